//! The sweep rendered: the terminal table, the markdown summary (mutants.md) with what each fault's pass ran and
//! why, the time per engine, and what to do about survivors.

use std::fmt::Write as _;

use strum::IntoEnumIterator;

use super::{engine_times, MutantRow, MutantsReport};
use crate::record::CheckName;

/// The table: one row per pass, one column per check, `x` where that check failed.
pub fn render_table(report: &MutantsReport) -> String {
    let mut columns: Vec<String> = CheckName::iter().map(|c| c.name().to_string()).collect();
    columns.push("error".into());
    let width = report.faults.iter().map(|r| r.fault.len()).max().unwrap_or(0).max("(clean)".len());
    let mut t = String::new();
    let _ = write!(t, "{:width$}  {:8}", "fault", "verdict");
    for c in &columns {
        let _ = write!(t, "  {c}");
    }
    t.push('\n');
    let row = |t: &mut String, name: &str, verdict: &str, r: &MutantRow| {
        let _ = write!(t, "{name:width$}  {verdict:8}");
        for c in &columns {
            let mark = if r.caught_by.contains(c) { "x" } else { "." };
            let _ = write!(t, "  {mark:^w$}", w = c.len());
        }
        t.push('\n');
    };
    let clean = if report.clean.failed { "FAILS" } else { "passes" };
    row(&mut t, "(clean)", clean, &report.clean);
    for r in &report.faults {
        row(&mut t, &r.fault, if r.failed { "caught" } else { "SURVIVED" }, r);
    }
    t
}

/// The sweep as markdown: the table, then what to do about survivors.
pub fn render_markdown(report: &MutantsReport) -> String {
    let mut md = String::from("# kvproof mutants\n\n");
    let caught = report.faults.iter().filter(|r| r.failed).count();
    let _ = writeln!(
        md,
        "{} of {} faults caught; clean engines {}.\n",
        caught,
        report.faults.len(),
        if report.clean.failed { "FAIL" } else { "pass" }
    );
    md.push_str("```\n");
    md.push_str(&render_table(report));
    md.push_str("```\n\n| fault | what it breaks | caught by | ran | seconds |\n|---|---|---|---|---|\n");
    for r in &report.faults {
        let by = if r.failed {
            r.caught_by.iter().cloned().collect::<Vec<_>>().join(", ")
        } else {
            "**nothing (survived)**".into()
        };
        let _ = writeln!(
            md,
            "| `{}` | {} | {by} | {} ({}) | {:.1} |",
            r.fault,
            r.description,
            r.scenarios.join(", "),
            r.selection,
            r.seconds
        );
    }
    for r in report.survivors() {
        let _ = writeln!(md, "\n**SURVIVED: `{}`**: {}", r.fault, survivor_advice(report, r));
    }
    md.push_str(&render_times(report));
    if !report.not_mutated.is_empty() {
        let _ = writeln!(md, "\nNot mutated (command engines): {}", report.not_mutated.join(", "));
    }
    md
}

/// What a survivor means and what to do: a kill-map choice that no longer kills means the map is stale.
pub fn survivor_advice(report: &MutantsReport, row: &MutantRow) -> String {
    match (&report.kill_map, row.from_map) {
        (Some(map), true) => format!(
            "the kill map {} chose {}, which no longer catches it: re-run the full sweep with the same scenarios \
             and `--full --write-kills {}` to re-record the map (and add a scenario if nothing catches it)",
            map.display(),
            row.scenarios.join(", "),
            map.display()
        ),
        _ => format!("no scenario caught it ({} ran)", row.scenarios.join(", ")),
    }
}

/// Wall time per engine: the clean pass and the fault passes.
pub fn render_times(report: &MutantsReport) -> String {
    let faults_s: f64 = report.faults.iter().map(|r| r.seconds).sum();
    let mut md = format!(
        "\n## Time\n\nClean pass {:.1} s, {} fault passes {:.1} s ({}). Per engine (a pass's wall time split \
         between its engines by their trials' engine time):\n\n| engine | clean pass s | fault passes | fault passes s |\n\
         |---|---|---|---|\n",
        report.clean.seconds,
        report.faults.len(),
        faults_s,
        if report.full { "every applicable scenario per fault" } else { "the kill map's choice per fault" }
    );
    for t in engine_times(report) {
        let _ = writeln!(md, "| {} | {:.1} | {} | {:.1} |", t.engine, t.clean_s, t.fault_passes, t.faults_s);
    }
    md
}

/// One line per engine for the terminal: `engine: clean X s, faults Y s (N passes)`.
pub fn render_times_line(report: &MutantsReport) -> String {
    engine_times(report)
        .iter()
        .map(|t| format!("{} {:.1}+{:.1}s", t.engine, t.clean_s, t.faults_s))
        .collect::<Vec<_>>()
        .join(", ")
}
