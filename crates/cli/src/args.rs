//! Command-line arguments: each command's flags, grouped by what they say.

use autobatch::estimate::{OptimizerKind, Precision, Recompute};
use autobatch::{plan::Ceiling, plan::Objective, search::Strategy};
use autobatch_models::{Attention, BaseDtype, Loss, Ops};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

use crate::values::{
    AttentionArg, Capacity, Count, DeviceSpec, LossArg, ObjectiveArg, OpsArg, OptimizerArg, PrecisionArg, RecomputeArg,
    StrategyArg, base_dtype, budget, bytes, capacity, ceiling, device, lora_alpha, module_name, parameters, seed,
    typed,
};

pub const EXIT_CODES: &str = "\
Exit codes:
  0  a plan (or estimate) was produced
  1  runtime failure: the workload or the device failed
  2  usage error: a bad flag or an impossible configuration
  3  nothing fits: not even the smallest batch fits under the ceiling (or
     the --time-limit passed before any batch was seen to fit)

With no command, runs `autobatch probe` with the flags given (see `autobatch
probe --help`): with none, the default small transformer on the CPU under a
256 MiB budget.";

/// What is the largest training batch that fits, and how many accumulation
/// steps reach the effective batch you want?
#[derive(Debug, Parser)]
#[command(name = "autobatch", version, after_help = EXIT_CODES, args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// More log output on stderr (-v info, -vv debug).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,

    /// The probe's flags, for `autobatch` with no command.
    #[command(flatten)]
    pub probe: ProbeArgs,

    #[command(subcommand)]
    pub command: Option<Command>,
}

impl Cli {
    /// The command line, parsed: `Err` for a bad flag, and for `--help` and
    /// `--version` (whose text the error prints).
    pub fn parse_from<I, T>(line: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let mut matches = command().try_get_matches_from(line)?;
        Cli::from_arg_matches_mut(&mut matches)
    }
}

/// The command line's `clap::Command`: [`Cli`]'s, with two settings no
/// derive attribute can give every flag at once.
pub fn command() -> clap::Command {
    // `--batch -3` reaches the count's parser, which says what is valid,
    // instead of reading as an unknown flag `-3`
    fn negatives_are_values(arg: clap::Arg) -> clap::Arg {
        match arg.get_action().takes_values() {
            true => arg.allow_negative_numbers(true),
            false => arg,
        }
    }
    let top = Cli::command().mut_args(|arg| match arg.get_id().as_str() {
        // the top level lists the commands; the probe's flags are probe's help
        "verbose" | "help" | "version" => arg,
        _ => negatives_are_values(arg).hide(true),
    });
    probe_relations(top)
        .mut_subcommand("probe", probe_relations)
        .mut_subcommand("estimate", |estimate| {
            old_weights_spelling(estimate).mut_arg("target_effective_batch", |arg| {
                arg.requires_all(["config", "capacity"]).conflicts_with("params")
            })
        })
        .mut_subcommand("serve", |serve| {
            old_weights_spelling(serve)
                .mut_arg("config", |arg| arg.required(true))
                .mut_arg("check", |arg| arg.conflicts_with_all(["concurrency", "plot"]))
        })
        .mut_subcommands(|command| command.mut_args(negatives_are_values))
}

/// The relations of the flags defined once that hold in `probe` alone (the
/// ids they name exist only there): a split's exactness needs a target,
/// `--base-dtype` is LoRA's base, `--batch` is the one `--find` holds.
fn probe_relations(probe: clap::Command) -> clap::Command {
    const NOT_WITH_CHECK: [&str; 14] = [
        "compare",
        "seq_lens",
        "find",
        "start",
        "max_batch",
        "target_effective_batch",
        "world_size",
        "exact",
        "objective",
        "cache",
        "eval",
        "plot",
        "time_limit",
        "max_trials",
    ];
    probe
        .mut_arg("check", |arg| arg.conflicts_with_all(NOT_WITH_CHECK))
        .mut_arg("exact", |arg| arg.requires("target_effective_batch"))
        .mut_arg("equal_micro_batches", |arg| arg.requires("target_effective_batch"))
        .mut_arg("base_dtype", |arg| arg.requires("lora"))
        .mut_arg("batch", |arg| arg.requires("find"))
}

/// `--weights`, 0.1's spelling of `--base-dtype`, where it is not probe's
/// own switch (load the checkpoint).
fn old_weights_spelling(command: clap::Command) -> clap::Command {
    command.mut_arg("base_dtype", |arg| arg.alias("weights"))
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
    Serve(Box<ServeArgs>),
}

/// The CPU budget of `autobatch probe` when none is given: small enough that
/// the default transformer tunes in seconds, and far from any machine's RAM.
/// `probe`'s CPU budget when `--budget` is not given: 256 MiB.
pub const DEFAULT_BUDGET: u64 = 256 << 20;

