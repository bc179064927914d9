//! Attention in blocks (FlashAttention-2's algorithm, Dao 2023) from candle
//! ops, so it runs on every device candle has: the forward pass walks the
//! keys a block at a time with an online softmax and keeps each row's
//! log-sum-exp; the backward pass recomputes the scores block by block from
//! q, k, v, the output and the log-sum-exp. No tensor of `b × heads × s × s`
//! elements is kept for the backward pass or made whole at any moment: the
//! largest is one block of scores, `b × heads × block × block`.

use candle_core::{D, DType, Result, Tensor};

use super::node::{Backward, node};

/// Queries and keys per block unless a [`BlockedAttention`] says otherwise.
pub const DEFAULT_BLOCK: usize = 128;

/// Scaled dot-product attention in blocks: the settings.
///
/// `q` is `(b, heads, s_q, d)`, `k` and `v` `(b, kv_heads, s_k, d)` with
/// `heads` a multiple of `kv_heads` (grouped-query attention: each kv head
/// serves `heads / kv_heads` query heads); the output is `(b, heads, s_q,
/// d)`, as `softmax(q·kᵀ · scale + mask) · v` computes it.
///
/// ```
/// use autobatch_models::ops::{attention, BlockedAttention};
/// use candle_core::{Device, Tensor, Var};
///
/// let q = Var::randn(0f32, 1.0, (2, 4, 37, 16), &Device::Cpu)?;
/// let (k, v) = (Tensor::randn(0f32, 1.0, (2, 2, 37, 16), &Device::Cpu)?, Tensor::randn(0f32, 1.0, (2, 2, 37, 16), &Device::Cpu)?);
/// let blocked = BlockedAttention::causal().block(8).forward(q.as_tensor(), &k, &v, None)?;
/// let eager = attention(q.as_tensor(), &k, &v, None, true)?;
/// let difference = (&blocked - &eager)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
/// assert!(difference < 1e-5);
/// let grads = blocked.sum_all()?.backward()?;
/// assert!(grads.get(&q).is_some());
/// # Ok::<(), candle_core::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockedAttention {
    /// Each query attends to itself and the keys before it. With fewer
    /// queries than keys, the queries are the last of the keys' positions (a
    /// chunk of a sequence whose earlier keys are cached).
    pub causal: bool,
    /// What the scores are multiplied by; `None`: `1 / √d`.
    pub scale: Option<f64>,
    /// Queries and keys per block.
    pub block: usize,
    /// Causally, each query sees only the last `window` positions up to its
    /// own (key `j` by query `i` where `i − window < j ≤ i`, as transformers'
    /// sliding window masks): the key blocks wholly before it are skipped.
    pub window: Option<usize>,
    /// The scores soft-capped before the mask, `cap · tanh(score / cap)`
    /// (Gemma 2's `attn_logit_softcapping`).
    pub softcap: Option<f64>,
}

impl BlockedAttention {
    /// Causal attention (a decoder's), blocks of [`DEFAULT_BLOCK`].
    pub fn causal() -> BlockedAttention {
        BlockedAttention { causal: true, scale: None, block: DEFAULT_BLOCK, window: None, softcap: None }
    }

    /// Bidirectional attention (an encoder's), blocks of [`DEFAULT_BLOCK`].
    pub fn bidirectional() -> BlockedAttention {
        BlockedAttention { causal: false, scale: None, block: DEFAULT_BLOCK, window: None, softcap: None }
    }

    /// With blocks of `block` queries and keys.
    pub fn block(mut self, block: usize) -> BlockedAttention {
        self.block = block;
        self
    }

    /// Within a sliding window of `window` positions (causal attention only).
    pub fn window(mut self, window: Option<usize>) -> BlockedAttention {
        self.window = window;
        self
    }

    /// The scores soft-capped at `cap`.
    pub fn softcap(mut self, cap: Option<f64>) -> BlockedAttention {
        self.softcap = cap;
        self
    }

    /// The scores multiplied by `scale` (`None`: `1 / √d`).
    pub fn scale(mut self, scale: Option<f64>) -> BlockedAttention {
        self.scale = scale;
        self
    }

