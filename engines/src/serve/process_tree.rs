//! Killing an engine together with every process it started. An engine command is often a wrapper (a shell script,
//! a Python launcher, `uv run ...`) whose child does the work: killing only the wrapper after a timeout leaves that
//! child running, holding a core and the stderr pipe for the rest of the run.
//!
//! The tree is frozen before it is killed: each process found is sent SIGSTOP, then `/proc` is read again for its
//! children, until no new one appears. A stopped process cannot fork, so a child started between two reads of
//! `/proc` is still found; then every process of the tree gets SIGKILL. On a system without `/proc` only the direct
//! child is killed.

use std::collections::{BTreeSet, HashMap};
use std::process::Child;

/// More processes than an engine's tree has; past it the walk stops (a fork bomb must not hold the harness up).
const MAX_TREE: usize = 4096;

/// Kills `child` and its descendants (see the module doc) and reaps `child`. Processes that escaped the tree
/// (a daemon that re-parented itself) are out of reach.
pub fn kill_tree(child: &mut Child) {
    let root = child.id();
    let descendants = if matches!(child.try_wait(), Ok(None)) { freeze_descendants(root) } else { Vec::new() };
    let _ = child.kill();
    for pid in descendants {
        signal(pid, Signal::Kill);
    }
    let _ = child.wait();
}

/// Stops `root` and, wave after wave, every process whose parent is stopped; returns the descendants (not `root`),
/// all stopped.
fn freeze_descendants(root: u32) -> Vec<u32> {
    let mut stopped = BTreeSet::from([root]);
    signal(root, Signal::Stop);
    let mut wave = vec![root];
    while !wave.is_empty() && stopped.len() < MAX_TREE {
        let children = children_by_parent();
        wave = stopped
            .iter()
            .flat_map(|p| children.get(p).into_iter().flatten())
            .copied()
            .filter(|c| !stopped.contains(c))
            .take(MAX_TREE - stopped.len())
            .collect();
        for &pid in &wave {
            signal(pid, Signal::Stop);
            stopped.insert(pid);
        }
    }
    stopped.remove(&root);
    stopped.into_iter().collect()
}

/// Every process's children, from `/proc/<pid>/stat` (empty where there is no `/proc`). Processes that exit
/// between listing and reading are skipped.
fn children_by_parent() -> HashMap<u32, Vec<u32>> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return children;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if let Some(parent) = std::fs::read_to_string(entry.path().join("stat")).ok().as_deref().and_then(parent_pid) {
            children.entry(parent).or_default().push(pid);
        }
    }
    children
}

/// The fields of a `/proc/<pid>/stat` line after the command name: `pid (comm) state ppid ...`, where `comm` may
/// itself hold spaces and parentheses, so they start after the last `)`.
fn fields_after_comm(stat: &str) -> Option<std::str::SplitWhitespace<'_>> {
    Some(stat[stat.rfind(')')? + 1..].split_whitespace())
}

/// The parent pid in a `/proc/<pid>/stat` line.
fn parent_pid(stat: &str) -> Option<u32> {
    fields_after_comm(stat)?.nth(1)?.parse().ok()
}

#[derive(Debug, Clone, Copy)]
enum Signal {
    Stop,
    Kill,
}

#[cfg(unix)]
fn signal(pid: u32, signal: Signal) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    let number = match signal {
        Signal::Stop => libc::SIGSTOP,
        Signal::Kill => libc::SIGKILL,
    };
    // SAFETY: kill(2) takes plain integers and touches no memory of ours; a pid that has exited meanwhile gives
    // ESRCH, which is ignored (the process is gone, which is what was wanted)
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(pid, number);
    }
}

#[cfg(not(unix))]
fn signal(_pid: u32, _signal: Signal) {}

/// Whether `pid` still runs (a zombie waiting for its new parent to reap it has ended).
#[cfg(all(test, target_os = "linux"))]
fn running(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    fields_after_comm(&stat).and_then(|mut f| f.next()).is_some_and(|state| state != "Z" && state != "X")
}

/// Whether `pid` has ended within a few seconds (SIGKILL is delivered asynchronously): the tests' check that a
/// kill reached a process.
#[cfg(all(test, target_os = "linux"))]
pub(crate) fn ends(pid: u32) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while running(pid) {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    fn scratch(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("kvproof-tree-{name}-{}", std::process::id()))
    }

    /// The pid a script wrote to `path` (it writes it before anything else, so a short wait is enough).
    fn pid_in(path: &Path) -> u32 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(pid) = std::fs::read_to_string(path).ok().and_then(|s| s.trim().parse().ok()) {
                return pid;
            }
            assert!(Instant::now() < deadline, "{} was never written", path.display());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_wrapper_its_child_and_their_grandchild_all_end() {
        let (inner, leaf) = (scratch("inner"), scratch("leaf"));
        let script = format!(
            "sh -c 'sleep 300 & echo $! > {leaf}; wait' & echo $! > {inner}; wait",
            leaf = leaf.display(),
            inner = inner.display()
        );
        let mut child = Command::new("sh").args(["-c", &script]).stdin(Stdio::null()).spawn().expect("sh starts");
        let (inner_pid, leaf_pid) = (pid_in(&inner), pid_in(&leaf));
        assert!(running(inner_pid) && running(leaf_pid));
        kill_tree(&mut child);
        assert!(ends(inner_pid), "the wrapper's child {inner_pid} outlived it");
        assert!(ends(leaf_pid), "the wrapper's grandchild {leaf_pid} outlived it");
        let _ = (std::fs::remove_file(inner), std::fs::remove_file(leaf));
    }

    #[test]
    fn the_parent_is_read_after_the_last_parenthesis() {
        assert_eq!(parent_pid("42 (sh) S 7 42 42 0 -1"), Some(7));
        assert_eq!(parent_pid("42 (a) (b) c) R 9 1 1"), Some(9));
        assert_eq!(parent_pid("42 (sh"), None);
        assert_eq!(parent_pid("42 (sh) S x"), None);
    }
}