/// `autobatch probe`.
#[derive(Debug, Args)]
pub struct ProbeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sizes: SizeArgs,
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(flatten)]
    pub search: SearchArgs,
    #[command(flatten)]
    pub plan: PlanningArgs,
    #[command(flatten)]
    pub mode: ModeArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

impl ProbeArgs {
    /// `--seq-lens`, as numbers.
    pub fn seq_lens(&self) -> Vec<usize> {
        crate::values::counts(&self.mode.seq_lens)
    }

    /// The flags that size a reference model, whether each was given, and
    /// the `--model`s it applies to: declared beside the flags, since clap
    /// has no rule for "only with --model X" (`--model` has a default), and
    /// checked before anything is built.
    pub fn reference_model_flags(&self) -> [(&'static str, bool, &'static [ModelKind]); 13] {
        use ModelKind::*;
        let sizes = &self.sizes;
        [
            ("--seq-lens", !self.mode.seq_lens.is_empty(), &[Transformer]),
            ("--vocab", sizes.vocab.is_some(), &[Transformer]),
            ("--d-model", sizes.d_model.is_some(), &[Transformer]),
            ("--heads", sizes.shape.heads.is_some(), &[Transformer]),
            ("--layers", sizes.shape.layers.is_some(), &[Transformer]),
            ("--seq-len", sizes.shape.seq_len.is_some(), &[Transformer]),
            ("--inputs", sizes.inputs.is_some(), &[Mlp]),
            ("--width", sizes.width.is_some(), &[Mlp]),
            ("--depth", sizes.depth.is_some(), &[Mlp]),
            ("--channels", sizes.channels.is_some(), &[Convnet]),
            ("--resolution", sizes.resolution.is_some(), &[Convnet]),
            ("--classes", sizes.classes.is_some(), &[Mlp, Convnet]),
            ("--checkpointing", self.model.checkpointing.on, &[Transformer]),
        ]
    }

    /// The length the model is built for: `--seq-len`, else the longest of
    /// `--seq-lens`.
    pub fn seq_len(&self) -> Option<usize> {
        self.sizes.shape.seq_len.or(self.mode.seq_lens.iter().max().copied()).map(Count::get)
    }
}

/// Which model trains, and how.
#[derive(Debug, Args)]
#[command(next_help_heading = "Model")]
pub struct ModelArgs {
    /// The reference model to tune (not with --config).
    #[arg(
        id = "model",
        long = "model",
        value_name = "MODEL",
        value_enum,
        default_value_t = ModelKind::Transformer,
        conflicts_with = "config"
    )]
    pub kind: ModelKind,
    #[command(flatten)]
    pub precision: PrecisionFlag,
    #[command(flatten)]
    pub optimizer: OptimizerFlag,
    #[command(flatten)]
    pub checkpointing: CheckpointingFlag,
    /// Seed of the weights and synthetic data.
    #[arg(long, default_value_t = 0, value_parser = seed)]
    pub seed: u64,
}

impl ModelArgs {
    /// `--precision`, fp32 when not given.
    pub fn precision(&self) -> Precision {
        self.precision.asked().unwrap_or(Precision::Fp32)
    }
}

/// The built-in reference models.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ModelKind {
    /// Decoder-only transformer language model.
    Transformer,
    /// Multi-layer perceptron classifier.
    Mlp,
    /// Small convolutional image classifier.
    Convnet,
}

/// The reference models' sizes; `--layers` and the lengths also size a
/// config's model.
#[derive(Debug, Args)]
#[command(next_help_heading = "Model size")]
pub struct SizeArgs {
    /// Transformer: vocabulary size [default: 256].
    #[arg(long, conflicts_with = "config")]
    pub vocab: Option<Count>,
    /// Transformer: hidden size [default: 64].
    #[arg(long, conflicts_with = "config")]
    pub d_model: Option<Count>,
    #[command(flatten)]
    pub shape: ShapeFlags,
    /// MLP: input features [default: 64].
    #[arg(long, conflicts_with = "config")]
    pub inputs: Option<Count>,
    /// MLP: hidden width [default: 256].
    #[arg(long, conflicts_with = "config")]
    pub width: Option<Count>,
    /// MLP: hidden layers [default: 3].
    #[arg(long, conflicts_with = "config")]
    pub depth: Option<Count>,
    /// Convnet: channels of the first convolution [default: 16].
    #[arg(long, conflicts_with = "config")]
    pub channels: Option<Count>,
    /// Convnet: image side, a multiple of 4; probe at the largest training will see [default: 32].
    #[arg(long, conflicts_with = "config")]
    pub resolution: Option<Count>,
    /// MLP or convnet: output classes [default: 10 for mlp, 3 for convnet].
    #[arg(long, conflicts_with = "config")]
    pub classes: Option<Count>,
}

