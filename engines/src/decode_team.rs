//! A decode step's parallel kernels handed to the pool's other threads for a few cache-line transfers each.
//!
//! A decode step is a few hundred small parallel kernels (SmolLM2: four matvecs and an attention a layer over 30
//! layers), each some microseconds of work. Through rayon's work stealing a kernel costs about 3 µs of hand-off
//! where the two cores share a last-level cache, 5.5 µs where they sit on two dies, which a VM's vCPUs do from
//! one moment to the next (docs/engines.md, *Decode steps*).
//!
//! [`run`] holds the pool's other threads for the length of one decode step. A kernel inside the step publishes its
//! tasks with one atomic store, in one share (a contiguous range of tasks) a thread of the pool. The lead runs the
//! first share; each held thread claims one with a compare-and-swap on the same word; the lead runs any share left
//! unclaimed once its own is done, then waits for the claimed ones. A held thread busy elsewhere claims nothing,
//! so nobody ever waits on a thread that may be waiting on them. Which thread runs a task never changes what the
//! task computes, so every output keeps its bits.
//!
//! `KVPROOF_DECODE_TEAM=off` leaves decode steps to rayon alone, to compare the two.
//!
//! Outside [`run`] (a prefill, the kernel benchmarks, tests) [`map`] and [`for_each_mut`] are rayon's parallel
//! iterators. A rayon job started inside a step (a kernel not written for the team) is still taken by the held
//! threads, which look for rayon work now and then while they wait.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use rayon::prelude::*;

/// Spins of a waiting thread before it lets the OS run something else: with several engines on few cores (`kvproof
/// run --jobs`), a thread spinning on a core another process needs would hold up the very thread it waits for.
const SPINS_BEFORE_YIELD: u32 = 1 << 14;
/// Spins of a held thread between two looks for rayon work (a kernel not written for the team, the experts of a
/// mixture): each look reads the other threads' queues, lines the lead then has to fetch back, and each spin it
/// does not look delays such a job.
const SPINS_PER_RAYON_LOOK: u32 = 16;

type Task<'a> = dyn Fn(usize) + Sync + 'a;

/// Bits of the job word's two counts: shares of the job, and the next share not yet claimed.
const SHARE_BITS: u32 = 16;
const SHARE_MASK: u64 = (1 << SHARE_BITS) - 1;

/// The state the calling thread and the held threads share for one decode step.
struct Team {
    /// The current job: its number (high 32 bits), its count of shares and the next share not yet claimed (16 bits
    /// each). One word, so a claim is one compare-and-swap that can only take a share of the job it saw.
    job: AtomicU64,
    /// The current job's task function (a `&Task` on the lead's stack, alive until every claimed share has
    /// finished).
    task: AtomicPtr<&'static Task<'static>>,
    /// The current job's task count.
    tasks: AtomicUsize,
    /// Shares of the current job the held threads have finished.
    finished: AtomicUsize,
    /// A task panicked on a held thread: the lead panics once the job is over.
    poisoned: AtomicBool,
    /// Threads stop holding at the end of the step.
    stop: AtomicBool,
}

thread_local! {
    /// The team this thread leads, while it runs a step under [`run`].
    static LEADING: Cell<*const Team> = const { Cell::new(std::ptr::null()) };
}

/// Whether decode steps hold a team: yes unless `KVPROOF_DECODE_TEAM=off` (read once), which leaves them to rayon's
/// work stealing alone, for comparing the two.
fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("KVPROOF_DECODE_TEAM").map_or(true, |v| v != "off"))
}

