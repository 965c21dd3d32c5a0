//! The gate's kill map: which scenarios each fault's pass runs when the map is present, absent, stale or corrupt;
//! the map's round trip; and, end to end on small kimi scenarios, a full sweep that records the map, the gate that
//! then runs one scenario per fault, and a stale map whose choice no longer kills (survived, with the command that
//! re-records the map).

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use kvproof::mutants::kill_map::{FaultKills, KillMap, Killer, ScenarioPrint};
use kvproof::mutants::{faults_of, selection, FaultPlan, Selection, Source};
use kvproof::scenario::{load_paths, Scenario};
use support::{kvproof, text, tmp, ScratchDir};

/// A kimi boundary matrix of `cases`, named `name`.
fn scenario_text(name: &str, cases: &str) -> String {
    format!(
        r#"{{"name": "{name}", "engine": {{"arch": "kimi", "preset": "tiny", "seed": 0}}, "kind": "boundary-matrix",
 "seed": 1, "params": {{"cases": [{cases}], "max_tokens": 4}}, "assert": {{"control": false}}}}"#
    )
}

/// A folder of two kimi scenarios: `strong` (several cases; catches both kimi faults) and `weak` (one case: catches
/// kv-leak, whose memory check fails on any run, but not truncate-recurrent); the scratch folder holding it goes
/// with it, to be kept for as long as the folder is used.
fn scenario_dir(name: &str) -> (ScratchDir, PathBuf) {
    let scratch = tmp(name);
    let dir = scratch.join("scenarios");
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(
        dir.join("strong.json"),
        scenario_text("strong", r#""extend", "shorter", "diverge-middle", "growing-conversation""#),
    )
    .expect("write");
    std::fs::write(dir.join("weak.json"), scenario_text("weak", r#""extend""#)).expect("write");
    (scratch, dir)
}

fn load(dir: &Path) -> Vec<Scenario> {
    load_paths(&[dir.to_path_buf()]).expect("load")
}

/// A map whose every fault is killed by `killers` (name, cost), fingerprinting the scenarios as they are now.
fn map_of(scenarios: &[Scenario], killers: &[(&str, u64)]) -> KillMap {
    let prints: BTreeMap<String, ScenarioPrint> =
        selection::prints(scenarios).into_iter().map(|(n, p)| (n, p.expect("print"))).collect();
    let faults = faults_of(scenarios)
        .expect("faults")
        .iter()
        .map(|f| {
            let killers = killers
                .iter()
                .map(|(s, cost)| Killer {
                    scenario: s.to_string(),
                    cost_ms: *cost,
                    caught_by: BTreeSet::from(["tokens".to_string()]),
                })
                .collect();
            (f.name().to_string(), FaultKills { killers })
        })
        .collect();
    KillMap { schema: 1, recorded_by: "test".into(), scenarios: prints, faults }
}

fn plan_with(scenarios: &[Scenario], path: &Path, text: Option<&str>) -> Vec<FaultPlan> {
    let map = match text {
        Some(t) => KillMap::parse(path, t).map(Some),
        None => Ok(None),
    };
    let faults = faults_of(scenarios).expect("faults");
    selection::plan(scenarios, &faults, &Source::Map { path: path.to_path_buf(), map })
}

fn ran(plan: &FaultPlan) -> Vec<&str> {
    plan.scenarios.iter().map(|s| s.name.as_str()).collect()
}

fn fallback_reason(plan: &FaultPlan) -> &str {
    match &plan.selection {
        Selection::Fallback { reason } => reason,
        other => panic!("{}: expected every applicable scenario, got {other:?}", plan.fault.name()),
    }
}

#[test]
fn a_current_map_runs_each_faults_cheapest_killer() {
    let (_scratch, dir) = scenario_dir("select-current");
    let scenarios = load(&dir);
    let path = dir.join("kills.json");
    let map = map_of(&scenarios, &[("strong", 900), ("weak", 40)]);
    let plans = plan_with(&scenarios, &path, Some(&map.to_json()));
    assert_eq!(plans.len(), 2, "kimi has two faults");
    for p in &plans {
        assert_eq!(ran(p), ["weak"], "{}", p.fault.name());
        assert_eq!(p.selection, Selection::FromMap { scenario: "weak".into(), killers: 2 });
    }
    // --full ignores the map
    let faults = faults_of(&scenarios).expect("faults");
    for p in selection::plan(&scenarios, &faults, &Source::Full) {
        assert_eq!(ran(&p), ["strong", "weak"]);
        assert_eq!(p.selection, Selection::Full);
    }
}

#[test]
fn a_map_that_cannot_vouch_for_a_fault_runs_its_full_set_and_says_why() {
    let (_scratch, dir) = scenario_dir("select-fallback");
    let scenarios = load(&dir);
    let path = dir.join("kills.json");
    let at = path.display().to_string();

    // absent
    for p in plan_with(&scenarios, &path, None) {
        assert_eq!(ran(&p), ["strong", "weak"]);
        assert_eq!(fallback_reason(&p), format!("no kill map at {at}"));
    }

    // corrupt: the error names the file and the line
    for p in plan_with(&scenarios, &path, Some("{\n  \"schema\": 1,\n  oops")) {
        assert_eq!(ran(&p), ["strong", "weak"]);
        let reason = fallback_reason(&p);
        assert!(reason.starts_with(&format!("{at}: not a kill map")) && reason.contains("line 3"), "{reason}");
    }

    // a fault missing from the map
    let mut map = map_of(&scenarios, &[("weak", 40)]);
    map.faults.remove("kv-leak");
    let plans = plan_with(&scenarios, &path, Some(&map.to_json()));
    let leak = plans.iter().find(|p| p.fault.name() == "kv-leak").expect("kv-leak");
    assert_eq!(ran(leak), ["strong", "weak"]);
    assert_eq!(fallback_reason(leak), format!("{at} has no entry faults.kv-leak"));
    let other = plans.iter().find(|p| p.fault.name() == "truncate-recurrent").expect("truncate-recurrent");
    assert_eq!(ran(other), ["weak"], "the other fault still uses the map");

    // a killer whose file changed since the map was recorded (even one that is not the cheapest)
    let map = map_of(&scenarios, &[("strong", 900), ("weak", 40)]);
    std::fs::write(dir.join("strong.json"), scenario_text("strong", r#""extend""#)).expect("rewrite");
    let changed = load(&dir);
    for p in plan_with(&changed, &path, Some(&map.to_json())) {
        assert_eq!(ran(&p), ["strong", "weak"]);
        assert!(fallback_reason(&p).contains("scenarios.strong.sha256 differs"), "{}", fallback_reason(&p));
    }

    // a killer that is no longer among the scenarios
    std::fs::remove_file(dir.join("strong.json")).expect("remove");
    let fewer = load(&dir);
    for p in plan_with(&fewer, &path, Some(&map.to_json())) {
        assert_eq!(ran(&p), ["weak"]);
        assert!(fallback_reason(&p).contains("names scenario strong, which is not among"), "{}", fallback_reason(&p));
    }

    // a fault nothing killed in the full sweep
    let map = map_of(&fewer, &[]);
    for p in plan_with(&fewer, &path, Some(&map.to_json())) {
        assert!(fallback_reason(&p).contains(".killers is empty"), "{}", fallback_reason(&p));
    }
}

#[test]
fn the_map_round_trips_and_names_bad_fields() {
    let (_scratch, dir) = scenario_dir("round-trip");
    let scenarios = load(&dir);
    let map = map_of(&scenarios, &[("strong", 900), ("weak", 40)]);
    let path = dir.join("kills.json");
    let json = map.to_json();
    assert_eq!(KillMap::parse(&path, &json).expect("parse"), map);
    std::fs::write(&path, &json).expect("write");
    assert_eq!(KillMap::load(&path).expect("load"), Some(map.clone()));
    assert_eq!(KillMap::load(&dir.join("absent.json")).expect("absent"), None);
    assert!(map.staleness(&map).is_empty());

    // a killer set that differs is stale; a cost that differs is not
    let mut cheaper = map.clone();
    cheaper.faults.get_mut("kv-leak").expect("kv-leak").killers[0].cost_ms = 1;
    assert!(map.staleness(&cheaper).is_empty());
    let mut fewer = map.clone();
    fewer.faults.get_mut("kv-leak").expect("kv-leak").killers.retain(|k| k.scenario == "strong");
    assert_eq!(map.staleness(&fewer), ["fault kv-leak: recorded killers [strong, weak], this sweep's [strong]"]);

    // fields checked after parsing are named
    let mut bad = map.clone();
    bad.scenarios.get_mut("weak").expect("weak").sha256 = "xyz".into();
    let e = KillMap::parse(&path, &bad.to_json()).expect_err("bad sha");
    assert!(e.to_string().contains("field `scenarios.weak.sha256`"), "{e}");
    let mut unknown = map.clone();
    unknown.faults.get_mut("kv-leak").expect("kv-leak").killers[0].scenario = "gone".into();
    let e = KillMap::parse(&path, &unknown.to_json()).expect_err("unknown scenario");
    assert!(e.to_string().contains("field `faults.kv-leak.killers[0].scenario`"), "{e}");
    let e = KillMap::parse(&path, &json.replace("\"schema\": 1", "\"schema\": 2")).expect_err("schema");
    assert!(e.to_string().contains("field `schema`"), "{e}");
}

/// The full sweep records a map; the gate then runs one scenario per fault from it, and all are caught; a map whose
/// choice no longer kills makes the fault SURVIVED, with the command that re-records the map, and exit 1.
#[test]
fn the_gate_runs_the_recorded_choice_and_a_stale_choice_fails_red() {
    let (_scratch, dir) = scenario_dir("gate");
    let map = dir.join("kills.json");
    // `kvproof mutants FLAGS.. DIR --out <sibling folder named `out`>`
    let mutants = |flags: &[&std::ffi::OsStr], out: &str| {
        let out = dir.parent().expect("parent").join(out);
        let o = kvproof().arg("mutants").args(flags).arg(&dir).arg("--out").arg(&out).output().expect("run mutants");
        (o, out)
    };
    let (o, _) = mutants(&["--full".as_ref(), "--write-kills".as_ref(), map.as_os_str()], "full");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let recorded = KillMap::load(&map).expect("load").expect("written");
    let killers = |f: &str| -> Vec<String> { recorded.faults[f].killers.iter().map(|k| k.scenario.clone()).collect() };
    assert_eq!(killers("kv-leak"), ["strong", "weak"], "{}", recorded.to_json());
    assert_eq!(killers("truncate-recurrent"), ["strong"], "{}", recorded.to_json());
    // weak's one case costs less than strong's four
    let cost = |f: &str, s: &str| recorded.faults[f].killers.iter().find(|k| k.scenario == s).expect("killer").cost_ms;
    assert!(cost("kv-leak", "weak") < cost("kv-leak", "strong"), "{}", recorded.to_json());

    // the gate: the cheapest killer per fault, from the map (the folder's kills.json by default)
    let (o, out) = mutants(&[], "gate");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let report: kvproof::mutants::MutantsReport =
        serde_json::from_str(&std::fs::read_to_string(out.join("mutants.json")).expect("json")).expect("report");
    let ran: Vec<(&str, Vec<String>)> = report.faults.iter().map(|r| (r.fault.as_str(), r.scenarios.clone())).collect();
    assert_eq!(ran, [("kv-leak", vec!["weak".to_string()]), ("truncate-recurrent", vec!["strong".to_string()])]);
    assert!(report.faults.iter().all(|r| r.from_map && r.failed), "{report:#?}");

    // the nightly's check passes while the map is current
    let (o, out) = mutants(&["--full".as_ref(), "--check-kills".as_ref()], "check-current");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let md = std::fs::read_to_string(out.join("mutants.md")).expect("md");
    assert!(md.contains("## Time") && md.contains("| kimi |"), "{md}");

    // a stale map: it says `weak` kills every fault (with weak's true hash), but weak misses truncate-recurrent
    let mut stale = recorded.clone();
    for kills in stale.faults.values_mut() {
        kills.killers = vec![Killer { scenario: "weak".into(), cost_ms: 1, caught_by: BTreeSet::new() }];
    }
    std::fs::write(&map, stale.to_json()).expect("write");
    let (o, _) = mutants(&[], "stale");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let t = text(&o);
    let line = t.lines().find(|l| l.starts_with("SURVIVED: truncate-recurrent ")).unwrap_or_else(|| panic!("{t}"));
    assert!(line.contains("chose weak, which no longer catches it"), "{line}");
    assert!(line.contains(&format!("--full --write-kills {}", map.display())), "{line}");
    assert!(!t.contains("SURVIVED: kv-leak"), "{t}");

    // the nightly's check: the full sweep against the stale map fails and prints the map it learned
    let (o, _) = mutants(&["--full".as_ref(), "--check-kills".as_ref()], "check");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("fault truncate-recurrent: recorded killers [weak], this sweep's [strong]"), "{t}");
    assert!(t.contains("fault kv-leak: recorded killers [weak], this sweep's [strong, weak]"), "{t}");
    assert!(t.contains("\"recorded_by\": \"kvproof mutants "), "the learned map is printed: {t}");
}