/// A model from a Hugging Face config.json, and how it trains.
#[derive(Debug, Args)]
#[command(next_help_heading = "Model from a config")]
pub struct ConfigArgs {
    #[command(flatten)]
    pub file: ConfigFlag,
    #[command(flatten)]
    pub lora: LoraFlags,
    #[command(flatten)]
    pub base: BaseDtypeFlag,
    #[command(flatten)]
    pub step: StepForms,
    /// Load the checkpoint beside the config instead of random weights:
    /// model.safetensors, or the shards model.safetensors.index.json names;
    /// from the same Hub snapshot for a Hub name (fetched into the cache
    /// where allowed), else from the config's folder. The memory does not
    /// depend on the values: this runs the step of the checkpoint as saved.
    #[arg(long, requires = "config")]
    pub weights: bool,
}

impl ConfigArgs {
    /// The flags that apply only to a config's model, and whether each was
    /// given: clap's `requires = "config"` does not hold them when `--model`
    /// (which conflicts with `--config`) is given, so they are checked by hand.
    pub fn config_only_flags(&self) -> [(&'static str, bool); 8] {
        [
            ("--lora", self.lora.rank.is_some()),
            ("--lora-alpha", self.lora.alpha.is_some()),
            ("--lora-targets", !self.lora.targets.is_empty()),
            ("--base-dtype", self.base.base_dtype.is_some()),
            ("--attention", self.step.attention.is_some()),
            ("--loss", self.step.loss.is_some()),
            ("--ops", self.step.ops.is_some()),
            ("--weights", self.weights),
        ]
    }
}

/// LoRA on a config's model, as `probe` and `estimate` both take it:
/// defined once here.
#[derive(Debug, Args)]
#[command(next_help_heading = "LoRA")]
pub struct LoraFlags {
    /// With --config: LoRA adapters of this rank are what trains; the base
    /// is frozen (its projections keep no gradient, its weights no
    /// optimizer state).
    #[arg(id = "lora", long = "lora", value_name = "LORA", requires = "config")]
    pub rank: Option<Count>,
    /// LoRA's alpha: the adapters' update is scaled by alpha / rank
    /// [default: 2 × rank, PEFT's]; the same memory whatever it is.
    #[arg(id = "lora_alpha", long = "lora-alpha", value_name = "LORA_ALPHA", value_parser = lora_alpha, requires = "lora")]
    pub alpha: Option<f64>,
    /// The modules LoRA adapts, by their checkpoint names, comma-separated
    /// [default: q_proj,v_proj; c_attn for gpt2; query,value for bert;
    /// qkv_proj for phi3]; a mixture's experts too on request (w1,w2,w3 for
    /// mixtral; gate_proj,up_proj,down_proj for qwen2_moe and qwen3_moe).
    #[arg(id = "lora_targets", long = "lora-targets", value_name = "LORA_TARGETS", value_delimiter = ',', value_parser = module_name, requires = "lora")]
    pub targets: Vec<String>,
}

/// How a config's step computes attention, the loss and the other ops, as
/// `probe` and `estimate` both take it: defined once here.
#[derive(Debug, Args)]
#[command(next_help_heading = "Model from a config")]
pub struct StepForms {
    /// With --config: how attention is computed. blocked: in blocks with an
    /// online softmax, the scores recomputed in the backward pass (as SDPA
    /// or FlashAttention-2); eager: the scores made whole and kept [default: blocked].
    #[arg(long, value_parser = typed::<AttentionArg, Attention>(), requires = "config")]
    pub attention: Option<Attention>,
    /// With --config: how the head and the loss are computed. chunked: fused
    /// in chunks of tokens, the logits never whole (as Liger Kernel's fused
    /// loss); full: every position's logits made whole [default: chunked].
    #[arg(long, value_parser = typed::<LossArg, Loss>(), requires = "config")]
    pub loss: Option<Loss>,
    /// With --config: how norms, rotary positions, activations and
    /// projections are computed. fused: each one node that keeps its inputs
    /// and output (what PyTorch keeps, or less); eager: written as candle
    /// ops, every intermediate kept [default: fused].
    #[arg(long, value_parser = typed::<OpsArg, Ops>(), requires = "config")]
    pub ops: Option<Ops>,
}

/// Where the search runs and how it tries batches.
#[derive(Debug, Args)]
#[command(next_help_heading = "Search")]
pub struct SearchArgs {
    #[command(flatten)]
    pub on: DeviceBudget,
    #[command(flatten)]
    pub ceiling: CeilingFlag,
    /// Smallest batch to try.
    #[arg(long, default_value_t = Count::ONE)]
    pub start: Count,
    #[command(flatten)]
    pub granule: MultipleOfFlag,
    /// Largest batch to try.
    #[arg(long)]
    pub max_batch: Option<Count>,
    /// Stop searching after this long (e.g. 30s, 2m, 500ms; warm-up
    /// included) with the largest batch seen to fit, not proven largest, and
    /// the batches that remain open. A trial running at the limit finishes;
    /// with --seq-lens or --compare each length or variant has the limit.
    #[arg(long, value_parser = crate::parse::parse_duration, allow_hyphen_values = true)]
    pub time_limit: Option<std::time::Duration>,
    /// Stop after this many trials with the best batch so far.
    #[arg(long)]
    pub max_trials: Option<Count>,
    /// Training steps per trial.
    #[arg(long, default_value_t = Count::ONE)]
    pub steps_per_trial: Count,
    /// Search strategy.
    #[arg(long, value_parser = typed::<StrategyArg, Strategy>(), default_value = "predictive")]
    pub strategy: Strategy,
}

/// What the plan is made from and for.
#[derive(Debug, Args)]
#[command(next_help_heading = "Plan")]
pub struct PlanningArgs {
    /// Plan from the largest batch that fits, or from the fastest in samples
    /// per second among the largest, ¾ and ½ of it (a few extra timed steps).
    #[arg(long, value_parser = typed::<ObjectiveArg, Objective>(), default_value = "largest")]
    pub objective: Objective,
    #[command(flatten)]
    pub target: TargetFlag,
    #[command(flatten)]
    pub split: SplitFlags,
    /// Also find the evaluation step's largest batch (forward only).
    #[arg(long)]
    pub eval: bool,
    /// Answer even when the measured step did not reach every variable's
    /// gradient (a cut graph, which understates training), the plan marked
    /// not proven; by default that is an error naming the switch.
    #[arg(long)]
    pub allow_partial_graph: bool,
    /// Keep plans in this JSON file: an unchanged model, device and settings
    /// reuse the stored plan without probing.
    #[arg(long)]
    pub cache: Option<std::path::PathBuf>,
}

/// The questions other than "the largest batch": one at a time.
#[derive(Debug, Args)]
#[command(next_help_heading = "Other questions (one at a time)")]
#[command(group(clap::ArgGroup::new("mode").args(["compare", "seq_lens", "find"])))]
pub struct ModeArgs {
    /// Tune the model as it is and with each remedy that applies to it, side
    /// by side: bf16, mixed precision, the lean optimizers (lion, adafactor,
    /// adam8bit) and, for the transformer, gradient checkpointing (alone and
    /// with bf16); the estimate's bytes per sample beside the measured. Each
    /// variant's largest batch.
    #[arg(long, conflicts_with_all = ["eval", "objective", "target_effective_batch", "world_size", "exact", "cache"])]
    pub compare: bool,
    /// Transformer: tune at each of these sequence lengths (comma-separated,
    /// e.g. 64,128,256) and print a plan across them: each length's largest
    /// batch, a memory model in batch and length, the token budget per
    /// micro-batch. The model takes sequences up to the longest (or --seq-len).
    #[arg(long, value_delimiter = ',', conflicts_with = "eval")]
    pub seq_lens: Vec<Count>,
    /// Find the longest input at a fixed --batch instead of the largest
    /// batch: seq-len (transformer: lengths up to --seq-len, the model's
    /// positions) or resolution (convnet: image sides up to --resolution, in
    /// multiples of 4).
    #[arg(
        long,
        value_enum,
        requires = "batch",
        conflicts_with_all = ["start", "max_batch", "target_effective_batch", "world_size", "exact", "objective", "cache", "eval"],
    )]
    pub find: Option<FindArg>,
    #[command(flatten)]
    pub batch: BatchFlag,
    #[command(flatten)]
    pub check: CheckFlag,
}

