//! Serving capacity: how many sequences at a given context fit beside their
//! KV caches and the worst step a server runs, measured as a [`Tuner`](crate::Tuner)
//! measures a training batch, with the tuner's ceiling and settings.
//!
//! A server's memory goes mostly to the KV cache of every sequence in flight;
//! each step adds a transient: the activations of the tokens it runs (a
//! prompt's chunk while every other sequence decodes one token), the keys
//! and values attention reads, the logits. A search of a [`Server`]
//! ([`Tuner::search`](crate::Tuner::search)) allocates the full caches of `n` sequences at the
//! [`Scheduling`]'s `max_model_len` tokens, runs that worst step and reads
//! the peak, and searches `n` as the tuner searches a batch: the answer was
//! run and fits, the next one up was run and does not.
//!
//! A candle server implements [`Server`] over its own model and cache;
//! `autobatch_models::Serving` is the one for the decoders that crate builds
//! from a `config.json`.

use serde::Serialize;

use crate::tuner::search::{Alone, Search};
use crate::{Error, MemoryMeter, Plan, Workload};

/// What a server does that the probe measures.
pub trait Server {
    /// The KV caches of a set of sequences.
    type Caches;

    /// Allocates the caches of `sequences` sequences of up to `context`
    /// tokens each and fills them: each holds `context` tokens but the last
    /// step's (one token for a decoding sequence, `chunk` for the one that
    /// prefills).
    fn allocate(&mut self, sequences: usize, context: usize, chunk: usize) -> candle_core::Result<Self::Caches>;

    /// The bytes `caches` hold.
    fn cache_bytes(&self, caches: &Self::Caches) -> u64;

    /// The worst step over `caches`: one sequence prefills the last `chunk`
    /// tokens of its context while every other decodes its last token.
    fn worst_step(&mut self, caches: &mut Self::Caches, chunk: usize) -> candle_core::Result<()>;

    /// Tokens per cache block and the bytes a block takes, when the cache is
    /// paged: the blocks a limit holds can then be counted.
    fn block(&self) -> Option<(usize, u64)> {
        None
    }

    /// The longest context the model takes (its positions).
    fn max_context(&self) -> Option<usize> {
        None
    }
}

/// The shape of the traffic a server is searched for: each sequence's
/// context (`max_model_len`) and the prefill chunk of its worst step
/// (`max_num_batched_tokens`), as vLLM's scheduler takes them. The
/// questions are a search's ([`Tuner::search`](crate::Tuner::search) of a [`Server`]):
/// [`sequences`](Search::sequences), [`context`](Search::context) and
/// [`measure`](Search::measure); the ceiling, the most sequences
/// ([`Tuner::max_batch`](crate::Tuner::max_batch)) and the observer are the tuner's.
///
/// A server of one's own: each sequence's cache a tensor of keys and values,
/// the worst step a projection of the tokens it runs
/// (`autobatch_models::Serving` is the one for the decoders built from a
/// `config.json`).
///
/// ```
/// #[global_allocator]
/// static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();
///
/// use autobatch::serve::{Scheduling, Server};
/// use autobatch::{HeapMeter, Tuner};
/// use candle_core::{DType, Device, Result, Tensor};
///
/// struct Toy;
/// impl Server for Toy {
///     type Caches = Vec<Tensor>;
///     fn allocate(&mut self, sequences: usize, context: usize, _chunk: usize) -> Result<Vec<Tensor>> {
///         (0..sequences).map(|_| Tensor::ones((2, context, 64), DType::F32, &Device::Cpu)).collect()
///     }
///     fn cache_bytes(&self, caches: &Vec<Tensor>) -> u64 {
///         caches.iter().map(|cache| cache.elem_count() as u64 * 4).sum()
///     }
///     fn worst_step(&mut self, caches: &mut Vec<Tensor>, chunk: usize) -> Result<()> {
///         let tokens = Tensor::ones((caches.len() + chunk, 64), DType::F32, &Device::Cpu)?;
///         tokens.matmul(&tokens.t()?)?.sum_all()?.to_scalar::<f32>().map(drop)
///     }
/// }
///
/// let mut meter = HeapMeter::with_room(4 << 20)?;
/// let shape = Scheduling::new(256).max_num_batched_tokens(64);
/// let plan = Tuner::new().search(&mut Toy, &mut meter).sequences(&shape)?;
/// assert!(plan.max_sequences > 1 && plan.proven);
/// // the answer fits and the next one up does not, each run alone
/// let answer = Tuner::new().search(&mut Toy, &mut meter).measure(plan.max_sequences, &shape)?;
/// let next = Tuner::new().search(&mut Toy, &mut meter).measure(plan.max_sequences + 1, &shape)?;
/// assert!(answer.fits && !next.fits);
/// # Ok::<(), autobatch::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Scheduling {
    max_model_len: usize,
    max_num_batched_tokens: usize,
    expected: Option<(usize, f64)>,
}

