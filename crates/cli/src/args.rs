//! Command-line arguments: each command's flags, grouped by what they say.

use autobatch::estimate::{OptimizerKind, Precision, Recompute};
use autobatch::{plan::Ceiling, plan::Objective, search::Strategy};
use autobatch_models::{Attention, BaseDtype, Loss, Ops};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

use crate::values::{
    AttentionArg, Capacity, Count, DeviceSpec, DtypeArg, LossArg, ObjectiveArg, OpsArg, OptimizerArg, PrecisionArg,
    RecomputeArg, StrategyArg, base_dtype, budget, bytes, capacity, ceiling, device, lora_alpha, module_name,
    parameters, seed, typed,
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
    Cli::command()
        .mut_args(|arg| match arg.get_id().as_str() {
            // the top level lists the commands; the probe's flags are probe's help
            "verbose" | "help" | "version" => arg,
            _ => negatives_are_values(arg).hide(true),
        })
        .mut_subcommands(|command| command.mut_args(negatives_are_values))
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
            ("--heads", sizes.heads.is_some(), &[Transformer]),
            ("--layers", sizes.layers.is_some(), &[Transformer]),
            ("--seq-len", sizes.seq_len.is_some(), &[Transformer]),
            ("--inputs", sizes.inputs.is_some(), &[Mlp]),
            ("--width", sizes.width.is_some(), &[Mlp]),
            ("--depth", sizes.depth.is_some(), &[Mlp]),
            ("--channels", sizes.channels.is_some(), &[Convnet]),
            ("--resolution", sizes.resolution.is_some(), &[Convnet]),
            ("--classes", sizes.classes.is_some(), &[Mlp, Convnet]),
            ("--checkpointing", self.model.checkpointing, &[Transformer]),
        ]
    }

    /// The length the model is built for: `--seq-len`, else the longest of
    /// `--seq-lens`.
    pub fn seq_len(&self) -> Option<usize> {
        self.sizes.seq_len.or(self.mode.seq_lens.iter().max().copied()).map(Count::get)
    }
}

/// Which model trains, and how.
#[derive(Debug, Args)]
#[command(next_help_heading = "Model")]
pub struct ModelArgs {
    /// The reference model to tune (not with --config).
    #[arg(id = "model", long = "model", value_name = "MODEL", value_enum, default_value_t = ModelKind::Transformer)]
    pub kind: ModelKind,
    /// How weights, gradients, activations and optimizer state are stored
    /// (`--dtype` is the same flag) [default: fp32; with --config, the
    /// config's torch_dtype].
    #[arg(long, alias = "dtype", value_parser = typed::<PrecisionArg, Precision>())]
    pub precision: Option<Precision>,
    #[command(flatten)]
    pub optimizer: OptimizerFlag,
    /// Gradient checkpointing over the transformer's blocks (keep each
    /// block's input, recompute the block in the backward pass).
    #[arg(long)]
    pub checkpointing: bool,
    /// Seed of the weights and synthetic data.
    #[arg(long, default_value_t = 0, value_parser = seed)]
    pub seed: u64,
}