/// The input size `probe --find` searches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FindArg {
    /// The transformer's sequence length.
    SeqLen,
    /// The convnet's image side.
    Resolution,
}

/// `--config`, as every command that reads a model takes it.
#[derive(Clone, Debug, Args)]
pub struct ConfigFlag {
    /// A Hugging Face config.json, or a Hub name (model_type llama, mistral,
    /// qwen2, qwen3, olmo2, gemma2, gemma3_text, phi3, mixtral, qwen2_moe,
    /// qwen3_moe, gpt2 or bert; serve takes the decoders): that architecture.
    /// probe runs its step in place of a reference model (with random
    /// weights unless --weights); estimate counts its parameters and its whole step
    /// (the head's logits and the loss included; with --capacity, the
    /// largest batch under --ceiling); serve measures it serving. Its
    /// torch_dtype is the dtype unless --precision (or --base-dtype) says
    /// otherwise; --seq-len [default: the shorter of 512 and its positions]
    /// and --layers apply to it.
    #[arg(id = "config", long = "config", value_name = "CONFIG")]
    pub path: Option<std::path::PathBuf>,
}

/// `--precision`, as `probe` and `estimate` take it, with its old spellings
/// (`--dtype`, an alias; `--mixed-precision`, hidden).
#[derive(Clone, Copy, Debug, Args)]
pub struct PrecisionFlag {
    /// How weights, gradients, activations and optimizer state are stored:
    /// fp32 [default; with --config its torch_dtype], bf16, or mixed (bf16
    /// weights, gradients and activations; fp32 master weights and optimizer
    /// state). With --base-dtype: the model's dtype (its activations and
    /// unquantized weights), the adapters in f32.
    #[arg(
        id = "precision",
        long = "precision",
        alias = "dtype",
        value_name = "PRECISION",
        value_parser = typed::<PrecisionArg, Precision>(),
        conflicts_with = "mixed_precision"
    )]
    pub given: Option<Precision>,
    /// `--precision mixed`, as 0.1 spelled it.
    #[arg(id = "mixed_precision", long = "mixed-precision", hide = true)]
    pub mixed: bool,
}

