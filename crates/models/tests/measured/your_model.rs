//! A model written as a candle user writes it (candle-nn layers, a `VarMap`,
//! `candle_nn::AdamW`), tuned through `ModelProbe` and trained through
//! `TrainLoop`: the answer is exact, probing changes no weight, a fused op
//! that cuts gradients is named, and training with accumulation at the
//! largest batch stays under the ceiling.
//!
//! Heap measurements are process-wide: like `crates/models/tests/measured/workloads.rs`, this file
//! has its own harness and runs its checks one after another on one thread.

use crate::common::bits;

use autobatch::{
    Error, HeapMeter, MemoryMeter, MicroBatch, ModelProbe, TrackingAllocator, TrainLoop, Tuner, Workload, plan::Warning,
};
use candle_core::{D, DType, Device, Module, Result, Tensor};
use candle_nn::{Embedding, Linear, Optimizer, ParamsAdamW, VarBuilder, VarMap, embedding, linear, loss, ops};

const MIB: u64 = 1 << 20;
/// Between the tuner's measurement and a brute-force one the harness holds a
/// few small allocations of its own (see crates/models/tests/measured/workloads.rs).
const TOLERANCE: u64 = 4 << 10;
const VOCAB: usize = 64;
const SEQ: usize = 32;

/// Layer norm as a user writes it: candle-nn's own (a fused op with no
/// backward on contiguous input), or after the switch the tuner's error
/// names (`use autobatch_models::ops::nn::{layer_norm, LayerNorm}` in place of
/// candle-nn's: the same names, the same arguments).
enum Norm {
    Fused(candle_nn::LayerNorm),
    Switched(autobatch_models::ops::nn::LayerNorm),
}

impl Norm {
    fn new(size: usize, fused: bool, vb: VarBuilder) -> Result<Norm> {
        if fused {
            return Ok(Norm::Fused(candle_nn::layer_norm(size, 1e-5, vb)?));
        }
        Ok(Norm::Switched(autobatch_models::ops::nn::layer_norm(size, 1e-5, vb)?))
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Norm::Fused(norm) => norm.forward(x),
            Norm::Switched(norm) => norm.forward(x),
        }
    }
}

struct Block {
    ln1: Norm,
    qkv: Linear,
    proj: Linear,
    ln2: Norm,
    fc1: Linear,
    fc2: Linear,
}

/// A small GPT: token and position embeddings, pre-norm blocks with causal
/// attention (an additive mask, as many users write it) and a GELU MLP.
struct Gpt {
    tokens: Embedding,
    positions: Tensor,
    blocks: Vec<Block>,
    ln_f: Norm,
    head: Linear,
    mask: Tensor,
    heads: usize,
    /// The mask added as autobatch's constant (no gradient of the scores'
    /// size), rather than by `broadcast_add` as users write it.
    constant_mask: bool,
    /// Switched to autobatch's lean ops: `BlockedAttention` in place of the
    /// scores written out, `ChunkedCrossEntropy` in place of the head and
    /// `cross_entropy`.
    lean: bool,
}

/// One block of a `Gpt` as a `Module`: what checkpointing recomputes.
struct BlockStep<'a> {
    block: &'a Block,
    gpt: &'a Gpt,
}

impl Module for BlockStep<'_> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.gpt.block(self.block, x)
    }
}

impl Gpt {
    fn new(d: usize, heads: usize, layers: usize, fused: bool, vb: VarBuilder) -> Result<Gpt> {
        let mut blocks = Vec::new();
        for i in 0..layers {
            let vb = vb.pp(format!("blocks.{i}"));
            blocks.push(Block {
                ln1: Norm::new(d, fused, vb.pp("ln1"))?,
                qkv: linear(d, 3 * d, vb.pp("qkv"))?,
                proj: linear(d, d, vb.pp("proj"))?,
                ln2: Norm::new(d, fused, vb.pp("ln2"))?,
                fc1: linear(d, 4 * d, vb.pp("fc1"))?,
                fc2: linear(4 * d, d, vb.pp("fc2"))?,
            });
        }
        let mask: Vec<f32> =
            (0..SEQ).flat_map(|i| (0..SEQ).map(move |j| if j > i { f32::NEG_INFINITY } else { 0. })).collect();
        Ok(Gpt {
            tokens: embedding(VOCAB, d, vb.pp("tokens"))?,
            positions: vb.get_with_hints((SEQ, d), "positions", candle_nn::init::DEFAULT_KAIMING_NORMAL)?,
            blocks,
            ln_f: Norm::new(d, fused, vb.pp("ln_f"))?,
            head: linear(d, VOCAB, vb.pp("head"))?,
            mask: Tensor::from_vec(mask, (SEQ, SEQ), vb.device())?,
            heads,
            constant_mask: false,
            lean: false,
        })
    }

    fn block(&self, block: &Block, x: &Tensor) -> Result<Tensor> {
        let (b, s, d) = x.dims3()?;
        let hd = d / self.heads;
        let qkv = block.qkv.forward(&block.ln1.forward(x)?)?.reshape((b, s, 3, self.heads, hd))?;
        let qkv = qkv.permute((2, 0, 3, 1, 4))?;
        let (q, k, v) = (qkv.get(0)?.contiguous()?, qkv.get(1)?.contiguous()?, qkv.get(2)?.contiguous()?);
        if self.lean {
            let attended = autobatch_models::ops::BlockedAttention::causal().forward(&q, &k, &v, None)?;
            let y = attended.transpose(1, 2)?.reshape((b, s, d))?;
            let x = (x + block.proj.forward(&y)?)?;
            return &x + block.fc2.forward(&block.fc1.forward(&block.ln2.forward(&x)?)?.gelu()?)?;
        }
        let mask = self.mask.narrow(0, 0, s)?.narrow(1, 0, s)?;
        let scores = (q.matmul(&k.t()?)? / (hd as f64).sqrt())?;
        let scores = if self.constant_mask {
            autobatch_models::ops::add_constant(&scores, &mask)?
        } else {
            scores.broadcast_add(&mask)?
        };
        let y = ops::softmax(&scores, D::Minus1)?.matmul(&v)?.transpose(1, 2)?.reshape((b, s, d))?;
        let x = (x + block.proj.forward(&y)?)?;
        &x + block.fc2.forward(&block.fc1.forward(&block.ln2.forward(&x)?)?.gelu()?)?
    }

    fn embed(&self, input: &Tensor) -> Result<Tensor> {
        self.tokens.forward(input)?.broadcast_add(&self.positions.narrow(0, 0, input.dim(1)?)?)
    }

    fn forward(&self, input: &Tensor) -> Result<Tensor> {
        let mut x = self.embed(input)?;
        for block in &self.blocks {
            x = self.block(block, &x)?;
        }
        self.head.forward(&self.ln_f.forward(&x)?)
    }

    fn steps(&self) -> Vec<BlockStep<'_>> {
        self.blocks.iter().map(|block| BlockStep { block, gpt: self }).collect()
    }

    /// The inputs and targets of `batch` sequences of `len` tokens (at most
    /// `SEQ`) from sample `offset`.
    fn data_of_length(&self, batch: usize, offset: usize, len: usize) -> Result<(Tensor, Tensor)> {
        let tokens: Vec<u32> = (0..batch * (len + 1))
            .map(|i| {
                let (sample, position) = (offset + i / (len + 1), i % (len + 1));
                ((sample * 7 + position * 3) % VOCAB) as u32
            })
            .collect();
        let tokens = Tensor::from_vec(tokens, (batch, len + 1), self.mask.device())?;
        Ok((tokens.narrow(1, 0, len)?.contiguous()?, tokens.narrow(1, 1, len)?.flatten_all()?))
    }

    /// Loss and gradients of sequences of `len` tokens with gradient
    /// checkpointing over the blocks; `frozen` is the same model over
    /// detached weights.
    fn checkpointed_loss(
        &self,
        frozen: &Gpt,
        vars: &[candle_core::Var],
        batch: usize,
        offset: usize,
        len: usize,
    ) -> Result<(Tensor, candle_core::backprop::GradStore)> {
        let (input, targets) = self.data_of_length(batch, offset, len)?;
        let x = self.embed(&input)?;
        autobatch::model::checkpointed(vars, &x, &self.steps(), &frozen.steps(), |h| {
            let logits = self.head.forward(&self.ln_f.forward(h)?)?;
            loss::cross_entropy(&logits.reshape((batch * len, VOCAB))?, &targets)
        })
    }

    /// The mean next-token loss of `batch` sequences of a fixed synthetic
    /// language, starting at sample `offset` of the step.
    fn loss(&self, batch: usize, offset: usize) -> Result<Tensor> {
        self.loss_of_length(batch, offset, SEQ)
    }

    /// [`loss`] of sequences of `len` tokens.
    fn loss_of_length(&self, batch: usize, offset: usize, len: usize) -> Result<Tensor> {
        let (input, targets) = self.data_of_length(batch, offset, len)?;
        if self.lean {
            let mut x = self.embed(&input)?;
            for block in &self.blocks {
                x = self.block(block, &x)?;
            }
            let hidden = self.ln_f.forward(&x)?.reshape((batch * len, ()))?;
            let head = autobatch_models::ops::ChunkedCrossEntropy::default();
            return head.forward(&hidden, self.head.weight(), self.head.bias(), &targets);
        }
        let logits = self.forward(&input)?;
        loss::cross_entropy(&logits.reshape((batch * len, VOCAB))?, &targets)
    }
}

