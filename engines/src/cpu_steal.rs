//! CPU steal: the share of this machine's CPU time that its hypervisor gave to other guests, from the `steal`
//! column of `/proc/stat`. On a shared virtual machine a benchmark or a timed curve can lose a quarter of its CPU
//! time to a neighbour without anything in its own process showing it; the figures it prints are then low, and
//! only this number says why. Linux only: elsewhere (or without `/proc`) it is unknown, never zero.

use serde::{Deserialize, Serialize};

/// The whole machine's CPU time so far (or over a stretch, `since`), in the kernel's ticks (`USER_HZ`, usually
/// 100 a second per CPU): all of it, and the stolen part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CpuTimes {
    pub total: u64,
    pub steal: u64,
}

impl CpuTimes {
    /// The times now; `None` when the system does not tell (no `/proc/stat`, or a first line it cannot read).
    pub fn now() -> Option<CpuTimes> {
        CpuTimes::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// The aggregate `cpu` line of a `/proc/stat` text: user, nice, system, idle, iowait, irq, softirq, steal
    /// (guest time is already inside user and nice, so it is not added again). `None` for anything else.
    pub fn parse(stat: &str) -> Option<CpuTimes> {
        let mut fields = stat.lines().next()?.split_ascii_whitespace();
        if fields.next()? != "cpu" {
            return None;
        }
        let ticks: Vec<u64> = fields.take(8).map(|f| f.parse().ok()).collect::<Option<_>>()?;
        let &[.., steal] = ticks.get(..8)? else { return None };
        let total = ticks.iter().try_fold(0u64, |a, t| a.checked_add(*t))?;
        Some(CpuTimes { total, steal })
    }

    /// The ticks from `earlier` to `self`; `None` when a counter went backwards (another boot, a bad read).
    pub fn since(&self, earlier: &CpuTimes) -> Option<CpuTimes> {
        Some(CpuTimes { total: self.total.checked_sub(earlier.total)?, steal: self.steal.checked_sub(earlier.steal)? })
    }

    /// Stolen ticks over all ticks of a stretch (`since`); `None` when no tick passed.
    pub fn fraction(&self) -> Option<f64> {
        (self.total > 0).then(|| self.steal as f64 / self.total as f64)
    }
}

/// Stretches added up (`Option<CpuTimes>` sums too: unknown as soon as one stretch is).
impl std::iter::Sum for CpuTimes {
    fn sum<I: Iterator<Item = CpuTimes>>(it: I) -> CpuTimes {
        it.fold(CpuTimes::default(), |a, b| CpuTimes {
            total: a.total.saturating_add(b.total),
            steal: a.steal.saturating_add(b.steal),
        })
    }
}

/// Steal over a stretch of time: started with `start`, read with `ticks` at any point after.
#[derive(Debug, Clone, Copy)]
pub struct StealMeter(Option<CpuTimes>);

impl StealMeter {
    pub fn start() -> StealMeter {
        StealMeter(CpuTimes::now())
    }

    /// The ticks since `start`; `None` when either read failed.
    pub fn ticks(&self) -> Option<CpuTimes> {
        CpuTimes::now()?.since(self.0.as_ref()?)
    }
}

/// "CPU steal 12.3%" over a stretch's `ticks` (`StealMeter::ticks`), with a warning when it is large enough to
/// move the figures; unknown, with the reason, when the system did not tell or no tick passed.
pub fn describe(ticks: Option<CpuTimes>) -> String {
    let Some(ticks) = ticks else { return "CPU steal unknown (no steal column in /proc/stat)".into() };
    match ticks.fraction() {
        None => "CPU steal unknown (no tick of the system clock passed)".into(),
        Some(f) if f >= DISTURBED => format!(
            "CPU steal {:.1}% (the hypervisor gave that much of this machine's CPU time to other guests: the figures \
             are low by about as much or more)",
            100.0 * f
        ),
        Some(f) => format!("CPU steal {:.1}%", 100.0 * f),
    }
}

/// Steal at or above which timed figures are called disturbed.
pub const DISTURBED: f64 = 0.02;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_aggregate_line_and_nothing_else() {
        let stat = "cpu  7191634 73352 366046 8833889 8525 0 4077 349148 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n";
        let t = CpuTimes::parse(stat).expect("a /proc/stat text");
        assert_eq!(t, CpuTimes { total: 7191634 + 73352 + 366046 + 8833889 + 8525 + 4077 + 349148, steal: 349148 });
        assert_eq!(CpuTimes::parse("cpu0 1 2 3 4 5 6 7 8\n"), None, "a per-CPU line is not the aggregate");
        assert_eq!(CpuTimes::parse("cpu 1 2 3 4 5 6 7\n"), None, "an old kernel without the steal column");
        assert_eq!(CpuTimes::parse("cpu 1 2 3 x 5 6 7 8\n"), None);
        assert_eq!(CpuTimes::parse(""), None);
        let huge = format!("cpu {} 1 0 0 0 0 0 0\n", u64::MAX);
        assert_eq!(CpuTimes::parse(&huge), None, "a total past u64 is not wrapped");
    }

    #[test]
    fn a_stretch_is_the_difference_and_its_share() {
        let (a, b) = (CpuTimes { total: 1000, steal: 10 }, CpuTimes { total: 1400, steal: 110 });
        let d = b.since(&a).expect("forwards");
        assert_eq!(d, CpuTimes { total: 400, steal: 100 });
        assert_eq!(d.fraction(), Some(0.25));
        assert_eq!(a.since(&b), None, "counters never run backwards");
        assert_eq!(CpuTimes { total: 0, steal: 0 }.fraction(), None, "no tick passed");
        assert!(describe(Some(d)).contains("25.0%") && describe(Some(d)).contains("low"));
        assert_eq!(describe(Some(CpuTimes { total: 1000, steal: 1 })), "CPU steal 0.1%");
        assert!(describe(Some(CpuTimes { total: 0, steal: 0 })).contains("no tick"));
        assert!(describe(None).contains("/proc/stat"));
        let parts = [Some(a), Some(d)];
        assert_eq!(parts.iter().copied().sum::<Option<CpuTimes>>(), Some(CpuTimes { total: 1400, steal: 110 }));
        assert_eq!([Some(a), None].iter().copied().sum::<Option<CpuTimes>>(), None, "one unknown stretch");
    }
}
