//! A simulated device for tests of code that depends on the search (yours and
//! this crate's) and for benchmarks: a memory curve in,
//! a [`Workload`] and a [`MemoryMeter`] out. Behind the `simulation`
//! feature: turn it on where your tests build,
//!
//! ```toml
//! [dev-dependencies]
//! autobatch = { version = "0.1", features = ["simulation"] }
//! ```
//!
//! ```
//! use autobatch::memory::simulated::{MemoryCurve, Simulation};
//! use autobatch::Tuner;
//!
//! const GIB: u64 = 1 << 30;
//! // 2 GiB of weights and optimizer state, 100 MiB per sample, on a 16 GiB device
//! // where another process already holds 1 GiB.
//! let (mut workload, mut meter) = Simulation::new(16 * GIB, MemoryCurve::affine(2 * GIB, 100 << 20))
//!     .other_process(GIB)
//!     .build();
//! let plan = Tuner::new().ceiling(0.9).search(&mut workload, &mut meter).run()?;
//! // (0.9 × 16 GiB − 1 GiB − 2 GiB) / 100 MiB = 116.7
//! assert_eq!(plan.largest_batch(), 116);
//! # Ok::<(), autobatch::Error>(())
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{Error, MemoryMeter, Workload};

/// Peak bytes of one training step of this process as a function of the batch,
/// including what it holds between steps (weights, optimizer state).
#[derive(Clone)]
pub enum MemoryCurve {
    /// `fixed + per_sample·b`.
    Affine {
        /// Bytes at batch 0.
        fixed: u64,
        /// Bytes per sample.
        per_sample: u64,
    },
    /// `fixed + per_sample·b + per_sample_squared·b²`, as attention's score matrices
    /// grow when the batch also sets a sequence length, or packed batches grow.
    Quadratic {
        /// Bytes at batch 0.
        fixed: u64,
        /// Bytes per sample.
        per_sample: u64,
        /// Bytes per sample squared.
        per_sample_squared: u64,
    },
    /// Any function of the batch.
    Custom(Arc<dyn Fn(usize) -> u64 + Send + Sync>),
}

impl MemoryCurve {
    /// `fixed + per_sample·b`.
    pub fn affine(fixed: u64, per_sample: u64) -> Self {
        MemoryCurve::Affine { fixed, per_sample }
    }

    /// `fixed + per_sample·b + per_sample_squared·b²`.
    pub fn quadratic(fixed: u64, per_sample: u64, per_sample_squared: u64) -> Self {
        MemoryCurve::Quadratic { fixed, per_sample, per_sample_squared }
    }

    /// Any function of the batch.
    pub fn custom(curve: impl Fn(usize) -> u64 + Send + Sync + 'static) -> Self {
        MemoryCurve::Custom(Arc::new(curve))
    }

    /// The curve's bytes at `batch` (saturating at `u64::MAX`).
    pub fn bytes(&self, batch: usize) -> u64 {
        let b = batch as u64;
        match self {
            MemoryCurve::Affine { fixed, per_sample } => fixed.saturating_add(per_sample.saturating_mul(b)),
            MemoryCurve::Quadratic { fixed, per_sample, per_sample_squared } => fixed
                .saturating_add(per_sample.saturating_mul(b))
                .saturating_add(per_sample_squared.saturating_mul(b).saturating_mul(b)),
            MemoryCurve::Custom(curve) => curve(batch),
        }
    }
}

impl fmt::Debug for MemoryCurve {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryCurve::Affine { fixed, per_sample } => write!(f, "Affine({fixed} + {per_sample}·b)"),
            MemoryCurve::Quadratic { fixed, per_sample, per_sample_squared } => {
                write!(f, "Quadratic({fixed} + {per_sample}·b + {per_sample_squared}·b²)")
            }
            MemoryCurve::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

/// Pieces a simulated step allocates its own bytes in (see
/// [`Simulation::allocations`]).
const DEFAULT_ALLOCATIONS: u64 = 64;

/// Builder of a simulated device: a curve plus the ways real devices deviate from it.
#[derive(Clone, Debug)]
pub struct Simulation {
    capacity: u64,
    curve: MemoryCurve,
    rounding: u64,
    noise: u64,
    seed: u64,
    blips: BTreeMap<usize, u64>,
    oom_from: Option<usize>,
    allocations: u64,
    error_at: Option<usize>,
    other_process: u64,
    resident: u64,
    leak_on_failure: u64,
    baseline_rise: Option<(usize, u64)>,
    slack: u64,
    name: String,
}

impl Simulation {
    /// A device of `capacity` bytes whose step at batch `b` peaks at `curve(b)`.
    pub fn new(capacity: u64, curve: MemoryCurve) -> Self {
        Simulation {
            capacity,
            curve,
            rounding: 1,
            noise: 0,
            seed: 0,
            blips: BTreeMap::new(),
            oom_from: None,
            allocations: DEFAULT_ALLOCATIONS,
            error_at: None,
            other_process: 0,
            resident: 0,
            leak_on_failure: 0,
            baseline_rise: None,
            slack: 0,
            name: "simulated device".to_owned(),
        }
    }

