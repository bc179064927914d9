//! `estimate`'s advice made into `probe` flags, for the test and the bench
//! that run each advised change and compare what it promised.

/// `estimate`'s flags for the probe's `--precision` value.
pub fn estimate_precision(precision: &str) -> Vec<String> {
    let flags: &[&str] = match precision {
        "mixed" => &["--mixed-precision"],
        other => &["--dtype", other],
    };
    flags.iter().map(|flag| (*flag).to_owned()).collect()
}

/// The probe's flags that make the change `estimate` advises with `flag`
/// (its JSON `remedies[].flag`) at `precision`; `None` for a change the
/// probe cannot run in one process (ZeRO over ranks, momentum, another
/// optimizer than AdamW over mixed precision's f32 masters).
pub fn probe_flags_of(flag: &str, precision: &str) -> Option<Vec<String>> {
    let words: Vec<&str> = flag.split(' ').collect();
    let flags: &[&str] = match words[..] {
        ["--optimizer", _] if precision == "mixed" => return None,
        ["--mixed-precision"] => &["--precision", "mixed"],
        ["--dtype", dtype] => &["--precision", dtype],
        ["--recompute", "full"] => &["--checkpointing"],
        ["--optimizer", "momentum"] | ["--zero", _] => return None,
        ["--optimizer", optimizer] => &["--optimizer", optimizer],
        _ => panic!("an advised flag the probe has no counterpart for: {flag}"),
    };
    Some(flags.iter().map(|flag| (*flag).to_owned()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_advised_flag_has_its_probe_counterpart() {
        assert_eq!(probe_flags_of("--dtype bf16", "fp32").unwrap(), ["--precision", "bf16"]);
        assert_eq!(probe_flags_of("--mixed-precision", "fp32").unwrap(), ["--precision", "mixed"]);
        assert_eq!(probe_flags_of("--recompute full", "bf16").unwrap(), ["--checkpointing"]);
        assert_eq!(probe_flags_of("--optimizer lion", "bf16").unwrap(), ["--optimizer", "lion"]);
        assert_eq!(probe_flags_of("--optimizer lion", "mixed"), None);
        assert_eq!(probe_flags_of("--zero 2", "fp32"), None);
        assert_eq!(estimate_precision("mixed"), ["--mixed-precision"]);
        assert_eq!(estimate_precision("bf16"), ["--dtype", "bf16"]);
    }
}
