//! One optimizer, chosen by kind, that a probe and a training loop hold
//! together: the probe computes dry the update of the very state training
//! steps, so that state is in memory once, as in training.

use std::cell::RefCell;
use std::rc::Rc;

use candle_core::backprop::GradStore;
use candle_core::{Result, Var};
use candle_nn::{Optimizer, ParamsAdamW};

use crate::Error;
use autobatch::estimate::OptimizerKind;
use autobatch::optim::{Adafactor, AdamW, AdamW8bit, DryStep, Lion, MixedPrecision, ParamsAdafactor, ParamsLion, Sgd};

/// Which optimizer, and its hyper-parameters: AdamW's as given, the others'
/// learning rate AdamW's scaled as each paper advises (Lion a third of it,
/// Adafactor its relative step, SGD ten times it).
#[derive(Clone, Debug)]
pub(crate) struct OptimizerChoice {
    /// Which optimizer.
    pub(crate) kind: OptimizerKind,
    /// On f32 master copies of low-precision variables ([`MixedPrecision`]).
    pub(crate) mixed: bool,
    /// AdamW's hyper-parameters, the others' scaled from its learning rate.
    pub(crate) adamw: ParamsAdamW,
}

impl OptimizerChoice {
    /// The optimizer over `vars`, or [`Error::InvalidSetting`] for a
    /// kind with no dry step here (or mixed precision of another than AdamW).
    fn build(&self, vars: Vec<Var>) -> std::result::Result<Built, Error> {
        let lr = self.adamw.lr;
        Ok(match self.kind {
            OptimizerKind::AdamW if self.mixed => Built::Mixed(MixedPrecision::new(vars, self.adamw.clone())?),
            OptimizerKind::AdamW => Built::AdamW(AdamW::new(vars, self.adamw.clone())?),
            OptimizerKind::Lion if !self.mixed => {
                Built::Lion(Lion::new(vars, ParamsLion { lr: lr / 3.0, ..ParamsLion::default() })?)
            }
            OptimizerKind::Adafactor if !self.mixed => {
                Built::Adafactor(Adafactor::new(vars, ParamsAdafactor::default())?)
            }
            OptimizerKind::Adam8bit if !self.mixed => {
                Built::AdamW8bit(AdamW8bit::new(vars, candle_nn::ParamsAdamW { lr, ..Default::default() })?)
            }
            OptimizerKind::Sgd if !self.mixed => Built::Sgd(Sgd::new(vars, 10.0 * lr)?),
            other => {
                let valid = if self.mixed {
                    "use adamw in mixed precision (the one optimizer with f32 masters here)"
                } else {
                    "use adamw, lion, adafactor, adam8bit or sgd (the optimizers with a dry step)"
                };
                return Err(Error::invalid(crate::Setting::Optimizer, autobatch::Value::Optimizer(other), valid));
            }
        })
    }
}

enum Built {
    AdamW(AdamW),
    Mixed(MixedPrecision<AdamW>),
    Lion(Lion),
    Adafactor(Adafactor),
    AdamW8bit(AdamW8bit),
    Sgd(Sgd),
}

impl Built {
    fn as_dry(&self) -> &dyn DryStep {
        match self {
            Built::AdamW(o) => o,
            Built::Mixed(o) => o,
            Built::Lion(o) => o,
            Built::Adafactor(o) => o,
            Built::AdamW8bit(o) => o,
            Built::Sgd(o) => o,
        }
    }

    fn step(&mut self, grads: &GradStore) -> Result<()> {
        match self {
            Built::AdamW(o) => o.step(grads),
            Built::Mixed(o) => o.step(grads),
            Built::Lion(o) => o.step(grads),
            Built::Adafactor(o) => o.step(grads),
            Built::AdamW8bit(o) => o.step(grads),
            Built::Sgd(o) => o.step(grads),
        }
    }

    fn adamw(&self) -> Option<&AdamW> {
        match self {
            Built::AdamW(adamw) => Some(adamw),
            Built::Mixed(mixed) => Some(mixed.inner()),
            _ => None,
        }
    }
}

struct Slot {
    choice: OptimizerChoice,
    vars: Vec<Var>,
    /// `None` while freed ([`Shared::free`]): built again, as it was, when next used.
    built: Option<Built>,
    /// Real steps taken: a stepped optimizer's state cannot be built again.
    steps: u64,
}

impl Slot {
    fn built(&mut self) -> Result<&mut Built> {
        if self.built.is_none() {
            let built = self.choice.build(self.vars.clone()).map_err(|err| candle_core::Error::Msg(err.to_string()))?;
            self.built = Some(built);
        }
        Ok(self.built.as_mut().expect("built just above"))
    }
}

/// An optimizer of [`OptimizerChoice`] held by several owners (a probe and a
/// training loop); every clone is the same optimizer.
#[derive(Clone)]
pub(crate) struct Shared(Rc<RefCell<Slot>>);

impl Shared {
    /// The optimizer `choice` over `vars`, built now.
    pub(crate) fn build(choice: OptimizerChoice, vars: Vec<Var>) -> std::result::Result<Shared, Error> {
        let built = choice.build(vars.clone())?;
        Ok(Shared(Rc::new(RefCell::new(Slot { choice, vars, built: Some(built), steps: 0 }))))
    }

    /// What it was built as.
    pub(crate) fn choice(&self) -> OptimizerChoice {
        self.0.borrow().choice.clone()
    }

