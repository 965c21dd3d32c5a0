//! The `kvproof` command line. Every error that reaches `main` is a usage or input error (exit 2); a finished run
//! exits 0 when every check passed and 1 when one failed.

use std::path::{Path, PathBuf};
use strum::IntoEnumIterator;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Parser, Subcommand};
use kvproof::exit;
use kvproof::record::CheckName;
use kvproof::record::Summary;
use kvproof::report::out_dir::{self, Layout};
use kvproof::report::safe_file;
use kvproof::runner::shard::Shard;
use kvproof::scenario::{self, CaseName, Kind};
use kvproof::session::{self, RunOptions, Spread};
use kvproof::{conformance, mutants, progress, report, stats};
use kvproof_engines::config::Preset;
use kvproof_engines::fault::Fault;

const EXIT_CODES: &str = "\
Exit codes:
  0  every check passed
  1  a check failed (or an engine died or hung, or `mutants` found a surviving fault)
  2  usage or input error (bad arguments, unreadable or malformed scenario, engine that cannot start)";

/// Proves LLM inference engines reuse their KV prefix state correctly, and measures what reuse buys.
#[derive(Debug, Parser)]
#[command(name = "kvproof", version, after_help = EXIT_CODES, after_long_help = EXIT_CODES)]
pub struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run scenario files (or folders of them) and write reports/<run>/.
    #[command(after_help = EXIT_CODES)]
    Run {
        /// Scenario files or folders (their *.json, schema.json and kills.json excluded).
        #[arg(required = true, value_name = "SCENARIO|DIR")]
        paths: Vec<PathBuf>,
        /// The run folder [default: reports/<UTC time>]; refused when it holds files, unless --force.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Use a --out folder that already holds files: kvproof's own files there are replaced, others kept.
        #[arg(long)]
        force: bool,
        /// Turn on one named fault in every bundled engine (`none`: force clean engines). See `kvproof list`.
        #[arg(long, value_name = "F", value_parser = parse_fault)]
        fault: Option<FaultArg>,
        /// Print the verdict as JSON on stdout instead of text.
        #[arg(long)]
        json: bool,
        /// Run only shard K of N of the scenarios' units (plans: a boundary case, a conversation, a session, a
        /// growth curve); `kvproof merge` combines the N shard folders into the unsharded run's folder.
        #[arg(long, value_name = "K/N", value_parser = parse_shard)]
        shard: Option<Shard>,
        /// Run J units side by side, each on its own engine instances [default: one per core]; results.jsonl is
        /// written in the same order whatever J is.
        #[arg(long, value_name = "J", value_parser = clap::value_parser!(u32).range(1..=4096))]
        jobs: Option<u32>,
    },
    /// Combine the shard folders of one `run --shard K/N` (all N of them) into one run folder, as the unsharded run.
    #[command(after_help = EXIT_CODES)]
    Merge {
        /// The shard run folders, in any order.
        #[arg(required = true, value_name = "DIR")]
        dirs: Vec<PathBuf>,
        /// The merged run folder; refused when it holds files, unless --force.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Use a --out folder that already holds files: kvproof's own files there are replaced, others kept.
        #[arg(long)]
        force: bool,
        /// Print the verdict as JSON on stdout instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List the bundled engines (presets, faults), scenario kinds, boundary cases and checks.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Write a deterministic random-init model (config.json, model.safetensors, tokenizer.json).
    Fixture {
        #[arg(long)]
        arch: String,
        #[arg(long, value_parser = parse_preset, default_value = "tiny")]
        preset: Preset,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// The model folder; refused when it holds files, unless --force.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Use a --out folder that already holds files: kvproof's own files there are replaced, others kept.
        #[arg(long)]
        force: bool,
    },
    /// Rebuild summary.md and junit.xml of a run folder from run.json and results.jsonl alone.
    #[command(after_help = EXIT_CODES)]
    Report {
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// Compare two state dumps row by row (rows matched by absolute position); exit 0 identical, 1 different.
    #[command(after_help = EXIT_CODES)]
    Diff {
        a: PathBuf,
        b: PathBuf,
        /// Also write the per-layer table as CSV.
        #[arg(long, value_name = "FILE")]
        csv: Option<PathBuf>,
        /// Also draw the heatmap (layers x positions, colour = log10 |diff|): .svg or .png.
        #[arg(long, value_name = "FILE")]
        heatmap: Option<PathBuf>,
        /// Print the whole diff as JSON instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Write the state of a scenario case's engine after a given turn (warm, or the cold run of that turn).
    Dump {
        #[arg(value_name = "SCENARIO")]
        scenario: PathBuf,
        /// The case or conversation name (see `kvproof investigate` errors for the list).
        #[arg(long)]
        case: String,
        /// The turn after which to dump (1-based) [default: the last].
        #[arg(long)]
        turn: Option<usize>,
        /// Dump the cold instance of that turn instead of the warm one.
        #[arg(long)]
        cold: bool,
        #[arg(long, value_name = "F", value_parser = parse_fault)]
        fault: Option<FaultArg>,
        /// The dump file; refused when it exists, unless --force.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// Replace an existing --out file (a link there is replaced, not written through).
        #[arg(long)]
        force: bool,
    },
    /// Rerun one case, dumping warm and cold after every turn, and tell where the states first part.
    Investigate {
        #[arg(value_name = "SCENARIO")]
        scenario: PathBuf,
        #[arg(long)]
        case: String,
        #[arg(long, value_name = "F", value_parser = parse_fault)]
        fault: Option<FaultArg>,
        /// Where the per-turn dumps and diffs go [default: reports/investigate-<UTC time>]; refused when it
        /// holds files, unless --force.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Use a --out folder that already holds files: kvproof's own files there are replaced, others kept.
        #[arg(long)]
        force: bool,
    },
    /// Benchmark the dump diff on large synthetic dumps next to a plain byte comparison (GB/s).
    BenchDiff {
        /// Total size of the two dumps, in GB.
        #[arg(long, default_value_t = 1.0)]
        gb: f64,
        /// Where the temporary dumps are written.
        #[arg(long, value_name = "DIR", default_value = "reports/bench-diff")]
        dir: PathBuf,
    },
    /// Run the scenarios clean and once per fault of each engine they use: every fault must be caught.
    #[command(after_help = EXIT_CODES)]
    Mutants {
        /// Scenario files or folders [default: scenarios/pr].
        #[arg(value_name = "SCENARIO|DIR")]
        paths: Vec<PathBuf>,
        /// The sweep's folder (one run folder per pass) [default: reports/mutants-<UTC time>]; refused when it
        /// holds files, unless --force.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Use a --out folder that already holds files: kvproof's own files there are replaced, others kept.
        #[arg(long)]
        force: bool,
        #[arg(long)]
        json: bool,
        /// Run every scenario each fault applies to, not only the kill map's cheapest killer (the nightly sweep;
        /// what a kill map is recorded from).
        #[arg(long)]
        full: bool,
        /// The kill map: per fault, the scenarios that killed it in a full sweep (docs/mutants.md) [default:
        /// kills.json in the scenario folder, when one folder is given]. A fault it cannot vouch for (no entry, a
        /// scenario gone or changed, a map that does not parse) runs every applicable scenario.
        #[arg(long, value_name = "FILE")]
        kills: Option<PathBuf>,
        /// With --full: record what the sweep learned as the kill map FILE (refused when the clean pass fails).
        #[arg(long, value_name = "FILE", requires = "full")]
        write_kills: Option<PathBuf>,
        /// With --full: exit 1 when the kill map (--kills) differs from what the sweep learned (a fault's killer
        /// set, a scenario's content), printing the differences and the new map.
        #[arg(long, requires = "full")]
        check_kills: bool,
    },
    /// Print the JSON schema of scenario files (scenarios/schema.json is this output).
    Schema,
    /// Start an engine process and check it against the stdio protocol (docs/protocol.md) frame by frame: exit 0
    /// when it violates nothing, 1 when it does, 2 when it cannot start.
    #[command(after_help = EXIT_CODES)]
    Conformance {
        /// How long any one answer may take, in milliseconds.
        #[arg(long, value_name = "MS", default_value_t = 30_000)]
        timeout_ms: u64,
        /// Print the findings as JSON instead of text.
        #[arg(long)]
        json: bool,
        /// The engine's command line, after `--` (`kvproof-engine` is found next to kvproof).
        #[arg(required = true, last = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// Append finished run folders' headline numbers to the nightly history CSV and redraw its trend plots.
    #[command(after_help = EXIT_CODES)]
    History {
        /// Run folders to record (none: only redraw the plots).
        #[arg(value_name = "RUN_DIR")]
        runs: Vec<PathBuf>,
        /// The history folder (history.csv, trend plots, index.html).
        #[arg(long, value_name = "DIR", default_value = "reports/history")]
        dir: PathBuf,
        /// What was tested, e.g. the commit; stored with every row.
        #[arg(long, default_value = "")]
        label: String,
    },
}

/// `--fault`: a fault, or `none`.
#[derive(Debug, Clone, Copy)]
struct FaultArg(Option<Fault>);

fn parse_fault(s: &str) -> Result<FaultArg, String> {
    if s == "none" {
        return Ok(FaultArg(None));
    }
    s.parse::<Fault>().map(|f| FaultArg(Some(f))).map_err(|e| {
        let known: Vec<&str> = Fault::iter().map(Fault::name).collect();
        format!("{e} (known: none, {})", known.join(", "))
    })
}

fn parse_shard(s: &str) -> Result<Shard, String> {
    s.parse::<Shard>().map_err(|e| e.to_string())
}

fn parse_preset(s: &str) -> Result<Preset, String> {
    s.parse::<Preset>().map_err(|e| e.to_string())
}

fn load(paths: &[PathBuf]) -> Result<Vec<scenario::Scenario>> {
    Ok(scenario::load_paths(paths)?)
}

pub fn main(cli: Cli) -> Result<i32> {
    let argv: Vec<String> = std::env::args().collect();
    match cli.command {
        Cmd::Run { paths, out, force, fault, json, shard, jobs } => {
            let scenarios = load(&paths)?;
            let out = out.unwrap_or_else(|| session::default_out(Path::new("reports"), ""));
            out_dir::make_room(&out, Layout::Run, force)?;
            let opts = RunOptions {
                out: out.clone(),
                fault: fault.map(|f| f.0),
                progress: !json && progress::wanted(),
                command: argv,
            };
            let spread = Spread { shard, jobs: jobs.map_or_else(session::default_jobs, |j| j as usize) };
            let (summary, _) = session::run_spread(&scenarios, &opts, spread)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&summary)?);
            } else {
                print_summary(&summary, &out);
            }
            Ok(if summary.pass { exit::PASS } else { exit::FAIL })
        }
        Cmd::Merge { dirs, out, force, json } => {
            out_dir::make_room(&out, Layout::Run, force)?;
            let summary = kvproof::merge::merge(&dirs, &out, argv)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&summary)?);
            } else {
                print_summary(&summary, &out);
            }
            Ok(if summary.pass { exit::PASS } else { exit::FAIL })
        }
        Cmd::Diff { a, b, csv, heatmap, json } => {
            use kvproof::provenance::{diff_files, render};
            let d = diff_files(&a, &b)?;
            if let Some(path) = &csv {
                render::write_csv(&d, path)?;
            }
            if let Some(path) = &heatmap {
                kvproof::plot::heatmap::draw(&d, path, "state A vs B: log10 max |diff| per row")?;
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&d)?);
            } else {
                print!("{}", render::table(&d, ("A", &a.display().to_string()), ("B", &b.display().to_string())));
            }
            Ok(if d.identical() { exit::PASS } else { exit::FAIL })
        }
        Cmd::Dump { scenario, case, turn, cold, fault, out, force } => {
            let scenarios = load(std::slice::from_ref(&scenario))?;
            let s = scenarios.first().context("no scenario")?;
            make_room_for_file(&out, force)?;
            let dump = kvproof::investigate::dump_turn(s, &case, fault.map(|f| f.0), turn, cold)?;
            let bytes = kvproof_engines::dump::write_file(&dump, &out)?;
            println!("wrote {} ({bytes} bytes, {} positions)", out.display(), dump.meta.len);
            Ok(exit::PASS)
        }
        Cmd::Investigate { scenario, case, fault, out, force } => {
            let scenarios = load(std::slice::from_ref(&scenario))?;
            let s = scenarios.first().context("no scenario")?;
            let out = out.unwrap_or_else(|| session::default_out(Path::new("reports"), "investigate-"));
            out_dir::make_room(&out, Layout::Investigate, force)?;
            print!("{}", kvproof::investigate::investigate(s, &case, fault.map(|f| f.0), &out)?);
            Ok(exit::PASS)
        }
        Cmd::BenchDiff { gb, dir } => {
            print!("{}", kvproof::provenance::bench::run(&dir, (gb * 1e9) as u64)?);
            Ok(exit::PASS)
        }
        Cmd::Schema => {
            print!("{}", scenario::schema_json());
            Ok(exit::PASS)
        }
        Cmd::Conformance { timeout_ms, json, command } => {
            let command = kvproof::driver::resolve_program(&command);
            let options = conformance::Options { timeout: std::time::Duration::from_millis(timeout_ms.max(1)) };
            let report = conformance::run(&command, options)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.render());
            }
            Ok(report.exit_code())
        }
        Cmd::List { json } => {
            list(json)?;
            Ok(exit::PASS)
        }
        Cmd::Fixture { arch, preset, seed, out, force } => {
            out_dir::make_room(&out, Layout::Fixture, force)?;
            kvproof_engines::fixture::write_dir(&arch, preset, seed, &out)
                .with_context(|| format!("writing the {arch}/{preset} fixture to {}", out.display()))?;
            println!("wrote {arch}/{preset} seed {seed} to {}", out.display());
            Ok(exit::PASS)
        }
        Cmd::History { runs, dir, label } => {
            let csv = dir.join(kvproof::history::HISTORY_CSV);
            for run in &runs {
                let rows = kvproof::history::headline(run, &label)?;
                let added = kvproof::history::append(&csv, &rows)?;
                if added == 0 {
                    println!("{}: already recorded in {}", run.display(), csv.display());
                } else {
                    println!("{}: {added} numbers appended to {}", run.display(), csv.display());
                }
            }
            let drawn = kvproof::history::plot(&dir)?;
            println!("{} trend plot(s) in {}", drawn.len(), dir.display());
            Ok(exit::PASS)
        }
        Cmd::Report { dir } => {
            let summary = report::rebuild(&dir)?;
            print_summary(&summary, &dir);
            Ok(if summary.pass { exit::PASS } else { exit::FAIL })
        }
        Cmd::Mutants { paths, out, force, json, full, kills, write_kills, check_kills } => {
            let paths = if paths.is_empty() { vec![PathBuf::from("scenarios/pr")] } else { paths };
            let scenarios = load(&paths)?;
            if mutants::faults_of(&scenarios)?.is_empty() {
                bail!("none of the scenarios uses a bundled engine with faults: nothing to mutate");
            }
            let kills = kills.or_else(|| mutants::default_kill_map(&paths));
            if check_kills && kills.is_none() {
                bail!("--check-kills needs the kill map to compare with: give --kills FILE");
            }
            let source = match (&kills, full) {
                (_, true) => mutants::Source::Full,
                (Some(path), false) => mutants::Source::Map { path: path.clone(), map: mutants::KillMap::load(path) },
                (None, false) => mutants::Source::Unmapped {
                    reason: "no kill map (--kills FILE, or one scenario folder holding kills.json)".into(),
                },
            };
            let out = out.unwrap_or_else(|| session::default_out(Path::new("reports"), "mutants-"));
            out_dir::make_room(&out, Layout::Mutants, force)?;
            let show = !json;
            let mut on_pass = |r: &mutants::MutantRow| {
                if show {
                    let verdict = match (r.fault.as_str(), r.failed) {
                        ("clean", false) => "passes".to_string(),
                        ("clean", true) => "FAILS (the clean engines must pass)".to_string(),
                        (_, true) => {
                            format!("caught by {}", r.caught_by.iter().cloned().collect::<Vec<_>>().join(", "))
                        }
                        (_, false) => "SURVIVED".to_string(),
                    };
                    eprintln!("{:<20} {verdict}  [{:.1}s: {}]", r.fault, r.seconds, r.selection);
                }
            };
            let report = mutants::sweep(&scenarios, &out, show && progress::wanted(), &argv, &source, &mut on_pass)?;
            let md = mutants::render_markdown(&report);
            safe_file::replace(&out.join(out_dir::MUTANTS_MD), md.as_bytes())?;
            let js = serde_json::to_string_pretty(&report)?;
            safe_file::replace(&out.join(out_dir::MUTANTS_JSON), format!("{js}\n").as_bytes())?;
            if json {
                println!("{js}");
            } else {
                print!("\n{}", mutants::render_table(&report));
                for s in report.survivors() {
                    println!("SURVIVED: {} ({}) — {}", s.fault, s.description, mutants::survivor_advice(&report, s));
                }
                if report.clean.failed {
                    println!("the clean run failed: see {}/summary.md", report.clean.out.display());
                }
                println!("time per engine (clean+faults): {}", mutants::render_times_line(&report));
                println!("report: {}", out.join(out_dir::MUTANTS_MD).display());
            }
            let mut ok = report.ok();
            if full && (write_kills.is_some() || check_kills) {
                let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
                let recorded_by = format!("kvproof mutants {} --full", names.join(" "));
                let learned = mutants::learned_map(&report, &scenarios, &recorded_by).map_err(|e| anyhow!(e))?;
                if let (true, Some(path)) = (check_kills, &kills) {
                    let stale = match mutants::KillMap::load(path) {
                        Ok(Some(recorded)) => recorded.staleness(&learned),
                        Ok(None) => vec![format!("no kill map at {}", path.display())],
                        Err(e) => vec![e.to_string()],
                    };
                    if !stale.is_empty() {
                        ok = false;
                        eprintln!("the kill map {} is stale:", path.display());
                        for line in &stale {
                            eprintln!("  {line}");
                        }
                        eprintln!(
                            "re-record it with `--full --write-kills {}`; the map this sweep learned:\n{}",
                            path.display(),
                            learned.to_json()
                        );
                    }
                }
                if let Some(path) = &write_kills {
                    if report.clean.failed {
                        eprintln!("not recording {}: the clean pass failed", path.display());
                        ok = false;
                    } else {
                        safe_file::replace(path, learned.to_json().as_bytes())?;
                        eprintln!("kill map recorded: {}", path.display());
                    }
                }
            }
            Ok(if ok { exit::PASS } else { exit::FAIL })
        }
    }
}

