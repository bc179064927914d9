//! Command-line arguments.

use clap::{Args, Parser, Subcommand, ValueEnum};

pub const EXIT_CODES: &str = "\
Exit codes:
  0  a plan (or estimate) was produced
  1  runtime failure: the workload or the device failed
  2  usage error: a bad flag or an impossible configuration
  3  nothing fits: not even the smallest batch fits under the ceiling (or
     the --time-limit passed before any batch was seen to fit)

With no command, runs `autobatch probe`: the default small transformer on the
CPU under a 256 MiB budget.";

/// What is the largest training batch that fits, and how many accumulation
/// steps reach the effective batch you want?
#[derive(Debug, Parser)]
#[command(name = "autobatch", version, after_help = EXIT_CODES)]
pub struct Cli {
    /// More log output on stderr (-v info, -vv debug).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,

    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Tune a model (a built-in reference model, or a config.json's
    /// architecture): run real training steps, find the largest batch.
    Probe(Box<ProbeArgs>),
    /// Analytical what-if: the training state of N parameters, and what would make it fit.
    Estimate(Box<EstimateArgs>),
    /// Accumulation arithmetic alone: split a target effective batch into micro-batches.
    Plan(PlanArgs),
    /// Serving capacity: how many sequences of --max-model-len tokens fit at
    /// once beside their KV caches and the worst step, measured (a config's
    /// decoder, forward only, its cache in blocks).
    Serve(Box<crate::serve::ServeArgs>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ModelKind {
    /// Decoder-only transformer language model.
    Transformer,
    /// Multi-layer perceptron classifier.
    Mlp,
    /// Small convolutional image classifier.
    Convnet,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DtypeArg {
    /// 32-bit floats (also `fp32`).
    #[value(alias = "fp32")]
    F32,
    /// bfloat16 weights, gradients, activations and AdamW moments.
    Bf16,
    /// bf16 weights, gradients and activations; f32 master weights and AdamW
    /// moments (2 + 2 + 12 bytes per parameter).
    Mixed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StrategyArg {
    /// Fit the memory curve on small trials, jump near the answer, verify:
    /// the same answer as binary in fewer, cheaper trials.
    Predictive,
    /// Double, then bisect to the exact largest batch.
    Binary,
    /// Double only: the largest fitting power of two.
    Power,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ObjectiveArg {
    /// The largest batch that fits.
    Largest,
    /// The best measured samples per second near the top.
    Throughput,
}

/// The CPU budget of `autobatch probe` when none is given: small enough that
/// the default transformer tunes in seconds, and far from any machine's RAM.
pub const DEFAULT_BUDGET: &str = "256MiB";

/// A count of at least 1 (a batch, a number of ranks, steps or trials).
pub(crate) fn positive(text: &str) -> Result<usize, String> {
    if text.trim_start().starts_with('-') {
        return Err("must not be negative: use a whole number of at least 1".to_owned());
    }
    let text = text.trim();
    // a whole number, also with an exponent (1e6)
    let exponent = text.contains(['e', 'E']) && text.bytes().all(|b| b.is_ascii_digit() || b".eE+".contains(&b));
    let value = match text.parse::<usize>() {
        Ok(value) => Some(value),
        Err(_) if exponent => crate::parse::parse_count(text).ok().and_then(|v| usize::try_from(v).ok()),
        Err(_) => None,
    };
    match value {
        Some(0) => Err("must be at least 1".to_owned()),
        Some(value) => Ok(value),
        None => Err(format!("must be a whole number from 1 to {} (e.g. 8, 1024 or 1e6)", usize::MAX)),
    }
}

impl ProbeArgs {
    /// `--precision`, f32 when not given.
    pub fn precision(&self) -> DtypeArg {
        self.precision.unwrap_or(DtypeArg::F32)
    }
}

/// LoRA's alpha: a positive number.
fn lora_alpha(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(alpha) if alpha.is_finite() && alpha > 0.0 => Ok(alpha),
        _ => Err("must be a positive number, e.g. 16".to_owned()),
    }
}

/// A LoRA base's dtype: f32, bf16, q8_0 or q4_0.
pub(crate) fn base_dtype(text: &str) -> Result<autobatch_models::BaseDtype, String> {
    text.trim().parse().map_err(|_| "must be f32, bf16, q8_0 or q4_0".to_owned())
}

/// A module name LoRA targets: not empty, no spaces.
fn module_name(text: &str) -> Result<String, String> {
    let name = text.trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return Err("must be module names separated by commas, e.g. q_proj,v_proj".to_owned());
    }
    Ok(name.to_owned())
}

/// A seed: any whole number that fits in 64 bits.
fn seed(text: &str) -> Result<u64, String> {
    text.trim().parse::<u64>().map_err(|_| format!("must be a whole number from 0 to {}", u64::MAX))
}

/// A fraction as a number (`0.9`) or a percentage (`90%`); whether it is in
/// range is the tuner's to say.
pub(crate) fn ceiling(text: &str) -> Result<autobatch::Ceiling, String> {
    let text = text.trim();
    let (number, scale) = match text.strip_suffix('%') {
        Some(percent) => (percent.trim_end(), 100.0),
        None => (text, 1.0),
    };
    match number.parse::<f64>() {
        Ok(value) if value.is_finite() => autobatch::Ceiling::new(value / scale).map_err(|err| err.to_string()),
        _ => Err("must be a fraction in (0, 1], e.g. 0.9 or 90%".to_owned()),
    }
}

#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// The reference model to tune.
    #[arg(long, value_enum, default_value_t = ModelKind::Transformer)]
    pub model: ModelKind,

    /// A Hugging Face config.json (model_type llama, mistral, qwen2, qwen3,
    /// gpt2 or bert): that architecture, with random weights, instead of a
    /// reference model. --seq-len, --seq-lens, --layers and --precision
    /// apply to it.
    #[arg(long, help_heading = "Model from a config")]
    pub config: Option<std::path::PathBuf>,
    /// With --config: LoRA adapters of this rank, the base frozen (its
    /// projections keep no gradient).
    #[arg(long, value_parser = positive, allow_negative_numbers = true, requires = "config", help_heading = "Model from a config")]
    pub lora: Option<usize>,
    /// LoRA's alpha: the adapters' update is scaled by alpha / rank [default: 2 × rank].
    #[arg(long, value_parser = lora_alpha, allow_negative_numbers = true, requires = "lora", help_heading = "Model from a config")]
    pub lora_alpha: Option<f64>,
    /// The modules LoRA adapts, by their checkpoint names, comma-separated
    /// [default: q_proj,v_proj; c_attn for gpt2; query,value for bert].
    #[arg(long, value_delimiter = ',', value_parser = module_name, requires = "lora", help_heading = "Model from a config")]
    pub lora_targets: Vec<String>,
    /// With --lora: the frozen base's dtype, the adapters in f32. f32 or
    /// bf16: the whole base (and the activations) in it; q8_0 or q4_0
    /// (QLoRA): the layers' projections quantized, the rest in the model's
    /// dtype [default: the model's dtype, adapters in it too].
    #[arg(long, value_parser = base_dtype, requires = "lora", help_heading = "Model from a config")]
    pub base_dtype: Option<autobatch_models::BaseDtype>,

    /// Transformer: vocabulary size [default: 256].
    #[arg(long, value_parser = positive, allow_negative_numbers = true, help_heading = "Model size")]
    pub vocab: Option<usize>,
    /// Transformer: hidden size [default: 64].
    #[arg(long, value_parser = positive, allow_negative_numbers = true, help_heading = "Model size")]
    pub d_model: Option<usize>,
    /// Transformer: attention heads, a divisor of --d-model [default: 4].
    #[arg(long, value_parser = positive, allow_negative_numbers = true, help_heading = "Model size")]
    pub heads: Option<usize>,
    /// Transformer blocks: the reference transformer's [default: 2], or with
    /// --config a shallower (or deeper) copy of the model [default: its own].
    #[arg(long, value_parser = positive, allow_negative_numbers = true, help_heading = "Model size")]
    pub layers: Option<usize>,
    /// Tokens per sample; probe at the longest training will see [default:
    /// 64 for the reference transformer; with --config, the shorter of 512
    /// and the model's positions].
    #[arg(long, value_parser = positive, allow_negative_numbers = true, help_heading = "Model size")]
    pub seq_len: Option<usize>,
    /// Transformer: tune at each of these sequence lengths (comma-separated,
    /// e.g. 64,128,256) and print a plan across them: each length's largest
    /// batch, a memory model in batch and length, the token budget per
    /// micro-batch. The model takes sequences up to the longest (or --seq-len).
    #[arg(long, value_delimiter = ',', value_parser = positive, allow_negative_numbers = true, help_heading = "Model size")]
    pub seq_lens: Vec<usize>,
    /// MLP: input features [default: 64].
    #[arg(long, value_parser = positive, allow_negative_numbers = true, help_heading = "Model size")]
    pub inputs: Option<usize>,
    /// MLP: hidden width [default: 256].
    #[arg(long, value_parser = positive, allow_negative_numbers = true, help_heading = "Model size")]
    pub width: Option<usize>,
    /// MLP: hidden layers [default: 3].
    #[arg(long, value_parser = positive, allow_negative_numbers = true, help_heading = "Model size")]
    pub depth: Option<usize>,
    /// Convnet: channels of the first convolution [default: 16].
    #[arg(long, value_parser = positive, allow_negative_numbers = true, help_heading = "Model size")]
    pub channels: Option<usize>,
    /// Convnet: image side, a multiple of 4; probe at the largest training will see [default: 32].
    #[arg(long, value_parser = positive, allow_negative_numbers = true, help_heading = "Model size")]
    pub resolution: Option<usize>,
    /// MLP or convnet: output classes [default: 10 for mlp, 3 for convnet].
    #[arg(long, value_parser = positive, allow_negative_numbers = true, help_heading = "Model size")]
    pub classes: Option<usize>,
    /// How weights, gradients, activations and optimizer state are stored
    /// (`--dtype` is the same flag) [default: f32; with --config, the
    /// config's torch_dtype].
    #[arg(long, alias = "dtype", value_enum, help_heading = "Model size")]
    pub precision: Option<DtypeArg>,
    /// Transformer: gradient checkpointing over the blocks (keep each block's
    /// input, recompute the block in the backward pass).
    #[arg(long, help_heading = "Model size")]
    pub checkpointing: bool,
    /// With --config: how attention is computed. blocked: in blocks with an
    /// online softmax, the scores recomputed in the backward pass (as SDPA or
    /// FlashAttention-2); eager: the scores made whole and kept.
    #[arg(long, value_enum, default_value_t = AttentionArg::Blocked, requires = "config", help_heading = "Model from a config")]
    pub attention: AttentionArg,
    /// With --config: how the head and the loss are computed. chunked: fused
    /// in chunks of tokens, the logits never whole (as Liger Kernel's fused
    /// loss); full: every position's logits made whole.
    #[arg(long, value_enum, default_value_t = LossArg::Chunked, requires = "config", help_heading = "Model from a config")]
    pub loss: LossArg,
    /// The optimizer the model trains with (its state and step are measured;
    /// --precision mixed runs AdamW on f32 masters).
    #[arg(long, value_enum, default_value_t = ProbeOptimizerArg::Adamw, help_heading = "Model size")]
    pub optimizer: ProbeOptimizerArg,
    /// Seed of the weights and synthetic data.
    #[arg(long, default_value_t = 0, value_parser = seed, allow_negative_numbers = true, help_heading = "Model size")]
    pub seed: u64,

    /// Device: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// CPU memory budget playing device memory, e.g. 512MiB or 4GiB. Keep it
    /// under half the free RAM: the one over-budget trial allocates up to about
    /// twice the budget (a budget above the available RAM is refused)
    /// [default: 256MiB].
    #[arg(long, allow_hyphen_values = true)]
    pub budget: Option<String>,
    /// Most a fitting step may use, as a fraction of capacity, in (0, 1]
    /// (0.9, or 90%).
    #[arg(long, default_value_t = autobatch::Ceiling::default(), value_parser = ceiling, allow_negative_numbers = true)]
    pub ceiling: autobatch::Ceiling,
    /// Smallest batch to try.
    #[arg(long, default_value_t = 1, value_parser = positive, allow_negative_numbers = true)]
    pub start: usize,
    /// Only try batches that are multiples of this (e.g. 8).
    #[arg(long, default_value_t = 1, value_parser = positive, allow_negative_numbers = true)]
    pub multiple_of: usize,
    /// Largest batch to try.
    #[arg(long, value_parser = positive, allow_negative_numbers = true)]
    pub max_batch: Option<usize>,
    /// Stop searching after this long (e.g. 30s, 2m, 500ms; warm-up
    /// included) with the largest batch seen to fit, not proven largest, and
    /// the batches that remain open. A trial running at the limit finishes;
    /// with --seq-lens or --compare each length or variant has the limit.
    #[arg(long, value_parser = crate::parse::parse_duration, allow_hyphen_values = true)]
    pub time_limit: Option<std::time::Duration>,
    /// Stop after this many trials with the best batch so far.
    #[arg(long, value_parser = positive, allow_negative_numbers = true)]
    pub max_trials: Option<usize>,
    /// Training steps per trial.
    #[arg(long, default_value_t = 1, value_parser = positive, allow_negative_numbers = true)]
    pub steps_per_trial: usize,
    /// Search strategy.
    #[arg(long, value_enum, default_value_t = StrategyArg::Predictive)]
    pub strategy: StrategyArg,
    /// Plan from the largest batch that fits, or from the fastest in samples
    /// per second among the largest, ¾ and ½ of it (a few extra timed steps).
    #[arg(long, value_enum, default_value_t = ObjectiveArg::Largest)]
    pub objective: ObjectiveArg,
    /// Effective (global) batch to reach with micro-batch × accumulation × ranks.
    #[arg(long, value_parser = positive, allow_negative_numbers = true)]
    pub target_effective_batch: Option<usize>,
    /// Data-parallel ranks.
    #[arg(long, default_value_t = 1, value_parser = positive, allow_negative_numbers = true)]
    pub world_size: usize,
    /// Fail instead of rounding the effective batch up when no split hits the target.
    #[arg(long)]
    pub exact: bool,
    /// Keep plans in this JSON file: an unchanged model, device and settings
    /// reuse the stored plan without probing.
    #[arg(long)]
    pub cache: Option<std::path::PathBuf>,
    /// Also find the evaluation step's largest batch (forward only).
    #[arg(long)]
    pub eval: bool,
    /// Answer even when the measured step did not reach every variable's
    /// gradient (a cut graph, which understates training), the plan marked
    /// not proven; by default that is an error naming the switch.
    #[arg(long)]
    pub allow_partial_graph: bool,
    /// Tune the model as it is and with each remedy that applies to it, side
    /// by side: bf16, mixed precision, the lean optimizers (lion, adafactor,
    /// adam8bit) and, for the transformer, gradient checkpointing (alone and
    /// with bf16); the estimate's bytes per sample beside the measured. Each
    /// variant's largest batch: no --eval, --objective, target, ranks or cache.
    #[arg(long)]
    pub compare: bool,
    /// Find the longest input at a fixed --batch instead of the largest
    /// batch: seq-len (transformer: lengths up to --seq-len, the model's
    /// positions) or resolution (convnet: image sides up to --resolution, in
    /// multiples of 4). --multiple-of is then the size's granule.
    #[arg(long, value_enum, requires = "batch", help_heading = "Longest input")]
    pub find: Option<FindArg>,
    /// The batch --find holds fixed.
    #[arg(long, value_parser = positive, allow_negative_numbers = true, help_heading = "Longest input")]
    pub batch: Option<usize>,
    /// Draw what the search measured into this SVG file: peak memory against
    /// the batch for every trial with the ceiling, the capacity, the fitted
    /// memory model and the chosen batch (with --seq-lens: the largest batch
    /// against the length and the token budget; with --compare: each
    /// variant's largest batch and bytes per sample; with --find: peak
    /// against the input size).
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<std::path::PathBuf>,
    /// Print the plan as JSON on stdout (trials and logs go to stderr).
    #[arg(long)]
    pub json: bool,
}

/// How a config model computes attention (`--attention`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AttentionArg {
    /// In blocks, nothing of heads × s × s kept (the default).
    Blocked,
    /// The scores made whole and kept for the backward pass.
    Eager,
}

/// How a config model computes its head and loss (`--loss`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LossArg {
    /// The head and the loss fused in chunks of tokens (the default).
    Chunked,
    /// Every position's logits made whole.
    Full,
}

/// The input size `probe --find` searches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FindArg {
    /// The transformer's sequence length.
    SeqLen,
    /// The convnet's image side.
    Resolution,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PrecisionArg {
    /// 32-bit floats (also `fp32`).
    #[value(alias = "fp32")]
    F32,
    /// bfloat16.
    Bf16,
}

/// The optimizers a reference model can be probed with (each has a dry step).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ProbeOptimizerArg {
    Adamw,
    Lion,
    Adafactor,
    Adam8bit,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OptimizerArg {
    Sgd,
    Momentum,
    Adamw,
    Adafactor,
    Adam8bit,
    Lion,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RecomputeArg {
    /// Keep every activation.
    None,
    /// Recompute the attention's softmax and score-times-value parts.
    Selective,
    /// Recompute every layer from its input (gradient checkpointing).
    Full,
}

#[derive(Debug, Args)]
pub struct EstimateArgs {
    /// Trainable parameters, e.g. 1e9, 125M or 7B.
    #[arg(long, allow_hyphen_values = true, required_unless_present = "config", conflicts_with = "config")]
    pub params: Option<String>,
    /// A Hugging Face config.json: the parameters, and the whole training
    /// step on candle counted from it (the activations of the lean step by
    /// default, the head's logits and the loss included) at --seq-len
    /// [default: the shorter of 512 and its positions]; with --capacity, the
    /// largest batch under --ceiling. The dtype is its torch_dtype unless
    /// --dtype says otherwise.
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// Dtype of weights, gradients and optimizer state [default: f32]; not
    /// with --mixed-precision, which has its own. With --base-dtype: the
    /// model's dtype (its activations and unquantized weights), the adapters in f32.
    #[arg(long, value_enum)]
    pub dtype: Option<PrecisionArg>,
    /// The optimizer whose state is counted.
    #[arg(long, value_enum, default_value_t = OptimizerArg::Adamw)]
    pub optimizer: OptimizerArg,
    /// Mixed precision: bf16 weights and gradients, fp32 master weights and optimizer state.
    #[arg(long)]
    pub mixed_precision: bool,
    /// Device capacity, e.g. 12GiB or 80GB, or a card by name (h100, a100-40gb,
    /// a100-80gb, h200, l4, l40s, rtx4090, rtx3090, v100-16gb, v100-32gb,
    /// mi300x, ...: the memory it reports): says whether it fits, and what
    /// would make it.
    #[arg(long, allow_hyphen_values = true)]
    pub capacity: Option<String>,
    /// List the named cards this configuration fits on (per device, under
    /// --zero, --ranks and --tensor-parallel), with the memory each reports.
    #[arg(long)]
    pub which_gpus: bool,
    /// Activation memory at the batch you want, e.g. 6GiB (from a probe); counted in the total.
    #[arg(long, allow_hyphen_values = true)]
    pub activations: Option<String>,
    /// ZeRO stage the state is partitioned at over --ranks: 0 none, 1 optimizer
    /// states, 2 + gradients, 3 + weights.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=3), help_heading = "Sharding")]
    pub zero: u8,
    /// Data-parallel ranks (the ZeRO partitions are spread over them).
    #[arg(long, default_value_t = 1, value_parser = positive, allow_negative_numbers = true, help_heading = "Sharding")]
    pub ranks: usize,
    /// Tensor-parallel degree: every parameter (and activation) split this many ways.
    #[arg(long, default_value_t = 1, value_parser = positive, allow_negative_numbers = true, help_heading = "Sharding")]
    pub tensor_parallel: usize,
    /// Transformer layers: with --hidden, --heads, --seq-len and --batch, the
    /// activations are estimated (Korthikanti et al. 2022, 16-bit) instead of
    /// given. With --config: a copy of the model with this many layers (its
    /// parameters and its activations).
    #[arg(long, value_parser = positive, allow_negative_numbers = true, help_heading = "Activations")]
    pub layers: Option<usize>,
    /// Transformer hidden size (not with --config, which has its own).
    #[arg(long, value_parser = positive, allow_negative_numbers = true, conflicts_with = "config", help_heading = "Activations")]
    pub hidden: Option<usize>,
    /// Transformer attention heads (not with --config, which has its own).
    #[arg(long, value_parser = positive, allow_negative_numbers = true, conflicts_with = "config", help_heading = "Activations")]
    pub heads: Option<usize>,
    /// Tokens per sample.
    #[arg(long, value_parser = positive, allow_negative_numbers = true, help_heading = "Activations")]
    pub seq_len: Option<usize>,
    /// Micro-batch per device.
    #[arg(long, value_parser = positive, allow_negative_numbers = true, help_heading = "Activations")]
    pub batch: Option<usize>,
    /// What the backward pass recomputes instead of keeping.
    #[arg(long, value_enum, default_value_t = RecomputeArg::None, help_heading = "Activations")]
    pub recompute: RecomputeArg,
    /// With --config: LoRA adapters of this rank are what trains; the base is
    /// frozen, its weights counted without gradients or optimizer state.
    #[arg(long, value_parser = positive, allow_negative_numbers = true, requires = "config", conflicts_with = "params", help_heading = "LoRA")]
    pub lora: Option<usize>,
    /// The modules LoRA adapts, comma-separated [default: q_proj,v_proj;
    /// c_attn for gpt2; query,value for bert].
    #[arg(long, value_delimiter = ',', value_parser = module_name, requires = "lora", help_heading = "LoRA")]
    pub lora_targets: Vec<String>,
    /// The frozen base's dtype (f32, bf16, q8_0, q4_0), the adapters in f32
    /// [default: the model's dtype, adapters in it too].
    #[arg(long, value_parser = base_dtype, requires = "lora", help_heading = "LoRA")]
    pub base_dtype: Option<autobatch_models::BaseDtype>,
    /// With --config: how attention is computed (blocked, the default, or
    /// eager: the scores made whole and kept).
    #[arg(long, value_enum, default_value_t = AttentionArg::Blocked, requires = "config", conflicts_with = "params", help_heading = "Model from a config")]
    pub attention: AttentionArg,
    /// With --config: how the head and loss are computed (chunked, the
    /// default, or full: every position's logits made whole).
    #[arg(long, value_enum, default_value_t = LossArg::Chunked, requires = "config", conflicts_with = "params", help_heading = "Model from a config")]
    pub loss: LossArg,
    /// With --config and --capacity: the largest batch is the one whose
    /// step stays under this fraction of the capacity (0.9, or 90%).
    #[arg(long, default_value_t = autobatch::Ceiling::default(), value_parser = ceiling, allow_negative_numbers = true, requires = "config", conflicts_with = "params", help_heading = "Model from a config")]
    pub ceiling: autobatch::Ceiling,
    /// With --config and --capacity: split this effective (global) batch
    /// into micro-batch × accumulation × --ranks from the largest batch.
    #[arg(long, value_parser = positive, allow_negative_numbers = true, requires_all = ["config", "capacity"], conflicts_with = "params", help_heading = "Model from a config")]
    pub target_effective_batch: Option<usize>,
    /// With --config: serving instead of training, counted: the KV cache's
    /// bytes per token and per sequence, the worst step's own bytes, and with
    /// --capacity the sequences of --max-model-len it holds under --ceiling,
    /// beside what vLLM's formula gives for the same settings.
    #[arg(long, requires = "config", conflicts_with_all = ["params", "lora", "batch", "seq_len", "target_effective_batch"], help_heading = "Serving")]
    pub serve: bool,
    /// With --serve: count for `serve --device cpu` (the CPU heap, where
    /// candle's matmul widens a bf16 weight to f32 for the product) rather
    /// than for an accelerator (the default).
    #[arg(long, requires = "serve", help_heading = "Serving")]
    pub on_cpu: bool,
    #[command(flatten)]
    pub serving: crate::serve::ServingArgs,
    /// Print the estimate as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Target effective (global) batch.
    #[arg(long, value_parser = positive, allow_negative_numbers = true)]
    pub target: usize,
    /// Largest micro-batch that fits on one rank.
    #[arg(long, value_parser = positive, allow_negative_numbers = true, required_unless_present = "uneven")]
    pub largest: Option<usize>,
    /// Mixed GPUs: the largest micro-batch of each rank, comma-separated
    /// (e.g. 200,90); the target is shared in proportion, exactly, with
    /// each rank's micro-steps and loss weights.
    #[arg(long, value_delimiter = ',', value_parser = positive, allow_negative_numbers = true, conflicts_with_all = ["largest", "world_size"])]
    pub uneven: Vec<usize>,
    /// Data-parallel ranks.
    #[arg(long, default_value_t = 1, value_parser = positive, allow_negative_numbers = true)]
    pub world_size: usize,
    /// Keep micro-batches to multiples of this.
    #[arg(long, default_value_t = 1, value_parser = positive, allow_negative_numbers = true)]
    pub multiple_of: usize,
    /// Fail instead of rounding the effective batch up when no split hits the target.
    #[arg(long)]
    pub exact: bool,
    /// Print the split as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}
