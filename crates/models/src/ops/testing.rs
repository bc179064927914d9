//! What the ops' tests share: seeded variables and the comparison of a
//! fused op with its eager form, output and gradients.

use candle_core::{DType, Device, Result, Tensor, Var};

/// `n` values in [−scale, scale) from `seed`, spread out.
pub(crate) fn values(n: usize, seed: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|i| ((((seed * 7919 + i * 104_729) % 2003) as f32 / 1001.0) - 1.0) * scale).collect()
}

/// A variable of `shape` from `seed`, its values within `scale`.
pub(crate) fn var(shape: &[usize], seed: usize, scale: f32) -> Var {
    let n = shape.iter().product();
    Var::from_tensor(&Tensor::from_vec(values(n, seed, scale), shape, &Device::Cpu).unwrap()).unwrap()
}

/// The largest difference over the largest magnitude of `theirs`, at least
/// 1: a relative tolerance for values of order 1 and more, an absolute one
/// below (as `torch.testing.assert_close` mixes `rtol` and `atol`). The
/// tests' values and weights are of order 1, and a gradient far smaller (a
/// saturated softmax's, GELU's at its minimum, a norm's of one feature) is
/// a difference of terms of order 1, whose rounding in f32 is of order
/// 1e-7 whatever the form, not an error of the gradient's own size.
pub(crate) fn relative(ours: &Tensor, theirs: &Tensor) -> f32 {
    let max = |t: &Tensor| t.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap();
    max(&(ours - theirs).unwrap()) / max(theirs).max(1.0)
}

/// How far a fused op's output and gradients are from the exact answer
/// (its eager form in f64), and how far the eager form's own are in f32.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Agreement {
    pub(crate) fused: f32,
    pub(crate) eager: f32,
}

impl Agreement {
    /// Within 1e-5 of the exact answer ([`relative`]).
    pub(crate) fn holds(&self) -> bool {
        self.fused <= 1e-5
    }
}

impl std::fmt::Display for Agreement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:e} from the exact answer (the eager form in f32: {:e})", self.fused, self.eager)
    }
}

/// The largest relative difference from the exact answer (`theirs` of the
/// same values in f64) of `ours` of `vars`, and of `theirs` of `vars` in
/// f32: of the outputs, and of each variable's gradient of a weighted sum
/// of the output (every element weighted differently). A variable one gives
/// a gradient and the other none is an infinite difference.
pub(crate) fn agree(
    vars: &[&Var],
    ours: impl Fn(&[&Tensor]) -> Result<Tensor>,
    theirs: impl Fn(&[&Tensor]) -> Result<Tensor>,
) -> Agreement {
    let wide: Vec<Var> = vars.iter().map(|v| Var::from_tensor(&v.to_dtype(DType::F64).unwrap()).unwrap()).collect();
    let inputs: Vec<&Tensor> = vars.iter().map(|v| v.as_tensor()).collect();
    let wide_inputs: Vec<&Tensor> = wide.iter().map(|v| v.as_tensor()).collect();
    let exact = theirs(&wide_inputs).unwrap();
    let weights = Tensor::from_vec(values(exact.elem_count(), 97, 1.0), exact.shape(), &Device::Cpu).unwrap();
    let gradients =
        |out: &Tensor| (out * weights.to_dtype(out.dtype()).unwrap()).unwrap().sum_all().unwrap().backward().unwrap();
    let exact_grads = gradients(&exact);
    let narrow = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    let distance = |out: Tensor| {
        assert_eq!(out.dims(), exact.dims(), "the outputs' shapes");
        let grads = gradients(&out);
        let mut error = relative(&out, &narrow(&exact));
        for (var, wide) in vars.iter().zip(&wide) {
            error = error.max(match (grads.get(var), exact_grads.get(wide)) {
                (Some(x), Some(y)) => relative(x, &narrow(y)),
                (None, None) => 0.0,
                _ => f32::INFINITY,
            });
        }
        error
    };
    Agreement { fused: distance(ours(&inputs).unwrap()), eager: distance(theirs(&inputs).unwrap()) }
}