/// Runs `f` (one decode step) on a worker of rayon's pool, the pool's other threads held for the step's kernels.
pub fn run<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    crate::engine_loop::on_worker(|| {
        let helpers = rayon::current_num_threads().saturating_sub(1);
        if helpers == 0 || !LEADING.get().is_null() || !enabled() {
            return f();
        }
        let team = Team {
            job: AtomicU64::new(0),
            task: AtomicPtr::new(std::ptr::null_mut()),
            tasks: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            poisoned: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        };
        rayon::scope(|s| {
            for _ in 0..helpers {
                s.spawn(|_| team.hold());
            }
            // the lead stops leading and releases the held threads even if `f` panics
            struct Release<'a>(&'a Team);
            impl Drop for Release<'_> {
                fn drop(&mut self) {
                    LEADING.set(std::ptr::null());
                    self.0.stop.store(true, Ordering::Release);
                }
            }
            LEADING.set(&team);
            let _release = Release(&team);
            f()
        })
    })
}

/// Whether this thread leads a team now (inside [`run`], outside a team task): a caller with work of uneven
/// tasks can pick the team's even shares or rayon's stealing.
pub fn leading() -> bool {
    !LEADING.get().is_null()
}

/// `f` on every item, in parallel: by the team where this thread leads one, else by rayon.
pub fn for_each_mut<T: Send>(items: &mut [T], f: impl Fn(&mut T) + Sync + Send) {
    let team = LEADING.get();
    if team.is_null() || items.len() < 2 {
        items.par_iter_mut().for_each(f);
        return;
    }
    let base = SendPtr(items.as_mut_ptr());
    let task = |i: usize| {
        let base = &base;
        // SAFETY: `i < items.len()` and the team runs each index of one job once (the shares are disjoint ranges),
        // so this is the only reference to item `i` while the job runs; `items` is borrowed mutably throughout
        #[allow(unsafe_code)]
        f(unsafe { &mut *base.0.add(i) })
    };
    // SAFETY: `team` is the team this thread leads, alive until `run` returns, which is after this call
    #[allow(unsafe_code)]
    unsafe { &*team }.lead(items.len(), &task);
}

/// `f` of every item, in order, computed in parallel: by the team where this thread leads one, else by rayon.
pub fn map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync + Send) -> Vec<R> {
    if LEADING.get().is_null() {
        return items.par_iter().map(f).collect();
    }
    let mut slots: Vec<(&T, Option<R>)> = items.iter().map(|t| (t, None)).collect();
    for_each_mut(&mut slots, |(t, out)| *out = Some(f(t)));
    slots.into_iter().map(|(_, out)| out.expect("the team runs every task")).collect()
}

/// A raw pointer parallel tasks share, each touching only its own elements (here an item of `for_each_mut`'s; in
/// `kernels::matmul_panels` a block of the output).
pub(crate) struct SendPtr<T>(pub(crate) *mut T);
// SAFETY: every user dereferences the pointer only at elements no other task touches while the tasks run (see
// `for_each_mut` and `matmul_panels`)
#[allow(unsafe_code)]
unsafe impl<T: Send> Sync for SendPtr<T> {}

/// Share `k` of `shares` of `tasks` tasks: contiguous, sizes differing by at most one.
fn share(tasks: usize, shares: usize, k: usize) -> std::ops::Range<usize> {
    (tasks * k / shares)..(tasks * (k + 1) / shares)
}

