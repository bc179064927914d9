//! The optimizers update a slice of a variable at a time, in place: the same
//! numbers as the whole-variable update, on variables that span several
//! slices (past 2^20 elements) and on small ones, property-tested over shapes
//! and hyper-parameters; a dry step changes nothing.

use autobatch::optim::{Adafactor, AdamW, AdamW8bit, DryStep, Lion, MixedPrecision, ParamsAdafactor, ParamsLion, Sgd};
use candle_core::backprop::GradStore;
use candle_core::{D, DType, Device, Tensor, Var};
use candle_nn::{Optimizer, ParamsAdamW};
use proptest::prelude::*;

/// Elements one slice spans (`SLICE_ELEMENTS`, crate-private): shapes
/// around it straddle a slice boundary.
const SLICE: usize = 1 << 20;

/// A variable of `shape` with values that differ element to element, from `seed`.
fn var(shape: &[usize], seed: u64) -> Var {
    let n: usize = shape.iter().product();
    let values: Vec<f32> =
        (0..n as u64).map(|i| (((i * 2_654_435_761 + seed * 97) % 10_007) as f32 / 10_007.0) - 0.5).collect();
    Var::from_tensor(&Tensor::from_vec(values, shape, &Device::Cpu).unwrap()).unwrap()
}

/// A loss whose gradient differs element to element and from step to step.
fn grads(vars: &[Var], step: usize) -> GradStore {
    let mut loss = Tensor::zeros((), DType::F32, &Device::Cpu).unwrap();
    for (i, v) in vars.iter().enumerate() {
        let shift = 0.1 * (step + i) as f64;
        let term = v.as_tensor().affine(1.0, shift).unwrap().sqr().unwrap().sum_all().unwrap();
        let term = term.to_dtype(DType::F32).unwrap();
        loss = (loss + term).unwrap();
    }
    loss.backward().unwrap()
}

fn values(v: &Var) -> Vec<f32> {
    v.as_tensor().flatten_all().unwrap().to_dtype(DType::F32).unwrap().to_vec1().unwrap()
}

fn largest_relative_difference(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs() / x.abs().max(y.abs()).max(1e-6)).fold(0.0, f32::max)
}

/// The values of variables of `shapes` after 20 steps of each optimizer,
/// from the same start on the same gradients.
fn twenty_steps<A: Optimizer, B: Optimizer>(
    shapes: &[Vec<usize>],
    ours: impl FnOnce(Vec<Var>) -> candle_core::Result<A>,
    theirs: impl FnOnce(Vec<Var>) -> candle_core::Result<B>,
) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let fresh = || -> Vec<Var> { shapes.iter().enumerate().map(|(i, s)| var(s, i as u64)).collect() };
    let (vars_a, vars_b) = (fresh(), fresh());
    let (mut a, mut b) = (ours(vars_a.clone()).unwrap(), theirs(vars_b.clone()).unwrap());
    for step in 0..20 {
        a.step(&grads(&vars_a, step)).unwrap();
        b.step(&grads(&vars_b, step)).unwrap();
    }
    (vars_a.iter().map(values).collect(), vars_b.iter().map(values).collect())
}

