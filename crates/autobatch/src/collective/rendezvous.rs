//! How ranks in separate processes meet: rank 0 publishes a communicator id
//! in a file every rank can read, the others wait for it. Kept apart from
//! NCCL so that it can be tested without a GPU.
//!
//! A file left by an earlier run must never be joined (its id is dead, and
//! joining it hangs in NCCL's init). The file carries the run's token: the
//! launcher's run id (`AUTOBATCH_RUN_ID`, else torchrun's
//! `TORCHELASTIC_RUN_ID`), or, without one, rank 0's start time, accepted by
//! the others only when it is not older than their own start (less a clock
//! skew allowance). Rank 0 removes any file it finds first, and writes
//! through a temporary name unique to its process, renamed over the path.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::Error;

const MAGIC: &str = "autobatch rendezvous 1";

/// How long a waiting rank tolerates rank 0's clock being behind its own,
/// when the run has no token.
const CLOCK_SKEW: Duration = Duration::from_secs(30);

/// Which run a file belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunToken {
    /// A token every rank of the run shares (a launcher's run id).
    Shared(String),
    /// No shared token: the file is stamped with rank 0's start time
    /// (milliseconds since the epoch), and a rank accepts files stamped no
    /// earlier than its own start, less the clock skew allowance.
    Started(u64),
}

