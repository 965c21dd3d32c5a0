//! Exact Clopper–Pearson bounds on a failure rate: "k failures in n trials" as an interval a CI can gate on.
//!
//! The bounds are quantiles of Beta distributions (statrs). The edge cases are closed forms and handled
//! explicitly: with 0 failures the lower bound is 0 and the upper `1 - alpha^(1/n)`; with n failures the upper
//! bound is 1 and the lower `alpha^(1/n)`. (The Beta quantile with a zero shape parameter is undefined.)

use serde::{Deserialize, Serialize};
use statrs::distribution::{Beta, ContinuousCDF};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StatsError {
    #[error("{failures} failures out of {trials} trials")]
    Counts { failures: u64, trials: u64 },
    #[error("confidence {0} is not in (0, 1)")]
    Confidence(f64),
    #[error("beta distribution: {0}")]
    Beta(String),
}

/// A failure-rate interval at a confidence.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Bound {
    pub failures: u64,
    pub trials: u64,
    pub confidence: f64,
    pub lower: f64,
    pub upper: f64,
}

impl Bound {
    pub fn rate(&self) -> f64 {
        share(self.failures as f64, self.trials as f64)
    }
}

/// `part / whole`, and 0 for an empty whole (no trials, no tokens: nothing to take a share of).
pub fn share(part: f64, whole: f64) -> f64 {
    if whole == 0.0 {
        0.0
    } else {
        part / whole
    }
}

fn check(failures: u64, trials: u64, confidence: f64) -> Result<(), StatsError> {
    if trials == 0 || failures > trials {
        return Err(StatsError::Counts { failures, trials });
    }
    if !(confidence > 0.0 && confidence < 1.0) {
        return Err(StatsError::Confidence(confidence));
    }
    Ok(())
}

/// The `p` quantile of Beta(a, b), by bisection on statrs' regularized incomplete beta CDF. (statrs' own
/// `inverse_cdf` stops at a coarse tolerance — about 1e-5 — which is visible at the digits a 1% gate needs.)
fn beta_quantile(p: f64, a: f64, b: f64) -> Result<f64, StatsError> {
    let beta = Beta::new(a, b).map_err(|e| StatsError::Beta(e.to_string()))?;
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    // The CDF is monotone on [0, 1]; 200 halvings reach adjacent floats long before the loop ends.
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi {
            break;
        }
        if beta.cdf(mid) < p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(0.5 * (lo + hi))
}

/// The upper end of the one-sided interval [0, u]: the failure rate is at most `u` with `confidence`.
pub fn upper_one_sided(failures: u64, trials: u64, confidence: f64) -> Result<f64, StatsError> {
    check(failures, trials, confidence)?;
    let alpha = 1.0 - confidence;
    if failures == trials {
        return Ok(1.0);
    }
    if failures == 0 {
        return Ok(1.0 - alpha.powf(1.0 / trials as f64));
    }
    beta_quantile(confidence, failures as f64 + 1.0, (trials - failures) as f64)
}

/// The lower end of the one-sided interval [l, 1].
pub fn lower_one_sided(failures: u64, trials: u64, confidence: f64) -> Result<f64, StatsError> {
    check(failures, trials, confidence)?;
    let alpha = 1.0 - confidence;
    if failures == 0 {
        return Ok(0.0);
    }
    if failures == trials {
        return Ok(alpha.powf(1.0 / trials as f64));
    }
    beta_quantile(alpha, failures as f64, (trials - failures) as f64 + 1.0)
}

/// The one-sided bound a gate uses: [0, upper].
pub fn one_sided(failures: u64, trials: u64, confidence: f64) -> Result<Bound, StatsError> {
    let upper = upper_one_sided(failures, trials, confidence)?;
    Ok(Bound { failures, trials, confidence, lower: 0.0, upper })
}

