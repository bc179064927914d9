//! The files `probe` reads and writes (`--cache`, `--plot`), checked before
//! the first trial: a probe that runs for minutes must not fail at its end
//! because its chart cannot be written, block on a named pipe, or write its
//! chart over its cache.

use std::path::{Path, PathBuf};

use crate::args::ProbeArgs;
use crate::failure::Failure;

/// Checks `--cache` and `--plot`: each names a regular file or a new one in a
/// folder that can be written, and not the same file as the other.
pub fn check(args: &ProbeArgs) -> Result<(), Failure> {
    if let Some(path) = &args.output.plot {
        check_plot(path)?;
    }
    if let Some(path) = &args.plan.cache {
        // the cache makes its folders
        writable("--cache", path, true)?;
    }
    if let (Some(cache), Some(plot)) = (&args.plan.cache, &args.output.plot)
        && same_file(cache, plot)
    {
        return Err(Failure::usage(format!(
            "--cache {} and --plot {} name the same file: the chart would be written over the cache; give \
                 each its own file",
            cache.display(),
            plot.display()
        )));
    }
    Ok(())
}

/// `--plot`: an SVG file that can be written.
pub fn check_plot(path: &Path) -> Result<(), Failure> {
    let is_svg = path.extension().and_then(|e| e.to_str()).is_some_and(|e| e.eq_ignore_ascii_case("svg"));
    if !is_svg {
        return Err(Failure::usage(format!("--plot {}: the chart is SVG; name a .svg file", path.display())));
    }
    writable("--plot", path, false)
}

/// `path` is a regular file this process may write, or a new file in an
/// existing folder it may write in (tried with a file of its own, removed);
/// with `makes_folders`, in a folder that can be made in the nearest one that
/// exists.
fn writable(flag: &str, path: &Path, makes_folders: bool) -> Result<(), Failure> {
    let refuse = |why: String| Failure::usage(format!("{flag} {}: {why}", path.display()));
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => return Err(refuse("is a folder; name a file in it".to_owned())),
        Ok(meta) if !meta.is_file() => {
            return Err(refuse("is not a regular file (a pipe or a device); name a file".to_owned()));
        }
        Ok(meta) if meta.permissions().readonly() => return Err(refuse("is read-only".to_owned())),
        Ok(_) => {
            // opened for writing without truncating: the file stays as it is
            return std::fs::OpenOptions::new()
                .append(true)
                .open(path)
                .map(drop)
                .map_err(|err| refuse(format!("cannot be written: {err}")));
        }
        Err(_) => {}
    }
    let mut folder = folder_of(path);
    if makes_folders {
        while !folder.exists() && folder_of(folder) != folder {
            folder = folder_of(folder);
        }
    }
    if !folder.is_dir() {
        return Err(refuse(format!("the folder {} does not exist", folder.display())));
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
