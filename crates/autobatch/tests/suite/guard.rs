//! The runtime guard: out-of-memory errors injected at random micro-steps leave
//! the effective batch and the accumulated gradient as an uninterrupted run has them.

use autobatch::memory::simulated::{MemoryCurve, Simulation};
use autobatch::{Error, Guard, MicroBatch};
use candle_core::{DType, Device, Tensor, Var};
use proptest::prelude::*;

fn oom() -> candle_core::Error {
    candle_core::Error::wrap("DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")")
}

/// A per-sample "gradient": anything deterministic and uneven.
fn sample_gradient(i: usize) -> f64 {
    ((i as f64) * 0.618).sin() * (1.0 + (i % 7) as f64)
}

/// One guarded step; OOM on the attempts listed and on micro-batches above
/// `fits_up_to`. Returns the accumulated gradient and how often each sample was used.
fn guarded_step(guard: &mut Guard, ooms_at: &[usize], fits_up_to: usize) -> Result<(f64, Vec<u32>), Error> {
    let (_, mut meter) = Simulation::new(1 << 30, MemoryCurve::affine(0, 1)).build();
    let mut used = vec![0u32; guard.batch()];
    let (mut gradient, mut attempt) = (0.0, 0);
    guard.step(&mut meter, |micro: MicroBatch| {
        attempt += 1;
        // (a single sample is not injected: that would be GuardExhausted, tested below)
        if (ooms_at.contains(&attempt) && micro.len > 1) || micro.len > fits_up_to {
            return Err(oom());
        }
        // mean over the micro-batch, scaled: as a mean loss's gradient would be
        let samples = micro.offset..micro.offset + micro.len;
        let mean = samples.clone().map(sample_gradient).sum::<f64>() / micro.len as f64;
        gradient += mean * micro.loss_scale;
        for i in samples {
            used[i] += 1;
        }
        Ok(())
    })?;
    Ok((gradient, used))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn injected_ooms_change_neither_the_samples_nor_the_gradient(
        batch in 1usize..3000,
        micro_share in 0.0f64..=1.0,
        ooms_at in prop::collection::vec(1usize..40, 0..8),
        fits_up_to in prop::option::of(1usize..3000),
    ) {
        let micro = ((batch as f64 * micro_share) as usize).clamp(1, batch);
        let mut reference = Guard::with_batch(batch, micro).unwrap();
        let (expected, _) = guarded_step(&mut reference, &[], usize::MAX).unwrap();
        let full_batch: f64 = (0..batch).map(sample_gradient).sum::<f64>() / batch as f64;
        prop_assert!((expected - full_batch).abs() <= 1e-9 * (1.0 + full_batch.abs()));

        let mut guard = Guard::with_batch(batch, micro).unwrap();
        let (gradient, used) = guarded_step(&mut guard, &ooms_at, fits_up_to.unwrap_or(usize::MAX)).unwrap();
        prop_assert!(used.iter().all(|&n| n == 1), "every sample exactly once");
        prop_assert!((gradient - expected).abs() <= 1e-9 * (1.0 + expected.abs()), "{} vs {}", gradient, expected);
        prop_assert!(guard.micro_batch() <= micro);
        if let Some(limit) = fits_up_to {
            prop_assert!(guard.micro_batch() <= limit.max(1));
        }
        prop_assert!(guard.micro_batch() * guard.accumulation_steps() >= batch);
    }
}

#[test]
fn the_gradient_of_a_real_candle_model_is_unchanged() {
    let device = Device::Cpu;
    let (batch, features) = (96, 8);
    let x = Tensor::randn(0f32, 1.0, (batch, features), &device).unwrap();
    let y = Tensor::randn(0f32, 1.0, (batch, 1), &device).unwrap();
    let w = Var::randn(0f32, 1.0, (features, 1), &device).unwrap();
    let loss_of = |rows: std::ops::Range<usize>| -> candle_core::Result<Tensor> {
        let xs = x.narrow(0, rows.start, rows.len())?;
        let ys = y.narrow(0, rows.start, rows.len())?;
        xs.matmul(w.as_tensor())?.sub(&ys)?.sqr()?.mean_all()
    };
    let full = loss_of(0..batch).unwrap().backward().unwrap().get(&w).unwrap().clone();

    let (_, mut meter) = Simulation::new(1 << 30, MemoryCurve::affine(0, 1)).build();
    let mut guard = Guard::with_batch(batch, 48).unwrap();
    let mut accumulated = Tensor::zeros((features, 1), DType::F32, &device).unwrap();
    let mut attempts = 0;
    let report = guard
        .step(&mut meter, |micro| {
            attempts += 1;
            if attempts == 2 || attempts == 4 {
                return Err(oom());
            }
            let loss = (loss_of(micro.offset..micro.offset + micro.len)? * micro.loss_scale)?;
            let grads = loss.backward()?; // all or nothing: accumulate only after it succeeded
            accumulated = (&accumulated + grads.get(&w).unwrap())?;
            Ok(())
        })
        .unwrap();
    assert_eq!((report.out_of_memory, report.samples, report.micro_batch), (2, batch, 12), "{report:?}");
    let difference = (accumulated - full).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
    assert!(difference < 1e-5, "gradient differs by {difference}");
}

#[test]
fn the_micro_batch_grows_back_after_stable_steps_but_never_above_the_plan() {
    let mut guard = Guard::with_batch(256, 64).unwrap().grow_back_after(3);
    let (_, used) = guarded_step(&mut guard, &[], 16).unwrap();
    assert!(used.iter().all(|&n| n == 1));
    assert_eq!((guard.micro_batch(), guard.accumulation_steps()), (16, 16));
    let mut sizes = Vec::new();
    for _ in 0..9 {
        guarded_step(&mut guard, &[], usize::MAX).unwrap();
        sizes.push(guard.micro_batch());
    }
    assert_eq!(sizes, [16, 16, 32, 32, 32, 64, 64, 64, 64]);

    let mut never = Guard::with_batch(256, 64).unwrap();
    guarded_step(&mut never, &[1], usize::MAX).unwrap();
    for _ in 0..20 {
        guarded_step(&mut never, &[], usize::MAX).unwrap();
    }
    assert_eq!(never.micro_batch(), 32, "without grow_back_after it stays down");
}

#[test]
fn a_single_sample_that_does_not_fit_and_other_errors_are_reported() {
    let mut guard = Guard::with_batch(8, 8).unwrap();
    let err = guarded_step(&mut guard, &[], 0).unwrap_err();
    assert!(matches!(err, Error::GuardExhausted { offset: 0 }), "{err}");

    let (_, mut meter) = Simulation::new(1 << 30, MemoryCurve::affine(0, 1)).build();
    let mut guard = Guard::with_batch(8, 4).unwrap();
    let err = guard.step(&mut meter, |_| Err(candle_core::Error::Msg("shape mismatch".into()))).unwrap_err();
    assert!(matches!(&err, Error::Workload { .. }) && err.to_string().contains("shape mismatch"), "{err}");
    assert!(matches!(
        Guard::with_batch(0, 4),
        Err(Error::InvalidSetting { setting: autobatch::Setting::Batch, value: autobatch::Value::Count(0), .. })
    ));
    assert!(matches!(
        Guard::with_batch(8, 0),
        Err(Error::InvalidSetting { setting: autobatch::Setting::MicroBatch, value: autobatch::Value::Count(0), .. })
    ));
}
