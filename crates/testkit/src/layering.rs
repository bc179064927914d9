//! A package's modules depend one way: no import cycle between them, every
//! module placed in a layer that uses only the layers below it, and the
//! leaves import nothing from the package but other leaves. Each package
//! checks its own `src/` from its own tests with [`depend_one_way`].
//!
//! Read from the source: every `crate::…` and `super::…` path and
//! re-exported root name in a module's files (tests and comments left out)
//! is an edge to the module that defines it. A module is a top-level folder
//! or file of `src/`, except the leaves and the parts, which count on their own.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One crate's source tree and how its modules are placed.
pub struct Crate {
    /// Its `src/` folder.
    pub src: PathBuf,
    /// Files that are modules of their own, importing only other leaves.
    pub leaves: &'static [&'static str],
    /// Submodules placed in layers of their own, apart from the module that holds them.
    pub parts: &'static [&'static str],
    /// Every module in its layer, lowest first: each may use only those before it.
    pub order: &'static [&'static str],
}

/// `src/a/b.rs` → `a::b`; `src/a/mod.rs` → `a`; `src/lib.rs` → ``.
fn module_path(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib" || p == "main") {
        parts.pop();
    }
    parts.join("::")
}

/// The node a module path belongs to: its leaf or part, or its top-level module.
fn node(krate: &Crate, path: &str) -> String {
    let leaf = krate
        .leaves
        .iter()
        .chain(krate.parts)
        .filter(|leaf| path == **leaf || path.starts_with(&format!("{leaf}::")))
        .max();
    match leaf {
        Some(leaf) => (*leaf).to_owned(),
        None => path.split("::").next().unwrap_or("").to_owned(),
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "bin") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The file's code without comments and without its `#[cfg(test)]` module.
fn code(file: &Path) -> String {
    let text = std::fs::read_to_string(file).unwrap();
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => &text[..],
    };
    text.lines().map(|line| line.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// Every path the code names after `prefix`, with `{a, b::c}` groups expanded.
fn paths_after(code: &str, prefix: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue; // `other_crate::…`, `a::crate::…`
        }
        let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(rest.len());
        let head = rest[..end].to_owned();
        if rest[end..].starts_with('{') {
            let close = rest[end..].find('}').map_or(rest.len(), |c| end + c);
            for item in rest[end + 1..close].split(',') {
                let item = item.trim().split(" as ").next().unwrap_or("").trim();
                if !item.is_empty() {
                    paths.push(format!("{head}{item}"));
                }
            }
        } else {
            paths.push(head.trim_end_matches(':').to_owned());
        }
    }
    paths
}

/// The crate paths a file of module `module` names: `crate::…`, `super::…`,
/// and `use child::…` of its own submodules.
fn crate_paths(code: &str, module: &str, modules: &BTreeSet<String>) -> Vec<String> {
    let mut paths = paths_after(code, "crate::");
    let parent = module.rsplit_once("::").map_or("", |(parent, _)| parent);
    for path in paths_after(code, "super::") {
        paths.push(if parent.is_empty() { path } else { format!("{parent}::{path}") });
    }
    for path in paths_after(code, "use ") {
        let child = format!("{module}::{path}");
        if !module.is_empty() && modules.iter().any(|m| child.starts_with(&format!("{m}::")) || child == *m) {
            paths.push(child);
        }
    }
    paths
}

/// The module a `crate::` path lands in: the longest prefix that is a module
/// of the crate; a root name goes where `lib.rs` re-exports it from.
fn resolve(path: &str, modules: &BTreeSet<String>, root_names: &BTreeMap<String, String>) -> Option<String> {
    let parts: Vec<&str> = path.split("::").collect();
    for len in (1..=parts.len()).rev() {
        let candidate = parts[..len].join("::");
        if modules.contains(&candidate) {
            return Some(candidate);
        }
    }
    root_names.get(parts[0]).cloned()
}

/// The edges between `krate`'s modules, checked: no cycle, leaves that use
/// only leaves, every module placed, none using one above it.
pub fn depend_one_way(krate: &Crate) -> BTreeMap<String, BTreeSet<String>> {
    let src = krate.src.as_path();
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| module_path(src, f)).filter(|m| !m.is_empty()).collect();
    // root names re-exported by lib.rs: `pub use a::b::{X, Y};` → X, Y in a::b
    let mut root_names = BTreeMap::new();
    let root = [src.join("lib.rs"), src.join("main.rs")].into_iter().find(|root| root.exists()).unwrap();
    for path in paths_after(&code(&root).replace("pub use ", "use crate::"), "crate::") {
        let (module, name) = path.rsplit_once("::").unwrap_or(("", &path));
        let module = resolve(module, &modules, &BTreeMap::new());
        if let Some(module) = module {
            root_names.insert(name.to_owned(), module);
        }
    }
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let from = module_path(src, file);
        if from.is_empty() {
            continue;
        }
        let from_node = node(krate, &from);
        for path in crate_paths(&code(file), &from, &modules) {
            let Some(to) = resolve(&path, &modules, &root_names) else { continue };
            let to_node = node(krate, &to);
            if to_node != from_node {
                edges.entry(from_node.clone()).or_default().insert(to_node);
            }
        }
        edges.entry(from_node).or_default();
    }

    for leaf in krate.leaves {
        let outside: Vec<&String> = edges[*leaf].iter().filter(|to| !krate.leaves.contains(&to.as_str())).collect();
        assert!(outside.is_empty(), "the leaf {leaf} imports {outside:?}");
    }
    // a depth-first search that reports the first cycle it closes
    fn visit<'a>(
        node: &'a str,
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) {
        if let Some(start) = path.iter().position(|n| *n == node) {
            panic!("import cycle: {} -> {node}", path[start..].join(" -> "));
        }
        if !done.insert(node) {
            return;
        }
        path.push(node);
        for next in edges.get(node).into_iter().flatten() {
            visit(next, edges, path, done);
        }
        path.pop();
    }
    let mut done = BTreeSet::new();
    for node in edges.keys() {
        visit(node, &edges, &mut Vec::new(), &mut done);
    }
    // and the named layers in their order: nothing lower uses anything higher
    let reaches = |from: &str, to: &str| reaches(&edges, from, to);
    let unplaced: Vec<&String> = edges.keys().filter(|node| !krate.order.contains(&node.as_str())).collect();
    assert!(unplaced.is_empty(), "modules of {} not placed in its order: {unplaced:?}", src.display());
    for (index, lower) in krate.order.iter().enumerate() {
        for higher in &krate.order[index + 1..] {
            assert!(!reaches(lower, higher), "{lower} depends on {higher}, which is above it");
        }
    }
    edges
}

/// Whether `from` reaches `to` along `edges`.
pub fn reaches(edges: &BTreeMap<String, BTreeSet<String>>, from: &str, to: &str) -> bool {
    let mut seen = BTreeSet::new();
    let mut stack = vec![from.to_owned()];
    while let Some(node) = stack.pop() {
        if node == to {
            return true;
        }
        if seen.insert(node.clone()) {
            stack.extend(edges.get(&node).into_iter().flatten().cloned());
        }
    }
    false
}