/// Make room for a single output file: an existing one (or a link) is refused unless `force`, which removes it
/// (a link itself, never what it points to) so the file is written afresh.
fn make_room_for_file(path: &Path, force: bool) -> Result<()> {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return Ok(()) };
    if meta.is_dir() {
        bail!("{} is a folder; --out names the dump file", path.display());
    }
    if !force {
        bail!("{} exists: choose another file, or pass --force to replace it", path.display());
    }
    std::fs::remove_file(path).with_context(|| format!("replacing {}", path.display()))
}

fn print_summary(summary: &Summary, dir: &Path) {
    for s in &summary.scenarios {
        let bound = s
            .bound
            .map(|b| format!("failure rate <= {} ({:.0}%)", stats::percent(b.upper), b.confidence * 100.0))
            .unwrap_or_default();
        println!(
            "{:4}  {:<24} {:<16} {}/{} passed, {} failed, {} inconclusive, {} errors  {bound}",
            if s.pass { "pass" } else { "FAIL" },
            s.name,
            s.kind,
            s.passed,
            s.trials,
            s.failed,
            s.inconclusive,
            s.errors
        );
        for r in &s.reasons {
            println!("      {r}");
        }
    }
    println!("{}: {}", if summary.pass { "PASS" } else { "FAIL" }, dir.join(report::SUMMARY).display());
}