fn shapes() -> impl Strategy<Value = Vec<Vec<usize>>> {
    prop::collection::vec(
        prop_oneof![
            (1usize..40).prop_map(|n| vec![n]),
            (1usize..20, 1usize..20).prop_map(|(r, c)| vec![r, c]),
            // past one slice: two or three of them, the last partial
            (1usize..1200).prop_map(|extra| vec![SLICE / 1000 + extra, 1000]),
            (0usize..3).prop_map(|extra| vec![SLICE + extra * 777]),
        ],
        1..3,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, failure_persistence: None, ..ProptestConfig::default() })]

    /// 20 steps in slices equal candle-nn's AdamW, whole, to the bit.
    #[test]
    fn adamw_in_slices_is_candle_nns_adamw(
        shapes in shapes(),
        lr in 1e-4f64..1e-1,
        weight_decay in 0f64..0.2,
        beta1 in 0.5f64..0.95,
    ) {
        let params = ParamsAdamW { lr, weight_decay, beta1, ..Default::default() };
        let (ours, theirs) = twenty_steps(&shapes, |v| AdamW::new(v, params.clone()), |v| candle_nn::AdamW::new(v, params.clone()));
        prop_assert_eq!(ours, theirs);
    }

    /// 20 steps in slices equal candle-nn's SGD, whole, to the bit.
    #[test]
    fn sgd_in_slices_is_candle_nns_sgd(shapes in shapes(), lr in 1e-4f64..1e-1) {
        let (ours, theirs) = twenty_steps(&shapes, |v| Sgd::new(v, lr), |v| candle_nn::SGD::new(v, lr));
        prop_assert_eq!(ours, theirs);
    }

    /// Lion in slices is Lion's formula on the whole variable.
    #[test]
    fn lion_in_slices_is_its_formula(shapes in shapes(), lr in 1e-4f64..1e-2, weight_decay in 0f64..0.2) {
        let params = ParamsLion { lr, weight_decay, ..ParamsLion::default() };
        let vars: Vec<Var> = shapes.iter().enumerate().map(|(i, s)| var(s, i as u64)).collect();
        let reference: Vec<(Tensor, Tensor)> =
            vars.iter().map(|v| (v.as_tensor().copy().unwrap(), v.zeros_like().unwrap())).collect();
        let mut lion = Lion::new(vars.clone(), params.clone()).unwrap();
        let mut reference = reference;
        for step in 0..5 {
            let g = grads(&vars, step);
            for (v, (theta, m)) in vars.iter().zip(reference.iter_mut()) {
                let g = g.get(v.as_tensor()).unwrap().detach();
                let c = ((&*m * params.beta1).unwrap() + (&g * (1.0 - params.beta1)).unwrap()).unwrap();
                let decayed = (&*theta * (1.0 - lr * weight_decay)).unwrap();
                *theta = (decayed - (c.sign().unwrap() * lr).unwrap()).unwrap();
                *m = ((&*m * params.beta2).unwrap() + (&g * (1.0 - params.beta2)).unwrap()).unwrap();
            }
            lion.step(&g).unwrap();
        }
        for (v, (theta, _)) in vars.iter().zip(&reference) {
            let expected: Vec<f32> = theta.flatten_all().unwrap().to_vec1().unwrap();
            prop_assert!(largest_relative_difference(&values(v), &expected) < 1e-6);
        }
    }

    /// Adafactor in slices is Adafactor's update on the whole variable
    /// (factored over its last two dimensions, or full for a vector).
    #[test]
    fn adafactor_in_slices_is_its_formula(shapes in shapes(), beta1 in prop::option::of(0.5f64..0.95)) {
        let params = ParamsAdafactor { beta1, weight_decay: 0.01, ..ParamsAdafactor::default() };
        let vars: Vec<Var> = shapes.iter().enumerate().map(|(i, s)| var(s, i as u64)).collect();
        let mut reference: Vec<WholeAdafactor> = vars.iter().map(|v| WholeAdafactor::new(v, &params)).collect();
        let mut adafactor = Adafactor::new(vars.clone(), params.clone()).unwrap();
        for step in 1..=4u64 {
            let g = grads(&vars, step as usize);
            for (v, whole) in vars.iter().zip(reference.iter_mut()) {
                whole.step(g.get(v.as_tensor()).unwrap(), step, &params);
            }
            adafactor.step(&g).unwrap();
        }
        for (v, whole) in vars.iter().zip(&reference) {
            let expected: Vec<f32> = whole.theta.flatten_all().unwrap().to_vec1().unwrap();
            // sums gathered slice by slice round differently from one sum: within
            // 1e-4 of each value, or of a thousandth of the largest where a value
            // is near zero (θ − update cancels there)
            let got = values(v);
            let floor = 1e-3 * expected.iter().fold(0f32, |m, x| m.max(x.abs()));
            let worst = got.iter().zip(&expected).map(|(x, y)| (x - y).abs() / x.abs().max(y.abs()).max(floor)).fold(0.0, f32::max);
            prop_assert!(worst < 1e-4, "{}", worst);
        }
    }

    /// The dry step of every optimizer (and of mixed precision over AdamW)
    /// leaves every variable as it was, and the real step moves them.
    #[test]
    fn a_dry_step_in_slices_changes_nothing(shapes in shapes()) {
        fn check<O: Optimizer + DryStep>(vars: &[Var], mut optimizer: O) -> Result<(), TestCaseError> {
            optimizer.step(&grads(vars, 0)).unwrap();
            let before: Vec<Vec<f32>> = vars.iter().map(values).collect();
            optimizer.dry_step(&grads(vars, 1)).unwrap();
            prop_assert_eq!(&before, &vars.iter().map(values).collect::<Vec<_>>());
            optimizer.step(&grads(vars, 1)).unwrap();
            prop_assert_ne!(&before, &vars.iter().map(values).collect::<Vec<_>>());
            Ok(())
        }
        let fresh = || shapes.iter().enumerate().map(|(i, s)| var(s, i as u64)).collect::<Vec<_>>();
        let vars = fresh();
        check(&vars, AdamW8bit::new(vars.clone(), ParamsAdamW { lr: 0.01, ..Default::default() }).unwrap())?;
        let vars = fresh();
        check(&vars, Lion::new(vars.clone(), ParamsLion { lr: 0.01, ..ParamsLion::default() }).unwrap())?;
        let vars = fresh();
        check(&vars, Adafactor::new(vars.clone(), ParamsAdafactor::default()).unwrap())?;
        let bf16: Vec<Var> = fresh()
            .iter()
            .map(|v| Var::from_tensor(&v.as_tensor().to_dtype(DType::BF16).unwrap()).unwrap())
            .collect();
        check(&bf16, MixedPrecision::<AdamW>::new(bf16.clone(), ParamsAdamW { lr: 0.01, ..Default::default() }).unwrap())?;
    }
}

