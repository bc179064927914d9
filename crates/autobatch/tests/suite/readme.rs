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

/// The ```rust blocks of `text`, each as its lines.
fn rust_blocks(text: &str) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    let mut block: Option<Vec<String>> = None;
    for line in text.lines() {
        match (&mut block, line.trim_start()) {
            (None, fence) if fence.starts_with("```rust") => block = Some(Vec::new()),
            (Some(_), "```") => blocks.extend(block.take()),
            (Some(lines), _) => lines.push(line.trim_end().to_owned()),
            (None, _) => {}
        }
    }
    blocks
}

/// `lines` without the common indentation, the blank lines kept.
fn dedented(lines: &[String]) -> Vec<String> {
    let indent = lines.iter().filter(|l| !l.trim().is_empty()).map(|l| l.len() - l.trim_start().len()).min();
    lines.iter().map(|l| l.get(indent.unwrap_or(0)..).unwrap_or("").trim_end().to_owned()).collect()
}

/// The guide's code is code that runs: each ```rust block of docs/library.md
/// is, line for line, a `// guide:` … `// end guide` region of the measured
/// harness's `guide.rs` (which runs it); the README's is the crate docs'
/// first example (a doctest), its hidden lines left out. A global allocator
/// and `#[test]` stand for what the running binary has of its own.
#[test]
fn the_guides_code_is_run() {
    let guide = std::fs::read_to_string(root().join("crates/autobatch/tests/measured/guide.rs")).unwrap();
    let mut regions: Vec<Vec<String>> = Vec::new();
    let mut region: Option<Vec<String>> = None;
    for line in guide.lines() {
        match (&mut region, line.trim()) {
            (None, marker) if marker.starts_with("// guide:") => region = Some(Vec::new()),
            (Some(_), "// end guide") => regions.extend(region.take().map(|lines| dedented(&lines))),
            (Some(lines), _) => lines.push(line.to_owned()),
            (None, _) => {}
        }
    }
    let own = |line: &String| {
        let line = line.trim_start();
        line.starts_with("#[global_allocator]") || line.starts_with("static ALLOCATOR") || line == "#[test]"
    };
    let library = std::fs::read_to_string(root().join("docs/library.md")).unwrap();
    let blocks = rust_blocks(&library);
    assert!(blocks.len() >= 4, "the guide's blocks were not found: {}", blocks.len());
    for block in blocks {
        let mut shown: Vec<String> = dedented(&block).into_iter().filter(|line| !own(line)).collect();
        while shown.first().is_some_and(|line| line.is_empty()) {
            shown.remove(0);
        }
        assert!(
            regions.contains(&shown),
            "docs/library.md shows code that no test runs (tests/measured/guide.rs):\n{}",
            shown.join("\n")
        );
    }
    // the README's first example is the crate docs' first doctest
    let lib = std::fs::read_to_string(root().join("crates/autobatch/src/lib.rs")).unwrap();
    let docs: Vec<&str> = lib
        .lines()
        .filter_map(|line| line.strip_prefix("//!"))
        .map(|line| line.strip_prefix(' ').unwrap_or(line))
        .collect();
    let open = docs.iter().position(|line| *line == "```").expect("the crate docs have an example");
    let close = open + 1 + docs[open + 1..].iter().position(|line| *line == "```").expect("a closed example");
    let runs: Vec<String> = docs[open + 1..close]
        .iter()
        .filter(|line| !line.starts_with("# ") && **line != "#")
        .map(|line| line.trim_end().to_owned())
        .collect();
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let shown = rust_blocks(&readme).into_iter().next().expect("the README has an example");
    assert_eq!(shown, runs, "the README's example is not the crate docs' first (a doctest)");
}