impl ModelArgs {
    /// `--precision`, fp32 when not given.
    pub fn precision(&self) -> Precision {
        self.precision.unwrap_or(Precision::Fp32)
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
    #[arg(long)]
    pub vocab: Option<Count>,
    /// Transformer: hidden size [default: 64].
    #[arg(long)]
    pub d_model: Option<Count>,
    /// Transformer: attention heads, a divisor of --d-model [default: 4].
    #[arg(long)]
    pub heads: Option<Count>,
    /// Transformer blocks: the reference transformer's [default: 2], or with
    /// --config a shallower (or deeper) copy of the model [default: its own].
    #[arg(long)]
    pub layers: Option<Count>,
    /// Tokens per sample; probe at the longest training will see [default:
    /// 64 for the reference transformer; with --config, the shorter of 512
    /// and the model's positions].
    #[arg(long)]
    pub seq_len: Option<Count>,
    /// MLP: input features [default: 64].
    #[arg(long)]
    pub inputs: Option<Count>,
    /// MLP: hidden width [default: 256].
    #[arg(long)]
    pub width: Option<Count>,
    /// MLP: hidden layers [default: 3].
    #[arg(long)]
    pub depth: Option<Count>,
    /// Convnet: channels of the first convolution [default: 16].
    #[arg(long)]
    pub channels: Option<Count>,
    /// Convnet: image side, a multiple of 4; probe at the largest training will see [default: 32].
    #[arg(long)]
    pub resolution: Option<Count>,
    /// MLP or convnet: output classes [default: 10 for mlp, 3 for convnet].
    #[arg(long)]
    pub classes: Option<Count>,
}

/// A model from a Hugging Face config.json, and how it trains.
#[derive(Debug, Args)]
#[command(next_help_heading = "Model from a config")]
pub struct ConfigArgs {
    /// A Hugging Face config.json (model_type llama, mistral, qwen2, qwen3,
    /// olmo2, gemma2, gemma3_text, phi3, mixtral, qwen3_moe, gpt2 or bert): that architecture, with random weights, instead of a
    /// reference model. --seq-len, --seq-lens, --layers and --precision
    /// apply to it.
    #[arg(
        id = "config",
        long = "config",
        value_name = "CONFIG",
        conflicts_with_all = ["model", "vocab", "d_model", "heads", "inputs", "width", "depth", "channels", "resolution", "classes"],
    )]
    pub path: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub lora: LoraFlags,
    /// The frozen base's dtype, the adapters in f32. f32 or bf16: the whole
    /// base (and the activations) in it; q8_0 or q4_0 (QLoRA): the layers'
    /// projections quantized, the rest in the model's dtype [default: the
    /// model's dtype, adapters in it too].
    #[arg(long, value_parser = base_dtype, requires = "lora")]
    pub base_dtype: Option<BaseDtype>,
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
            ("--base-dtype", self.base_dtype.is_some()),
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
    /// Only try batches that are multiples of this (e.g. 8); with --find,
    /// the input size's granule.
    #[arg(long, default_value_t = Count::ONE)]
    pub multiple_of: Count,
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
    /// Effective (global) batch to reach with micro-batch × accumulation × ranks.
    #[arg(long)]
    pub target_effective_batch: Option<Count>,
    /// Data-parallel ranks.
    #[arg(long, default_value_t = Count::ONE)]
    pub world_size: Count,
    /// Fail instead of rounding the effective batch up when no split hits the target.
    #[arg(long, requires = "target_effective_batch")]
    pub exact: bool,
    /// Micro-batches of one size only (more accumulation steps where ones that
    /// differ by one sample would reach the target in fewer).
    #[arg(long, requires = "target_effective_batch")]
    pub equal_micro_batches: bool,
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
    /// The batch --find holds fixed.
    #[arg(long, requires = "find")]
    pub batch: Option<Count>,
    /// No search: run batch N and the next one up (N + --multiple-of), each
    /// once after a warm-up step, and say whether N fits and is the largest
    /// that does. Exit 3 when N does not fit; no advice is measured.
    #[arg(
        long,
        value_name = "N",
        conflicts_with_all = ["compare", "seq_lens", "find", "start", "max_batch", "target_effective_batch", "world_size", "exact", "objective", "cache", "eval", "plot", "time_limit", "max_trials"],
    )]
    pub check: Option<Count>,
}

/// The input size `probe --find` searches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FindArg {
    /// The transformer's sequence length.
    SeqLen,
    /// The convnet's image side.
    Resolution,
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
    /// Draw what the search measured into this SVG file: peak memory against
    /// the batch for every trial with the ceiling, the capacity, the fitted
    /// memory model and the chosen batch (with --seq-lens: the largest batch
    /// against the length and the token budget; with --compare: each
    /// variant's largest batch and bytes per sample; with --find: peak
    /// against the input size).
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<std::path::PathBuf>,
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

impl EstimateArgs {
    /// The arguments in the words the help lists, the way the estimate reads
    /// them: the hidden old spellings folded into them (`--mixed-precision`
    /// as `--precision mixed`, `--dtype fp32|bf16` as `--precision`), and
    /// probe's `--checkpointing` as `--recompute full`.
    pub fn in_one_vocabulary(mut self) -> EstimateArgs {
        if std::mem::take(&mut self.state.mixed_precision) {
            self.state.precision = Some(Precision::Mixed);
        }
        if let Some(dtype) = self.state.dtype.take() {
            self.state.precision = Some(dtype);
        }
        if std::mem::take(&mut self.activations.checkpointing) {
            self.activations.recompute = Recompute::Full;
        }
        self
    }
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
    /// A Hugging Face config.json: the parameters, and the whole training
    /// step on candle counted from it (the activations of the lean step by
    /// default, the head's logits and the loss included) at --seq-len
    /// [default: the shorter of 512 and its positions]; with --capacity, the
    /// largest batch under --ceiling. The dtype is its torch_dtype unless
    /// --precision says otherwise.
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// How weights, gradients and optimizer state are stored: fp32 [default;
    /// with --config its torch_dtype], bf16, or mixed (bf16 weights and
    /// gradients, fp32 master weights and optimizer state). With
    /// --base-dtype: the model's dtype (its activations and unquantized
    /// weights), the adapters in f32.
    #[arg(long, value_parser = typed::<PrecisionArg, Precision>(), conflicts_with_all = ["dtype", "mixed_precision"])]
    pub precision: Option<Precision>,
    #[command(flatten)]
    pub optimizer: OptimizerFlag,
    /// `--precision fp32|bf16`, as 0.1 spelled it.
    #[arg(long, hide = true, value_parser = typed::<DtypeArg, Precision>(), conflicts_with = "mixed_precision")]
    pub dtype: Option<Precision>,
    /// `--precision mixed`, as 0.1 spelled it.
    #[arg(long, hide = true)]
    pub mixed_precision: bool,
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
    /// With --config and --capacity: split this effective (global) batch
    /// into micro-batch × accumulation × --ranks from the largest batch.
    #[arg(long, requires_all = ["config", "capacity"], conflicts_with = "params")]
    pub target_effective_batch: Option<Count>,
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
    /// Transformer layers: with --hidden, --heads, --seq-len and --batch, the
    /// activations are estimated (Korthikanti et al. 2022, 16-bit) instead of
    /// given. With --config: a copy of the model with this many layers (its
    /// parameters and its activations).
    #[arg(long)]
    pub layers: Option<Count>,
    /// Transformer hidden size (not with --config, which has its own).
    #[arg(long, conflicts_with = "config")]
    pub hidden: Option<Count>,
    /// Transformer attention heads (not with --config, which has its own).
    #[arg(long, conflicts_with = "config")]
    pub heads: Option<Count>,
    /// Tokens per sample.
    #[arg(long)]
    pub seq_len: Option<Count>,
    /// Micro-batch per device.
    #[arg(long)]
    pub batch: Option<Count>,
    /// What the backward pass recomputes instead of keeping.
    #[arg(long, value_parser = typed::<RecomputeArg, Recompute>(), default_value = "none")]
    pub recompute: Recompute,
    /// Gradient checkpointing, as `probe` says it: --recompute full.
    #[arg(long, conflicts_with = "recompute")]
    pub checkpointing: bool,
}

