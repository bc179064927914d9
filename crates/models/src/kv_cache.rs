//! A paged KV cache: every layer's keys and values in blocks of a fixed
//! number of tokens, allocated once for the whole pool, and a block table per
//! sequence, as vLLM's `PagedAttention` keeps them. A sequence holds the
//! blocks its tokens fill; its last block may be partly empty.

use candle_core::{DType, Device, Tensor};

use super::config::Config;
use crate::Error;

/// Tokens per block by default (vLLM's).
pub const DEFAULT_BLOCK_SIZE: usize = 16;

/// A sequence in a [`KvCache`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SequenceId(usize);

/// A sequence's tokens in one step, at positions `start ..`: a prompt's
/// chunk (prefill) or one token (decode).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// The sequence the tokens extend.
    pub sequence: SequenceId,
    /// The position of the first token: the tokens the sequence held before.
    pub start: usize,
    /// The token ids.
    pub tokens: Vec<u32>,
}

impl Chunk {
    /// The positions of its tokens.
    pub fn positions(&self) -> std::ops::Range<usize> {
        self.start..self.start + self.tokens.len()
    }
}

/// One layer's pool: keys and values `(blocks × block_size, kv_heads,
/// head_dim)`; in 8 bits, each token's head with its scale `(…, 1)` in f32.
struct LayerPool {
    keys: Tensor,
    values: Tensor,
    scales: Option<(Tensor, Tensor)>,
}

/// A sequence's block table in one group: the physical blocks of its
/// logical blocks `first ..` (those before `first`, wholly outside every
/// query's window from now on, given back).
#[derive(Clone, Debug, Default)]
struct Table {
    first: usize,
    blocks: Vec<usize>,
}

/// The layers that keep every key, or those that keep the last `window`
/// positions (a sliding layer's cache holds its window, not the context):
/// their blocks, the free ones, and each sequence's table.
struct Group {
    window: Option<usize>,
    blocks: usize,
    free: Vec<usize>,
    tables: Vec<Option<Table>>,
}

impl Group {
    fn new(window: Option<usize>, blocks: usize) -> Group {
        // handed out from the lowest: a sequence's blocks in order
        Group { window, blocks, free: (0..blocks).rev().collect(), tables: Vec::new() }
    }
}

/// The keys and values of every sequence in flight, in blocks.
///
/// ```
/// use autobatch_models::{Config, KvCache};
/// use candle_core::{DType, Device};
///
/// let config = Config::from_json(r#"{"model_type": "llama", "vocab_size": 32, "hidden_size": 16,
///     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
///     "intermediate_size": 32, "max_position_embeddings": 64}"#)?;
/// let mut cache = KvCache::new(&config, 8, 16, DType::F32, &Device::Cpu)?;
/// // 2 layers × keys and values × 16 tokens × 2 kv heads × 4 dims × 4 bytes
/// assert_eq!(cache.bytes_per_block(), 2 * 2 * 16 * 2 * 4 * 4);
/// let sequence = cache.add_sequence();
/// cache.fill(sequence, 20)?; // two blocks: 16 tokens and 4
/// assert_eq!((cache.len(sequence), cache.free_blocks()), (20, 6));
/// cache.remove_sequence(sequence);
/// assert_eq!(cache.free_blocks(), 8);
/// # Ok::<(), autobatch::Error>(())
/// ```
pub struct KvCache {
    block_size: usize,
    dtype: DType,
    kv_heads: usize,
    head_dim: usize,
    layers: Vec<LayerPool>,
    /// Each layer's group.
    layer_group: Vec<usize>,
    /// The layers that keep every key first, then those within a window.
    groups: Vec<Group>,
    /// Tokens each sequence slot holds (`None`: removed).
    lens: Vec<Option<usize>>,
}

