//! The files the tool writes (`--cache`, `--plot`), checked before the first
//! trial by one rule, whatever the command: a probe that runs for minutes
//! must not fail at its end because its chart cannot be written, block on a
//! named pipe, or write over a file it did not write.
//!
//! The rule, for every file written:
//! - never through a symbolic link (the file named is the file written);
//! - never onto an input (`--config`) or onto another output;
//! - a regular file, in a folder that exists and can be written (no folder is
//!   made: a typo in a folder is said, not created);
//! - an existing file only when it is the tool's own: a chart the tool wrote
//!   (its first line is [`CHART_MARK`]), a plan cache (the library reads it,
//!   and leaves a file that is not one alone, saying so); a chart is replaced
//!   whole ([`write_replacing`]), never half-written.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::args::ProbeArgs;
use crate::failure::Failure;

/// The first line of every chart the tool writes: what tells a chart of ours,
/// which `--plot` may replace, from a file it must not.
pub const CHART_MARK: &str = "<!-- a chart written by autobatch: a later chart may replace this file -->";

/// What a file written is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// `--plot`: an SVG chart.
    Chart,
    /// `--cache`: the plan cache.
    Cache,
}

/// `probe`'s files: `--cache` and `--plot`, against `--config`.
pub fn check(args: &ProbeArgs) -> Result<(), Failure> {
    let mut outputs = Vec::new();
    if let Some(path) = &args.plan.cache {
        outputs.push(("--cache", path.as_path(), Kind::Cache));
    }
    if let Some(path) = &args.output.plot.path {
        outputs.push(("--plot", path.as_path(), Kind::Chart));
    }
    let inputs: Vec<(&str, &Path)> = args.config.file.path.iter().map(|path| ("--config", path.as_path())).collect();
    check_files(&inputs, &outputs)
}

/// `serve --plot`, against `serve --config`.
pub fn check_serve(config: &Path, plot: &Path) -> Result<(), Failure> {
    check_files(&[("--config", config)], &[("--plot", plot, Kind::Chart)])
}

fn check_files(inputs: &[(&str, &Path)], outputs: &[(&str, &Path, Kind)]) -> Result<(), Failure> {
    for (i, &(flag, path, _)) in outputs.iter().enumerate() {
        for &(other, other_path, _) in &outputs[..i] {
            if same_file(path, other_path) {
                return Err(Failure::usage(format!(
                    "{other} {} and {flag} {} name the same file: one would be written over the other; give \
                     each its own file",
                    other_path.display(),
                    path.display()
                )));
            }
        }
        for &(input, input_path) in inputs {
            if same_file(path, input_path) {
                return Err(Failure::usage(format!(
                    "{flag} {} is the file {input} reads: the tool never writes over its input; name another file",
                    path.display()
                )));
            }
        }
    }
    for &(flag, path, kind) in outputs {
        writable(flag, path, kind)?;
    }
    Ok(())
}

/// `path` can take the file `kind` is, by the rule above.
fn writable(flag: &str, path: &Path, kind: Kind) -> Result<(), Failure> {
    let refuse = |why: String| Failure::usage(format!("{flag} {}: {why}", path.display()));
    // `x.svg/` reads as `x.svg` to Path's components, but the system takes it
    // for a folder: refused here, not when the file is written at the end
    let text = path.as_os_str().as_encoded_bytes();
    if text.ends_with(b"/") || text.ends_with(b"/.") || text == b"." || text.ends_with(b"/..") || text == b".." {
        return Err(refuse("names a folder (it ends in a slash or a dot folder); name a file".to_owned()));
    }
    if kind == Kind::Chart {
        let is_svg = path.extension().and_then(|e| e.to_str()).is_some_and(|e| e.eq_ignore_ascii_case("svg"));
        if !is_svg {
            return Err(refuse("the chart is SVG; name a .svg file".to_owned()));
        }
    }
    if let Ok(target) = std::fs::read_link(path) {
        return Err(refuse(format!(
            "is a symbolic link (to {}): the tool writes the file named, never through a link; name the file itself",
            target.display()
        )));
    }
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => return Err(refuse("is a folder; name a file in it".to_owned())),
        Ok(meta) if !meta.is_file() => {
            return Err(refuse("is not a regular file (a pipe or a device); name a file".to_owned()));
        }
        Ok(meta) if meta.permissions().readonly() => return Err(refuse("is read-only".to_owned())),
        Ok(_) => {
            if kind == Kind::Chart && !is_our_chart(path) {
                return Err(refuse(
                    "exists and is not a chart autobatch wrote: name a new file, or remove this one first".to_owned(),
                ));
            }
            // opened for writing without truncating: the file stays as it is
            std::fs::OpenOptions::new()
                .append(true)
                .open(path)
                .map_err(|err| refuse(format!("cannot be written: {err}")))?;
        }
        Err(_) => {}
    }
    let folder = folder_of(path);
    if !folder.is_dir() {
        return Err(refuse(format!("the folder {} does not exist; make it first", folder.display())));
    }
    let trial = folder.join(format!(".autobatch-write-check-{}", std::process::id()));
    match std::fs::OpenOptions::new().write(true).create_new(true).open(&trial) {
        Ok(file) => {
            drop(file);
            let _ = std::fs::remove_file(&trial);
            Ok(())
        }
        Err(err) => Err(refuse(format!("no file can be written in {}: {err}", folder.display()))),
    }
}

