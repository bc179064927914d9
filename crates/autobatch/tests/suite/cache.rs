//! The plan cache: hits skip probing, any change misses, bad files are ignored,
//! concurrent writers never corrupt it.

use std::path::PathBuf;

use autobatch::memory::simulated::{MemoryCurve, SimulatedMeter, SimulatedWorkload, Simulation};
use autobatch::{CacheKey, Error, Plan, Tuner, plan::Warning};
use candle_core::{DType, Device, Var};

use crate::common::accumulating::Accumulating;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cache-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("plans.json")
}

fn device(capacity: u64) -> (SimulatedWorkload, SimulatedMeter) {
    Simulation::new(capacity, MemoryCurve::affine(2 * GIB, 100 * MIB)).name("sim-A").build()
}

fn model_key(hidden: usize, seq_len: usize) -> CacheKey {
    let weight = Var::zeros((hidden, hidden), DType::F32, &Device::Cpu).unwrap();
    let bias = Var::zeros(hidden, DType::F32, &Device::Cpu).unwrap();
    CacheKey::new().variables([("fc.weight", &weight), ("fc.bias", &bias)]).param("seq_len", seq_len)
}

fn run(tuner: &Tuner, capacity: u64) -> (Plan, usize) {
    let (mut workload, mut meter) = device(capacity);
    let plan = tuner.search(&mut workload, &mut meter).run().unwrap();
    (plan, workload.steps())
}

#[test]
fn a_hit_skips_probing_and_keeps_the_answer() {
    let path = scratch("hit");
    let tuner = Tuner::new().cache(&path).cache_key(model_key(64, 512));
    let (first, steps) = run(&tuner, 16 * GIB);
    assert!(!first.cached() && steps > 0);
    let (second, steps) = run(&tuner, 16 * GIB);
    assert_eq!(steps, 0, "a hit runs no step");
    assert!(second.cached());
    assert_eq!((second.largest_batch(), second.peak_bytes()), (first.largest_batch(), first.peak_bytes()));
    assert_eq!(second.trials(), first.trials());

    // the accumulation is planned anew from the cached largest batch
    let (third, steps) = run(&tuner.clone().target_effective_batch(1000).world_size(4), 16 * GIB);
    assert_eq!(steps, 0);
    assert_eq!(third.micro_batch() * third.accumulation_steps() * 4, third.effective_batch());
    assert!(third.effective_batch() >= 1000 && third.micro_batch() <= first.largest_batch());
}

#[test]
fn an_answer_a_budget_cut_short_is_never_served_as_final() {
    let path = scratch("unproven");
    let tuner = Tuner::new().cache(&path).cache_key(model_key(64, 512));
    let (truth, _) = run(&Tuner::new(), 16 * GIB);
    assert!(truth.proven_largest());
    // stored cut short by the trial limit: batch 1 or 2, not proven
    let (cut, _) = run(&tuner.clone().max_trials(2), 16 * GIB);
    assert!(!cut.proven_largest() && cut.largest_batch() < truth.largest_batch(), "{cut}");
    // the same settings without the limit: searched again (from the stored
    // answer), the true answer, and said so
    let (resumed, steps) = run(&tuner, 16 * GIB);
    assert!(steps > 0 && !resumed.cached(), "an unproven answer is not a hit");
    assert_eq!(resumed.largest_batch(), truth.largest_batch());
    assert!(resumed.proven_largest());
    assert!(
        resumed
            .warnings()
            .iter()
            .any(|w| matches!(w, Warning::CachedUnproven { batch, .. } if *batch == cut.largest_batch())),
        "{:?}",
        resumed.warnings()
    );
    // now the proven answer is stored, and served, without the note
    let (hit, steps) = run(&tuner, 16 * GIB);
    assert!(steps == 0 && hit.cached() && hit.largest_batch() == truth.largest_batch());
    assert!(!hit.warnings().iter().any(|w| matches!(w, Warning::CachedUnproven { .. })));
    // a limit that is the settings' own (the largest batch allowed) is served
    let capped = tuner.clone().max_batch(4);
    assert!(!run(&capped, 16 * GIB).0.proven_largest());
    let (hit, steps) = run(&capped, 16 * GIB);
    assert!(steps == 0 && hit.cached() && hit.largest_batch() == 4);
}