/// `max_num_batched_tokens` by default: vLLM's for online serving.
const DEFAULT_MAX_NUM_BATCHED_TOKENS: usize = 2048;

impl Scheduling {
    /// Sequences of `max_model_len` tokens, the prefill chunk 2048 tokens
    /// (vLLM's `max_num_batched_tokens` online; or the whole context, if shorter).
    pub fn new(max_model_len: usize) -> Scheduling {
        Scheduling { max_model_len, max_num_batched_tokens: DEFAULT_MAX_NUM_BATCHED_TOKENS, expected: None }
    }

    /// The most tokens one step prefills (vLLM's `max_num_batched_tokens`):
    /// the worst step prefills this many (at most the context) while every
    /// other sequence decodes.
    pub fn max_num_batched_tokens(mut self, tokens: usize) -> Scheduling {
        self.max_num_batched_tokens = tokens;
        self
    }

    /// Where the most sequences are expected, each sequence there adding
    /// about `bytes_per_sequence`: the search starts there (a good
    /// expectation takes two trials beside the first); the answer is the same.
    pub fn expect(mut self, sequences: usize, bytes_per_sequence: f64) -> Scheduling {
        self.expected = Some((sequences, bytes_per_sequence));
        self
    }

    /// The prefill chunk at `context` tokens.
    fn chunk(&self, context: usize) -> usize {
        self.max_num_batched_tokens.min(context)
    }

    /// The settings, `sequences` when given (at least one), and
    /// `max_model_len` within what the server's model takes.
    fn check<S: Server + ?Sized>(&self, server: &S, sequences: Option<usize>) -> Result<(), Error> {
        if self.max_model_len == 0 {
            return Err(Error::zero(crate::Setting::MaxModelLen));
        }
        if self.max_num_batched_tokens == 0 {
            return Err(Error::zero(crate::Setting::MaxNumBatchedTokens));
        }
        if sequences == Some(0) {
            return Err(Error::zero(crate::Setting::Sequences));
        }
        match server.max_context() {
            Some(most) if self.max_model_len > most => Err(Error::invalid(
                crate::Setting::MaxModelLen,
                crate::Value::Count(self.max_model_len),
                format!("it must be at most the model's positions, {most}"),
            )),
            _ => Ok(()),
        }
    }
}

