//! Variables the forward pass writes: found by the probe steps, put back
//! after every step.
//!
//! candle-nn's `BatchNorm` in training mode (`forward_t(x, true)`) writes its
//! running mean and variance into variables of the `VarMap` during the forward
//! pass (`Var::set`), and a user's own layer may keep a buffer the same way.
//! No optimizer touches them and they get no gradient, so neither a dry update
//! nor a gradient check sees them: only their values tell. The first step that
//! runs to the end therefore starts from a host copy of every variable and
//! compares after it. From then on the probe watches only the variables that
//! may be written: those that changed, and those that got no gradient (a
//! buffer's first write can leave it as it was: a running mean of
//! activations that are all zero at batch 1 stays zero). Their host copies
//! are kept and put back after every step; one seen to change is a buffer,
//! one never seen to change a variable the graph does not reach.

use candle_core::{CpuStorage, Device, Result, Storage, Tensor, Var};

/// What the probe knows about the variables the forward pass writes.
#[derive(Debug, Default)]
pub(crate) struct Buffers {
    /// The variables that may be written, with their values before probing on
    /// the host; `None` until a step has run to the end.
    watched: Option<Vec<Watched>>,
}

/// A variable that may be written by the forward pass.
#[derive(Debug)]
struct Watched {
    /// Its index among the probe's variables.
    index: usize,
    /// Its value before probing, on the host.
    value: Tensor,
    /// Whether a step was seen to change it: a buffer.
    written: bool,
}

/// The values to put back after one step.
pub(crate) struct Saved {
    /// Before the first step that runs to the end: every variable, on the host.
    all: Option<Vec<Tensor>>,
}

impl Buffers {
    /// What to keep before a step: a host copy of every variable while no
    /// step has run to the end (on the CPU that copy is heap the step's peak
    /// includes, which is why it falls on the tuner's warm-up step), nothing
    /// after.
    pub(crate) fn save(&self, vars: &[(String, Var)]) -> Result<Saved> {
        if self.watched.is_some() {
            return Ok(Saved { all: None });
        }
        let all = vars.iter().map(|(_, var)| host_copy(var.as_tensor())).collect::<Result<Vec<_>>>()?;
        Ok(Saved { all: Some(all) })
    }

    /// Puts back what the step wrote. `gradients` is `Some` when the step ran
    /// to the end: for each variable, whether it got a gradient.
    pub(crate) fn restore(&mut self, vars: &[(String, Var)], saved: Saved, gradients: Option<&[bool]>) -> Result<()> {
        if let Some(watched) = &mut self.watched {
            for watched in watched.iter_mut() {
                let var = &vars[watched.index].1;
                if watched.written || !same_bits(&host_copy_if_needed(var.as_tensor())?, &watched.value)? {
                    write_back(var, &watched.value)?;
                    watched.written = true;
                }
            }
            return Ok(());
        }
        let Some(all) = saved.all else { return Ok(()) };
        let mut watched = Vec::new();
        for (index, ((_, var), value)) in vars.iter().zip(all).enumerate() {
            let written = !same_bits(&host_copy_if_needed(var.as_tensor())?, &value)?;
            if written {
                write_back(var, &value)?;
            }
            let without_gradient = gradients.is_some_and(|got| !got[index]);
            if written || without_gradient {
                watched.push(Watched { index, value, written });
            }
        }
        if gradients.is_some() {
            self.watched = Some(watched);
        }
        Ok(())
    }

    /// The indices of the variables seen to be written (buffers), once a step
    /// has run to the end.
    pub(crate) fn written(&self) -> Option<impl Iterator<Item = usize> + '_> {
        self.watched.as_ref().map(|watched| watched.iter().filter(|w| w.written).map(|w| w.index))
    }
}

/// Writes `value` (on the host) into `var`, on its device.
fn write_back(var: &Var, value: &Tensor) -> Result<()> {
    if var.device().is_cpu() { var.set(value) } else { var.set(&value.to_device(var.device())?) }
}

/// A copy of `tensor` in host memory that does not share its storage.
pub(crate) fn host_copy(tensor: &Tensor) -> Result<Tensor> {
    if tensor.device().is_cpu() { tensor.copy() } else { tensor.to_device(&Device::Cpu) }
}

/// `tensor` readable on the host: itself on the CPU, a copy otherwise.
fn host_copy_if_needed(tensor: &Tensor) -> Result<Tensor> {
    if tensor.device().is_cpu() { Ok(tensor.clone()) } else { tensor.to_device(&Device::Cpu) }
}

