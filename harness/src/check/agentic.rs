//! Agentic sessions summed up from their records: per task, the warm and cold trajectories' turns, tool calls,
//! finished and solved sessions, each per-turn assertion's rate with its two-sided Clopper–Pearson interval, and
//! the reuse accounting (engine, token-exact, re-rendered, lost).

use strum::IntoEnumIterator;

use crate::record::{
    AgentStep, AgentTurn, AgenticStats, Assertion, AssertionRate, TaskStats, TrajectoryStats, TrialRecord,
};
use crate::stats;

/// Count one trajectory turn.
fn add_step(t: &mut TrajectoryStats, s: &AgentStep, counts: &mut [(usize, usize)]) {
    t.turns += 1;
    t.tool_calls += s.calls.len();
    t.finished += usize::from(s.answer.is_some());
    t.solved += usize::from(s.solved == Some(true));
    for a in &s.assertions {
        let c = &mut counts[a.assertion as usize];
        c.0 += 1;
        c.1 += usize::from(a.held);
    }
}

fn rates(counts: &[(usize, usize)], confidence: f64) -> Vec<AssertionRate> {
    Assertion::iter()
        .map(|assertion| {
            let (applied, held) = counts[assertion as usize];
            let bound = (applied > 0).then(|| stats::two_sided(held as u64, applied as u64, confidence).ok()).flatten();
            AssertionRate { assertion, applied, held, bound }
        })
        .collect()
}

/// Per-task accumulator: the stats and the assertion counts of each trajectory.
struct Tally {
    stats: TaskStats,
    warm: Vec<(usize, usize)>,
    cold: Vec<(usize, usize)>,
}

impl Tally {
    fn new(task: &str) -> Self {
        let n = Assertion::iter().count();
        Tally {
            stats: TaskStats { task: task.to_string(), ..TaskStats::default() },
            warm: vec![(0, 0); n],
            cold: vec![(0, 0); n],
        }
    }

    fn add(&mut self, t: &TrialRecord, a: &AgentTurn) {
        let s = &mut self.stats;
        if a.turn == 1 {
            s.sessions += 1;
        }
        if a.parted_at == Some(a.turn) {
            s.parted += 1;
        }
        s.prompt_tokens += t.prompt_tokens;
        s.reused += a.reuse.engine.unwrap_or(0);
        s.token_exact += a.reuse.token_exact.unwrap_or(0);
        s.rendered += a.reuse.rendered.unwrap_or(0);
        s.lost += a.reuse.lost.unwrap_or(0);
        s.turns_losing += usize::from(a.reuse.lost.is_some_and(|l| l > 0));
        add_step(&mut s.warm, &a.warm, &mut self.warm);
        for c in a.cold.iter().chain(&a.cold_tail) {
            add_step(&mut s.cold, c, &mut self.cold);
        }
    }

    fn finish(mut self, confidence: f64) -> TaskStats {
        self.stats.warm.assertions = rates(&self.warm, confidence);
        self.stats.cold.assertions = rates(&self.cold, confidence);
        self.stats
    }
}

/// The agentic stats of one scenario's trials (in task order of first appearance).
pub fn stats(trials: &[&TrialRecord], confidence: f64) -> AgenticStats {
    let mut per: Vec<Tally> = Vec::new();
    let mut total = Tally::new("all");
    for t in trials {
        let Some(a) = t.agent.as_deref() else { continue };
        total.add(t, a);
        match per.iter_mut().find(|p| p.stats.task == a.task) {
            Some(p) => p.add(t, a),
            None => {
                let mut p = Tally::new(&a.task);
                p.add(t, a);
                per.push(p);
            }
        }
    }
    AgenticStats {
        confidence,
        tasks: per.into_iter().map(|p| p.finish(confidence)).collect(),
        total: total.finish(confidence),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{AssertionResult, RerenderReuse};
    use crate::scenario::Kind;

    fn step(held: &[(Assertion, bool)]) -> AgentStep {
        let mut s = AgentStep::failed("x");
        s.assertions =
            held.iter().map(|&(assertion, held)| AssertionResult { assertion, held, detail: String::new() }).collect();
        s
    }

    fn trial(turn: usize, warm: AgentStep, cold: AgentStep, parted_at: Option<usize>) -> TrialRecord {
        let mut t = TrialRecord::new("s", Kind::Agentic, "fix-0000", 0, &format!("turn {turn}"), turn - 1);
        t.prompt_tokens = 100;
        let reuse = RerenderReuse { engine: Some(60), token_exact: Some(80), rendered: Some(70), lost: Some(10) };
        t.agent =
            Some(Box::new(AgentTurn { cold: Some(cold), parted_at, reuse, ..AgentTurn::new("fix", 0, turn, warm) }));
        t
    }

    #[test]
    fn warm_and_cold_rates_are_counted_apart() {
        let ok = step(&[(Assertion::SchemaValidCall, true)]);
        let bad = step(&[(Assertion::SchemaValidCall, false)]);
        let trials = [trial(1, ok.clone(), ok.clone(), None), trial(2, bad.clone(), ok.clone(), Some(2))];
        let refs: Vec<&TrialRecord> = trials.iter().collect();
        let s = stats(&refs, 0.95);
        assert_eq!(s.tasks.len(), 1);
        let t = &s.total;
        assert_eq!((t.sessions, t.parted, t.warm.turns, t.cold.turns), (1, 1, 2, 2));
        let rate =
            |tr: &TrajectoryStats| tr.assertions.iter().find(|r| r.assertion == Assertion::SchemaValidCall).cloned();
        let (w, c) = (rate(&t.warm).expect("warm"), rate(&t.cold).expect("cold"));
        assert_eq!((w.applied, w.held, c.applied, c.held), (2, 1, 2, 2));
        assert!(w.bound.expect("bound").lower < 0.5 && c.bound.expect("bound").upper == 1.0);
        assert_eq!((t.prompt_tokens, t.reused, t.lost, t.turns_losing), (200, 120, 20, 2));
        assert!((t.reuse_share() - 0.6).abs() < 1e-9);
        let never = t.warm.assertions.iter().find(|r| r.assertion == Assertion::ReadBeforeWrite).expect("listed");
        assert_eq!((never.applied, never.bound), (0, None));
    }
}