impl PrecisionFlag {
    /// The precision asked for, in whichever spelling; `None` where none was.
    pub fn asked(&self) -> Option<Precision> {
        if self.mixed { Some(Precision::Mixed) } else { self.given }
    }
}

/// `--checkpointing`, as `probe` and `estimate` take it.
#[derive(Clone, Copy, Debug, Args)]
pub struct CheckpointingFlag {
    /// Gradient checkpointing over the transformer's blocks: keep each
    /// block's input, recompute the block in the backward pass (estimate:
    /// --recompute full).
    #[arg(id = "checkpointing", long = "checkpointing")]
    pub on: bool,
}

/// A transformer's `--layers`, `--heads` and `--seq-len`, as `probe` and
/// `estimate` take them.
#[derive(Clone, Copy, Debug, Args)]
pub struct ShapeFlags {
    /// Transformer blocks: the reference transformer's [default: 2] (probe),
    /// the formula's with --hidden, --heads, --seq-len and --batch
    /// (estimate: Korthikanti et al. 2022, 16-bit); with --config a
    /// shallower (or deeper) copy of the model [default: its own].
    #[arg(id = "layers", long = "layers", value_name = "LAYERS")]
    pub layers: Option<Count>,
    /// Transformer attention heads, a divisor of the width [default: 4 for
    /// the reference transformer] (not with --config, which has its own).
    #[arg(id = "heads", long = "heads", value_name = "HEADS", conflicts_with = "config")]
    pub heads: Option<Count>,
    /// Tokens per sample: probe at the longest training will see [default:
    /// 64 for the reference transformer; with --config, the shorter of 512
    /// and the model's positions].
    #[arg(id = "seq_len", long = "seq-len", value_name = "SEQ_LEN")]
    pub seq_len: Option<Count>,
}

/// `--batch`, a batch held fixed: the one `probe --find` searches the input
/// size at, the micro-batch `estimate` counts the activations of.
#[derive(Clone, Copy, Debug, Args)]
pub struct BatchFlag {
    /// The batch held fixed: the one --find searches the input size at
    /// (probe), the micro-batch per device the activations are counted at
    /// (estimate).
    #[arg(id = "batch", long = "batch", value_name = "BATCH")]
    pub size: Option<Count>,
}

/// The frozen weights' dtype, `--base-dtype`, as `probe`, `estimate` and
/// `serve` take it (`--weights`, 0.1's spelling, is an alias where it is not
/// probe's own switch: see [`command`]).
#[derive(Clone, Copy, Debug, Args)]
pub struct BaseDtypeFlag {
    /// The frozen weights' dtype: f32 or bf16, the whole base (and the
    /// activations) in it; q8_0 or q4_0 (QLoRA), the layers' projections
    /// quantized, the rest in the model's dtype. With --lora, the base's,
    /// the adapters in f32 [default: the model's dtype, adapters in it too];
    /// serving (serve, estimate --serve), every weight's, all frozen
    /// [default: the config's torch_dtype].
    #[arg(id = "base_dtype", long = "base-dtype", value_name = "BASE_DTYPE", value_parser = base_dtype)]
    pub base_dtype: Option<BaseDtype>,
}