#[test]
fn any_change_that_decides_memory_misses() {
    let path = scratch("miss");
    let base = Tuner::new().cache(&path).cache_key(model_key(64, 512));
    run(&base, 16 * GIB);
    let changes: Vec<(&str, Tuner, u64)> = vec![
        ("a variable's shape", base.clone().cache_key(model_key(128, 512)), 16 * GIB),
        ("the sequence length", base.clone().cache_key(model_key(64, 1024)), 16 * GIB),
        ("the ceiling", base.clone().ceiling(0.8), 16 * GIB),
        ("the granularity", base.clone().multiple_of(8), 16 * GIB),
        ("the device's capacity", base.clone(), 24 * GIB),
        ("max_batch", base.clone().max_batch(100), 16 * GIB),
    ];
    for (what, tuner, capacity) in changes {
        let (plan, steps) = run(&tuner, capacity);
        assert!(!plan.cached() && steps > 0, "changing {what} must miss");
    }
    // another device of the same capacity
    let (mut workload, mut meter) =
        Simulation::new(16 * GIB, MemoryCurve::affine(2 * GIB, 100 * MIB)).name("sim-B").build();
    let plan = base.search(&mut workload, &mut meter).run().unwrap();
    assert!(!plan.cached() && workload.steps() > 0, "another device must miss");
    // and every one of them is now a hit
    assert!(run(&base.clone().ceiling(0.8), 16 * GIB).0.cached());
    assert!(run(&base, 16 * GIB).0.cached());
}

#[test]
fn the_key_names_the_crate_version_and_the_settings() {
    let key = model_key(64, 512);
    assert!(key.to_string().contains("fc.weight: F32 [64, 64]") && key.to_string().contains("seq_len: 512"));
    let path = scratch("key");
    run(&Tuner::new().cache(&path).cache_key(key), 16 * GIB);
    let file = std::fs::read_to_string(&path).unwrap();
    for part in
        [concat!("autobatch.version: ", env!("CARGO_PKG_VERSION")), "autobatch.device: sim-A", "autobatch.ceiling: 0.9"]
    {
        assert!(file.contains(part), "{part} in {file}");
    }
}

#[test]
fn corrupt_unreadable_and_foreign_files_are_ignored_and_left_alone() {
    for (name, contents) in [
        ("corrupt", "{\"format\": \"autobatch-plan-cache\", \"version\": 1, \"entr"),
        ("foreign", "{\"name\": \"my-app\", \"settings\": [1, 2, 3]}"),
        ("binary", "\u{0}\u{1}\u{2}not json at all"),
        ("future", "{\"format\": \"autobatch-plan-cache\", \"version\": 99, \"entries\": {}}"),
    ] {
        let path = scratch(name);
        std::fs::write(&path, contents).unwrap();
        let (plan, steps) = run(&Tuner::new().cache(&path).cache_key(model_key(64, 512)), 16 * GIB);
        assert!(!plan.cached() && steps > 0, "{name}");
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            contents,
            "{name}: a file we do not recognize is never written over"
        );
    }
    // a directory where the file should be: unreadable, not fatal
    let path = scratch("directory");
    std::fs::create_dir_all(&path).unwrap();
    let (plan, _) = run(&Tuner::new().cache(&path).cache_key(model_key(64, 512)), 16 * GIB);
    assert!(!plan.cached());
}

/// An entry edited to say it ran under another ceiling, capacity or
/// granularity than its key names is not served, however plausible its peaks.
#[test]
fn an_entry_that_disagrees_with_its_key_is_a_miss() {
    for (field, value) in [("ceiling", serde_json::json!(0.99)), ("capacity_bytes", serde_json::json!(32 * GIB))] {
        let path = scratch(&format!("edited-{field}"));
        let tuner = Tuner::new().cache(&path).cache_key(model_key(64, 512));
        run(&tuner, 16 * GIB);
        let mut file: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for entry in file["entries"].as_object_mut().unwrap().values_mut() {
            entry["plan"][field] = value.clone();
        }
        std::fs::write(&path, file.to_string()).unwrap();
        let (plan, steps) = run(&tuner, 16 * GIB);
        assert!(!plan.cached() && steps > 0, "an entry edited at {field} was served");
    }
}

