//! Live trial output: a row per trial as it ends, and a spinner on a terminal
//! while a trial runs.
//!
//! Why not `indicatif` (the crate made for live lines): measured on 0.17, its
//! steady tick allocates on its own thread at every frame (100 allocations,
//! 2,480 bytes in 2 s at 10 Hz: about 124 bytes a frame), and on the CPU every
//! allocation of the process lands in the heap peak a trial measures. That
//! noise is small, but it lands at random: the same probe could answer one
//! batch differently on a terminal (spinner shown) than piped (none) when a
//! peak falls within a frame's bytes of the limit. The spinner here formats
//! straight into the locked stderr and allocates nothing while a trial runs.

use crate::output::{errln, outln};
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use autobatch::{Observer, plan::Trial, plan::TrialKind};

/// The exit code of a process ended by SIGINT (128 + 2), as shells report it.
const INTERRUPTED: i32 = 130;

/// On Ctrl-C: clear the live status line, say so, exit with 130. The line is
/// cleared under the stderr lock, which the spinner takes to draw, so no frame
/// lands after it. The plan cache is written atomically (a temporary file
/// renamed over it), so an interrupt never leaves half a cache.
pub fn exit_cleanly_on_interrupt() {
    let installed = ctrlc::set_handler(|| {
        let mut stderr = std::io::stderr().lock();
        if stderr.is_terminal() {
            let _ = write!(stderr, "\r\x1b[K");
        }
        let _ = writeln!(stderr, "interrupted");
        let _ = stderr.flush();
        std::process::exit(INTERRUPTED);
    });
    if let Err(err) = installed {
        log::debug!("no interrupt handler: {err}");
    }
}

/// Prints each trial as it finishes, to stdout (or stderr when stdout carries JSON).
pub struct Progress {
    rows_to_stderr: bool,
    rows: usize,
    /// The width of the batch column: widened (with a new header) when a
    /// batch does not fit in it, so that the columns stay aligned.
    batch_width: usize,
    spinner: Option<Spinner>,
    /// A heading (`length 64:`) printed before the next trial's row, so that
    /// a search that runs none (a cache hit) leaves no empty heading.
    heading: Option<String>,
    /// What the trials' sizes are when the search is over the input size
    /// (`seq-len`): the column's name, and no samples per second.
    size_word: Option<&'static str>,
}

impl Progress {
    /// A progress display a tuner holds ([`Tuner::observer`](autobatch::Tuner::observer)):
    /// its rows end when the tuner (the last holder) drops it.
    pub fn shared(json: bool) -> std::sync::Arc<std::sync::Mutex<Progress>> {
        std::sync::Arc::new(std::sync::Mutex::new(Progress::new(json)))
    }

    pub fn new(rows_to_stderr: bool) -> Self {
        let spinner = std::io::stderr().is_terminal().then(Spinner::start);
        Progress { rows_to_stderr, rows: 0, batch_width: Trial::BATCH_WIDTH, spinner, heading: None, size_word: None }
    }

    /// Trials are input sizes named `word` (a search over the size).
    pub fn sizes(mut self, word: &'static str) -> Self {
        self.size_word = Some(word);
        if let Some(spinner) = &self.spinner {
            spinner.state.sizes.store(true, Ordering::Relaxed);
        }
        self
    }

    /// Starts a new table under `heading`, printed with its first trial.
    fn start_table(&mut self, heading: String) {
        if let Some(spinner) = &self.spinner {
            spinner.hide();
        }
        self.heading = Some(heading);
        self.rows = 0;
    }

    fn print_header(&self) {
        if let Some(spinner) = &self.spinner {
            spinner.hide();
        }
        let header = match self.size_word {
            Some(word) => {
                let width = self.batch_width.max(word.len());
                format!(
                    "{:>5}  {word:>width$}  {:<13}  {:>9}  {:>6}  {:>9}",
                    "trial", "outcome", "peak", "util", "time"
                )
            }
            None => Trial::table_header_with_width(self.batch_width),
        };
        self.print_row(&header);
    }

    fn print_row(&self, row: &str) {
        if self.rows_to_stderr {
            errln!("{row}");
        } else {
            outln!("{row}");
        }
    }
}

impl Observer for Progress {
    fn warmup_started(&mut self, batch: usize) {
        if let Some(spinner) = &self.spinner {
            spinner.show(0, batch);
        }
    }

    fn evaluation_alone_started(&mut self, start: usize, freed_bytes: u64) {
        self.start_table(format!(
            "evaluation step alone ({} of training's optimizer state freed), from batch {start}:",
            autobatch::Bytes(freed_bytes)
        ));
    }

    fn evaluation_started(&mut self, start: usize) {
        self.start_table(format!("evaluation step (forward only), beside training's state, from batch {start}:"));
    }

    fn size_started(&mut self, size: usize) {
        self.start_table(format!("length {size}:"));
    }

    fn size_search_started(&mut self, batch: usize) {
        let word = self.size_word.unwrap_or("size");
        self.start_table(format!("largest {word} at batch {batch}:"));
    }

