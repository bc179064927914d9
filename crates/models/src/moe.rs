//! A mixture of experts in place of a decoder's MLP (Mixtral, Qwen3-MoE):
//! a router scores every expert for each token, each token goes to its top
//! `k`, each expert runs its gated MLP on the tokens sent to it (gathered,
//! computed, summed back by the router's weights), as transformers 5
//! computes it. Never a dense (tokens × experts × intermediate) tensor: an
//! expert's products are as large as its share of the batch.
//!
//! Where the tokens go is the router's choice, or forced to the costliest
//! routing ([`Routing::Worst`]): the memory a step holds depends on it, the
//! weights and the loss's path do not.

use std::sync::Mutex;

use candle_core::{D, DType, Module, Result, Tensor};

use crate::config::{Config, Experts};
use crate::layers::{Forms, Layout, Proj};
use crate::lora::Lora;
use crate::ops::{self, Activation};
use crate::per_token::{PerToken, Widths};
use crate::weights::{Init, TensorSpec, Weights};
use crate::{Ops, Routing};

const STD: f32 = 0.02;

/// A sparse layer's tensors: the router, then each expert's gate, up and
/// down projections, under the checkpoint's names.
pub(crate) fn tensors(config: &Config, experts: &Experts, layer: usize) -> Vec<TensorSpec> {
    let module = format!("model.layers.{layer}.{}", experts.names.module());
    let mut specs =
        vec![TensorSpec::new(format!("{module}.gate.weight"), &[experts.count, config.hidden], Init::Normal(STD))];
    specs.extend(
        projections(config, experts, layer)
            .into_iter()
            .map(|(name, out, input)| TensorSpec::new(format!("{name}.weight"), &[out, input], Init::Normal(STD))),
    );
    if experts.shared.is_some() {
        specs.push(TensorSpec::new(
            format!("{module}.shared_expert_gate.weight"),
            &[1, config.hidden],
            Init::Normal(STD),
        ));
    }
    specs
}

/// A sparse layer's projections LoRA can adapt (its experts'), by
/// checkpoint name, with their (out, in); the router is not one.
pub(crate) fn projections(config: &Config, experts: &Experts, layer: usize) -> Vec<(String, usize, usize)> {
    let (h, i) = (config.hidden, experts.intermediate);
    let [gate, up, down] = experts.names.projections();
    let module = format!("model.layers.{layer}.{}", experts.names.module());
    let mut all: Vec<(String, usize, usize)> = (0..experts.count)
        .flat_map(|expert| {
            let at = |name: &str| format!("{module}.experts.{expert}.{name}");
            [(at(gate), i, h), (at(up), i, h), (at(down), h, i)]
        })
        .collect();
    if let Some(shared) = experts.shared {
        let at = |name: &str| format!("{module}.shared_expert.{name}");
        all.extend([(at(gate), shared, h), (at(up), shared, h), (at(down), h, shared)]);
    }
    all
}

/// A sparse MLP's tensors per token (the layer's input norm and attention
/// aside): the router's logits and probabilities (in f32), the chosen
/// weights; each of the token's `k` rows gathered, its gate and up products
/// (the activation too, eager), its expert's output (joined and weighted
/// too, eager); the sum back into the stream. The backward pass's widest moment is an
/// expert's halves' gradients: as many rows as the batch's tokens for the
/// experts the worst routing loads, `k / E` of them routed evenly, beside
/// the joined rows' gradient split to the experts.
pub(crate) fn block_bytes(experts: &Experts, w: &Widths) -> PerToken {
    let (d, e, k, i) = (w.d, experts.count as f64, experts.per_token as f64, experts.intermediate as f64);
    let widened = if d == 4.0 { 0.0 } else { e * 4.0 + k * d };
    let router = e * d + widened + e * 4.0 + 3.0 * k * 4.0 + k * d;
    // gathered, gate and up, the expert's output; eager: the activation and
    // the product, the outputs joined and weighted
    let rows = k * (2.0 * w.h * d + 2.0 * i * d) + if w.fused { 0.0 } else { k * (2.0 * i * d + 2.0 * w.h * d) };
    let share = if w.worst_routing { 1.0 } else { (k / e).min(1.0) };
    let halves = if w.fused { 2.0 * share * i * d } else { 8.0 * share * i * d };
    let sparse = PerToken { kept: router + rows + w.h * d, backward: halves + 2.0 * k * w.h * d };
    match experts.shared {
        // gate and up (the activation too, eager), the output, its gate's sigmoid, the
        // scaled output and the sum; its own halves' gradients for every token
        Some(shared) => {
            let s = shared as f64;
            let activation = if w.fused { 0.0 } else { 2.0 * s * d };
            let kept = 2.0 * s * d + activation + 3.0 * w.h * d + 2.0 * d;
            PerToken { kept: sparse.kept + kept, backward: sparse.backward.max(w.mlp_backward_of(s, false)) }
        }
        None => sparse,
    }
}