/// `--world-size`, `--exact` and `--equal-micro-batches`: how a target is
/// split, as `probe` and `plan` take them.
#[derive(Clone, Copy, Debug, Args)]
pub struct SplitFlags {
    /// Data-parallel ranks.
    #[arg(id = "world_size", long = "world-size", value_name = "WORLD_SIZE", default_value_t = Count::ONE)]
    pub world_size: Count,
    /// Fail instead of rounding the effective batch up when no split hits the target.
    #[arg(id = "exact", long = "exact")]
    pub exact: bool,
    /// Micro-batches of one size only (more accumulation steps where ones that
    /// differ by one sample would reach the target in fewer).
    #[arg(id = "equal_micro_batches", long = "equal-micro-batches")]
    pub equal_micro_batches: bool,
}

/// `--multiple-of`, as `probe` and `plan` take it.
#[derive(Clone, Copy, Debug, Args)]
pub struct MultipleOfFlag {
    /// Keep (micro-)batches to multiples of this (e.g. 8); with probe
    /// --find, the input size's granule.
    #[arg(id = "multiple_of", long = "multiple-of", value_name = "MULTIPLE_OF", default_value_t = Count::ONE)]
    pub multiple_of: Count,
}

/// `--plot`, as `probe` and `serve` take it.
#[derive(Clone, Debug, Args)]
pub struct PlotFlag {
    /// Draw what was measured into this SVG file. probe: peak memory against
    /// the batch for every trial, with the ceiling, the capacity, the fitted
    /// memory model and the chosen batch (with --seq-lens: the largest batch
    /// against the length and the token budget; with --compare: each
    /// variant's largest batch and bytes per sample; with --find: peak
    /// against the input size). serve: memory against the sequences, the
    /// held bytes, the caches and the step's own apart (not with
    /// --concurrency).
    #[arg(id = "plot", long = "plot", value_name = "FILE.svg", help_heading = "Output")]
    pub path: Option<std::path::PathBuf>,
}

/// `--target-effective-batch`, as `probe` and `estimate` take it.
#[derive(Clone, Copy, Debug, Args)]
pub struct TargetFlag {
    /// Effective (global) batch to reach with micro-batch × accumulation ×
    /// ranks, split from the largest batch (estimate: with --config and
    /// --capacity, over --ranks).
    #[arg(id = "target_effective_batch", long = "target-effective-batch", value_name = "TARGET_EFFECTIVE_BATCH")]
    pub batch: Option<Count>,
}

/// `--check N`, as `probe` and `serve` take it: no search, N and the next up run.
#[derive(Clone, Copy, Debug, Args)]
pub struct CheckFlag {
    /// No search: run N and the next one up, each once after a warm-up
    /// step, and say whether N fits and is the most that does. probe: batch
    /// N and N + --multiple-of, exit 3 when N does not fit, no advice
    /// measured; serve: N and N + 1 sequences at --max-model-len, each with
    /// the worst step (a check by brute force).
    #[arg(id = "check", long = "check", value_name = "N")]
    pub n: Option<Count>,
}

/// `--optimizer`, as `probe` and `estimate` take it.
#[derive(Clone, Copy, Debug, Args)]
pub struct OptimizerFlag {
    /// The optimizer: its state counted (estimate), its state and its step
    /// measured (probe, which runs every one but momentum). --precision
    /// mixed runs AdamW on f32 master weights.
    #[arg(id = "optimizer", long = "optimizer", value_name = "OPTIMIZER", value_parser = typed::<OptimizerArg, OptimizerKind>(), default_value = "adamw")]
    pub kind: OptimizerKind,
}

/// `--device` and `--budget`, as `probe` and `serve` take them.
#[derive(Clone, Copy, Debug, Args)]
pub struct DeviceBudget {
    /// Where to run: cpu (the heap under --budget), cuda or cuda:N.
    #[arg(long, default_value = "cpu", value_parser = device)]
    pub device: DeviceSpec,
    /// CPU memory budget playing device memory, e.g. 512MiB or 4GiB. Keep it
    /// under half the free RAM: the one over-budget trial allocates up to
    /// about twice the budget (a budget above the available RAM is refused)
    /// [default: 256MiB for probe; 1GiB for serve, the whole process's,
    /// weights included].
    #[arg(long, allow_hyphen_values = true, value_parser = budget)]
    pub budget: Option<u64>,
}

/// `--json`, the same flag in every command.
#[derive(Clone, Copy, Debug, Args)]
pub struct JsonOutput {
    /// Print the answer (the plan, the estimate, the split, the serving
    /// plan) as JSON on stdout; trials, progress and logs go to stderr.
    #[arg(id = "json", long = "json", help_heading = "Output")]
    pub on: bool,
}

/// `--ceiling`, the same flag in every command.
#[derive(Clone, Copy, Debug, Args)]
pub struct CeilingFlag {
    /// The most a step (or serving's peak) may use, a fraction of the
    /// capacity in (0, 1]: 0.9 or 90%. With estimate, of --capacity: the
    /// total must stay under it, and with --config the largest batch is the
    /// one whose step does.
    #[arg(id = "ceiling", long = "ceiling", value_name = "CEILING", default_value_t = Ceiling::default(), value_parser = ceiling)]
    pub fraction: Ceiling,
}

