//! A linear head and its cross entropy fused, in chunks of rows (Liger
//! Kernel's FusedLinearCrossEntropy, torchtune's chunked output): the logits
//! of a chunk, its loss, and its gradients for the hidden states, the head's
//! weight and bias, computed in the forward pass; `(rows × vocab)` never
//! exists at once, and nothing of the logits is kept for the backward pass,
//! which hands out the gradients already computed.

use std::sync::Mutex;

use candle_core::{D, DType, Result, Tensor};

use super::node::{Backward, node};

/// The fewest rows a chunk takes unless a [`ChunkedCrossEntropy`] says
/// otherwise (the last chunk may have fewer).
pub const MIN_CHUNK_ROWS: usize = 256;

/// Elements of a chunk's logits where the head's weight gets no gradient (a
/// frozen head: LoRA's, QLoRA's): its rows are this over the vocabulary
/// (16 MiB a tensor in f32), at most [`FROZEN_HEAD_CHUNK_ROWS`], whatever
/// the batch. A chunk then costs a matmul of its rows and nothing more, so
/// small ones are cheap, and the loss's bytes stop growing with the batch
/// within one short sample (32 rows at a vocabulary of 49,152, 27 at
/// 151,936) rather than at 256 rows (issue 89: 1.2 MB a token at 64 tokens,
/// where the rest of the step keeps 33 kB); not fewer, or a large batch runs
/// thousands of chunks of a few ops each.
pub const FROZEN_HEAD_CHUNK_ELEMENTS: usize = 1 << 22;

/// The most rows of a frozen head's chunk ([`FROZEN_HEAD_CHUNK_ELEMENTS`]).
pub const FROZEN_HEAD_CHUNK_ROWS: usize = 32;

/// The rows of a chunk of `n` rows of width `width` over `vocab` classes
/// when none is given: Liger Kernel's `⌈n / ⌈vocab / width⌉⌉`, at least
/// [`MIN_CHUNK_ROWS`], where the head's weight gets a gradient (each chunk
/// adds its share to the whole of it); [`FROZEN_HEAD_CHUNK_ELEMENTS`] over
/// the vocabulary, at most [`FROZEN_HEAD_CHUNK_ROWS`], where it does not.
/// At least 1.
pub fn default_chunk_rows(n: usize, vocab: usize, width: usize, weight_gradient: bool) -> usize {
    let rows = match weight_gradient {
        true => n.div_ceil(vocab.div_ceil(width.max(1)).max(1)).max(MIN_CHUNK_ROWS),
        false => (FROZEN_HEAD_CHUNK_ELEMENTS / vocab.max(1)).min(FROZEN_HEAD_CHUNK_ROWS),
    };
    rows.max(1)
}

/// The label `I64` targets ignore, as PyTorch's `ignore_index` and
/// transformers' labels do.
pub const IGNORE_INDEX: i64 = -100;

/// Cross entropy of a linear head over hidden states, in chunks of rows:
/// the mean over the targets not ignored of `−log softmax(h · Wᵀ + b)[t]`,
/// in f32 whatever the weights' dtype, as the eager
/// `cross_entropy(linear(h).to_dtype(f32), t)` computes it.
///
/// ```
/// use autobatch_models::ops::ChunkedCrossEntropy;
/// use candle_core::{Device, Tensor, Var};
///
/// let hidden = Var::randn(0f32, 1.0, (10, 8), &Device::Cpu)?;
/// let weight = Var::randn(0f32, 1.0, (50, 8), &Device::Cpu)?;
/// let targets = Tensor::new(&[1i64, 7, -100, 3, 49, 0, 12, 5, 5, 9], &Device::Cpu)?; // -100: ignored
/// let fused = ChunkedCrossEntropy::rows(3).forward(hidden.as_tensor(), weight.as_tensor(), None, &targets)?;
/// let grads = fused.backward()?;
/// assert!(grads.get(&hidden).is_some() && grads.get(&weight).is_some());
/// # Ok::<(), candle_core::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ChunkedCrossEntropy {
    /// Rows per chunk; `None`: [`default_chunk_rows`]. Where the head's
    /// weight trains, Liger Kernel's rule, `⌈n / ⌈vocab / h⌉⌉` of `n` rows
    /// of width `h` (a chunk's logits hold about as many values as the
    /// hidden states), and at least [`MIN_CHUNK_ROWS`]: each chunk adds its
    /// share to the head weight's whole gradient, work of the weight's size
    /// that a chunk of a few rows would not pay for. Where it is frozen, a
    /// fixed [`FROZEN_HEAD_CHUNK_ELEMENTS`] over the vocabulary.
    pub rows: Option<usize>,
    /// The logits soft-capped before the softmax, `cap · tanh(z / cap)`
    /// (Gemma 2's `final_logit_softcapping`); the gradient through the cap.
    pub softcap: Option<f64>,
}