/// One expert: a gated MLP.
struct Expert {
    gate: Proj,
    up: Proj,
    down: Proj,
}

/// A sparse MLP over its weights.
pub(crate) struct SparseMlp {
    router: Proj,
    experts: Vec<Expert>,
    /// The shared expert and its gate (Qwen2-MoE).
    shared: Option<(Expert, Proj)>,
    per_token: usize,
    normalized: bool,
    activation: Activation,
    forms: Forms,
}

impl SparseMlp {
    pub(crate) fn new(
        experts: &Experts,
        layer: usize,
        weights: &Weights,
        lora: Option<&Lora>,
        activation: Activation,
        forms: Forms,
    ) -> Result<SparseMlp> {
        let module = format!("model.layers.{layer}.{}", experts.names.module());
        let [gate, up, down] = experts.names.projections();
        let proj = |name: String| Proj::new(weights, &name, Layout::OutIn, lora, forms.ops);
        Ok(SparseMlp {
            router: Proj::unadapted(weights, &format!("{module}.gate"), Layout::OutIn, lora, forms.ops)?,
            experts: (0..experts.count)
                .map(|expert| {
                    let at = |name: &str| format!("{module}.experts.{expert}.{name}");
                    Ok(Expert { gate: proj(at(gate))?, up: proj(at(up))?, down: proj(at(down))? })
                })
                .collect::<Result<_>>()?,
            shared: match experts.shared {
                Some(_) => {
                    let at = |name: &str| format!("{module}.shared_expert.{name}");
                    let expert = Expert { gate: proj(at(gate))?, up: proj(at(up))?, down: proj(at(down))? };
                    let gate = Proj::unadapted(
                        weights,
                        &format!("{module}.shared_expert_gate"),
                        Layout::OutIn,
                        lora,
                        forms.ops,
                    )?;
                    Some((expert, gate))
                }
                None => None,
            },
            per_token: experts.per_token,
            normalized: experts.normalized,
            activation,
            forms,
        })
    }