/// Whether two host tensors of the same shape hold the same bits (NaN equal
/// to the same NaN, 0.0 not equal to −0.0), read in place.
pub(crate) fn same_bits(a: &Tensor, b: &Tensor) -> Result<bool> {
    if a.shape() != b.shape() || a.dtype() != b.dtype() {
        return Ok(false);
    }
    let (a, b) = (a.contiguous()?, b.contiguous()?);
    let (a_storage, a_layout) = a.storage_and_layout();
    let (b_storage, b_layout) = b.storage_and_layout();
    let (Storage::Cpu(a_cpu), Storage::Cpu(b_cpu)) = (&*a_storage, &*b_storage) else {
        candle_core::bail!("comparing variables needs host tensors")
    };
    let (Some(a_range), Some(b_range)) = (a_layout.contiguous_offsets(), b_layout.contiguous_offsets()) else {
        candle_core::bail!("comparing variables needs contiguous tensors")
    };
    fn eq<T, B: PartialEq>(a: &[T], b: &[T], bits: impl Fn(&T) -> B) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| bits(x) == bits(y))
    }
    let (a_range, b_range) = (a_range.0..a_range.1, b_range.0..b_range.1);
    Ok(match (a_cpu, b_cpu) {
        (CpuStorage::U8(x), CpuStorage::U8(y))
        | (CpuStorage::F6E2M3(x), CpuStorage::F6E2M3(y))
        | (CpuStorage::F6E3M2(x), CpuStorage::F6E3M2(y))
        | (CpuStorage::F4(x), CpuStorage::F4(y))
        | (CpuStorage::F8E8M0(x), CpuStorage::F8E8M0(y)) => x[a_range] == y[b_range],
        (CpuStorage::U32(x), CpuStorage::U32(y)) => x[a_range] == y[b_range],
        (CpuStorage::I16(x), CpuStorage::I16(y)) => x[a_range] == y[b_range],
        (CpuStorage::I32(x), CpuStorage::I32(y)) => x[a_range] == y[b_range],
        (CpuStorage::I64(x), CpuStorage::I64(y)) => x[a_range] == y[b_range],
        (CpuStorage::BF16(x), CpuStorage::BF16(y)) => eq(&x[a_range], &y[b_range], |v| v.to_bits()),
        (CpuStorage::F16(x), CpuStorage::F16(y)) => eq(&x[a_range], &y[b_range], |v| v.to_bits()),
        (CpuStorage::F32(x), CpuStorage::F32(y)) => eq(&x[a_range], &y[b_range], |v| v.to_bits()),
        (CpuStorage::F64(x), CpuStorage::F64(y)) => eq(&x[a_range], &y[b_range], |v| v.to_bits()),
        (CpuStorage::F8E4M3(x), CpuStorage::F8E4M3(y)) => eq(&x[a_range], &y[b_range], |v| v.to_bits()),
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::DType;

    #[test]
    fn same_bits_tells_signed_zeros_apart_and_nans_equal() {
        let device = Device::Cpu;
        let t = |values: &[f32]| Tensor::new(values, &device).unwrap();
        assert!(same_bits(&t(&[1.0, f32::NAN]), &t(&[1.0, f32::NAN])).unwrap());
        assert!(!same_bits(&t(&[0.0]), &t(&[-0.0])).unwrap());
        assert!(!same_bits(&t(&[1.0, 2.0]), &t(&[1.0, 2.5])).unwrap());
        let ints = Tensor::new(&[3u32, 4], &device).unwrap();
        assert!(same_bits(&ints, &ints.copy().unwrap()).unwrap());
        assert!(!same_bits(&ints, &ints.to_dtype(DType::I64).unwrap()).unwrap());
        // a transposed view against its contiguous copy
        let m = Tensor::arange(0f32, 6., &device).unwrap().reshape((2, 3)).unwrap().t().unwrap();
        assert!(same_bits(&m, &m.contiguous().unwrap()).unwrap());
    }

    #[test]
    fn finds_the_variables_a_step_writes_and_puts_them_back() {
        let device = Device::Cpu;
        let weight = Var::new(&[1f32, 2.0], &device).unwrap();
        let running = Var::new(&[0f32, 0.0], &device).unwrap();
        let vars = vec![("weight".to_owned(), weight.clone()), ("running".to_owned(), running.clone())];
        let mut buffers = Buffers::default();
        let step = |value: f32| running.set(&Tensor::new(&[value, 0.25], &device).unwrap());
        let gradients = [true, false];
        // a failed step: put back, still unknown
        let saved = buffers.save(&vars).unwrap();
        step(0.5).unwrap();
        buffers.restore(&vars, saved, None).unwrap();
        assert!(buffers.written().is_none());
        assert_eq!(running.to_vec1::<f32>().unwrap(), [0.0, 0.0]);
        // the first complete step finds it
        let saved = buffers.save(&vars).unwrap();
        step(0.5).unwrap();
        buffers.restore(&vars, saved, Some(&gradients)).unwrap();
        assert_eq!(buffers.written().unwrap().collect::<Vec<_>>(), [1]);
        assert_eq!(running.to_vec1::<f32>().unwrap(), [0.0, 0.0]);
        // later steps keep only its copy
        let saved = buffers.save(&vars).unwrap();
        assert!(saved.all.is_none());
        step(0.5).unwrap();
        buffers.restore(&vars, saved, Some(&gradients)).unwrap();
        assert_eq!(running.to_vec1::<f32>().unwrap(), [0.0, 0.0]);
        assert_eq!(weight.to_vec1::<f32>().unwrap(), [1.0, 2.0]);
    }

    #[test]
    fn a_buffer_the_first_step_leaves_as_it_was_is_found_later() {
        let device = Device::Cpu;
        let weight = Var::new(&[1f32, 2.0], &device).unwrap();
        let running = Var::new(&[0f32, 0.0], &device).unwrap();
        let vars = vec![("weight".to_owned(), weight.clone()), ("running".to_owned(), running.clone())];
        let mut buffers = Buffers::default();
        let gradients = [true, false];
        // the first step writes the value it found
        let saved = buffers.save(&vars).unwrap();
        running.set(&Tensor::new(&[0f32, 0.0], &device).unwrap()).unwrap();
        buffers.restore(&vars, saved, Some(&gradients)).unwrap();
        assert_eq!(buffers.written().unwrap().count(), 0);
        // a later one changes it: found, and put back
        let saved = buffers.save(&vars).unwrap();
        running.set(&Tensor::new(&[3f32, 4.0], &device).unwrap()).unwrap();
        buffers.restore(&vars, saved, Some(&gradients)).unwrap();
        assert_eq!(buffers.written().unwrap().collect::<Vec<_>>(), [1]);
        assert_eq!(running.to_vec1::<f32>().unwrap(), [0.0, 0.0]);
    }
}
