//! The core's integration tests, one binary (one link of candle): the search,
//! the tuner and its plans on simulated devices, the cache, ranks, the
//! repository's own checks (layering, surface, the README). No allocator is
//! installed here: `heap_meter_without_allocator` checks what a user who
//! forgot it sees. The heap measurements are in `tests/measured`.

use autobatch_testkit as common;

mod cache;
mod distributed;
mod guard;
mod heap_meter_without_allocator;
mod layering;
mod longest;
mod optim_slices;
mod properties;
mod readme;
mod sizes;
mod surface;
mod tuner;