/// Where the answer goes.
#[derive(Debug, Args)]
#[command(next_help_heading = "Output")]
pub struct OutputArgs {
    #[command(flatten)]
    pub plot: PlotFlag,
    #[command(flatten)]
    pub json: JsonOutput,
}

/// `autobatch estimate`.
#[derive(Debug, Args)]
pub struct EstimateArgs {
    #[command(flatten)]
    pub state: StateArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
    #[command(flatten)]
    pub sharding: ShardingArgs,
    #[command(flatten)]
    pub activations: ActivationArgs,
    #[command(flatten)]
    pub lora: LoraFlags,
    #[command(flatten)]
    pub base: BaseArgs,
    #[command(flatten)]
    pub step: StepForms,
    #[command(flatten)]
    pub serving: ServingCountArgs,
    #[command(flatten)]
    pub json: JsonOutput,
}

/// What trains and how its state is stored.
#[derive(Debug, Args)]
#[command(next_help_heading = "What trains")]
pub struct StateArgs {
    /// Trainable parameters, e.g. 1e9, 125M or 7B.
    #[arg(
        long,
        allow_hyphen_values = true,
        required_unless_present = "config",
        conflicts_with = "config",
        value_parser = parameters
    )]
    pub params: Option<u64>,
    #[command(flatten)]
    pub config: ConfigFlag,
    #[command(flatten)]
    pub precision: PrecisionFlag,
    #[command(flatten)]
    pub optimizer: OptimizerFlag,
}

/// The device it should fit on.
#[derive(Debug, Args)]
#[command(next_help_heading = "Device")]
pub struct DeviceArgs {
    /// Device capacity, e.g. 12GiB or 80GB, or a card by name (h100, a100-40gb,
    /// a100-80gb, h200, l4, l40s, rtx4090, rtx3090, v100-16gb, v100-32gb,
    /// mi300x, ...: the memory it reports): says whether it fits, and what
    /// would make it.
    #[arg(long, allow_hyphen_values = true, value_parser = capacity)]
    pub capacity: Option<Capacity>,
    /// List the named cards this configuration fits on (per device, under
    /// --zero, --ranks and --tensor-parallel), with the memory each reports.
    #[arg(long)]
    pub which_gpus: bool,
    #[command(flatten)]
    pub ceiling: CeilingFlag,
    #[command(flatten)]
    pub target: TargetFlag,
    /// With --config: count the step (or with --serve, serving) as it runs
    /// on the CPU (`probe` and `serve --device cpu`: the CPU heap, where
    /// candle's matmul widens bf16 operands and products to f32) rather than
    /// on an accelerator (the default).
    #[arg(long, requires = "config")]
    pub on_cpu: bool,
}

/// How the state is spread over devices.
#[derive(Debug, Args)]
#[command(next_help_heading = "Sharding")]
pub struct ShardingArgs {
    /// ZeRO stage the state is partitioned at over --ranks: 0 none, 1 optimizer
    /// states, 2 + gradients, 3 + weights.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=3))]
    pub zero: u8,
    /// Data-parallel ranks (the ZeRO partitions are spread over them).
    #[arg(long, default_value_t = Count::ONE)]
    pub ranks: Count,
    /// Tensor-parallel degree: every parameter (and activation) split this many ways.
    #[arg(long, default_value_t = Count::ONE)]
    pub tensor_parallel: Count,
}

/// The activations: given, or a transformer's counted (with --config, its
/// sizes and length).
#[derive(Debug, Args)]
#[command(next_help_heading = "Activations")]
pub struct ActivationArgs {
    /// Activation memory at the batch you want, e.g. 6GiB (from a probe); counted in the total.
    #[arg(
        id = "activations",
        long = "activations",
        value_name = "ACTIVATIONS",
        allow_hyphen_values = true,
        value_parser = bytes
    )]
    pub bytes: Option<u64>,
    #[command(flatten)]
    pub shape: ShapeFlags,
    /// Transformer hidden size (not with --config, which has its own).
    #[arg(long, conflicts_with = "config")]
    pub hidden: Option<Count>,
    #[command(flatten)]
    pub batch: BatchFlag,
    /// What the backward pass recomputes instead of keeping (--checkpointing
    /// is --recompute full).
    #[arg(long, value_parser = typed::<RecomputeArg, Recompute>(), default_value = "none", conflicts_with = "checkpointing")]
    pub recompute: Recompute,
    #[command(flatten)]
    pub checkpointing: CheckpointingFlag,
}