impl ChunkedCrossEntropy {
    /// Chunks of `rows` rows.
    pub fn rows(rows: usize) -> ChunkedCrossEntropy {
        ChunkedCrossEntropy { rows: Some(rows), softcap: None }
    }

    /// With the logits soft-capped at `cap` (none where `None`).
    pub fn softcap(mut self, cap: Option<f64>) -> ChunkedCrossEntropy {
        self.softcap = cap;
        self
    }

    /// The mean cross entropy of `hidden` `(n, h)` through the head
    /// `weight` `(vocab, h)` (and `bias` `(vocab)`) against `targets` `(n)`:
    /// `U32` class ids, or `I64` with [`IGNORE_INDEX`] where a row does not
    /// count. A scalar in f32; its backward pass gives each of `hidden`,
    /// `weight` and `bias` that takes part in the graph its gradient.
    pub fn forward(&self, hidden: &Tensor, weight: &Tensor, bias: Option<&Tensor>, targets: &Tensor) -> Result<Tensor> {
        Ok(self.run(hidden, weight, bias, targets, false)?.0)
    }

    /// [`forward`](Self::forward), with the head weight's gradient (for a
    /// loss gradient of 1, in the weight's dtype) handed to the caller
    /// instead of to candle's backward pass: candle adds the first gradient a
    /// variable gets to a zero tensor of its own, so a vocabulary-sized one
    /// handed over is three at once; the caller who runs the backward pass
    /// puts this one in the gradient store itself, or adds the embedding's
    /// rows into it in place ([`add_rows_in_place`]).
    pub(crate) fn forward_taking_weight_gradient(
        &self,
        hidden: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        targets: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        match self.run(hidden, weight, bias, targets, true)? {
            (loss, Some(gradient)) => Ok((loss, gradient)),
            (_, None) => candle_core::bail!("chunked cross entropy: no gradient of the head's weight"),
        }
    }

