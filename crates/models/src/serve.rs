//! [`Server`] for this crate's decoders: [`Serving`] over
//! [`Inference`](crate::Inference) and a [`KvCache`].

use crate::Error;
use crate::{Chunk, KvCache, Serving};

use autobatch::serve::Server;

impl Server for Serving {
    type Caches = KvCache;

    fn allocate(&mut self, sequences: usize, context: usize, chunk: usize) -> candle_core::Result<KvCache> {
        let config = self.model().config();
        let block_size = self.tokens_per_block();
        let blocks = sequences.saturating_mul(context.div_ceil(block_size));
        // a sliding layer's blocks: each sequence's window at its step (the prefilling one's wider)
        let window = |last_step: usize| KvCache::window_blocks_for(config, block_size, context - last_step, last_step);
        let window_blocks = window(chunk).saturating_add(sequences.saturating_sub(1).saturating_mul(window(1)));
        let mut cache = KvCache::with_window_blocks(
            config,
            blocks,
            window_blocks,
            block_size,
            self.kv_cache_dtype(),
            self.device(),
        )
        .map_err(candle)?;
        for index in 0..sequences {
            let sequence = cache.add_sequence();
            let last_step = if index == 0 { chunk } else { 1 };
            cache.fill(sequence, context - last_step).map_err(candle)?;
        }
        Ok(cache)
    }

    fn cache_bytes(&self, cache: &KvCache) -> u64 {
        cache.bytes()
    }

    fn worst_step(&mut self, cache: &mut KvCache, chunk: usize) -> candle_core::Result<()> {
        let vocab = self.model().config().vocab as u32;
        let token = |i: usize| (i as u32).wrapping_mul(7).wrapping_add(3) % vocab;
        let chunks: Vec<Chunk> = cache
            .sequences()
            .into_iter()
            .enumerate()
            .map(|(index, sequence)| {
                let start = cache.len(sequence);
                let count = if index == 0 { chunk } else { 1 };
                Chunk { sequence, start, tokens: (start..start + count).map(token).collect() }
            })
            .collect();
        self.model().step(cache, &chunks).map_err(candle)?;
        Ok(())
    }

    fn block(&self) -> Option<(usize, u64)> {
        Some((self.tokens_per_block(), self.block_bytes()))
    }

    fn max_context(&self) -> Option<usize> {
        let config = self.model().config();
        Some(config.max_positions)
    }
}

/// A crate error as candle's, candle's own kept whole (an out-of-memory
/// error stays one).
fn candle(err: Error) -> candle_core::Error {
    match err {
        Error::Core(autobatch::Error::Candle(source)) => source,
        other => candle_core::Error::Msg(other.to_string()),
    }
}
