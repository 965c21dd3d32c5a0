//! Transparent huge pages for the engines' heap: on Linux with glibc, where the kernel gives them only to memory
//! that asks (`/sys/kernel/mm/transparent_hugepage/enabled` is `madvise`, the common default), the process runs
//! itself again once with glibc's `glibc.malloc.hugetlb=1` tunable, so malloc asks for them on every arena it
//! grows. glibc reads its tunables before `main`, so setting one means starting again; `exec` keeps the pid, the
//! open files and the arguments.
//!
//! Why: a decode step reads every weight and every cached k/v row once, each layer's in its own allocation of a
//! few hundred KiB to a few MiB. In 4 KiB pages that is a page walk every 4 KiB, and on a virtual machine a walk
//! through two page tables. Measured on the 2-core AVX2 EPYC VM, the GGUF engine's decode (SmolLM2, four to five
//! alternating runs each): at 1024 cached positions 94-105 tok/s without, 103-118 with; at 128 a median of 123
//! against 132; at 256 inside the noise (95-135 against 102-119). Huge pages for the weights alone (each matrix
//! its own 2 MiB-aligned mapping) gave ~3%, within the noise: the caches and the rest of the heap are where the
//! walks were.
//!
//! The tunable is for this process only: once glibc has read it, `GLIBC_TUNABLES` is put back as it was, so an
//! engine kvproof starts (another team's, whose memory is theirs to arrange) gets the environment the user gave.
//!
//! `KVPROOF_NO_HUGE_PAGES=1` turns it off (to compare, or where a second `exec` is unwelcome).

// elsewhere the re-run compiles to nothing, and only the tests use the rules it would have followed
#![cfg_attr(not(all(target_os = "linux", target_env = "gnu")), allow(dead_code))]

/// The tunable that makes glibc's malloc advise huge pages on the memory it maps.
const TUNABLE: &str = "glibc.malloc.hugetlb=1";

/// The environment variable that turns the re-run off.
const OPT_OUT: &str = "KVPROOF_NO_HUGE_PAGES";

/// Set across the `exec`: `GLIBC_TUNABLES` as the user gave it (empty: unset), to put back afterwards.
const BEFORE: &str = "KVPROOF_GLIBC_TUNABLES_BEFORE";

/// Set in the process run again with `TUNABLE`: its heap asks for huge pages, and so do the mappings it makes
/// itself (`cache::Floats`).
static IN_USE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this process runs with `TUNABLE` (set by `rerun_with_huge_pages`).
pub fn in_use() -> bool {
    IN_USE.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether a process with these settings should run itself again with `TUNABLE`: Linux's transparent huge pages
/// only where memory asks (`thp_mode` is the content of `/sys/kernel/mm/transparent_hugepage/enabled`, the mode in
/// brackets), glibc's tunables not already asking (`tunables`: `GLIBC_TUNABLES`), and no opt-out.
fn worth_rerun(thp_mode: Option<&str>, tunables: Option<&str>, opt_out: Option<&str>) -> bool {
    let asked = |t: &str| t.split(':').any(|kv| kv.trim().starts_with("glibc.malloc.hugetlb="));
    let madvise_only = thp_mode.is_some_and(|m| m.contains("[madvise]"));
    let opted_out = opt_out.is_some_and(|v| !v.is_empty() && v != "0");
    madvise_only && !tunables.is_some_and(asked) && !opted_out
}

/// `GLIBC_TUNABLES` with `TUNABLE` added to what was there.
fn with_tunable(tunables: Option<&str>) -> String {
    match tunables {
        Some(t) if !t.is_empty() => format!("{t}:{TUNABLE}"),
        _ => TUNABLE.to_string(),
    }
}

/// Runs this process again with `TUNABLE` when `worth_rerun` says so (and returns only if it does not, or the
/// `exec` fails: the process then goes on in 4 KiB pages, as before); in the process run again, puts
/// `GLIBC_TUNABLES` back as it was. Call it first thing in `main`, before any thread starts.
pub fn rerun_with_huge_pages() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::os::unix::process::CommandExt;
        if let Some(before) = std::env::var_os(BEFORE) {
            // the run again: glibc has read the tunable; children get the user's environment
            match before.is_empty() {
                true => std::env::remove_var("GLIBC_TUNABLES"),
                false => std::env::set_var("GLIBC_TUNABLES", before),
            }
            std::env::remove_var(BEFORE);
            IN_USE.store(true, std::sync::atomic::Ordering::Relaxed);
            return;
        }
        let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok();
        let tunables = std::env::var("GLIBC_TUNABLES").ok();
        let opt_out = std::env::var(OPT_OUT).ok();
        if !worth_rerun(mode.as_deref(), tunables.as_deref(), opt_out.as_deref()) {
            return;
        }
        let Ok(exe) = std::env::current_exe() else { return };
        let mut args = std::env::args_os();
        let arg0 = args.next().unwrap_or_else(|| exe.clone().into_os_string());
        // returns only on failure
        let _ = std::process::Command::new(&exe)
            .arg0(arg0)
            .args(args)
            .env("GLIBC_TUNABLES", with_tunable(tunables.as_deref()))
            .env(BEFORE, tunables.as_deref().unwrap_or(""))
            .exec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reruns_only_where_memory_must_ask_and_nobody_has() {
        let madvise = Some("always [madvise] never\n");
        assert!(worth_rerun(madvise, None, None));
        assert!(worth_rerun(madvise, Some("glibc.malloc.arena_max=2"), Some("0")));
        // already asked (by us, or by the user either way), opted out, or nothing to gain
        assert!(!worth_rerun(madvise, Some("glibc.malloc.hugetlb=1"), None));
        assert!(!worth_rerun(madvise, Some("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0"), None));
        assert!(!worth_rerun(madvise, None, Some("1")));
        assert!(!worth_rerun(Some("[always] madvise never"), None, None));
        assert!(!worth_rerun(Some("always madvise [never]"), None, None));
        assert!(!worth_rerun(None, None, None));
    }

    #[test]
    fn the_tunable_is_added_to_what_was_there() {
        assert_eq!(with_tunable(None), TUNABLE);
        assert_eq!(with_tunable(Some("")), TUNABLE);
        assert_eq!(with_tunable(Some("glibc.malloc.arena_max=2")), format!("glibc.malloc.arena_max=2:{TUNABLE}"));
    }
}