fn gpt(fused: bool) -> (VarMap, Gpt) {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let model = Gpt::new(32, 4, 2, fused, vb).unwrap();
    (varmap, model)
}

fn peak_of<W: Workload>(workload: &mut W, batch: usize) -> u64 {
    TrackingAllocator::reset_peak();
    workload.step(batch).unwrap();
    TrackingAllocator::peak_bytes()
}

fn the_answer_is_exact_and_probing_changes_no_weight() {
    let (varmap, mut model) = gpt(false);
    let before = bits(&varmap);
    let budget = HeapMeter::with_room(20 * MIB).unwrap().budget_bytes();
    let tune = |model: &Gpt| {
        let mut probe = ModelProbe::new(&varmap, |b| model.loss(b.len, 0))
            .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
            .unwrap();
        let mut meter = HeapMeter::new(budget).unwrap();
        let plan = Tuner::new().search(&mut probe, &mut meter).run().unwrap();
        let (largest, limit) = (plan.largest_batch(), plan.limit_bytes());
        assert!(plan.proven_largest(), "{plan}");
        // brute force: the answer fits, the next batch does not
        assert!(peak_of(&mut probe, largest) <= limit + TOLERANCE);
        assert!(peak_of(&mut probe, largest + 1) > limit.saturating_sub(TOLERANCE));
        assert_eq!(probe.variables_without_gradient(), Some(&[][..]));
        plan
    };
    // the mask added with broadcast_add: candle keeps a gradient of the
    // scores' size for it (4 heads × 32 × 32 × 4 bytes a sample), and says so
    let plain = tune(&model);
    let [autobatch::plan::Warning::UntrainedGradients { bytes, .. }] = plain.warnings() else { panic!("{plain}") };
    assert!(*bytes >= plain.largest_batch() as u64 * 4 * (SEQ * SEQ) as u64 * 4, "{plain}");
    assert!(plain.to_string().contains("add-constant"), "{plain}");
    // doing what it says: no warning, and no less fits (here the peak is the
    // optimizer's update, after the store is gone: the backward pass's is lower)
    model.constant_mask = true;
    let fixed = tune(&model);
    assert!(fixed.warnings().is_empty(), "{fixed}");
    assert!(fixed.largest_batch() >= plain.largest_batch(), "{plain}\n{fixed}");
    println!("  mask gradient {bytes} bytes; largest batch {} -> {}", plain.largest_batch(), fixed.largest_batch());
    assert_eq!(bits(&varmap), before, "probing changed a weight");
}

fn a_fused_op_that_cuts_gradients_is_named() {
    let (varmap, model) = gpt(true);
    let mut probe = ModelProbe::new(&varmap, |b| model.loss(b.len, 0))
        .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
        .unwrap();
    // refused by default, naming the switch this file makes (Norm::new)
    let err = Tuner::new().search(&mut probe, &mut HeapMeter::with_room(20 * MIB).unwrap()).run().unwrap_err();
    let Error::PartialGraph { variables: cut, of } = &err else { panic!("{err:?}") };
    assert_eq!(*of, varmap.all_vars().len());
    assert!(cut.iter().any(|name| name == "tokens.weight"), "{cut:?}");
    let message = err.to_string();
    assert!(message.contains("write those ops from differentiable tensor ops"), "{message}");
    assert!(message.contains("Tuner::allow_partial_graph"), "{message}");
    // the partial answer, when asked for
    let plan = Tuner::new()
        .allow_partial_graph(true)
        .search(&mut probe, &mut HeapMeter::with_room(20 * MIB).unwrap())
        .run()
        .unwrap();
    let missing = plan.warnings().iter().find_map(|w| match w {
        Warning::MissingGradients { variables, of } => Some((variables.clone(), *of)),
        _ => None,
    });
    let (variables, of) = missing.unwrap_or_else(|| panic!("no gradient warning:\n{plan}"));
    assert_eq!(of, varmap.all_vars().len());
    // the final norm is fused: nothing before the head learns
    for name in ["tokens.weight", "blocks.0.qkv.weight", "blocks.1.fc2.bias", "ln_f.weight"] {
        assert!(variables.iter().any(|v| v == name), "{name} not in {variables:?}");
    }
    assert!(!variables.iter().any(|v| v.starts_with("head.")), "{variables:?}");
    let text = plan.to_string();
    assert!(text.contains("gradient") && text.contains(&variables[0]) && text.contains("fused"), "{text}");
    // a long list is cut short on its line, the count of the rest said
    assert!(text.contains(&format!("and {} more", variables.len() - 8)), "{text}");
    // the number understates training: the plan says so where the number is
    assert!(!plan.complete_graph());
    assert!(!plan.proven_largest(), "{plan}");
    assert_eq!(
        plan.stopped_by(),
        Some(&autobatch::plan::SearchLimit::PartialGraph { variables: variables.len(), of: varmap.all_vars().len() })
    );
    let json: serde_json::Value = serde_json::from_str(&plan.to_json()).unwrap();
    assert_eq!(json["measured_graph"], "partial");
    assert!(text.contains("not proven largest: the measured step reached the gradients of"), "{text}");
    assert_eq!(cut.len(), variables.len());
    let partial = plan.largest_batch();
    // after the switch: the whole graph, complete and proven, and less fits than the cut graph said
    let (varmap, model) = gpt(false);
    let mut probe = ModelProbe::new(&varmap, |b| model.loss(b.len, 0))
        .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
        .unwrap();
    let plan = Tuner::new().search(&mut probe, &mut HeapMeter::with_room(20 * MIB).unwrap()).run().unwrap();
    assert!(plan.complete_graph());
    assert!(plan.proven_largest(), "{plan}");
    assert!(plan.largest_batch() < partial, "the cut graph said {partial}, the whole one {}", plan.largest_batch());
}

/// An LSTM as candle-nn builds it (hundreds of small tensors a step) tunes to
/// the same exact answer twice in one process, with a plan dropped, a
/// backward pass and a line of output between, and a target effective batch
/// the second time: what the tuner holds between trials (it keeps two
/// graphs, not one per trial) does not grow with the trials run, and the
/// answer does not depend on what ran before.
fn an_answer_does_not_depend_on_what_ran_before() {
    use candle_nn::{LSTMConfig, RNN, lstm};
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let rnn = lstm(16, 48, LSTMConfig::default(), vb.pp("lstm")).unwrap();
    let head = linear(48, 8, vb.pp("head")).unwrap();
    let steps = 48;
    let batch_loss = |micro: autobatch::MicroBatch| -> Result<Tensor> {
        let b = micro.len;
        let x = Tensor::ones((b, steps, 16), DType::F32, &Device::Cpu)?;
        let hidden = rnn.states_to_tensor(&rnn.seq(&x)?)?;
        let last = hidden.narrow(1, steps - 1, 1)?.squeeze(1)?;
        loss::cross_entropy(&head.forward(&last)?, &Tensor::zeros(b, DType::U32, &Device::Cpu)?)
    };
    let budget = HeapMeter::with_room(12 * MIB).unwrap().budget_bytes();
    let tune = |tuner: Tuner| {
        let mut probe =
            ModelProbe::new(&varmap, batch_loss).optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default()).unwrap();
        let plan = tuner.search(&mut probe, &mut HeapMeter::new(budget).unwrap()).run().unwrap();
        let limit = plan.limit_bytes();
        let largest = plan.largest_batch();
        // brute force with the plan held, as a trainer holds it
        assert!(peak_of(&mut probe, largest) <= limit + TOLERANCE, "{plan}");
        assert!(peak_of(&mut probe, largest + 1) > limit.saturating_sub(TOLERANCE), "{plan}");
        // what the tuner holds beside the model: two graphs and a few bytes a trial, however many trials
        let graph = probe.graph_tensors().map_or(0, |g| g.len() * std::mem::size_of::<autobatch::GraphTensor>()) as u64;
        let baselines: Vec<u64> = plan.trials().iter().map(|t| t.baseline_bytes).collect();
        let grown = baselines.iter().max().unwrap() - baselines.iter().min().unwrap();
        let bound = 2 * graph + 16 * 1024;
        assert!(grown <= bound, "the tuner's own memory grew {grown} bytes over {} trials", baselines.len());
        largest
    };
    let first = tune(Tuner::new());
    drop(batch_loss(autobatch::MicroBatch::of(8)).unwrap().backward().unwrap());
    println!("  an LSTM of {steps} steps: largest batch {first}");
    let second = tune(Tuner::new().target_effective_batch(4 * first + 3).strategy(autobatch::search::Strategy::Binary));
    assert_eq!(first, second, "the same model, another answer after the first run");
}

