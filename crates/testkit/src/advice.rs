//! `estimate`'s advice run by `probe`, for the test and the bench that run
//! each advised change and compare what it promised. Both commands say a
//! change with the same flags (`--precision mixed`, `--checkpointing`).

/// `estimate`'s flags for the probe's `--precision` value: the same flag.
pub fn estimate_precision(precision: &str) -> Vec<String> {
    vec!["--precision".to_owned(), precision.to_owned()]
}

/// The probe's flags that make the change `estimate` advises with `flag`
/// (its JSON `remedies[].flag`) at `precision`: the same flags; `None` for a
/// change the probe cannot run in one process (ZeRO over ranks, momentum,
/// another optimizer than AdamW over mixed precision's f32 masters).
pub fn probe_flags_of(flag: &str, precision: &str) -> Option<Vec<String>> {
    let words: Vec<&str> = flag.split(' ').collect();
    // several flags (a pair of changes): each the probe's, or none
    let starts: Vec<usize> = (0..words.len()).filter(|&i| words[i].starts_with("--")).collect();
    if starts.len() > 1 && words[0] != "--ranks" {
        let mut all = Vec::new();
        for (i, &start) in starts.iter().enumerate() {
            let end = starts.get(i + 1).copied().unwrap_or(words.len());
            all.extend(probe_flags_of(&words[start..end].join(" "), precision)?);
        }
        return Some(all);
    }
    match words[..] {
        ["--optimizer", _] if precision == "mixed" => None,
        ["--optimizer", "momentum"] | ["--zero", _] | ["--ranks", _] | ["--ranks", _, "--zero", _] => None,
        ["--precision", _]
        | ["--checkpointing"]
        | ["--optimizer", _]
        | ["--lora", _]
        | ["--base-dtype", _]
        | ["--seq-len", _] => Some(words.iter().map(|word| (*word).to_owned()).collect()),
        _ => panic!("an advised flag the probe has no counterpart for: {flag}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_advised_flag_is_the_probes_own_where_the_probe_can_run_it() {
        assert_eq!(probe_flags_of("--precision bf16", "fp32").unwrap(), ["--precision", "bf16"]);
        assert_eq!(probe_flags_of("--precision mixed", "fp32").unwrap(), ["--precision", "mixed"]);
        assert_eq!(probe_flags_of("--checkpointing", "bf16").unwrap(), ["--checkpointing"]);
        assert_eq!(probe_flags_of("--optimizer lion", "bf16").unwrap(), ["--optimizer", "lion"]);
        assert_eq!(probe_flags_of("--optimizer lion", "mixed"), None);
        assert_eq!(probe_flags_of("--zero 2", "fp32"), None);
        assert_eq!(probe_flags_of("--ranks 4 --zero 3", "fp32"), None);
        assert_eq!(probe_flags_of("--checkpointing --lora 16", "fp32").unwrap(), ["--checkpointing", "--lora", "16"]);
        assert_eq!(probe_flags_of("--lora 16 --ranks 4 --zero 3", "fp32"), None);
        assert_eq!(estimate_precision("mixed"), ["--precision", "mixed"]);
    }
}