    /// The eager form of the same attention: the scores made whole with
    /// candle's differentiable ops (what this equals; `q` contiguous).
    pub fn eager(&self, q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let shape = Shapes::of(q, k, v, mask, self)?;
        let scale = self.scale.unwrap_or(1.0 / (shape.d as f64).sqrt());
        let groups = shape.heads / shape.kv_heads;
        let (k, v) = (repeat_heads(k, groups)?, repeat_heads(v, groups)?);
        let scores = (crate::ops::matmul(q, &k.t()?)? * scale)?;
        let scores = match self.softcap {
            Some(cap) => ((scores / cap)?.tanh()? * cap)?,
            None => scores,
        };
        let scores = match mask {
            Some(mask) => {
                let (b, s_k) = mask.dims2()?;
                crate::ops::add_constant(&scores, &mask.to_dtype(scores.dtype())?.reshape((b, 1, 1, s_k))?)?
            }
            None => scores,
        };
        let scores = if shape.causal {
            let mask = causal_block(&shape, shape.q_offset, shape.s_q, 0, shape.s_k, q.device())?;
            crate::ops::add_constant(&scores, &mask.to_dtype(scores.dtype())?)?
        } else {
            scores
        };
        crate::ops::matmul(&crate::ops::softmax_last_dim(&scores)?, &v)
    }

    /// The attention of `q` over `k` and `v` (any layout: heads split from a
    /// projection's output by a reshape and a transpose, without a copy),
    /// with an additive key mask `(b, s_k)` where given (BERT's padding: 0
    /// where a key counts, a large negative number where it does not). One
    /// node of candle's graph that keeps its inputs, the output and each
    /// row's log-sum-exp; the output is `(b, heads, s_q, d)`, a transposed
    /// view of `(b, s_q, heads, d)` (heads joined by a reshape, no copy).
    pub fn forward(&self, q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        self.attend(q, k, v, mask, None)
    }

    /// [`forward`](Self::forward) of `q` and `k` rotated first by the rotary
    /// tables `cos` and `sin` (`(t, d / 2)`, `t` at least `s_k`; the halves
    /// rotated, as [`rope`](crate::ops::rope)): the same output as
    /// `forward(&rope(q, cos, sin)?, &rope(k, cos, sin)?, v, mask)`, but the
    /// graph keeps `q` and `k` as given, not rotated (the backward pass
    /// rotates them again, and their gradients back). Causally, the queries
    /// are the keys' last positions, as in `forward`.
    pub fn forward_rotary(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
        cos: &Tensor,
        sin: &Tensor,
    ) -> Result<Tensor> {
        self.attend(q, k, v, mask, Some((cos, sin)))
    }

    fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
        rotary: Option<(&Tensor, &Tensor)>,
    ) -> Result<Tensor> {
        let shape = Shapes::of(q, k, v, mask, self)?;
        let scale = self.scale.unwrap_or(1.0 / (shape.d as f64).sqrt());
        let mask = mask.map(|mask| mask.detach().to_dtype(DType::F32)).transpose()?;
        let rotary = rotary.map(|(cos, sin)| Rotary::new(cos, sin, &shape)).transpose()?;
        let (q_, k_, v_) = prepared(q, k, v, rotary.as_ref())?;
        let (out, lse) = forward(&q_, &k_, &v_, mask.as_ref(), &shape, scale)?;
        // (b, s_q, heads, d): the heads joined by a reshape
        let value = out.transpose(1, 2)?.contiguous()?;
        drop((q_, k_, v_, out));
        let attend = Attend { shape, scale, lse, mask, rotary };
        node(&[q, k, v], value, attend)?.transpose(1, 2)
    }
}

/// The rotary tables of a call: the queries' rows and the keys'.
struct Rotary {
    q: (Tensor, Tensor),
    k: (Tensor, Tensor),
}

impl Rotary {
    fn new(cos: &Tensor, sin: &Tensor, shape: &Shapes) -> Result<Rotary> {
        let rows = cos.dim(0)?;
        if cos.dims() != sin.dims() || cos.dims() != [rows, shape.d / 2] || rows < shape.s_k || shape.d % 2 == 1 {
            candle_core::bail!(
                "blocked attention: rotary tables of {:?} and {:?} for {} keys of {} dimensions",
                cos.dims(),
                sin.dims(),
                shape.s_k,
                shape.d
            )
        }
        let rows = |t: &Tensor, start, len| t.detach().narrow(0, start, len)?.contiguous();
        Ok(Rotary {
            q: (rows(cos, shape.q_offset, shape.s_q)?, rows(sin, shape.q_offset, shape.s_q)?),
            k: (rows(cos, 0, shape.s_k)?, rows(sin, 0, shape.s_k)?),
        })
    }

