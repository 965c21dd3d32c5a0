//! Agentic sessions in the report, from the `agent` field of results.jsonl alone: the per-task table (turns, tool
//! calls, finished and solved sessions, reuse share, tokens lost to re-rendering), the per-turn assertion rates
//! warm beside cold with their intervals, where warm and cold parted, `agentic.csv` (one row per warm turn) and
//! `agentic-sessions.md` (each session's transcript, the cold trajectory beside the warm one once they part).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use super::ReportError;
use crate::record::{AgentStep, AgentTurn, AgenticStats, AssertionRate, TaskStats, TrialRecord};
use crate::stats;

pub const AGENTIC_CSV: &str = "agentic.csv";
pub const SESSIONS_MD: &str = "agentic-sessions.md";
/// Sessions written out in full; the rest are counted (a nightly of thousands would make an unreadable file).
const MAX_SESSIONS_SHOWN: usize = 200;
/// Characters of a reply or tool result shown in a transcript.
const MAX_TEXT: usize = 600;

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

/// "held/applied = rate [lo, hi]", or "—" when the assertion never applied.
pub fn rate_cell(r: &AssertionRate) -> String {
    match r.bound {
        Some(b) if r.applied > 0 => format!(
            "{}/{} = {} [{}, {}]",
            r.held,
            r.applied,
            pct(r.held as f64 / r.applied as f64),
            stats::percent(b.lower),
            stats::percent(b.upper)
        ),
        _ => "—".into(),
    }
}

fn task_row(md: &mut String, scenario: &str, t: &TaskStats) {
    let _ = writeln!(
        md,
        "| {scenario} | {} | {} | {} | {} / {} | {} / {} | {} / {} | {} / {} | {} | {} | {} | {} ({} turns) |",
        t.task,
        t.sessions,
        t.parted,
        t.warm.turns,
        t.cold.turns,
        t.warm.tool_calls,
        t.cold.tool_calls,
        t.warm.finished,
        t.cold.finished,
        t.warm.solved,
        t.cold.solved,
        pct(t.reuse_share()),
        t.token_exact,
        t.rendered,
        t.lost,
        t.turns_losing
    );
}

/// The agentic section of summary.md.
pub fn markdown(rows: &[(&str, &AgenticStats)], trials: &[TrialRecord]) -> String {
    let mut md = String::new();
    if rows.is_empty() {
        return md;
    }
    md.push_str(
        "\n## Agentic sessions\n\nEvery turn runs warm (the session) and cold (the whole transcript on a fresh \
         instance). The cold trajectory is the session as it goes cold throughout: the same until warm and cold \
         part, then run on its own. *Reuse share*: warm prompt tokens the engine reused. After turn 1: *token-exact* \
         is what the previous turn fed (all reusable had the transcript kept its ids), *rendered* what the \
         re-rendered transcript still shares with it, *lost* the difference (re-tokenization of the reply's text, \
         an unstable template, or turns the client dropped under `keep_turns`).\n\n| scenario | task | sessions | parted | turns warm / cold | tool calls warm / \
         cold | finished warm / cold | solved warm / cold | reuse share | token-exact | rendered | lost |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (name, s) in rows {
        for t in s.tasks.iter().chain(std::iter::once(&s.total)) {
            task_row(&mut md, name, t);
        }
    }
    let conf = rows.first().map_or(0.95, |(_, s)| s.confidence);
    let _ = write!(
        md,
        "\n### Per-turn assertions\n\nHeld / applied, with the two-sided Clopper–Pearson interval at {:.0}% on the \
         rate it holds. A reuse bug shows as warm differing from cold.\n\n| scenario | task | assertion | warm | \
         cold |\n|---|---|---|---|---|\n",
        conf * 100.0
    );
    for (name, s) in rows {
        for t in s.tasks.iter().chain(std::iter::once(&s.total)) {
            for (w, c) in t.warm.assertions.iter().zip(&t.cold.assertions) {
                let _ = writeln!(md, "| {name} | {} | {} | {} | {} |", t.task, w.assertion, rate_cell(w), rate_cell(c));
            }
        }
    }
    let partings: Vec<String> = trials.iter().filter_map(parting).collect();
    if !partings.is_empty() {
        md.push_str("\n### Where warm and cold parted\n\n");
        for p in &partings {
            let _ = writeln!(md, "- {p}");
        }
    }
    md
}

