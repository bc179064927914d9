//! What one token's tensors weigh in a training step: a layer's widths and
//! its dtypes' bytes, and the bytes per token the forward pass keeps and the
//! backward pass holds beside them. The vocabulary every family counts its
//! block in ([`Config::step_memory`](crate::Config::step_memory) adds them up).

/// Bytes per token of the tensors the forward pass keeps, and of the widest
/// moment of the backward pass beside them.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PerToken {
    pub(crate) kept: f64,
    pub(crate) backward: f64,
}

impl std::ops::Add for PerToken {
    type Output = PerToken;

    fn add(self, other: PerToken) -> PerToken {
        PerToken { kept: self.kept + other.kept, backward: self.backward + other.backward }
    }
}

/// The widths a layer's tensors have, and their dtypes' bytes.
pub(crate) struct Widths {
    pub(crate) h: f64,
    pub(crate) q: f64,
    pub(crate) kv: f64,
    pub(crate) i: f64,
    pub(crate) vocab: f64,
    pub(crate) heads: f64,
    /// The model's dtype (weights, activations).
    pub(crate) d: f64,
    /// Whether norms compute in f32 beside a 16-bit dtype (a copy each way).
    pub(crate) widened: bool,
    /// The fused ops ([`Ops::Fused`](crate::Ops::Fused)): each one tensor kept.
    pub(crate) fused: bool,
    /// A mixture of experts routed the worst way ([`Routing::Worst`](crate::Routing::Worst)).
    pub(crate) worst_routing: bool,
}

impl Widths {
    /// An RMS norm of width `w` (candle-nn's `rms_norm_slow`: squared,
    /// divided, scaled; in f32 for a 16-bit input).
    pub(crate) fn rms_norm(&self, w: f64) -> f64 {
        if self.fused {
            w * self.d
        } else if self.widened {
            4.0 * w * 3.0 + 2.0 * w * 2.0
        } else {
            3.0 * w * self.d
        }
    }

    /// A layer norm of width `w` (candle-nn's `layer_norm_slow`: centred,
    /// squared, divided, scaled, shifted).
    pub(crate) fn layer_norm(&self, w: f64) -> f64 {
        if self.fused {
            w * self.d
        } else if self.widened {
            4.0 * w * 4.0 + 2.0 * w * 3.0
        } else {
            5.0 * w * self.d
        }
    }

    /// A projection to `out` features: the product, and the bias added
    /// (one tensor fused).
    pub(crate) fn linear(&self, out: f64, bias: bool) -> f64 {
        out * self.d * if bias && !self.fused { 2.0 } else { 1.0 }
    }

    /// A projection to `out` features added to the residual stream: the
    /// product (with its bias) and the sum, one tensor fused.
    pub(crate) fn residual_linear(&self, out: f64, bias: bool) -> f64 {
        if self.fused { out * self.d } else { self.linear(out, bias) + out * self.d }
    }

    /// Heads split from a projection's output and made contiguous: a copy of
    /// `w`, none fused (the heads are views).
    pub(crate) fn heads(&self, w: f64) -> f64 {
        if self.fused { 0.0 } else { w * self.d }
    }

    /// The widest moment of the backward pass through the MLP: eager, the
    /// gradients of its intermediates with their sums (GELU's backward
    /// about twice SiLU's temporaries, with the attention's beside); fused,
    /// the gradients of its two halves (or of one with GELU), the
    /// activation's recomputed a block of rows at a time.
    pub(crate) fn mlp_backward(&self, gelu: bool) -> f64 {
        self.mlp_backward_of(self.i, gelu)
    }

    /// [`mlp_backward`](Self::mlp_backward) of an MLP `i` wide.
    pub(crate) fn mlp_backward_of(&self, i: f64, gelu: bool) -> f64 {
        let w = self;
        match (w.fused, gelu) {
            (false, true) => 16.0 * i * w.d + 12.0 * w.h * w.d,
            (false, false) => 8.0 * i * w.d,
            (true, true) => 2.0 * i * w.d + 4.0 * w.h * w.d,
            (true, false) => 2.0 * i * w.d,
        }
    }
}