    /// `x` rotated by `tables`, or rotated back.
    fn apply(x: &Tensor, (cos, sin): &(Tensor, Tensor), back: bool) -> Result<Tensor> {
        let x = x.contiguous()?;
        if back { candle_nn::rotary_emb::rope(&x, cos, &sin.neg()?) } else { candle_nn::rotary_emb::rope(&x, cos, sin) }
    }
}

/// q, k and v detached and contiguous, q and k rotated where `rotary` says.
fn prepared(q: &Tensor, k: &Tensor, v: &Tensor, rotary: Option<&Rotary>) -> Result<(Tensor, Tensor, Tensor)> {
    let (q, k, v) = (q.detach().contiguous()?, k.detach().contiguous()?, v.detach().contiguous()?);
    match rotary {
        Some(rotary) => Ok((Rotary::apply(&q, &rotary.q, false)?, Rotary::apply(&k, &rotary.k, false)?, v)),
        None => Ok((q, k, v)),
    }
}

/// The eager form: the scores made whole, `softmax(q·kᵀ · scale + mask) ·
/// v` with candle's differentiable ops; what [`BlockedAttention`] equals.
/// Shapes as there; `scale` is `1 / √d`.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>, causal: bool) -> Result<Tensor> {
    let (_, heads, s, d) = q.dims4()?;
    let s_k = k.dim(2)?;
    if causal && s > s_k {
        candle_core::bail!("attention: causal attention of {s} queries over {s_k} keys")
    }
    let groups = heads / k.dim(1)?;
    let (k, v) = (repeat_heads(k, groups)?, repeat_heads(v, groups)?);
    let scores = (crate::ops::matmul(q, &k.t()?)? / (d as f64).sqrt())?;
    let scores = match mask {
        Some(mask) => {
            let (b, s_k) = mask.dims2()?;
            crate::ops::add_constant(&scores, &mask.to_dtype(scores.dtype())?.reshape((b, 1, 1, s_k))?)?
        }
        None => scores,
    };
    let scores = if causal {
        let mask = causal_mask(s_k - s, s, 0, s_k, None, q.device())?.to_dtype(scores.dtype())?;
        crate::ops::add_constant(&scores, &mask)?
    } else {
        scores
    };
    crate::ops::matmul(&crate::ops::softmax_last_dim(&scores)?, &v)
}

/// The sizes of one attention call, checked.
#[derive(Clone, Copy, Debug)]
struct Shapes {
    b: usize,
    heads: usize,
    kv_heads: usize,
    s_q: usize,
    s_k: usize,
    d: usize,
    block: usize,
    causal: bool,
    /// The position of the first query among the keys'.
    q_offset: usize,
    window: Option<usize>,
    softcap: Option<f64>,
}

impl Shapes {
    fn of(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>, config: &BlockedAttention) -> Result<Shapes> {
        let (b, heads, s_q, d) = q.dims4()?;
        let (kb, kv_heads, s_k, kd) = k.dims4()?;
        if (kb, kd) != (b, d) || v.dims() != k.dims() {
            candle_core::bail!(
                "blocked attention: q {:?}, k {:?} and v {:?} do not agree (b, heads, s, d)",
                q.dims(),
                k.dims(),
                v.dims()
            )
        }
        if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            candle_core::bail!("blocked attention: {heads} query heads are not a multiple of {kv_heads} kv heads")
        }
        if config.causal && s_q > s_k {
            candle_core::bail!("blocked attention: causal attention of {s_q} queries over {s_k} keys")
        }
        if config.block == 0 {
            candle_core::bail!("blocked attention: blocks of 0 queries")
        }
        if let Some(window) = config.window
            && (window == 0 || !config.causal)
        {
            candle_core::bail!("blocked attention: a window of {window} (causal attention within 1 key or more)")
        }
        if let Some(cap) = config.softcap
            && !(cap.is_finite() && cap > 0.0)
        {
            candle_core::bail!("blocked attention: a soft cap of {cap} (a positive number)")
        }
        if let Some(mask) = mask
            && mask.dims() != [b, s_k]
        {
            candle_core::bail!("blocked attention: a key mask of {:?} for ({b}, {s_k})", mask.dims())
        }
        // causally, the queries are the last s_q of the keys' positions (a
        // chunk of a sequence whose earlier keys are cached)
        let q_offset = if config.causal { s_k - s_q } else { 0 };
        Ok(Shapes {
            b,
            heads,
            kv_heads,
            s_q,
            s_k,
            d,
            block: config.block,
            causal: config.causal,
            q_offset,
            window: config.window,
            softcap: config.softcap,
        })
    }

    /// The query blocks, as (start, length).
    fn query_blocks(&self) -> impl Iterator<Item = (usize, usize)> + use<> {
        blocks(self.s_q, self.block)
    }

    /// The key blocks a query block at `start` of `len` sees: all of them,
    /// or causally those that start at or before its last query (within a
    /// window, those that end after its first query's window starts).
    fn key_blocks(&self, start: usize, len: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        let (first, last) = (self.q_offset + start, self.q_offset + start + len - 1);
        let seen_from = self.window.map_or(0, |window| (first + 1).saturating_sub(window));
        blocks(self.s_k, self.block).filter(move |&(key, len)| !self.causal || (key <= last && key + len > seen_from))
    }

    /// Whether the scores of the block of queries `q0..q0 + q_len` (their
    /// positions) over keys `k0..k0 + k_len` have an entry a causal mask or
    /// the window hides.
    fn masks(&self, q0: usize, q_len: usize, k0: usize, k_len: usize) -> bool {
        self.causal && (k0 + k_len - 1 > q0 || self.window.is_some_and(|window| k0 + window < q0 + q_len))
    }
}