    /// Frees its state, when it has taken no step (it is then built again,
    /// as it was, when next used): the bytes freed.
    pub(crate) fn free(&self) -> u64 {
        let mut slot = self.0.borrow_mut();
        if slot.steps > 0 {
            return 0;
        }
        slot.built.take().map_or(0, |built| built.as_dry().state_bytes())
    }

    /// `f` of the AdamW inside (over the master copies in mixed precision),
    /// when it is one; a freed one is read as its next use builds it, and
    /// stays freed (reading allocates nothing that stays).
    pub fn with_adamw<R>(&self, f: impl FnOnce(&AdamW) -> R) -> Result<Option<R>> {
        let slot = self.0.borrow();
        match &slot.built {
            Some(built) => Ok(built.adamw().map(f)),
            None => {
                let rebuilt =
                    slot.choice.build(slot.vars.clone()).map_err(|err| candle_core::Error::Msg(err.to_string()))?;
                Ok(rebuilt.adamw().map(f))
            }
        }
    }
}

impl DryStep for Shared {
    fn free_state(&self) -> u64 {
        self.free()
    }

    fn dry_step(&self, grads: &GradStore) -> Result<()> {
        self.0.borrow_mut().built()?.as_dry().dry_step(grads)
    }

    fn state_bytes(&self) -> u64 {
        self.0.borrow().built.as_ref().map_or(0, |built| built.as_dry().state_bytes())
    }

    fn kind(&self) -> Option<OptimizerKind> {
        Some(self.0.borrow().choice.kind)
    }

    fn master_weights(&self) -> bool {
        self.0.borrow().choice.mixed
    }
}

impl Optimizer for Shared {
    type Config = OptimizerChoice;

    fn new(vars: Vec<Var>, config: OptimizerChoice) -> Result<Self> {
        Shared::build(config, vars).map_err(|err| candle_core::Error::Msg(err.to_string()))
    }

    fn step(&mut self, grads: &GradStore) -> Result<()> {
        let mut slot = self.0.borrow_mut();
        slot.built()?.step(grads)?;
        slot.steps += 1;
        Ok(())
    }

    fn learning_rate(&self) -> f64 {
        self.0.borrow().choice.adamw.lr
    }

    fn set_learning_rate(&mut self, lr: f64) {
        // AdamW's rate: the next build scales it as `OptimizerChoice` says, as the built one does now
        let mut slot = self.0.borrow_mut();
        slot.choice.adamw.lr = lr;
        match &mut slot.built {
            Some(Built::AdamW(o)) => o.set_learning_rate(lr),
            Some(Built::Mixed(o)) => o.set_learning_rate(lr),
            Some(Built::Lion(o)) => o.set_learning_rate(lr / 3.0),
            Some(Built::Adafactor(o)) => o.set_learning_rate(lr),
            Some(Built::AdamW8bit(o)) => o.set_learning_rate(lr),
            Some(Built::Sgd(o)) => o.set_learning_rate(10.0 * lr),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device};

    use super::*;

    fn shared(kind: OptimizerKind) -> (Var, Shared) {
        let w = Var::ones((64, 64), DType::F32, &Device::Cpu).unwrap();
        let choice = OptimizerChoice { kind, mixed: false, adamw: ParamsAdamW::default() };
        (w.clone(), Shared::build(choice, vec![w]).unwrap())
    }

    #[test]
    fn every_clone_steps_one_state_and_a_freed_one_comes_back_as_it_was() {
        let (w, mut training) = shared(OptimizerKind::AdamW);
        let probe = training.clone();
        let bytes = probe.state_bytes();
        assert_eq!(bytes, 8 * 64 * 64);
        assert_eq!((probe.free(), probe.state_bytes(), training.state_bytes()), (bytes, 0, 0));
        assert_eq!(probe.with_adamw(|adamw| adamw.step_count()).unwrap(), Some(0));
        assert_eq!(probe.state_bytes(), 0, "reading a freed optimizer leaves it freed");
        let grads = w.as_tensor().sqr().unwrap().sum_all().unwrap().backward().unwrap();
        probe.dry_step(&grads).unwrap();
        assert_eq!(training.state_bytes(), bytes, "built again at the next use");
        training.step(&grads).unwrap();
        assert_eq!(probe.with_adamw(|adamw| adamw.step_count()).unwrap(), Some(1));
        assert_eq!(probe.free(), 0, "a stepped optimizer keeps its state");
    }

    #[test]
    fn a_kind_without_a_dry_step_is_refused() {
        let w = Var::ones(4, DType::F32, &Device::Cpu).unwrap();
        let momentum = OptimizerChoice { kind: OptimizerKind::Momentum, mixed: false, adamw: ParamsAdamW::default() };
        assert!(matches!(
            Shared::build(momentum, vec![w.clone()]),
            Err(Error::InvalidSetting { value: autobatch::Value::Optimizer(_), .. })
        ));
        let mixed_lion = OptimizerChoice { kind: OptimizerKind::Lion, mixed: true, adamw: ParamsAdamW::default() };
        assert!(matches!(
            Shared::build(mixed_lion, vec![w]),
            Err(Error::InvalidSetting { value: autobatch::Value::Optimizer(_), .. })
        ));
        assert_eq!(shared(OptimizerKind::Lion).1.state_bytes(), 4 * 64 * 64);
    }
}
