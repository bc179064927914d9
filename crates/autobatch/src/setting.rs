//! The names of the settings an error can be about: one per builder method or
//! argument that checks a value, typed, so that a program renaming them (the
//! command line's flags) matches every one and misses none. A leaf.

macro_rules! setting_names {
    ($($(#[$doc:meta])* $variant:ident => $name:literal,)*) => {
        /// A setting of this workspace, by the builder method or argument that
        /// sets it: what [`Setting::Named`](crate::Setting::Named) holds and a
        /// [`Names`](crate::Names) renames.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum SettingName {
            $($(#[$doc])* $variant,)*
        }

        impl SettingName {
            /// Every setting name, in the order declared.
            pub const ALL: &'static [SettingName] = &[$(SettingName::$variant),*];

            /// The name as the builder spells it: `multiple_of`.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(SettingName::$variant => $name,)*
                }
            }
        }
    };
}

setting_names! {
    /// `Tuner::ceiling`: the share of capacity a step may use.
    Ceiling => "ceiling",
    /// `Tuner::start`: the smallest batch tried.
    Start => "start",
    /// `Tuner::multiple_of`: what every batch is a multiple of.
    MultipleOf => "multiple_of",
    /// `Tuner::max_batch`: the largest batch tried.
    MaxBatch => "max_batch",
    /// `Tuner::time_limit`: how long a search may run.
    TimeLimit => "time_limit",
    /// `ModelProbe::allow_partial_graph`: a step some variables get no gradient from.
    AllowPartialGraph => "allow_partial_graph",
    /// `Tuner::objective`: the largest batch or the fastest.
    Objective => "objective",
    /// `Tuner::uneven_ranks`: ranks sharing one global batch unevenly.
    UnevenRanks => "uneven_ranks",
    /// `Tuner::cache`: the plan cache's file.
    Cache => "cache",
    /// `Search::evaluating`: the evaluation step searched too.
    Evaluation => "evaluation",
    /// `Tuner::max_trials`.
    MaxTrials => "max_trials",
    /// `Tuner::timing_repeats`: the steps a throughput point is timed over.
    TimingRepeats => "timing_repeats",
    /// `Tuner::steps_per_trial`.
    StepsPerTrial => "steps_per_trial",
    /// `Tuner::target_effective_batch`.
    TargetEffectiveBatch => "target_effective_batch",
    /// The global batch shared among uneven ranks.
    TargetGlobalBatch => "target_global_batch",
    /// `Tuner::exact_effective_batch`.
    ExactEffectiveBatch => "exact_effective_batch",
    /// The largest micro-batch the accumulation arithmetic starts from.
    LargestMicroBatch => "largest_micro_batch",
    /// `Tuner::world_size`: the ranks training together.
    WorldSize => "world_size",
    /// The ranks' own capacities or shares.
    Ranks => "ranks",
    /// One rank's index.
    Rank => "rank",
    /// A batch, where one is given (a trial, a search over the input size).
    Batch => "batch",
    /// A micro-batch of a plan or a guard.
    MicroBatch => "micro_batch",
    /// Accumulation steps.
    AccumulationSteps => "accumulation_steps",
    /// A step count.
    Steps => "steps",
    /// A plan handed to a training loop.
    Plan => "plan",
    /// The input size a search is over (a sequence length, a resolution).
    Size => "size",
    /// The input sizes of `Search::sizes`.
    Sizes => "sizes",
    /// A sequence length.
    SeqLen => "seq_len",
    /// `HeapMeter::new`'s budget.
    BudgetBytes => "budget_bytes",
    /// A device's capacity.
    Capacity => "capacity",
    /// An accelerator by name.
    Accelerator => "accelerator",
    /// `Headroom`'s least headroom.
    MinHeadroom => "min_headroom",
    /// A plan cache's key.
    CacheKey => "cache_key",
    /// A comparison variant's predicted bytes per sample.
    BytesPerSampleShare => "bytes_per_sample_share",
    /// A comparison variant's predicted fixed bytes.
    FixedBytesChange => "fixed_bytes_change",
    /// The variant a comparison variant is expected like.
    Like => "like",
    /// The optimizer.
    Optimizer => "optimizer",
    /// A model's dtype.
    Dtype => "dtype",
    /// A quantized base's dtype.
    BaseDtype => "base_dtype",
    /// ZeRO's stage.
    ZeroStage => "zero_stage",
    /// Data-parallel ranks of the estimate.
    DataParallel => "data_parallel",
    /// Tensor-parallel ranks of the estimate.
    TensorParallel => "tensor_parallel",
    /// A `config.json` file.
    Config => "config",
    /// LoRA's rank.
    LoraRank => "lora_rank",
    /// The projections LoRA adapts.
    LoraTargets => "lora_targets",
    /// A reference model's layers.
    Layers => "layers",
    /// A reference transformer's attention heads.
    Heads => "heads",
    /// A reference transformer's model width.
    DModel => "d_model",
    /// A reference transformer's vocabulary.
    Vocab => "vocab",
    /// A reference MLP's width.
    Width => "width",
    /// A reference MLP's hidden layers.
    Depth => "depth",
    /// A reference MLP's inputs.
    Inputs => "inputs",
    /// A reference model's classes.
    Classes => "classes",
    /// A reference convnet's channels.
    Channels => "channels",
    /// A reference convnet's input channels.
    InChannels => "in_channels",
    /// A reference convnet's image side.
    Resolution => "resolution",
    /// Serving: the context of each sequence.
    MaxModelLen => "max_model_len",
    /// Serving: the tokens one step prefills.
    MaxNumBatchedTokens => "max_num_batched_tokens",
    /// Serving: the sequences served together.
    Sequences => "sequences",
    /// Serving: tokens per KV cache block.
    BlockSize => "block_size",
}

impl SettingName {
    /// The setting the builder spells `name`, if there is one.
    pub fn from_name(name: &str) -> Option<SettingName> {
        SettingName::ALL.iter().copied().find(|setting| setting.as_str() == name)
    }
}

impl std::fmt::Display for SettingName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_reads_back_as_its_setting() {
        for setting in SettingName::ALL {
            assert_eq!(SettingName::from_name(setting.as_str()), Some(*setting));
        }
        assert_eq!(SettingName::from_name("multiple-of"), None);
    }
}
