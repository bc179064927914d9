//! Sections of docs/benchmarks.md that separate benches own: each between
//! `<!-- begin NAME -->` and `<!-- end NAME -->`, replaced by its bench and
//! kept when the search bench rewrites the rest.

use std::path::PathBuf;

/// `docs/NAME` at the workspace's root.
pub fn page(name: &str) -> PathBuf {
    crate::workspace_root().join("docs").join(name)
}

/// The page the benches share, docs/benchmarks.md.
pub fn benchmarks_md() -> PathBuf {
    page("benchmarks.md")
}

fn markers(name: &str) -> (String, String) {
    (format!("<!-- begin {name} -->"), format!("<!-- end {name} -->"))
}

/// Writes `text` as the section `name`, in place of the one there or at the end.
pub fn replace(name: &str, text: &str) -> std::io::Result<PathBuf> {
    let path = benchmarks_md();
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    let (begin, end) = markers(name);
    let block = format!("{begin}\n{}\n{end}\n", text.trim_end());
    let updated = match (current.find(&begin), current.find(&end)) {
        (Some(start), Some(stop)) if stop > start => {
            let after = current[stop + end.len()..].trim_start_matches('\n');
            format!("{}{block}{after}", &current[..start])
        }
        _ => format!("{}\n\n{block}", current.trim_end()),
    };
    std::fs::create_dir_all(path.parent().expect("docs/ has a parent"))?;
    std::fs::write(&path, updated)?;
    Ok(path)
}

/// The sections other benches own in the file as it is, to carry over a rewrite.
pub fn owned_sections() -> String {
    let current = std::fs::read_to_string(benchmarks_md()).unwrap_or_default();
    let mut out = String::new();
    let mut rest = current.as_str();
    while let Some(start) = rest.find("<!-- begin ") {
        let name_end = rest[start..].find(" -->").map_or(rest.len(), |i| start + i);
        let name = &rest[start + "<!-- begin ".len()..name_end];
        let (_, end) = markers(name);
        let Some(stop) = rest[start..].find(&end).map(|i| start + i + end.len()) else { break };
        out += &format!("\n{}\n", &rest[start..stop]);
        rest = &rest[stop..];
    }
    out
}

/// `text` with the [`host`] line after its title (its first paragraph).
pub fn with_host(text: &str) -> String {
    text.replacen("\n\n", &format!("\n\n{}\n\n", host()), 1)
}

/// The host a figure was measured on, as a line for the docs: the CPU, its
/// threads, and the caches candle's CPU matmul sizes its per-thread buffers
/// from (a figure measured in bytes on the CPU depends on them), and the date.
pub fn host() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name").map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned()))
        })
        .unwrap_or_else(|| "an unnamed CPU".to_owned());
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let caches = &*gemm_common::cache::CACHE_INFO;
    let days = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() / 86_400);
    format!(
        "Measured on {cpu}, {threads} threads, L2 {} per core and L3 {} as candle's matmul reads them, on {}.",
        autobatch::Bytes(caches[1].cache_bytes as u64),
        autobatch::Bytes(caches[2].cache_bytes as u64),
        civil_date(days as i64)
    )
}

/// `YYYY-MM-DD` of a day counted from 1970-01-01 (Howard Hinnant's algorithm).
fn civil_date(days: i64) -> String {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}
