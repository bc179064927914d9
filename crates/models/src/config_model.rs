//! [`ConfigModel`]: the model a `config.json` describes, built with
//! deterministic weights, its loss, its training step and its sizes.

use candle_core::{DType, Device, Tensor};
use candle_nn::VarMap;

use crate::families::{Network, bert};
use crate::family::Family;
use crate::ops::ChunkedCrossEntropy;
use crate::splitmix::Rng;
use crate::trainer::{Model, Trainer};
use crate::weights::{TensorSpec, Weights};
use crate::{BertHead, Config, Error, Loss, Training, checkpoint, layers, ops};

/// An error met building a model: candle's own is the model's
/// ([`autobatch::Error::ModelBuild`]), the rest as they are.
pub(crate) fn building(err: Error) -> Error {
    match err {
        Error::Core(autobatch::Error::Candle(source)) => autobatch::Error::ModelBuild(source).into(),
        other => other,
    }
}

/// The network of a config over its weights, as its family builds it.
pub(crate) fn build_network(config: &Config, weights: &Weights, training: &Training) -> candle_core::Result<Network> {
    let forms = layers::Forms { attention: training.attention, ops: training.ops, routing: training.routing };
    config.family.architecture().network(config, weights, training.lora.as_ref(), forms)
}

/// A model built from its config, with deterministic weights: a `VarMap` of
/// what trains and the loss it trains with (see the [crate](crate) docs).
pub struct ConfigModel {
    config: Config,
    training: Training,
    weights: Weights,
    network: Network,
    /// With checkpointing: the same network over detached weights, whose
    /// forward pass records no graph.
    frozen: Option<Network>,
    dtype: DType,
    device: Device,
    /// The sequence length it was built for: the longest it steps at.
    longest: usize,
    /// Checkpoint tensors left unused, as transformers leaves them.
    ignored: Vec<String>,
}

impl ConfigModel {
    /// Builds `config` for `training` on `device`. Refused before anything
    /// is allocated: a sequence past the model's positions or its sliding
    /// window, an unknown LoRA target, a dtype other than f32 or bf16.
    pub fn build(config: &Config, training: &Training, device: &Device) -> Result<ConfigModel, Error> {
        ConfigModel::assemble(config, training, device, None).map_err(crate::building)
    }

