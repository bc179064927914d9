//! Sections of docs/benchmarks.md that separate benches own: each between
//! `<!-- begin NAME -->` and `<!-- end NAME -->`, replaced by its bench and
//! kept when the search bench rewrites the rest.

use std::path::PathBuf;

pub fn benchmarks_md() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/benchmarks.md"))
}

fn markers(name: &str) -> (String, String) {
    (format!("<!-- begin {name} -->"), format!("<!-- end {name} -->"))
}

/// Writes `text` as the section `name`, in place of the one there or at the end.
#[allow(dead_code)] // each bench uses one of the two
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
#[allow(dead_code)]
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