    /// Rounds every step's peak up to a multiple of `bytes`, like an allocator
    /// that hands out memory in fixed-size chunks (a 2 MiB pool granule, say).
    /// Zero is treated as one: no rounding.
    pub fn rounding(mut self, bytes: u64) -> Self {
        self.rounding = bytes.max(1);
        self
    }

    /// Adds up to `bytes` of pseudo-random noise to the peak of each batch (as
    /// data- or shape-dependent allocations vary): deterministic per seed and
    /// batch, so a batch always measures the same and brute force sees it too.
    /// Below one sample's bytes, the curve stays monotone.
    pub fn noise(mut self, bytes: u64, seed: u64) -> Self {
        self.noise = bytes;
        self.seed = seed;
        self
    }

    /// A non-monotone blip: the step at exactly `batch` needs `extra` more bytes
    /// (a kernel that picks a workspace-hungry algorithm at one shape, say).
    pub fn blip(mut self, batch: usize, extra: u64) -> Self {
        self.blips.insert(batch, extra);
        self
    }

    /// Steps at `batch` and above fail with a real out-of-memory error even when
    /// the curve says they would fit (fragmentation, or an allocation the curve
    /// does not model).
    pub fn oom_from(mut self, batch: usize) -> Self {
        self.oom_from = Some(batch);
        self
    }

    /// A step allocates what it adds to the memory held between steps in
    /// `count` equal pieces (default 64), so a step that runs out of memory
    /// has handed out every piece that fit before the failing one: what the
    /// meter reads as its peak, as a pool's high-water mark after a real
    /// out-of-memory error. Zero is treated as one.
    pub fn allocations(mut self, count: u64) -> Self {
        self.allocations = count.max(1);
        self
    }

    /// The peak a step at `batch` that fails with out-of-memory reaches before
    /// its failing allocation (with nothing leaked), or `None` when the step
    /// does not run out of memory.
    pub fn peak_before_failure(&self, batch: usize) -> Option<u64> {
        let idle = self.other_process.saturating_add(self.resident);
        self.held_at_failure(batch, idle, 0, 0)
    }

    /// Where a step at `batch` stops when the device has no more room: the
    /// pieces of its own bytes handed out before the one that would pass the
    /// room (the capacity, or under [`oom_from`](Self::oom_from) just under
    /// what the first failing batch needs).
    fn held_at_failure(&self, batch: usize, idle: u64, leaked: u64, risen: u64) -> Option<u64> {
        let peak = self.step_peak(batch, leaked, risen);
        let below_oom = self.oom_from.filter(|&from| batch >= from);
        let room = match below_oom {
            Some(from) => self.step_peak(from, leaked, risen).saturating_sub(1).min(self.capacity),
            None if peak > self.capacity => self.capacity,
            None => return None,
        };
        let piece = (peak.saturating_sub(idle) / self.allocations).max(1);
        let room = room.min(peak.saturating_sub(1)).max(idle);
        Some(idle + (room - idle) / piece * piece)
    }

    /// The step at exactly `batch` fails with an error that is not out-of-memory.
    pub fn error_at(mut self, batch: usize) -> Self {
        self.error_at = Some(batch);
        self
    }

    /// Bytes held on the device by another process for the whole run.
    pub fn other_process(mut self, bytes: u64) -> Self {
        self.other_process = bytes;
        self
    }

    /// Bytes this process holds between steps (weights, optimizer state); part
    /// of the curve, but also what the meter sees as in use when idle.
    pub fn resident(mut self, bytes: u64) -> Self {
        self.resident = bytes;
        self
    }

    /// Every failed step leaves `bytes` allocated for good: a workload that
    /// does not clean up after an out-of-memory error.
    pub fn leak_on_failure(mut self, bytes: u64) -> Self {
        self.leak_on_failure = bytes;
        self
    }

    /// After the `step`-th call (counting from 1) the process holds `bytes` more
    /// for good, on top of the curve: a runtime that allocates scratch space
    /// late, like per-thread buffers.
    pub fn baseline_rise(mut self, step: usize, bytes: u64) -> Self {
        self.baseline_rise = Some((step, bytes));
        self
    }