impl RunToken {
    /// `AUTOBATCH_RUN_ID`, else `TORCHELASTIC_RUN_ID`, else this process's start.
    pub fn from_env() -> RunToken {
        RunToken::from_vars(|name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) over the variables `lookup` gives. An
    /// empty value is no token, nor is `none`: torchrun without
    /// `--rdzv-id` gives every run the id "none", which tells no two runs
    /// apart (a file of an earlier run would be joined, and hang).
    pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> RunToken {
        ["AUTOBATCH_RUN_ID", "TORCHELASTIC_RUN_ID"]
            .iter()
            .find_map(|name| {
                lookup(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty() && !v.eq_ignore_ascii_case("none"))
            })
            .map_or_else(|| RunToken::Started(now_ms()), RunToken::Shared)
    }

    fn stamp(&self) -> String {
        match self {
            RunToken::Shared(token) => format!("run {token}"),
            RunToken::Started(ms) => format!("started {ms}"),
        }
    }

    /// Whether a file stamped `stamp` belongs to this run.
    fn accepts(&self, stamp: &str) -> bool {
        match self {
            RunToken::Shared(_) => stamp == self.stamp(),
            RunToken::Started(mine) => stamp
                .strip_prefix("started ")
                .and_then(|ms| ms.parse::<u64>().ok())
                .is_some_and(|theirs| theirs.saturating_add(CLOCK_SKEW.as_millis() as u64) >= *mine),
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The file through which ranks share an id of `id_len` bytes.
#[derive(Clone, Debug)]
pub struct IdFile {
    path: PathBuf,
    token: RunToken,
    timeout: Duration,
    id_len: usize,
}

impl IdFile {
    /// The file at `path`, for the run `token`, waiting at most `timeout`.
    pub fn new(path: impl Into<PathBuf>, token: RunToken, timeout: Duration, id_len: usize) -> IdFile {
        IdFile { path: path.into(), token, timeout, id_len }
    }

    /// Rank 0: removes whatever file is there, then makes the id with
    /// `make_id` (NCCL's, which takes a while: the driver starts) and writes
    /// it with this run's token, atomically (a temporary name unique to this
    /// process and call, renamed over the path). The stale file goes first,
    /// so that no rank that starts meanwhile finds it.
    pub fn publish_new(&self, make_id: impl FnOnce() -> Result<Vec<u8>, Error>) -> Result<Vec<u8>, Error> {
        match std::fs::remove_file(&self.path) {
            Ok(()) => log::info!("removed a stale rendezvous file {}", self.path.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(self.failed("remove the stale", e)),
        }
        let id = make_id()?;
        self.publish(&id)?;
        Ok(id)
    }

    fn failed(&self, what: &str, e: std::io::Error) -> Error {
        Error::Collective(format!("cannot {what} {}: {e}", self.path.display()))
    }

    /// Rank 0: writes `id` with this run's token, atomically, over whatever
    /// file is there ([`publish_new`](Self::publish_new) removes it first).
    pub fn publish(&self, id: &[u8]) -> Result<(), Error> {
        if id.len() != self.id_len {
            return Err(Error::Collective(format!("an id of {} bytes, not {}", id.len(), self.id_len)));
        }
        let failed = |what: &str, e: std::io::Error| self.failed(what, e);
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let text = format!("{MAGIC}\n{}\n{hex}\n", self.token.stamp());
        let temporary = temporary_path(&self.path);
        std::fs::write(&temporary, text).map_err(|e| failed("write next to", e))?;
        std::fs::rename(&temporary, &self.path).map_err(|e| {
            let _ = std::fs::remove_file(&temporary);
            failed("write", e)
        })
    }

    /// The other ranks: waits for a file of this run and returns its id.
    /// A file of another run (or a torn or foreign one) is not taken; after
    /// the timeout, an error that says what was there.
    pub fn wait(&self) -> Result<Vec<u8>, Error> {
        let started = Instant::now();
        loop {
            let seen = match std::fs::read_to_string(&self.path) {
                Ok(text) => match self.parse(&text) {
                    Ok(id) => return Ok(id),
                    Err(why) => Some(why),
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => Some(format!("unreadable: {e}")),
            };
            if started.elapsed() >= self.timeout {
                let found =
                    seen.map_or_else(|| "no file was there".to_owned(), |why| format!("the file there is {why}"));
                return Err(Error::Collective(format!(
                    "rank 0 published no id for this run at {} within {:?} ({found}): is rank 0 running, with the \
                     same path and run id (AUTOBATCH_RUN_ID)?",
                    self.path.display(),
                    self.timeout
                )));
            }
            std::thread::sleep(Duration::from_millis(50).min(self.timeout / 4 + Duration::from_millis(1)));
        }
    }

    /// The id in `text`, or why it is not this run's.
    fn parse(&self, text: &str) -> Result<Vec<u8>, String> {
        let mut lines = text.lines();
        if lines.next() != Some(MAGIC) {
            return Err("not a rendezvous file (or half written)".to_owned());
        }
        let stamp = lines.next().unwrap_or("");
        if !self.token.accepts(stamp) {
            return Err(format!("from another run ({stamp})"));
        }
        let hex = lines.next().unwrap_or("");
        let id: Option<Vec<u8>> = (hex.len() == 2 * self.id_len)
            .then(|| (0..self.id_len).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()).collect())
            .flatten();
        id.ok_or_else(|| format!("not an id of {} bytes", self.id_len))
    }
}

/// The CUDA ordinal a rank of `local_rank` should be on, given what
/// `CUDA_VISIBLE_DEVICES` (`visible`) lets the process see: with one device
/// visible (a launcher that masks each rank to its GPU, as SLURM's
/// `--gpus-per-task` does) it is 0 for every rank; with several, or none
/// set, it is `local_rank`. A rank past the visible devices is an error
/// that says so.
pub fn expected_ordinal(local_rank: usize, visible: Option<&str>) -> Result<usize, Error> {
    let Some(visible) = visible.map(str::trim).filter(|v| !v.is_empty()) else { return Ok(local_rank) };
    let count = visible.split(',').filter(|d| !d.trim().is_empty()).count();
    match count {
        1 => Ok(0),
        n if local_rank < n => Ok(local_rank),
        n => Err(Error::Collective(format!(
            "LOCAL_RANK is {local_rank} but CUDA_VISIBLE_DEVICES={visible} shows {n} devices: give each rank one \
             device, or all of them"
        ))),
    }
}

/// `path` with `.<pid>.<n>.tmp` added to its whole name: unique to this
/// process and call, so that two id files sharing a stem never collide.
fn temporary_path(path: &Path) -> PathBuf {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(format!(".{}.{}.tmp", std::process::id(), CALLS.fetch_add(1, Ordering::Relaxed)));
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("autobatch-rendezvous-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn id(seed: u8) -> Vec<u8> {
        (0..128).map(|i| seed.wrapping_add(i as u8)).collect()
    }

    #[test]
    fn a_waiting_rank_gets_the_id_rank_0_publishes() {
        let path = folder("basic").join("nccl.id");
        let token = RunToken::Shared("job-7".into());
        let file = IdFile::new(&path, token.clone(), Duration::from_secs(5), 128);
        let waiter = {
            let file = file.clone();
            std::thread::spawn(move || file.wait())
        };
        std::thread::sleep(Duration::from_millis(100));
        file.publish(&id(3)).unwrap();
        assert_eq!(waiter.join().unwrap().unwrap(), id(3));
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[test]
    fn a_stale_file_of_another_run_is_never_joined() {
        let path = folder("stale").join("nccl.id");
        IdFile::new(&path, RunToken::Shared("old".into()), Duration::from_secs(1), 128).publish(&id(1)).unwrap();
        let file = IdFile::new(&path, RunToken::Shared("new".into()), Duration::from_secs(5), 128);
        let waiter = {
            let file = file.clone();
            std::thread::spawn(move || file.wait())
        };
        std::thread::sleep(Duration::from_millis(200)); // the waiter sees the old file meanwhile
        file.publish(&id(2)).unwrap();
        assert_eq!(waiter.join().unwrap().unwrap(), id(2), "joined the stale id");

        // without a shared token: a file stamped long before this rank started is stale
        let old = IdFile::new(&path, RunToken::Started(now_ms() - 3_600_000), Duration::from_secs(1), 128);
        old.publish(&id(4)).unwrap();
        let mine = IdFile::new(&path, RunToken::Started(now_ms()), Duration::from_millis(300), 128);
        let err = mine.wait().unwrap_err().to_string();
        assert!(err.contains("from another run") && err.contains("within"), "{err}");
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[test]
    fn none_is_no_run_token() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_owned())
        };
        // torchrun without --rdzv-id: every run is "none"
        assert!(matches!(RunToken::from_vars(vars(&[("TORCHELASTIC_RUN_ID", "none")])), RunToken::Started(_)));
        assert!(matches!(RunToken::from_vars(vars(&[("TORCHELASTIC_RUN_ID", " NONE ")])), RunToken::Started(_)));
        assert!(matches!(RunToken::from_vars(vars(&[("AUTOBATCH_RUN_ID", "")])), RunToken::Started(_)));
        assert_eq!(
            RunToken::from_vars(vars(&[("AUTOBATCH_RUN_ID", "none"), ("TORCHELASTIC_RUN_ID", "job-3")])),
            RunToken::Shared("job-3".into())
        );
        assert_eq!(
            RunToken::from_vars(vars(&[("AUTOBATCH_RUN_ID", "a"), ("TORCHELASTIC_RUN_ID", "b")])),
            RunToken::Shared("a".into())
        );
    }

    #[test]
    fn the_stale_file_is_gone_before_the_new_id_is_made() {
        let path = folder("order").join("nccl.id");
        let token = RunToken::Started(now_ms());
        // an earlier run of the same start (within the clock skew allowance): a waiting rank would take it
        IdFile::new(&path, token.clone(), Duration::from_secs(1), 128).publish(&id(1)).unwrap();
        let file = IdFile::new(&path, token, Duration::from_secs(5), 128);
        let made = file
            .publish_new(|| {
                assert!(!path.exists(), "the stale file was still there while the id was made");
                Ok(id(2))
            })
            .unwrap();
        assert_eq!(made, id(2));
        assert_eq!(file.wait().unwrap(), id(2));
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[test]
    fn the_expected_gpu_follows_what_the_process_sees() {
        assert_eq!(expected_ordinal(3, None).unwrap(), 3);
        assert_eq!(expected_ordinal(3, Some("")).unwrap(), 3);
        // SLURM or a launcher masking each rank to its own GPU
        assert_eq!(expected_ordinal(3, Some("5")).unwrap(), 0);
        assert_eq!(expected_ordinal(1, Some("GPU-8f2a")).unwrap(), 0);
        assert_eq!(expected_ordinal(2, Some("0,1,2,3")).unwrap(), 2);
        let err = expected_ordinal(5, Some("0,1")).unwrap_err().to_string();
        assert!(err.contains("LOCAL_RANK is 5") && err.contains("2 devices"), "{err}");
    }

    #[test]
    fn waiting_ends_with_a_clear_error() {
        let path = folder("timeout").join("nccl.id");
        let started = Instant::now();
        let err = IdFile::new(&path, RunToken::Shared("x".into()), Duration::from_millis(200), 128).wait().unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5));
        let text = err.to_string();
        assert!(text.contains("no file was there") && text.contains("AUTOBATCH_RUN_ID"), "{text}");
        // a torn or foreign file is not an id
        std::fs::write(&path, "hello").unwrap();
        let err = IdFile::new(&path, RunToken::Shared("x".into()), Duration::from_millis(100), 128).wait().unwrap_err();
        assert!(err.to_string().contains("not a rendezvous file"), "{err}");
        std::fs::write(&path, format!("{MAGIC}\nrun x\nabcd\n")).unwrap();
        let err = IdFile::new(&path, RunToken::Shared("x".into()), Duration::from_millis(100), 128).wait().unwrap_err();
        assert!(err.to_string().contains("not an id of 128 bytes"), "{err}");
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[test]
    fn temporary_names_are_unique_even_for_files_sharing_a_stem() {
        let dir = folder("names");
        let (a, b) = (dir.join("job.a"), dir.join("job.b"));
        assert_ne!(temporary_path(&a), temporary_path(&b));
        assert_ne!(temporary_path(&a), temporary_path(&a));
        assert!(temporary_path(&a).to_string_lossy().ends_with(".tmp"));
        let token = RunToken::Shared("t".into());
        std::thread::scope(|s| {
            s.spawn(|| IdFile::new(&a, token.clone(), Duration::from_secs(1), 128).publish(&id(5)).unwrap());
            s.spawn(|| IdFile::new(&b, token.clone(), Duration::from_secs(1), 128).publish(&id(6)).unwrap());
        });
        assert_eq!(IdFile::new(&a, token.clone(), Duration::from_secs(1), 128).wait().unwrap(), id(5));
        assert_eq!(IdFile::new(&b, token, Duration::from_secs(1), 128).wait().unwrap(), id(6));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