/// "scenario / session parted at turn N: …" for the turn where a session's trajectories parted.
fn parting(t: &TrialRecord) -> Option<String> {
    let a = t.agent.as_deref()?;
    if a.parted_at != Some(a.turn) {
        return None;
    }
    let how = t.divergence.as_ref().map_or_else(|| "the replies differ".to_string(), |d| d.describe());
    Some(format!("{} / {} parted at turn {}: {how}", t.scenario, t.plan, a.turn))
}

#[derive(Serialize)]
struct CsvRow<'a> {
    scenario: &'a str,
    session: &'a str,
    task: &'a str,
    turn: usize,
    verdict: String,
    prompt_tokens: usize,
    reused: Option<usize>,
    expected_reuse: Option<usize>,
    token_exact: Option<usize>,
    rendered: Option<usize>,
    lost: Option<usize>,
    warm_ms: Option<f64>,
    cold_ms: Option<f64>,
    warm_calls: String,
    cold_calls: String,
    warm_failed_assertions: String,
    cold_failed_assertions: String,
    parted_at: Option<usize>,
    ended: &'a str,
}

fn calls(s: Option<&AgentStep>) -> String {
    let Some(s) = s else { return String::new() };
    if s.calls.is_empty() {
        return s.call_error.as_deref().map_or_else(String::new, |_| "(no valid call)".into());
    }
    s.calls.iter().map(|c| format!("{}{}", c.name, if c.ok { "" } else { "!" })).collect::<Vec<_>>().join(" ")
}