impl Team {
    /// Publishes `tasks` tasks of `task` in one share a thread of the pool, runs the first share and any share no
    /// held thread has claimed once it is done, and returns once every share has finished. A held thread busy
    /// elsewhere (in a rayon job it took while waiting, which may itself wait on this thread) claims nothing, so
    /// the lead never waits on it.
    fn lead(&self, tasks: usize, task: &Task<'_>) {
        let shares = rayon::current_num_threads().min(tasks).min(SHARE_MASK as usize);
        let job = (self.job.load(Ordering::Relaxed) >> 32) + 1;
        // SAFETY: a held thread calls this only after claiming a share of job `job`, and this function returns
        // (ending `task`'s borrow) only after every claimed share has finished
        #[allow(unsafe_code)]
        let erased: &'static Task<'static> = unsafe { std::mem::transmute::<&Task<'_>, &'static Task<'static>>(task) };
        self.task.store(&erased as *const _ as *mut _, Ordering::Relaxed);
        self.tasks.store(tasks, Ordering::Relaxed);
        self.finished.store(0, Ordering::Relaxed);
        // Release: the task, its count and the zeroed count of finished shares are visible to whoever sees the job;
        // share 0 is the lead's
        self.job.store((job << 32) | ((shares as u64) << SHARE_BITS) | 1, Ordering::Release);
        // the lead's shares may panic; the held threads may still be running tasks that borrow `task`, so it waits
        // for them before the panic goes on
        let mut mine = 1;
        // a kernel inside a task must not publish a job of its own over this one: while the lead runs tasks it
        // leads nothing, and such a kernel goes to rayon
        let leading = LEADING.replace(std::ptr::null());
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            share(tasks, shares, 0).for_each(task);
            while let Some(k) = self.claim(job) {
                mine += 1;
                share(tasks, shares, k).for_each(task);
            }
        }));
        LEADING.set(leading);
        if ran.is_err() {
            // the shares not yet claimed are nobody's: take them all so no held thread starts one
            while self.claim(job).is_some() {
                mine += 1;
            }
        }
        let mut spins = 0u32;
        while self.finished.load(Ordering::Acquire) < shares - mine {
            pause(&mut spins);
        }
        if let Err(panic) = ran {
            std::panic::resume_unwind(panic);
        }
        if self.poisoned.load(Ordering::Acquire) {
            panic!("a decode step's kernel panicked on another thread of the pool");
        }
    }

    /// The next unclaimed share of job `job`, claimed; `None` once every share is claimed or the job is over.
    fn claim(&self, job: u64) -> Option<usize> {
        let mut word = self.job.load(Ordering::Acquire);
        loop {
            let (next, shares) = ((word & SHARE_MASK) as usize, ((word >> SHARE_BITS) & SHARE_MASK) as usize);
            if word >> 32 != job || next >= shares {
                return None;
            }
            match self.job.compare_exchange_weak(word, word + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(next),
                Err(now) => word = now,
            }
        }
    }

    /// A held thread's loop: a share of any job with one unclaimed, rayon work now and then, until the step ends.
    fn hold(&self) {
        let (mut spins, mut looks) = (0u32, 0u32);
        while !self.stop.load(Ordering::Acquire) {
            let word = self.job.load(Ordering::Acquire);
            let job = word >> 32;
            if let Some(k) = (job > 0).then(|| self.claim(job)).flatten() {
                spins = 0;
                let shares = ((word >> SHARE_BITS) & SHARE_MASK) as usize;
                // SAFETY: a share of job `job` is claimed and unfinished, so the lead is inside `lead` for it and
                // the pointer it stored before publishing (seen through the claim's Acquire) is live
                #[allow(unsafe_code)]
                let task = unsafe { *self.task.load(Ordering::Relaxed) };
                let tasks = self.tasks.load(Ordering::Relaxed);
                let ran =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| share(tasks, shares, k).for_each(task)));
                if ran.is_err() {
                    self.poisoned.store(true, Ordering::Release);
                }
                self.finished.fetch_add(1, Ordering::AcqRel);
                continue;
            }
            looks = looks.wrapping_add(1);
            if looks % SPINS_PER_RAYON_LOOK == 0 {
                if let Some(rayon::Yield::Executed) = rayon::yield_now() {
                    spins = 0;
                    continue;
                }
            }
            pause(&mut spins);
        }
    }
}

