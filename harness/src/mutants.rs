//! `kvproof mutants`: prove the scenarios catch every bug class they claim to. The scenarios run once on clean
//! engines (which must pass) and once per fault of each bundled engine they use (each of which must fail);
//! the table says which checks caught each fault.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use strum::IntoEnumIterator;

use kvproof_engines::fault::Fault;
use serde::{Deserialize, Serialize};

use crate::record::CheckName;
use crate::scenario::{EngineSpec, Scenario};
use crate::session::{self, RunOptions, SessionError};

/// One pass of the sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MutantRow {
    /// The fault's name, or "(clean)".
    pub fault: String,
    pub description: String,
    /// The scenarios that ran in this pass.
    pub scenarios: Vec<String>,
    /// Whether the run failed (for a fault: caught; for the clean pass: a problem).
    pub failed: bool,
    /// The checks that failed somewhere (plus "error" when an engine died).
    pub caught_by: BTreeSet<String>,
    /// The pass's run folder.
    pub out: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MutantsReport {
    pub clean: MutantRow,
    pub faults: Vec<MutantRow>,
    /// Scenarios whose engine is a command: faults cannot be injected into them.
    pub not_mutated: Vec<String>,
}

impl MutantsReport {
    pub fn survivors(&self) -> Vec<&MutantRow> {
        self.faults.iter().filter(|r| !r.failed).collect()
    }

    /// The clean engines pass and every fault is caught.
    pub fn ok(&self) -> bool {
        !self.clean.failed && self.survivors().is_empty() && !self.faults.is_empty()
    }
}

/// The faults of every bundled engine the scenarios use, in catalog order.
pub fn faults_of(scenarios: &[Scenario]) -> Result<Vec<Fault>, kvproof_engines::EngineError> {
    let mut out = BTreeSet::new();
    for s in scenarios {
        if let EngineSpec::Bundled { arch, .. } = &s.engine {
            out.extend(kvproof_engines::bundled::arch(arch)?.faults.iter().copied());
        }
    }
    Ok(out.into_iter().collect())
}

fn applies(s: &Scenario, f: Fault) -> bool {
    match &s.engine {
        EngineSpec::Bundled { arch, .. } => kvproof_engines::bundled::check_fault(arch, Some(f)).is_ok(),
        EngineSpec::Command { .. } | EngineSpec::Http(_) => false,
    }
}

/// Run the sweep into `out` (one run folder per pass). `on_pass` is told about each finished pass.
pub fn sweep(
    scenarios: &[Scenario],
    out: &Path,
    progress: bool,
    command: &[String],
    on_pass: &mut dyn FnMut(&MutantRow),
) -> Result<MutantsReport, SessionError> {
    let faults = faults_of(scenarios).map_err(|e| SessionError::Fault {
        scenario: scenarios.first().map(|s| s.name.clone()).unwrap_or_default(),
        path: scenarios.first().map(|s| s.path.clone()).unwrap_or_default(),
        message: e.to_string(),
    })?;
    let pass = |name: &str, description: &str, set: Vec<Scenario>, fault: Option<Fault>| {
        let opts = RunOptions { out: out.join(name), fault: Some(fault), progress, command: command.to_vec() };
        let (summary, _) = session::run_scenarios(&set, &opts)?;
        Ok::<MutantRow, SessionError>(MutantRow {
            fault: name.to_string(),
            description: description.to_string(),
            scenarios: set.iter().map(|s| s.name.clone()).collect(),
            failed: !summary.pass,
            caught_by: summary.caught_by(),
            out: opts.out,
        })
    };
    let clean = pass("clean", "no fault: every scenario must pass", scenarios.to_vec(), None)?;
    on_pass(&clean);
    let mut rows = Vec::new();
    for f in faults {
        let set: Vec<Scenario> = scenarios.iter().filter(|s| applies(s, f)).cloned().collect();
        let row = pass(f.name(), f.describe(), set, Some(f))?;
        on_pass(&row);
        rows.push(row);
    }
    let not_mutated =
        scenarios.iter().filter(|s| !matches!(s.engine, EngineSpec::Bundled { .. })).map(|s| s.name.clone()).collect();
    Ok(MutantsReport { clean, faults: rows, not_mutated })
}

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
    md.push_str("```\n\n| fault | what it breaks | caught by |\n|---|---|---|\n");
    for r in &report.faults {
        let by = if r.failed {
            r.caught_by.iter().cloned().collect::<Vec<_>>().join(", ")
        } else {
            "**nothing (survived)**".into()
        };
        let _ = writeln!(md, "| `{}` | {} | {by} |", r.fault, r.description);
    }
    if !report.not_mutated.is_empty() {
        let _ = writeln!(md, "\nNot mutated (command engines): {}", report.not_mutated.join(", "));
    }
    md
}
