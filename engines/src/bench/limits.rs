//! This machine's limits, measured in the benchmark's own run: the f32 fused-multiply-add peak (a register-only
//! loop on every rayon thread at once) and the DRAM read bandwidth (a streaming read of a buffer far larger than
//! the last-level cache on every thread at once). Kernel figures are printed as fractions of these.

use std::time::Instant;

/// Independent accumulators of the peak loop: enough to cover FMA latency (4 cycles) x 2 FMA ports twice over.
const CHAINS: usize = 16;
/// Passes of each measurement; the best one counts (the machine may be shared).
const PASSES: usize = 5;
/// Bytes a timed pass of [`read_bandwidth`] reads at least (a smaller buffer is read that many times over).
const PASS_BYTES: usize = 64 << 20;

/// The measured limits and what each measurement ran.
#[derive(Debug, Clone)]
pub struct Limits {
    pub peak_gflops: f64,
    /// e.g. "AVX-512F FMA, 2 threads"
    pub peak_how: String,
    pub bandwidth_gbs: f64,
    /// e.g. "1200 MiB streaming read, 16 streams a thread, 2 threads"
    pub bandwidth_how: String,
    /// The last-level cache size the bandwidth buffer was sized against, when the system tells it.
    pub llc_bytes: Option<u64>,
    /// Each measurement's [`line_trip_ns`], in order (empty with one thread).
    pub line_trips_ns: Vec<f64>,
}

impl Limits {
    /// Measures both limits (a few seconds; allocates the bandwidth buffer, see [`stream_bytes`]).
    pub fn measure() -> Limits {
        let (peak_gflops, isa) = fma_peak();
        let threads = rayon::current_num_threads();
        let llc_bytes = last_level_cache();
        let bytes = stream_bytes(llc_bytes, available_memory());
        let line_trip = line_trip_ns();
        let (bandwidth_gbs, way) = read_bandwidth(bytes);
        Limits {
            peak_gflops,
            peak_how: format!("{isa} FMA, {threads} threads"),
            bandwidth_gbs,
            bandwidth_how: format!("{} MiB streaming read, {}, {threads} threads", bytes >> 20, way.name()),
            llc_bytes,
            line_trips_ns: line_trip.into_iter().collect(),
        }
    }

    /// The higher of two measurements of each limit: on a shared machine a measurement can only come out low,
    /// so the fractions against the best stay honest (never flattered by a pass that met contention).
    pub fn best(self, other: Limits) -> Limits {
        let (peak_gflops, peak_how) = if other.peak_gflops > self.peak_gflops {
            (other.peak_gflops, other.peak_how)
        } else {
            (self.peak_gflops, self.peak_how)
        };
        let (bandwidth_gbs, bandwidth_how) = if other.bandwidth_gbs > self.bandwidth_gbs {
            (other.bandwidth_gbs, other.bandwidth_how)
        } else {
            (self.bandwidth_gbs, self.bandwidth_how)
        };
        let line_trips_ns = self.line_trips_ns.into_iter().chain(other.line_trips_ns).collect();
        Limits { peak_gflops, peak_how, bandwidth_gbs, bandwidth_how, llc_bytes: self.llc_bytes, line_trips_ns }
    }
}

/// The widest FMA this CPU runs, its GFLOP/s on every rayon thread at once (best of [`PASSES`]), and its name.
pub fn fma_peak() -> (f64, &'static str) {
    // ~0.3 s per pass at a few hundred GFLOP/s
    fma_peak_of(PASSES, 0)
}

/// [`fma_peak`] over `passes` passes, each `1 / 2^shorter` of its length.
pub fn fma_peak_of(passes: usize, shorter: u32) -> (f64, &'static str) {
    let kernel = FmaKernel::detect();
    let iters: u64 = match kernel {
        FmaKernel::Portable => 1 << 20,
        _ => 1 << 23,
    } >> shorter;
    let flops_per_iter = 2.0 * (CHAINS * kernel.lanes()) as f64;
    let best = (0..passes)
        .map(|_| {
            let t = Instant::now();
            let sums = rayon::broadcast(|_| kernel.run(iters));
            let s = t.elapsed().as_secs_f64().max(1e-9);
            std::hint::black_box(sums);
            flops_per_iter * iters as f64 * rayon::current_num_threads() as f64 / s / 1e9
        })
        .fold(0.0, f64::max);
    (best, kernel.name())
}

#[derive(Debug, Clone, Copy)]
enum FmaKernel {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Portable,
}