/// One wait of a spinning thread: a spin-loop hint, and after [`SPINS_BEFORE_YIELD`] of them an OS yield.
fn pause(spins: &mut u32) {
    if *spins < SPINS_BEFORE_YIELD {
        *spins += 1;
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_is_visited_once_inside_a_step_and_outside() {
        for n in [0, 1, 2, 3, 17, 1000] {
            let outside: Vec<usize> = map(&(0..n).collect::<Vec<_>>(), |i| i * 3);
            let inside = run(|| {
                let mut v: Vec<(usize, u32)> = (0..n).map(|i| (i, 0)).collect();
                for _ in 0..50 {
                    for_each_mut(&mut v, |(_, hits)| *hits += 1);
                }
                assert!(v.iter().all(|&(_, hits)| hits == 50), "a task ran twice or never");
                map(&(0..n).collect::<Vec<_>>(), |i| i * 3)
            });
            assert_eq!(inside, outside);
            assert_eq!(inside, (0..n).map(|i| i * 3).collect::<Vec<_>>());
        }
    }

    #[test]
    fn the_shares_cover_the_tasks_once() {
        for tasks in 0..40 {
            for shares in 1..6 {
                let all: Vec<usize> = (0..shares).flat_map(|k| share(tasks, shares, k)).collect();
                assert_eq!(all, (0..tasks).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn rayon_work_inside_a_step_finishes() {
        let count = |k: usize| k * 37 % 101;
        let sums =
            run(|| (0..200).map(|k| (0..count(k)).into_par_iter().map(|i| i as u64).sum()).collect::<Vec<u64>>());
        for (k, s) in sums.into_iter().enumerate() {
            let n = count(k) as u64;
            assert_eq!(s, n * n.saturating_sub(1) / 2);
        }
    }

    #[test]
    fn team_kernels_inside_rayon_jobs_inside_a_step_finish() {
        // team kernels inside rayon jobs (which either thread may run) and rayon work inside those, mixed
        let totals = run(|| {
            (0..64)
                .into_par_iter()
                .map(|k| {
                    let mut v: Vec<u64> = (0..(k % 7 + 2)).collect();
                    for_each_mut(&mut v, |x| *x *= 2);
                    let inner: u64 = (0..k).into_par_iter().sum();
                    v.iter().sum::<u64>() + inner
                })
                .collect::<Vec<u64>>()
        });
        for (k, t) in totals.into_iter().enumerate() {
            let n = (k % 7 + 2) as u64;
            assert_eq!(t, n * (n - 1) + (k as u64) * (k as u64).saturating_sub(1) / 2);
        }
    }

    #[test]
    fn a_team_kernel_while_the_held_thread_waits_on_the_lead_finishes() {
        // the lead starts a rayon join; the held thread takes its second half and inside it starts a join of its
        // own and sleeps in the first half; the lead, waiting, takes that join's second half and in it starts a
        // team kernel. The held thread will next wait on the lead: a lead that waited for it to claim a share would
        // never return.
        let pause = || std::thread::sleep(std::time::Duration::from_millis(30));
        for _ in 0..3 {
            let sum = run(|| {
                let (a, b) = rayon::join(
                    || {
                        pause();
                        1u64
                    },
                    || {
                        let (c, d) = rayon::join(
                            || {
                                pause();
                                pause();
                                10u64
                            },
                            || {
                                let mut v: Vec<u64> = (0..16).collect();
                                for_each_mut(&mut v, |x| *x += 1);
                                v.iter().sum::<u64>()
                            },
                        );
                        c + d
                    },
                );
                a + b
            });
            assert_eq!(sum, 1 + 10 + 136);
        }
    }

    /// Held by each test that needs a held thread to join its step, for the whole step. Two such steps at once
    /// deadlock for the length of the wait below: the second `run` can start on the first's held thread (which
    /// takes rayon work while it waits), and then each lead waits for a helper that is the other lead.
    fn one_joining_step_at_a_time() -> std::sync::MutexGuard<'static, ()> {
        static JOINING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        JOINING.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Inside `run`: jobs until a held thread has claimed a share, so the next jobs are shared (false on one core,
    /// or when none has joined in 30 s). The other threads of the pool may be busy with other tests' rayon work for
    /// a while before one takes up the held thread's job: a fixed count of 200 µs tries was sometimes too short.
    fn a_helper_has_joined() -> bool {
        let lead = std::thread::current().id();
        let start = std::time::Instant::now();
        std::iter::repeat(()).take_while(|_| start.elapsed().as_secs() < 30).any(|_| {
            let mut ids = vec![lead; 2];
            // the lead sits in share 0 long enough for a held thread to claim share 1
            for_each_mut(&mut ids, |id| {
                *id = std::thread::current().id();
                if *id == lead {
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
            });
            ids.iter().any(|id| *id != lead)
        })
    }

    /// Task 0 (the lead's share) waits, at most a second, until task 1 (a held thread's) has run.
    fn after_the_other(done: &AtomicBool, i: usize) {
        if i == 0 {
            let t = std::time::Instant::now();
            while !done.load(Ordering::Acquire) && t.elapsed().as_secs() < 1 {
                std::hint::spin_loop();
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        } else {
            done.store(true, Ordering::Release);
        }
    }

    /// Waits, at most a second, until `flag` is set.
    fn wait_for(flag: &AtomicBool) {
        let t = std::time::Instant::now();
        while !flag.load(Ordering::Acquire) && t.elapsed().as_secs() < 1 {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn a_team_kernel_inside_a_team_task_runs_whole() {
        // The interleaving a kernel published over the job it is part of gets wrong: the held thread runs outer
        // task 1 while the lead, in outer task 0, starts an inner kernel; the held thread finishes task 1 after
        // that publish (counting a finished share into the inner job's count) and claims inner item 1, which is
        // slow. Published over the outer job, the inner kernel would take that count as its item 1's and return
        // before item 1 is written. Run inside tasks as it must be (through rayon), every flag wait below times out
        // or is met, and the sums are whole.
        let (outer_started, inner_started, item_started) =
            (AtomicBool::new(false), AtomicBool::new(false), AtomicBool::new(false));
        let _alone = one_joining_step_at_a_time();
        let sums = run(|| {
            let shared = a_helper_has_joined();
            let sums = map(&[0usize, 1], |&i| {
                if i == 1 {
                    outer_started.store(true, Ordering::Release);
                    wait_for(&inner_started);
                    return 1;
                }
                wait_for(&outer_started);
                let mut v: Vec<u64> = vec![0, 0];
                for_each_mut(&mut v, |x| {
                    if inner_started.swap(true, Ordering::AcqRel) {
                        // the second item: slow, so a lead that does not wait for it reads it unwritten
                        item_started.store(true, Ordering::Release);
                        std::thread::sleep(std::time::Duration::from_millis(50));
                        *x = 20;
                    } else {
                        wait_for(&item_started);
                        *x = 10;
                    }
                });
                v.iter().sum::<u64>()
            });
            (shared || rayon::current_num_threads() < 2, sums)
        });
        assert!(sums.0, "no held thread joined the step");
        assert_eq!(sums.1, vec![30, 1]);
    }

    #[test]
    fn a_task_that_panics_on_any_thread_ends_the_step_with_a_panic() {
        let _alone = one_joining_step_at_a_time();
        for bad in [0usize, 1] {
            // checked outside the step: a failed assert inside it would be one more panic the test expects
            let joined = AtomicBool::new(false);
            let caught = std::panic::catch_unwind(|| {
                run(|| {
                    joined.store(a_helper_has_joined() || rayon::current_num_threads() < 2, Ordering::Release);
                    let done = AtomicBool::new(false);
                    let mut v = vec![0usize, 1];
                    // task 1 runs on the held thread (task 0 waits for it on the lead)
                    for_each_mut(&mut v, |i| {
                        if *i == bad {
                            panic!("task {bad} fails");
                        }
                        after_the_other(&done, *i);
                    });
                })
            });
            assert!(joined.load(Ordering::Acquire), "no held thread joined the step");
            assert!(caught.is_err(), "task {bad}'s panic was lost");
            assert!(LEADING.get().is_null());
        }
        assert_eq!(run(|| map(&[1, 2, 3], |x| x * 2)), vec![2, 4, 6]);
    }
}