#[test]
fn a_cache_without_a_model_key_is_an_error_before_any_step() {
    let path = scratch("nokey");
    let (mut workload, mut meter) = device(16 * GIB);
    let err = Tuner::new().cache(&path).search(&mut workload, &mut meter).run().unwrap_err();
    assert!(matches!(err, Error::InvalidSetting { value: autobatch::Value::Missing, .. }), "{err}");
    assert!(err.to_string().starts_with("Tuner::cache_key is missing: the plan cache needs"), "{err}");
    assert_eq!(workload.steps(), 0);
}

#[test]
fn concurrent_writers_never_corrupt_the_file() {
    let path = scratch("concurrent");
    let writers: Vec<_> = (0..8)
        .map(|writer| {
            let path = path.clone();
            std::thread::spawn(move || {
                for round in 0..10 {
                    let tuner = Tuner::new().cache(&path).cache_key(model_key(8 + writer, round));
                    run(&tuner, 16 * GIB);
                }
            })
        })
        .collect();
    let reader = {
        let path = path.clone();
        std::thread::spawn(move || {
            for _ in 0..200 {
                if let Ok(text) = std::fs::read_to_string(&path) {
                    let value: serde_json::Value = serde_json::from_str(&text).expect("always a whole file");
                    assert_eq!(value["format"], "autobatch-plan-cache");
                }
                std::thread::yield_now();
            }
        })
    };
    for writer in writers {
        writer.join().unwrap();
    }
    reader.join().unwrap();
    // the file is whole, and whatever it holds is a hit
    let text = std::fs::read_to_string(&path).unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(!value["entries"].as_object().unwrap().is_empty());
    let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "no temporary files left behind");
}

#[test]
fn the_evaluation_step_is_cached_beside_the_training_step() {
    let path = scratch("evaluation");
    let tuner = Tuner::new().cache(&path).cache_key(model_key(64, 512));
    let sims = || {
        let (train, meter) = device(16 * GIB);
        let (eval, _) = Simulation::new(16 * GIB, MemoryCurve::affine(2 * GIB, 30 * MIB)).name("sim-A").build();
        (train, eval, meter)
    };
    let (mut train, mut eval, mut meter) = sims();
    let first = tuner.search(&mut train, &mut meter).evaluating(&mut eval).run().unwrap();
    let (mut train, mut eval, mut meter) = sims();
    let second = tuner.search(&mut train, &mut meter).evaluating(&mut eval).run().unwrap();
    assert!(second.cached(), "{second}");
    assert_eq!((train.steps(), eval.steps()), (0, 0));
    assert_eq!(second.evaluation().unwrap().largest_batch, first.evaluation().unwrap().largest_batch);
}

#[test]
fn one_unreadable_entry_is_a_miss_not_the_loss_of_the_file() {
    let path = scratch("entry");
    let (tuner_a, tuner_b) =
        (Tuner::new().cache(&path).cache_key(model_key(64, 1)), Tuner::new().cache(&path).cache_key(model_key(64, 2)));
    run(&tuner_a, 16 * GIB);
    run(&tuner_b, 16 * GIB);
    // break the entry of b
    let mut file: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let entries = file["entries"].as_object_mut().unwrap();
    let b = entries
        .iter()
        .find(|(_, e)| e["key"].as_str().unwrap().contains("seq_len: 2"))
        .map(|(k, _)| k.clone())
        .unwrap();
    entries.insert(b.clone(), serde_json::json!({ "key": 42 }));
    std::fs::write(&path, serde_json::to_string(&file).unwrap()).unwrap();

    assert!(run(&tuner_a, 16 * GIB).0.cached(), "the other entries still hit");
    let (plan, steps) = run(&tuner_b, 16 * GIB);
    assert!(!plan.cached() && steps > 0, "the broken entry is a miss");
    assert!(run(&tuner_b, 16 * GIB).0.cached(), "and it was stored again");
}