impl FmaKernel {
    fn detect() -> FmaKernel {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return FmaKernel::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                return FmaKernel::Avx2;
            }
        }
        FmaKernel::Portable
    }

    fn lanes(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            FmaKernel::Avx512 => 16,
            #[cfg(target_arch = "x86_64")]
            FmaKernel::Avx2 => 8,
            FmaKernel::Portable => 1,
        }
    }

    fn name(self) -> &'static str {
        match self {
            #[cfg(target_arch = "x86_64")]
            FmaKernel::Avx512 => "AVX-512F",
            #[cfg(target_arch = "x86_64")]
            FmaKernel::Avx2 => "AVX2",
            FmaKernel::Portable => "scalar mul_add",
        }
    }

    fn run(self, iters: u64) -> f32 {
        match self {
            // SAFETY: `detect` chose these only where the CPU has the features they enable
            #[cfg(target_arch = "x86_64")]
            #[allow(unsafe_code)]
            FmaKernel::Avx512 => unsafe { x86::fma_avx512(iters) },
            #[cfg(target_arch = "x86_64")]
            #[allow(unsafe_code)]
            FmaKernel::Avx2 => unsafe { x86::fma_avx2(iters) },
            FmaKernel::Portable => fma_portable(iters),
        }
    }
}

fn fma_portable(iters: u64) -> f32 {
    let (a, b) = (std::hint::black_box(0.999_999f32), std::hint::black_box(1e-7f32));
    let mut acc = [0.0f32; CHAINS];
    for _ in 0..iters {
        for v in &mut acc {
            *v = v.mul_add(a, b);
        }
    }
    acc.iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86 {
    use std::arch::x86_64::*;

    use super::CHAINS;

    /// `CHAINS` independent 16-lane FMA chains, all in registers (checked in the disassembly: the loop body is
    /// 16 `vfmadd` on zmm registers and the loop counter, no loads or stores).
    #[target_feature(enable = "avx512f")]
    pub unsafe fn fma_avx512(iters: u64) -> f32 {
        let a = _mm512_set1_ps(std::hint::black_box(0.999_999));
        let b = _mm512_set1_ps(std::hint::black_box(1e-7));
        let mut acc = [_mm512_setzero_ps(); CHAINS];
        for _ in 0..iters {
            for v in &mut acc {
                *v = _mm512_fmadd_ps(*v, a, b);
            }
        }
        let total = acc.iter().fold(_mm512_setzero_ps(), |s, &v| _mm512_add_ps(s, v));
        _mm512_reduce_add_ps(total)
    }

    /// The same with 8-lane registers (16 of them: all the AVX2 register file).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn fma_avx2(iters: u64) -> f32 {
        let a = _mm256_set1_ps(std::hint::black_box(0.999_999));
        let b = _mm256_set1_ps(std::hint::black_box(1e-7));
        let mut acc = [_mm256_setzero_ps(); CHAINS];
        for _ in 0..iters {
            for v in &mut acc {
                *v = _mm256_fmadd_ps(*v, a, b);
            }
        }
        let total = acc.iter().fold(_mm256_setzero_ps(), |s, &v| _mm256_add_ps(s, v));
        let mut out = [0.0f32; 8];
        // SAFETY: `out` is 8 f32s; unaligned store
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), total) };
        out.iter().sum()
    }
}

/// Bytes of the bandwidth buffer: max(1 GiB, 4 x the last-level cache), at most a quarter of the available
/// memory (and at least 64 MiB).
pub fn stream_bytes(llc: Option<u64>, available: Option<u64>) -> usize {
    let want = (4 * llc.unwrap_or(0)).max(1 << 30);
    let cap = available.map_or(want, |a| a / 4).max(64 << 20);
    want.min(cap) as usize
}

/// GB/s of an xor over a buffer of `bytes` bytes split across every rayon thread (best of [`PASSES`] of each
/// [`ReadWay`]), and the way that read fastest. Machines differ in which plain read reaches their memory's rate:
/// on a 2-core AVX-512 EPYC sixteen streams a thread did (one stream left the memory idle), while on a 2-core
/// Xeon (Sapphire Rapids class) sixteen streams read 20-25 GB/s and one stream asked 2 KiB ahead 25-34, as fast
/// as the kernels that ask ahead. A limit must bound every kernel, so it is the faster of the two.
///
/// A buffer smaller than [`PASS_BYTES`] is read over and over within each timed pass (each thread its own parts), so
/// a pass is long enough to time and, after the first, reads the buffer from the cache that holds it: the limit of a
/// kernel whose bytes stay in a cache, which the DRAM read does not bound.
pub fn read_bandwidth(bytes: usize) -> (f64, ReadWay) {
    best_read(&read_buffer(bytes), PASSES)
}