fn blocks(len: usize, block: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len).step_by(block).map(move |start| (start, block.min(len - start)))
}

/// 0 where key `k0 + j` may be seen by query `q0 + i` (positions), −∞ where
/// it comes after it or, within a `window`, at or before `q0 + i − window`:
/// `(q_len, k_len)` in f32.
fn causal_mask(
    q0: usize,
    q_len: usize,
    k0: usize,
    k_len: usize,
    window: Option<usize>,
    device: &candle_core::Device,
) -> Result<Tensor> {
    let hidden = |q: usize, k: usize| k > q || window.is_some_and(|window| k + window <= q);
    let values: Vec<f32> = (0..q_len)
        .flat_map(|i| (0..k_len).map(move |j| if hidden(q0 + i, k0 + j) { f32::NEG_INFINITY } else { 0.0 }))
        .collect();
    Tensor::from_vec(values, (q_len, k_len), device)
}

/// [`causal_mask`] of a call's shape.
fn causal_block(
    shape: &Shapes,
    q0: usize,
    q_len: usize,
    k0: usize,
    k_len: usize,
    device: &candle_core::Device,
) -> Result<Tensor> {
    causal_mask(q0, q_len, k0, k_len, shape.window, device)
}

/// `(b, kv_heads, n, d)` → `(b, kv_heads · groups, n, d)`, each kv head repeated.
fn repeat_heads(xs: &Tensor, groups: usize) -> Result<Tensor> {
    if groups == 1 {
        return Ok(xs.clone());
    }
    let (b, kv_heads, n, d) = xs.dims4()?;
    xs.unsqueeze(2)?.expand((b, kv_heads, groups, n, d))?.reshape((b, kv_heads * groups, n, d))
}

/// `(b, heads, n, d)` summed over each kv head's group → `(b, kv_heads, n, d)`.
fn sum_groups(xs: &Tensor, kv_heads: usize) -> Result<Tensor> {
    let (b, heads, n, d) = xs.dims4()?;
    if heads == kv_heads {
        return Ok(xs.clone());
    }
    xs.reshape((b, kv_heads, heads / kv_heads, n, d))?.sum(2)
}

/// One block of scores in f32: `q_i · k_jᵀ · scale` (`q_i` contiguous),
/// soft-capped where the shape says, with the key mask and the causal (and
/// window) mask where they apply; and, soft-capped, the cap's derivative at
/// each score (`1 − tanh²`), what the scores' gradient is multiplied by.
fn scores(
    q: &Tensor,
    k: &Tensor,
    mask: Option<&Tensor>,
    shape: &Shapes,
    (q0, q_len): (usize, usize),
    (k0, k_len): (usize, usize),
    scale: f64,
) -> Result<(Tensor, Option<Tensor>)> {
    let s = (q.matmul(&k.t()?)?.to_dtype(DType::F32)? * scale)?;
    let (s, derivative) = match shape.softcap {
        Some(cap) => {
            let tanh = (s / cap)?.tanh()?;
            let derivative = tanh.sqr()?.affine(-1.0, 1.0)?;
            ((tanh * cap)?, Some(derivative))
        }
        None => (s, None),
    };
    let s = match mask {
        Some(mask) => s.broadcast_add(&mask.narrow(1, k0, k_len)?.reshape((shape.b, 1, 1, k_len))?)?,
        None => s,
    };
    let q_position = shape.q_offset + q0;
    let s = if shape.masks(q_position, q_len, k0, k_len) {
        s.broadcast_add(&causal_block(shape, q_position, q_len, k0, k_len, q.device())?)?
    } else {
        s
    };
    Ok((s, derivative))
}

