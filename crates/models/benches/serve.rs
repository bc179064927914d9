//! Serving capacity on the CPU heap: the probe's answer (the most sequences
//! whose full KV caches at the context and the worst step fit), what it cost,
//! and the count from the config and vLLM's formula beside it.
//!
//! ```text
//! cargo bench --bench serve     # writes its section of docs/benchmarks.md
//! ```
//!
//! Three configs (one with an 8-bit cache too) as `autobatch serve` runs them (the search starting where
//! the count expects the answer), and the same search with no expectation.
//! Cost: every trial's sequences over the answer (a trial of n sequences
//! decodes n − 1 tokens beside one prefill chunk), and the trials' time over
//! one worst step at the answer; the warm-up (one sequence: the prefill
//! profile) apart.

#[global_allocator]
static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();

use std::fmt::Write as _;

use autobatch::serve::{Scheduling, ServePlan};
use autobatch::{Bytes, HeapMeter, MemoryMeter, Tuner};
use autobatch_models::{BaseDtype, Config, KvCache, Serving, ServingShape};
use candle_core::{DType, Device};

struct Case {
    name: &'static str,
    config: &'static str,
    weights: BaseDtype,
    context: usize,
    chunk: usize,
    budget: u64,
    /// The cache's dtype when not the model's.
    cache: Option<DType>,
}

const fn case(name: &'static str, config: &'static str, weights: BaseDtype, context: usize, chunk: usize) -> Case {
    Case { name, config, weights, context, chunk, budget: 1 << 30, cache: None }
}

const CASES: [Case; 4] = [
    case("SmolLM2-135M bf16", "smollm2-135m.json", BaseDtype::Bf16, 1024, 128),
    Case {
        cache: Some(KvCache::INT8),
        ..case("SmolLM2-135M bf16, int8 cache", "smollm2-135m.json", BaseDtype::Bf16, 1024, 128)
    },
    case("SmolLM2-135M q4_0", "smollm2-135m.json", BaseDtype::Q4_0, 2048, 256),
    Case { budget: 3 << 29, ..case("GPT-2 f32", "gpt2.json", BaseDtype::F32, 512, 128) },
];

fn probe(case: &Case, expect: bool) -> (ServePlan, u64, usize, f64, f64, f64) {
    let path = format!("{}/tests/configs/{}", env!("CARGO_MANIFEST_DIR"), case.config);
    let config = Config::from_file(path).unwrap();
    let dtype = case.weights.float().unwrap_or(DType::BF16);
    let quantized_dtype = case.weights.float().is_none().then_some(dtype);
    let cache_dtype = case.cache.unwrap_or(dtype);
    let server = Serving::build(&config, case.weights, quantized_dtype, &Device::Cpu).unwrap();
    let mut server = server.cache_dtype(cache_dtype).unwrap();
    let shape = ServingShape {
        context: case.context,
        chunk: case.chunk,
        block_size: 16,
        weights: case.weights,
        dtype,
        cache_dtype,
        on_cpu: true,
    };
    let counted = config.serving_bytes(&shape).unwrap();
    let mut meter = HeapMeter::new(case.budget).unwrap();
    let limit = (0.9 * case.budget as f64) as u64;
    let held = meter.in_use().unwrap();
    let other = held.saturating_sub(counted.weight_bytes);
    let expected = counted.max_sequences(limit, other);
    let shape = Scheduling::new(case.context).max_num_batched_tokens(case.chunk);
    let slope = (counted.cache_bytes_per_sequence + counted.step_bytes_per_sequence) as f64;
    let tuner = Tuner::new();
    let plan = if expect {
        tuner.search(&mut server, &mut meter).sequences(&shape.clone().expect(expected.max(1), slope)).unwrap()
    } else {
        tuner.search(&mut server, &mut meter).sequences(&shape).unwrap()
    };
    let at_answer = tuner.search(&mut server, &mut meter).measure(plan.max_sequences, &shape).unwrap().seconds;
    let profile = tuner.search(&mut server, &mut meter).measure(1, &shape).unwrap().seconds;
    let vllm = counted.vllm_concurrency(plan.limit_bytes, plan.held_bytes.saturating_sub(counted.weight_bytes));
    (plan, counted.cache_bytes_per_token, expected, vllm, at_answer, profile)
}

fn main() {
    let mut section = String::from(
        "## Serving capacity\n\n`cargo bench --bench serve`: the most sequences whose full KV caches at the context and \
         the worst step (one sequence prefilling a chunk while every other decodes) fit under 90% of a CPU budget, \
         found by a tuner's search of the server as `autobatch serve` runs it (the search starting where the count expects the answer) \
         and with no expectation; the count from the config (`Config::serving_bytes`) and vLLM's formula for the \
         same settings beside it. Cost: the sequences of every trial over the answer (a decode-step equivalent is one \
         worst step at the answer; each trial also prefills one chunk), and the trials' time over one worst step at \
         the answer; the warm-up, one sequence (the prefill profile), apart.\n\n\
         | config | context, chunk | budget | answer | counted | vLLM's concurrency | cache per token | trials, from the count | decode-step equivalents | time / worst step | trials, no expectation | decode-step equivalents |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for case in &CASES {
        let (plan, per_token, expected, vllm, at_answer, profile) = probe(case, true);
        let (plain, ..) = probe(case, false);
        let n = plan.max_sequences as f64;
        let equivalents = |plan: &ServePlan| plan.trials.iter().map(|t| t.number as f64).sum::<f64>() / n;
        let seconds: f64 = plan.trials.iter().map(|t| t.seconds).sum();
        let tried = |plan: &ServePlan| plan.trials.iter().map(|t| t.number.to_string()).collect::<Vec<_>>().join(", ");
        let row = format!(
            "| {} | {}, {} | {} | {} | {} | {:.2} | {} | {} | {:.2} | {:.2} | {} | {:.2} |",
            case.name,
            case.context,
            case.chunk,
            Bytes(case.budget),
            plan.max_sequences,
            expected,
            vllm,
            Bytes(per_token),
            tried(&plan),
            equivalents(&plan),
            seconds / at_answer,
            tried(&plain),
            equivalents(&plain),
        );
        eprintln!("{row} (prefill profile {profile:.2} s, worst step at the answer {at_answer:.2} s)");
        assert_eq!(
            plain.max_sequences, plan.max_sequences,
            "the expectation changes where the search starts, not its answer"
        );
        section += &row;
        section.push('\n');
    }
    let _ = writeln!(
        section,
        "\nThe answer is the same with and without the expectation; every one was run and fits, and one more was run \
         and does not. vLLM's concurrency is its blocks' tokens over the context: the limit less the weights and a \
         profile run of the chunk with no cache, so it counts no decoding sequence's own bytes and no block rounding."
    );
    let path = shared::replace("serving", &shared::with_host(&section)).unwrap();
    eprintln!("wrote {}", path.display());
}

use autobatch_testkit::docs as shared;