/// The GPT switched to autobatch's lean ops as a user switches it (the
/// attention's lines and the loss's line): the same loss and gradients
/// within 1e-5, and the tuner's exact answer larger than the eager model's.
fn your_model_switched_to_the_lean_ops_is_exact_and_fits_more() {
    let (varmap, mut model) = gpt(false);
    let vars = varmap.all_vars();
    let gradients = |model: &Gpt| {
        let loss = model.loss(6, 0).unwrap();
        let grads = loss.backward().unwrap();
        let values: Vec<Tensor> = vars.iter().map(|var| grads.get(var).expect("a gradient").clone()).collect();
        (loss.to_scalar::<f32>().unwrap(), values)
    };
    let (eager_loss, eager) = gradients(&model);
    model.lean = true;
    let (lean_loss, lean) = gradients(&model);
    assert!((eager_loss - lean_loss).abs() <= 1e-5 * eager_loss.abs(), "{eager_loss} against {lean_loss}");
    for (a, b) in eager.iter().zip(&lean) {
        let scale = a.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap().max(1e-3);
        let error = (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap();
        assert!(error <= 1e-5 * scale, "a gradient differs by {error} (largest {scale})");
    }
    let budget = HeapMeter::with_room(20 * MIB).unwrap().budget_bytes();
    let tune = |model: &Gpt| {
        let mut probe = ModelProbe::new(&varmap, |b| model.loss(b.len, 0))
            .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
            .unwrap();
        let plan = Tuner::new().search(&mut probe, &mut HeapMeter::new(budget).unwrap()).run().unwrap();
        let (largest, limit) = (plan.largest_batch(), plan.limit_bytes());
        assert!(peak_of(&mut probe, largest) <= limit + TOLERANCE, "{plan}");
        assert!(peak_of(&mut probe, largest + 1) > limit.saturating_sub(TOLERANCE), "{plan}");
        largest
    };
    let lean_batch = tune(&model);
    model.lean = false;
    let eager_batch = tune(&model);
    println!("  the GPT: largest batch {eager_batch} eager, {lean_batch} with the lean ops");
    assert!(lean_batch > eager_batch, "{eager_batch} eager, {lean_batch} lean");
}

/// A forward-only probe over the detached model holds no optimizer state,
/// records no graph and fits a larger batch than training; run over the
/// variables themselves it says the graph was recorded.
fn a_forward_only_probe_measures_serving() {
    let (varmap, model) = gpt(false);
    let serving = Gpt::new(32, 4, 2, false, autobatch::model::detached(&varmap)).unwrap();
    let mut meter = HeapMeter::with_room(20 * MIB).unwrap();
    let training = {
        let mut probe = ModelProbe::new(&varmap, |b| model.loss(b.len, 0))
            .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
            .unwrap();
        Tuner::new().search(&mut probe, &mut meter).run().unwrap()
    };
    let forward = |b: autobatch::MicroBatch| -> Result<Tensor> {
        let (input, _) = serving.data_of_length(b.len, 0, SEQ)?;
        serving.forward(&input)
    };
    let mut probe = ModelProbe::new(&varmap, forward).forward_only();
    let plan = Tuner::new().search(&mut probe, &mut meter).run().unwrap();
    assert!(plan.warnings().is_empty() && plan.proven_largest(), "{plan}");
    assert!(plan.largest_batch() > 2 * training.largest_batch(), "{plan}\n{training}");
    assert!(!probe.can_accumulate() && probe.profile().is_none());
    // brute force: the forward pass at the answer fits, one more does not
    let limit = plan.limit_bytes();
    assert!(peak_of(&mut probe, plan.largest_batch()) <= limit + TOLERANCE);
    assert!(peak_of(&mut probe, plan.largest_batch() + 1) > limit.saturating_sub(TOLERANCE));
    drop(probe);
    // the same forward pass over the variables records a graph: said
    let recorded = |b: autobatch::MicroBatch| -> Result<Tensor> {
        let (input, _) = model.data_of_length(b.len, 0, SEQ)?;
        model.forward(&input)
    };
    let mut probe = ModelProbe::new(&varmap, recorded).forward_only();
    let plan = Tuner::new().max_batch(64).search(&mut probe, &mut meter).run().unwrap();
    assert!(plan.warnings().iter().any(|w| matches!(w, Warning::GraphRecorded)), "{plan}");
}

/// A model that keeps state between calls (a cache that grows with every
/// forward pass, as a KV cache does): without a reset the plan warns and the
/// state stays held; with `with_reset` each trial starts clean and nothing is
/// left after tuning.
fn state_kept_between_steps_is_named_and_a_reset_clears_it() {
    use std::cell::RefCell;
    use std::rc::Rc;
    let (varmap, model) = gpt(false);
    let cache: Rc<RefCell<Vec<Tensor>>> = Rc::default();
    let kept = Rc::clone(&cache);
    let loss = move |micro: autobatch::MicroBatch| -> Result<Tensor> {
        let b = micro.len;
        let (input, targets) = model.data_of_length(b, 0, SEQ)?;
        // the model keeps what it saw: 64 KiB a sample, as a larger model's KV cache would
        kept.borrow_mut().push(Tensor::zeros((b, 16 << 10), DType::F32, &Device::Cpu)?);
        let logits = model.forward(&input)?;
        loss::cross_entropy(&logits.reshape((b * SEQ, VOCAB))?, &targets)
    };
    let mut probe =
        ModelProbe::new(&varmap, loss).optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default()).unwrap();
    let plan = Tuner::new().search(&mut probe, &mut HeapMeter::with_room(20 * MIB).unwrap()).run().unwrap();
    assert!(plan.warnings().iter().any(|w| matches!(w, Warning::StateKept { .. })), "{plan}");
    assert!(!cache.borrow().is_empty());
    let clear = Rc::clone(&cache);
    let mut probe = probe.with_reset(move || {
        clear.borrow_mut().clear();
        Ok(())
    });
    let plan = Tuner::new().search(&mut probe, &mut HeapMeter::with_room(20 * MIB).unwrap()).run().unwrap();
    assert!(!plan.warnings().iter().any(|w| matches!(w, Warning::StateKept { .. })), "{plan}");
    assert!(cache.borrow().is_empty(), "the reset ran after tuning");
}

/// An op candle cannot differentiate (a max-pool whose kernel is not its
/// stride) is named, with what to do, instead of a bare workload error.
fn an_op_without_a_backward_pass_is_named() {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let layer = linear(16, 16, vb.pp("fc")).unwrap();
    let loss = |micro: autobatch::MicroBatch| -> Result<Tensor> {
        let b = micro.len;
        let x = layer.forward(&Tensor::ones((b, 16), DType::F32, &Device::Cpu)?)?.reshape((b, 1, 4, 4))?;
        x.max_pool2d_with_stride(3, 1)?.sum_all()
    };
    let mut probe =
        ModelProbe::new(&varmap, loss).optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default()).unwrap();
    match Tuner::new().search(&mut probe, &mut HeapMeter::with_room(6 * MIB).unwrap()).run() {
        Err(err @ Error::BackwardUnsupported { .. }) => {
            let Error::BackwardUnsupported { batch, op, .. } = &err else { unreachable!() };
            assert_eq!((*batch, op.as_str()), (1, "maxpool2d"));
            let text = err.to_string();
            assert!(text.contains("forward_only") && text.contains("cannot differentiate maxpool2d"), "{text}");
        }
        other => panic!("{other:?}"),
    }
}

fn training_with_accumulation_at_the_largest_batch_stays_under_the_ceiling() {
    let (varmap, model) = gpt(false);
    let mut meter = HeapMeter::with_room(20 * MIB).unwrap();
    let loss = |b: autobatch::MicroBatch| model.loss(b.len, 0);
    let largest = {
        let mut probe =
            ModelProbe::new(&varmap, loss).optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default()).unwrap();
        Tuner::new().search(&mut probe, &mut meter).run().unwrap().largest_batch()
    };
    for target in [2 * largest, 3 * largest + 1] {
        let plan = {
            let mut probe =
                ModelProbe::new(&varmap, loss).optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default()).unwrap();
            Tuner::new().target_effective_batch(target).search(&mut probe, &mut meter).run().unwrap()
        };
        assert_eq!(plan.largest_batch(), largest, "{plan}");
        assert!(plan.accumulation_steps() > 1, "{plan}");
        let verified = plan.accumulation_peak_bytes().unwrap_or_else(|| panic!("not verified:\n{plan}"));
        assert!(verified <= plan.limit_bytes(), "{plan}");
        assert!(plan.trials().iter().any(|t| t.kind == autobatch::plan::TrialKind::Accumulation && t.outcome.fits()));

        let optimizer = autobatch::optim::AdamW::new(varmap.all_vars(), ParamsAdamW::default()).unwrap();
        let mut training = TrainLoop::new(&plan, &varmap, optimizer).unwrap();
        let mut losses = Vec::new();
        for step in 0..3 {
            meter.reset_peak().unwrap();
            let report = training.step(&mut meter, |micro| model.loss(micro.len, step * 1000 + micro.offset)).unwrap();
            let peak = meter.peak().unwrap();
            assert!(peak <= plan.limit_bytes(), "step {step} peaked at {peak} over {}:\n{plan}", plan.limit_bytes());
            // the target itself: micro-batches that differ by one sample reach 3·b* + 1 exactly
            assert_eq!((report.samples, report.out_of_memory), (target, 0), "{plan}");
            losses.push(report.loss.unwrap());
        }
        assert!(losses[2] < losses[0], "{losses:?}");
    }
}