impl ActivationArgs {
    /// What the backward pass recomputes: `--recompute`, or `--checkpointing`'s full.
    pub fn recompute(&self) -> Recompute {
        if self.checkpointing.on { Recompute::Full } else { self.recompute }
    }
}

/// The frozen weights' dtype in an estimate: LoRA's base, or every weight served.
#[derive(Debug, Args)]
#[command(next_help_heading = "LoRA")]
pub struct BaseArgs {
    #[command(flatten)]
    pub base: BaseDtypeFlag,
}

/// The flags `estimate --serve` does not read: each says how training runs
/// (its state, its sharding, its activations, its step), or sizes what the
/// config already sizes; serving is sized by the serving flags alone.
const SERVE_IGNORES: [&str; 20] = [
    "params",
    "lora",
    "lora_targets",
    "batch",
    "seq_len",
    "layers",
    "activations",
    "recompute",
    "target_effective_batch",
    "optimizer",
    "mixed_precision",
    "precision",
    "checkpointing",
    "zero",
    "ranks",
    "tensor_parallel",
    "attention",
    "loss",
    "ops",
    "which_gpus",
];

/// Serving instead of training, counted.
#[derive(Debug, Args)]
#[command(next_help_heading = "Serving")]
pub struct ServingCountArgs {
    /// With --config: serving instead of training, counted: the KV cache's
    /// bytes per token and per sequence, the worst step's own bytes, and with
    /// --capacity the sequences of --max-model-len it holds under --ceiling,
    /// beside what vLLM's formula gives for the same settings.
    #[arg(long, requires = "config", conflicts_with_all = SERVE_IGNORES)]
    pub serve: bool,
    #[command(flatten)]
    pub settings: ServingArgs,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Target effective (global) batch.
    #[arg(long)]
    pub target: Count,
    /// Largest micro-batch that fits on one rank.
    #[arg(long, required_unless_present = "uneven")]
    pub largest: Option<Count>,
    /// Mixed GPUs: the largest micro-batch of each rank, comma-separated
    /// (e.g. 200,90); the target is shared in proportion, exactly, with
    /// each rank's micro-steps and loss weights.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["largest", "world_size", "equal_micro_batches"])]
    pub uneven: Vec<Count>,
    #[command(flatten)]
    pub split: SplitFlags,
    #[command(flatten)]
    pub granule: MultipleOfFlag,
    #[command(flatten)]
    pub json: JsonOutput,
}

/// How a model is served: what `serve` measures and `estimate --serve` counts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Args)]
pub struct ServingArgs {
    /// Tokens each sequence's cache holds (vLLM's --max-model-len)
    /// [default: the shorter of 4096 and the model's positions].
    #[arg(long, help_heading = "Serving")]
    pub max_model_len: Option<Count>,
    /// Tokens the worst step prefills while every other sequence decodes a
    /// token (vLLM's --max-num-batched-tokens) [default: 2048].
    #[arg(long, help_heading = "Serving")]
    pub max_num_batched_tokens: Option<Count>,
    /// Tokens per KV cache block (vLLM's --block-size) [default: 16].
    #[arg(long, help_heading = "Serving")]
    pub block_size: Option<Count>,
    /// The KV cache's dtype: f32, bf16, f16, or int8 (a byte a value and an
    /// f32 scale per token and head) [default: the dtype the model computes in].
    #[arg(long, value_enum, help_heading = "Serving")]
    pub kv_cache_dtype: Option<CacheDtype>,
}

/// A KV cache's dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CacheDtype {
    F32,
    Bf16,
    F16,
    /// 8 bits a value and an f32 scale per token and head.
    Int8,
}

impl From<CacheDtype> for candle_core::DType {
    fn from(dtype: CacheDtype) -> candle_core::DType {
        match dtype {
            CacheDtype::F32 => candle_core::DType::F32,
            CacheDtype::Bf16 => candle_core::DType::BF16,
            CacheDtype::F16 => candle_core::DType::F16,
            CacheDtype::Int8 => autobatch_models::KvCache::INT8,
        }
    }
}

/// `autobatch serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub config: ConfigFlag,
    #[command(flatten)]
    pub serving: ServingArgs,
    #[command(flatten)]
    pub base: BaseDtypeFlag,
    /// The longest context this many sequences hold, instead of how many
    /// sequences hold --max-model-len (then the longest it may be).
    #[arg(long, conflicts_with = "plot")]
    pub concurrency: Option<Count>,
    #[command(flatten)]
    pub check: CheckFlag,
    #[command(flatten)]
    pub ceiling: CeilingFlag,
    #[command(flatten)]
    pub on: DeviceBudget,
    #[command(flatten)]
    pub json: JsonOutput,
    #[command(flatten)]
    pub plot: PlotFlag,
}
