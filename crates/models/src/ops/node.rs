//! One node of candle's graph for a computation of many ops: its value is
//! computed off the graph, on detached tensors, and handed over as the
//! node's output; its backward pass is written out by hand.
//!
//! candle keeps every tensor an op consumed until the graph is dropped, so
//! a norm written as six ops keeps six tensors for the backward pass where
//! the backward pass needs its input alone. A fused op keeps its inputs
//! (which the graph holds anyway, as the ops before it made them) and its
//! output, and recomputes anything else it needs in its backward pass.
//!
//! candle's custom ops take at most three inputs. A node over more (a
//! residual, a gated activation's two halves, a weight and its bias; a
//! mixture's experts' outputs) takes its first two directly and the rest
//! through a *bundle*: a node of one element whose inputs are the rest
//! (past three, itself bundling its own rest). The node's backward pass leaves
//! the rest's gradients with the bundle, whose own backward pass, which
//! candle runs after the node's (the bundle comes before it in the graph),
//! hands them out.

use std::sync::{Arc, Mutex};

use candle_core::{CpuStorage, DType, Layout, Result, Shape, Tensor};

/// The backward pass of a fused op.
pub(crate) trait Backward: Send + Sync + 'static {
    /// The op's name in candle's graph.
    fn name(&self) -> &'static str;

    /// The gradient of each input for the output's gradient `grad`: one entry
    /// per input, `Some` for each one `wanted` (those in the graph) and of its
    /// shape. `inputs` and `output` are detached.
    fn backward(
        &self,
        inputs: &[Tensor],
        wanted: &[bool],
        output: &Tensor,
        grad: &Tensor,
    ) -> Result<Vec<Option<Tensor>>>;
}

/// `value`, computed from `inputs` off the graph, as one node of the graph
/// over `inputs` (one or more) whose backward pass is `backward`; `value`
/// itself when no input takes part in the graph.
pub(crate) fn node(inputs: &[&Tensor], value: Tensor, backward: impl Backward) -> Result<Tensor> {
    let wanted: Vec<bool> = inputs.iter().map(|input| input.track_op()).collect();
    if !wanted.contains(&true) {
        return Ok(value);
    }
    let value = if value.is_contiguous() && value.layout().start_offset() == 0 { value } else { value.copy()? };
    let detached = inputs.iter().map(|input| input.detach()).collect();
    let fused = |direct, stash| Fused {
        backward: Box::new(backward),
        inputs: detached,
        wanted: wanted.clone(),
        value: Mutex::new(Some(value)),
        direct,
        stash,
    };
    match *inputs {
        [a] => a.apply_op1(fused(1, None)),
        [a, b] => a.apply_op2(b, fused(2, None)),
        [a, b, c] => a.apply_op3(b, c, fused(3, None)),
        // past three: the rest bundled, itself a node (bundling its own rest past three)
        [a, b, ref rest @ ..] => {
            let stash = Arc::new(Mutex::new(None));
            let marker = Tensor::zeros(1, DType::F32, a.device())?;
            let bundle = node(rest, marker, Unbundle { stash: stash.clone() })?;
            a.apply_op3(b, &bundle, fused(2, Some(stash)))
        }
        [] => candle_core::bail!("a fused op of no input"),
    }
}

/// The gradients a node left for its bundle's inputs.
type Stash = Arc<Mutex<Option<Vec<Option<Tensor>>>>>;

/// The custom op candle's graph holds for a [`node`].
struct Fused {
    backward: Box<dyn Backward>,
    /// Every input, detached (the graph holds the same storage).
    inputs: Vec<Tensor>,
    wanted: Vec<bool>,
    /// The output, computed before the op ran; taken by its forward.
    value: Mutex<Option<Tensor>>,
    /// How many inputs the graph gives the op directly; the rest come through a bundle.
    direct: usize,
    stash: Option<Stash>,
}

impl Fused {
    fn take_value(&self) -> Result<Tensor> {
        let mut value = lock(&self.value)?;
        value.take().ok_or_else(|| candle_core::Error::Msg(format!("{}: its forward ran twice", self.name())))
    }