/// A wide MLP: its gradient copy (the accumulator) is worth hundreds of samples.
fn wide_mlp_loss(layers: &[Linear], batch: usize, offset: usize) -> Result<Tensor> {
    let x: Vec<f32> = (0..batch * 256).map(|i| (((offset * 256 + i) * 37 % 101) as f32 / 50.0) - 1.0).collect();
    let mut h = Tensor::from_vec(x, (batch, 256), &Device::Cpu)?;
    for (index, layer) in layers.iter().enumerate() {
        h = layer.forward(&h)?;
        if index + 1 < layers.len() {
            h = h.relu()?;
        }
    }
    let labels: Vec<u32> = (0..batch).map(|i| ((offset + i) % 10) as u32).collect();
    loss::cross_entropy(&h, &Tensor::from_vec(labels, batch, &Device::Cpu)?)
}

fn an_accumulating_plan_steps_its_micro_batch_down_until_the_accumulator_fits() {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let layers = vec![
        linear(256, 1024, vb.pp("fc1")).unwrap(),
        linear(1024, 1024, vb.pp("fc2")).unwrap(),
        linear(1024, 10, vb.pp("out")).unwrap(),
    ];
    let loss = |b: autobatch::MicroBatch| wide_mlp_loss(&layers, b.len, 0);
    // with SGD (no state, a small update) the backward pass is the peak, and
    // the accumulator held through it (5 MiB) is worth ~170 samples
    let mut meter = HeapMeter::with_room(56 * MIB).unwrap();
    let tuner = Tuner::new().multiple_of(8);
    let largest = {
        let mut probe = ModelProbe::new(&varmap, loss).optimizer::<autobatch::optim::Sgd>(0.01).unwrap();
        tuner.clone().search(&mut probe, &mut meter).run().unwrap().largest_batch()
    };
    let plan = {
        let mut probe = ModelProbe::new(&varmap, loss).optimizer::<autobatch::optim::Sgd>(0.01).unwrap();
        tuner.target_effective_batch(2 * largest).search(&mut probe, &mut meter).run().unwrap()
    };
    // the gradient copy does not fit beside the largest batch: the micro-batch
    // stepped down, and the split still reaches the target
    assert_eq!(plan.largest_batch(), largest, "{plan}");
    assert!(plan.micro_batch() < largest && plan.micro_batch() % 8 == 0, "{plan}");
    assert!(plan.effective_batch() >= 2 * largest, "{plan}");
    let failed =
        plan.trials().iter().filter(|t| t.kind == autobatch::plan::TrialKind::Accumulation && !t.outcome.fits());
    assert!(failed.count() >= 1, "{plan}");
    assert!(plan.accumulation_peak_bytes().is_some_and(|peak| peak <= plan.limit_bytes()), "{plan}");

    let optimizer = autobatch::optim::Sgd::new(varmap.all_vars(), 0.01).unwrap();
    let mut training = TrainLoop::new(&plan, &varmap, optimizer).unwrap();
    for step in 0..3 {
        meter.reset_peak().unwrap();
        training.step(&mut meter, |micro| wide_mlp_loss(&layers, micro.len, step * 10_000 + micro.offset)).unwrap();
        let peak = meter.peak().unwrap();
        assert!(peak <= plan.limit_bytes(), "step {step} peaked at {peak} over {}:\n{plan}", plan.limit_bytes());
    }
}

/// Weights used as the right operand of `matmul` (no `Linear`): candle leaves
/// their gradients holding the layer's input through the graph. Training with
/// accumulation must not keep one micro-step's activations alive into the next.
fn accumulated_gradients_hold_no_activations() {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let w1 = vb.get_with_hints((256, 512), "w1", candle_nn::init::DEFAULT_KAIMING_NORMAL).unwrap();
    let w2 = vb.get_with_hints((512, 10), "w2", candle_nn::init::DEFAULT_KAIMING_NORMAL).unwrap();
    let loss = |batch: usize, offset: usize| -> Result<Tensor> {
        let x: Vec<f32> = (0..batch * 256).map(|i| (((offset * 256 + i) * 37 % 101) as f32 / 50.0) - 1.0).collect();
        let x = Tensor::from_vec(x, (batch, 256), &Device::Cpu)?;
        let logits = x.matmul(&w1)?.relu()?.matmul(&w2)?;
        let labels: Vec<u32> = (0..batch).map(|i| ((offset + i) % 10) as u32).collect();
        loss::cross_entropy(&logits, &Tensor::from_vec(labels, batch, &Device::Cpu)?)
    };
    let mut meter = HeapMeter::with_room(42 * MIB).unwrap();
    let largest = {
        let mut probe = ModelProbe::new(&varmap, |b| loss(b.len, 0)).optimizer::<autobatch::optim::Sgd>(0.01).unwrap();
        Tuner::new().search(&mut probe, &mut meter).run().unwrap().largest_batch()
    };
    let plan = {
        let mut probe = ModelProbe::new(&varmap, |b| loss(b.len, 0)).optimizer::<autobatch::optim::Sgd>(0.01).unwrap();
        Tuner::new().target_effective_batch(4 * largest).search(&mut probe, &mut meter).run().unwrap()
    };
    let optimizer = autobatch::optim::Sgd::new(varmap.all_vars(), 0.01).unwrap();
    let mut training = TrainLoop::new(&plan, &varmap, optimizer).unwrap();
    for step in 0..2 {
        meter.reset_peak().unwrap();
        training.step(&mut meter, |micro| loss(micro.len, step * 10_000 + micro.offset)).unwrap();
        let peak = meter.peak().unwrap();
        assert!(peak <= plan.limit_bytes(), "step {step} peaked at {peak} over {}:\n{plan}", plan.limit_bytes());
    }
}

