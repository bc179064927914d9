//! LoRA: low-rank adapters beside frozen projections (Hu et al. 2021, as the
//! PEFT library applies them): `W x + (α / r) · B A dropout(x)`, `A` of
//! `(r, in)`, `B` of `(out, r)` starting at zero, so that the adapted model
//! starts as the base.

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Module, Result, Tensor};

use crate::ops::{FrozenLinear, matmul};

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
    /// The frozen base's dtype, and with it f32 adapters; `None`: the base
    /// and the adapters in the model's dtype (a model written with one
    /// dtype). See [`BaseDtype`].
    pub base: Option<BaseDtype>,
    /// Run the frozen projections through candle's own matmul, which keeps
    /// a gradient the size of every frozen weight in the gradient store (as
    /// a model written with `candle_nn::Linear` does): what the fix saves,
    /// measured. A dense base only.
    pub frozen_gradients: bool,
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
            base: None,
            frozen_gradients: false,
        }
    }

    /// With the frozen base in `base` and the adapters in f32.
    pub fn base(mut self, base: BaseDtype) -> Lora {
        self.base = Some(base);
        self
    }

    /// The adapters' dtype in a model of `model` dtype: f32 beside a base of
    /// its own dtype (PEFT's default), else the model's.
    pub fn adapter_dtype(&self, model: DType) -> DType {
        if self.base.is_some() { DType::F32 } else { model }
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

/// The dtype of a LoRA model's frozen base: what `--base-dtype` names.
///
/// A float base (`f32`, `bf16`) holds every frozen tensor, and the
/// activations, in that dtype; a quantized one (`q8_0`, `q4_0`: QLoRA on
/// candle) holds the layers' projections in candle's quantized blocks and
/// the rest (embeddings, norms, the head) in the model's dtype. Either way
/// the adapters are f32, the input cast at their boundary and their update
/// cast back, and the loss is computed in f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BaseDtype {
    /// 4 bytes per parameter.
    F32,
    /// 2 bytes per parameter.
    Bf16,
    /// Blocks of 32 int8 values and an f16 scale: 34 / 32 = 1.0625 bytes per parameter.
    Q8_0,
    /// Blocks of 32 4-bit values and an f16 scale: 18 / 32 = 0.5625 bytes per parameter.
    Q4_0,
}

impl BaseDtype {
    /// Every base dtype, as `--base-dtype` lists them.
    pub const ALL: [BaseDtype; 4] = [BaseDtype::F32, BaseDtype::Bf16, BaseDtype::Q8_0, BaseDtype::Q4_0];

    /// `f32`, `bf16`, `q8_0`, `q4_0`.
    pub fn name(self) -> &'static str {
        match self {
            BaseDtype::F32 => "f32",
            BaseDtype::Bf16 => "bf16",
            BaseDtype::Q8_0 => "q8_0",
            BaseDtype::Q4_0 => "q4_0",
        }
    }

    /// The dtype of a float base.
    pub fn float(self) -> Option<DType> {
        match self {
            BaseDtype::F32 => Some(DType::F32),
            BaseDtype::Bf16 => Some(DType::BF16),
            BaseDtype::Q8_0 | BaseDtype::Q4_0 => None,
        }
    }

    /// candle's quantized type of a quantized base.
    pub fn quantized(self) -> Option<GgmlDType> {
        match self {
            BaseDtype::Q8_0 => Some(GgmlDType::Q8_0),
            BaseDtype::Q4_0 => Some(GgmlDType::Q4_0),
            BaseDtype::F32 | BaseDtype::Bf16 => None,
        }
    }

    /// Bytes per parameter of a projection's weight stored in this dtype.
    pub fn bytes_per_parameter(self) -> f64 {
        match self.quantized() {
            Some(quantized) => quantized.type_size() as f64 / quantized.block_size() as f64,
            None => self.float().map_or(4, |dtype| dtype.size_in_bytes()) as f64,
        }
    }
}

impl std::fmt::Display for BaseDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for BaseDtype {
    type Err = crate::Error;

    /// `f32`, `bf16`, `q8_0` or `q4_0` (case-insensitive).
    fn from_str(text: &str) -> std::result::Result<BaseDtype, crate::Error> {
        BaseDtype::ALL.into_iter().find(|base| base.name().eq_ignore_ascii_case(text)).ok_or_else(|| {
            crate::Error::invalid(
                crate::Setting::BaseDtype,
                autobatch::Value::Text(text.to_owned()),
                "use f32, bf16, q8_0 or q4_0",
            )
        })
    }
}

/// A frozen projection with trained LoRA adapters.
#[derive(Clone, Debug)]
pub struct LoraLinear {
    base: FrozenLinear,
    /// candle's own matmul under the base (keeps the weight's gradient).
    plain: bool,
    a: Tensor,
    b: Tensor,
    scale: f64,
    dropout: f32,
}

impl LoraLinear {
    /// Adapters `a` `(r, in)` and `b` `(out, r)` beside the frozen `weight`
    /// `(out, in)` and `bias`, the update scaled by `scale`, `dropout` on its input.
    pub fn new(weight: Tensor, bias: Option<Tensor>, a: Tensor, b: Tensor, scale: f64, dropout: f32) -> LoraLinear {
        LoraLinear::over(FrozenLinear::new(weight, bias), a, b, scale, dropout)
    }

    /// Adapters over any frozen projection (a quantized one too). The
    /// adapters may have a dtype of their own: the input is cast to it and
    /// their update back to the input's.
    pub fn over(base: FrozenLinear, a: Tensor, b: Tensor, scale: f64, dropout: f32) -> LoraLinear {
        LoraLinear { base, plain: false, a, b, scale, dropout }
    }

    /// The base through candle's own matmul, which keeps a gradient of the
    /// frozen weight (a dense base only): what the fix saves, measured.
    pub(crate) fn keeping_frozen_gradients(mut self) -> LoraLinear {
        self.plain = self.base.weight().is_some();
        self
    }

    /// `[residual +] self(xs)` as one node ([`lora_linear`](crate::ops::lora_linear)),
    /// where it can be: without dropout (its mask would have to be kept),
    /// not through candle's own product.
    pub(crate) fn fused(&self, residual: Option<&Tensor>, xs: &Tensor) -> Option<Result<Tensor>> {
        let fusable = self.dropout == 0.0 && !self.plain;
        fusable.then(|| crate::ops::lora_linear(residual, xs, &self.base, &self.a, &self.b, self.scale))
    }
}

impl Module for LoraLinear {
    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        let base = match (self.plain, self.base.weight()) {
            (true, Some(weight)) => crate::ops::eager::linear(xs, weight, self.base.bias())?,
            _ => self.base.forward(xs)?,
        };
        // the adapters' own dtype (f32 beside a bf16 or quantized base): cast at the boundary
        let input = xs.to_dtype(self.a.dtype())?;
        let input = if self.dropout > 0.0 { candle_nn::ops::dropout(&input, self.dropout)? } else { input };
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
        crate::ops::residual(&base, &up.reshape(shape)?.to_dtype(base.dtype())?)
    }
}