/// The output `(b, heads, s_q, d)` in q's dtype and each row's log-sum-exp
/// `(b, heads, s_q, 1)` in f32, by blocks of queries and keys with an online
/// softmax; on detached tensors (no graph).
fn forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    shape: &Shapes,
    scale: f64,
) -> Result<(Tensor, Tensor)> {
    let groups = shape.heads / shape.kv_heads;
    let (mut outputs, mut lses) = (Vec::new(), Vec::new());
    for (q0, q_len) in shape.query_blocks() {
        // made contiguous once for every key block it meets
        let q_i = q.narrow(2, q0, q_len)?.contiguous()?;
        let rows = (shape.b, shape.heads, q_len, 1);
        // a finite start: a row whose keys are all masked so far keeps weights of 0, not NaN
        let mut max = Tensor::full(-1e30f32, rows, q.device())?;
        let mut sum = Tensor::zeros(rows, DType::F32, q.device())?;
        let mut acc = Tensor::zeros((shape.b, shape.heads, q_len, shape.d), DType::F32, q.device())?;
        for (k0, k_len) in shape.key_blocks(q0, q_len) {
            let k_j = repeat_heads(&k.narrow(2, k0, k_len)?, groups)?;
            let v_j = repeat_heads(&v.narrow(2, k0, k_len)?, groups)?;
            let (s, _) = scores(&q_i, &k_j, mask, shape, (q0, q_len), (k0, k_len), scale)?;
            let new_max = max.maximum(&s.max_keepdim(D::Minus1)?)?;
            let p = s.broadcast_sub(&new_max)?.exp()?;
            let rescale = (&max - &new_max)?.exp()?;
            sum = ((&sum * &rescale)? + p.sum_keepdim(D::Minus1)?)?;
            let pv = p.to_dtype(v_j.dtype())?.matmul(&v_j.contiguous()?)?.to_dtype(DType::F32)?;
            acc = (acc.broadcast_mul(&rescale)? + pv)?;
            max = new_max;
        }
        outputs.push(acc.broadcast_div(&sum)?.to_dtype(q.dtype())?);
        lses.push((max + sum.log()?)?);
    }
    Ok((Tensor::cat(&outputs, 2)?, Tensor::cat(&lses, 2)?))
}