    /// [`build`](Self::build) over given weights, by their checkpoint names
    /// (what `candle_core::safetensors::load` of the model's files returns);
    /// LoRA adapters not among them start as `build` starts them. A missing
    /// tensor or a shape other than the config's is an error naming it.
    ///
    /// ```
    /// use autobatch_models::{Config, ConfigModel, Training};
    /// let config = Config::from_json(r#"{"model_type": "gpt2", "vocab_size": 16, "n_embd": 8, "n_layer": 1, "n_head": 2, "n_positions": 8}"#)?;
    /// let random = ConfigModel::build(&config, &Training::new(4), &candle_core::Device::Cpu)?;
    /// let tensors = random.varmap().data().lock().unwrap().iter().map(|(n, v)| (n.clone(), v.as_tensor().clone())).collect();
    /// let loaded = ConfigModel::from_tensors(&config, &Training::new(4), tensors, &candle_core::Device::Cpu)?;
    /// let ids = candle_core::Tensor::new(&[[1u32, 2, 3, 4]], &candle_core::Device::Cpu)?;
    /// assert_eq!(loaded.forward(&ids)?.to_vec3::<f32>()?, random.forward(&ids)?.to_vec3::<f32>()?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_tensors(
        config: &Config,
        training: &Training,
        tensors: std::collections::HashMap<String, Tensor>,
        device: &Device,
    ) -> Result<ConfigModel, Error> {
        ConfigModel::assemble(config, training, device, Some(tensors)).map_err(crate::building)
    }

    /// [`from_tensors`](Self::from_tensors) of the model's safetensors files.
    pub fn from_safetensors(
        config: &Config,
        training: &Training,
        files: &[impl AsRef<std::path::Path>],
        device: &Device,
    ) -> Result<ConfigModel, Error> {
        let mut tensors = std::collections::HashMap::new();
        for file in files {
            tensors.extend(candle_core::safetensors::load(file.as_ref(), device)?);
        }
        ConfigModel::from_tensors(config, training, tensors, device)
    }

    fn assemble(
        config: &Config,
        training: &Training,
        device: &Device,
        given: Option<std::collections::HashMap<String, Tensor>>,
    ) -> Result<ConfigModel, Error> {
        config.check_seq_len(training.seq_len)?;
        let dtype = config.model_dtype(training)?;
        crate::trainer::check_dtype(dtype)?;
        let adapter_dtype = training.lora.as_ref().map_or(dtype, |lora| lora.adapter_dtype(dtype));
        let dtype_of = |name: &str| if name.contains(".lora_") { adapter_dtype } else { dtype };
        let mut specs = config.tensors();
        let trains_everything = training.lora.is_none();
        if let Some(lora) = &training.lora {
            specs.extend(config.adapters(lora)?);
        }
        // a tensor transformers keeps and does not use (an untied BERT head's old bias) never learns
        let unused = config.unused_tensors();
        let trained = |name: &str| (trains_everything && !unused.contains(&name)) || name.contains(".lora_");
        let mut ignored = Vec::new();
        let weights = match given {
            None => Weights::build(&specs, training.seed, dtype_of, device, trained)?,
            Some(given) => {
                let names: Vec<String> = specs.iter().map(|spec| spec.name.clone()).collect();
                let mut matched = checkpoint::match_names(config, &names, given)?;
                ignored = matched.ignored;
                // adapters and a new classifier a checkpoint does not hold start as they start in build
                let mut fresh_specs = specs.clone();
                fresh_specs.retain(|spec| {
                    (spec.name.contains(".lora_") || checkpoint::starts_fresh(config, &spec.name))
                        && !matched.tensors.contains_key(&spec.name)
                });
                let fresh = Weights::build(&fresh_specs, training.seed, dtype_of, device, |_| false)?;
                let source = |spec: &TensorSpec| match matched.tensors.remove(&spec.name) {
                    Some(tensor) => Ok(tensor),
                    None if fresh.maybe(&spec.name).is_some() => fresh.get(&spec.name),
                    None => Err(candle_core::Error::Msg(format!(
                        "the checkpoint has no tensor {}",
                        checkpoint::both_spellings(config.family, &spec.name)
                    ))),
                };
                Weights::from_source(&specs, dtype_of, source, trained)?
            }
        };
        if !ignored.is_empty() {
            log::info!("checkpoint tensors left unused, as transformers leaves them: {}", ignored.join(", "));
        }
        let mut weights = weights;
        if let Some(quantized) = training.lora.as_ref().and_then(|lora| lora.base?.quantized()) {
            for (name, _, _) in config.projections() {
                weights.quantize(
                    &format!("{name}.weight"),
                    config.family.architecture().weights_in_out(),
                    quantized,
                )?;
            }
        }
        let network = build_network(config, &weights, training)?;
        let frozen = match (training.checkpointing, config.family.checkpoints()) {
            (false, _) => None,
            (true, false) => {
                return Err(Error::invalid(
                    crate::Setting::ConfigKey("model_type".to_owned()),
                    autobatch::Value::Text(config.family.model_type().to_owned()),
                    format!("use a decoder ({}) for gradient checkpointing", Family::listed(Family::checkpoints)),
                ));
            }
            // the routers' loss needs every layer's probabilities in one graph
            (true, true) if config.experts.as_ref().is_some_and(|experts| experts.aux_loss.is_some()) => {
                return Err(Error::invalid(
                    crate::Setting::ConfigKey("output_router_logits".to_owned()),
                    autobatch::Value::Text("true, with gradient checkpointing".to_owned()),
                    "use false with checkpointing (the routers' load-balancing loss is computed without it)",
                ));
            }
            (true, true) => Some(build_network(config, &weights.detached(), training)?),
        };
        Ok(ConfigModel {
            config: config.clone(),
            training: training.clone(),
            weights,
            network,
            frozen,
            dtype,
            device: device.clone(),
            longest: training.seq_len,
            ignored,
        })
    }

    /// The checkpoint's tensors it left unused as transformers leaves them
    /// (a tied head's copy, buffers, another task's head), each with why.
    pub fn ignored_tensors(&self) -> &[String] {
        &self.ignored
    }

    /// The loss transformers computes for `model(input_ids, labels=labels).loss`,
    /// in f32, on `input_ids` `(b, s)` and `labels` (i64, `-100` ignored):
    /// a decoder's next-token loss, `labels` `(b, s)` shifted inside (the
    /// logits at position t against `labels[t + 1]`: s tokens give s − 1
    /// predictions); BERT's masked-LM loss, `labels` `(b, s)` with `-100`
    /// everywhere but the masked positions; a BERT classifier's, `labels`
    /// `(b)`. The mean over the labels not ignored.
    pub fn loss_of(&self, input_ids: &Tensor, labels: &Tensor) -> Result<Tensor, Error> {
        let (b, s) = input_ids.dims2()?;
        let labels_host = labels.to_dtype(DType::I64)?.flatten_all()?.to_vec1::<i64>()?;
        if let Network::Bert(network) = &self.network
            && !network.predicts_tokens()
        {
            let logits = network.forward(input_ids)?;
            let targets = Tensor::from_vec(labels_host.iter().map(|&l| l as u32).collect(), b, &self.device)?;
            return Ok(layers::cross_entropy(&logits, &targets)?);
        }
        if labels_host.len() != b * s {
            return Err(Error::invalid(
                crate::Setting::Labels,
                autobatch::Value::Count(labels_host.len()),
                format!("give one label per input token, {b} × {s}"),
            ));
        }
        let shift = usize::from(!matches!(self.network, Network::Bert(_)));
        let (mut rows, mut targets) = (Vec::new(), Vec::new());
        for sample in 0..b {
            for position in 0..s.saturating_sub(shift) {
                let label = labels_host[sample * s + position + shift];
                if label == ops::IGNORE_INDEX {
                    continue;
                }
                let vocab = self.config.vocab as i64;
                if !(0..vocab).contains(&label) {
                    return Err(Error::invalid(
                        crate::Setting::Labels,
                        autobatch::Value::Text(label.to_string()),
                        format!("a token id below the vocabulary, {vocab}, or -100 to ignore the position"),
                    ));
                }
                rows.push((sample * s + position) as u32);
                targets.push(label as u32);
            }
        }
        if targets.is_empty() {
            return Err(Error::invalid(
                crate::Setting::Labels,
                autobatch::Value::Text("-100 everywhere".to_owned()),
                "give at least one label that is not -100",
            ));
        }
        Ok(self.token_loss(input_ids, Some(rows), targets)?)
    }

    /// What trains: every tensor, or the LoRA adapters alone.
    pub fn varmap(&self) -> &VarMap {
        &self.weights.varmap
    }

    /// The config it was built from.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The sequence length its steps run at.
    pub fn seq_len(&self) -> usize {
        self.training.seq_len
    }

    /// The logits of token ids `(b, s)`: `(b, s, vocab)`, or `(b, labels)`
    /// for a BERT classifier.
    pub fn forward(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        match &self.network {
            Network::Decoder(network) => network.forward(ids),
            Network::Gpt2(network) => network.forward(ids),
            Network::Bert(network) => network.forward(ids),
        }
    }

    /// The mean loss of `batch` samples drawn from `data_seed` (the same seed,
    /// the same samples): next-token cross entropy for a decoder, masked-LM
    /// (15% of the tokens masked) or classification for BERT; in f32.
    ///
    /// `loss(…)?.backward()` gives the gradients candle's backward pass
    /// makes. A decoder's full fine-tune with the chunked loss holds less
    /// through `Model::loss_and_gradients` (the embedding's and head's
    /// gradients made once: 593.6 MB against 774.8 MB at batch 1 of
    /// SmolLM2-135M cut to 2 layers), which is what the probe measures and
    /// the training loop of [`into_trainer`](Self::into_trainer) runs: a loop
    /// of your own that trains to a probed plan calls that one.
    pub fn loss(&self, batch: usize, data_seed: u64) -> candle_core::Result<Tensor> {
        let (s, vocab) = (self.training.seq_len, self.config.vocab);
        match &self.network {
            Network::Bert(network) => {
                let ids = sequences(data_seed, batch, s, vocab);
                if !network.predicts_tokens() {
                    let BertHead::Classification { labels } = self.config.bert_head else { unreachable!() };
                    // the class is the first token's, modulo the classes: something to learn
                    let classes: Vec<u32> = ids.chunks(s).map(|sample| sample[0] % labels as u32).collect();
                    let logits = network.forward(&Tensor::from_vec(ids, (batch, s), &self.device)?)?;
                    return layers::cross_entropy(&logits, &Tensor::from_vec(classes, batch, &self.device)?);
                }
                // every sample's first token and about 15% of the rest are masked
                let mask_id = if vocab > 103 { 103 } else { vocab as u32 - 1 };
                let mut rng = Rng::new(data_seed ^ 0x4d41_534b);
                let masked: Vec<u32> =
                    (0..batch * s).filter(|&i| i % s == 0 || rng.below(100) < 15).map(|i| i as u32).collect();
                let targets: Vec<u32> = masked.iter().map(|&i| ids[i as usize]).collect();
                let mut input = ids;
                for &i in &masked {
                    input[i as usize] = mask_id;
                }
                self.token_loss(&Tensor::from_vec(input, (batch, s), &self.device)?, Some(masked), targets)
            }
            _ => {
                let (input, targets) = self.next_tokens(batch, data_seed)?;
                self.token_loss(&input, None, targets.to_vec1::<u32>()?)
            }
        }
    }

    /// The mean cross entropy of token predictions on `input` `(b, s)`: the
    /// logits at `rows` of the `b · s` positions (every one when `None`)
    /// against `targets`, the head and the loss computed as the training's
    /// [`Loss`] says. BERT's masked-LM loss in full is transformers': the
    /// log-probabilities at every position, the rows of them counted.
    fn token_loss(&self, input: &Tensor, rows: Option<Vec<u32>>, targets: Vec<u32>) -> candle_core::Result<Tensor> {
        let loss = self.cross_entropy(input, rows, targets)?;
        // the routers' load-balancing loss of the same forward pass, where asked for
        match &self.network {
            Network::Decoder(network) => match network.router_aux_loss()? {
                Some(aux) => {
                    let aux = aux.to_dtype(loss.dtype())?;
                    loss + aux
                }
                None => Ok(loss),
            },
            _ => Ok(loss),
        }
    }

    /// [`token_loss`](Self::token_loss)'s cross entropy.
    fn cross_entropy(&self, input: &Tensor, rows: Option<Vec<u32>>, targets: Vec<u32>) -> candle_core::Result<Tensor> {
        let (b, s) = input.dims2()?;
        let (count, vocab) = (targets.len(), self.config.vocab);
        let targets = Tensor::from_vec(targets, count, &self.device)?;
        let rows = rows.map(|rows| Tensor::from_vec(rows, count, &self.device)).transpose()?;
        let pick = |tensor: Tensor| match &rows {
            Some(rows) => tensor.index_select(rows, 0),
            None => Ok(tensor),
        };
        match (&self.network, self.training.loss) {
            (Network::Bert(network), Loss::Full) => {
                let Some(rows) = &rows else { candle_core::bail!("a masked-LM loss needs its masked positions") };
                bert::masked_lm_loss(&network.forward(input)?.reshape((b * s, vocab))?, rows, &targets)
            }
            (Network::Bert(network), Loss::Chunked) => {
                let Some((features, weight, bias)) = network.masked_lm_features(input)? else {
                    candle_core::bail!("a BERT classifier predicts no tokens")
                };
                let features = pick(features.reshape((b * s, self.config.hidden))?)?;
                ChunkedCrossEntropy::default().softcap(self.config.final_softcap).forward(
                    &features,
                    &weight,
                    bias.as_ref(),
                    &targets,
                )
            }
            (_, Loss::Full) => layers::cross_entropy(&pick(self.forward(input)?.reshape((b * s, vocab))?)?, &targets),
            (network, Loss::Chunked) => {
                let trunk = match network {
                    Network::Decoder(network) => network.trunk(input)?,
                    Network::Gpt2(network) => network.trunk(input)?,
                    Network::Bert(_) => unreachable!("BERT's loss is above"),
                };
                let (features, weight, bias) = network.head_parts(&trunk)?;
                let features = pick(features.reshape((b * s, self.config.hidden))?)?;
                ChunkedCrossEntropy::default().softcap(self.config.final_softcap).forward(
                    &features,
                    &weight,
                    bias.as_ref(),
                    &targets,
                )
            }
        }
    }

    /// The decoder whose embedding's and head's gradients this model puts in
    /// the gradient store itself, with its head's weight: every weight
    /// training (no adapters), the chunked loss, no checkpointing.
    fn own_table_gradients(&self) -> Option<(&crate::decoder::Decoder, Tensor)> {
        let Network::Decoder(network) = &self.network else { return None };
        if self.training.loss != Loss::Chunked || self.frozen.is_some() {
            return None;
        }
        let (weight, _) = network.head_dense()?;
        (weight.track_op() && network.embedding().0.track_op()).then_some((network, weight))
    }

    /// The loss and the gradients of `batch` samples, the vocabulary-sized
    /// ones made once: candle's backward pass adds the first gradient a
    /// variable gets to a zero tensor of its own (the head's: three
    /// vocabulary-sized tensors at once), and an embedding lookup's rows to
    /// a new table (two). Here the loss keeps the head's gradient, the
    /// lookup's rows are a leaf of the graph, and after the backward pass
    /// the rows are added into the table's gradient in place (the head's,
    /// where the two are tied): one such tensor, as PyTorch accumulates it.
    /// The same sums in the same order as `loss.backward()`.
    fn own_table_loss_and_gradients(
        &self,
        network: &crate::decoder::Decoder,
        weight: &Tensor,
        batch: usize,
        data_seed: u64,
    ) -> candle_core::Result<(Tensor, candle_core::backprop::GradStore)> {
        let (ids, input, targets) = self.next_tokens_and_ids(batch, data_seed)?;
        let (table, padding) = network.embedding();
        let rows = candle_core::Var::from_tensor(&layers::embed(&table.detach(), &input, None)?)?;
        let trunk = network.trunk_of_rows(rows.as_tensor().clone())?;
        let (features, _, bias) = self.network.head_parts(&trunk)?;
        let features = features.reshape((batch * self.training.seq_len, self.config.hidden))?;
        let (loss, head) = ChunkedCrossEntropy::default()
            .softcap(self.config.final_softcap)
            .forward_taking_weight_gradient(&features, weight, bias.as_ref(), &targets)?;
        let loss = match network.router_aux_loss()? {
            Some(aux) => (&loss + aux.to_dtype(loss.dtype())?)?,
            None => loss,
        };
        let mut grads = loss.backward()?;
        let rows_grad = grads.remove(rows.as_tensor());
        let tied = weight.id() == table.id();
        let sum = match tied {
            true => head,
            false => {
                grads.insert(weight, head);
                table.zeros_like()?
            }
        };
        if let Some(rows_grad) = rows_grad {
            ops::add_rows_in_place(&sum, &ids, &rows_grad, padding.map(|id| id as u32))?;
        }
        grads.insert(table, sum);
        Ok((loss, grads))
    }

    /// A decoder's batch: `s + 1` tokens a sample, the first `s` the input
    /// `(b, s)`, each one's next token its target `(b · s)`.
    fn next_tokens(&self, batch: usize, data_seed: u64) -> candle_core::Result<(Tensor, Tensor)> {
        let (_, input, targets) = self.next_tokens_and_ids(batch, data_seed)?;
        Ok((input, targets))
    }

    /// [`next_tokens`](Self::next_tokens), and the input's ids on the host
    /// (read there, not copied back from the device).
    fn next_tokens_and_ids(&self, batch: usize, data_seed: u64) -> candle_core::Result<(Vec<u32>, Tensor, Tensor)> {
        let s = self.training.seq_len;
        let tokens = sequences(data_seed, batch, s + 1, self.config.vocab);
        let ids = tokens.chunks(s + 1).flat_map(|sample| sample[..s].iter().copied()).collect();
        let tokens = Tensor::from_vec(tokens, (batch, s + 1), &self.device)?;
        Ok((ids, tokens.narrow(1, 0, s)?.contiguous()?, tokens.narrow(1, 1, s)?.flatten_all()?))
    }

    /// The model in the reference models' engine: a [`Workload`](autobatch::Workload)
    /// whose probe changes nothing and a training loop with one optimizer
    /// (AdamW by default), resizable to any sequence length up to the one it
    /// was built for. What `autobatch probe --config` tunes.
    pub fn into_trainer(self) -> Result<Trainer<ConfigModel>, Error> {
        // the variables' dtype: the adapters' under LoRA
        let dtype = self.training.lora.as_ref().map_or(self.dtype, |lora| lora.adapter_dtype(self.dtype));
        let (varmap, seed) = (self.weights.varmap.clone(), self.training.seed);
        Trainer::from_varmap(self, varmap, dtype, seed)
    }

    /// Steps at `seq_len` tokens from now on (at most the length built for).
    pub fn set_seq_len(&mut self, seq_len: usize) -> Result<(), Error> {
        if seq_len == 0 || seq_len > self.longest {
            return Err(Error::invalid(
                crate::Setting::SeqLen,
                autobatch::Value::Count(seq_len),
                format!("it must be from 1 to the sequence length the model was built for, {}", self.longest),
            ));
        }
        self.training.seq_len = seq_len;
        Ok(())
    }

    /// The sequence length it was built for.
    pub fn longest_seq_len(&self) -> usize {
        self.longest
    }
}