/// A buffer of `bytes` bytes for [`best_read`], every word nonzero (so every page is a real page, not the shared
/// zero page).
pub fn read_buffer(bytes: usize) -> Vec<u64> {
    use rayon::prelude::*;
    (0..bytes / 8).into_par_iter().map(|i| i as u64 | 1).collect()
}

/// [`read_bandwidth`] over `buf`: GB/s of the best of `passes` passes of each [`ReadWay`], and that way.
pub fn best_read(buf: &[u64], passes: usize) -> (f64, ReadWay) {
    let bytes = std::mem::size_of_val(buf);
    let reads = PASS_BYTES.div_ceil(bytes.max(1)).max(1);
    let mut best = (0.0, ReadWay::Streams);
    // the ways alternate pass by pass, so a stretch of contention does not fall on one way only
    for _ in 0..passes {
        for way in [ReadWay::Streams, ReadWay::AskedAhead] {
            let t = Instant::now();
            let x = read_pass(buf, reads, way);
            let s = t.elapsed().as_secs_f64().max(1e-9);
            std::hint::black_box(x);
            let gbs = (bytes * reads) as f64 / s / 1e9;
            if gbs > best.0 {
                best = (gbs, way);
            }
        }
    }
    best
}

/// One timed pass of [`read_bandwidth`]: every word of `buf` read `reads` times over, `way`, on every rayon thread;
/// the xor of all it read (so a word read an even number of times cancels out).
fn read_pass(buf: &[u64], reads: usize, way: ReadWay) -> u64 {
    use rayon::prelude::*;
    // 8 MiB parts, work-stolen: one thread the OS holds back a moment does not stall the whole pass (as one part
    // per thread would), the same way the matvecs it bounds split their work; a small buffer in four parts a thread
    let per = ((8 << 20) / 8).min(buf.len().div_ceil(4 * rayon::current_num_threads())).max(1);
    // (`black_box`: each read of a part is a read, not one result reused)
    let read = |part: &[u64]| (0..reads).fold(0, |a, _| a ^ way.xor(std::hint::black_box(part)));
    buf.par_chunks(per).map(read).reduce(|| 0, |a, b| a ^ b)
}

/// A plain sequential read, walked one of two ways (see [`read_bandwidth`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadWay {
    /// [`STREAMS`] sub-ranges walked in lockstep ([`xor_streams`]).
    Streams,
    /// One stream, each line asked for [`ASK_AHEAD_BYTES`] ahead ([`xor_asked_ahead`]).
    AskedAhead,
}

impl ReadWay {
    fn xor(self, part: &[u64]) -> u64 {
        match self {
            ReadWay::Streams => xor_streams(part),
            ReadWay::AskedAhead => xor_asked_ahead(part),
        }
    }

    /// How the bench prints it, e.g. "16 streams a thread".
    pub fn name(self) -> String {
        match self {
            ReadWay::Streams => format!("{STREAMS} streams a thread"),
            ReadWay::AskedAhead => format!("one stream a thread asked {} KiB ahead", ASK_AHEAD_BYTES >> 10),
        }
    }
}

/// Sequential read streams one thread walks side by side: as many as the widest matvec tile reads weight rows at
/// once (sixteen), so the limit is measured with the memory-level parallelism the kernels it bounds have. One
/// stream per thread leaves the memory system idle between a line's request and its arrival.
const STREAMS: usize = 16;

/// The xor of every word of `part`, read as [`STREAMS`] equal sub-ranges walked in lockstep, a cache line of each
/// per step.
fn xor_streams(part: &[u64]) -> u64 {
    const WORDS: usize = 8;
    let len = part.len() / STREAMS / WORDS * WORDS;
    let streams: [&[u64]; STREAMS] = std::array::from_fn(|i| &part[i * len..(i + 1) * len]);
    let mut acc = [[0u64; WORDS]; STREAMS];
    for at in (0..len).step_by(WORDS) {
        for (a, s) in acc.iter_mut().zip(&streams) {
            for (x, w) in a.iter_mut().zip(&s[at..at + WORDS]) {
                *x ^= w;
            }
        }
    }
    let tail = part[STREAMS * len..].iter().fold(0, |a, b| a ^ b);
    acc.iter().flatten().fold(tail, |a, b| a ^ b)
}