/// The gradients of q, k and v for the output gradient `grad` `(b, heads,
/// s_q, d)`, the scores recomputed block by block (FlashAttention-2's
/// backward): `D = rowsum(dO ∘ O)`, and for each block `P = exp(S − lse)`,
/// `dV += Pᵀ·dO`, `dS = P ∘ (dO·Vᵀ − D)`, `dQ += dS·K·scale`, `dK += dSᵀ·Q·scale`.
#[allow(clippy::too_many_arguments)]
fn backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    grad: &Tensor,
    lse: &Tensor,
    mask: Option<&Tensor>,
    shape: &Shapes,
    scale: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let groups = shape.heads / shape.kv_heads;
    let grad = grad.to_dtype(DType::F32)?;
    let rows = (grad.clone() * out.to_dtype(DType::F32)?)?.sum_keepdim(D::Minus1)?;
    let key_blocks: Vec<(usize, usize)> = blocks(shape.s_k, shape.block).collect();
    let mut dk: Vec<Option<Tensor>> = vec![None; key_blocks.len()];
    let mut dv: Vec<Option<Tensor>> = vec![None; key_blocks.len()];
    let mut dq = Vec::new();
    let add = |slot: &mut Option<Tensor>, value: Tensor| -> Result<()> {
        *slot = Some(match slot.take() {
            Some(sum) => (sum + value)?,
            None => value,
        });
        Ok(())
    };
    for (q0, q_len) in shape.query_blocks() {
        let q_i = q.narrow(2, q0, q_len)?.contiguous()?;
        let q_f = q_i.to_dtype(DType::F32)?;
        let (do_i, lse_i, rows_i) = (grad.narrow(2, q0, q_len)?, lse.narrow(2, q0, q_len)?, rows.narrow(2, q0, q_len)?);
        let do_i = do_i.contiguous()?;
        let mut dq_i = Tensor::zeros((shape.b, shape.heads, q_len, shape.d), DType::F32, q.device())?;
        for (k0, k_len) in shape.key_blocks(q0, q_len) {
            // the key block's place among all of them (a window skips the first ones)
            let index = k0 / shape.block;
            let k_j = repeat_heads(&k.narrow(2, k0, k_len)?, groups)?.contiguous()?;
            let v_j = repeat_heads(&v.narrow(2, k0, k_len)?, groups)?.contiguous()?.to_dtype(DType::F32)?;
            let (s, derivative) = scores(&q_i, &k_j, mask, shape, (q0, q_len), (k0, k_len), scale)?;
            let k_j = k_j.to_dtype(DType::F32)?;
            let p = s.broadcast_sub(&lse_i)?.exp()?;
            add(&mut dv[index], p.t()?.matmul(&do_i)?)?;
            let dp = do_i.matmul(&v_j.t()?)?;
            let ds = (p * dp.broadcast_sub(&rows_i)?)?;
            // through the soft cap: its derivative at each score
            let ds = match derivative {
                Some(derivative) => (ds * derivative)?,
                None => ds,
            };
            dq_i = (dq_i + (ds.matmul(&k_j)? * scale)?)?;
            add(&mut dk[index], (ds.t()?.matmul(&q_f)? * scale)?)?;
        }
        dq.push(dq_i);
    }
    let gather = |parts: Vec<Option<Tensor>>, like: &Tensor| -> Result<Tensor> {
        let parts: Vec<Tensor> = parts
            .into_iter()
            .zip(&key_blocks)
            .map(|(part, &(_, len))| match part {
                Some(part) => sum_groups(&part, shape.kv_heads),
                // a key block no query sees (causally none but before a window)
                None => Tensor::zeros((shape.b, shape.kv_heads, len, shape.d), DType::F32, like.device()),
            })
            .collect::<Result<_>>()?;
        Tensor::cat(&parts, 2)?.to_dtype(like.dtype())
    };
    let dq = Tensor::cat(&dq, 2)?.to_dtype(q.dtype())?;
    Ok((dq, gather(dk, k)?, gather(dv, v)?))
}

/// The backward pass: the scores recomputed block by block from q, k, v,
/// the output and the log-sum-exp (q and k rotated again where they were).
struct Attend {
    shape: Shapes,
    scale: f64,
    lse: Tensor,
    mask: Option<Tensor>,
    rotary: Option<Rotary>,
}