    /// `residual + self(h)` for `h` `(b, s, hidden)` (the sum alone without
    /// a residual: an output normed before it joins the stream); with
    /// `stats`, the router's probabilities and its own choice pushed there
    /// (for the load-balancing loss).
    pub(crate) fn forward(
        &self,
        h: &Tensor,
        residual: Option<&Tensor>,
        stats: Option<&Mutex<Vec<RouterStats>>>,
    ) -> Result<Tensor> {
        let (dims, device) = (h.dims().to_vec(), h.device());
        let hidden = h.dim(D::Minus1)?;
        let flat = h.reshape(((), hidden))?;
        let tokens = flat.dim(0)?;
        // the router's probabilities in f32, as transformers takes them
        let logits = self.router.forward(&flat)?.to_dtype(DType::F32)?;
        let probs = match self.forms.ops {
            Ops::Fused => ops::softmax_last_dim(&logits)?,
            Ops::Eager => candle_nn::ops::softmax(&logits, D::Minus1)?,
        };
        let chosen = self.choose(&probs, stats)?;
        // each expert's rows, in the experts' order: (token, its slot among the token's k)
        let mut sent: Vec<Vec<(u32, u32)>> = vec![Vec::new(); self.experts.len()];
        for (token, experts) in chosen.iter().enumerate() {
            for (slot, &expert) in experts.iter().enumerate() {
                sent[expert].push((token as u32, (token * self.per_token + slot) as u32));
            }
        }
        let mut outputs = Vec::new();
        for (expert, rows) in self.experts.iter().zip(&sent).filter(|(_, rows)| !rows.is_empty()) {
            let ids = Tensor::from_vec(rows.iter().map(|row| row.0).collect::<Vec<_>>(), rows.len(), device)?;
            outputs.push(expert.forward(&flat.index_select(&ids, 0)?, self.activation)?);
        }
        let order: Vec<(u32, u32)> = sent.into_iter().flatten().collect();
        let token_of = Tensor::from_vec(order.iter().map(|row| row.0).collect::<Vec<_>>(), order.len(), device)?;
        let slot_of = Tensor::from_vec(order.iter().map(|row| row.1).collect::<Vec<_>>(), order.len(), device)?;
        let weights = self.chosen_weights(&probs, &chosen)?.to_dtype(h.dtype())?.index_select(&slot_of, 0)?;
        let base = match residual {
            Some(residual) => residual.reshape((tokens, hidden))?,
            None => Tensor::zeros((tokens, hidden), h.dtype(), device)?,
        };
        let summed = match self.forms.ops {
            Ops::Fused => ops::routed_sum(&base, &outputs, &weights, &token_of)?,
            Ops::Eager => ops::routed_sum_eager(&base, &outputs, &weights, &token_of)?,
        };
        let summed = match &self.shared {
            // every token through the shared expert, scaled by the sigmoid of its gate
            Some((expert, gate)) => {
                let scale = candle_nn::ops::sigmoid(&gate.forward(&flat)?)?;
                ops::residual(&summed, &expert.forward(&flat, self.activation)?.broadcast_mul(&scale)?)?
            }
            None => summed,
        };
        summed.reshape(dims)
    }

    /// Each token's `k` experts: the router's top `k`, or the worst routing;
    /// with `stats`, the router's own choice counted there beside its
    /// probabilities.
    fn choose(&self, probs: &Tensor, stats: Option<&Mutex<Vec<RouterStats>>>) -> Result<Vec<Vec<usize>>> {
        let own = match (self.forms.routing, stats) {
            (Routing::Router, _) | (Routing::Worst, Some(_)) => Some(top_k(&probs.to_vec2::<f32>()?, self.per_token)),
            (Routing::Worst, None) => None,
        };
        if let (Some(stats), Some(own)) = (stats, &own) {
            let mut counts = vec![0f32; self.experts.len()];
            for &expert in own.iter().flatten() {
                counts[expert] += 1.0;
            }
            let mut stats = stats.lock().map_err(|_| candle_core::Error::Msg("the router's statistics".into()))?;
            stats.push(RouterStats { probs: probs.clone(), counts });
        }
        Ok(match (self.forms.routing, own) {
            (Routing::Router, Some(own)) => own,
            _ => worst(probs.dim(0)?, self.experts.len(), self.per_token),
        })
    }

    /// The chosen experts' probabilities `(tokens · k)`, token by token,
    /// renormalized over the chosen where the family does.
    fn chosen_weights(&self, probs: &Tensor, chosen: &[Vec<usize>]) -> Result<Tensor> {
        let index: Vec<u32> = chosen.iter().flatten().map(|&expert| expert as u32).collect();
        let index = Tensor::from_vec(index, (chosen.len(), self.per_token), probs.device())?;
        let top = probs.gather(&index, 1)?;
        let top = if self.normalized { top.broadcast_div(&top.sum_keepdim(1)?)? } else { top };
        top.flatten_all()
    }
}

impl Expert {
    /// `down(activation(gate(x)) · up(x))`, the down projection one node.
    fn forward(&self, x: &Tensor, activation: Activation) -> Result<Tensor> {
        self.down.activated(activation, &self.gate.forward(x)?, Some(&self.up.forward(x)?))
    }
}

