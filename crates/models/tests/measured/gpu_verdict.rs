//! The GPU check's verdict logic (`autobatch_testkit::gpu_verdict`), on the
//! CPU: what passes and what fails, before a GPU ever runs it.

use autobatch_testkit::gpu_verdict::{Evidence, Next, verdict};

const MIB: u64 = 1 << 20;

fn good() -> Evidence {
    Evidence {
        largest_batch: 100,
        proven_largest: true,
        stopped_by: None,
        limit_bytes: 1000 * MIB,
        used_bytes: 950 * MIB,
        reserved_bytes: 960 * MIB,
        device_bytes: 970 * MIB,
        next: Next::OverCeiling { peak_bytes: 1005 * MIB },
        oom_forced: true,
        healthy_after_oom: true,
        pool_checked: true,
    }
}

fn a_clean_run_passes() {
    let v = verdict(&good());
    assert!(v.pass && v.notes.is_empty(), "{v:?}");
    assert!(verdict(&Evidence { next: Next::OutOfMemory, ..good() }).pass);
}

fn an_under_count_by_reserved_or_device_wide_bytes_fails() {
    // the pool's used bytes fit, but fragmentation or memory outside the pool did not
    let v = verdict(&Evidence { reserved_bytes: 1010 * MIB, ..good() });
    assert!(!v.pass && v.notes[0].contains("reserved"), "{v:?}");
    let v = verdict(&Evidence { device_bytes: 1200 * MIB, ..good() });
    assert!(!v.pass && v.notes[0].contains("device-wide"), "{v:?}");
}

fn the_next_batch_fitting_fails_only_a_proven_answer() {
    let fits = Next::Fits { peak_bytes: 990 * MIB };
    let v = verdict(&Evidence { next: fits.clone(), ..good() });
    assert!(!v.pass && v.notes[0].contains("not the largest"), "{v:?}");
    // a search stopped by a cap is not a false FAIL
    let capped = Evidence { next: fits, proven_largest: false, stopped_by: Some("max batch 100".into()), ..good() };
    let v = verdict(&capped);
    assert!(v.pass && v.notes[0].contains("did not prove"), "{v:?}");
    let v = verdict(&Evidence { next: Next::Error { message: "illegal address".into() }, ..good() });
    assert!(!v.pass, "{v:?}");
}

fn a_broken_context_or_an_unchecked_pool_fails() {
    assert!(!verdict(&Evidence { healthy_after_oom: false, ..good() }).pass);
    assert!(!verdict(&Evidence { pool_checked: false, ..good() }).pass);
    let v = verdict(&Evidence { oom_forced: false, healthy_after_oom: false, ..good() });
    assert!(v.pass && v.notes[0].contains("not judged"), "{v:?}");
}

fn a_next_batch_past_the_element_limit_is_not_run_and_not_a_failure() {
    let stopped = Some("stopped at batch 2047: the next batch up would run a tensor of 4296015872 elements".into());
    let v = verdict(&Evidence { next: Next::PastElementLimit, proven_largest: false, stopped_by: stopped, ..good() });
    assert!(v.pass && v.notes[0].contains("not run"), "{v:?}");
}

fn a_peak_at_the_limit_within_the_tolerance_is_noted_not_judged() {
    let limit = 1000 * MIB;
    assert_eq!(autobatch_testkit::gpu_verdict::tolerance(limit), 2 * MIB);
    assert_eq!(autobatch_testkit::gpu_verdict::tolerance(100_000 * MIB), 200 * MIB);
    // the found batch's reserved bytes 1 MiB over: a fresh step's noise
    let v = verdict(&Evidence { reserved_bytes: limit + MIB, ..good() });
    assert!(v.pass && v.notes[0].contains("within the tolerance"), "{v:?}");
    let v = verdict(&Evidence { reserved_bytes: limit + 3 * MIB, ..good() });
    assert!(!v.pass, "{v:?}");
    // the next batch 1 MiB under: not a proof that the answer is not the largest
    let v = verdict(&Evidence { next: Next::Fits { peak_bytes: limit - MIB }, ..good() });
    assert!(v.pass && v.notes[0].contains("not judged"), "{v:?}");
    let v = verdict(&Evidence { next: Next::Fits { peak_bytes: limit - 3 * MIB }, ..good() });
    assert!(!v.pass && v.notes[0].contains("not the largest"), "{v:?}");
}

/// The tests of this file, in the order they run.
pub fn tests() -> Vec<(&'static str, fn())> {
    vec![
        ("a_clean_run_passes", a_clean_run_passes),
        (
            "an_under_count_by_reserved_or_device_wide_bytes_fails",
            an_under_count_by_reserved_or_device_wide_bytes_fails,
        ),
        ("the_next_batch_fitting_fails_only_a_proven_answer", the_next_batch_fitting_fails_only_a_proven_answer),
        ("a_broken_context_or_an_unchecked_pool_fails", a_broken_context_or_an_unchecked_pool_fails),
        (
            "a_next_batch_past_the_element_limit_is_not_run_and_not_a_failure",
            a_next_batch_past_the_element_limit_is_not_run_and_not_a_failure,
        ),
        (
            "a_peak_at_the_limit_within_the_tolerance_is_noted_not_judged",
            a_peak_at_the_limit_within_the_tolerance_is_noted_not_judged,
        ),
    ]
}