impl Backward for Attend {
    fn name(&self) -> &'static str {
        "blocked-attention"
    }

    fn backward(&self, inputs: &[Tensor], _: &[bool], output: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let (q, k, v) = prepared(&inputs[0], &inputs[1], &inputs[2], self.rotary.as_ref())?;
        let (out, grad) = (output.transpose(1, 2)?, grad.transpose(1, 2)?);
        let (dq, dk, dv) = backward(&q, &k, &v, &out, &grad, &self.lse, self.mask.as_ref(), &self.shape, self.scale)?;
        let (dq, dk) = match &self.rotary {
            Some(rotary) => (Rotary::apply(&dq, &rotary.q, true)?, Rotary::apply(&dk, &rotary.k, true)?),
            None => (dq, dk),
        };
        Ok(vec![Some(dq), Some(dk), Some(dv)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};
    use proptest::prelude::*;

    use crate::ops::testing::relative;

    /// Blocked and eager attention of the same inputs, their outputs and
    /// the gradients of q, k, v (and, when given, of nothing for the mask).
    #[allow(clippy::too_many_arguments)]
    fn compare(
        b: usize,
        heads: usize,
        kv: usize,
        s: usize,
        d: usize,
        block: usize,
        causal: bool,
        masked: bool,
        dtype: DType,
    ) -> f32 {
        compare_with(
            b,
            heads,
            kv,
            s,
            d,
            BlockedAttention { causal, block, ..BlockedAttention::causal() },
            masked,
            dtype,
        )
    }

    /// [`compare`] of any settings: blocked against [`BlockedAttention::eager`]
    /// where the settings go past the plain [`attention`].
    #[allow(clippy::too_many_arguments)]
    fn compare_with(
        b: usize,
        heads: usize,
        kv: usize,
        s: usize,
        d: usize,
        config: BlockedAttention,
        masked: bool,
        dtype: DType,
    ) -> f32 {
        let causal = config.causal;
        let device = Device::Cpu;
        let var = |heads| {
            Var::from_tensor(&Tensor::randn(0f32, 1.0, (b, heads, s, d), &device).unwrap().to_dtype(dtype).unwrap())
                .unwrap()
        };
        let (q, k, v) = (var(heads), var(kv), var(kv));
        // a padding mask: the last keys of the second sample do not count
        let mask = masked.then(|| {
            let values: Vec<f32> = (0..b * s).map(|i| if i / s == 1 && i % s > s / 2 { -1e9 } else { 0.0 }).collect();
            Tensor::from_vec(values, (b, s), &device).unwrap()
        });
        let weights = Tensor::randn(0f32, 1.0, (b, heads, s, d), &device).unwrap().to_dtype(dtype).unwrap();
        let run = |blocked: bool| {
            let plain = config.window.is_none() && config.softcap.is_none() && config.scale.is_none();
            let out = if blocked {
                config.forward(q.as_tensor(), k.as_tensor(), v.as_tensor(), mask.as_ref()).unwrap()
            } else if plain {
                attention(q.as_tensor(), k.as_tensor(), v.as_tensor(), mask.as_ref(), causal).unwrap()
            } else {
                config.eager(q.as_tensor(), k.as_tensor(), v.as_tensor(), mask.as_ref()).unwrap()
            };
            let grads = (&out * &weights).unwrap().sum_all().unwrap().backward().unwrap();
            let f32 = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
            let grad = |var: &Var| f32(grads.get(var).expect("a gradient"));
            (f32(&out), grad(&q), grad(&k), grad(&v))
        };
        let (ours, theirs) = (run(true), run(false));
        [
            relative(&ours.0, &theirs.0),
            relative(&ours.1, &theirs.1),
            relative(&ours.2, &theirs.2),
            relative(&ours.3, &theirs.3),
        ]
        .into_iter()
        .fold(0.0, f32::max)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// Lengths that are not block multiples, a single token, grouped
        /// heads, a padding mask, causal or not: the output and every
        /// gradient equal the eager attention's within 1e-5 in f32.
        #[test]
        fn blocked_equals_eager(
            s in 1usize..40,
            block in 1usize..17,
            groups in prop::sample::select(vec![1usize, 2, 4]),
            kv in 1usize..3,
            d in prop::sample::select(vec![8usize, 12, 16]),
            causal: bool,
            masked: bool,
        ) {
            let error = compare(2, kv * groups, kv, s, d, block, causal, masked, DType::F32);
            prop_assert!(error <= 1e-5, "off by {error:e}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// Within a sliding window (shorter and longer than the blocks and
        /// the sequence), soft-capped or not, at a scale of its own: the
        /// blocked output and every gradient equal the eager ones within
        /// 1e-5 in f32, the key blocks a window hides skipped.
        #[test]
        fn blocked_equals_eager_within_a_window_and_a_soft_cap(
            s in 1usize..40,
            block in 1usize..17,
            groups in prop::sample::select(vec![1usize, 2]),
            window in prop::option::of(1usize..45),
            softcap in prop::option::of(prop::sample::select(vec![0.5f64, 2.0, 50.0])),
            scale in prop::option::of(prop::sample::select(vec![0.1f64, 0.25])),
            masked: bool,
        ) {
            let config = BlockedAttention { block, ..BlockedAttention::causal() }.window(window).softcap(softcap).scale(scale);
            // no padding mask within a window: a query whose whole window is padding has
            // scores of −1e9 and a log-sum-exp f32 cannot tell from them (−1e9 + ln 2 rounds
            // to −1e9); the decoders that slide pass no key mask
            let error = compare_with(2, 2 * groups, 2, s, 8, config, masked && window.is_none(), DType::F32);
            prop_assert!(error <= 1e-5, "off by {error:e}");
        }
    }

    /// The eager form, row by row as the definition reads: query `i` over
    /// keys `max(0, i − window + 1)..=i`, its scores `q·k · scale`
    /// soft-capped, their softmax, the values weighed.
    #[test]
    #[allow(clippy::needless_range_loop)] // indices, as the definition reads
    fn the_eager_form_within_a_window_is_the_definition() {
        let device = Device::Cpu;
        let (s, d, window, cap, scale) = (11usize, 4usize, 3usize, 1.5f64, 0.3f64);
        let q = Tensor::randn(0f32, 1.0, (1, 1, s, d), &device).unwrap();
        let (k, v) = (
            Tensor::randn(0f32, 1.0, (1, 1, s, d), &device).unwrap(),
            Tensor::randn(0f32, 1.0, (1, 1, s, d), &device).unwrap(),
        );
        let config = BlockedAttention::causal().window(Some(window)).softcap(Some(cap)).scale(Some(scale));
        let eager = config.eager(&q, &k, &v, None).unwrap();
        let blocked = config.block(2).forward(&q, &k, &v, None).unwrap();
        let [q, k, v] = [q, k, v].map(|t| t.squeeze(0).unwrap().squeeze(0).unwrap().to_vec2::<f32>().unwrap());
        for (i, q_i) in q.iter().enumerate() {
            let seen: Vec<usize> = (i.saturating_sub(window - 1)..=i).collect();
            let scores: Vec<f64> = seen
                .iter()
                .map(|&j| {
                    let dot: f64 = (0..d).map(|c| q_i[c] as f64 * k[j][c] as f64).sum::<f64>() * scale;
                    cap * (dot / cap).tanh()
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::MIN, f64::max);
            let weights: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for c in 0..d {
                let expected: f64 = seen.iter().zip(&weights).map(|(&j, w)| w / total * v[j][c] as f64).sum();
                for (form, out) in [("eager", &eager), ("blocked", &blocked)] {
                    let got =
                        out.get(0).unwrap().get(0).unwrap().get(i).unwrap().get(c).unwrap().to_scalar::<f32>().unwrap();
                    assert!((got as f64 - expected).abs() < 1e-5, "{form} at ({i}, {c}): {got} against {expected}");
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

        /// The last `c` queries over every key (a chunk whose earlier keys
        /// are cached, or one decoded token) see what the same rows of the
        /// whole causal attention see, blocked and eager, and the blocked
        /// form's gradients equal the eager one's.
        #[test]
        fn a_chunk_of_the_last_queries_sees_what_the_whole_does(
            s in 1usize..40,
            chunk_share in 0.0f64..1.0,
            block in 1usize..17,
            groups in prop::sample::select(vec![1usize, 2]),
        ) {
            let c = ((s as f64 * chunk_share) as usize).clamp(1, s);
            let device = Device::Cpu;
            let (heads, kv, d) = (2 * groups, 2, 8);
            let q = Var::from_tensor(&Tensor::randn(0f32, 1.0, (1, heads, s, d), &device).unwrap()).unwrap();
            let (k, v) = (Tensor::randn(0f32, 1.0, (1, kv, s, d), &device).unwrap(), Tensor::randn(0f32, 1.0, (1, kv, s, d), &device).unwrap());
            let config = BlockedAttention { block, ..BlockedAttention::causal() };
            let whole = config.forward(q.as_tensor(), &k, &v, None).unwrap().narrow(2, s - c, c).unwrap();
            let last = q.as_tensor().narrow(2, s - c, c).unwrap();
            let blocked = config.forward(&last, &k, &v, None).unwrap();
            let eager = attention(&last, &k, &v, None, true).unwrap();
            prop_assert!(relative(&blocked, &whole) <= 1e-5);
            prop_assert!(relative(&eager, &whole) <= 1e-5);
            let grad = |out: &Tensor| out.sum_all().unwrap().backward().unwrap().get(&q).unwrap().clone();
            prop_assert!(relative(&grad(&blocked), &grad(&eager)) <= 1e-5);
        }
    }

    #[test]
    fn more_queries_than_keys_are_refused_causally() {
        let q = Tensor::zeros((1, 1, 4, 8), DType::F32, &Device::Cpu).unwrap();
        let k = Tensor::zeros((1, 1, 3, 8), DType::F32, &Device::Cpu).unwrap();
        assert!(BlockedAttention::causal().forward(&q, &k, &k, None).is_err());
        assert!(attention(&q, &k, &k, None, true).is_err());
    }

    #[test]
    fn in_bf16_within_bf16s_tolerance() {
        // the eager form rounds its scores and weights to bf16; the blocked form keeps its softmax in f32
        let error = compare(2, 4, 2, 45, 16, 16, true, false, DType::BF16);
        assert!(error <= 3e-2, "off by {error:e}");
    }
}