    /// The loss node, and the weight's gradient where `take_weight` asks for it.
    fn run(
        &self,
        hidden: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        targets: &Tensor,
        take_weight: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let (n, width) = hidden.dims2()?;
        let (vocab, weight_width) = weight.dims2()?;
        if weight_width != width {
            candle_core::bail!("chunked cross entropy: hidden states of {width} for a head of {weight_width}")
        }
        let targets = targets_of(targets, n, vocab)?;
        let counted = targets.iter().filter(|t| t.is_some()).count();
        if counted == 0 {
            candle_core::bail!("chunked cross entropy: every one of the {n} targets is ignored")
        }
        let wants = Wanted {
            hidden: hidden.track_op(),
            weight: take_weight || weight.track_op(),
            bias: bias.is_some_and(Tensor::track_op),
        };
        let rows = self.rows.unwrap_or_else(|| default_chunk_rows(n, vocab, width, wants.weight)).max(1);
        let (h, w, b) = (hidden.detach(), weight.detach(), bias.map(Tensor::detach));
        let device = hidden.device();
        let mut loss = Tensor::zeros((), DType::F32, device)?;
        let mut grad_hidden = Vec::new();
        let grad_weight = if wants.weight { Some(Tensor::zeros((vocab, width), DType::F32, device)?) } else { None };
        let mut grad_bias = if wants.bias { Some(Tensor::zeros(vocab, DType::F32, device)?) } else { None };
        for start in (0..n).step_by(rows) {
            let len = rows.min(n - start);
            let chunk = &targets[start..start + len];
            let h_c = h.narrow(0, start, len)?;
            // each vocabulary-wide tensor let go as soon as the next is made:
            // two of them at once (three soft-capped), not five
            let product = h_c.matmul(&w.t()?)?;
            let product = match &b {
                Some(b) => product.broadcast_add(b)?,
                None => product,
            };
            let logits = product.to_dtype(DType::F32)?;
            drop(product);
            // soft-capped: the capped logits, and the cap's derivative for the gradient
            let (logits, derivative) = match self.softcap {
                Some(cap) => {
                    let tanh = (logits / cap)?.tanh()?;
                    let derivative = tanh.sqr()?.affine(-1.0, 1.0)?;
                    ((tanh * cap)?, Some(derivative))
                }
                None => (logits, None),
            };
            let ids: Vec<u32> = chunk.iter().map(|t| t.unwrap_or(0)).collect();
            let ids = Tensor::from_vec(ids, (len, 1), device)?;
            let weights: Vec<f32> = chunk.iter().map(|t| if t.is_some() { 1.0 } else { 0.0 }).collect();
            let counts = Tensor::from_vec(weights, (len, 1), device)?;
            let picked = logits.gather(&ids, 1)?;
            // log Σ exp, as candle's log_sum_exp computes it, the logits let go first
            let max = logits.max_keepdim(D::Minus1)?;
            let shifted = logits.broadcast_sub(&max)?;
            drop(logits);
            let log_sum = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
            let lse = (&log_sum + &max)?;
            loss = (loss + ((&lse - picked)? * &counts)?.sum_all()?)?;
            if !wants.any() {
                continue;
            }
            // softmax − one-hot, over the rows that count, for the mean
            let centred = shifted.broadcast_sub(&log_sum)?;
            drop(shifted);
            let probabilities = centred.exp()?;
            drop(centred);
            let scattered = probabilities.scatter_add(&ids, &counts.neg()?, 1)?;
            drop(probabilities);
            // each row times its count over the rows counted (0 or 1 over n: the same product)
            let grad = scattered.broadcast_mul(&(counts / counted as f64)?)?;
            drop(scattered);
            let grad = match derivative {
                Some(derivative) => (grad * derivative)?,
                None => grad,
            };
            if let Some(sum) = grad_bias.as_mut() {
                *sum = (&*sum + grad.sum(0)?)?;
            }
            let grad_native = grad.to_dtype(w.dtype())?;
            drop(grad);
            if wants.hidden {
                grad_hidden.push(grad_native.matmul(&w)?);
            }
            if let Some(sum) = &grad_weight {
                add_weight_gradient(sum, &grad_native, &h_c)?;
            }
        }
        let loss = (loss / counted as f64)?;
        let grad_weight = grad_weight.map(|g| g.to_dtype(weight.dtype())).transpose()?;
        let (grad_weight, taken) = if take_weight { (None, grad_weight) } else { (grad_weight, None) };
        if !(wants.hidden || wants.bias || grad_weight.is_some()) {
            return Ok((loss, taken));
        }
        let grads = Grads {
            hidden: wants.hidden.then(|| Tensor::cat(&grad_hidden, 0)?.to_dtype(hidden.dtype())).transpose()?,
            weight: grad_weight,
            bias: grad_bias.zip(bias).map(|(g, b)| g.to_dtype(b.dtype())).transpose()?,
            has_bias: bias.is_some(),
        };
        // a weight whose gradient is taken is no input of the node: candle hands it nothing
        let detached = weight.detach();
        let mut inputs = vec![hidden, if take_weight { &detached } else { weight }];
        inputs.extend(bias);
        Ok((node(&inputs, loss, HandOut { grads: Mutex::new(Some(grads)) })?, taken))
    }
}

