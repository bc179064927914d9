//! The memory this process may use, from every limit it lives under: the
//! machine's available RAM and swap, its cgroup's memory limit (v2
//! `memory.max`, v1 `memory.limit_in_bytes`), and its resource limits on
//! address space and data (`ulimit -v`, `ulimit -d`). A CPU step cannot fail
//! on allocation in Rust: past any of these the process aborts or is killed,
//! so the budget is checked against them before any trial runs.

use std::path::{Path, PathBuf};

/// One limit and the room it leaves now.
#[derive(Clone, Debug, PartialEq)]
pub struct Room {
    /// What the limit is, for people: `RAM and swap available`, `ulimit -v`, ...
    pub what: &'static str,
    /// Bytes that can still be allocated under it.
    pub bytes: u64,
    /// Whether going past it ends the process (a resource or cgroup limit)
    /// rather than slowing it down (swap).
    pub hard: bool,
}

/// Every limit that applies, read now (Linux; elsewhere none is known).
pub fn rooms() -> Vec<Room> {
    let mut rooms = Vec::new();
    if let Some((available, swap_free)) = meminfo() {
        rooms.push(Room { what: "RAM available", bytes: available, hard: false });
        rooms.push(Room { what: "RAM and swap available", bytes: available.saturating_add(swap_free), hard: true });
    }
    if let Some(room) = cgroup_room() {
        rooms.push(Room { what: "its cgroup's memory limit", bytes: room, hard: true });
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    for (limit, used, what) in [
        ("Max address space", "VmSize:", "its address-space limit (ulimit -v)"),
        ("Max data size", "VmData:", "its data-size limit (ulimit -d)"),
    ] {
        if let Some(limit) = soft_limit(&limits, limit) {
            let used = kilobytes(&status, used).unwrap_or(0);
            rooms.push(Room { what, bytes: limit.saturating_sub(used), hard: true });
        }
    }
    rooms
}

/// (MemAvailable, SwapFree) from `/proc/meminfo`, in bytes.
fn meminfo() -> Option<(u64, u64)> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    Some((kilobytes(&meminfo, "MemAvailable:")?, kilobytes(&meminfo, "SwapFree:").unwrap_or(0)))
}

/// A `Name:   1234 kB` field, in bytes.
fn kilobytes(text: &str, name: &str) -> Option<u64> {
    let rest = text.lines().find_map(|line| line.strip_prefix(name))?;
    rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok()?.checked_mul(1024)
}

/// The soft limit of a `/proc/self/limits` row, in bytes; `None` when unlimited.
fn soft_limit(limits: &str, name: &str) -> Option<u64> {
    let row = limits.lines().find(|line| line.starts_with(name))?;
    row[name.len()..].split_whitespace().next()?.parse().ok()
}

/// Limits this large mean none.
const UNLIMITED: u64 = 1 << 60;

/// The room under the tightest memory limit of this process's cgroup and
/// its ancestors, v2 or v1.
fn cgroup_room() -> Option<u64> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let root = Path::new("/sys/fs/cgroup");
    let mut tightest: Option<u64> = None;
    for line in cgroups.lines() {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let (dir, limit_file, usage_file) = match controllers {
            "" => (root.to_path_buf(), "memory.max", "memory.current"),
            list if list.split(',').any(|c| c == "memory") => {
                (root.join("memory"), "memory.limit_in_bytes", "memory.usage_in_bytes")
            }
            _ => continue,
        };
        for dir in ancestors(&dir, path) {
            let read = |file: &str| std::fs::read_to_string(dir.join(file)).ok();
            let Some(limit) = read(limit_file).and_then(|text| text.trim().parse::<u64>().ok()) else { continue };
            if limit >= UNLIMITED {
                continue;
            }
            let used = read(usage_file).and_then(|text| text.trim().parse::<u64>().ok()).unwrap_or(0);
            let room = limit.saturating_sub(used);
            tightest = Some(tightest.map_or(room, |t| t.min(room)));
        }
    }
    tightest
}

/// `base/path` and each of its parents down to `base` (a container sees its
/// own cgroup at `base`, so the path may not exist below it).
fn ancestors(base: &Path, path: &str) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let mut current = PathBuf::from(path.trim_start_matches('/'));
    loop {
        dirs.push(base.join(&current));
        if !current.pop() {
            break;
        }
    }
    dirs.dedup();
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_proc_rows() {
        let limits = "Limit  Soft Limit Hard Limit Units\nMax data size             unlimited            unlimited            bytes\nMax address space         8192000000           8192000000           bytes\n";
        assert_eq!(soft_limit(limits, "Max address space"), Some(8_192_000_000));
        assert_eq!(soft_limit(limits, "Max data size"), None);
        assert_eq!(kilobytes("VmSize:\t    3896 kB\n", "VmSize:"), Some(3896 * 1024));
        let dirs = ancestors(Path::new("/sys/fs/cgroup"), "/a/b");
        assert_eq!(dirs, [Path::new("/sys/fs/cgroup/a/b"), Path::new("/sys/fs/cgroup/a"), Path::new("/sys/fs/cgroup")]);
    }
}