    /// The name the meter reports (see [`MemoryMeter::device_name`]).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The slack the meter reports (see [`MemoryMeter::slack_bytes`]).
    pub fn slack(mut self, bytes: u64) -> Self {
        self.slack = bytes;
        self
    }

    /// The device-wide peak of a step at `batch` with nothing leaked and no late
    /// baseline rise (noise included): what a brute-force check compares to the ceiling.
    pub fn device_peak(&self, batch: usize) -> u64 {
        self.step_peak(batch, 0, 0)
    }

    /// Whether a step at `batch` fails with a workload error (out-of-memory or
    /// not) regardless of the ceiling, with nothing leaked.
    pub fn step_fails(&self, batch: usize) -> bool {
        self.error_at == Some(batch)
            || self.oom_from.is_some_and(|b| batch >= b)
            || self.device_peak(batch) > self.capacity
    }

    /// The largest candidate of `space` whose step runs with a device-wide peak
    /// at or under `ceiling × capacity`, by brute force over every candidate
    /// (scanning stops at `scan_limit`).
    pub fn true_largest(&self, ceiling: f64, space: &crate::search::SearchSpace, scan_limit: usize) -> Option<usize> {
        // computed here on its own: the oracle does not share the tuner's code
        let limit = (ceiling * self.capacity as f64).floor() as u64;
        (space.first()..=space.last().min(scan_limit))
            .step_by(space.multiple_of())
            .filter(|&b| !self.step_fails(b) && self.device_peak(b) <= limit)
            .max()
    }

    fn step_peak(&self, batch: usize, leaked: u64, risen: u64) -> u64 {
        let own = self
            .curve
            .bytes(batch)
            .saturating_add(self.blips.get(&batch).copied().unwrap_or(0))
            .saturating_add(self.noise_at(batch))
            .max(self.resident)
            .saturating_add(risen);
        let rounded = own.div_ceil(self.rounding).saturating_mul(self.rounding);
        rounded.saturating_add(self.other_process).saturating_add(leaked)
    }

    fn noise_at(&self, batch: usize) -> u64 {
        if self.noise == 0 {
            return 0;
        }
        crate::splitmix::splitmix64(self.seed ^ (batch as u64).rotate_left(32)) % (self.noise + 1)
    }

    /// Splits the device into the workload that runs on it and the meter that watches it.
    pub fn build(self) -> (SimulatedWorkload, SimulatedMeter) {
        let state = Arc::new(Mutex::new(State { peak: 0, leaked: 0, risen: 0, steps: 0, piece: None }));
        let config = Arc::new(self);
        (SimulatedWorkload { config: Arc::clone(&config), state: Arc::clone(&state) }, SimulatedMeter { config, state })
    }

    /// This simulation's step as a workload on the device `meter` watches
    /// (another model on the same device, as [`Search::compare`](crate::Search::compare)
    /// measures variants): the device's capacity, other processes, resident
    /// bytes, slack and name are the meter's simulation's; the step's curve
    /// and failures are this one's.
    ///
    /// ```
    /// use autobatch::memory::simulated::{MemoryCurve, Simulation};
    /// use autobatch::Tuner;
    ///
    /// let (first, mut meter) = Simulation::new(16 << 30, MemoryCurve::affine(2 << 30, 100 << 20)).build();
    /// let mut second = Simulation::new(0, MemoryCurve::affine(2 << 30, 50 << 20)).build_on(&meter);
    /// let plan = Tuner::new().search(&mut second, &mut meter).run()?;
    /// assert_eq!(plan.largest_batch(), ((0.9 * (16u64 << 30) as f64) as u64 - (2 << 30)) as usize / (50 << 20));
    /// # drop(first);
    /// # Ok::<(), autobatch::Error>(())
    /// ```
    pub fn build_on(self, meter: &SimulatedMeter) -> SimulatedWorkload {
        let device = &meter.config;
        let config = Simulation {
            capacity: device.capacity,
            other_process: device.other_process,
            resident: device.resident,
            slack: device.slack,
            name: device.name.clone(),
            ..self
        };
        SimulatedWorkload { config: Arc::new(config), state: Arc::clone(&meter.state) }
    }
}

#[derive(Debug)]
struct State {
    peak: u64,
    leaked: u64,
    risen: u64,
    steps: usize,
    /// The bytes of each allocation of the last step that fit.
    piece: Option<u64>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic while holding this lock cannot leave the counters half-updated
    // in a way that matters to a simulation: keep going.
    state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Simulation {
    fn idle_bytes(&self, state: &State) -> u64 {
        self.other_process.saturating_add(self.resident).saturating_add(state.leaked).saturating_add(state.risen)
    }
}

/// The workload half of a [`Simulation`].
#[derive(Debug)]
pub struct SimulatedWorkload {
    config: Arc<Simulation>,
    state: Arc<Mutex<State>>,
}

impl SimulatedWorkload {
    /// How many steps have been run (warm-up included).
    pub fn steps(&self) -> usize {
        lock(&self.state).steps
    }

