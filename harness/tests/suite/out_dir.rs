//! The run folder is kvproof's and nothing else: a run writes only inside it and follows no symlink it did not
//! create, `--out` onto a folder that holds files is refused unless `--force` (which clears only kvproof's own
//! files), `kvproof report` reads only inside the folder, and an error's text is printed once.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::support;
use support::{kvproof, text, tmp};

/// A three-case boundary run of the tiny bundled engine (a fraction of a second).
fn scenario(dir: &Path) -> PathBuf {
    let p = dir.join("s.json");
    std::fs::write(
        &p,
        r#"{"name": "small", "engine": {"arch": "inkling", "preset": "tiny"}, "kind": "boundary-matrix",
        "seed": 3, "params": {"cases": ["extend", "diverge-last", "prompt-reply"], "max_tokens": 5}}"#,
    )
    .expect("write scenario");
    p
}

fn run(dir: &Path, out: &Path, extra: &[&str]) -> Output {
    kvproof().arg("run").arg(scenario(dir)).arg("--out").arg(out).args(extra).output().expect("run")
}

fn symlink(target: &Path, link: &Path) {
    std::os::unix::fs::symlink(target, link).expect("symlink");
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn a_symlink_in_the_out_folder_is_never_followed() {
    let dir = tmp("symlink");
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, "precious\n").expect("victim");
    let elsewhere = dir.join("elsewhere");
    std::fs::create_dir(&elsewhere).expect("elsewhere");
    std::fs::write(elsewhere.join("keep.txt"), "mine\n").expect("keep");

    let out = dir.join("out");
    std::fs::create_dir(&out).expect("out");
    symlink(&victim, &out.join("turns.csv"));
    symlink(&elsewhere, &out.join("plots"));
    let o = run(&dir, &out, &[]);
    assert_eq!(read(&victim), "precious\n", "the run wrote through out/turns.csv: {}", text(&o));
    assert_eq!(o.status.code(), Some(2), "a folder holding files is refused: {}", text(&o));

    // --force removes the links (they carry kvproof's names) and writes real files; the targets stay untouched
    let o = run(&dir, &out, &["--force"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(read(&victim), "precious\n");
    assert_eq!(std::fs::read_dir(&elsewhere).expect("elsewhere").count(), 1, "plots were drawn through the link");
    for name in ["turns.csv", "plots"] {
        let meta = std::fs::symlink_metadata(out.join(name)).expect("written");
        assert!(!meta.file_type().is_symlink(), "{name} is still a link");
    }

    // `report` rewrites the derived files in place: a link planted in the folder is not written through
    for name in ["junit.tmp", "summary.tmp", "index.tmp", "growth.csv"] {
        symlink(&victim, &out.join(name));
    }
    let o = kvproof().arg("report").arg(&out).output().expect("report");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(read(&victim), "precious\n", "report wrote through a link");
}

#[test]
fn out_onto_a_folder_that_holds_files_is_refused_without_force() {
    let dir = tmp("refuse");
    let out = dir.join("out");
    std::fs::create_dir(&out).expect("an empty folder is fine");
    let o = run(&dir, &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let before = read(&out.join("results.jsonl"));

    let o = run(&dir, &out, &["--fault", "memcmp-short"]);
    let msg = text(&o);
    assert_eq!(o.status.code(), Some(2), "{msg}");
    assert!(msg.contains(&out.display().to_string()) && msg.contains("--force"), "{msg}");
    assert_eq!(read(&out.join("results.jsonl")), before, "the old run was touched");
    assert!(!out.join("provenance").exists(), "the refused run captured provenance");

    // mutants and investigate guard their folders the same way
    std::fs::write(dir.join("notes.txt"), "x").expect("notes");
    let o = kvproof().arg("mutants").arg(scenario(&dir)).arg("--out").arg(&dir).output().expect("mutants");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--force"), "{}", text(&o));
    let o = kvproof()
        .arg("investigate")
        .arg(scenario(&dir))
        .args(["--case", "extend", "--out"])
        .arg(&dir)
        .output()
        .expect("investigate");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--force"), "{}", text(&o));
}

#[test]
fn force_clears_only_kvproofs_own_files() {
    let dir = tmp("force");
    let out = dir.join("out");
    let o = run(&dir, &out, &["--fault", "memcmp-short"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(out.join("provenance").is_dir(), "the faulty run captured provenance");
    std::fs::write(out.join("notes.txt"), "mine\n").expect("notes");
    std::fs::write(out.join("plots/mine.png"), "mine\n").expect("plot");
    std::fs::create_dir(out.join("data")).expect("data");
    std::fs::write(out.join("data/results.jsonl"), "mine\n").expect("data");

    let o = run(&dir, &out, &["--force"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(read(&out.join("notes.txt")), "mine\n");
    assert_eq!(read(&out.join("plots/mine.png")), "mine\n", "an unrelated plot was deleted");
    assert_eq!(read(&out.join("data/results.jsonl")), "mine\n");
    assert!(!out.join("provenance").exists(), "the old run's provenance is left behind");
    assert!(!out.join("plots/heatmap-01-small-diverge-last-turn-2.svg").exists(), "the old run's heatmap is left");
    let index = read(&out.join("index.html"));
    assert!(!index.contains("provenance/"), "the new index links the old provenance");
    assert!(read(&out.join("summary.md")).contains("3/3"));
}

/// Rewrite the `provenance.dir` of every results line that has one.
fn set_provenance_dir(out: &Path, to: &str) {
    let path = out.join("results.jsonl");
    let mut lines = Vec::new();
    for line in read(&path).lines() {
        let mut v: serde_json::Value = serde_json::from_str(line).expect("json");
        if v["provenance"].is_object() {
            v["provenance"]["dir"] = serde_json::Value::String(to.into());
        }
        lines.push(v.to_string());
    }
    std::fs::write(&path, lines.join("\n") + "\n").expect("write");
}

#[test]
fn report_reads_only_inside_the_run_folder() {
    let dir = tmp("inside");
    let out = dir.join("out");
    let o = run(&dir, &out, &["--fault", "memcmp-short"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let captured = out.join("provenance/small/diverge-last/turn-2");
    let line =
        read(&out.join("results.jsonl")).lines().position(|l| l.contains("\"provenance\":{")).expect("a capture") + 1;
    // a copy of the capture outside the run folder, which a report must not read
    let outside = dir.join("outside");
    std::fs::create_dir(&outside).expect("outside");
    std::fs::copy(captured.join("diff.json"), outside.join("diff.json")).expect("copy");

    for escape in ["../outside", outside.to_str().expect("utf-8"), "provenance/../../outside"] {
        set_provenance_dir(&out, escape);
        let o = kvproof().arg("report").arg(&out).output().expect("report");
        let msg = text(&o);
        assert_eq!(o.status.code(), Some(2), "`{escape}` was followed: {msg}");
        assert!(msg.contains(&format!("results.jsonl:{line}:")) && msg.contains("provenance.dir"), "{msg}");
    }

    // a relative path whose folder is a link out of the run folder
    std::fs::remove_dir_all(&captured).expect("rm");
    symlink(&outside, &captured);
    set_provenance_dir(&out, "provenance/small/diverge-last/turn-2");
    let o = kvproof().arg("report").arg(&out).output().expect("report");
    let msg = text(&o);
    assert_eq!(o.status.code(), Some(2), "the link was followed: {msg}");
    assert!(msg.contains("provenance.dir") && msg.contains("link"), "{msg}");
    assert!(!read(&out.join("index.html")).contains("outside"), "{msg}");
}

#[test]
fn results_lines_and_the_manifest_are_bounded() {
    let dir = tmp("bounded");
    let out = dir.join("out");
    let o = run(&dir, &out, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let results = read(&out.join("results.jsonl"));
    let mut lines: Vec<String> = results.lines().map(str::to_string).collect();
    // valid JSON, padded past any sane record size
    lines[1] = format!("{}{}", " ".repeat(17 << 20), lines[1]);
    std::fs::write(out.join("results.jsonl"), lines.join("\n") + "\n").expect("write");
    let o = kvproof().arg("report").arg(&out).output().expect("report");
    let msg = text(&o);
    assert_eq!(o.status.code(), Some(2), "an oversized line was read whole");
    assert!(msg.contains("results.jsonl:2:") && msg.contains("longer than"), "{}", &msg[..msg.len().min(500)]);

    std::fs::write(out.join("results.jsonl"), results).expect("write");
    let manifest = read(&out.join("run.json"));
    std::fs::write(out.join("run.json"), format!("{}{manifest}", " ".repeat(17 << 20))).expect("write");
    let o = kvproof().arg("report").arg(&out).output().expect("report");
    let msg = text(&o);
    assert_eq!(o.status.code(), Some(2), "an oversized manifest was read whole");
    assert!(msg.contains("run.json") && msg.contains("larger than"), "{}", &msg[..msg.len().min(500)]);
}

#[test]
fn an_error_with_an_inner_cause_is_printed_once() {
    let dir = tmp("once");
    let o = kvproof().arg("report").arg(dir.join("missing")).output().expect("report");
    let msg = text(&o);
    assert_eq!(o.status.code(), Some(2), "{msg}");
    assert!(msg.contains("missing/run.json"), "{msg}");
    assert_eq!(msg.matches("os error 2").count(), 1, "printed twice: {msg}");
}

#[test]
fn dump_and_fixture_refuse_what_exists_and_force_replaces_links_not_targets() {
    let dir = tmp("dump");
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, "precious\n").expect("victim");
    let out = dir.join("state.safetensors");
    symlink(&victim, &out);
    let dump = |extra: &[&str]| {
        kvproof()
            .arg("dump")
            .arg(scenario(&dir))
            .args(["--case", "extend", "--out"])
            .arg(&out)
            .args(extra)
            .output()
            .expect("dump")
    };
    let o = dump(&[]);
    assert_eq!(read(&victim), "precious\n", "the dump wrote through the link: {}", text(&o));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--force"), "{}", text(&o));
    let o = dump(&["--force"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(read(&victim), "precious\n");
    assert!(std::fs::symlink_metadata(&out).expect("dump").is_file());

    let model = dir.join("model");
    std::fs::create_dir(&model).expect("model");
    std::fs::write(model.join("notes.txt"), "mine\n").expect("notes");
    symlink(&victim, &model.join("config.json"));
    let fixture = |extra: &[&str]| {
        kvproof()
            .args(["fixture", "--arch", "inkling", "--preset", "tiny", "--out"])
            .arg(&model)
            .args(extra)
            .output()
            .expect("fixture")
    };
    let o = fixture(&[]);
    assert_eq!(read(&victim), "precious\n", "the fixture wrote through the link: {}", text(&o));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = fixture(&["--force"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(read(&victim), "precious\n");
    assert_eq!(read(&model.join("notes.txt")), "mine\n");
    assert!(std::fs::symlink_metadata(model.join("config.json")).expect("config").is_file());
}