fn failed(s: Option<&AgentStep>) -> String {
    s.map(|s| s.assertions.iter().filter(|a| !a.held).map(|a| a.assertion.name()).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn agent_trials(trials: &[TrialRecord]) -> Vec<(&TrialRecord, &AgentTurn)> {
    trials.iter().filter_map(|t| t.agent.as_deref().map(|a| (t, a))).collect()
}

/// Write `agentic.csv` (one row per warm turn); no file when the run has no agentic turns.
pub fn write_csv(dir: &Path, trials: &[TrialRecord]) -> Result<bool, ReportError> {
    let rows: Vec<CsvRow> = agent_trials(trials)
        .into_iter()
        .map(|(t, a)| CsvRow {
            scenario: &t.scenario,
            session: &t.plan,
            task: &a.task,
            turn: a.turn,
            verdict: t.verdict.to_string(),
            prompt_tokens: t.prompt_tokens,
            reused: t.reused,
            expected_reuse: t.expected_reuse,
            token_exact: a.reuse.token_exact,
            rendered: a.reuse.rendered,
            lost: a.reuse.lost,
            warm_ms: t.timings.warm_ms,
            cold_ms: t.timings.cold_ms,
            warm_calls: calls(Some(&a.warm)),
            cold_calls: calls(a.cold.as_ref()),
            warm_failed_assertions: failed(Some(&a.warm)),
            cold_failed_assertions: failed(a.cold.as_ref()),
            parted_at: a.parted_at,
            ended: a.ended.as_deref().unwrap_or(""),
        })
        .collect();
    super::write_csv_rows(dir, AGENTIC_CSV, rows)
}

/// `text` cut to `MAX_TEXT` characters, on one quoted block.
fn quote(text: &str) -> String {
    let cut: String = text.chars().take(MAX_TEXT).collect();
    let more = if cut.len() < text.len() { " …" } else { "" };
    // code spans keep a reply's markup from rendering; backticks inside are replaced so the span stays one span
    format!("`{}{more}`", cut.replace('`', "'").replace('\n', "⏎"))
}

fn write_step(md: &mut String, who: &str, s: &AgentStep) {
    let _ = writeln!(md, "- **{who}** replied {}", quote(&s.reply));
    for c in &s.calls {
        let _ = writeln!(md, "  - call `{}` {} → {}", c.name, quote(&c.arguments), quote(&c.result));
    }
    if let Some(e) = &s.call_error {
        let _ = writeln!(md, "  - no valid call: {}", quote(e));
    }
    if let Some(a) = &s.answer {
        let solved = match s.solved {
            Some(true) => " (solved)",
            Some(false) => " (wrong answer)",
            None => "",
        };
        let _ = writeln!(md, "  - finished with {}{solved}", quote(a));
    }
    let broken: Vec<String> =
        s.assertions.iter().filter(|a| !a.held).map(|a| format!("{} ({})", a.assertion, a.detail)).collect();
    if !broken.is_empty() {
        let _ = writeln!(md, "  - assertions broken: {}", broken.join("; "));
    }
}

/// Render the transcripts of every agentic session (the first `MAX_SESSIONS_SHOWN`).
pub fn sessions_markdown(trials: &[TrialRecord]) -> String {
    let mut sessions: BTreeMap<(&str, usize), Vec<(&TrialRecord, &AgentTurn)>> = BTreeMap::new();
    for (t, a) in agent_trials(trials) {
        sessions.entry((t.scenario.as_str(), t.plan_index)).or_default().push((t, a));
    }
    let mut md = String::from(
        "# Agentic sessions\n\nEach turn: the warm reply (the session follows it), the tool calls parsed from it and \
         the sandbox's results, after a table of the session's turns (*lost*: tokens lost to re-rendering the \
         transcript). Once warm and cold part, the cold trajectory's turn is shown beside it.\n",
    );
    let total = sessions.len();
    for (_, mut turns) in sessions.into_iter().take(MAX_SESSIONS_SHOWN) {
        turns.sort_by_key(|(_, a)| a.turn);
        let Some((first, a0)) = turns.first() else { continue };
        let _ = writeln!(md, "\n## {} / {} (task {})\n", first.scenario, first.plan, a0.task);
        md.push_str(
            "| turn | verdict | prompt | reused | token-exact | lost | warm ms | cold ms | warm calls | cold calls | \
             broken (warm) |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        let cell = |v: Option<usize>| v.map_or_else(|| "—".to_string(), |v| v.to_string());
        let ms = |m: Option<f64>| m.map_or_else(|| "—".to_string(), |m| format!("{m:.0}"));
        for (t, a) in &turns {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                a.turn,
                t.verdict,
                t.prompt_tokens,
                cell(t.reused),
                cell(a.reuse.token_exact),
                cell(a.reuse.lost),
                ms(t.timings.warm_ms),
                ms(t.timings.cold_ms),
                calls(Some(&a.warm)),
                calls(a.cold.as_ref()),
                failed(Some(&a.warm))
            );
        }
        md.push('\n');
        for (t, a) in &turns {
            let reuse = match (a.reuse.token_exact, a.reuse.lost) {
                (Some(e), Some(l)) => format!(", token-exact {e}, lost to re-rendering {l}"),
                _ => String::new(),
            };
            let _ = writeln!(
                md,
                "**turn {}** — {}: prompt {} tokens, reused {}{reuse}; warm {} ms, cold {} ms",
                a.turn,
                t.verdict,
                t.prompt_tokens,
                cell(t.reused),
                ms(t.timings.warm_ms),
                ms(t.timings.cold_ms)
            );
            write_step(&mut md, "warm", &a.warm);
            if a.parted_at.is_some() {
                if let Some(c) = &a.cold {
                    write_step(&mut md, "cold trajectory", c);
                }
            }
            if a.parted_at == Some(a.turn) {
                let _ = writeln!(md, "- warm and cold parted here: {}", parting(t).unwrap_or_default());
            }
            if let Some(e) = &a.ended {
                let _ = writeln!(md, "- session ended: {e}");
            }
            for (k, c) in a.cold_tail.iter().enumerate() {
                let _ = writeln!(md, "\n**cold trajectory, turn {}**", a.turn + k + 1);
                write_step(&mut md, "cold trajectory", c);
            }
            md.push('\n');
        }
    }
    if total > MAX_SESSIONS_SHOWN {
        let _ = writeln!(md, "\n({} more sessions in results.jsonl)", total - MAX_SESSIONS_SHOWN);
    }
    md
}

/// Write `agentic-sessions.md`; no file when the run has no agentic turns.
pub fn write_sessions(dir: &Path, trials: &[TrialRecord]) -> Result<bool, ReportError> {
    let path = dir.join(SESSIONS_MD);
    if !trials.iter().any(|t| t.agent.is_some()) {
        let _ = std::fs::remove_file(&path);
        return Ok(false);
    }
    super::safe_file::replace(&path, sessions_markdown(trials).as_bytes())?;
    Ok(true)
}

/// One turn index's samples over sessions: context, warm ms, cold ms.
type TurnSamples = (Vec<f64>, Vec<f64>, Vec<f64>);

/// Per turn index: the mean context and the median warm and cold wall times over the sessions that reached it.
pub fn wall_by_turn(trials: &[&TrialRecord]) -> Vec<(usize, f64, f64, f64)> {
    let mut by: BTreeMap<usize, TurnSamples> = BTreeMap::new();
    for t in trials {
        let (Some(a), Some(w), Some(c)) = (t.agent.as_deref(), t.timings.warm_ms, t.timings.cold_ms) else {
            continue;
        };
        let e = by.entry(a.turn).or_default();
        e.0.push(t.prompt_tokens as f64);
        e.1.push(w);
        e.2.push(c);
    }
    by.into_iter()
        .map(|(turn, (ctx, w, c))| {
            let mean = ctx.iter().sum::<f64>() / ctx.len() as f64;
            (turn, mean, crate::record::median(&w), crate::record::median(&c))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{AssertionResult, ToolCall};
    use crate::scenario::Kind;

    fn trial(turn: usize, parted: bool) -> TrialRecord {
        let mut t = TrialRecord::new("s", Kind::Agentic, "fix-0000", 0, &format!("turn {turn}"), turn - 1);
        t.prompt_tokens = 100 * turn;
        t.timings.warm_ms = Some(10.0);
        t.timings.cold_ms = Some(10.0 * turn as f64);
        let mut warm = AgentStep::failed("x");
        warm.call_error = None;
        warm.reply = "<tool_call>{\"name\": \"read_file\"}</tool_call>".into();
        warm.calls = vec![ToolCall {
            name: "read_file".into(),
            arguments: "{\"path\":\"a\"}".into(),
            ok: false,
            result: "error: no such file: a".into(),
        }];
        warm.assertions = vec![AssertionResult {
            assertion: crate::record::Assertion::ReadBeforeWrite,
            held: false,
            detail: "wrote a before reading it".into(),
        }];
        let mut cold = warm.clone();
        cold.reply = "something else".into();
        let parted_at = parted.then_some(turn);
        t.agent = Some(Box::new(AgentTurn { cold: Some(cold), parted_at, ..AgentTurn::new("fix", 0, turn, warm) }));
        t
    }

    #[test]
    fn the_transcript_shows_calls_broken_assertions_and_the_parting() {
        let trials = [trial(1, false), trial(2, true)];
        let md = sessions_markdown(&trials);
        assert!(md.contains("## s / fix-0000 (task fix)"), "{md}");
        assert!(md.contains("call `read_file`"), "{md}");
        assert!(md.contains("read-before-write (wrote a before reading it)"), "{md}");
        assert!(md.contains("cold trajectory** replied `something else`"), "{md}");
        assert!(md.contains("parted at turn 2"), "{md}");
        assert_eq!(md.matches("cold trajectory** replied").count(), 1, "cold shown only once parted");
    }

    #[test]
    fn wall_times_are_grouped_by_turn() {
        let trials = [trial(1, false), trial(2, false)];
        let refs: Vec<&TrialRecord> = trials.iter().collect();
        assert_eq!(wall_by_turn(&refs), vec![(1, 100.0, 10.0, 10.0), (2, 200.0, 10.0, 20.0)]);
    }
}