    /// The simulation this workload runs on.
    pub fn simulation(&self) -> &Simulation {
        &self.config
    }
}

impl Workload for SimulatedWorkload {
    fn step(&mut self, batch: usize) -> candle_core::Result<()> {
        let sim = &*self.config;
        let mut state = lock(&self.state);
        state.steps += 1;
        let peak = sim.step_peak(batch, state.leaked, state.risen);
        if let Some((at, bytes)) = sim.baseline_rise
            && state.steps == at
        {
            state.risen = state.risen.saturating_add(bytes);
        }
        if sim.error_at == Some(batch) {
            return Err(candle_core::Error::Msg(format!("simulated failure at batch {batch}: shape mismatch")).bt());
        }
        let idle = sim.idle_bytes(&state);
        if let Some(held) = sim.held_at_failure(batch, idle, state.leaked, state.risen) {
            state.peak = state.peak.max(held);
            state.leaked = state.leaked.saturating_add(sim.leak_on_failure);
            return Err(candle_core::Error::Cuda(Box::new(SimulatedOutOfMemory {
                batch,
                requested: peak,
                capacity: sim.capacity,
            }))
            .bt());
        }
        state.peak = state.peak.max(peak);
        state.piece = Some((peak.saturating_sub(idle) / sim.allocations).max(1));
        Ok(())
    }

    /// The last step that fit, as its allocations: so many equal pieces (an
    /// element a byte).
    fn graph_tensors(&self) -> Option<Vec<crate::GraphTensor>> {
        let piece = lock(&self.state).piece?;
        let count = usize::try_from(self.config.allocations).unwrap_or(usize::MAX);
        Some(vec![crate::GraphTensor { elements: piece, dtype: candle_core::DType::U8 }; count])
    }
}

/// The meter half of a [`Simulation`].
#[derive(Debug)]
pub struct SimulatedMeter {
    config: Arc<Simulation>,
    state: Arc<Mutex<State>>,
}

impl MemoryMeter for SimulatedMeter {
    fn capacity(&self) -> Result<u64, Error> {
        Ok(self.config.capacity)
    }

    fn in_use(&self) -> Result<u64, Error> {
        Ok(self.config.idle_bytes(&lock(&self.state)))
    }

    fn reset_peak(&mut self) -> Result<(), Error> {
        let mut state = lock(&self.state);
        state.peak = self.config.idle_bytes(&state);
        Ok(())
    }

    fn peak(&self) -> Result<u64, Error> {
        Ok(lock(&self.state).peak)
    }

    fn slack_bytes(&self) -> u64 {
        self.config.slack
    }

    fn device_name(&self) -> String {
        self.config.name.clone()
    }
}

/// The error a simulated step fails with when the device runs out of memory. Its
/// text carries the CUDA driver's code, as candle's real error does, so
/// [`is_oom`](crate::is_oom) recognizes it.
#[derive(Debug)]
pub struct SimulatedOutOfMemory {
    /// The batch that did not fit.
    pub batch: usize,
    /// Device-wide bytes the step would have needed.
    pub requested: u64,
    /// Device capacity.
    pub capacity: u64,
}

impl fmt::Display for SimulatedOutOfMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\") (simulated: batch {} needs {} of {} bytes)",
            self.batch, self.requested, self.capacity
        )
    }
}

impl std::error::Error for SimulatedOutOfMemory {}

/// A simulated device whose step memory depends on an input size (a sequence
/// length, an image side) as well as on the batch: the workload half is
/// [`Resizable`](crate::Resizable), for [`Search::sizes`](crate::Search::sizes).
///
/// ```
/// use autobatch::memory::simulated::SizedSimulation;
/// use autobatch::search::SearchSpace;
/// use autobatch::{Resizable, Tuner};
///
/// let sim = SizedSimulation::new(8 << 30, 256, |batch, len| (1 << 30) + (batch * len * len) as u64 * 1024);
/// let space = SearchSpace::new(1, None, 1)?;
/// let truth = sim.true_largest(0.9, 128, &space, 1 << 20);
/// let (mut workload, mut meter) = sim.build();
/// workload.resize(128)?;
/// assert_eq!(Some(Tuner::new().search(&mut workload, &mut meter).run()?.largest_batch()), truth);
/// # Ok::<(), autobatch::Error>(())
/// ```
pub struct SizedSimulation {
    simulation: Simulation,
    size: Arc<std::sync::atomic::AtomicUsize>,
}

