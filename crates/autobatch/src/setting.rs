//! The settings of this crate an error can be about: one per builder method
//! or argument that checks a value, typed, so that a program naming them its
//! own way (the command line's flags) matches every one and misses none. A
//! leaf: it names only this crate's own settings.

macro_rules! settings {
    ($($(#[$doc:meta])* $variant:ident => $name:literal,)*) => {
        /// A setting of this crate, by the builder method or argument that
        /// sets it: what [`Error::InvalidSetting`](crate::Error::InvalidSetting)
        /// is about. Its `Display` is that method (`Tuner::ceiling`). Not
        /// `non_exhaustive`: a program naming every setting its own way
        /// matches them all, and does not compile until it names a new one.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Setting {
            $($(#[$doc])* $variant,)*
        }

        impl Setting {
            /// Every setting, in the order declared.
            pub const ALL: &'static [Setting] = &[$(Setting::$variant),*];

            /// The builder method or argument that sets it: `Tuner::multiple_of`.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Setting::$variant => $name,)*
                }
            }
        }
    };
}

settings! {
    /// The share of capacity a step may use.
    Ceiling => "Tuner::ceiling",
    /// The smallest batch tried.
    Start => "Tuner::start",
    /// What every batch is a multiple of.
    MultipleOf => "Tuner::multiple_of",
    /// The largest batch tried.
    MaxBatch => "Tuner::max_batch",
    /// How long a search may run.
    TimeLimit => "Tuner::time_limit",
    /// A step some variables get no gradient from.
    AllowPartialGraph => "Tuner::allow_partial_graph",
    /// The largest batch or the fastest.
    Objective => "Tuner::objective",
    /// Ranks sharing one global batch unevenly.
    UnevenRanks => "Tuner::uneven_ranks",
    /// The plan cache's file.
    Cache => "Tuner::cache",
    /// The evaluation step searched too.
    Evaluation => "Search::evaluating",
    /// The most trials a search runs.
    MaxTrials => "Tuner::max_trials",
    /// The steps a throughput point is timed over.
    TimingRepeats => "Tuner::timing_repeats",
    /// The steps each trial runs.
    StepsPerTrial => "Tuner::steps_per_trial",
    /// The effective batch the plan reaches.
    TargetEffectiveBatch => "Tuner::target_effective_batch",
    /// The global batch shared among uneven ranks.
    TargetGlobalBatch => "target_global_batch",
    /// Whether the effective batch must be hit exactly.
    ExactEffectiveBatch => "Tuner::exact_effective_batch",
    /// The largest micro-batch the accumulation arithmetic starts from.
    LargestMicroBatch => "largest_micro_batch",
    /// The ranks training together.
    WorldSize => "Tuner::world_size",
    /// The ranks' own largest micro-batches or shares.
    Ranks => "ranks",
    /// One rank's index.
    Rank => "rank",
    /// A batch, where one is given (a trial, a headroom check, a search over
    /// the input size).
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
    /// The input sizes of a search over several sizes.
    Sizes => "Search::sizes",
    /// `HeapMeter::new`'s budget.
    BudgetBytes => "HeapMeter::new's budget_bytes",
    /// A device's capacity.
    Capacity => "capacity",
    /// An accelerator by name.
    Accelerator => "accelerator",
    /// The least headroom a headroom check keeps.
    MinHeadroom => "Headroom::min_headroom",
    /// A plan cache's key.
    CacheKey => "Tuner::cache_key",
    /// A comparison variant's expected place to start from.
    Like => "Variant::expecting's like",
    /// A comparison variant's predicted share of bytes per sample.
    BytesPerSampleShare => "Variant::expecting's bytes_per_sample_share",
    /// A comparison variant's predicted change of fixed bytes.
    FixedBytesChange => "Variant::expecting's fixed_bytes_change",
    /// ZeRO's stage.
    ZeroStage => "Sharding's zero_stage",
    /// Data-parallel ranks of an estimate.
    DataParallel => "Sharding's data_parallel",
    /// Tensor-parallel ranks of an estimate.
    TensorParallel => "Sharding's tensor_parallel",
    /// Serving: the context of each sequence.
    MaxModelLen => "Scheduling::new's max_model_len",
    /// Serving: the tokens one step prefills.
    MaxNumBatchedTokens => "Scheduling::max_num_batched_tokens",
    /// Serving: the sequences served together.
    Sequences => "sequences",
}

impl std::fmt::Display for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