/// Gradient checkpointing of a model written as a user writes it: the same
/// gradients, a lower peak, and a plan that trains under the ceiling.
fn checkpointing_keeps_the_gradients_and_lowers_the_peak() {
    let (varmap, model) = gpt(false);
    let frozen = Gpt::new(32, 4, 2, false, autobatch::model::detached(&varmap)).unwrap();
    let vars = varmap.all_vars();
    let (loss, grads) = model.checkpointed_loss(&frozen, &vars, 8, 0, SEQ).unwrap();
    let plain = model.loss(8, 0).unwrap();
    let plain_grads = plain.backward().unwrap();
    assert_eq!(loss.to_scalar::<f32>().unwrap(), plain.to_scalar::<f32>().unwrap());
    let mut worst = 0f32;
    for (name, var) in varmap.data().lock().unwrap().iter() {
        let (a, b) = (grads.get(var).unwrap(), plain_grads.get(var).unwrap());
        let scale = b.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap().max(f32::MIN_POSITIVE);
        let diff = (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(diff <= 1e-5 * scale, "{name}: gradients differ by {diff} (largest {scale})");
        worst = worst.max(diff / scale);
    }
    println!("  largest relative gradient difference: {worst:e}");
    drop((plain, plain_grads, grads));

    let mut meter = HeapMeter::with_room(20 * MIB).unwrap();
    let mut plain = ModelProbe::new(&varmap, |b| model.loss(b.len, 0))
        .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
        .unwrap();
    let without = Tuner::new().search(&mut plain, &mut meter).run().unwrap();
    drop(plain);
    let mut probe = ModelProbe::new(&varmap, |b| model.checkpointed_loss(&frozen, &vars, b.len, 0, SEQ))
        .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
        .unwrap();
    let with = Tuner::new().target_effective_batch(64).search(&mut probe, &mut meter).run().unwrap();
    drop(probe);
    let per_sample = |plan: &autobatch::Plan| plan.memory_model().unwrap().bytes_per_sample;
    println!(
        "  largest batch {} -> {}, {:.0} -> {:.0} bytes per sample",
        without.largest_batch(),
        with.largest_batch(),
        per_sample(&without),
        per_sample(&with)
    );
    assert!(with.largest_batch() > without.largest_batch(), "{with}\n{without}");
    assert!(per_sample(&with) < 0.85 * per_sample(&without), "{with}\n{without}");

    let optimizer = autobatch::optim::AdamW::new(varmap.all_vars(), ParamsAdamW::default()).unwrap();
    let mut training = TrainLoop::new(&with, &varmap, optimizer).unwrap();
    let mut losses = Vec::new();
    for step in 0..3 {
        meter.reset_peak().unwrap();
        let report = training
            .step(&mut meter, |micro| {
                model.checkpointed_loss(&frozen, &vars, micro.len, step * 1000 + micro.offset, SEQ)
            })
            .unwrap();
        let peak = meter.peak().unwrap();
        assert!(peak <= with.limit_bytes(), "step {step} peaked at {peak}:\n{with}");
        losses.push(report.loss.unwrap());
    }
    assert!(losses[2] < losses[0], "{losses:?}");
}

/// The plan's ceiling holds in training with each lean optimizer, probed with
/// its dry step and trained with the real one through `TrainLoop`.
fn training_with_each_lean_optimizer_stays_under_the_ceiling() {
    use autobatch::optim::{Adafactor, AdamW8bit, Lion, ParamsAdafactor, ParamsLion};
    fn check<O: Optimizer>(
        name: &str,
        probe_with: impl Fn(
            ModelProbe<&dyn Fn(MicroBatch) -> Result<Tensor>>,
        ) -> ModelProbe<&dyn Fn(MicroBatch) -> Result<Tensor>>,
        make: impl Fn(Vec<candle_core::Var>) -> O,
    ) {
        let (varmap, model) = gpt(false);
        let loss = |micro: MicroBatch| model.loss(micro.len, 0);
        let loss: &dyn Fn(MicroBatch) -> Result<Tensor> = &loss;
        let mut meter = HeapMeter::with_room(20 * MIB).unwrap();
        let plan = {
            let mut probe = probe_with(ModelProbe::new(&varmap, loss));
            let largest = Tuner::new().search(&mut probe, &mut meter).run().unwrap().largest_batch();
            Tuner::new().target_effective_batch(2 * largest).search(&mut probe, &mut meter).run().unwrap()
        };
        assert!(plan.accumulation_steps() > 1 && plan.accumulation_peak_bytes().is_some(), "{name}:\n{plan}");
        let mut training = TrainLoop::new(&plan, &varmap, make(varmap.all_vars())).unwrap();
        for step in 0..2 {
            meter.reset_peak().unwrap();
            training.step(&mut meter, |micro| model.loss(micro.len, step * 1000 + micro.offset)).unwrap();
            let peak = meter.peak().unwrap();
            assert!(peak <= plan.limit_bytes(), "{name}: step {step} peaked at {peak}:\n{plan}");
        }
    }
    check(
        "lion",
        |p| p.optimizer::<autobatch::optim::Lion>(ParamsLion::default()).unwrap(),
        |v| Lion::new(v, ParamsLion::default()).unwrap(),
    );
    check(
        "adafactor",
        |p| p.optimizer::<autobatch::optim::Adafactor>(ParamsAdafactor::default()).unwrap(),
        |v| Adafactor::new(v, ParamsAdafactor::default()).unwrap(),
    );
    check(
        "adamw8bit",
        |p| p.optimizer::<autobatch::optim::AdamW8bit>(candle_nn::ParamsAdamW::default()).unwrap(),
        |v| AdamW8bit::new(v, candle_nn::ParamsAdamW::default()).unwrap(),
    );
}

fn sgd_and_any_optimizer_change_nothing_either() {
    let (varmap, model) = gpt(false);
    let before = bits(&varmap);
    let mut meter = HeapMeter::with_room(20 * MIB).unwrap();
    let mut sgd = ModelProbe::new(&varmap, |b| model.loss(b.len, 0)).optimizer::<autobatch::optim::Sgd>(0.5).unwrap();
    let with_sgd = Tuner::new().search(&mut sgd, &mut meter).run().unwrap();
    drop(sgd);
    assert_eq!(bits(&varmap), before);
    let mut any = ModelProbe::new(&varmap, |b| model.loss(b.len, 0))
        .optimizer::<candle_nn::AdamW>(ParamsAdamW { lr: 0.5, ..Default::default() })
        .unwrap();
    let with_any = Tuner::new().search(&mut any, &mut meter).run().unwrap();
    assert_eq!(bits(&varmap), before, "the general path did not restore the weights");
    // the throwaway AdamW's new moments are measured: with the graph held
    // through the update, at batch 1, the update is the step's peak and they
    // show (later, or with the graph freed first, the backward pass
    // dominates); SGD has no state
    let mut any = any.graph_through_update(true);
    let mut sgd = ModelProbe::new(&varmap, |b| model.loss(b.len, 0))
        .optimizer::<autobatch::optim::Sgd>(0.5)
        .unwrap()
        .graph_through_update(true);
    sgd.step(1).unwrap(); // the first step also holds a copy of every variable, to find buffers
    let state = 2 * 4 * varmap.all_vars().iter().map(|v| v.elem_count() as u64).sum::<u64>();
    let (p_any, p_sgd) = (peak_of(&mut any, 1), peak_of(&mut sgd, 1));
    assert!(p_any >= p_sgd + state / 2, "moments of {state} bytes not measured: {p_any} vs {p_sgd}");
    assert!(with_any.largest_batch() <= with_sgd.largest_batch(), "{with_any}\n{with_sgd}");
    assert_eq!(bits(&varmap), before);
    assert!(any.cache_key().unwrap().to_string().contains("optimizer: candle_nn::optim::AdamW"));
    assert!(any.profile().is_none(), "a general optimizer's state is unknown");
}

fn the_evaluation_step_of_your_model_gets_its_own_larger_batch() {
    let (varmap, model) = gpt(false);
    // the same model built a second time over the same weights, with no graph
    let evaluation_model = Gpt::new(32, 4, 2, false, autobatch::model::detached(&varmap)).unwrap();
    let mut evaluation = |b: usize| evaluation_model.loss(b, 0)?.to_scalar::<f32>().map(drop);
    let mut probe = ModelProbe::new(&varmap, |b| model.loss(b.len, 0))
        .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
        .unwrap();
    let mut meter = HeapMeter::with_room(20 * MIB).unwrap();
    let plan = Tuner::new().search(&mut probe, &mut meter).evaluating(&mut evaluation).run().unwrap();
    let eval = plan.evaluation().unwrap();
    assert!(eval.largest_batch > 2 * plan.largest_batch(), "{plan}");
    // alone, the probe's AdamW moments freed: what a forward-only probe finds
    let during = eval.during_training.as_ref().expect("the probe freed AdamW's moments");
    let parameters: usize = varmap.all_vars().iter().map(|v| v.elem_count()).sum();
    assert_eq!(during.state_bytes, 8 * parameters as u64);
    assert!(during.largest_batch < eval.largest_batch, "{plan}");
    let mut forward_only = ModelProbe::new(&varmap, |b| evaluation_model.loss(b.len, 0)).forward_only();
    let alone = Tuner::new().search(&mut forward_only, &mut meter).run().unwrap();
    assert_eq!(alone.largest_batch(), eval.largest_batch, "{alone}\n{plan}");
    // same weights: the same loss
    let (train_loss, eval_loss) = (model.loss(4, 0).unwrap(), evaluation_model.loss(4, 0).unwrap());
    assert_eq!(train_loss.to_scalar::<f32>().unwrap(), eval_loss.to_scalar::<f32>().unwrap());
}

fn the_cache_key_and_the_advice_come_from_the_variables() {
    let (varmap, model) = gpt(false);
    let probe = ModelProbe::new(&varmap, |b| model.loss(b.len, 0)).key_param("seq_len", SEQ);
    let mut probe = probe.optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default()).unwrap();
    let key = probe.cache_key().unwrap().to_string();
    assert!(key.contains("blocks.0.qkv.weight: F32 [96, 32]") && key.contains("seq_len: 32"), "{key}");
    assert!(key.contains("optimizer: autobatch::optim::AdamW"), "{key}");
    let profile = probe.profile().unwrap();
    let parameters: usize = varmap.all_vars().iter().map(|v| v.elem_count()).sum();
    assert_eq!(profile.parameters, parameters as u64);
    // nothing fits without room above what the process holds: the advice is computed from the variables
    match Tuner::new().search(&mut probe, &mut HeapMeter::with_room(0).unwrap()).run() {
        Err(Error::NothingFits { remedies, .. }) => assert!(!remedies.is_empty()),
        other => panic!("{other:?}"),
    }
    // and a cache hit skips probing
    let path = std::env::temp_dir().join(format!("autobatch-your-model-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let tuner = Tuner::new().cache(&path);
    // the same device twice: one budget
    let budget = HeapMeter::with_room(20 * MIB).unwrap().budget_bytes();
    let first = tuner.search(&mut probe, &mut HeapMeter::new(budget).unwrap()).run().unwrap();
    let second = tuner.search(&mut probe, &mut HeapMeter::new(budget).unwrap()).run().unwrap();
    assert!(!first.cached() && second.cached() && first.largest_batch() == second.largest_batch());
    let _ = std::fs::remove_file(&path);
}

/// Your model at several sequence lengths (`ModelProbe::by_size`): each
/// length's plan trains under the ceiling with `TrainLoop` and candle-nn's
/// AdamW, a length in between fits at its predicted batch, and the plan
/// cache keeps the lengths apart.
fn your_model_tuned_at_several_lengths_trains_under_the_ceiling_at_each() {
    use autobatch::plan::BatchSource;
    let (varmap, model) = gpt(false);
    let mut meter = HeapMeter::with_room(20 * MIB).unwrap();
    let dir = std::env::temp_dir().join(format!("autobatch-your-model-lengths-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cache = dir.join("plans.json");
    let tuner = Tuner::new().cache(&cache);
    let plan = {
        let loss = |batch: autobatch::MicroBatch, len: usize| model.loss_of_length(batch.len, 0, len);
        let mut probe = ModelProbe::by_size(&varmap, SEQ, loss)
            .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
            .unwrap();
        let plan = tuner.search(&mut probe, &mut meter).sizes(&[8, 16, SEQ]).unwrap();
        let again = tuner.search(&mut probe, &mut meter).sizes(&[8, 16, SEQ]).unwrap();
        assert!(again.cached(), "{again}");
        plan
    };
    eprintln!("{plan}");
    let batches: Vec<usize> = plan.sizes.values().map(|plan| plan.largest_batch()).collect();
    assert!(batches[0] > batches[1] && batches[1] > batches[2], "{plan}");
    let predicted = plan.batch_for(24).unwrap();
    assert_eq!(predicted.source, BatchSource::Predicted);
    assert!(predicted.batch <= batches[1] && predicted.batch >= batches[2], "{predicted:?}\n{plan}");
    {
        let loss = |batch: autobatch::MicroBatch, len: usize| model.loss_of_length(batch.len, 0, len);
        let mut probe = ModelProbe::by_size(&varmap, 24, loss)
            .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
            .unwrap();
        let peak = peak_of(&mut probe, predicted.batch);
        assert!(peak <= plan.limit_bytes + TOLERANCE, "predicted {predicted:?} peaks at {peak}\n{plan}");
    }
    // one optimizer throughout, each step at its bucket's plan
    let optimizer = autobatch::optim::AdamW::new(varmap.all_vars(), ParamsAdamW::default()).unwrap();
    let shortest = plan.sizes.values().next().unwrap();
    let mut training = TrainLoop::new(shortest, &varmap, optimizer).unwrap();
    for (&size, at_size) in plan.sizes.iter().rev() {
        training.switch_plan(at_size).unwrap();
        assert_eq!(training.guard().micro_batch(), at_size.micro_batch());
        for step in 0..2 {
            meter.reset_peak().unwrap();
            training
                .step(&mut meter, |micro| model.loss_of_length(micro.len, step * 1000 + micro.offset, size))
                .unwrap();
            let peak = meter.peak().unwrap();
            assert!(peak <= plan.limit_bytes, "length {size} step {step} peaked at {peak}\n{plan}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The longest length of your model at a fixed batch (`Search::longest`
/// over `ModelProbe::by_size`): the answer's step fits, one token longer
/// does not, no weight changed, the probe is left at its length, and a real
/// training step at the answer stays under the ceiling.
fn your_models_longest_length_at_a_batch_is_exact() {
    use autobatch::{Resizable, plan::SizeRange};
    let (varmap, model) = gpt(false);
    let before = bits(&varmap);
    let mut meter = HeapMeter::with_room(20 * MIB).unwrap();
    let loss = |batch: autobatch::MicroBatch, len: usize| model.loss_of_length(batch.len, 0, len);
    let mut probe =
        ModelProbe::by_size(&varmap, SEQ, loss).optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default()).unwrap();
    // a batch that fits at the shortest lengths and not at SEQ
    let at_seq = Tuner::new().search(&mut probe, &mut meter).run().unwrap().largest_batch();
    let batch = 2 * at_seq;
    let longest = Tuner::new().search(&mut probe, &mut meter).longest(batch, SizeRange::up_to(SEQ)).unwrap();
    eprint!("{}", longest.summary("sequence length"));
    let (len, limit) = (longest.largest_size, longest.limit_bytes());
    assert!(longest.proven_longest && len < SEQ, "{longest:?}");
    assert_eq!(probe.size(), SEQ);
    drop(longest);
    assert!(bits(&varmap) == before, "probing changed a weight");
    probe.resize(len).unwrap();
    let fits = peak_of(&mut probe, batch);
    probe.resize(len + 1).unwrap();
    let next = peak_of(&mut probe, batch);
    assert!(fits <= limit + TOLERANCE, "length {len} at batch {batch} peaks at {fits} > {limit}");
    assert!(next > limit - TOLERANCE, "length {} at batch {batch} peaks at {next} <= {limit}", len + 1);
    drop(probe);
    // training at that length and batch: backward, then candle-nn's AdamW
    let mut optimizer = autobatch::optim::AdamW::new(varmap.all_vars(), ParamsAdamW::default()).unwrap();
    optimizer.step(&model.loss_of_length(batch, 1, len).unwrap().backward().unwrap()).unwrap(); // the moments exist
    TrackingAllocator::reset_peak();
    let grads = model.loss_of_length(batch, 2, len).unwrap().backward().unwrap();
    optimizer.step(&grads).unwrap();
    drop(grads);
    let trained = TrackingAllocator::peak_bytes();
    assert!(trained <= limit, "training at batch {batch}, length {len} peaked at {trained} > {limit}");
}

/// `TrainLoop::step` scales the loss and the gradients a closure returns itself:
/// one accumulated step with checkpointing moves the weights as `step` does
/// with the plain backward pass (no scale applied by hand). And a
/// checkpointed model tunes at several lengths (`by_size`, its closure returning the gradients),
/// each length's plan training under the ceiling.
fn checkpointing_needs_no_hand_applied_scale_and_tunes_by_length() {
    let (varmap, model) = gpt(false);
    let frozen = Gpt::new(32, 4, 2, false, autobatch::model::detached(&varmap)).unwrap();
    let vars = varmap.all_vars();
    let mut meter = HeapMeter::with_room(20 * MIB).unwrap();
    let plan = {
        let mut probe = ModelProbe::new(&varmap, |b| model.checkpointed_loss(&frozen, &vars, b.len, 0, SEQ))
            .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
            .unwrap();
        Tuner::new().max_batch(6).target_effective_batch(21).search(&mut probe, &mut meter).run().unwrap()
    };
    assert!(plan.accumulation_steps() > 1, "{plan}");
    let weights = || -> Vec<Tensor> { vars.iter().map(|v| v.as_tensor().copy().unwrap()).collect() };
    let start = weights();
    let sgd = || <candle_nn::SGD as Optimizer>::new(vars.clone(), 0.5).unwrap();
    let mut plain = TrainLoop::new(&plan, &varmap, sgd()).unwrap();
    let plain_report = plain.step(&mut meter, |micro| model.loss(micro.len, micro.offset)).unwrap();
    let after_plain = weights();
    for (var, value) in vars.iter().zip(&start) {
        var.set(value).unwrap();
    }
    let mut checkpointed = TrainLoop::new(&plan, &varmap, sgd()).unwrap();
    let report = checkpointed
        .step(&mut meter, |micro| model.checkpointed_loss(&frozen, &vars, micro.len, micro.offset, SEQ))
        .unwrap();
    let (a, b) = (plain_report.loss.unwrap(), report.loss.unwrap());
    assert!((a - b).abs() <= 1e-6 * a.abs(), "mean losses {a} and {b}");
    for ((plain, checkpointed), start) in after_plain.iter().zip(weights()).zip(&start) {
        let moved = (plain - start).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        let diff = (plain - &checkpointed).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(diff <= 1e-4 * moved.max(1e-6), "the steps differ by {diff}, the weights moved by {moved}");
    }

    let mut probe = ModelProbe::by_size(&varmap, SEQ, |b, len| model.checkpointed_loss(&frozen, &vars, b.len, 0, len))
        .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
        .unwrap();
    let sizes = Tuner::new().search(&mut probe, &mut meter).sizes(&[SEQ / 2, SEQ]).unwrap();
    drop(probe);
    assert!(sizes.sizes[&(SEQ / 2)].largest_batch() > sizes.sizes[&SEQ].largest_batch(), "{sizes}");
    for (&len, plan) in &sizes.sizes {
        assert!(plan.proven_largest(), "{plan}");
        let optimizer = autobatch::optim::AdamW::new(varmap.all_vars(), ParamsAdamW::default()).unwrap();
        let mut training = TrainLoop::new(plan, &varmap, optimizer).unwrap();
        meter.reset_peak().unwrap();
        training
            .step(&mut meter, |micro| model.checkpointed_loss(&frozen, &vars, micro.len, micro.offset, len))
            .unwrap();
        let peak = meter.peak().unwrap();
        assert!(peak <= plan.limit_bytes(), "length {len}: training peaked at {peak}:\n{plan}");
    }
}

/// The plan's peak is what a `TrainLoop` step holds at its batch, within 1%,
/// single step and accumulating, on the GPT (an additive mask: candle gives it
/// a gradient the size of the attention scores) and a wide MLP; the whole
/// gradient store held through the update is measured on request (more, where
/// the update is the step's peak).
fn the_plan_peak_is_what_a_train_loop_step_holds() {
    let (gpt_vars, gpt) = gpt(false);
    let mlp_vars = VarMap::new();
    let vb = VarBuilder::from_varmap(&mlp_vars, DType::F32, &Device::Cpu);
    let layers: Vec<Linear> = [(256, 512, "fc1"), (512, 512, "fc2"), (512, 10, "head")]
        .into_iter()
        .map(|(i, o, name)| linear(i, o, vb.pp(name)).unwrap())
        .collect();
    type Loss<'a> = Box<dyn Fn(usize, usize) -> Result<Tensor> + 'a>;
    let cases: [(&str, &VarMap, Loss, usize); 2] = [
        ("gpt", &gpt_vars, Box::new(|b, offset| gpt.loss(b, offset)), 6),
        ("mlp", &mlp_vars, Box::new(|b, offset| wide_mlp_loss(&layers, b, offset)), 96),
    ];
    let mut meter = HeapMeter::with_room(230 * MIB).unwrap();
    for (name, varmap, loss, micro) in &cases {
        let (micro, loss) = (*micro, loss);
        for k in [1, 4] {
            let plan = {
                let mut probe = ModelProbe::new(varmap, |b| loss(b.len, 0))
                    .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
                    .unwrap();
                let tuner = Tuner::new().start(micro).max_batch(micro).target_effective_batch(micro * k);
                tuner.search(&mut probe, &mut meter).run().unwrap()
            };
            assert_eq!((plan.micro_batch(), plan.accumulation_steps()), (micro, k), "{plan}");
            let kind =
                if k == 1 { autobatch::plan::TrialKind::Search } else { autobatch::plan::TrialKind::Accumulation };
            let trial = plan.trials().iter().rev().find(|t| t.kind == kind && t.batch == micro).unwrap();
            let probed = trial.peak_bytes.unwrap() - trial.baseline_bytes;

            let optimizer = autobatch::optim::AdamW::new(varmap.all_vars(), ParamsAdamW::default()).unwrap();
            let mut training = TrainLoop::new(&plan, varmap, optimizer).unwrap();
            let mut step = |meter: &mut HeapMeter| {
                let before = meter.in_use().unwrap();
                meter.reset_peak().unwrap();
                training.step(meter, |m| loss(m.len, m.offset)).unwrap();
                meter.peak().unwrap() - before
            };
            step(&mut meter);
            let trained = step(&mut meter);
            let gap = probed.abs_diff(trained) as f64 / trained as f64;
            assert!(gap <= 0.01, "{name}, k = {k}: the plan's step holds {probed}, TrainLoop's {trained}");
        }
        // the store `loss.backward()` returns, held through the update, holds more than the variables' gradients
        let mut held = |whole: bool| {
            let mut probe = ModelProbe::new(varmap, |b| loss(b.len, 0))
                .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
                .unwrap()
                .grad_store_through_update(whole);
            probe.step(micro).unwrap();
            let before = meter.in_use().unwrap();
            meter.reset_peak().unwrap();
            probe.step(micro).unwrap();
            meter.peak().unwrap() - before
        };
        let (lean, whole) = (held(false), held(true));
        // never less; more only where the update is the step's peak (AdamW's
        // update, a slice at a time, is neither model's peak here)
        assert!(whole >= lean, "{name}: {whole} holding the whole store, {lean} the variables' gradients");
    }
}

/// A user's own decoder with candle-nn layers and candle-nn's KV cache (one
/// per sequence, made whole at the context on its first append), served by
/// one step per sequence, behind `serve::Server`: the probe's answer fits
/// with every cache full and the worst step, one more does not, both run
/// with no search; the caches' bytes per token are the layer's.
fn a_users_own_server_finds_how_many_sequences_fit() {
    use autobatch::serve::{Scheduling, Server};
    use candle_nn::kv_cache::KvCache;
    const HIDDEN: usize = 32;
    const HEADS: usize = 4;
    const HEAD_DIM: usize = HIDDEN / HEADS;
    const VOCAB: usize = 64;

    struct TinyDecoder {
        embed: Embedding,
        q: Linear,
        k: Linear,
        v: Linear,
        o: Linear,
        head: Linear,
    }

    impl TinyDecoder {
        /// `tokens` appended to `cache`: the last token's logits.
        fn step(&self, cache: &mut KvCache, tokens: &[u32]) -> Result<Tensor> {
            let x = self.embed.forward(&Tensor::new(tokens, &Device::Cpu)?.unsqueeze(0)?)?;
            let s = tokens.len();
            let split = |t: Tensor| t.reshape((1, s, HEADS, HEAD_DIM))?.transpose(1, 2)?.contiguous();
            let (q, k, v) = (split(self.q.forward(&x)?)?, split(self.k.forward(&x)?)?, split(self.v.forward(&x)?)?);
            let (k, v) = cache.append(&k, &v)?;
            let len = k.dim(2)?;
            let scores = (q.matmul(&k.t()?)? / (HEAD_DIM as f64).sqrt())?;
            // causal: the chunk's queries are the last s of the keys' positions
            let mask: Vec<f32> = (0..s)
                .flat_map(|i| (0..len).map(move |j| if j > len - s + i { f32::NEG_INFINITY } else { 0.0 }))
                .collect();
            let scores = scores.broadcast_add(&Tensor::from_vec(mask, (s, len), &Device::Cpu)?)?;
            let out = ops::softmax_last_dim(&scores)?.matmul(&v.contiguous()?)?;
            let out = out.transpose(1, 2)?.reshape((1, s, HIDDEN))?;
            self.head.forward(&(x + self.o.forward(&out)?)?.narrow(1, s - 1, 1)?)
        }
    }

    struct UsersServer(TinyDecoder);

    impl Server for UsersServer {
        type Caches = Vec<KvCache>;

        fn allocate(&mut self, sequences: usize, context: usize, chunk: usize) -> Result<Vec<KvCache>> {
            (0..sequences)
                .map(|index| {
                    let mut cache = KvCache::new(2, context);
                    let held = context - if index == 0 { chunk } else { 1 };
                    let zeros = Tensor::zeros((1, HEADS, held, HEAD_DIM), DType::F32, &Device::Cpu)?;
                    cache.append(&zeros, &zeros)?;
                    Ok(cache)
                })
                .collect()
        }

        fn cache_bytes(&self, caches: &Vec<KvCache>) -> u64 {
            let bytes = |t: &Option<Tensor>| t.as_ref().map_or(0, |t| t.elem_count() * t.dtype().size_in_bytes());
            caches.iter().map(|c| (bytes(c.k_cache().all_data()) + bytes(c.v_cache().all_data())) as u64).sum()
        }

        fn worst_step(&mut self, caches: &mut Vec<KvCache>, chunk: usize) -> Result<()> {
            for (index, cache) in caches.iter_mut().enumerate() {
                let count = if index == 0 { chunk } else { 1 };
                let tokens: Vec<u32> = (0..count).map(|t| (t % VOCAB) as u32).collect();
                self.0.step(cache, &tokens)?;
            }
            Ok(())
        }
    }

    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let model = TinyDecoder {
        embed: embedding(VOCAB, HIDDEN, vb.pp("embed")).unwrap(),
        q: linear(HIDDEN, HIDDEN, vb.pp("q")).unwrap(),
        k: linear(HIDDEN, HIDDEN, vb.pp("k")).unwrap(),
        v: linear(HIDDEN, HIDDEN, vb.pp("v")).unwrap(),
        o: linear(HIDDEN, HIDDEN, vb.pp("o")).unwrap(),
        head: linear(HIDDEN, VOCAB, vb.pp("head")).unwrap(),
    };
    let mut server = UsersServer(model);
    let mut meter = HeapMeter::with_room(4 << 20).unwrap();
    let shape = Scheduling::new(128).max_num_batched_tokens(32);
    let plan = Tuner::new().search(&mut server, &mut meter).sequences(&shape).unwrap();
    let n = plan.max_sequences;
    assert!(plan.proven && n > 10 && plan.kv_blocks.is_none(), "{plan:?}");
    // keys and values of every head, f32, over the tokens held
    assert_eq!(plan.cache_bytes_per_token, (2 * HIDDEN * 4) as f64, "{plan:?}");
    let fits = Tuner::new().search(&mut server, &mut meter).measure(n, &shape).unwrap();
    let over = Tuner::new().search(&mut server, &mut meter).measure(n + 1, &shape).unwrap();
    assert!(fits.fits && !over.fits, "{n}: {fits:?}, {}: {over:?}", n + 1);
}

/// The tests of this file, in the order they run.
/// A vision transformer as a user writes it: a strided `conv2d` cuts the
/// image into patches, a class token and positions are variables of the
/// `VarMap`, pre-norm blocks (the layer norm the tuner's error names in
/// place of candle-nn's fused one) with candle-nn's differentiable softmax
/// and a GELU MLP, the class token's head; trained with `candle_nn::AdamW`.
struct Vit {
    patches: candle_nn::Conv2d,
    class_token: Tensor,
    positions: Tensor,
    blocks: Vec<Block>,
    norm: Norm,
    head: Linear,
}

const IMAGE: usize = 32;
const PATCH: usize = 4;
const CLASSES: usize = 4;

impl Vit {
    fn new(d: usize, layers: usize, vb: VarBuilder) -> Result<Vit> {
        let conv = candle_nn::Conv2dConfig { stride: PATCH, ..Default::default() };
        let tokens = (IMAGE / PATCH).pow(2) + 1;
        let blocks = (0..layers)
            .map(|i| {
                let vb = vb.pp(format!("blocks.{i}"));
                Ok(Block {
                    ln1: Norm::new(d, false, vb.pp("ln1"))?,
                    qkv: linear(d, 3 * d, vb.pp("qkv"))?,
                    proj: linear(d, d, vb.pp("proj"))?,
                    ln2: Norm::new(d, false, vb.pp("ln2"))?,
                    fc1: linear(d, 2 * d, vb.pp("fc1"))?,
                    fc2: linear(2 * d, d, vb.pp("fc2"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Vit {
            patches: candle_nn::conv2d(3, d, PATCH, conv, vb.pp("patches"))?,
            class_token: vb.get_with_hints(
                (1, 1, d),
                "class_token",
                candle_nn::Init::Randn { mean: 0., stdev: 0.02 },
            )?,
            positions: vb.get_with_hints(
                (1, tokens, d),
                "positions",
                candle_nn::Init::Randn { mean: 0., stdev: 0.02 },
            )?,
            blocks,
            norm: Norm::new(d, false, vb.pp("norm"))?,
            head: linear(d, CLASSES, vb.pp("head"))?,
        })
    }

    /// Samples `offset..offset + batch`: each class a pattern of its own,
    /// each sample a variation of it.
    fn images(batch: usize, offset: usize) -> Result<(Tensor, Tensor)> {
        let pixels = 3 * IMAGE * IMAGE;
        let labels: Vec<u32> = (offset..offset + batch).map(|i| (i % CLASSES) as u32).collect();
        let values: Vec<f32> = labels
            .iter()
            .zip(offset..)
            .flat_map(|(&class, sample)| {
                (0..pixels).map(move |j| {
                    (0.05 * (j + 1) as f32 * (class + 1) as f32).sin() + 0.1 * (0.7 * j as f32 + sample as f32).sin()
                })
            })
            .collect();
        let images = Tensor::from_vec(values, (batch, 3, IMAGE, IMAGE), &Device::Cpu)?;
        Ok((images, Tensor::new(labels, &Device::Cpu)?))
    }

    fn attention(&self, block: &Block, x: &Tensor) -> Result<Tensor> {
        let (b, t, d) = x.dims3()?;
        let heads = 4;
        let qkv = block.qkv.forward(x)?.reshape((b, t, 3, heads, d / heads))?.permute((2, 0, 3, 1, 4))?;
        let (q, k, v) = (qkv.get(0)?.contiguous()?, qkv.get(1)?.contiguous()?, qkv.get(2)?.contiguous()?);
        let scores = (q.matmul(&k.t()?)? / ((d / heads) as f64).sqrt())?;
        let out = ops::softmax(&scores, D::Minus1)?.matmul(&v)?;
        block.proj.forward(&out.transpose(1, 2)?.reshape((b, t, d))?)
    }

    fn loss(&self, batch: usize, offset: usize) -> Result<Tensor> {
        let (images, labels) = Vit::images(batch, offset)?;
        // (b, d, 8, 8) -> (b, 64, d), the class token first
        let patches = self.patches.forward(&images)?.flatten_from(2)?.transpose(1, 2)?;
        let class_token = self.class_token.broadcast_as((batch, 1, patches.dim(2)?))?;
        let mut x = Tensor::cat(&[&class_token, &patches], 1)?.broadcast_add(&self.positions)?;
        for block in &self.blocks {
            x = (&x + self.attention(block, &block.ln1.forward(&x)?)?)?;
            let mlp = block.fc2.forward(&block.fc1.forward(&block.ln2.forward(&x)?)?.gelu()?)?;
            x = (x + mlp)?;
        }
        let class = self.norm.forward(&x.narrow(1, 0, 1)?.squeeze(1)?)?;
        loss::cross_entropy(&self.head.forward(&class)?, &labels)
    }
}

/// The ViT: the largest batch exact by brute force, probing changes no
/// weight, and a plan that accumulates to an odd target trains under its
/// ceiling with `candle_nn::AdamW` through `TrainLoop`, the same loss closure
/// as the probe's, beside the probe (no drop), the loss falling.
fn a_vision_transformer_tunes_exactly_and_trains_under_the_plan() {
    let varmap = VarMap::new();
    let vit = Vit::new(64, 2, VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu)).unwrap();
    let before = bits(&varmap);
    let loss = |micro: MicroBatch| vit.loss(micro.len, micro.offset);
    let params = ParamsAdamW { lr: 1e-3, ..Default::default() };
    let mut meter = HeapMeter::with_room(24 * MIB).unwrap();
    let mut probe = ModelProbe::new(&varmap, loss).optimizer::<candle_nn::AdamW>(params.clone()).unwrap();
    let plan = Tuner::new().search(&mut probe, &mut meter).run().unwrap();
    let (largest, limit) = (plan.largest_batch(), plan.limit_bytes());
    assert!(plan.proven_largest() && largest >= 4, "{plan}");
    assert!(peak_of(&mut probe, largest) <= limit + TOLERANCE, "batch {largest} is over\n{plan}");
    assert!(peak_of(&mut probe, largest + 1) > limit.saturating_sub(TOLERANCE), "{} fits\n{plan}", largest + 1);
    assert_eq!(probe.variables_without_gradient(), Some(&[][..]), "every variable trains");

    let target = 2 * largest + 1;
    let plan = Tuner::new().target_effective_batch(target).search(&mut probe, &mut meter).run().unwrap();
    assert!(plan.accumulation_steps() > 1, "{plan}");
    assert_eq!(bits(&varmap), before, "probing changed a weight");
    println!("  vit: largest batch {largest}, {target} = {} micro-steps", plan.accumulation_steps());

    let optimizer = candle_nn::AdamW::new(varmap.all_vars(), params).unwrap();
    let mut training = TrainLoop::new(&plan, &varmap, optimizer).unwrap();
    let mut losses = Vec::new();
    for step in 0..4 {
        meter.reset_peak().unwrap();
        let report = training.step(&mut meter, loss).unwrap();
        let peak = meter.peak().unwrap();
        assert!(peak <= plan.limit_bytes(), "step {step} peaked at {peak} over {}:\n{plan}", plan.limit_bytes());
        assert_eq!((report.samples, report.out_of_memory), (target, 0), "{plan}");
        losses.push(report.loss.unwrap());
    }
    println!("  vit: loss {:.3} -> {:.3}", losses[0], losses[3]);
    assert!(losses[3] < losses[0], "{losses:?}");
}

pub fn tests() -> Vec<(&'static str, fn())> {
    vec![
        ("a_users_own_server_finds_how_many_sequences_fit", a_users_own_server_finds_how_many_sequences_fit),
        (
            "a_vision_transformer_tunes_exactly_and_trains_under_the_plan",
            a_vision_transformer_tunes_exactly_and_trains_under_the_plan,
        ),
        (
            "your_model_switched_to_the_lean_ops_is_exact_and_fits_more",
            your_model_switched_to_the_lean_ops_is_exact_and_fits_more,
        ),
        ("an_answer_does_not_depend_on_what_ran_before", an_answer_does_not_depend_on_what_ran_before),
        ("your_models_longest_length_at_a_batch_is_exact", your_models_longest_length_at_a_batch_is_exact),
        ("the_answer_is_exact_and_probing_changes_no_weight", the_answer_is_exact_and_probing_changes_no_weight),
        ("a_fused_op_that_cuts_gradients_is_named", a_fused_op_that_cuts_gradients_is_named),
        (
            "training_with_accumulation_at_the_largest_batch_stays_under_the_ceiling",
            training_with_accumulation_at_the_largest_batch_stays_under_the_ceiling,
        ),
        (
            "an_accumulating_plan_steps_its_micro_batch_down_until_the_accumulator_fits",
            an_accumulating_plan_steps_its_micro_batch_down_until_the_accumulator_fits,
        ),
        ("accumulated_gradients_hold_no_activations", accumulated_gradients_hold_no_activations),
        (
            "checkpointing_keeps_the_gradients_and_lowers_the_peak",
            checkpointing_keeps_the_gradients_and_lowers_the_peak,
        ),
        (
            "training_with_each_lean_optimizer_stays_under_the_ceiling",
            training_with_each_lean_optimizer_stays_under_the_ceiling,
        ),
        ("sgd_and_any_optimizer_change_nothing_either", sgd_and_any_optimizer_change_nothing_either),
        (
            "the_evaluation_step_of_your_model_gets_its_own_larger_batch",
            the_evaluation_step_of_your_model_gets_its_own_larger_batch,
        ),
        ("the_cache_key_and_the_advice_come_from_the_variables", the_cache_key_and_the_advice_come_from_the_variables),
        (
            "your_model_tuned_at_several_lengths_trains_under_the_ceiling_at_each",
            your_model_tuned_at_several_lengths_trains_under_the_ceiling_at_each,
        ),
        (
            "checkpointing_needs_no_hand_applied_scale_and_tunes_by_length",
            checkpointing_needs_no_hand_applied_scale_and_tunes_by_length,
        ),
        ("a_forward_only_probe_measures_serving", a_forward_only_probe_measures_serving),
        (
            "state_kept_between_steps_is_named_and_a_reset_clears_it",
            state_kept_between_steps_is_named_and_a_reset_clears_it,
        ),
        ("an_op_without_a_backward_pass_is_named", an_op_without_a_backward_pass_is_named),
        ("the_plan_peak_is_what_a_train_loop_step_holds", the_plan_peak_is_what_a_train_loop_step_holds),
    ]
}