/// Adds a chunk's share `gradᵀ · h` to the head weight's gradient `sum`
/// (`(vocab, width)`, f32, contiguous) in place, a block of the vocabulary's
/// rows at a time (`Tensor::slice_set`): the whole product and the whole new
/// sum are never made, so the loss holds one vocabulary-sized gradient, not
/// three at once (1.6 GB where 545 MB would do on a 151,936 × 896 f32 head).
fn add_weight_gradient(sum: &Tensor, grad: &Tensor, h: &Tensor) -> Result<()> {
    let (vocab, width) = sum.dims2()?;
    let block = (WEIGHT_GRADIENT_ELEMENTS / width.max(1)).max(1);
    for start in (0..vocab).step_by(block) {
        let len = block.min(vocab - start);
        let share = grad.narrow(1, start, len)?.t()?.contiguous()?.matmul(h)?.to_dtype(DType::F32)?;
        let updated = (sum.narrow(0, start, len)? + share)?;
        sum.slice_set(&updated, 0, start)?;
    }
    Ok(())
}

/// Adds `rows` `(ids.len(), width)` (or any shape of that many rows) into the
/// rows `ids` of `sum` `(vocab, width)` (contiguous) in place, the rows of
/// `skip` left out: an embedding lookup's gradient added into its table's,
/// a block of the vocabulary's rows at a time, each row in the order of
/// `ids` (as candle's `index_add` adds them). No second table-sized tensor
/// is made: the blocks of [`WEIGHT_GRADIENT_ELEMENTS`] are the most held
/// beside `sum`.
pub(crate) fn add_rows_in_place(sum: &Tensor, ids: &[u32], rows: &Tensor, skip: Option<u32>) -> Result<()> {
    let (vocab, width) = sum.dims2()?;
    let rows = rows.reshape((ids.len(), width))?.to_dtype(sum.dtype())?;
    let block = (WEIGHT_GRADIENT_ELEMENTS / width.max(1)).max(1);
    // each block's rows: where in the block, and which of `rows`
    let mut blocks: std::collections::BTreeMap<usize, (Vec<u32>, Vec<u32>)> = Default::default();
    for (position, &id) in ids.iter().enumerate() {
        if Some(id) == skip {
            continue;
        }
        if id as usize >= vocab {
            candle_core::bail!("an embedding row {id} of a table of {vocab}")
        }
        let (index, within) = (id as usize / block, (id as usize % block) as u32);
        let (local, positions) = blocks.entry(index).or_default();
        local.push(within);
        positions.push(position as u32);
    }
    let device = sum.device();
    for (index, (local, positions)) in blocks {
        let (start, count) = (index * block, local.len());
        let len = block.min(vocab - start);
        let local = Tensor::from_vec(local, count, device)?;
        let picked = rows.index_select(&Tensor::from_vec(positions, count, device)?, 0)?;
        let updated = sum.narrow(0, start, len)?.index_add(&local, &picked, 0)?;
        sum.slice_set(&updated, 0, start)?;
    }
    Ok(())
}

/// Elements of the head's gradient one block of [`add_weight_gradient`]
/// spans: 4 MiB in f32, as the optimizers' slices.
const WEIGHT_GRADIENT_ELEMENTS: usize = 1 << 20;

/// Which inputs take part in the graph (and get a gradient).
#[derive(Clone, Copy)]
struct Wanted {
    hidden: bool,
    weight: bool,
    bias: bool,
}

impl Wanted {
    fn any(&self) -> bool {
        self.hidden || self.weight || self.bias
    }
}