    fn name(&self) -> &'static str {
        self.backward.name()
    }

    /// The direct inputs' gradients (and the bundle's marker), the rest stashed.
    fn gradients(&self, res: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let mut grads = self.backward.backward(&self.inputs, &self.wanted, &res.detach(), &grad.detach())?;
        if grads.len() != self.inputs.len() {
            candle_core::bail!("{}: {} gradients for {} inputs", self.name(), grads.len(), self.inputs.len())
        }
        for ((grad, input), &wanted) in grads.iter_mut().zip(&self.inputs).zip(&self.wanted) {
            match grad {
                Some(g) if g.dims() != input.dims() => {
                    candle_core::bail!(
                        "{}: a gradient of {:?} for an input of {:?}",
                        self.name(),
                        g.dims(),
                        input.dims()
                    )
                }
                // candle expects a gradient for every input in the graph
                None if wanted => *grad = Some(input.zeros_like()?),
                Some(_) if !wanted => *grad = None,
                _ => {}
            }
        }
        let rest = grads.split_off(self.direct);
        if let Some(stash) = &self.stash {
            let marker = rest.iter().any(Option::is_some).then(|| Tensor::zeros(1, DType::F32, res.device()));
            *lock(stash)? = Some(rest);
            grads.push(marker.transpose()?);
        }
        Ok(grads)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> Result<std::sync::MutexGuard<'_, T>> {
    mutex.lock().map_err(|_| candle_core::Error::Msg("a fused op's lock is poisoned".into()))
}

/// The bundle's backward pass: the gradients its node left.
struct Unbundle {
    stash: Stash,
}

impl Backward for Unbundle {
    fn name(&self) -> &'static str {
        "fused-op-inputs"
    }

    fn backward(&self, inputs: &[Tensor], _: &[bool], _: &Tensor, _: &Tensor) -> Result<Vec<Option<Tensor>>> {
        Ok(lock(&self.stash)?.take().unwrap_or_else(|| vec![None; inputs.len()]))
    }
}

/// A tensor computed before a custom op ran, handed over as the op's output
/// on the CPU: a copy of its storage (`tensor` contiguous from its start).
pub(crate) fn handed_over_cpu(tensor: &Tensor) -> Result<(CpuStorage, Shape)> {
    use candle_core::backend::BackendStorage;
    let (storage, layout) = tensor.storage_and_layout();
    match &*storage {
        candle_core::Storage::Cpu(storage) => Ok((storage.try_clone(layout)?, layout.shape().clone())),
        _ => candle_core::bail!("a custom op's output is not on the CPU"),
    }
}

/// [`handed_over_cpu`] on a CUDA device.
#[cfg(feature = "cuda")]
pub(crate) fn handed_over_cuda(tensor: &Tensor) -> Result<(candle_core::CudaStorage, Shape)> {
    use candle_core::backend::BackendStorage;
    let (storage, layout) = tensor.storage_and_layout();
    match &*storage {
        candle_core::Storage::Cuda(storage) => Ok((storage.try_clone(layout)?, layout.shape().clone())),
        _ => candle_core::bail!("a custom op's output is not on the GPU"),
    }
}

impl candle_core::CustomOp1 for Fused {
    fn name(&self) -> &'static str {
        Fused::name(self)
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        handed_over_cpu(&self.take_value()?)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, _: &candle_core::CudaStorage, _: &Layout) -> Result<(candle_core::CudaStorage, Shape)> {
        handed_over_cuda(&self.take_value()?)
    }

    fn bwd(&self, _: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(self.gradients(res, grad)?.pop().flatten())
    }
}

impl candle_core::CustomOp2 for Fused {
    fn name(&self) -> &'static str {
        Fused::name(self)
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        handed_over_cpu(&self.take_value()?)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        handed_over_cuda(&self.take_value()?)
    }

    fn bwd(&self, _: &Tensor, _: &Tensor, res: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let mut grads = self.gradients(res, grad)?.into_iter();
        Ok((grads.next().flatten(), grads.next().flatten()))
    }
}