/// Mixed precision over AdamW, its masters updated in slices from the bf16
/// gradients, is AdamW on f32 masters fed those gradients cast whole.
#[test]
fn mixed_precision_in_slices_is_adamw_on_f32_masters() {
    let shape = [SLICE / 1000 + 17, 1000];
    let bf16 = Var::from_tensor(&var(&shape, 3).as_tensor().to_dtype(DType::BF16).unwrap()).unwrap();
    let master = Var::from_tensor(&bf16.as_tensor().to_dtype(DType::F32).unwrap()).unwrap();
    let params = ParamsAdamW { lr: 0.01, ..Default::default() };
    let mut mixed = MixedPrecision::<AdamW>::new(vec![bf16.clone()], params.clone()).unwrap();
    let mut reference = candle_nn::AdamW::new(vec![master.clone()], params).unwrap();
    for step in 0..3 {
        let g = grads(std::slice::from_ref(&bf16), step);
        let mut cast = GradStore::default();
        cast.insert(master.as_tensor(), g.get(bf16.as_tensor()).unwrap().to_dtype(DType::F32).unwrap());
        mixed.step(&g).unwrap();
        reference.step(&cast).unwrap();
        // the reference's model weights: its master rounded, as mixed writes them
        let rounded = master.as_tensor().to_dtype(DType::BF16).unwrap();
        assert_eq!(
            values(&bf16),
            rounded.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
        );
        // and the next step starts from the same masters
        assert_eq!(values(&mixed.masters()[0]), values(&master));
    }
}

/// Adafactor's update on a whole variable, as the paper writes it: the
/// reference the sliced update is checked against.
struct WholeAdafactor {
    theta: Tensor,
    second: Vec<Tensor>,
    first: Option<Tensor>,
}

impl WholeAdafactor {
    fn new(v: &Var, params: &ParamsAdafactor) -> WholeAdafactor {
        let dims = v.dims();
        let zeros = |shape: Vec<usize>| Tensor::zeros(shape, DType::F32, &Device::Cpu).unwrap();
        let second = if dims.len() >= 2 {
            let mut col = dims[..dims.len() - 2].to_vec();
            col.push(dims[dims.len() - 1]);
            vec![zeros(dims[..dims.len() - 1].to_vec()), zeros(col)]
        } else {
            vec![zeros(dims.to_vec())]
        };
        let first = params.beta1.map(|_| zeros(dims.to_vec()));
        WholeAdafactor { theta: v.as_tensor().copy().unwrap(), second, first }
    }

    fn step(&mut self, grad: &Tensor, t: u64, p: &ParamsAdafactor) {
        let rms =
            |x: &Tensor| f64::from(x.sqr().unwrap().mean_all().unwrap().sqrt().unwrap().to_scalar::<f32>().unwrap());
        let grad = grad.detach();
        let relative = p.lr.unwrap_or_else(|| (1e-2f64).min(1.0 / (t as f64).sqrt()));
        let lr = if p.scale_parameter { relative * p.eps2.max(rms(&self.theta)) } else { relative };
        let beta2t = 1.0 - (t as f64).powf(p.decay_rate);
        let squared = (grad.sqr().unwrap() + p.eps1).unwrap();
        let update = if self.second.len() == 2 {
            let row = ((&self.second[0] * beta2t).unwrap()
                + (squared.mean(D::Minus1).unwrap() * (1.0 - beta2t)).unwrap())
            .unwrap();
            let col = ((&self.second[1] * beta2t).unwrap()
                + (squared.mean(D::Minus2).unwrap() * (1.0 - beta2t)).unwrap())
            .unwrap();
            let row_factor =
                row.broadcast_div(&row.mean_keepdim(D::Minus1).unwrap()).unwrap().sqrt().unwrap().recip().unwrap();
            let col_factor = col.sqrt().unwrap().recip().unwrap();
            let factor = row_factor
                .unsqueeze(D::Minus1)
                .unwrap()
                .broadcast_mul(&col_factor.unsqueeze(D::Minus2).unwrap())
                .unwrap();
            self.second = vec![row, col];
            (factor * &grad).unwrap()
        } else {
            let v = ((&self.second[0] * beta2t).unwrap() + (squared * (1.0 - beta2t)).unwrap()).unwrap();
            let update = (v.sqrt().unwrap().recip().unwrap() * &grad).unwrap();
            self.second = vec![v];
            update
        };
        let clip = (rms(&update) / p.clip_threshold).max(1.0);
        let mut update = (update * (lr / clip)).unwrap();
        if let (Some(m), Some(beta1)) = (&self.first, p.beta1) {
            let next = ((m * beta1).unwrap() + (update * (1.0 - beta1)).unwrap()).unwrap();
            update = next.clone();
            self.first = Some(next);
        }
        let decayed = (&self.theta * (1.0 - p.weight_decay * lr)).unwrap();
        self.theta = (decayed - update).unwrap();
    }
}