    fn variant_started(&mut self, name: &str) {
        self.start_table(format!("variant: {name}"));
    }

    fn variant_finished(&mut self, name: &str, largest_batch: Option<usize>) {
        if let Some(spinner) = &self.spinner {
            spinner.hide();
        }
        match largest_batch {
            Some(batch) => self.print_row(&format!("{name}: largest batch {batch}\n")),
            None => self.print_row(&format!("{name}: nothing fits\n")),
        }
    }

    fn trial_started(&mut self, batch: usize, _kind: TrialKind) {
        if let Some(heading) = self.heading.take() {
            if let Some(spinner) = &self.spinner {
                spinner.hide();
            }
            self.print_row(&heading);
        }
        let width = batch.to_string().len();
        if self.rows == 0 || width > self.batch_width {
            self.batch_width = self.batch_width.max(width);
            self.print_header();
        }
        if let Some(spinner) = &self.spinner {
            spinner.show(self.rows + 1, batch);
        }
    }

    fn trial_finished(&mut self, trial: &Trial, capacity_bytes: u64) {
        if let Some(spinner) = &self.spinner {
            spinner.hide();
        }
        self.rows += 1;
        let row = match self.size_word {
            Some(word) => {
                let width = self.batch_width.max(word.len());
                let (peak, util) = match trial.peak_bytes {
                    Some(peak) => (
                        autobatch::Bytes(peak).to_string(),
                        format!("{:.1}%", 100.0 * peak as f64 / capacity_bytes as f64),
                    ),
                    None => ("-".to_owned(), "-".to_owned()),
                };
                let seconds = trial.duration.as_secs_f64();
                let time = if seconds >= 1.0 { format!("{seconds:.2} s") } else { format!("{:.1} ms", seconds * 1e3) };
                let kind = if trial.kind == TrialKind::Recheck { "  (re-check)" } else { "" };
                format!(
                    "{:>5}  {:>width$}  {:<13}  {peak:>9}  {util:>6}  {time:>9}{kind}",
                    self.rows,
                    trial.batch,
                    trial.outcome.to_string()
                )
            }
            None => trial.table_row_with_width(self.rows, capacity_bytes, self.batch_width),
        };
        self.print_row(&row);
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(spinner) = self.spinner.take() {
            spinner.stop();
        }
    }
}

/// A thread that redraws one status line on stderr while a trial runs. It
/// allocates nothing while drawing (formatting straight into the locked
/// stderr), so that it does not disturb a heap measurement.
struct Spinner {
    state: Arc<SpinnerState>,
    thread: JoinHandle<()>,
}

struct SpinnerState {
    epoch: Instant,
    visible: AtomicBool,
    stop: AtomicBool,
    number: AtomicUsize,
    batch: AtomicUsize,
    since_nanos: AtomicU64,
    /// Trials are input sizes, not batches.
    sizes: AtomicBool,
}

const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

impl Spinner {
    fn start() -> Spinner {
        let state = Arc::new(SpinnerState {
            epoch: Instant::now(),
            visible: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            number: AtomicUsize::new(0),
            batch: AtomicUsize::new(0),
            since_nanos: AtomicU64::new(0),
            sizes: AtomicBool::new(false),
        });
        let shared = Arc::clone(&state);
        let thread = std::thread::spawn(move || {
            let mut frame = 0;
            while !shared.stop.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(100));
                let mut stderr = std::io::stderr().lock();
                // checked under the lock: `hide` clears the line under it too
                if !shared.visible.load(Ordering::Acquire) {
                    continue;
                }
                let since = Duration::from_nanos(shared.since_nanos.load(Ordering::Relaxed));
                let elapsed = shared.epoch.elapsed().saturating_sub(since).as_secs_f64();
                let batch = shared.batch.load(Ordering::Relaxed);
                let what = if shared.sizes.load(Ordering::Relaxed) { "size" } else { "batch" };
                let _ = match shared.number.load(Ordering::Relaxed) {
                    0 => write!(stderr, "\r{} warm-up at {what} {batch}  {elapsed:.1} s\x1b[K", FRAMES[frame]),
                    n => write!(stderr, "\r{} trial {n}: {what} {batch} running  {elapsed:.1} s\x1b[K", FRAMES[frame]),
                };
                let _ = stderr.flush();
                frame = (frame + 1) % FRAMES.len();
            }
        });
        Spinner { state, thread }
    }

    fn show(&self, number: usize, batch: usize) {
        let state = &self.state;
        state.number.store(number, Ordering::Relaxed);
        state.batch.store(batch, Ordering::Relaxed);
        state.since_nanos.store(state.epoch.elapsed().as_nanos() as u64, Ordering::Relaxed);
        state.visible.store(true, Ordering::Release);
    }

    fn hide(&self) {
        let mut stderr = std::io::stderr().lock();
        if self.state.visible.swap(false, Ordering::AcqRel) {
            let _ = write!(stderr, "\r\x1b[K");
            let _ = stderr.flush();
        }
    }

    fn stop(self) {
        self.hide();
        self.state.stop.store(true, Ordering::Release);
        let _ = self.thread.join();
    }
}