impl Model for ConfigModel {
    fn describe(&self) -> String {
        self.config.describe(&self.training)
    }

    fn loss(&self, batch: usize, data_seed: u64) -> candle_core::Result<Tensor> {
        ConfigModel::loss(self, batch, data_seed)
    }

    /// With checkpointing: each layer's input kept, each layer run again in
    /// the backward pass ([`checkpointed`](autobatch::model::checkpointed)).
    fn loss_and_gradients(
        &self,
        batch: usize,
        data_seed: u64,
        vars: &[candle_core::Var],
    ) -> candle_core::Result<(Tensor, candle_core::backprop::GradStore)> {
        if let Some((network, weight)) = self.own_table_gradients() {
            return self.own_table_loss_and_gradients(network, &weight, batch, data_seed);
        }
        let Some(frozen) = &self.frozen else {
            let loss = self.loss(batch, data_seed)?;
            let grads = loss.backward()?;
            return Ok((loss, grads));
        };
        let (input, targets) = self.next_tokens(batch, data_seed)?;
        let (embedded, tables) = match &self.network {
            Network::Decoder(network) => {
                let embedded = network.embed(&input)?;
                let tables = network.tables(&embedded)?;
                (embedded, Some(tables))
            }
            Network::Gpt2(network) => (network.embed(&input)?, None),
            Network::Bert(_) => candle_core::bail!("BERT is not checkpointed"),
        };
        let steps = |network| -> Vec<Step<'_>> {
            (0..self.config.layers).map(|index| Step { network, index, tables: tables.as_ref() }).collect()
        };
        let (blocks, detached) = (steps(&self.network), steps(frozen));
        let vocab = self.config.vocab;
        let mut loss = None;
        let (_, grads) = autobatch::model::checkpointed(vars, &embedded, &blocks, &detached, |h| {
            let rows = batch * self.training.seq_len;
            let head = match self.training.loss {
                Loss::Full => {
                    let logits = match &self.network {
                        Network::Decoder(network) => network.head(h)?,
                        Network::Gpt2(network) => network.head(h)?,
                        Network::Bert(_) => candle_core::bail!("BERT is not checkpointed"),
                    };
                    layers::cross_entropy(&logits.reshape((rows, vocab))?, &targets)?
                }
                Loss::Chunked => {
                    let (features, weight, bias) = self.network.head_parts(h)?;
                    let features = features.reshape((rows, self.config.hidden))?;
                    ChunkedCrossEntropy::default().softcap(self.config.final_softcap).forward(
                        &features,
                        &weight,
                        bias.as_ref(),
                        &targets,
                    )?
                }
            };
            loss = Some(head.detach());
            Ok(head)
        })?;
        Ok((loss.expect("the head ran"), grads))
    }

    fn computes_own_gradients(&self) -> bool {
        self.frozen.is_some() || self.own_table_gradients().is_some()
    }

    fn transformer(&self) -> Option<(autobatch::estimate::TransformerShape, autobatch::estimate::Recompute)> {
        let shape = autobatch::estimate::TransformerShape {
            layers: self.config.layers as u64,
            hidden: self.config.hidden as u64,
            heads: self.config.heads as u64,
            seq_len: self.training.seq_len as u64,
            batch: 1,
        };
        let recompute = if self.frozen.is_some() {
            autobatch::estimate::Recompute::Full
        } else {
            autobatch::estimate::Recompute::None
        };
        Some((shape, recompute))
    }

    fn detached(&self) -> ConfigModel {
        let weights = self.weights.detached();
        let network =
            build_network(&self.config, &weights, &self.training).expect("the same weights build the same network");
        ConfigModel {
            config: self.config.clone(),
            training: self.training.clone(),
            weights,
            network,
            frozen: None,
            dtype: self.dtype,
            device: self.device.clone(),
            longest: self.longest,
            ignored: self.ignored.clone(),
        }
    }
}

