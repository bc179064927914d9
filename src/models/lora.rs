//! LoRA: low-rank adapters beside frozen projections (Hu et al. 2021, as the
//! PEFT library applies them): `W x + (α / r) · B A dropout(x)`, `A` of
//! `(r, in)`, `B` of `(out, r)` starting at zero, so that the adapted model
//! starts as the base.

use candle_core::{Module, Result, Tensor};

use crate::ops::{frozen_linear, matmul};

/// Which projections get adapters, and their rank, scale and dropout.
#[derive(Clone, Debug, PartialEq)]
pub struct Lora {
    /// The rank `r`.
    pub rank: usize,
    /// `α`: the adapters' update is scaled by `α / r`.
    pub alpha: f64,
    /// The modules adapted, by the last part of their checkpoint name
    /// (`q_proj`, `v_proj`; `c_attn` for GPT-2; `query`, `value` for BERT).
    pub targets: Vec<String>,
    /// Dropout on the adapter's input while training (0 for none).
    pub dropout: f32,
}

impl Lora {
    /// Rank `rank`, `α` = 2 × rank, on the family's query and value
    /// projections, no dropout (PEFT's usual settings).
    pub fn new(rank: usize, targets: &[&str]) -> Lora {
        Lora {
            rank,
            alpha: 2.0 * rank as f64,
            targets: targets.iter().map(|t| (*t).to_owned()).collect(),
            dropout: 0.0,
        }
    }

    /// Whether the module `name` (a checkpoint path) gets adapters.
    pub fn targets(&self, name: &str) -> bool {
        let last = name.rsplit('.').next().unwrap_or(name);
        self.targets.iter().any(|target| target == last)
    }

    /// `α / r`.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }
}

/// A frozen projection with trained LoRA adapters.
#[derive(Clone, Debug)]
pub struct LoraLinear {
    weight: Tensor,
    bias: Option<Tensor>,
    a: Tensor,
    b: Tensor,
    scale: f64,
    dropout: f32,
}

impl LoraLinear {
    /// Adapters `a` `(r, in)` and `b` `(out, r)` beside the frozen `weight`
    /// `(out, in)` and `bias`, the update scaled by `scale`, `dropout` on its input.
    pub fn new(weight: Tensor, bias: Option<Tensor>, a: Tensor, b: Tensor, scale: f64, dropout: f32) -> LoraLinear {
        LoraLinear { weight: weight.detach(), bias: bias.map(|b| b.detach()), a, b, scale, dropout }
    }
}

impl Module for LoraLinear {
    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let base = frozen_linear(xs, &self.weight, self.bias.as_ref())?;
        let input = if self.dropout > 0.0 { candle_nn::ops::dropout(xs, self.dropout)? } else { xs.clone() };
        let out = self.b.dim(0)?;
        let lead = &xs.dims()[..xs.rank() - 1];
        let rows = lead.iter().product::<usize>();
        // scaled at the rank (rows × r, small): the graph keeps every
        // intermediate until the backward pass, and one of rows × out is enough
        // the input may be outside the graph (after frozen layers only): no gradient for it then
        let down = (matmul(&input.reshape((rows, self.a.dim(1)?))?, &self.a.t()?)? * self.scale)?;
        let up = matmul(&down, &self.b.t()?)?;
        let mut shape = lead.to_vec();
        shape.push(out);
        super::layers::residual(&base, &up.reshape(shape)?)
    }
}