impl KvCache {
    /// A pool of `blocks` blocks of `block_size` tokens for every layer of
    /// `config` (a decoder: llama, mistral, qwen2, qwen3, olmo2 or gpt2), in `dtype`
    /// (f32, bf16 or f16; `U8`: 8 bits, see [`INT8`](Self::INT8)), allocated now.
    /// The sliding layers (Mistral's, Gemma's) get as many blocks: see
    /// [`with_window_blocks`](Self::with_window_blocks) for fewer.
    pub fn new(
        config: &Config,
        blocks: usize,
        block_size: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<KvCache, Error> {
        KvCache::with_window_blocks(config, blocks, blocks, block_size, dtype, device)
    }

    /// [`new`](Self::new) with `window_blocks` blocks for the layers that
    /// attend within a sliding window: each sequence holds there only the
    /// blocks its queries can still see ([`window_blocks_for`](Self::window_blocks_for)).
    pub fn with_window_blocks(
        config: &Config,
        blocks: usize,
        window_blocks: usize,
        block_size: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<KvCache, Error> {
        KvCache::check(config, block_size, dtype)?;
        let windows: Vec<Option<usize>> = (0..config.layers).map(|layer| config.window_of(layer)).collect();
        let mut groups = Vec::new();
        if windows.iter().any(Option::is_none) {
            groups.push(Group::new(None, blocks));
        }
        if let Some(window) = windows.iter().flatten().next() {
            groups.push(Group::new(Some(*window), window_blocks));
        }
        let layer_group: Vec<usize> =
            windows.iter().map(|window| usize::from(window.is_some() && groups.len() == 2)).collect();
        let mut layers = Vec::with_capacity(config.layers);
        for &group in &layer_group {
            let group_blocks = groups[group].blocks;
            let rows = group_blocks.checked_mul(block_size).ok_or_else(|| too_many(group_blocks, block_size))?;
            let shape = (rows, config.kv_heads, config.head_dim);
            let scales = (dtype == KvCache::INT8)
                .then(|| -> candle_core::Result<(Tensor, Tensor)> {
                    let shape = (rows, config.kv_heads, 1);
                    Ok((Tensor::zeros(shape, DType::F32, device)?, Tensor::zeros(shape, DType::F32, device)?))
                })
                .transpose()?;
            layers.push(LayerPool {
                keys: Tensor::zeros(shape, dtype, device)?,
                values: Tensor::zeros(shape, dtype, device)?,
                scales,
            });
        }
        Ok(KvCache {
            block_size,
            dtype,
            kv_heads: config.kv_heads,
            head_dim: config.head_dim,
            layers,
            layer_group,
            groups,
            lens: Vec::new(),
        })
    }

    /// The blocks a layer within a `window` of `config` holds for a sequence
    /// of `held` tokens taking `new` more in one step, blocks of `block_size`:
    /// those from the first its new queries can see to its last (every one
    /// where no layer slides).
    pub fn window_blocks_for(config: &Config, block_size: usize, held: usize, new: usize) -> usize {
        let last = (held + new).div_ceil(block_size.max(1));
        match config.sliding_window {
            Some(window) if !config.sliding_layers.is_empty() => {
                last - (held + 1).saturating_sub(window) / block_size.max(1)
            }
            _ => last,
        }
    }

    /// The 8-bit cache's dtype: each key and value of a token's head stored
    /// in a byte, `round(x / scale) + 128` with `scale = max |x| / 127` over
    /// the head (kept in f32 beside it): symmetric, per token and head, as
    /// LMDeploy's 8-bit KV cache scales (vLLM's 8-bit cache is fp8 with a
    /// scale per tensor). Attention reads the values back within half a scale.
    pub const INT8: DType = DType::U8;

    /// The bytes one block of `block_size` tokens takes in `dtype` over
    /// every layer of `config`: `2 × layers × block_size × kv_heads ×
    /// (head_dim × bytes per element)` (keys and values; in 8 bits, each
    /// head's f32 scale too).
    pub fn block_bytes(config: &Config, block_size: usize, dtype: DType) -> u64 {
        pool_bytes(config.layers, block_size, config.kv_heads, config.head_dim, dtype)
    }

    /// The bytes one block of `block_size` tokens takes over `config`'s
    /// layers that slide (`sliding`) or keep every key.
    pub fn group_block_bytes(config: &Config, block_size: usize, dtype: DType, sliding: bool) -> u64 {
        let layers = (0..config.layers).filter(|&layer| config.window_of(layer).is_some() == sliding).count();
        pool_bytes(layers, block_size, config.kv_heads, config.head_dim, dtype)
    }

    /// The bytes one of its blocks takes over every layer.
    pub fn bytes_per_block(&self) -> u64 {
        pool_bytes(self.layers.len(), self.block_size, self.kv_heads, self.head_dim, self.dtype)
    }

    /// The bytes its pools hold: each layer's blocks.
    pub fn bytes(&self) -> u64 {
        let per_layer_block = pool_bytes(1, self.block_size, self.kv_heads, self.head_dim, self.dtype);
        self.layer_group
            .iter()
            .map(|&group| per_layer_block.saturating_mul(self.groups[group].blocks as u64))
            .fold(0u64, u64::saturating_add)
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The dtype keys and values are kept in.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device its blocks are on.
    pub fn device(&self) -> Device {
        self.layers.first().map_or(Device::Cpu, |layer| layer.keys.device().clone())
    }

    /// Blocks in the pool of the layers that keep every key (where every
    /// layer slides, of theirs).
    pub fn blocks(&self) -> usize {
        self.groups.first().map_or(0, |group| group.blocks)
    }

    /// Blocks of that pool no sequence holds.
    pub fn free_blocks(&self) -> usize {
        self.groups.first().map_or(0, |group| group.free.len())
    }

    /// Blocks a sequence of `tokens` tokens holds where every key is kept.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// A new, empty sequence.
    pub fn add_sequence(&mut self) -> SequenceId {
        let slot = self.lens.iter().position(Option::is_none).unwrap_or(self.lens.len());
        if slot == self.lens.len() {
            self.lens.push(None);
        }
        self.lens[slot] = Some(0);
        for group in &mut self.groups {
            if group.tables.len() <= slot {
                group.tables.resize(slot + 1, None);
            }
            group.tables[slot] = Some(Table::default());
        }
        SequenceId(slot)
    }

    /// Ends `sequence`: its blocks go back to the pool.
    pub fn remove_sequence(&mut self, sequence: SequenceId) {
        if self.lens.get_mut(sequence.0).and_then(Option::take).is_none() {
            return;
        }
        for group in &mut self.groups {
            if let Some(table) = group.tables.get_mut(sequence.0).and_then(Option::take) {
                group.free.extend(table.blocks.into_iter().rev());
            }
        }
    }

    /// Tokens `sequence` holds (0 for one removed).
    pub fn len(&self, sequence: SequenceId) -> usize {
        self.lens.get(sequence.0).copied().flatten().unwrap_or(0)
    }

    /// Whether no sequence holds a token.
    pub fn is_empty(&self) -> bool {
        self.lens.iter().flatten().all(|&len| len == 0)
    }

    /// Sequences in flight.
    pub fn sequences(&self) -> Vec<SequenceId> {
        (0..self.lens.len()).filter(|&i| self.lens[i].is_some()).map(SequenceId).collect()
    }

    /// Takes `tokens` more positions for `sequence` without computing them
    /// (their keys and values stay what the blocks held): a cache as full as
    /// a long prompt leaves it, for measuring. Refused when the pool has too
    /// few free blocks.
    pub fn fill(&mut self, sequence: SequenceId, tokens: usize) -> Result<(), Error> {
        let len = self.len(sequence) + tokens;
        // no query runs over the filled positions: a window keeps what the next one sees
        self.grow(sequence, len, len)
    }

    fn table(&self, group: usize, sequence: SequenceId) -> Option<&Table> {
        self.groups.get(group).and_then(|group| group.tables.get(sequence.0)).and_then(Option::as_ref)
    }

    /// Grows `sequence` to `len` tokens, taking the blocks that needs (a
    /// window's blocks no new query sees given back first).
    pub(crate) fn reserve(&mut self, sequence: SequenceId, len: usize) -> Result<(), Error> {
        let held = self.len(sequence);
        self.grow(sequence, len, held)
    }

    /// [`reserve`](Self::reserve), the first query that runs at `queried_from`.
    fn grow(&mut self, sequence: SequenceId, len: usize, queried_from: usize) -> Result<(), Error> {
        if self.lens.get(sequence.0).copied().flatten().is_none() {
            return Err(unknown(sequence));
        }
        let block_size = self.block_size;
        let last = len.div_ceil(block_size);
        // what each group gives back and takes, checked for all before any changes
        let mut plans = Vec::with_capacity(self.groups.len());
        for group in &self.groups {
            let table = group.tables[sequence.0].as_ref().ok_or_else(|| unknown(sequence))?;
            let first = match group.window {
                Some(window) => ((queried_from + 1).saturating_sub(window) / block_size).max(table.first),
                None => 0,
            };
            let given_back = (first - table.first).min(table.blocks.len());
            let kept = table.blocks.len() - given_back;
            let more = last.saturating_sub(first).saturating_sub(kept);
            if more > group.free.len() + given_back {
                return Err(Error::invalid(
                    crate::Setting::KvCacheBlocks,
                    autobatch::Value::Count(last - first),
                    format!(
                        "a sequence of {len} tokens needs {more} more blocks of {block_size} tokens; the pool has {} \
                         free of {}",
                        group.free.len(),
                        group.blocks
                    ),
                ));
            }
            plans.push((first, given_back, more));
        }
        for (group, (first, given_back, more)) in self.groups.iter_mut().zip(plans) {
            let table = group.tables[sequence.0].as_mut().ok_or_else(|| unknown(sequence))?;
            group.free.extend(table.blocks.drain(..given_back).rev());
            table.first = first;
            let taken: Vec<usize> = (0..more).filter_map(|_| group.free.pop()).collect();
            table.blocks.extend(taken);
        }
        let held = self.lens[sequence.0].get_or_insert(0);
        *held = (*held).max(len);
        Ok(())
    }

    /// Writes the keys and values `(kv_heads, n, head_dim)` of positions
    /// `start .. start + n` of `sequence` into `layer`'s blocks (reserved
    /// before), converted to the cache's dtype.
    pub(crate) fn write(
        &self,
        layer: usize,
        sequence: SequenceId,
        start: usize,
        keys: &Tensor,
        values: &Tensor,
    ) -> candle_core::Result<()> {
        let table = self
            .table(self.layer_group[layer], sequence)
            .ok_or_else(|| candle_core::Error::Msg(format!("no sequence {sequence:?}")))?;
        let pool = &self.layers[layer];
        // (n, kv_heads, head_dim), as the pool lays tokens out
        let as_rows = |t: &Tensor| t.transpose(0, 1)?.contiguous();
        let (keys, values) = (as_rows(keys)?, as_rows(values)?);
        let ((keys, key_scales), (values, value_scales)) = match pool.scales {
            Some(_) => (quantize(&keys)?, quantize(&values)?),
            None => ((keys.to_dtype(self.dtype)?, None), (values.to_dtype(self.dtype)?, None)),
        };
        let n = keys.dim(0)?;
        let set = |pool: &Tensor, rows: &Tensor, done: usize, run: usize, row: usize| {
            pool.slice_set(&rows.narrow(0, done, run)?.contiguous()?, 0, row)
        };
        let mut done = 0;
        while done < n {
            let position = start + done;
            let (block, within) = (position / self.block_size, position % self.block_size);
            let run = (self.block_size - within).min(n - done);
            let physical =
                block.checked_sub(table.first).and_then(|index| table.blocks.get(index)).ok_or_else(|| {
                    candle_core::Error::Msg(format!("position {position} of {sequence:?} is not reserved"))
                })?;
            let row = physical * self.block_size + within;
            set(&pool.keys, &keys, done, run, row)?;
            set(&pool.values, &values, done, run, row)?;
            if let (Some((key_pool, value_pool)), Some(key_scales), Some(value_scales)) =
                (&pool.scales, &key_scales, &value_scales)
            {
                set(key_pool, key_scales, done, run, row)?;
                set(value_pool, value_scales, done, run, row)?;
            }
            done += run;
        }
        Ok(())
    }

    /// `layer`'s keys and values of the first `len` positions of `sequence`
    /// (of a sliding layer, from the first block it still holds: the queries
    /// of the step are the last positions either way, and see within their
    /// window), `(1, kv_heads, n, head_dim)` each, in `dtype`: a copy
    /// gathered from its blocks.
    pub(crate) fn gather(
        &self,
        layer: usize,
        sequence: SequenceId,
        len: usize,
        dtype: DType,
    ) -> candle_core::Result<(Tensor, Tensor)> {
        let group = self.layer_group[layer];
        let table =
            self.table(group, sequence).ok_or_else(|| candle_core::Error::Msg(format!("no sequence {sequence:?}")))?;
        let pool = &self.layers[layer];
        // a window's layer: its blocks from the first it still holds
        let from = table.first * self.block_size;
        let count = len.div_ceil(self.block_size) - table.first;
        let ids: Vec<u32> = table.blocks[..count].iter().map(|&b| b as u32).collect();
        let ids = Tensor::from_vec(ids, count, pool.keys.device())?;
        let pool_blocks = self.groups[group].blocks;
        // (len − from, kv_heads, width) of a pool whose rows are `width` wide
        let rows = |pool: &Tensor, width: usize| -> candle_core::Result<Tensor> {
            let blocks = pool.reshape((pool_blocks, self.block_size, self.kv_heads, width))?;
            blocks.index_select(&ids, 0)?.reshape((count * self.block_size, self.kv_heads, width))?.narrow(
                0,
                0,
                len - from,
            )
        };
        let read = |pool: &Tensor, scales: Option<&Tensor>| -> candle_core::Result<Tensor> {
            let values = rows(pool, self.head_dim)?;
            let values = match scales {
                Some(scales) => (values.to_dtype(DType::F32)? - 128.0)?.broadcast_mul(&rows(scales, 1)?)?,
                None => values,
            };
            values.transpose(0, 1)?.to_dtype(dtype)?.contiguous()?.unsqueeze(0)
        };
        let (key_scales, value_scales) = match &pool.scales {
            Some((keys, values)) => (Some(keys), Some(values)),
            None => (None, None),
        };
        Ok((read(&pool.keys, key_scales)?, read(&pool.values, value_scales)?))
    }
}

impl KvCache {
    /// A cache of `dtype` in blocks of `block_size` for `config`, refused where it cannot be.
    pub(crate) fn check(config: &Config, block_size: usize, dtype: DType) -> Result<(), Error> {
        config.family.check_generates("a KV cache serves")?;
        if block_size == 0 {
            return Err(Error::zero(crate::Setting::BlockSize));
        }
        if !matches!(dtype, DType::F32 | DType::BF16 | DType::F16 | KvCache::INT8) {
            return Err(Error::invalid(
                crate::Setting::KvCacheDtype,
                autobatch::Value::Text(format!("{dtype:?}").to_lowercase()),
                "f32, bf16, f16, or KvCache::INT8 (8 bits and a scale per token and head)",
            ));
        }
        Ok(())
    }
}

/// Keys and values of `tokens` over `layers`, saturating: a config's sizes
/// are the user's, and a product past 64 bits is refused as too large where
/// it is compared with a limit, never wrapped into a small one.
fn pool_bytes(layers: usize, tokens: usize, kv_heads: usize, head_dim: usize, dtype: DType) -> u64 {
    [layers as u64, tokens as u64, kv_heads as u64, head_bytes(head_dim, dtype)]
        .into_iter()
        .fold(2u64, u64::saturating_mul)
}

/// The bytes of one token's head in `dtype`: its values, and in 8 bits its scale.
fn head_bytes(head_dim: usize, dtype: DType) -> u64 {
    let scale = if dtype == KvCache::INT8 { DType::F32.size_in_bytes() as u64 } else { 0 };
    (head_dim as u64).saturating_mul(dtype.size_in_bytes() as u64).saturating_add(scale)
}

/// `rows` `(n, kv_heads, head_dim)` in 8 bits: `round(x / scale) + 128`,
/// `scale = max |x| / 127` over each token's head, and the scales `(n,
/// kv_heads, 1)` in f32.
fn quantize(rows: &Tensor) -> candle_core::Result<(Tensor, Option<Tensor>)> {
    let rows = rows.to_dtype(DType::F32)?;
    // a head of zeros keeps a scale that divides
    let scales = (rows.abs()?.max_keepdim(2)?.maximum(f32::MIN_POSITIVE)? / 127.0)?;
    let bytes = (rows.broadcast_div(&scales)?.round()? + 128.0)?.clamp(0f32, 255f32)?.to_dtype(DType::U8)?;
    Ok((bytes, Some(scales)))
}

fn too_many(blocks: usize, block_size: usize) -> Error {
    Error::invalid(
        crate::Setting::KvCacheBlocks,
        autobatch::Value::Count(blocks),
        format!("blocks × {block_size} tokens must fit in a usize"),
    )
}

fn unknown(sequence: SequenceId) -> Error {
    Error::invalid(
        crate::Setting::Sequence,
        autobatch::Value::Count(sequence.0),
        "a sequence the cache holds (add_sequence)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gemma 2's pattern at a window of 8: layer 0 slides, layer 1 keeps
    /// every key.
    fn sliding_config() -> Config {
        Config::from_json(
            r#"{"model_type": "gemma2", "vocab_size": 32, "hidden_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "intermediate_size": 32,
            "max_position_embeddings": 64, "sliding_window": 8}"#,
        )
        .unwrap()
    }

    /// A sliding layer's cache holds the blocks its next queries see, not
    /// the context: given back as the sequence grows, taken again from the
    /// pool, and its pool sized to the windows alone is enough.
    #[test]
    fn a_sliding_layer_holds_its_window_not_the_context() {
        let config = sliding_config();
        let (held, new) = (30, 1);
        let window = KvCache::window_blocks_for(&config, 4, held, new);
        // positions 23 .. 31 are seen by the query at 30: blocks 5, 6, 7
        assert_eq!(window, 3);
        let mut cache = KvCache::with_window_blocks(&config, 9, window, 4, DType::F32, &Device::Cpu).unwrap();
        let sequence = cache.add_sequence();
        cache.fill(sequence, held).unwrap();
        cache.reserve(sequence, held + new).unwrap();
        assert_eq!((cache.len(sequence), cache.free_blocks()), (31, 1));
        // the pools: 9 blocks in the full layer, 3 in the sliding one
        let per_layer_block = 2 * 4 * 8 * 4;
        assert_eq!(cache.bytes(), (9 + 3) * per_layer_block);
        // written and gathered: the sliding layer's keys from block 5 on
        let keys = Tensor::ones((1, 1, 8), DType::F32, &Device::Cpu).unwrap();
        cache.write(0, sequence, 30, &keys, &keys).unwrap();
        let (gathered, _) = cache.gather(0, sequence, 31, DType::F32).unwrap();
        assert_eq!(gathered.dims(), [1, 1, 31 - 20, 8]);
        let (whole, _) = cache.gather(1, sequence, 31, DType::F32).unwrap();
        assert_eq!(whole.dims(), [1, 1, 31, 8]);
        // a position the window gave back is refused, not written elsewhere
        assert!(cache.write(0, sequence, 3, &keys, &keys).is_err());
        // growing by a block gives one back and takes one
        cache.reserve(sequence, 33).unwrap();
        let (gathered, _) = cache.gather(0, sequence, 33, DType::F32).unwrap();
        assert_eq!(gathered.dims()[2], 33 - 24);
        cache.remove_sequence(sequence);
        assert_eq!(cache.free_blocks(), 9);
    }
}
