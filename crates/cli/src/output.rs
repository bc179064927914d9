//! Everything the tool prints goes through here, so that a write that fails
//! (a full disk, `> /dev/full`, a closed descriptor) ends the command with
//! exit 1 and one line, instead of `println!`'s panic (exit 101).
//!
//! A failed write is remembered, not returned: the trial rows are written from
//! inside a search, where no caller can take an error, and the answer is
//! printed after the work is done, so the command ends as it would have, then
//! says what could not be written. A reader that closes the pipe
//! (`autobatch … | head -1`) still ends the process by SIGPIPE (exit 141),
//! before any write returns (see `main`).

use std::fmt;
use std::io::Write;
use std::sync::Mutex;

use crate::failure::Failure;

/// The first write that failed: the stream's name and the error, said.
static FAILED: Mutex<Option<String>> = Mutex::new(None);

/// Which standard stream a line goes to.
#[derive(Clone, Copy, Debug)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Writes `text` to `stream` and flushes it (a buffered line that fails at
/// exit would fail silently); a failure is remembered for [`check`].
pub fn write(stream: Stream, text: fmt::Arguments<'_>) {
    let written = match stream {
        Stream::Stdout => {
            let mut out = std::io::stdout().lock();
            out.write_fmt(text).and_then(|()| out.flush())
        }
        Stream::Stderr => {
            let mut err = std::io::stderr().lock();
            err.write_fmt(text).and_then(|()| err.flush())
        }
    };
    if let Err(err) = written {
        remember(stream, &err);
    }
}

/// Remembers that a write to `stream` failed (the first failure is the one said).
pub fn remember(stream: Stream, err: &std::io::Error) {
    let mut failed = FAILED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if failed.is_none() {
        *failed = Some(said(stream, err));
    }
}

/// A failed write, said.
pub fn said(stream: Stream, err: &std::io::Error) -> String {
    let name = match stream {
        Stream::Stdout => "standard output",
        Stream::Stderr => "standard error",
    };
    format!("could not write to {name}: {err}")
}

/// The command's failure if any of its writes failed: what it printed is not
/// all it meant to say.
pub fn check() -> Result<(), Failure> {
    let failed = FAILED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    match failed.as_ref() {
        Some(message) => Err(Failure::runtime(message.clone())),
        None => Ok(()),
    }
}

/// The log's stream (warnings, `-v`'s lines): stderr, its failures
/// remembered as every other write's (a warning lost to `2>/dev/full` ends
/// the command with exit 1, as a lost answer does).
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let mut err = std::io::stderr().lock();
        let written = err.write_all(bytes).and_then(|()| err.flush());
        if let Err(failed) = &written {
            remember(Stream::Stderr, failed);
        }
        written.map(|()| bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().lock().flush()
    }
}

/// `print!` to stdout, through [`write()`].
macro_rules! out {
    ($($arg:tt)*) => { $crate::output::write($crate::output::Stream::Stdout, format_args!($($arg)*)) };
}

/// `println!` to stdout, through [`write()`].
macro_rules! outln {
    () => { $crate::output::write($crate::output::Stream::Stdout, format_args!("\n")) };
    ($($arg:tt)*) => { $crate::output::write($crate::output::Stream::Stdout, format_args!("{}\n", format_args!($($arg)*))) };
}

/// `eprintln!` to stderr, through [`write()`].
macro_rules! errln {
    ($($arg:tt)*) => { $crate::output::write($crate::output::Stream::Stderr, format_args!("{}\n", format_args!($($arg)*))) };
}

pub(crate) use {errln, out, outln};
