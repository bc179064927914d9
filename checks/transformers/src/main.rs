//! candle-transformers models with tiny configurations, probed as a user
//! would (a `VarMap`, random weights, `ModelProbe`, the CPU heap meter):
//!
//! - BERT as candle-transformers ships it: its fused LayerNorm cuts the graph,
//!   so the plan is demoted (partial graph, not proven) and a strict tuner
//!   refuses it; no variable changes;
//! - the same BERT forked with `autobatch_models::ops::nn::LayerNorm` (three lines): the
//!   whole graph, an exact answer by brute force, below the demoted one;
//! - its forward pass alone (`ModelProbe::new(..).forward_only()` over `detached`);
//! - its longest input at twice that batch (`Search::longest`), exact, and
//!   a real training step there under the ceiling;
//! - Qwen2, whose KV cache grows with every forward pass, probed twice in a
//!   row with a reset hook;
//! - `autobatch_models` (llama, mistral, qwen2, qwen3, bert) against
//!   candle-transformers' models on the same weights: the same logits
//!   (`logits.rs`).

#[global_allocator]
static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();

#[allow(dead_code, clippy::all)]
mod bert_fork;
mod logits;

use std::cell::RefCell;
use std::rc::Rc;

use autobatch::model::detached;
use autobatch::{Error, HeapMeter, MemoryMeter, ModelProbe, Plan, Tuner, Workload};
use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::{ParamsAdamW, VarBuilder, VarMap, linear, loss};

const BUDGET: u64 = 64 << 20;
const SEQ: usize = 64;
const VOCAB: usize = 1000;

fn bert_config() -> String {
    format!(
        r#"{{"vocab_size": {VOCAB}, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 512, "hidden_act": "gelu", "hidden_dropout_prob": 0.0, "max_position_embeddings": 128,
        "type_vocab_size": 2, "initializer_range": 0.02, "layer_norm_eps": 1e-12, "pad_token_id": 0,
        "classifier_dropout": null, "model_type": "bert"}}"#
    )
}

fn tokens(batch: usize) -> Result<Tensor> {
    tokens_of_length(batch, SEQ)
}

fn tokens_of_length(batch: usize, len: usize) -> Result<Tensor> {
    let ids: Vec<u32> = (0..batch * len).map(|i| ((i * 7919) % VOCAB) as u32).collect();
    Tensor::from_vec(ids, (batch, len), &Device::Cpu)
}

/// Every variable's bits, by name.
fn bits(varmap: &VarMap) -> Vec<(String, Vec<u32>)> {
    let data = varmap.data().lock().unwrap();
    let mut all: Vec<_> = data
        .iter()
        .map(|(n, v)| (n.clone(), v.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap()))
        .map(|(n, v)| (n, v.into_iter().map(f32::to_bits).collect::<Vec<_>>()))
        .collect();
    all.sort();
    all
}

/// The probe's step peak at `batch`.
fn peak<W: Workload>(probe: &mut W, meter: &mut HeapMeter, batch: usize) -> u64 {
    meter.reset_peak().unwrap();
    probe.step(batch).unwrap();
    meter.peak().unwrap()
}

/// Brute force: the answer fits, the next batch does not.
fn exact<W: Workload>(name: &str, probe: &mut W, meter: &mut HeapMeter, plan: &Plan) {
    let b = plan.largest_batch();
    let (at, above) = (peak(probe, meter, b), peak(probe, meter, b + 1));
    let limit = plan.limit_bytes();
    assert!(at <= limit && above > limit, "{name}: batch {b} peaks at {at}, {} at {above}, limit {limit}", b + 1);
}

/// A BERT encoder and a token head, as candle-transformers ships it or forked.
enum Bert {
    Original(candle_transformers::models::bert::BertModel),
    Fork(bert_fork::BertModel),
}

impl Bert {
    fn load(vb: VarBuilder, forked: bool) -> Bert {
        if forked {
            let config: bert_fork::Config = serde_json::from_str(&bert_config()).unwrap();
            Bert::Fork(bert_fork::BertModel::load(vb, &config).unwrap())
        } else {
            let config: candle_transformers::models::bert::Config = serde_json::from_str(&bert_config()).unwrap();
            Bert::Original(candle_transformers::models::bert::BertModel::load(vb, &config).unwrap())
        }
    }

    fn hidden(&self, ids: &Tensor) -> Result<Tensor> {
        let types = ids.zeros_like()?;
        match self {
            Bert::Original(model) => model.forward(ids, &types, None),
            Bert::Fork(model) => model.forward(ids, &types, None),
        }
    }
}

