//! A model whose first step cannot fit, refused before anything is
//! allocated: counted from the request the flags made.

use autobatch_models as models;
use autobatch_models::Compute;
use autobatch_models::reference::{ConvNetConfig, TransformerConfig};
use autobatch_models::trainer::Footprint;

use crate::failure::Failure;
use crate::model::ModelConfig;

use super::request::{Question, Request};

/// Refuses a model whose first step cannot fit under `limit` before anything
/// is allocated: the smallest batch at the longest size probed (`--seq-lens`,
/// else the configured size), or under `--find` `--batch` at the shortest
/// size searched. A lower bound where the model is built for a longer size
/// than a step runs at: the search measures the rest and says when nothing fits.
pub fn check_footprint(request: &Request, footprint: &Footprint, compute: Compute, limit: u64) -> Result<(), Failure> {
    let (batch, size) = match &request.question {
        Question::Find { batch, granule } => (*batch, *granule),
        Question::Check { batch } => (*batch, usize::MAX),
        Question::Lengths(lengths) => (request.first_batch, lengths.iter().copied().max().unwrap_or(usize::MAX)),
        _ => (request.first_batch, usize::MAX),
    };
    let finding = matches!(request.question, Question::Find { .. });
    let at_size = match &request.model {
        ModelConfig::Transformer(c) if size < c.seq_len => {
            ModelConfig::Transformer(TransformerConfig { seq_len: size, ..c.clone() })
        }
        ModelConfig::ConvNet(c) if finding => {
            ModelConfig::ConvNet(ConvNetConfig { resolution: size.max(4).min(c.resolution), ..c.clone() })
        }
        ModelConfig::FromConfig(spec) if size < spec.1.seq_len => {
            let training = models::Training { seq_len: size, ..spec.1.clone() };
            ModelConfig::FromConfig(Box::new((spec.0.clone(), training)))
        }
        _ => return Ok(footprint.check_batch_within(batch, limit)?),
    };
    let first_step = at_size.footprint(request.optimizing, compute)?;
    let first_step = match (finding, &at_size) {
        // a config model's fixed count is its state and the step's widest
        // moment at one sample, which is the length's (its eager scores): the
        // shortest length searched counts its own
        (true, ModelConfig::FromConfig(_)) | (false, _) => first_step,
        // a reference model is built at its largest size (its causal mask, a
        // head over the largest image) and its first step runs at the smallest
        (true, _) => Footprint { min_bytes_per_sample: first_step.min_bytes_per_sample, ..footprint.clone() },
    };
    Ok(first_step.check_batch_within(batch, limit)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(line: &[&str]) -> Request {
        let cli = crate::args::Cli::parse_from([&["autobatch", "probe"], line].concat()).unwrap();
        let Some(crate::args::Command::Probe(args)) = cli.command else { panic!("{line:?} is not a probe") };
        Request::of(&args).unwrap()
    }

    /// `--find seq-len` answers a length from the granule up: the pre-check
    /// counts the shortest, never the longest length's eager scores as fixed
    /// bytes (issue 84: refused at 16 MiB where 74 tokens fit).
    #[test]
    fn a_length_search_counts_the_shortest_length_it_may_answer() {
        let dir = std::env::temp_dir().join(format!("autobatch-find-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.json");
        std::fs::write(
            &path,
            r#"{"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "max_position_embeddings": 512, "tie_word_embeddings": true, "torch_dtype": "float32"}"#,
        )
        .unwrap();
        let path = path.to_str().unwrap();
        let flags = ["--config", path, "--layers", "1", "--batch", "8", "--seq-len", "512", "--attention", "eager"];
        let finding = request(&[&flags[..], &["--find", "seq-len"]].concat());
        let full = finding.model.footprint(finding.optimizing, Compute::Cpu).unwrap();
        let shortest = finding.model.with_seq_len(1).unwrap().footprint(finding.optimizing, Compute::Cpu).unwrap();
        let (at_shortest, at_longest) = (
            shortest.fixed_bytes + 8 * shortest.min_bytes_per_sample,
            full.fixed_bytes + 8 * full.min_bytes_per_sample,
        );
        assert!(at_shortest < at_longest / 2, "the eager scores at 512 tokens dominate: {at_shortest} {at_longest}");
        assert!(check_footprint(&finding, &full, Compute::Cpu, at_shortest).is_ok());
        assert!(check_footprint(&finding, &full, Compute::Cpu, at_shortest - 1).is_err(), "a lower bound still");
        // a batch search runs at the longest length: that count holds there
        let batch = request(&[&flags[..1], &flags[1..2], &["--seq-len", "512", "--attention", "eager"]].concat());
        assert!(check_footprint(&batch, &full, Compute::Cpu, at_longest - 8 * full.min_bytes_per_sample).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}