/// Whether the file at `path` starts with [`CHART_MARK`].
fn is_our_chart(path: &Path) -> bool {
    let mut start = vec![0; CHART_MARK.len()];
    std::fs::File::open(path).and_then(|mut file| file.read_exact(&mut start)).is_ok() && start == CHART_MARK.as_bytes()
}

/// Writes `bytes` as the file `path`, whole: into a new file beside it, then
/// renamed over it (a link at `path` is replaced, not followed), so that a
/// reader never sees half a chart and a failed write leaves the old file.
pub fn write_replacing(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    let temporary = folder_of(path).join(format!(".{name}.autobatch-{}.tmp", std::process::id()));
    let written = std::fs::File::create(&temporary).and_then(|mut file| {
        file.write_all(bytes)?;
        file.sync_all()
    });
    match written.and_then(|()| std::fs::rename(&temporary, path)) {
        Ok(()) => Ok(()),
        Err(err) => {
            let _ = std::fs::remove_file(&temporary);
            Err(err)
        }
    }
}

fn folder_of(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Whether two paths name one file: the same file where both exist; where
/// either does not (yet), the same place once the folders that exist are
/// resolved (links followed) and the rest of each path is read as written
/// (`nd/../c2.svg` is `c2.svg` once `nd` is made).
fn same_file(a: &Path, b: &Path) -> bool {
    let resolved = |path: &Path| -> Option<PathBuf> {
        // a link to a file not written yet (the cache's first run) is followed by hand
        let mut path = path.to_path_buf();
        for _ in 0..40 {
            let Ok(target) = std::fs::read_link(&path) else { break };
            path = if target.is_relative() { folder_of(&path).join(target) } else { target };
        }
        resolve(&path)
    };
    match (resolved(a), resolved(b)) {
        (Some(a), Some(b)) => a == b,
        _ => a == b,
    }
}

/// `path` made absolute: its longest part that exists resolved by the file
/// system, the rest (`.` and `..` too) applied to it as written.
fn resolve(path: &Path) -> Option<PathBuf> {
    use std::path::Component;
    let absolute = if path.is_absolute() { path.to_path_buf() } else { std::env::current_dir().ok()?.join(path) };
    let parts: Vec<Component> = absolute.components().collect();
    for existing in (1..=parts.len()).rev() {
        let Ok(mut resolved) = std::fs::canonicalize(parts[..existing].iter().collect::<PathBuf>()) else {
            continue;
        };
        for part in &parts[existing..] {
            match part {
                Component::ParentDir => {
                    resolved.pop();
                }
                Component::Normal(name) => resolved.push(name),
                _ => {}
            }
        }
        return Some(resolved);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_through_a_missing_folder_is_the_file_it_comes_back_to() {
        let dir = std::env::temp_dir().join(format!("autobatch-paths-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cache = dir.join("c2.svg");
        std::fs::write(&cache, "{}").unwrap();
        assert!(same_file(&dir.join("missing/../c2.svg"), &cache));
        assert!(same_file(&dir.join("missing/deeper/../../c2.svg"), &dir.join("./c2.svg")));
        assert!(!same_file(&dir.join("missing/c2.svg"), &cache));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[cfg(test)]
mod trailing {
    use super::*;

    /// `x.svg/` and `k7.json/` name folders to the system though their last
    /// component reads as a file's: refused before any trial (issue 85),
    /// where the chart failed after the search and the cache warned after it.
    #[test]
    fn a_path_ending_in_a_slash_is_refused_before_anything_runs() {
        let dir = std::env::temp_dir().join(format!("autobatch-trailing-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (flag, name, kind) in [("--plot", "x.svg/", Kind::Chart), ("--cache", "k7.json/", Kind::Cache)] {
            let path = PathBuf::from(format!("{}/{name}", dir.display()));
            let refused = writable(flag, &path, kind).unwrap_err();
            assert!(refused.message.contains("names a folder"), "{}", refused.message);
            let file = dir.join(name.trim_end_matches('/'));
            assert!(writable(flag, &file, kind).is_ok(), "{}", file.display());
        }
        assert!(writable("--cache", &dir.join("k7.json/."), Kind::Cache).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