/// Tunes BERT (`forked` or not) with AdamW under 64 MiB; returns the plan.
fn bert(forked: bool) -> Plan {
    let name = if forked { "BERT fork" } else { "BERT" };
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let head = linear(128, VOCAB, vb.pp("head")).unwrap();
    let model = Bert::load(vb.pp("bert"), forked);
    let loss = |batch: autobatch::MicroBatch| -> Result<Tensor> {
        let ids = tokens(batch.len)?;
        let logits = head.forward(&model.hidden(&ids)?)?.reshape((batch.len * SEQ, VOCAB))?;
        loss::cross_entropy(&logits, &ids.flatten_all()?)
    };
    let before = bits(&varmap);
    let mut meter = HeapMeter::new(BUDGET).unwrap();
    let mut probe =
        ModelProbe::new(&varmap, loss).optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default()).unwrap();
    // the partial answer of an unforked model's cut graph, asked for (refused by default, below)
    let plan = Tuner::new().allow_partial_graph(!forked).search(&mut probe, &mut meter).run().unwrap();
    assert!(bits(&varmap) == before, "{name}: tuning changed a variable");
    let of = varmap.all_vars().len();
    let cut = probe.variables_without_gradient().unwrap().len();
    println!(
        "{name}: largest batch {} ({}), measured graph {}: {cut} of {of} variables without a gradient",
        plan.largest_batch(),
        if plan.proven_largest() { "proven" } else { "not proven" },
        if plan.complete_graph() { "complete" } else { "partial" }
    );
    if forked {
        assert_eq!((plan.complete_graph(), cut), (true, 0), "{plan}");
        assert!(plan.proven_largest(), "{plan}");
        exact(name, &mut probe, &mut meter, &plan);
        // its forward pass alone, over the same weights detached
        let serving = Bert::load(detached(&varmap).pp("bert"), true);
        let forward = |batch: autobatch::MicroBatch| serving.hidden(&tokens(batch.len)?);
        let mut forward_only = ModelProbe::new(&varmap, forward).forward_only();
        let served = Tuner::new().search(&mut forward_only, &mut meter).run().unwrap();
        assert!(served.warnings().is_empty() && served.largest_batch() > plan.largest_batch(), "{served}");
        exact("BERT fork, forward only", &mut forward_only, &mut meter, &served);
        println!(
            "{name}, forward only (the probe freed its AdamW moments when its search ended): largest batch {} (proven)",
            served.largest_batch()
        );
        // evaluating: evaluation between training steps, then alone with the probe's moments freed
        let mut evaluation = |batch: usize| serving.hidden(&tokens(batch)?).map(drop);
        let with_eval = Tuner::new().search(&mut probe, &mut meter).evaluating(&mut evaluation).run().unwrap();
        let eval = with_eval.evaluation().unwrap();
        let during = eval.during_training.as_ref().expect("the probe frees AdamW's moments");
        assert!(during.largest_batch <= served.largest_batch(), "{with_eval}");
        let alone = Tuner::new().search(&mut forward_only, &mut meter).run().unwrap();
        assert_eq!(alone.largest_batch(), eval.largest_batch, "{alone}\n{with_eval}");
        assert_eq!(alone.largest_batch(), served.largest_batch(), "{alone}\n{served}");
        exact("BERT fork, forward only alone", &mut forward_only, &mut meter, &alone);
        println!(
            "{name}, evaluating: evaluation alone {} (a forward-only probe with the moments freed: {}), \
             between training steps {} ({} of moments)",
            eval.largest_batch,
            alone.largest_batch(),
            during.largest_batch,
            autobatch::Bytes(during.state_bytes)
        );
    } else {
        assert!(!plan.complete_graph(), "{plan}");
        assert!(!plan.proven_largest() && cut > 0, "{plan}");
        match Tuner::new().search(&mut probe, &mut meter).run() {
            Err(Error::PartialGraph { variables, .. }) => assert_eq!(variables.len(), cut),
            other => panic!("the tuner took the partial graph by default: {other:?}"),
        }
    }
    plan
}