impl SizedSimulation {
    /// A device of `capacity` bytes whose step at `batch` samples of size `size`
    /// uses `curve(batch, size)` bytes; steps start at size `size`.
    pub fn new(capacity: u64, size: usize, curve: impl Fn(usize, usize) -> u64 + Send + Sync + 'static) -> Self {
        let shared = Arc::new(std::sync::atomic::AtomicUsize::new(size));
        let current = Arc::clone(&shared);
        let curve = MemoryCurve::custom(move |batch| curve(batch, current.load(std::sync::atomic::Ordering::Relaxed)));
        SizedSimulation { simulation: Simulation::new(capacity, curve), size: shared }
    }

    /// Changes the underlying [`Simulation`] (noise, rounding, another process…).
    pub fn with(mut self, change: impl FnOnce(Simulation) -> Simulation) -> Self {
        self.simulation = change(self.simulation);
        self
    }

    /// The largest batch of size `size` that fits under `ceiling` (see
    /// [`Simulation::true_largest`]).
    pub fn true_largest(
        &self,
        ceiling: f64,
        size: usize,
        space: &crate::search::SearchSpace,
        scan_limit: usize,
    ) -> Option<usize> {
        use std::sync::atomic::Ordering::Relaxed;
        let before = self.size.swap(size, Relaxed);
        let largest = self.simulation.true_largest(ceiling, space, scan_limit);
        self.size.store(before, Relaxed);
        largest
    }

    /// Splits the device into the workload and the meter.
    pub fn build(self) -> (SizedWorkload, SimulatedMeter) {
        let (workload, meter) = self.simulation.build();
        (SizedWorkload { workload, size: self.size }, meter)
    }
}

impl fmt::Debug for SizedSimulation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SizedSimulation").field("simulation", &self.simulation).field("size", &self.size).finish()
    }
}

/// The workload half of a [`SizedSimulation`].
#[derive(Debug)]
pub struct SizedWorkload {
    workload: SimulatedWorkload,
    size: Arc<std::sync::atomic::AtomicUsize>,
}

impl SizedWorkload {
    /// How many steps have been run (warm-up included).
    pub fn steps(&self) -> usize {
        self.workload.steps()
    }
}

impl Workload for SizedWorkload {
    fn step(&mut self, batch: usize) -> candle_core::Result<()> {
        self.workload.step(batch)
    }
}

impl crate::Resizable for SizedWorkload {
    fn resize(&mut self, size: usize) -> Result<(), Error> {
        self.size.store(size, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    fn size(&self) -> usize {
        self.size.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_step_that_runs_out_of_memory_reads_the_pieces_handed_out_before_the_failing_one() {
        // 1 GiB held between steps, 1 MiB per sample; room ends just under batch 3000's need
        let sim = Simulation::new(16 << 30, MemoryCurve::affine(1 << 30, MIB)).resident(1 << 30).oom_from(3000);
        let room = (1 << 30) + 3000 * MIB - 1;
        assert_eq!(sim.peak_before_failure(2999), None);
        for (batch, pieces) in [(3000, 64), (4000, 64)] {
            let reading = sim.peak_before_failure(batch).unwrap();
            let piece = batch as u64 * MIB / pieces;
            assert!(reading <= room && reading + piece > room, "batch {batch}: {reading}");
        }
        // finer allocations, a closer reading; a step past the capacity reads under it
        let fine = sim.clone().allocations(1024).peak_before_failure(4000).unwrap();
        assert!(fine <= room && fine + 4000 * MIB / 1024 > room);
        let small = Simulation::new(2 << 30, MemoryCurve::affine(1 << 30, MIB)).resident(1 << 30);
        assert!(small.peak_before_failure(1024).is_none());
        let over = small.peak_before_failure(1025).unwrap();
        assert!(over <= 2 << 30 && over > (2 << 30) - 1025 * MIB / 64);
    }

    #[test]
    fn the_meter_reads_what_a_failed_step_held() {
        let sim = Simulation::new(16 << 30, MemoryCurve::affine(1 << 30, MIB)).resident(1 << 30).oom_from(3000);
        let expected = sim.peak_before_failure(3500).unwrap();
        let (mut workload, mut meter) = sim.build();
        meter.reset_peak().unwrap();
        assert!(crate::is_oom(&workload.step(3500).unwrap_err()));
        assert_eq!(meter.peak().unwrap(), expected);
    }
}