/// How far ahead [`xor_asked_ahead`] asks for a line: measured on the Xeon above, 2 and 8 KiB read alike (25-32
/// GB/s), 512 bytes less (24-29).
const ASK_AHEAD_BYTES: usize = 2048;

/// The xor of every word of `part`, one cache line at a time, each step asking for the line [`ASK_AHEAD_BYTES`]
/// ahead (a prefetch hint: it changes no value).
fn xor_asked_ahead(part: &[u64]) -> u64 {
    const WORDS: usize = 8;
    const AHEAD: usize = ASK_AHEAD_BYTES / 8;
    let mut acc = [0u64; WORDS];
    let mut lines = part.chunks_exact(WORDS);
    for (at, line) in lines.by_ref().enumerate() {
        if let Some(ahead) = part.get(at * WORDS + AHEAD) {
            ask_line(ahead);
        }
        for (x, w) in acc.iter_mut().zip(line) {
            *x ^= w;
        }
    }
    let tail = lines.remainder().iter().fold(0, |a, b| a ^ b);
    acc.iter().fold(tail, |a, b| a ^ b)
}

/// Asks the memory system for the line holding `word` (a hint; nothing on targets without one).
#[inline(always)]
fn ask_line(word: &u64) {
    // SAFETY: a prefetch reads nothing the program observes and never faults; the address is a live reference's
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>((word as *const u64).cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = word;
}

/// Round trips of a cache line between two threads one [`line_trip_ns`] pass times.
const TRIPS: u64 = 20_000;

/// Nanoseconds a cache line takes from one thread to another (half a round trip, best of [`PASSES`]), `None` on
/// one core. It tells how the cores meet: tens of nanoseconds where they share a last-level cache, a few hundred
/// where they do not (two dies or sockets). A VM's vCPUs can move between both from one moment to the next, and
/// the figures below move with them: cores apart read DRAM faster together (each die has its own path to memory),
/// while every hand-off between them costs more.
pub fn line_trip_ns() -> Option<f64> {
    use std::sync::atomic::{AtomicU64, Ordering};
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return None;
    }
    let best = (0..PASSES)
        .map(|_| {
            let line = AtomicU64::new(0);
            std::thread::scope(|s| {
                s.spawn(|| {
                    for i in 0..TRIPS {
                        wait_for(&line, 2 * i + 1);
                        line.store(2 * i + 2, Ordering::Release);
                    }
                });
                let t = Instant::now();
                for i in 0..TRIPS {
                    line.store(2 * i + 1, Ordering::Release);
                    wait_for(&line, 2 * i + 2);
                }
                t.elapsed().as_secs_f64() * 1e9 / (2 * TRIPS) as f64
            })
        })
        .fold(f64::MAX, f64::min);
    Some(best)
}

/// Spins until `line` holds `value`; after a few thousand spins (far longer than a trip between two running
/// threads) it lets the OS run the other thread, which may be waiting for this core.
fn wait_for(line: &std::sync::atomic::AtomicU64, value: u64) {
    let mut spins = 0u32;
    while line.load(std::sync::atomic::Ordering::Acquire) != value {
        if spins < 4096 {
            spins += 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// Above this many nanoseconds a line trip is taken for cores without a shared last-level cache.
const APART_NS: f64 = 100.0;
/// Below this many nanoseconds a line trip is taken for two hardware threads of one core (on the 2-vCPU EPYC VM:
/// 14-18 ns there, 30-52 between two cores of one die, 150-230 between two dies).
const ONE_CORE_NS: f64 = 25.0;

/// Where two threads ran, as a line trip between them tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Two hardware threads of one core: they share its FMA units, so two threads get one core's peak (117 against
    /// 226-234 GFLOP/s on the EPYC VM, in 300 alternations of the trip and the peak).
    OneCore,
    /// Two cores sharing a last-level cache (one die).
    OneDie,
    /// Two cores without a shared last-level cache (two dies or sockets).
    TwoDies,
}

impl Placement {
    pub fn of(trip_ns: f64) -> Placement {
        if trip_ns < ONE_CORE_NS {
            Placement::OneCore
        } else if trip_ns > APART_NS {
            Placement::TwoDies
        } else {
            Placement::OneDie
        }
    }
}

/// The `cores:` line of a block whose measurements took `trips_ns` ([`line_trip_ns`] each, in order): the trips
/// and what they say about the cores; `None` without a trip (one core).
pub fn placement(trips_ns: &[f64]) -> Option<String> {
    if trips_ns.is_empty() {
        return None;
    }
    let trips: Vec<String> = trips_ns.iter().map(|ns| format!("{ns:.0}")).collect();
    let first = Placement::of(trips_ns[0]);
    let what = match first {
        _ if trips_ns.iter().any(|&ns| Placement::of(ns) != first) => {
            "the cores moved between placements: no fraction here speaks for one placement"
        }
        Placement::OneCore => "two hardware threads of one core: the two threads share its FMA units",
        Placement::OneDie => "cores sharing a last-level cache",
        Placement::TwoDies => "cores without a shared last-level cache: DRAM reads faster, hand-offs cost more",
    };
    Some(format!("cores: a cache line between two threads in {} ns ({what})", trips.join(" / ")))
}

/// The largest cache `/sys` lists for cpu0 (the last level), in bytes.
pub fn last_level_cache() -> Option<u64> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("size")).ok())
        .filter_map(|s| parse_size(s.trim()))
        .max()
}

