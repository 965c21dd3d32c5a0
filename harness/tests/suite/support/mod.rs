//! What the integration tests share: the built `kvproof` and `kvproof-engine`, the repository's root, a fresh
//! scratch folder per test, scenarios run in-process, and a command's output as one text for assertion messages.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kvproof::record::{Summary, TrialRecord};
use kvproof::scenario::Scenario;
use kvproof::session::{run_scenarios, RunOptions};
pub use kvproof_engines::scratch_dir::ScratchDir;

/// The `kvproof` binary of this build, run as under CI (no progress bars).
pub fn kvproof() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kvproof"));
    c.env("CI", "true");
    c
}

/// The `kvproof-engine` binary built next to this test's binary (`cargo test --workspace` builds it).
pub fn engine_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    kvproof::driver::sibling_binary(&exe, "kvproof-engine").unwrap_or_else(|| {
        panic!(
            "kvproof-engine is not built next to {}: run `cargo test --workspace` (or `cargo build -p kvproof-engines`)",
            exe.display()
        )
    })
}

/// The repository's root (where scenarios/, ci/ and fuzz/ are).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The name of the test file that called (`cli` for cli.rs): test files that share a process (and so its id) get
/// scratch folders of their own by it.
#[track_caller]
fn caller() -> String {
    let file = Path::new(std::panic::Location::caller().file());
    file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}

/// An empty scratch folder named after the calling test file, the process and `name`; removed when dropped, kept
/// when the test fails.
#[track_caller]
pub fn tmp(name: &str) -> ScratchDir {
    ScratchDir::new(&format!("{}-{}-{name}", caller(), std::process::id()))
}

/// `scenarios` run in-process (no fault, no progress bars) into a scratch folder named after the calling test file
/// and `name`, removed afterwards: the run's summary and trials.
#[track_caller]
pub fn run_in_tmp(name: &str, scenarios: &[Scenario]) -> (Summary, Vec<TrialRecord>) {
    let dir = ScratchDir::new(&format!("{}-{}-{name}", caller(), std::process::id()));
    let opts = RunOptions { out: dir.join("run"), fault: None, progress: false, command: vec![] };
    run_scenarios(scenarios, &opts).expect("run")
}

/// stdout then stderr.
pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}