/// The frozen weights' dtype in an estimate: LoRA's base, or every weight served.
#[derive(Debug, Args)]
#[command(next_help_heading = "LoRA")]
pub struct BaseArgs {
    /// The frozen weights' dtype (f32, bf16, q8_0, q4_0): with --lora the
    /// base's, the adapters in f32 [default: the model's dtype, adapters in
    /// it too]; with --serve every weight's (all frozen) [default: the
    /// config's torch_dtype], as `probe --base-dtype` and `serve --base-dtype` say it.
    #[arg(long, alias = "weights", value_parser = base_dtype)]
    pub base_dtype: Option<BaseDtype>,
}

/// The flags `estimate --serve` does not read: each says how training runs
/// (its state, its sharding, its activations, its step), or sizes what the
/// config already sizes; serving is sized by the serving flags alone.
const SERVE_IGNORES: [&str; 21] = [
    "params",
    "lora",
    "lora_targets",
    "batch",
    "seq_len",
    "layers",
    "activations",
    "recompute",
    "target_effective_batch",
    "dtype",
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
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["largest", "world_size"])]
    pub uneven: Vec<Count>,
    /// Data-parallel ranks.
    #[arg(long, default_value_t = Count::ONE)]
    pub world_size: Count,
    /// Keep micro-batches to multiples of this.
    #[arg(long, default_value_t = Count::ONE)]
    pub multiple_of: Count,
    /// Fail instead of rounding the effective batch up when no split hits the target.
    #[arg(long)]
    pub exact: bool,
    /// Micro-batches of one size only (more accumulation steps where ones that
    /// differ by one sample would reach the target in fewer).
    #[arg(long, conflicts_with = "uneven")]
    pub equal_micro_batches: bool,
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
    /// A Hugging Face config.json of a decoder (llama, mistral, qwen2, qwen3, olmo2,
    /// gemma2, gemma3_text, phi3, mixtral, qwen3_moe, gpt2).
    #[arg(long)]
    pub config: std::path::PathBuf,
    #[command(flatten)]
    pub serving: ServingArgs,
    /// How the weights are stored, every one frozen as LoRA's base is
    /// (`probe --base-dtype`): f32, bf16, q8_0 or q4_0 [default: the
    /// config's torch_dtype]; quantized, the rest computes in the config's
    /// dtype. `--weights`, as 0.1 spelled it, still works.
    #[arg(long, alias = "weights", value_parser = base_dtype, help_heading = "Serving")]
    pub base_dtype: Option<BaseDtype>,
    /// The longest context this many sequences hold, instead of how many
    /// sequences hold --max-model-len (then the longest it may be).
    #[arg(long)]
    pub concurrency: Option<Count>,
    /// No search: run N sequences and N + 1 at --max-model-len, each with
    /// the worst step, and say whether each fits (a check by brute force).
    #[arg(long, value_name = "N", conflicts_with_all = ["concurrency", "plot"])]
    pub check: Option<Count>,
    #[command(flatten)]
    pub ceiling: CeilingFlag,
    #[command(flatten)]
    pub on: DeviceBudget,
    #[command(flatten)]
    pub json: JsonOutput,
    /// Draw memory against the sequences (the held bytes, the caches and the
    /// step's own apart) into this SVG file (not with --concurrency).
    #[arg(long, conflicts_with = "concurrency")]
    pub plot: Option<std::path::PathBuf>,
}