/// One sparse layer's router in a forward pass: its probabilities `(tokens,
/// experts)` (in the graph) and how many of its own top-`k` choices went to
/// each expert.
pub(crate) struct RouterStats {
    probs: Tensor,
    counts: Vec<f32>,
}

/// transformers' `load_balancing_loss_func` over every sparse layer's
/// router, times `weight`: the experts times the sum over experts of the
/// share of choices it got and its mean probability, over all the layers'
/// tokens together (no attention mask). Its gradient reaches the routers
/// through the probabilities; the choices count as constants.
pub(crate) fn load_balancing_loss(stats: &[RouterStats], weight: f64) -> Result<Tensor> {
    let Some(first) = stats.first() else { candle_core::bail!("the load-balancing loss of no sparse layer") };
    let experts = first.counts.len();
    let probs = Tensor::cat(&stats.iter().map(|stat| stat.probs.clone()).collect::<Vec<_>>(), 0)?;
    let rows = probs.dim(0)? as f64;
    let mut counts = vec![0f32; experts];
    for stat in stats {
        for (total, count) in counts.iter_mut().zip(&stat.counts) {
            *total += count;
        }
    }
    let counts = Tensor::from_vec(counts, experts, probs.device())?;
    let per_expert = probs.sum(0)?.mul(&counts)?;
    per_expert.sum_all()? * (weight * experts as f64 / (rows * rows))
}

/// Each row's `k` most probable experts, the most probable first.
fn top_k(probs: &[Vec<f32>], k: usize) -> Vec<Vec<usize>> {
    probs
        .iter()
        .map(|row| {
            let mut experts: Vec<usize> = (0..row.len()).collect();
            experts.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
            experts.truncate(k);
            experts
        })
        .collect()
}

/// The costliest routing of `tokens` tokens over `count` experts, `k` each:
/// every token to experts `0..k` but the first few, which go to the others
/// `k` at a time, so that every expert computes (its gradient exists, as in
/// a step on real data) and `k` experts take all but a few tokens (their
/// products as large as the batch). With fewer tokens than that takes, the
/// last experts get none.
pub(crate) fn worst(tokens: usize, count: usize, k: usize) -> Vec<Vec<usize>> {
    let hot: Vec<usize> = (0..k).collect();
    let others: Vec<usize> = (k..count).collect();
    let mut groups: Vec<Vec<usize>> = others.chunks(k).map(<[usize]>::to_vec).collect();
    // a short last group filled from the hot experts: each token's k distinct
    if let Some(last) = groups.last_mut() {
        last.extend(hot.iter().take(k - last.len()));
    }
    (0..tokens).map(|token| groups.get(token).cloned().unwrap_or_else(|| hot.clone())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_routing_covers_every_expert_and_loads_k_of_them() {
        for (tokens, count, k) in [(64, 8, 2), (100, 128, 8), (3, 8, 2), (10, 7, 3), (5, 4, 4)] {
            let routing = worst(tokens, count, k);
            assert_eq!(routing.len(), tokens);
            let mut load = vec![0usize; count];
            for experts in &routing {
                let mut distinct = experts.clone();
                distinct.sort_unstable();
                distinct.dedup();
                assert_eq!(distinct.len(), k, "{experts:?}: k distinct experts a token");
                for &e in experts {
                    load[e] += 1;
                }
            }
            let groups = (count - k).div_ceil(k);
            if tokens > groups {
                assert!(load.iter().all(|&n| n > 0), "{load:?}: every expert computes");
            }
            let hot = tokens.saturating_sub(groups);
            assert!(load[..k].iter().all(|&n| n >= hot), "{load:?}: the first k take all but {groups} tokens");
        }
    }

    #[test]
    fn the_router_takes_the_k_most_probable() {
        let probs = vec![vec![0.1, 0.5, 0.3, 0.1], vec![0.4, 0.1, 0.1, 0.4]];
        assert_eq!(top_k(&probs, 2), [vec![1, 2], vec![0, 3]]);
    }
}