/// Each row's class, `None` where ignored; checked against the vocabulary.
fn targets_of(targets: &Tensor, n: usize, vocab: usize) -> Result<Vec<Option<u32>>> {
    if targets.dims() != [n] {
        candle_core::bail!("chunked cross entropy: {:?} targets for {n} rows", targets.dims())
    }
    let ids: Vec<i64> = match targets.dtype() {
        DType::U32 => targets.to_vec1::<u32>()?.into_iter().map(i64::from).collect(),
        DType::I64 => targets.to_vec1::<i64>()?,
        other => candle_core::bail!("chunked cross entropy: targets of {other:?}; use u32 or i64"),
    };
    ids.into_iter()
        .map(|id| match id {
            IGNORE_INDEX => Ok(None),
            id if (0..vocab as i64).contains(&id) => Ok(Some(id as u32)),
            id => candle_core::bail!("chunked cross entropy: target {id} of a vocabulary of {vocab}"),
        })
        .collect()
}

/// The gradients computed in the forward pass, for the loss's gradient of 1.
struct Grads {
    hidden: Option<Tensor>,
    weight: Option<Tensor>,
    bias: Option<Tensor>,
    /// Whether the head has a bias (an input of the node).
    has_bias: bool,
}

/// The backward pass: the gradients computed in the forward pass, handed
/// out (and let go) scaled by the loss's own gradient.
struct HandOut {
    grads: Mutex<Option<Grads>>,
}

