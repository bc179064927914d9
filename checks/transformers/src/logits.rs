//! `autobatch_models` against candle-transformers on the same weights: each
//! family's logits, from one tiny config read by both, agree within 1e-4 of
//! their largest magnitude. The configs exercise grouped-query attention,
//! Llama 3's rope scaling, tied and untied heads, Qwen2's biases, Qwen3's q/k
//! norms with an explicit head_dim, and BERT's masked-LM head.

use std::collections::HashMap;

use autobatch_models::{Config, ConfigModel, Training};
use candle_core::{DType, Device, IndexOp, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::{bert, llama, mistral, qwen2, qwen3};

const SEQ: usize = 12;
const BATCH: usize = 2;

/// Our model's tensors by their checkpoint names (what a safetensors file of
/// the real weights holds), and the model.
fn ours(json: &str) -> (ConfigModel, HashMap<String, Tensor>) {
    let config = Config::from_json(json).unwrap_or_else(|err| panic!("{err}"));
    let model = ConfigModel::build(&config, &Training::new(SEQ), &Device::Cpu).unwrap();
    let tensors = model
        .varmap()
        .data()
        .lock()
        .unwrap()
        .iter()
        .map(|(name, var)| (name.clone(), var.as_tensor().detach()))
        .collect();
    (model, tensors)
}

fn token_ids(vocab: usize) -> Tensor {
    let ids: Vec<u32> = (0..BATCH * SEQ).map(|i| ((i * 7919 + 13) % vocab) as u32).collect();
    Tensor::from_vec(ids, (BATCH, SEQ), &Device::Cpu).unwrap()
}

/// The largest difference over the largest magnitude.
fn relative(a: &Tensor, b: &Tensor) -> f32 {
    let (a, b) = (a.to_dtype(DType::F32).unwrap(), b.to_dtype(DType::F32).unwrap());
    let diff = (&a - &b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
    diff / b.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap().max(f32::MIN_POSITIVE)
}

/// Our logits at the last position, `(b, vocab)`.
fn last(model: &ConfigModel, ids: &Tensor) -> Tensor {
    model.forward(ids).unwrap().i((.., SEQ - 1, ..)).unwrap()
}

fn compare(name: &str, ours: &Tensor, theirs: &Tensor, failures: &mut Vec<String>) {
    let difference = relative(ours, theirs);
    println!("  {name}: logits differ by {difference:.2e} of their largest magnitude");
    if difference > 1e-4 {
        failures.push(format!("{name}: logits differ by {difference:e}"));
    }
}

fn llama_family(failures: &mut Vec<String>) {
    for (name, tied) in [("llama (GQA, llama3 rope, tied head)", true), ("llama (untied head)", false)] {
        let json = format!(
            r#"{{"model_type": "llama", "vocab_size": 97, "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0, "max_position_embeddings": 256, "tie_word_embeddings": {tied},
            "rope_scaling": {{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}}}"#
        );
        let (model, tensors) = ours(&json);
        let config: llama::LlamaConfig = serde_json::from_str(&json).unwrap();
        let config = config.into_config(false);
        let vb = VarBuilder::from_tensors(tensors, DType::F32, &Device::Cpu);
        let theirs = llama::Llama::load(vb, &config).unwrap();
        let mut cache = llama::Cache::new(false, DType::F32, &config, &Device::Cpu).unwrap();
        let ids = token_ids(97);
        compare(name, &last(&model, &ids), &theirs.forward(&ids, 0, &mut cache).unwrap(), failures);
    }
}

fn mistral_family(failures: &mut Vec<String>) {
    let json = r#"{"model_type": "mistral", "vocab_size": 97, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "max_position_embeddings": 256, "sliding_window": 4096, "hidden_act": "silu"}"#;
    let (model, tensors) = ours(json);
    let config: mistral::Config = serde_json::from_str(json).unwrap();
    let vb = VarBuilder::from_tensors(tensors, DType::F32, &Device::Cpu);
    let mut theirs = mistral::Model::new(&config, vb).unwrap();
    let ids = token_ids(97);
    let theirs = theirs.forward(&ids, 0).unwrap().squeeze(1).unwrap();
    compare("mistral (one kv head, untied)", &last(&model, &ids), &theirs, failures);
}

fn qwen_families(failures: &mut Vec<String>) {
    let json = r#"{"model_type": "qwen2", "vocab_size": 97, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "max_position_embeddings": 256, "sliding_window": 256, "max_window_layers": 2,
        "use_sliding_window": false, "tie_word_embeddings": true, "hidden_act": "silu"}"#;
    let (model, mut tensors) = ours(json);
    // our q/k/v biases start at zero: give them values, or the check would not see them
    for (name, tensor) in tensors.iter_mut().filter(|(name, _)| name.ends_with("proj.bias")) {
        let values: Vec<f32> = (0..tensor.elem_count()).map(|i| ((i * 31 + name.len()) % 17) as f32 / 40.0).collect();
        let filled = Tensor::from_vec(values, tensor.shape(), &Device::Cpu).unwrap();
        let var = model.varmap().data().lock().unwrap()[name.as_str()].clone();
        var.set(&filled).unwrap();
        *tensor = filled;
    }
    let config: qwen2::Config = serde_json::from_str(json).unwrap();
    let vb = VarBuilder::from_tensors(tensors, DType::F32, &Device::Cpu);
    let mut theirs = qwen2::ModelForCausalLM::new(&config, vb).unwrap();
    let ids = token_ids(97);
    let theirs = theirs.forward(&ids, 0).unwrap().squeeze(1).unwrap();
    compare("qwen2 (q/k/v biases, tied)", &last(&model, &ids), &theirs, failures);

    let json = r#"{"model_type": "qwen3", "vocab_size": 97, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 24,
        "attention_bias": false, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 256,
        "sliding_window": null, "max_window_layers": 2, "use_sliding_window": false,
        "tie_word_embeddings": false, "hidden_act": "silu"}"#;
    let (model, mut tensors) = ours(json);
    // q/k norms start at one: move them, so that a norm applied wrongly shows
    for (name, tensor) in tensors.iter_mut().filter(|(name, _)| name.contains("_norm.")) {
        let values: Vec<f32> = (0..tensor.elem_count()).map(|i| 0.5 + ((i * 13) % 11) as f32 / 10.0).collect();
        let filled = Tensor::from_vec(values, tensor.shape(), &Device::Cpu).unwrap();
        model.varmap().data().lock().unwrap()[name.as_str()].set(&filled).unwrap();
        *tensor = filled;
    }
    let config: qwen3::Config = serde_json::from_str(json).unwrap();
    let vb = VarBuilder::from_tensors(tensors, DType::F32, &Device::Cpu);
    let mut theirs = qwen3::ModelForCausalLM::new(&config, vb).unwrap();
    let ids = token_ids(97);
    let theirs = theirs.forward(&ids, 0).unwrap().squeeze(1).unwrap();
    compare("qwen3 (q/k norms, head_dim 24, untied)", &last(&model, &ids), &theirs, failures);
}