#[cfg(unix)]
#[test]
fn a_linked_cache_is_updated_where_it_lives_and_keeps_its_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let target = scratch("linked");
    let real = target.with_file_name("real").join("plans.json");
    std::fs::create_dir_all(real.parent().unwrap()).unwrap();
    // a relative link, as `ln -s real/plans.json link.json` makes it
    let link = target.with_file_name("link.json");
    std::os::unix::fs::symlink("real/plans.json", &link).unwrap();

    // the first write creates the file at the end of the link; the link stays
    let tuner = Tuner::new().cache(&link).cache_key(model_key(64, 512));
    run(&tuner, 16 * GIB);
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link was replaced");
    assert!(std::fs::read_to_string(&real).unwrap().contains("autobatch-plan-cache"));

    // a private file stays private through a second write
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o600)).unwrap();
    let other = Tuner::new().cache(&link).cache_key(model_key(128, 512));
    run(&other, 16 * GIB);
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link was replaced");
    let mode = std::fs::metadata(&real).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the cache's permissions changed to {mode:o}");
    let stored = std::fs::read_to_string(&real).unwrap();
    assert_eq!(stored.matches("\"key\"").count(), 2, "both plans are in the linked file: {stored}");
    // and a hit through the link skips probing
    let (_, steps) = run(&tuner, 16 * GIB);
    assert_eq!(steps, 0);
}

/// A cached plan asked for a target whose split accumulates at a micro-batch
/// the stored run never checked with the accumulator held: that one step runs
/// on the hit, and the micro-batch comes down until it fits.
#[test]
fn a_hit_that_now_accumulates_checks_the_accumulator_once() {
    let path = scratch("accumulating-hit");
    let sim = || Simulation::new(16 * GIB, MemoryCurve::affine(2 * GIB, 100 * MIB)).name("sim-A");
    let tuner = Tuner::new().cache(&path).cache_key(model_key(64, 512));
    let (workload, mut meter) = sim().build();
    let mut workload = Accumulating(workload);
    let stored = tuner.search(&mut workload, &mut meter).run().unwrap();
    assert_eq!(stored.accumulation_steps(), 1);
    let limit = stored.limit_bytes();
    let fits = Accumulating::largest(&sim(), stored.largest_batch(), limit);
    assert!(fits < stored.largest_batch());

    let steps = workload.0.steps();
    let hit = tuner
        .clone()
        .target_effective_batch(10 * stored.largest_batch())
        .search(&mut workload, &mut meter)
        .run()
        .unwrap();
    assert!(hit.cached());
    assert!(hit.accumulation_steps() > 1 && hit.micro_batch() <= fits, "{} > {fits}\n{hit}", hit.micro_batch());
    assert!(hit.accumulation_peak_bytes().is_some_and(|peak| peak <= limit), "{hit}");
    assert!(workload.0.steps() > steps, "the accumulator was checked");

    // what the check showed is stored: the same target again runs nothing
    let steps = workload.0.steps();
    let again = tuner
        .clone()
        .target_effective_batch(10 * stored.largest_batch())
        .search(&mut workload, &mut meter)
        .run()
        .unwrap();
    assert_eq!((again.micro_batch(), again.accumulation_steps()), (hit.micro_batch(), hit.accumulation_steps()));
    assert!(again.cached() && again.accumulation_peak_bytes().is_some());
    assert_eq!(workload.0.steps(), steps);
    // and the stored answer is unchanged: without a target, the largest batch
    let plain = tuner.search(&mut workload, &mut meter).run().unwrap();
    assert_eq!((plain.micro_batch(), plain.accumulation_steps()), (stored.largest_batch(), 1));
    assert_eq!(workload.0.steps(), steps);
    let _ = std::fs::remove_file(&path);
}

/// A plan read back claims only what its trials show: one edited to say
/// "proven largest" (its `stopped_by` removed) with no failed trial one
/// granule up is refused, and the cache probes again (issue 85).
#[test]
fn a_plan_that_claims_a_proof_it_does_not_carry_is_refused() {
    let (mut workload, mut meter) = device(16 * GIB);
    let cut = Tuner::new().max_trials(2).search(&mut workload, &mut meter).run().unwrap();
    assert!(!cut.proven_largest());
    let mut edited: serde_json::Value = serde_json::from_str(&cut.to_json()).unwrap();
    edited["stopped_by"] = serde_json::Value::Null;
    edited["proven_largest"] = true.into();
    let err = serde_json::from_value::<Plan>(edited).unwrap_err().to_string();
    assert!(err.contains("a claim without its evidence"), "{err}");
    // a proven plan read back is the same plan
    let (mut workload, mut meter) = device(16 * GIB);
    let proven = Tuner::new().search(&mut workload, &mut meter).run().unwrap();
    assert!(proven.proven_largest());
    let read: Plan = serde_json::from_str(&proven.to_json()).unwrap();
    assert_eq!(read.largest_batch(), proven.largest_batch());
}
