//! `autobatch plan`: the accumulation arithmetic alone, no device.

use crate::output::outln;
use autobatch::{plan::Accumulation, plan::RankSplit};

use crate::args::PlanArgs;
use crate::failure::{Failure, Flags};
use crate::values::counts;

/// `autobatch plan`: the split, as text or JSON.
pub fn run(args: &PlanArgs) -> Result<(), Failure> {
    let (text, json) = match args.largest {
        Some(_) => even(args).map(|split| (split.to_string(), serde_json::to_string_pretty(&split)))?,
        None => uneven(args).map(|split| (split.to_string(), serde_json::to_string_pretty(&split)))?,
    };
    if args.json.on {
        outln!("{}", json.expect("plain values serialize"));
    } else {
        outln!("{text}");
    }
    Ok(())
}

/// `plan --largest 48`: the target over `--world-size` equal ranks.
fn even(args: &PlanArgs) -> Result<Accumulation, Failure> {
    let largest = args.largest.map_or(0, |largest| largest.get());
    let multiple_of = args.granule.multiple_of.get();
    if largest < multiple_of {
        return Err(Failure::usage(format!(
            "--largest {largest} is below --multiple-of {multiple_of}: no micro-batch that is a multiple of \
             {multiple_of} fits; lower --multiple-of to at most {largest}"
        )));
    }
    let (target, world_size) = (args.target.get(), args.split.world_size.get());
    let planned = match args.split.equal_micro_batches {
        true => Accumulation::plan_equal(target, world_size, largest, multiple_of),
        false => Accumulation::plan_aligned(target, world_size, largest, multiple_of),
    };
    let split = planned.map_err(|err| plan_error(err, "--world-size"))?;
    match args.split.exact {
        true => split.require_exact().map_err(|err| plan_error(err, "--world-size")),
        false => Ok(split),
    }
}

/// `plan --uneven 200,90`: the target shared among ranks of uneven capacity.
fn uneven(args: &PlanArgs) -> Result<RankSplit, Failure> {
    let (largest, multiple_of) = (counts(&args.uneven), args.granule.multiple_of.get());
    if let Some(rank) = largest.iter().position(|&largest| largest < multiple_of) {
        return Err(Failure::usage(format!(
            "--uneven: rank {rank}'s largest micro-batch {} is below --multiple-of {multiple_of}: it cannot take one",
            largest[rank]
        )));
    }
    let split = RankSplit::plan(args.target.get(), &largest, multiple_of).map_err(|err| plan_error(err, "--uneven"))?;
    match args.split.exact {
        true => split.require_exact().map_err(|err| plan_error(err, "--uneven")),
        false => Ok(split),
    }
}

/// `plan`'s errors in its own flags (`ranks`: `--world-size`, or `--uneven`
/// with one number per rank).
fn plan_error(err: autobatch::Error, ranks: &'static str) -> Failure {
    Failure::in_flags(err, &Flags { target: "--target", ranks, largest: "--largest", ..Flags::PROBE })
}