/// The longest input the BERT fork trains on at a fixed batch
/// (`Search::longest` over `ModelProbe::by_size`): the answer's step
/// fits and one token longer does not, a real AdamW training step at the
/// answer (backward, then `optimizer.step`) stays under the ceiling, and no
/// variable changed.
fn bert_fork_longest(batch: usize) {
    use autobatch::{Resizable, plan::SizeRange};
    use candle_nn::Optimizer;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let head = linear(128, VOCAB, vb.pp("head")).unwrap();
    let model = Bert::load(vb.pp("bert"), true);
    let loss = |batch: autobatch::MicroBatch, len: usize| -> Result<Tensor> {
        let ids = tokens_of_length(batch.len, len)?;
        let logits = head.forward(&model.hidden(&ids)?)?.reshape((batch.len * len, VOCAB))?;
        loss::cross_entropy(&logits, &ids.flatten_all()?)
    };
    let before = bits(&varmap);
    let mut meter = HeapMeter::new(BUDGET).unwrap();
    let mut probe =
        ModelProbe::by_size(&varmap, SEQ, loss).optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default()).unwrap();
    // the model's 128 positions are the range
    let longest = Tuner::new().search(&mut probe, &mut meter).longest(batch, SizeRange::up_to(128)).unwrap();
    assert!(bits(&varmap) == before, "BERT fork: the length search changed a variable");
    let (len, limit) = (longest.largest_size, longest.limit_bytes());
    assert!(longest.proven_longest && len < 128, "{}", longest.summary("sequence length"));
    probe.resize(len).unwrap();
    let at = peak(&mut probe, &mut meter, batch);
    probe.resize(len + 1).unwrap();
    let above = peak(&mut probe, &mut meter, batch);
    assert!(at <= limit && above > limit, "length {len} peaks at {at}, {} at {above}, limit {limit}", len + 1);
    let mut optimizer = candle_nn::AdamW::new(varmap.all_vars(), ParamsAdamW::default()).unwrap();
    optimizer.step(&loss(autobatch::MicroBatch::of(batch), len).unwrap().backward().unwrap()).unwrap(); // the moments exist
    meter.reset_peak().unwrap();
    let grads = loss(autobatch::MicroBatch::of(batch), len).unwrap().backward().unwrap();
    optimizer.step(&grads).unwrap();
    drop(grads);
    let trained = meter.peak().unwrap();
    assert!(trained <= limit, "training at batch {batch}, length {len} peaked at {trained} > {limit}");
    println!(
        "BERT fork, longest length at batch {batch}: {len} (proven: peaks at {at}, {} at {above} over the limit \
         {limit}; a training step at {len} peaks at {trained})",
        len + 1
    );
}

/// Qwen2 keeps a KV cache that grows with every forward pass: probed twice in
/// a row with `clear_kv_cache` as the reset hook, the answers agree, nothing
/// is left held, and the model runs from position 0 afterwards.
fn qwen2() {
    use candle_transformers::models::qwen2::{Config, Model};
    let config: Config = serde_json::from_str(&format!(
        r#"{{"vocab_size": {VOCAB}, "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256, "sliding_window": 256,
        "max_window_layers": 2, "tie_word_embeddings": false, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
        "use_sliding_window": false, "hidden_act": "silu"}}"#
    ))
    .unwrap();
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let head = linear(64, VOCAB, vb.pp("head")).unwrap();
    let model = Rc::new(RefCell::new(Model::new(&config, vb.pp("model")).unwrap()));
    let forward = Rc::clone(&model);
    let loss = move |batch: autobatch::MicroBatch| -> Result<Tensor> {
        let ids = tokens(batch.len)?;
        let hidden = forward.borrow_mut().forward(&ids, 0, None)?;
        let logits = head.forward(&hidden)?.reshape((batch.len * SEQ, VOCAB))?;
        loss::cross_entropy(&logits, &ids.flatten_all()?)
    };
    let reset = Rc::clone(&model);
    let mut probe = ModelProbe::new(&varmap, loss)
        .optimizer::<autobatch::optim::AdamW>(ParamsAdamW::default())
        .unwrap()
        .with_reset(move || {
            reset.borrow_mut().clear_kv_cache();
            Ok(())
        });
    let mut meter = HeapMeter::new(BUDGET).unwrap();
    let first = Tuner::new().allow_partial_graph(true).search(&mut probe, &mut meter).run().unwrap();
    let second = Tuner::new().allow_partial_graph(true).search(&mut probe, &mut meter).run().unwrap();
    assert_eq!(first.largest_batch(), second.largest_batch(), "{first}\n{second}");
    for plan in [&first, &second] {
        assert!(!plan.warnings().iter().any(|w| matches!(w, autobatch::plan::Warning::StateKept { .. })), "{plan}");
    }
    // the cache was cleared after tuning: a forward pass from position 0 runs
    model.borrow_mut().forward(&tokens(2).unwrap(), 0, None).unwrap();
    println!(
        "Qwen2 with a reset hook: largest batch {} twice, measured graph {} ({} variables without a gradient)",
        first.largest_batch(),
        if first.complete_graph() { "complete" } else { "partial" },
        probe.variables_without_gradient().map_or(0, <[String]>::len)
    );
}

fn main() {
    let failures = logits::check();
    assert!(failures.is_empty(), "autobatch_models against candle-transformers: {failures:?}");
    let demoted = bert(false);
    let whole = bert(true);
    bert_fork_longest(2 * whole.largest_batch());
    assert!(whole.largest_batch() < demoted.largest_batch(), "the cut graph's answer overstates training");
    qwen2();
    println!("all checks passed");
}