/// The questions a search of a [`Server`] answers (see [`Scheduling`]).
impl<S: Server + ?Sized, M: MemoryMeter + ?Sized> Search<'_, S, M, Alone> {
    /// The largest number of sequences whose full caches at the shape's
    /// `max_model_len` and the worst step stay under the tuner's ceiling,
    /// run and proven by the next one up (searched up to the tuner's
    /// [`max_batch`](crate::Tuner::max_batch), when set).
    pub fn sequences(self, shape: &Scheduling) -> Result<ServePlan, Error> {
        let (tuner, server, meter) = self.parts();
        shape.check(server, None)?;
        let context = shape.max_model_len;
        let chunk = shape.chunk(context);
        let mut workload = Trials { server, context: Varies::Sequences(context), chunk, cache_bytes: Vec::new() };
        let plan = tuner.search_numbers(&mut workload, meter, None, shape.expected)?;
        Ok(ServePlan::of(plan, &workload, context, chunk))
    }

    /// The longest context (in tokens, up to the shape's `max_model_len`)
    /// at which `sequences` sequences' full caches and the worst step stay
    /// under the tuner's ceiling, run and proven by the next token up (or
    /// `max_model_len`).
    pub fn context(self, sequences: usize, shape: &Scheduling) -> Result<ServePlan, Error> {
        let (tuner, server, meter) = self.parts();
        shape.check(server, Some(sequences))?;
        let chunk = shape.max_num_batched_tokens;
        let mut workload = Trials { server, context: Varies::Context(sequences), chunk, cache_bytes: Vec::new() };
        let plan = tuner.search_numbers(&mut workload, meter, Some(shape.max_model_len), None)?;
        let context = plan.largest_batch;
        Ok(ServePlan::of(plan, &workload, context, chunk.min(context)))
    }

    /// One trial, no search: `sequences` full caches at the shape's
    /// `max_model_len` and the worst step, its peak read and judged against
    /// the tuner's ceiling (an out-of-memory error does not fit). What a
    /// check by brute force runs.
    pub fn measure(self, sequences: usize, shape: &Scheduling) -> Result<ServeTrial, Error> {
        let (tuner, server, meter) = self.parts();
        shape.check(server, Some(sequences))?;
        let ceiling = tuner.checked_ceiling()?;
        meter.under_ceiling(ceiling);
        let limit = ceiling.limit_bytes(meter.capacity()?);
        let chunk = shape.chunk(shape.max_model_len);
        meter.reset_peak()?;
        let started = std::time::Instant::now();
        let ran = server.allocate(sequences, shape.max_model_len, chunk).and_then(|mut caches| {
            let bytes = server.cache_bytes(&caches);
            server.worst_step(&mut caches, chunk).map(|()| bytes)
        });
        let seconds = started.elapsed().as_secs_f64();
        match ran {
            Ok(cache_bytes) => {
                let peak = meter.peak()?;
                Ok(ServeTrial {
                    number: sequences,
                    fits: peak <= limit,
                    peak_bytes: Some(peak),
                    cache_bytes: Some(cache_bytes),
                    seconds,
                })
            }
            Err(err) if crate::is_oom(&err) => Ok(ServeTrial {
                number: sequences,
                fits: false,
                peak_bytes: meter.peak().ok(),
                cache_bytes: None,
                seconds,
            }),
            Err(source) => Err(Error::Workload { batch: sequences, source }),
        }
    }
}

/// What a trial's number is.
#[derive(Clone, Copy, Debug)]
enum Varies {
    /// Sequences, each at this context.
    Sequences(usize),
    /// The context, of this many sequences.
    Context(usize),
}

/// The server as a workload: a trial allocates the caches and runs the worst step.
struct Trials<'a, S: Server + ?Sized> {
    server: &'a mut S,
    context: Varies,
    chunk: usize,
    /// The caches' bytes of each trial, by its number.
    cache_bytes: Vec<(usize, u64)>,
}

impl<S: Server + ?Sized> Workload for Trials<'_, S> {
    fn step(&mut self, number: usize) -> candle_core::Result<()> {
        let (sequences, context) = match self.context {
            Varies::Sequences(context) => (number, context),
            Varies::Context(sequences) => (sequences, number),
        };
        let chunk = self.chunk.min(context);
        let mut caches = self.server.allocate(sequences, context, chunk)?;
        let bytes = self.server.cache_bytes(&caches);
        self.cache_bytes.retain(|&(n, _)| n != number);
        self.cache_bytes.push((number, bytes));
        self.server.worst_step(&mut caches, chunk)
    }
}