fn list(json: bool) -> Result<()> {
    let engines: Vec<serde_json::Value> = kvproof_engines::bundled::arches()
        .map(|a| {
            serde_json::json!({
                "arch": a.name,
                "modelled_on": a.modelled_on,
                "state": a.state,
                "reuse_rule": a.reuse_rule,
                "presets": Preset::ALL.iter().map(|p| p.name()).collect::<Vec<_>>(),
                "faults": a.faults.iter().map(|f| serde_json::json!({"name": f.name(), "breaks": f.describe()})).collect::<Vec<_>>(),
            })
        })
        .collect();
    if json {
        let value = serde_json::json!({
            "engines": engines,
            "kinds": Kind::iter().map(|k| serde_json::json!({"name": k.name(), "what": k.describe()})).collect::<Vec<_>>(),
            "boundary_cases": CaseName::iter().map(|c| c.name()).collect::<Vec<_>>(),
            "checks": CheckName::iter().map(|c| c.name()).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    println!("engines (bundled; presets: {}):", Preset::ALL.map(|p| p.name()).join(", "));
    for a in kvproof_engines::bundled::arches() {
        println!("  {:<10} modelled on {}; {}", a.name, a.modelled_on, a.state);
        println!("  {:<10} reuse: {}", "", a.reuse_rule);
        for f in a.faults {
            println!("  {:<10}   fault {:<20} {}", "", f.name(), f.describe());
        }
    }
    println!("scenario kinds:");
    for k in Kind::iter() {
        println!("  {:<16} {}", k.name(), k.describe());
    }
    println!("boundary cases: {}", CaseName::iter().map(|c| c.name()).collect::<Vec<_>>().join(", "));
    println!("checks: {}", CheckName::iter().map(|c| c.name()).collect::<Vec<_>>().join(", "));
    Ok(())
}
