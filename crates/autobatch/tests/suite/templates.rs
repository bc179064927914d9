//! Every setting a message template names (`{{multiple_of}}` in a `format!`,
//! filled with the caller's names when the error is rendered) is a
//! `SettingName`: a typo would print the braces instead of the flag.

use std::path::Path;

use autobatch::SettingName;

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_setting_a_template_names_is_one() {
    let root = crate::common::workspace_root();
    let mut files = Vec::new();
    for package in ["crates/autobatch", "crates/models", "crates/cli"] {
        rust_files(&root.join(package).join("src"), &mut files);
    }
    let mut named = 0;
    let mut unknown = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (at, _) in text.match_indices("{{") {
            let rest = &text[at + 2..];
            let end = rest.find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')).unwrap_or(0);
            if end == 0 || !rest[end..].starts_with("}}") {
                continue;
            }
            named += 1;
            if SettingName::from_name(&rest[..end]).is_none() {
                unknown.push(format!("{}: {{{}}}", file.display(), &rest[..end]));
            }
        }
    }
    assert!(named >= 5, "the templates were not found ({named})");
    assert!(unknown.is_empty(), "templates naming no setting: {unknown:#?}");
}