/// How many sequences at what context a server holds, and where its memory goes.
#[derive(Clone, Debug, Serialize)]
pub struct ServePlan {
    /// The most sequences whose full caches and the worst step fit.
    pub max_sequences: usize,
    /// Tokens each sequence's cache holds.
    pub context: usize,
    /// Tokens the worst step prefills (while every other sequence decodes).
    pub chunk: usize,
    /// The peak of the worst step at the answer.
    pub peak_bytes: u64,
    /// What the peak may reach: the ceiling's share of the capacity.
    pub limit_bytes: u64,
    /// What 100% means.
    pub capacity_bytes: u64,
    /// What the device held before the trials (the weights, the process).
    pub held_bytes: u64,
    /// The caches at the answer.
    pub cache_bytes: u64,
    /// The caches' bytes per token they can hold, measured: over every
    /// token of their blocks when the cache is paged (the arithmetic's `2 ×
    /// layers × kv_heads × head_dim × bytes`), else over the tokens held.
    pub cache_bytes_per_token: f64,
    /// The caches' bytes per sequence, measured (a paged cache's last block
    /// of each sequence counted whole).
    pub cache_bytes_per_sequence: u64,
    /// The worst step's own bytes at the answer: the peak past what was
    /// held and the caches.
    pub step_bytes: u64,
    /// Cache blocks the limit holds beside what was held and the worst
    /// step's own bytes at the answer (vLLM's "# GPU blocks", measured),
    /// when the cache is paged.
    pub kv_blocks: Option<u64>,
    /// Tokens per block, when the cache is paged.
    pub block_tokens: Option<usize>,
    /// The batch above the answer was run and did not fit.
    pub proven: bool,
    /// Every trial: its number (sequences or context), outcome, peak.
    pub trials: Vec<ServeTrial>,
    /// The device, as its meter names it.
    pub device: String,
}

/// One measured trial.
#[derive(Clone, Debug, Serialize)]
pub struct ServeTrial {
    /// Sequences, or the context when the context was searched.
    pub number: usize,
    /// Whether it fit.
    pub fits: bool,
    /// Its peak, when read.
    pub peak_bytes: Option<u64>,
    /// Its caches' bytes.
    pub cache_bytes: Option<u64>,
    /// How long it took.
    pub seconds: f64,
}

impl ServePlan {
    fn of<S: Server + ?Sized>(plan: Plan, trials: &Trials<'_, S>, context: usize, chunk: usize) -> ServePlan {
        let cache_of = |number: usize| trials.cache_bytes.iter().find(|&&(n, _)| n == number).map(|&(_, bytes)| bytes);
        let answer = plan.largest_batch;
        let held_bytes = plan.trials.iter().map(|t| t.baseline_bytes).min().unwrap_or(0);
        let cache_bytes = cache_of(answer).unwrap_or(0);
        let sequences = match trials.context {
            Varies::Sequences(_) => answer,
            Varies::Context(sequences) => sequences,
        };
        let step_bytes = plan.peak_bytes.saturating_sub(held_bytes).saturating_sub(cache_bytes);
        let block = trials.server.block();
        // the tokens the caches can hold: every slot of every block when paged
        let tokens = match block {
            Some((block_tokens, _)) => sequences * context.div_ceil(block_tokens) * block_tokens,
            None => sequences * context,
        };
        let kv_blocks = block
            .filter(|&(_, bytes)| bytes > 0)
            .map(|(_, bytes)| plan.limit_bytes().saturating_sub(held_bytes).saturating_sub(step_bytes) / bytes);
        ServePlan {
            max_sequences: sequences,
            context,
            chunk,
            peak_bytes: plan.peak_bytes,
            limit_bytes: plan.limit_bytes(),
            capacity_bytes: plan.capacity_bytes(),
            held_bytes,
            cache_bytes,
            cache_bytes_per_token: cache_bytes as f64 / tokens.max(1) as f64,
            cache_bytes_per_sequence: cache_bytes / sequences.max(1) as u64,
            step_bytes,
            kv_blocks,
            block_tokens: block.map(|(tokens, _)| tokens),
            proven: plan.proven_largest(),
            trials: plan
                .trials
                .iter()
                .map(|t| ServeTrial {
                    number: t.batch,
                    fits: t.outcome.fits(),
                    peak_bytes: t.peak_bytes,
                    cache_bytes: cache_of(t.batch),
                    seconds: t.duration.as_secs_f64(),
                })
                .collect(),
            device: plan.device,
        }
    }

    /// The plan as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("plain values serialize")
    }
}
