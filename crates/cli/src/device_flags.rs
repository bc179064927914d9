//! `--device` and `--budget`, read and checked the same way for `probe` and
//! `serve`: where a command runs, and the CPU budget against every limit the
//! process lives under.

use autobatch::Bytes;

use crate::failure::Failure;
use crate::parse::parse_bytes;

/// Where to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    Cpu,
    Cuda(usize),
}

pub fn parse_device(text: &str) -> Result<DeviceSpec, Failure> {
    let invalid = || Failure::usage(format!("invalid device {text:?}: use cpu, cuda or cuda:N (N a GPU ordinal)"));
    match text {
        "cpu" => Ok(DeviceSpec::Cpu),
        "cuda" => Ok(DeviceSpec::Cuda(0)),
        other => match other.strip_prefix("cuda:") {
            Some(ordinal) => ordinal.parse().map(DeviceSpec::Cuda).map_err(|_| invalid()),
            None => Err(invalid()),
        },
    }
}

/// `--budget` (or `default`) read and checked against every limit the
/// process lives under, as the probe's CPU budget says; with where it came from.
pub fn checked_budget(given: Option<&str>, default: &'static str) -> Result<(u64, &'static str), Failure> {
    let (text, why) = match given {
        Some(text) => (text, "--budget"),
        None => (default, "the default; set --budget"),
    };
    let budget = parse_bytes(text).map_err(|err| Failure::usage(format!("--budget: {err}")))?;
    if budget == 0 {
        return Err(Failure::usage("--budget is 0: give the memory the step may use, e.g. 256MiB"));
    }
    let search = budget.saturating_mul(2);
    let twice = match budget.checked_mul(2) {
        Some(bytes) => Bytes(bytes).to_string(),
        None => "more than 16 EiB".to_owned(),
    };
    let threads = rayon::current_num_threads() as u64 + 1;
    // the limits that end the process first: a budget refused is not also warned about
    let mut rooms = crate::limits::rooms();
    rooms.sort_by_key(|room| !room.hard);
    for room in rooms {
        let reserve = if room.what.contains("ulimit") { threads * PER_THREAD_RESERVE } else { 0 };
        let needed = search.saturating_add(reserve);
        if needed <= room.bytes {
            continue;
        }
        let most = room.bytes.saturating_sub(reserve) / 2;
        if room.hard {
            let advice = if most >= 1 << 20 {
                format!("use at most --budget {}", crate::parse::flag_bytes(most))
            } else {
                format!("that leaves no room for a probe beside its {threads} threads: raise the limit")
            };
            return Err(Failure::usage(format!(
                "--budget {}: a search can allocate about twice the budget ({twice}), and this process may use only {} \
                 more under {}; {advice}",
                Bytes(budget),
                Bytes(room.bytes),
                room.what,
            )));
        }
        log::warn!(
            "--budget {}: a search can allocate about twice the budget ({twice}), more than the {} of {}: it may swap",
            Bytes(budget),
            Bytes(room.bytes),
            room.what
        );
    }
    Ok((budget, why))
}

/// Address space each worker thread may reserve beyond what it allocates (an
/// allocator arena and a stack): counted against `ulimit -v` and `ulimit -d`.
const PER_THREAD_RESERVE: u64 = 66 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices() {
        assert_eq!(parse_device("cpu").unwrap(), DeviceSpec::Cpu);
        assert_eq!(parse_device("cuda").unwrap(), DeviceSpec::Cuda(0));
        assert_eq!(parse_device("cuda:3").unwrap(), DeviceSpec::Cuda(3));
        for bad in ["gpu", "cuda:", "cuda:x", "CPU", "cuda:-1"] {
            assert!(parse_device(bad).is_err(), "{bad}");
        }
    }
}
