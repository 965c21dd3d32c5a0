//! The DRAM read measured around a timed run, for the runs whose figure is a fraction of it (decode phases, the
//! DRAM-sized kernels).
//!
//! A VM's two vCPUs can move between one die and two from one moment to the next, and the DRAM read moves with
//! them: on the 2-core EPYC of docs/engines.md, 31-36 GB/s on one die and 42-59 on two, flipping within a second.
//! A run timed while the cores shared a die, put against a block's limit read while they sat apart, showed half its
//! real fraction; a run on two dies against a read on one showed more than its limit. So each such run is put
//! against a read taken just before it and just after it, with the placement each time: the higher of the two
//! reads is the limit that bound the run (a shared machine only ever makes a read come out low).

use super::limits::{best_read, last_level_cache, line_trip_ns, read_buffer, APART_NS};

/// Passes of each way of reading in one measurement around a run: two, so one disturbed pass does not set the
/// limit, while the reads stay a few tens of milliseconds beside a run of a fraction of a second.
const PASSES: usize = 2;

/// A buffer for reads around runs, held for the whole benchmark (allocating and faulting in a fresh one for every
/// run would cost more than the read itself).
pub struct ReadAround {
    buf: Vec<u64>,
}

/// What was measured around one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Around {
    /// The higher of the DRAM read just before the run and just after it, GB/s.
    pub read_gbs: f64,
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

impl ReadAround {
    /// A buffer sized by [`around_bytes`] for this machine.
    pub fn new() -> ReadAround {
        ReadAround { buf: read_buffer(around_bytes(last_level_cache(), super::limits::available_memory())) }
    }

    /// `run`'s result, and the read and placement measured just before and just after it.
    pub fn around<R>(&self, run: impl FnOnce() -> R) -> (R, Around) {
        let before = (line_trip_ns(), best_read(&self.buf, PASSES).0);
        let out = run();
        let after = (best_read(&self.buf, PASSES).0, line_trip_ns());
        (out, Around::of(before, after))
    }
}

impl Default for ReadAround {
    fn default() -> Self {
        ReadAround::new()
    }
}

impl Around {
    /// The measurements before a run (trip, read) and after it (read, trip) as one: the higher read, both trips.
    fn of((trip_before, read_before): (Option<f64>, f64), (read_after, trip_after): (f64, Option<f64>)) -> Around {
        let trips_ns = trip_before.zip(trip_after).map(|(a, b)| [a, b]);
        Around { read_gbs: read_before.max(read_after), trips_ns }
    }

    /// How the run's cores met, for its line: e.g. "32.8 GB/s, cores sharing a last-level cache".
    pub fn describe(&self) -> String {
        let cores = match self.trips_ns {
            None => "one core",
            Some(trips) => match trips.map(|ns| ns > APART_NS) {
                [false, false] => "cores sharing a last-level cache",
                [true, true] => "cores apart",
                _ => "cores moved during it",
            },
        };
        format!("{:.1} GB/s, {cores}", self.read_gbs)
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
    fn a_run_is_put_against_the_higher_read_and_its_placement_told() {
        let together = Around::of((Some(33.0), 31.44), (41.24, Some(35.0)));
        assert_eq!(together, Around { read_gbs: 41.24, trips_ns: Some([33.0, 35.0]) });
        assert_eq!(together.describe(), "41.2 GB/s, cores sharing a last-level cache");
        let apart = Around::of((Some(160.0), 52.0), (41.0, Some(170.0)));
        assert_eq!(apart.describe(), "52.0 GB/s, cores apart");
        assert_eq!(Around::of((Some(33.0), 30.0), (50.0, Some(170.0))).describe(), "50.0 GB/s, cores moved during it");
        assert_eq!(Around::of((Some(170.0), 50.0), (30.0, Some(33.0))).describe(), "50.0 GB/s, cores moved during it");
        assert_eq!(Around::of((None, 30.0), (29.0, None)).describe(), "30.0 GB/s, one core");
    }
}