/// A `/sys` cache size such as `48K`, `2048K`, `300M` or `1024`.
fn parse_size(s: &str) -> Option<u64> {
    let (num, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => s.split_at(i),
        None => (s, ""),
    };
    let n: u64 = num.parse().ok()?;
    let shift = match unit {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        _ => return None,
    };
    n.checked_mul(1 << shift)
}

/// `MemAvailable` from /proc/meminfo, in bytes.
pub(super) fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cores_line_tells_the_placement_from_every_trip() {
        assert_eq!(placement(&[]), None);
        let together = placement(&[44.2, 47.9]).expect("two trips");
        assert!(together.starts_with("cores: a cache line between two threads in 44 / 48 ns (cores sharing"));
        assert!(placement(&[181.0, 176.0]).expect("two trips").contains("without a shared last-level cache"));
        assert!(placement(&[45.0, 181.0]).expect("two trips").contains("moved"));
        assert!(placement(&[181.0, 45.0]).expect("two trips").contains("moved"));
        assert!(placement(&[16.0, 15.0]).expect("two trips").contains("two hardware threads of one core"));
        assert!(placement(&[16.0, 45.0]).expect("two trips").contains("moved"));
        assert!(placement(&[45.0, 16.0]).expect("two trips").contains("moved"));
    }

    #[test]
    fn a_line_trip_is_measured_where_there_are_two_cores() {
        let two = std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2;
        match line_trip_ns() {
            Some(ns) => assert!(two && ns > 0.0 && ns < 1e6, "{ns} ns"),
            None => assert!(!two),
        }
    }

    #[test]
    fn cache_sizes_parse_as_sys_writes_them() {
        assert_eq!(parse_size("48K"), Some(48 << 10));
        assert_eq!(parse_size("307200K"), Some(300 << 20));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("1024"), Some(1024));
        assert_eq!(parse_size("12Q"), None);
        assert_eq!(parse_size(""), None);
    }

    #[test]
    fn the_streams_read_every_word_once() {
        for n in [0usize, 7, 128, 1000, 4096 + 13] {
            let part: Vec<u64> = (0..n as u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
            let every = part.iter().fold(0, |a, b| a ^ b);
            assert_eq!(xor_streams(&part), every, "{n} words");
            assert_eq!(xor_asked_ahead(&part), every, "{n} words, asked ahead");
        }
    }

    #[test]
    fn a_pass_reads_every_word_as_many_times_as_asked() {
        // an odd count of reads leaves every word's xor, an even one cancels every word: each part is read `reads`
        // times over, not once (a pass that read a small buffer once would count `reads` times its bytes)
        for n in [1usize, 7, 1000, (3 << 20) + 5] {
            let buf: Vec<u64> = (0..n as u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1).collect();
            let every = buf.iter().fold(0, |a, b| a ^ b);
            for way in [ReadWay::Streams, ReadWay::AskedAhead] {
                assert_eq!(read_pass(&buf, 1, way), every, "{n} words, once, {way:?}");
                assert_eq!(read_pass(&buf, 3, way), every, "{n} words, three times, {way:?}");
                assert_eq!(read_pass(&buf, 2, way), 0, "{n} words, twice, {way:?}");
            }
        }
    }

    #[test]
    fn the_stream_buffer_outgrows_the_cache_within_memory() {
        // four times a 300 MiB L3, one GiB at least, a quarter of free memory at most
        assert_eq!(stream_bytes(Some(300 << 20), Some(64 << 30)), 1200 << 20);
        assert_eq!(stream_bytes(Some(8 << 20), None), 1 << 30);
        assert_eq!(stream_bytes(Some(300 << 20), Some(2 << 30)), 512 << 20);
    }
}