impl Backward for HandOut {
    fn name(&self) -> &'static str {
        "chunked-cross-entropy"
    }

    fn backward(&self, _: &[Tensor], _: &[bool], _: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let taken =
            self.grads.lock().map_err(|_| candle_core::Error::Msg("chunked cross entropy: poisoned".into()))?.take();
        let Some(grads) = taken else { candle_core::bail!("chunked cross entropy: its backward ran twice") };
        let scale = |g: Option<Tensor>| -> Result<Option<Tensor>> {
            g.map(|g| g.broadcast_mul(&grad.to_dtype(g.dtype())?)).transpose()
        };
        let mut handed = vec![scale(grads.hidden)?, scale(grads.weight)?];
        if grads.has_bias {
            handed.push(scale(grads.bias)?);
        }
        Ok(handed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};
    use proptest::prelude::*;

    fn relative(ours: &Tensor, theirs: &Tensor) -> f32 {
        let (ours, theirs) = (ours.to_dtype(DType::F32).unwrap(), theirs.to_dtype(DType::F32).unwrap());
        crate::ops::testing::relative(&ours, &theirs)
    }

    /// The fused loss and the eager one (logits whole, in f32, the ignored
    /// rows left out), their values and the gradients of hidden, weight and
    /// bias; the weight also used as an embedding (a tied head).
    #[allow(clippy::too_many_arguments)]
    fn compare(
        n: usize,
        vocab: usize,
        width: usize,
        rows: usize,
        bias: bool,
        ignored: bool,
        tied: bool,
        dtype: DType,
    ) -> f32 {
        let device = Device::Cpu;
        // seeded values (randn's would differ from run to run), of the spread of N(0, 1)
        let var = |shape: &[usize], seed: usize| {
            let values = crate::ops::testing::var(shape, seed, 1.7).as_tensor().to_dtype(dtype).unwrap();
            Var::from_tensor(&values).unwrap()
        };
        let seed = n * 7 + vocab * 131 + rows;
        let (h, w, b) = (var(&[n, width], seed), var(&[vocab, width], seed + 1), var(&[vocab], seed + 2));
        let ids: Vec<i64> =
            (0..n).map(|i| if ignored && i % 3 == 1 { IGNORE_INDEX } else { ((i * 7 + 3) % vocab) as i64 }).collect();
        if ids.iter().all(|&id| id == IGNORE_INDEX) {
            return 0.0;
        }
        let targets = Tensor::new(ids.as_slice(), &device).unwrap();
        let bias = bias.then_some(b.as_tensor());
        // the tied use: an embedding lookup of the same weight, added to the hidden states
        let input = |h: &Var| {
            if tied {
                let lookup = w.as_tensor().index_select(&Tensor::new(&[0u32, 1], &device).unwrap(), 0).unwrap();
                h.as_tensor().broadcast_add(&lookup.sum(0).unwrap()).unwrap()
            } else {
                h.as_tensor().clone()
            }
        };
        let fused = ChunkedCrossEntropy::rows(rows).forward(&input(&h), w.as_tensor(), bias, &targets).unwrap();
        let fused_grads = fused.backward().unwrap();
        let kept: Vec<u32> = (0..n as u32).filter(|&i| ids[i as usize] != IGNORE_INDEX).collect();
        let kept_targets: Vec<u32> = kept.iter().map(|&i| ids[i as usize] as u32).collect();
        let count = kept.len();
        let logits = input(&h).matmul(&w.as_tensor().t().unwrap()).unwrap();
        let logits = match bias {
            Some(b) => logits.broadcast_add(b).unwrap(),
            None => logits,
        };
        let logits = logits
            .to_dtype(DType::F32)
            .unwrap()
            .index_select(&Tensor::new(kept.as_slice(), &device).unwrap(), 0)
            .unwrap();
        let eager =
            candle_nn::loss::cross_entropy(&logits, &Tensor::from_vec(kept_targets, count, &device).unwrap()).unwrap();
        let eager_grads = eager.backward().unwrap();
        let mut worst = relative(&fused, &eager);
        for var in [Some(&h), Some(&w), bias.map(|_| &b)].into_iter().flatten() {
            worst = worst.max(relative(fused_grads.get(var).unwrap(), eager_grads.get(var).unwrap()));
        }
        worst
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// Chunks that do not divide the rows, ignored targets, a bias, a
        /// tied head: the loss and every gradient equal the eager loss's within 1e-5.
        #[test]
        fn fused_equals_eager(
            n in 1usize..40,
            vocab in 2usize..70,
            rows in 1usize..17,
            bias: bool,
            ignored: bool,
            tied: bool,
        ) {
            let error = compare(n, vocab, 12, rows, bias, ignored, tied, DType::F32);
            prop_assert!(error <= 1e-5, "off by {error:e}");
        }
    }

    /// A head wider than one block of its gradient's rows (4096 wide: 256
    /// rows a block, 3 blocks, the last partial), each added in place: the
    /// same as the eager loss's, tied or not.
    #[test]
    fn a_head_of_several_gradient_blocks_equals_eager() {
        for tied in [false, true] {
            let error = compare(9, 600, 4096, 4, true, true, tied, DType::F32);
            // sums of 4096 products in f32, in another order than the eager
            // matmul's: rounding of 1e-5 (a misplaced block is off by order 1)
            assert!(error <= 1e-4, "tied {tied}: off by {error:e}");
        }
    }

    #[test]
    fn in_bf16_within_bf16s_tolerance() {
        let error = compare(33, 97, 16, 8, true, true, true, DType::BF16);
        assert!(error <= 2e-2, "off by {error:e}");
    }

    #[test]
    fn a_frozen_head_gets_no_gradient_and_targets_are_checked() {
        let device = Device::Cpu;
        let h = Var::randn(0f32, 1.0, (4, 8), &device).unwrap();
        let w = Tensor::randn(0f32, 1.0, (10, 8), &device).unwrap();
        let targets = Tensor::new(&[1u32, 2, 3, 4], &device).unwrap();
        let grads =
            ChunkedCrossEntropy::default().forward(h.as_tensor(), &w, None, &targets).unwrap().backward().unwrap();
        assert!(grads.get(&h).is_some() && grads.get(&w).is_none());
        let beyond = Tensor::new(&[1u32, 2, 3, 10], &device).unwrap();
        assert!(ChunkedCrossEntropy::default().forward(h.as_tensor(), &w, None, &beyond).is_err());
        let none = Tensor::new(&[IGNORE_INDEX; 4], &device).unwrap();
        assert!(ChunkedCrossEntropy::default().forward(h.as_tensor(), &w, None, &none).is_err());
    }
}
