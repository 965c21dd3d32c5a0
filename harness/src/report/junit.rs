//! `junit.xml`: one testsuite per scenario, one testcase per trial (and one for the failure-rate bound), so CI
//! systems list every case and show the failing ones with their checks.

use std::fmt::Write as _;

use super::summary::Summary;
use crate::record::TrialRecord;
use crate::record::{Status, Verdict};
use crate::stats;

/// XML-escape text and attribute values; drops characters XML 1.0 cannot carry.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 => {}
            c => out.push(c),
        }
    }
    out
}

fn seconds(t: &TrialRecord) -> f64 {
    [t.timings.warm_ms, t.timings.cold_ms, t.timings.control_ms].iter().flatten().sum::<f64>() / 1000.0
}

pub fn render(summary: &Summary, trials: &[TrialRecord]) -> String {
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let tests: usize = summary
        .scenarios
        .iter()
        .map(|s| s.trials + usize::from(s.max_failure_rate.is_some()) + usize::from(s.growth.is_some()))
        .sum();
    let failures: usize = summary
        .scenarios
        .iter()
        .map(|s| {
            s.failed
                + usize::from(s.checks.get(&crate::record::CheckName::Rate).is_some_and(|c| c.fail > 0))
                + usize::from(crate::check::growth::failed(s.growth.as_ref()))
        })
        .sum();
    let errors: usize = summary.scenarios.iter().map(|s| s.errors).sum();
    let _ = writeln!(
        x,
        "<testsuites name=\"kvproof {}\" tests=\"{tests}\" failures=\"{failures}\" errors=\"{errors}\">",
        escape(&summary.run)
    );
    for s in &summary.scenarios {
        let mine: Vec<&TrialRecord> = trials.iter().filter(|t| t.scenario == s.name).collect();
        let rate_case = s.max_failure_rate.is_some();
        let rate_failed = s.checks.get(&crate::record::CheckName::Rate).is_some_and(|c| c.fail > 0);
        let skipped = s.inconclusive + s.skipped_cases.len();
        let _ = writeln!(
            x,
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{skipped}\">",
            escape(&s.name),
            mine.len() + usize::from(rate_case) + s.skipped_cases.len() + usize::from(s.growth.is_some()),
            s.failed + usize::from(rate_failed) + usize::from(crate::check::growth::failed(s.growth.as_ref())),
            s.errors
        );
        for t in &mine {
            let _ = write!(
                x,
                "    <testcase classname=\"{}.{}\" name=\"{}\" time=\"{:.3}\"",
                escape(&s.name),
                escape(&t.plan),
                escape(&t.step),
                seconds(t)
            );
            match t.verdict {
                Verdict::Pass => x.push_str("/>\n"),
                Verdict::Fail => {
                    let failed: Vec<String> = t
                        .checks
                        .iter()
                        .filter(|c| c.status == Status::Fail)
                        .map(|c| format!("{}: {}", c.check, c.detail))
                        .collect();
                    let first = failed.first().cloned().unwrap_or_default();
                    let _ = write!(
                        x,
                        ">\n      <failure message=\"{}\">{}</failure>\n    </testcase>\n",
                        escape(&first),
                        escape(&failed.join("\n"))
                    );
                }
                Verdict::Error => {
                    let msg = t.error.clone().unwrap_or_default();
                    let body = format!("{msg}\n{}", t.stderr_tail.clone().unwrap_or_default());
                    let _ = write!(
                        x,
                        ">\n      <error message=\"{}\">{}</error>\n    </testcase>\n",
                        escape(&msg),
                        escape(body.trim_end())
                    );
                }
                Verdict::Inconclusive => {
                    x.push_str(">\n      <skipped message=\"inconclusive: the cold-vs-cold control disagreed\"/>\n    </testcase>\n");
                }
            }
        }
        for (case, why) in &s.skipped_cases {
            let _ = write!(
                x,
                "    <testcase classname=\"{}.{}\" name=\"case\">\n      <skipped message=\"{}\"/>\n    </testcase>\n",
                escape(&s.name),
                escape(case),
                escape(why)
            );
        }
        if let Some(g) = &s.growth {
            x.push_str(&super::growth::junit_case(&s.name, g));
        }
        if let (true, Some(b)) = (rate_case, s.bound) {
            let limit = s.max_failure_rate.unwrap_or(0.0);
            let _ = write!(x, "    <testcase classname=\"{}\" name=\"failure rate bound\"", escape(&s.name));
            if rate_failed {
                let msg = format!(
                    "{} > {} ({}/{} failed)",
                    stats::percent(b.upper),
                    stats::percent(limit),
                    b.failures,
                    b.trials
                );
                let _ = write!(x, ">\n      <failure message=\"{}\"/>\n    </testcase>\n", escape(&msg));
            } else {
                x.push_str("/>\n");
            }
        }
        x.push_str("  </testsuite>\n");
    }
    x.push_str("</testsuites>\n");
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_drops_control_bytes() {
        assert_eq!(escape("a<b & \"c\"\u{1}"), "a&lt;b &amp; &quot;c&quot;");
    }
}