/// One layer of a network as a `Module`: what checkpointing runs twice.
struct Step<'a> {
    network: &'a Network,
    index: usize,
    tables: Option<&'a crate::decoder::Tables>,
}

impl candle_core::Module for Step<'_> {
    fn forward(&self, xs: &Tensor) -> candle_core::Result<Tensor> {
        match (self.network, self.tables) {
            (Network::Decoder(network), Some(tables)) => network.block(self.index, xs, tables),
            (Network::Gpt2(network), _) => network.block(self.index, xs),
            _ => candle_core::bail!("layer {} cannot be checkpointed", self.index),
        }
    }
}

/// `batch` samples of `len` token ids below `vocab`: each starts at a random
/// token and follows a fixed successor rule (`t → 5t + 3 mod vocab`) with a
/// random token one time in eight: a language a model can learn, so that a
/// loss falls as training goes.
fn sequences(seed: u64, batch: usize, len: usize, vocab: usize) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    let mut ids = Vec::with_capacity(batch * len);
    for _ in 0..batch {
        let mut token = rng.below(vocab);
        for _ in 0..len {
            ids.push(token as u32);
            token = if rng.below(8) == 0 { rng.below(vocab) } else { (5 * token + 3) % vocab };
        }
    }
    ids
}

/// Steps at any sequence length from 1 to the one the model was built for.
impl autobatch::Resizable for Trainer<ConfigModel> {
    fn resize(&mut self, size: usize) -> Result<(), autobatch::Error> {
        let longest = self.model().longest_seq_len();
        if size == 0 || size > longest {
            return Err(autobatch::Error::invalid(
                autobatch::Setting::Size,
                autobatch::Value::Count(size),
                format!("it must be from 1 to the sequence length the model was built for, {longest}"),
            ));
        }
        self.model_mut().set_seq_len(size).map_err(|_| autobatch::Error::zero(autobatch::Setting::Size))
    }

    fn size(&self) -> usize {
        self.model().seq_len()
    }
}
