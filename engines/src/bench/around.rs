//! The limit measured around a timed run, for the whole-model phases (a prefill against the FMA peak, a decode
//! against the DRAM read) and the DRAM-sized kernels.
//!
//! A VM's two vCPUs move from one moment to the next between two hardware threads of one core, two cores of one
//! die and two dies, and the limits move with them: on the 2-core EPYC of docs/engines.md the two threads' FMA peak
//! is one core's (117 GFLOP/s) on one core and 226-234 otherwise, and the DRAM read 31-36 GB/s on one die and 42-59
//! on two, each flipping within a second. A run timed in one placement and put against a block's limit measured in
//! another showed up to half its real fraction (a decode on one die against a read on two) or more than its limit
//! (the other way round). So each such run is put against the limit measured just before it and just after it,
//! with the placement each time: the higher of the two is the limit that bound the run (a shared machine only ever
//! makes a measurement come out low).

use super::limits::{best_read, fma_peak_of, last_level_cache, line_trip_ns, read_buffer, Placement};

/// Passes of each measurement around a run: two, so one disturbed pass does not set the limit, while the
/// measurements stay a few tens of milliseconds beside a run of a fraction of a second or more.
const PASSES: usize = 2;
/// A peak pass around a run is an eighth of the block's (about 40 ms at a few hundred GFLOP/s).
const PEAK_SHORTER: u32 = 3;

/// Measures limits around runs; it holds the buffer the reads read for the whole benchmark (allocating and
/// faulting in a fresh one for every run would cost more than the read itself).
pub struct Gauge {
    buf: Vec<u64>,
}

/// A limit measured around one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Around {
    /// The higher of the measurement just before the run and just after it (GB/s of a read, or GFLOP/s of the peak).
    pub limit: f64,
    /// The cache line's trip between two threads before the run and after it (`None` on one core).
    pub trips_ns: Option<[f64; 2]>,
}

/// Bytes of the read around a run: four times the last-level cache (two dies each hold their own, so twice what
/// both can hold), at least 256 MiB, at most a quarter of the available memory (and at least 64 MiB).
pub fn around_bytes(llc: Option<u64>, available: Option<u64>) -> usize {
    let want = (4 * llc.unwrap_or(0)).max(256 << 20);
    let cap = available.map_or(want, |a| a / 4).max(64 << 20);
    want.min(cap) as usize
}

impl Gauge {
    /// A gauge whose read buffer is sized by [`around_bytes`] for this machine.
    pub fn new() -> Gauge {
        Gauge { buf: read_buffer(around_bytes(last_level_cache(), super::limits::available_memory())) }
    }

    /// `run`'s result, and the DRAM read (GB/s) and placement measured just before and just after it.
    pub fn read_around<R>(&self, run: impl FnOnce() -> R) -> (R, Around) {
        around(|| best_read(&self.buf, PASSES).0, run)
    }

    /// `run`'s result, and the f32 FMA peak (GFLOP/s) and placement measured just before and just after it.
    pub fn peak_around<R>(&self, run: impl FnOnce() -> R) -> (R, Around) {
        around(|| fma_peak_of(PASSES, PEAK_SHORTER).0, run)
    }
}

impl Default for Gauge {
    fn default() -> Self {
        Gauge::new()
    }
}

/// `run` between two measurements of `limit`, each beside a line trip.
fn around<R>(limit: impl Fn() -> f64, run: impl FnOnce() -> R) -> (R, Around) {
    let before = (line_trip_ns(), limit());
    let out = run();
    let after = (limit(), line_trip_ns());
    (out, Around::of(before, after))
}

impl Around {
    /// The measurements before a run (trip, limit) and after it (limit, trip) as one: the higher limit, both trips.
    fn of((trip_before, before): (Option<f64>, f64), (after, trip_after): (f64, Option<f64>)) -> Around {
        let trips_ns = trip_before.zip(trip_after).map(|(a, b)| [a, b]);
        Around { limit: before.max(after), trips_ns }
    }

    /// The limit in `unit` and where the run's threads were: e.g. "35.1 GB/s, cores sharing a last-level cache".
    pub fn describe(&self, unit: &str) -> String {
        format!("{:.1} {unit}, {}", self.limit, self.placement())
    }

    /// Where the run's threads were, for its line: e.g. "cores sharing a last-level cache".
    pub fn placement(&self) -> &'static str {
        match self.trips_ns.map(|trips| trips.map(Placement::of)) {
            None => "one core",
            Some([a, b]) if a != b => "cores moved during it",
            Some([Placement::OneCore, _]) => "two hardware threads of one core",
            Some([Placement::OneDie, _]) => "cores sharing a last-level cache",
            Some([Placement::TwoDies, _]) => "cores apart",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_read_around_outgrows_both_dies_caches_within_memory() {
        assert_eq!(around_bytes(Some(32 << 20), Some(64 << 30)), 256 << 20);
        assert_eq!(around_bytes(Some(300 << 20), Some(64 << 30)), 1200 << 20);
        assert_eq!(around_bytes(None, None), 256 << 20);
        assert_eq!(around_bytes(Some(32 << 20), Some(512 << 20)), 128 << 20);
    }

    #[test]
    fn a_run_is_put_against_the_higher_limit_and_its_placement_told() {
        let together = Around::of((Some(33.0), 31.44), (41.24, Some(35.0)));
        assert_eq!(together, Around { limit: 41.24, trips_ns: Some([33.0, 35.0]) });
        assert_eq!(together.describe("GB/s"), "41.2 GB/s, cores sharing a last-level cache");
        let apart = Around::of((Some(160.0), 52.0), (41.0, Some(170.0)));
        assert_eq!((apart.limit, apart.placement()), (52.0, "cores apart"));
        let one_core = Around::of((Some(16.0), 117.0), (116.0, Some(15.0)));
        assert_eq!((one_core.limit, one_core.placement()), (117.0, "two hardware threads of one core"));
        assert_eq!(Around::of((Some(33.0), 30.0), (50.0, Some(170.0))).placement(), "cores moved during it");
        assert_eq!(Around::of((Some(170.0), 50.0), (30.0, Some(33.0))).placement(), "cores moved during it");
        assert_eq!(Around::of((Some(16.0), 117.0), (230.0, Some(33.0))).placement(), "cores moved during it");
        assert_eq!(Around::of((None, 30.0), (29.0, None)).placement(), "one core");
    }
}
