//! The README says what the repository holds: its layout lists every source
//! file, and nothing that is not there.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, root: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path: PathBuf = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.insert(path.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/"));
        }
    }
}

#[test]
fn the_layout_lists_every_source_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let layout = readme.split("## Layout").nth(1).expect("a Layout section");
    let block = layout.split("```").nth(1).expect("a code block in the Layout section");
    let listed: BTreeSet<String> = block
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|path| path.starts_with("src/"))
        .map(str::to_owned)
        .collect();
    let mut present = BTreeSet::new();
    rust_files(&root.join("src"), root, &mut present);
    let missing: Vec<_> = present.difference(&listed).collect();
    let stale: Vec<_> = listed.difference(&present).collect();
    assert!(missing.is_empty() && stale.is_empty(), "not in the README: {missing:?}; gone: {stale:?}");
}