/// The two-sided interval: each tail gets half of `1 - confidence`.
pub fn two_sided(failures: u64, trials: u64, confidence: f64) -> Result<Bound, StatsError> {
    check(failures, trials, confidence)?;
    let tail = (1.0 - confidence) / 2.0;
    let lower = lower_one_sided(failures, trials, 1.0 - tail)?;
    let upper = upper_one_sided(failures, trials, 1.0 - tail)?;
    Ok(Bound { failures, trials, confidence, lower, upper })
}

/// The failure rate as a percentage with enough digits to see a 1% gate: `0.997%`.
pub fn percent(rate: f64) -> String {
    let p = rate * 100.0;
    if p == 0.0 || p >= 10.0 {
        format!("{p:.1}%")
    } else {
        format!("{p:.3}%")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn zero_of_ten_is_25_9_percent() {
        let u = upper_one_sided(0, 10, 0.95).expect("bound");
        assert!(close(u, 0.2589, 5e-5), "{u}");
    }

    #[test]
    fn zero_of_299_is_at_most_one_percent() {
        let u = upper_one_sided(0, 299, 0.95).expect("bound");
        assert!(u <= 0.0100, "{u}");
        // and 298 trials would not be enough: the gate size is tight
        assert!(upper_one_sided(0, 298, 0.95).expect("bound") > 0.0100);
    }

    #[test]
    fn two_sided_with_failures_matches_reference_values() {
        // R: binom.test(3, 10)$conf.int = 0.06673951 0.65245285
        let b = two_sided(3, 10, 0.95).expect("bound");
        assert!(close(b.lower, 0.066_739_51, 1e-8), "{b:?}");
        assert!(close(b.upper, 0.652_452_85, 1e-8), "{b:?}");
        // exact binomial tails (computed independently by bisection on the binomial sum):
        // binom.test(1, 299)$conf.int = 8.467136e-05 0.01849242
        let b = two_sided(1, 299, 0.95).expect("bound");
        assert!(close(b.lower, 8.467_136e-5, 1e-10), "{b:?}");
        assert!(close(b.upper, 0.018_492_42, 1e-7), "{b:?}");
    }

    #[test]
    fn one_failure_in_299_breaks_a_one_percent_gate() {
        // one-sided 95%: qbeta(0.95, 2, 298) = 0.0157668
        let u = upper_one_sided(1, 299, 0.95).expect("bound");
        assert!(close(u, 0.015_766_8, 1e-7), "{u}");
        assert!(u > 0.01);
    }

    #[test]
    fn all_failures_and_edges_are_explicit() {
        assert_eq!(upper_one_sided(10, 10, 0.95).expect("bound"), 1.0);
        let l = lower_one_sided(10, 10, 0.95).expect("bound");
        assert!(close(l, 0.05f64.powf(0.1), 1e-12), "{l}");
        assert_eq!(lower_one_sided(0, 10, 0.95).expect("bound"), 0.0);
        let b = two_sided(0, 10, 0.95).expect("bound");
        assert_eq!(b.lower, 0.0);
        assert!(close(b.upper, 0.308_5, 1e-4), "{b:?}"); // R: 0.3084971
        assert!(matches!(upper_one_sided(0, 0, 0.95), Err(StatsError::Counts { .. })));
        assert!(matches!(upper_one_sided(3, 2, 0.95), Err(StatsError::Counts { .. })));
        assert!(matches!(upper_one_sided(0, 5, 1.0), Err(StatsError::Confidence(_))));
    }

    #[test]
    fn bounds_are_ordered_and_monotone_in_failures() {
        let mut last = 0.0;
        for k in 0..=20 {
            let b = two_sided(k, 20, 0.9).expect("bound");
            assert!(b.lower <= b.rate() && b.rate() <= b.upper, "{b:?}");
            assert!(b.upper >= last, "upper bound must grow with failures");
            last = b.upper;
        }
    }

    #[test]
    fn percent_shows_the_digits_a_gate_needs() {
        assert_eq!(percent(0.009_969), "0.997%");
        assert_eq!(percent(0.2589), "25.9%");
        assert_eq!(percent(0.0), "0.0%");
    }
}
