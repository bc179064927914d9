//! `autobatch`: find the largest batch that fits, plan gradient accumulation,
//! estimate training memory. See `autobatch --help`.

mod args;
mod device_flags;
mod estimate;
mod failure;
mod hub;
mod limits;
mod model;
mod output;
mod parse;
mod paths;
mod plan;
mod plot;
mod probe;
mod progress;
mod serve;
mod values;

use std::process::ExitCode;

use args::{Cli, Command};
use failure::{Failure, clap_message};
use output::errln;

// The CPU meter counts the heap through this allocator.
#[global_allocator]
static ALLOCATOR: autobatch::TrackingAllocator = autobatch::TrackingAllocator::new();

fn main() -> ExitCode {
    end_quietly_on_a_closed_pipe();
    let cli = match Cli::parse_from(std::env::args_os()) {
        Ok(cli) => cli,
        Err(err) => {
            use clap::error::ErrorKind::{DisplayHelp, DisplayVersion};
            if matches!(err.kind(), DisplayHelp | DisplayVersion) {
                return match err.print().and_then(|()| std::io::Write::flush(&mut std::io::stdout())) {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(write) => report(Failure::runtime(output::said(output::Stream::Stdout, &write))),
                };
            }
            errln!("error: {}", clap_message(&err));
            return ExitCode::from(2);
        }
    };
    init_logging(cli.verbose);
    for note in parse::notes() {
        log::warn!("{note}");
    }
    progress::exit_cleanly_on_interrupt();
    let answered = match cli.command {
        // no command: `autobatch probe` with the flags given
        None => probe::run(&cli.probe),
        Some(Command::Probe(args)) => probe::run(&args),
        // `estimate --serve` counts serving: serve's count, not a training step's
        Some(Command::Estimate(args)) if args.serving.serve && args.state.config.path.is_some() => {
            serve::estimate(&args)
        }
        Some(Command::Estimate(args)) => estimate::run(&args),
        Some(Command::Plan(args)) => plan::run(&args),
        Some(Command::Serve(args)) => serve::run(&args),
    };
    // a command that failed says why; one whose answer could not be written, that
    match answered.and_then(|()| output::check()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => report(failure),
    }
}

/// A reader that stops reading (`autobatch probe | head -1`) ends the process
/// as it ends any Unix tool: by SIGPIPE, quietly. Rust ignores the signal, so
/// a write to the closed pipe would fail (see `output`).
fn end_quietly_on_a_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: at the start of main, before any thread exists: setting a
    // signal's disposition to its default is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn report(failure: Failure) -> ExitCode {
    if let Some(json) = &failure.json {
        output::outln!("{}", serde_json::to_string_pretty(json).expect("plain values serialize"));
    }
    // where stderr cannot take the line either, the exit code alone says it
    errln!("error: {}", failure.message);
    failure.exit_code()
}

fn init_logging(verbose: u8) {
    let level = match verbose {
        0 => log::LevelFilter::Warn,
        1 => log::LevelFilter::Info,
        _ => log::LevelFilter::Debug,
    };
    let mut builder = env_logger::Builder::new();
    builder.filter_level(level);
    if verbose == 0 {
        // a plan's warnings are in its report (text) or its JSON: logging them
        // too would print each twice
        builder.filter_module("autobatch::tuner", log::LevelFilter::Error);
        builder.filter_module("autobatch::model", log::LevelFilter::Error);
    }
    // `warning: ...`, as the error line reads `error: ...`: no module paths
    builder.format(|out, record| {
        use std::io::Write;
        let level = match record.level() {
            log::Level::Error => "error",
            log::Level::Warn => "warning",
            log::Level::Info => "info",
            log::Level::Debug | log::Level::Trace => "debug",
        };
        writeln!(out, "{level}: {}", record.args())
    });
    builder.parse_default_env().target(env_logger::Target::Pipe(Box::new(output::LogWriter))).init();
}