fn bert_family(failures: &mut Vec<String>) {
    let json = r#"{"model_type": "bert", "vocab_size": 97, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 64, "type_vocab_size": 2,
        "hidden_act": "gelu", "hidden_dropout_prob": 0.0, "initializer_range": 0.02, "layer_norm_eps": 1e-12,
        "pad_token_id": 0, "classifier_dropout": null}"#;
    let (model, mut tensors) = ours(json);
    // candle-transformers reads the tied decoder under its own names
    let word = tensors["bert.embeddings.word_embeddings.weight"].clone();
    let bias = tensors["cls.predictions.bias"].clone();
    tensors.insert("cls.predictions.decoder.weight".to_owned(), word);
    tensors.insert("cls.predictions.decoder.bias".to_owned(), bias);
    let config: bert::Config = serde_json::from_str(json).unwrap();
    let vb = VarBuilder::from_tensors(tensors, DType::F32, &Device::Cpu);
    let theirs = bert::BertForMaskedLM::load(vb, &config).unwrap();
    let ids = token_ids(97);
    let types = ids.zeros_like().unwrap();
    let theirs = theirs.forward(&ids, &types, None).unwrap();
    compare("bert (masked-LM head, tied decoder)", &model.forward(&ids).unwrap(), &theirs, failures);
}

/// Every family's logits against candle-transformers'; the failures, if any.
pub fn check() -> Vec<String> {
    let mut failures = Vec::new();
    llama_family(&mut failures);
    mistral_family(&mut failures);
    qwen_families(&mut failures);
    bert_family(&mut failures);
    failures
}
