//! The README and the guide say what the repository holds: the design page's
//! layout lists every source file and nothing that is not there; every file
//! a page links to or names, and every example a page runs, exists.

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

/// The workspace's packages, from its root.
const PACKAGES: [&str; 4] = ["crates/autobatch", "crates/models", "crates/cli", "crates/testkit"];

fn root() -> &'static Path {
    crate::common::workspace_root()
}

/// The README and every page of the guide, with their paths.
fn pages() -> Vec<(PathBuf, String)> {
    let mut pages = vec![root().join("README.md"), root().join("CHANGELOG.md")];
    for entry in std::fs::read_dir(root().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    pages.into_iter().map(|path| (path.clone(), std::fs::read_to_string(&path).unwrap())).collect()
}

#[test]
fn the_layout_lists_every_source_file() {
    let design = std::fs::read_to_string(root().join("docs/design.md")).unwrap();
    let layout = design.split("## Layout").nth(1).expect("a Layout section in docs/design.md");
    let block = layout.split("```").nth(1).expect("a code block in the Layout section");
    let listed: BTreeSet<String> = block
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|path| path.starts_with("src/") || path.starts_with("crates/") && path.ends_with(".rs"))
        .map(str::to_owned)
        .collect();
    let mut present = BTreeSet::new();
    for package in PACKAGES {
        rust_files(&root().join(package).join("src"), root(), &mut present);
    }
    let missing: Vec<_> = present.difference(&listed).collect();
    let stale: Vec<_> = listed.difference(&present).collect();
    assert!(missing.is_empty() && stale.is_empty(), "not in docs/design.md: {missing:?}; gone: {stale:?}");
}

#[test]
fn every_link_and_named_file_exists() {
    let mut broken = Vec::new();
    for (page, text) in pages() {
        let folder = page.parent().unwrap();
        // markdown links: [text](target), relative to the page
        for target in text.split("](").skip(1).filter_map(|rest| rest.split(')').next()) {
            let target = target.split('#').next().unwrap_or("");
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            if !folder.join(target).exists() {
                broken.push(format!("{}: link {target}", page.display()));
            }
        }
        // files named in code spans, from the repository's root
        for span in text.split('`').skip(1).step_by(2) {
            let name = span.split_whitespace().next().unwrap_or("").trim_end_matches([',', '.', ':', ')', ';']);
            let named = ["src/", "tests/", "examples/", "benches/", "scripts/", "docs/", "crates/"];
            let is_path = named.iter().any(|p| name.starts_with(p))
                && !name.contains(['*', '<', '{', '…'])
                && name.rsplit('/').next().is_some_and(|last| last.contains('.'));
            if is_path && !root().join(name).exists() {
                broken.push(format!("{}: names {name}", page.display()));
            }
        }
        // every example a page runs
        for rest in text.split("--example").skip(1) {
            let name = rest.split_whitespace().next().unwrap_or("");
            let name = name.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-')).next().unwrap_or("");
            let exists = PACKAGES.iter().map(|package| root().join(package).join("examples")).any(|examples| {
                examples.join(format!("{name}.rs")).exists() || examples.join(name).join("main.rs").exists()
            });
            if !name.is_empty() && !exists {
                broken.push(format!("{}: runs --example {name}", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}