impl candle_core::CustomOp3 for Fused {
    fn name(&self) -> &'static str {
        Fused::name(self)
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        handed_over_cpu(&self.take_value()?)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        handed_over_cuda(&self.take_value()?)
    }

    fn bwd(
        &self,
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let mut grads = self.gradients(res, grad)?.into_iter();
        Ok((grads.next().flatten(), grads.next().flatten(), grads.next().flatten()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// `Σ inputs`, whose backward pass gives each input the output's gradient.
    struct Sum;

    impl Backward for Sum {
        fn name(&self) -> &'static str {
            "sum-of-inputs"
        }

        fn backward(
            &self,
            inputs: &[Tensor],
            wanted: &[bool],
            _: &Tensor,
            grad: &Tensor,
        ) -> Result<Vec<Option<Tensor>>> {
            Ok(inputs.iter().zip(wanted).map(|(_, &w)| w.then(|| grad.clone())).collect())
        }
    }

    fn sum_node(inputs: &[&Tensor]) -> Result<Tensor> {
        let mut value = inputs[0].detach();
        for input in &inputs[1..] {
            value = (value + input.detach())?;
        }
        node(inputs, value, Sum)
    }

    #[test]
    fn every_input_of_one_to_five_gets_its_gradient() {
        for count in 1..=5 {
            for frozen in 0..count {
                let vars: Vec<Var> =
                    (0..count).map(|i| Var::new(&[i as f32, 1.0, 2.0], &Device::Cpu).unwrap()).collect();
                // one input outside the graph: no gradient for it, the others theirs
                let constant = vars[frozen].as_tensor().detach();
                let inputs: Vec<&Tensor> =
                    (0..count).map(|i| if i == frozen { &constant } else { vars[i].as_tensor() }).collect();
                let out = sum_node(&inputs).unwrap();
                let expected: f32 = (0..count).map(|i| i as f32 + 3.0).sum();
                assert_eq!(out.sum_all().unwrap().to_scalar::<f32>().unwrap(), expected);
                let weights = Tensor::new(&[1f32, 2.0, 3.0], &Device::Cpu).unwrap();
                let grads = (out * &weights).unwrap().sum_all().unwrap().backward().unwrap();
                for (i, var) in vars.iter().enumerate() {
                    let grad = grads.get(var);
                    if i == frozen && count > 1 {
                        assert!(grad.is_none(), "{count} inputs: the constant {i} got a gradient");
                    } else if i != frozen {
                        let grad = grad.unwrap_or_else(|| panic!("{count} inputs: {i} got none")).to_vec1::<f32>();
                        assert_eq!(grad.unwrap(), [1.0, 2.0, 3.0], "{count} inputs, input {i}");
                    }
                }
            }
        }
    }

    #[test]
    fn outside_the_graph_the_value_is_returned_as_it_is() {
        let a = Tensor::new(&[1f32, 2.0], &Device::Cpu).unwrap();
        let out = sum_node(&[&a, &a]).unwrap();
        assert!(!out.track_op());
        assert_eq!(out.to_vec1::<f32>().unwrap(), [2.0, 4.0]);
    }

    #[test]
    fn many_inputs_each_get_their_gradient_through_nested_bundles() {
        for count in [6, 7, 12, 33] {
            let vars: Vec<Var> = (0..count).map(|i| Var::new(&[i as f32, 1.0], &Device::Cpu).unwrap()).collect();
            let inputs: Vec<&Tensor> = vars.iter().map(Var::as_tensor).collect();
            let out = sum_node(&inputs).unwrap();
            let weights = Tensor::new(&[2f32, 3.0], &Device::Cpu).unwrap();
            let grads = (out * &weights).unwrap().sum_all().unwrap().backward().unwrap();
            for (i, var) in vars.iter().enumerate() {
                let grad = grads.get(var).unwrap_or_else(|| panic!("{count} inputs: {i} got none"));
                assert_eq!(grad.to_vec1::<f32>().unwrap(), [2.0, 3.0], "{count} inputs, input {i}");
            }
        }
    }
}
