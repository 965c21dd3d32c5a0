//! The HTTP driver against `kvproof-engine --http 0` (built by `cargo test --workspace` next to this test's
//! binary, started here on a port the OS picks): the same scenarios in-process, over stdio and over HTTP give the
//! same verdicts, reuse counts and replies trial for trial; a server with its prompt cache off fails
//! `reuse-fired`; a served fault is caught; a second server serves as the cold instance; conversations as text
//! reach the engine's own template; servers that are absent or silent are start errors, and a server that comes up
//! late is reached by the retries.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kvproof::driver::{launcher_for, ChatRequest, DriverError};
use kvproof::record::{CheckName, Status, TrialRecord, Verdict};
use kvproof::scenario::{load_str, Scenario};
use kvproof_engines::chat::TextMessage;
use serde_json::{json, Value};

use crate::support;
use support::{engine_binary, run_in_tmp};

/// `kvproof-engine ARGS --http PORT`, stopped when dropped.
struct Served {
    child: Child,
    url: String,
}

impl Served {
    fn start(args: &[&str]) -> Served {
        Served::on_port(args, 0)
    }

    fn on_port(args: &[&str], port: u16) -> Served {
        let mut child = Command::new(engine_binary())
            .args(args)
            .args(["--http", &port.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn kvproof-engine --http");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("first line");
        let url =
            line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("first line: {line:?}")).to_string();
        Served { child, url }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tiny(arch: &str) -> Vec<&str> {
    vec!["--arch", arch, "--preset", "tiny", "--seed", "0"]
}

fn scenario(name: &str, engine: Value, kind: &str, params: Value) -> Scenario {
    let json = json!({
        "name": name, "engine": engine, "kind": kind, "seed": 5, "params": params,
        // dumps travel neither over HTTP nor, for the memory check, over stdio: compare what all three carry
        "assert": {"state": false},
    });
    load_str(Path::new("http.json"), &json.to_string()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The start error of a launcher that must not start.
fn start_error(engine: Value) -> DriverError {
    match launcher_for(&scenario("start", engine, "stress-pairs", json!({})).engine, None) {
        Ok(l) => panic!("started: {}", l.label()),
        Err(e) => e,
    }
}

fn http(url: &str) -> Value {
    json!({"url": url, "cold": "bypass", "reset": "llama.cpp"})
}

fn stdio(arch: &str) -> Value {
    let mut command = vec![engine_binary().to_string_lossy().into_owned()];
    command.extend(tiny(arch).iter().map(|s| s.to_string()));
    json!({"command": command})
}

fn status(t: &TrialRecord, c: CheckName) -> Option<Status> {
    t.checks.iter().find(|r| r.check == c).map(|r| r.status)
}

/// What the three transports must agree on, trial for trial.
fn essentials(trials: &[TrialRecord]) -> Vec<Value> {
    let mut rows: Vec<Value> = trials
        .iter()
        .map(|t| {
            let checks: Vec<Value> =
                [CheckName::Outcome, CheckName::Tokens, CheckName::Control, CheckName::Reuse, CheckName::ReuseFired]
                    .iter()
                    .map(|&c| json!([c.name(), status(t, c).map(|s| format!("{s:?}"))]))
                    .collect();
            json!({
                "trial": format!("{} / {} / {}", t.scenario, t.plan, t.step),
                "verdict": format!("{:?}", t.verdict),
                "reused": t.reused, "expected": t.expected_reuse, "prompt": t.prompt_tokens,
                "warm": t.warm_reply, "cold": t.cold_reply,
                "checks": checks,
                "staleness": t.staleness.as_ref().map(|s| format!("{:?}", s.class)),
            })
        })
        .collect();
    rows.sort_by_key(|r| r["trial"].as_str().unwrap_or_default().to_string());
    rows
}

#[test]
fn in_process_stdio_and_http_give_the_same_trials() {
    // boundary cases that need no dumps, no cancel and no audio; stress pairs and staleness on engines without audio
    let inkling_cases = json!({"cases": ["extend", "exact-repeat", "shorter", "diverge-first", "diverge-middle",
        "diverge-last", "prompt-reply", "window-wrap", "capacity-growth", "context-overflow", "block-edges"]});
    let glm53_cases = json!({"cases": ["extend", "grid-diverge", "grid-repeat", "grid-reply", "grid-tiling"]});
    // slot-switch leaves slot 1 holding a conversation that interleave's first compared turn must not find
    let glm_cases = json!({"cases": ["diverge-middle", "exact-repeat", "slot-switch", "interleave"]});
    let stress = json!({"pairs": 12, "turns": [2, 5], "user_len": [1, 16], "max_tokens": 4});
    let staleness = json!({"cases": 3, "max_tokens": 6});
    let plan: [(&str, &str, &Value); 5] = [
        ("inkling", "boundary-matrix", &inkling_cases),
        ("glm53", "boundary-matrix", &glm53_cases),
        ("glm", "boundary-matrix", &glm_cases),
        ("kimi", "stress-pairs", &stress),
        ("deepseek", "semantic-staleness", &staleness),
    ];
    let servers: Vec<Served> = plan.iter().map(|(arch, _, _)| Served::start(&tiny(arch))).collect();

    let build = |how: &str| -> Vec<Scenario> {
        plan.iter()
            .zip(&servers)
            .map(|((arch, kind, params), served)| {
                let engine = match how {
                    "in-process" => json!({"arch": arch}),
                    "stdio" => stdio(arch),
                    _ => http(&served.url),
                };
                scenario(&format!("{arch}-{kind}"), engine, kind, (*params).clone())
            })
            .collect()
    };
    let (in_summary, in_trials) = run_in_tmp("in-process", &build("in-process"));
    let (stdio_summary, stdio_trials) = run_in_tmp("stdio", &build("stdio"));
    let (http_summary, http_trials) = run_in_tmp("http", &build("http"));

    for (how, summary, trials) in [("in-process", &in_summary, &in_trials), ("http", &http_summary, &http_trials)] {
        let bad: Vec<_> = trials.iter().filter(|t| t.verdict != Verdict::Pass).collect();
        assert!(summary.pass, "{how}: {bad:#?}");
    }
    assert!(stdio_summary.pass);
    let expected = essentials(&in_trials);
    assert!(expected.len() > 50, "{} trials", expected.len());
    for (how, trials) in [("stdio", &stdio_trials), ("http", &http_trials)] {
        let got = essentials(trials);
        assert_eq!(got.len(), expected.len(), "{how}");
        for (g, e) in got.iter().zip(&expected) {
            assert_eq!(g, e, "{how} differs from in-process");
        }
    }
    // reuse counts travelled, and were not all zero
    assert!(http_trials.iter().filter(|t| t.reused.unwrap_or(0) > 0).count() > 20);
    // what the API cannot carry is skipped with the reason, never passed
    for t in &http_trials {
        for c in [CheckName::State, CheckName::Record, CheckName::Memory] {
            assert_eq!(status(t, c), Some(Status::Skipped), "{} {c}", t.name());
        }
    }
}

#[test]
fn a_server_with_its_prompt_cache_off_fails_reuse_fired() {
    let served = Served::start(&tiny("inkling"));
    let params = json!({"cases": ["extend", "prompt-reply", "diverge-middle", "growing-conversation"]});
    let honest = scenario("cache-on", http(&served.url), "boundary-matrix", params.clone());
    let mut off = http(&served.url);
    off["extra_body"] = json!({"cache_prompt": false});
    let off = scenario("cache-off", off, "boundary-matrix", params);

    let (summary, _) = run_in_tmp("cache-on", &[honest]);
    assert!(summary.pass);
    let (summary, trials) = run_in_tmp("cache-off", &[off]);
    assert!(!summary.pass, "an engine whose reuse never engages must fail");
    let fired_failed = trials.iter().filter(|t| status(t, CheckName::ReuseFired) == Some(Status::Fail)).count();
    assert!(fired_failed >= 20, "{fired_failed} reuse-fired failures");
    for t in &trials {
        assert_eq!(t.reused, Some(0), "{}", t.name());
        // the replies themselves are right: only reuse fails
        assert_eq!(status(t, CheckName::Tokens), Some(Status::Pass), "{}", t.name());
    }
}

#[test]
fn each_plan_starts_from_a_fresh_state() {
    let served = Served::start(&tiny("glm"));
    // slot-switch leaves a conversation on slot 1; interleave's first turn there must reuse nothing
    let params = json!({"cases": ["slot-switch", "interleave"]});
    for (reset, pass) in [("none", false), ("llama.cpp", true), ("vllm", true)] {
        let mut engine = http(&served.url);
        engine["reset"] = json!(reset);
        let (summary, trials) =
            run_in_tmp(reset, &[scenario(&format!("reset-{reset}"), engine, "boundary-matrix", params.clone())]);
        assert_eq!(summary.pass, pass, "reset {reset}: {trials:#?}");
        if !pass {
            let failed: Vec<String> = trials.iter().filter(|t| t.verdict == Verdict::Fail).map(|t| t.name()).collect();
            assert_eq!(failed, ["interleave / B turn 1 on slot 1"], "reset {reset}");
        }
    }
}

#[test]
fn a_fault_served_over_http_is_caught() {
    let mut args = tiny("inkling");
    args.extend(["--fault", "memcmp-short"]);
    let served = Served::start(&args);
    let s = scenario("memcmp-short", http(&served.url), "boundary-matrix", json!({"cases": ["diverge-last"]}));
    let (summary, trials) = run_in_tmp("fault", &[s]);
    assert!(!summary.pass);
    let failed: Vec<&TrialRecord> = trials.iter().filter(|t| t.verdict == Verdict::Fail).collect();
    assert!(!failed.is_empty());
    assert!(failed.iter().all(|t| status(t, CheckName::Reuse) == Some(Status::Fail)), "{failed:#?}");
}

#[test]
fn a_second_server_is_the_cold_instance() {
    let (warm, cold) = (Served::start(&tiny("kimi")), Served::start(&tiny("kimi")));
    let params = json!({"pairs": 8, "turns": [2, 4], "user_len": [1, 12], "max_tokens": 4});
    let engine = json!({"url": warm.url, "cold": {"url": cold.url}, "reset": "vllm"});
    let two = scenario("two-servers", engine.clone(), "stress-pairs", params.clone());
    let one = scenario("one-server", http(&warm.url), "stress-pairs", params);
    let (summary, two_trials) = run_in_tmp("two", &[two]);
    assert!(summary.pass, "{two_trials:#?}");
    assert!(summary.scenarios[0].engine.contains("a second server at"), "{}", summary.scenarios[0].engine);
    let (_, one_trials) = run_in_tmp("one", &[one]);
    let reused = |ts: &[TrialRecord]| ts.iter().map(|t| (t.plan.clone(), t.step.clone(), t.reused)).collect::<Vec<_>>();
    assert_eq!(reused(&two_trials), reused(&one_trials));

    // a cold server with another model is refused at start, naming the field
    let other = Served::start(&["--arch", "kimi", "--preset", "tiny", "--seed", "1"]);
    let engine = json!({"url": warm.url, "cold": {"url": other.url}, "reset": "vllm"});
    let e = start_error(engine);
    assert!(e.to_string().contains("engine.cold.url"), "{e}");
}

#[test]
fn conversations_as_text_reach_the_engines_template() {
    let served = Served::start(&tiny("inkling"));
    let over_http = launcher_for(&scenario("chat", http(&served.url), "stress-pairs", json!({})).engine, None)
        .expect("http launcher");
    let in_process =
        launcher_for(&scenario("chat", json!({"arch": "inkling"}), "stress-pairs", json!({})).engine, None)
            .expect("in-process launcher");
    assert!(over_http.caps().chat && over_http.caps().token_ids && over_http.caps().reuse_count);
    assert!(over_http.caps().gaps && !over_http.caps().dumps && !over_http.caps().cancel_at_poll);
    let req = ChatRequest {
        id: 1,
        slot: 0,
        messages: vec![
            TextMessage { role: "system".into(), content: "be brief".into() },
            TextMessage { role: "user".into(), content: "what is reuse? é".into() },
        ],
        max_tokens: 10,
        ignore_eos: true,
    };
    let a = over_http.launch().expect("warm").generate_chat(&req).expect("http chat");
    let b = in_process.launch().expect("warm").generate_chat(&req).expect("in-process chat");
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(a.prompt_ids, b.prompt_ids);
    assert_eq!(a.pieces, b.pieces);
    assert_eq!((a.reused, a.prompt_tokens, a.stop), (b.reused, b.prompt_tokens, b.stop));
    let (ga, gb) = (a.gaps.expect("gaps"), b.gaps.expect("gaps"));
    assert!(ga.iter().zip(&gb).all(|(x, y)| (x - y).abs() < 1e-4), "{ga:?} vs {gb:?}");
}

#[test]
fn absent_silent_and_late_servers() {
    // nothing listens: a start error naming the URL, after the retries
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let url = format!("http://127.0.0.1:{port}/v1");
    let mut engine = http(&url);
    engine["retries"] = json!(0);
    let e = start_error(engine);
    assert!(matches!(e, DriverError::Start { .. }) && e.to_string().contains(&url), "{e}");

    // a server that accepts and never answers: the timeout
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let mut engine = http(&format!("http://{}/v1", silent.local_addr().expect("addr")));
    engine["timeout_ms"] = json!(300);
    let started = std::time::Instant::now();
    let e = start_error(engine);
    assert!(e.to_string().contains("timed out"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(10));
    drop(silent);

    // a server that comes up while the driver retries
    let late = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        Served::on_port(&tiny("inkling"), port)
    });
    engine = http(&url);
    engine["retries"] = json!(5);
    let launcher = launcher_for(&scenario("late", engine, "stress-pairs", json!({})).engine, None);
    let served = late.join().expect("late server");
    let launcher = launcher.expect("reached after retries");
    assert_eq!(launcher.info().arch, "inkling");
    drop(served);
}
