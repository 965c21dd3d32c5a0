//! Benchmarks that print numbers: this machine's measured limits (f32 FMA peak, DRAM read bandwidth), kernel
//! GFLOP/s and GB/s as fractions of the limit that bounds each, prefill and decode tokens/s per preset with the
//! same fractions (from the work the kernels counted), and the second-turn speedup that reuse buys on a long
//! conversation.

mod around;
mod limits;

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use rayon::prelude::*;

use crate::bundled;
use crate::chat::{render, Message, Role};
use crate::config::Preset;
use crate::cpu_steal::{self, StealMeter};
use crate::engine::{Engine, NoObserver, Reply, Request};
use crate::error::Result;
use crate::kernels::{attend_many, matmul, matmul_panels, qmatmul, work, Panels, QMatrix, QType, Work};

pub use around::{Around, Gauge};
pub use limits::Limits;

/// Lengths used per preset: (prefill prompt, decode tokens, conversation turn-1 prompt).
fn sizes(preset: Preset) -> (usize, usize, usize) {
    match preset {
        Preset::Tiny => (256, 64, 256),
        Preset::Small => (1024, 64, 2048),
        Preset::Bench => (4096, 32, 4096),
    }
}

fn ids(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i.wrapping_mul(2654435761).wrapping_add(salt) >> 7) % 256).collect()
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64().max(1e-9)
}

/// The two limits, one line, and how the cores met while they were measured, another.
pub fn describe(l: &Limits) -> String {
    let llc = l.llc_bytes.map_or("unknown".into(), |b| format!("{} MiB", b >> 20));
    let mut out = format!(
        "limits: f32 peak {:.1} GFLOP/s ({}), DRAM read {:.1} GB/s ({}; last-level cache {llc})\n",
        l.peak_gflops, l.peak_how, l.bandwidth_gbs, l.bandwidth_how
    );
    if let Some(cores) = limits::placement(&l.line_trips_ns) {
        let _ = writeln!(out, "{cores}");
    }
    out
}

/// `part` as a percentage of `whole`.
fn pct(part: f64, whole: f64) -> f64 {
    100.0 * part / whole.max(1e-12)
}

/// The fewest seconds one call of `f` took over `reps` calls (the least disturbed run).
fn best_of(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            secs(t.elapsed())
        })
        .fold(f64::INFINITY, f64::min)
}

/// Seconds per call of `matmul` over `rows` rows of `x` against `w` (`out x inp`), best of `reps` calls.
fn time_matmul(x: &[f32], rows: usize, w: &[f32], out: usize, inp: usize, reps: usize) -> f64 {
    let mut y = vec![0.0; rows * out];
    matmul(x, rows, w, out, inp, &mut y);
    best_of(reps, || matmul(x, rows, w, out, inp, &mut y))
}

/// Seconds per call of `matmul_panels` over `rows` rows of `x` against `w` packed, best of `reps` calls.
fn time_matmul_panels(x: &[f32], rows: usize, w: &Panels, reps: usize) -> f64 {
    let mut y = vec![0.0; rows * w.out_dim];
    matmul_panels(x, rows, w, &mut y);
    best_of(reps, || matmul_panels(x, rows, w, &mut y))
}

/// Seconds per call of `qmatmul` over `rows` rows of `x` against `w`, best of `reps` calls.
fn time_qmatmul(x: &[f32], rows: usize, w: &QMatrix, reps: usize) -> f64 {
    let mut y = vec![0.0; rows * w.out_dim];
    qmatmul(x, rows, w, &mut y);
    best_of(reps, || qmatmul(x, rows, w, &mut y))
}

/// Seconds of a causal prefill's attention for one head of `width` (query `t` over keys `0..=t`), in blocks of
/// rows attending together as the models run it (`kernels::attend_many`), blocks in parallel; best of `reps`.
fn time_attention(positions: usize, width: usize, reps: usize) -> f64 {
    const ROWS: usize = 16;
    let (k, v, q) = (filled(positions * width, 83), filled(positions * width, 79), filled(positions * width, 89));
    let mut out = vec![0.0; positions * width];
    let row = |p: usize| (&k[p * width..(p + 1) * width], &v[p * width..(p + 1) * width]);
    best_of(reps, || {
        out.par_chunks_mut(ROWS * width).enumerate().for_each(|(b, o)| {
            let rows = b * ROWS..b * ROWS + o.len() / width;
            let queries: Vec<&[f32]> = rows.clone().map(|t| &q[t * width..(t + 1) * width]).collect();
            let ranges: Vec<_> = rows.map(|t| 0..t + 1).collect();
            attend_many(&queries, &ranges, row, 0.125, o);
        });
    })
}

/// GB/s of a decode step's attention (one row) read from DRAM: SmolLM2's shape (9 query heads of 64 over 3 kv heads)
/// over `positions` cached positions, k and v stored kv head by kv head as the GGUF engine keeps them
/// (`cache::HeadMajorCache`), `layers` layers' caches attended one after another so they come from memory, as in a
/// decode step; best of `reps` sweeps over the layers. Also the bytes of cached k and v one sweep reads, and the
/// DRAM read around the sweeps.
fn decode_attention_gbs(positions: usize, layers: usize, reps: usize, gauge: &Gauge) -> (f64, usize, Around) {
    use crate::arch::gqa_attend::{attend_rows, Heads};
    use crate::cache::{HeadMajorCache, RowMeta};
    let (width, heads, kv_heads) = (64, 9, 3);
    let kvd = kv_heads * width;
    let caches: Vec<(HeadMajorCache, HeadMajorCache)> = (0..layers)
        .map(|l| {
            let (mut k, mut v) =
                (HeadMajorCache::new(positions, kv_heads, width), HeadMajorCache::new(positions, kv_heads, width));
            let (rows_k, rows_v) = (filled(positions * kvd, 83 + l), filled(positions * kvd, 79 + l));
            for (p, (rk, rv)) in rows_k.chunks_exact(kvd).zip(rows_v.chunks_exact(kvd)).enumerate() {
                let meta = RowMeta { pos: p as i64, writer: None };
                k.put(p, rk, meta);
                v.put(p, rv, meta);
            }
            (k, v)
        })
        .collect();
    let q = filled(heads * width, 89);
    let mut att = vec![0.0; heads * width];
    let shape = Heads { width, heads, group: heads / kv_heads, scale: 0.125 };
    let (seconds, around) = gauge.read_around(|| {
        best_of(reps, || {
            crate::decode_team::run(|| {
                for (k, v) in &caches {
                    attend_rows(&q, shape, |_| 0..positions, |g, p| (k.get(g, p), v.get(g, p)), &mut att);
                }
            })
        })
    });
    let bytes = layers * 2 * positions * kvd * 4;
    (bytes as f64 / seconds / 1e9, bytes, around)
}

/// A Q4_1 matrix of `out x inp` laid out directly (quantizing its f32 source would take 6x the memory): every
/// block scale 1/64, minimum -1/8, nibbles varying along the row.
fn q4_1_filled(out: usize, inp: usize) -> QMatrix {
    let row_bytes = QType::Q4_1.row_bytes(inp);
    let mut bytes = vec![0u8; out * row_bytes];
    bytes.par_chunks_mut(20).enumerate().for_each(|(i, b)| {
        b[..2].copy_from_slice(&0x2400u16.to_le_bytes()); // 2^-6
        b[2..4].copy_from_slice(&0xb000u16.to_le_bytes()); // -2^-3
        for (j, q) in b[4..].iter_mut().enumerate() {
            *q = ((i * 7 + j * 13) % 251) as u8;
        }
    });
    QMatrix::from_vec(QType::Q4_1, out, inp, bytes).expect("whole blocks")
}

fn filled(n: usize, m: usize) -> Vec<f32> {
    (0..n).map(|i| ((i % m) as f32 - (m / 2) as f32) / m as f32).collect()
}

/// The batch-invariant matmul at a prefill shape (against the compute peak) and at decode shapes (against the
/// bandwidth): one whose weights fit in cache, and one whose weights are several times the last-level cache.
/// The limits are measured before and after the kernels, and the best of the two counts; the DRAM-sized kernels
/// are put against the read measured around their own calls ([`Gauge::read_around`]).
pub fn kernels(before: Limits, gauge: &Gauge) -> (String, Limits) {
    let (inp, outp) = (1024, 1024);
    let w = filled(inp * outp, 97);
    let rows = 256;
    let gflops = 2.0 * (rows * inp * outp) as f64 / time_matmul(&filled(rows * inp, 89), rows, &w, outp, inp, 8) / 1e9;
    let small_gbs = (4 * inp * outp) as f64 / time_matmul(&filled(inp, 89), 1, &w, outp, inp, 200) / 1e9;
    let panels = Panels::pack(&w, outp, inp);
    let panel_gflops =
        2.0 * (rows * inp * outp) as f64 / time_matmul_panels(&filled(rows * inp, 89), rows, &panels, 8) / 1e9;
    drop((w, panels));
    // weights as large as the bandwidth buffer: they stream from DRAM on every call
    let big_in = 4096;
    let big_out = limits::stream_bytes(before.llc_bytes, None) / (4 * big_in);
    let w = filled(big_out * big_in, 97);
    let (big_seconds, big_around) = gauge.read_around(|| time_matmul(&filled(big_in, 89), 1, &w, big_out, big_in, 3));
    let big_gbs = (4 * big_in * big_out) as f64 / big_seconds / 1e9;
    drop(w);
    // the quantized kernel (Q4_1 weights against 8-bit activations, as the GGUF model runs it) at the same shapes
    let w = QMatrix::quantize(QType::Q4_1, &filled(inp * outp, 97), outp, inp);
    let q_gflops = 2.0 * (rows * inp * outp) as f64 / time_qmatmul(&filled(rows * inp, 89), rows, &w, 8) / 1e9;
    let big_out_q = limits::stream_bytes(before.llc_bytes, None) / QType::Q4_1.row_bytes(big_in);
    let wq = q4_1_filled(big_out_q, big_in);
    let q_bytes = (QType::Q4_1.row_bytes(big_in) * big_out_q) as f64;
    let (q_seconds, q_around) = gauge.read_around(|| time_qmatmul(&filled(big_in, 89), 1, &wq, 3));
    let q_gbs = q_bytes / q_seconds / 1e9;
    drop((w, wq));
    // the quantized decode kernel on a matrix that stays in cache (SmolLM2's gate, 540 KiB): its own rate, the
    // most a decode of whole-model weights can read whatever the memory gives; run as a decode step runs it
    let (cache_in, cache_out) = (576, 1536);
    let wc = q4_1_filled(cache_out, cache_in);
    let (xc, mut yc) = (filled(cache_in, 89), vec![0.0; cache_out]);
    let cache_bytes = (QType::Q4_1.row_bytes(cache_in) * cache_out) as f64;
    let q_cache_gbs = cache_bytes / crate::decode_team::run(|| best_of(400, || qmatmul(&xc, 1, &wc, &mut yc))) / 1e9;
    drop(wc);
    // one head of the bench preset's attention (64 wide) over a 2048-position causal prefill
    let (positions, width) = (2048, 64);
    let att_flops = 4.0 * width as f64 * (positions * (positions + 1) / 2) as f64;
    let att_gflops = att_flops / time_attention(positions, width, 3) / 1e9;
    // a decode step's attention over a long context, 30 layers' caches (90 MiB: several times the last-level cache)
    let (decode_positions, decode_layers) = (2048, 30);
    let (decode_att_gbs, decode_att_bytes, att_around) =
        decode_attention_gbs(decode_positions, decode_layers, 20, gauge);
    let l = before.best(Limits::measure());

    let mut out = describe(&l);
    let _ = writeln!(
        out,
        "matmul {rows:>4} x {inp} x {outp}: {gflops:7.1} GFLOP/s = {:5.1}% of peak",
        pct(gflops, l.peak_gflops)
    );
    let _ = writeln!(
        out,
        "panel matmul {rows:>3} x {inp} x {outp}: {panel_gflops:7.1} GFLOP/s = {:5.1}% of peak (the same bits, lanes across outputs)",
        pct(panel_gflops, l.peak_gflops)
    );
    let _ = writeln!(
        out,
        "qmatmul Q4_1 {rows:>3} x {inp} x {outp}: {q_gflops:7.1} GFLOP/s = {:5.1}% of peak",
        pct(q_gflops, l.peak_gflops)
    );
    let _ = writeln!(
        out,
        "qmatvec Q4_1 1 x {big_in} x {big_out_q}: {q_gbs:7.1} GB/s = {:5.1}% of the DRAM read around it ({}; {} MiB of \
         weights)",
        pct(q_gbs, q_around.limit),
        q_around.describe("GB/s"),
        (q_bytes as u64) >> 20
    );
    let _ = writeln!(
        out,
        "qmatvec Q4_1 1 x {cache_in} x {cache_out}: {q_cache_gbs:7.1} GB/s = {:5.1}% of DRAM read (its {} KiB of \
         weights stay in cache, not a DRAM figure){}",
        pct(q_cache_gbs, l.bandwidth_gbs),
        (cache_bytes as u64) >> 10,
        of_a_read_as_large(q_cache_gbs, cache_bytes as usize).0
    );
    let _ = writeln!(
        out,
        "attention {positions} positions x {width} (causal, one head): {att_gflops:7.1} GFLOP/s = {:5.1}% of peak",
        pct(att_gflops, l.peak_gflops)
    );
    let _ = writeln!(
        out,
        "decode attention 1 row x {decode_positions} positions (9 heads of 64, 3 kv heads stored apart, \
         {decode_layers} layers): {decode_att_gbs:7.1} GB/s = {:5.1}% of the DRAM read around it ({}; {} MiB of cached \
         k/v){}",
        pct(decode_att_gbs, att_around.limit),
        att_around.describe("GB/s"),
        decode_att_bytes >> 20,
        of_a_read_as_large(decode_att_gbs, decode_att_bytes).0
    );
    let _ = writeln!(
        out,
        "matvec    1 x {inp} x {outp}: {small_gbs:7.1} GB/s    = {:5.1}% of DRAM read (its 4 MiB of weights stay in \
         cache, not a DRAM figure){}",
        pct(small_gbs, l.bandwidth_gbs),
        of_a_read_as_large(small_gbs, 4 * inp * outp).0
    );
    let _ = writeln!(
        out,
        "matvec    1 x {big_in} x {big_out}: {big_gbs:7.1} GB/s    = {:5.1}% of the DRAM read around it ({}; {} MiB of \
         weights)",
        pct(big_gbs, big_around.limit),
        big_around.describe("GB/s"),
        (4 * big_in * big_out) >> 20
    );
    (out, l)
}

/// Fresh runs each whole-model phase is timed over. The fastest counts, as the limits' best pass and the kernels'
/// best call do: a shared machine's slow stretch only ever makes a run slower, and one run against the best of
/// several passes of the limits was a fraction biased low (on one machine a bench prefill measured 1498, 2200 and
/// 1900 tok/s in three runs minutes apart). The slowest run is printed beside the fastest.
pub const MODEL_RUNS: usize = 3;

/// The work and time of one phase (prefill or decode) of a whole model: its fastest run, and the slowest's time.
#[derive(Debug, Clone, Copy)]
pub struct Phase {
    pub work: Work,
    pub seconds: f64,
    pub tokens: usize,
    /// The slowest run's seconds (`seconds` itself when the phase ran once).
    pub slowest_seconds: f64,
    pub runs: usize,
    /// The limit measured around the fastest run, where it was (the FMA peak around a prefill, the DRAM read
    /// around a decode).
    pub limit: Option<Around>,
    /// The limit measured around the slowest run.
    pub slowest_limit: Option<Around>,
}

impl Phase {
    /// One run of a phase.
    pub fn once(work: Work, seconds: f64, tokens: usize) -> Phase {
        Phase { work, seconds, tokens, slowest_seconds: seconds, runs: 1, limit: None, slowest_limit: None }
    }

    /// This run with the limit measured around it ([`Gauge`]).
    pub fn with_limit(self, around: Around) -> Phase {
        Phase { limit: Some(around), slowest_limit: Some(around), ..self }
    }

    /// The faster of two runs of the same phase, keeping the slowest time either saw (and the limit around it).
    pub fn best(self, other: Phase) -> Phase {
        let fastest = if other.seconds < self.seconds { other } else { self };
        let slowest = if other.slowest_seconds > self.slowest_seconds { other } else { self };
        Phase {
            slowest_seconds: slowest.slowest_seconds,
            slowest_limit: slowest.slowest_limit,
            runs: self.runs + other.runs,
            ..fastest
        }
    }

    /// The prefill and decode phases of [`MODEL_RUNS`] calls of `run` (call `k` gets `k`), each the fastest run with
    /// the slowest's time beside it.
    pub fn fastest_of<E>(
        mut run: impl FnMut(usize) -> std::result::Result<(Phase, Phase), E>,
    ) -> std::result::Result<(Phase, Phase), E> {
        let mut best = run(0)?;
        for k in 1..MODEL_RUNS {
            let (p, d) = run(k)?;
            best = (best.0.best(p), best.1.best(d));
        }
        Ok(best)
    }

    /// Tokens a second of the fastest run, and of the slowest.
    pub fn tokens_per_second(&self) -> (f64, f64) {
        (self.tokens as f64 / self.seconds.max(1e-9), self.tokens as f64 / self.slowest_seconds.max(1e-9))
    }
}

/// `gbs` as a fraction of a read of `bytes` over and over: the limit of a kernel whose `bytes` stay in a cache
/// (measured here, [`limits::read_bandwidth`]), e.g. ", 61.2% of a read of as many bytes (160.3 GB/s)", and the
/// fraction itself.
fn of_a_read_as_large(gbs: f64, bytes: usize) -> (String, f64) {
    let read = limits::read_bandwidth(bytes).0;
    let at = pct(gbs, read);
    (format!(", {at:.1}% of a read of as many bytes ({read:.1} GB/s)"), at)
}

/// Whole-model prefill against the compute peak (the kernels' counted FLOPs per token x tokens/s) and decode
/// against the bandwidth (the weight bytes and the cached key and value bytes read per token x tokens/s), one
/// line. A phase timed with its limit measured around it ([`Phase::limit`]) is put against that, each run (the
/// fastest, the slowest) against its own; one without, against the block's `l`. Where a decode step's bytes fit in
/// the last-level cache, the DRAM read does not bound it: the line says so and also puts the decode against a read
/// of as many bytes over and over (measured here, [`limits::read_bandwidth`]), the rate of the cache that holds them.
pub fn model_fractions(l: &Limits, prefill: Phase, decode: Phase) -> String {
    let gflops = prefill.work.flops as f64 / prefill.seconds.max(1e-9) / 1e9;
    let bytes = decode.work.weight_bytes + decode.work.cache_bytes;
    let gbs = bytes as f64 / decode.seconds.max(1e-9) / 1e9;
    let per_token = |b: u64| b / decode.tokens.max(1) as u64;
    let mib = |b: u64| per_token(b) as f64 / (1 << 20) as f64;
    let in_cache = match l.llc_bytes {
        Some(llc) if (1..=llc).contains(&per_token(bytes)) => {
            let (of_read, at) = of_a_read_as_large(gbs, per_token(bytes) as usize);
            let slowest = slowest_run(&decode, at * decode.seconds / decode.slowest_seconds.max(1e-9));
            format!("; its bytes fit in the last-level cache{of_read}{slowest}")
        }
        _ => String::new(),
    };
    let prefill_of = of_limit(&prefill, prefill.work.flops as f64 / 1e9, l.peak_gflops, "peak", "GFLOP/s");
    let decode_of = of_limit(&decode, bytes as f64 / 1e9, l.bandwidth_gbs, "DRAM read", "GB/s");
    format!(
        "prefill {:.2} GFLOP/token, {gflops:.1} GFLOP/s = {prefill_of}; decode {:.1} MiB of weights + {:.1} MiB of \
         cached k/v rows per token, {gbs:.1} GB/s = {decode_of}{in_cache}",
        prefill.work.flops as f64 / prefill.tokens.max(1) as f64 / 1e9,
        mib(decode.work.weight_bytes),
        mib(decode.work.cache_bytes),
    )
}

/// `phase`'s fastest run, `amount` (GFLOP or GB) a run, as a percentage of its limit, with the words after it: the
/// limit measured around the run where there is one ("58.6% of the peak around it (233.1 GFLOP/s, cores sharing a
/// last-level cache)"), else the block's `block` ("58.6% of peak"); and the slowest run's fraction of its own limit
/// where the phase ran more than once.
fn of_limit(phase: &Phase, amount: f64, block: f64, what: &str, unit: &str) -> String {
    let limit_of = |around: Option<Around>| around.map_or(block, |a| a.limit);
    let at = pct(amount / phase.seconds.max(1e-9), limit_of(phase.limit));
    let of = match phase.limit {
        Some(a) => format!("of the {what} around it ({})", a.describe(unit)),
        None => format!("of {what}"),
    };
    let slowest = pct(amount / phase.slowest_seconds.max(1e-9), limit_of(phase.slowest_limit));
    format!("{at:.1}% {of}{}", slowest_run(phase, slowest))
}

/// " (slowest run 52.4%)" beside a phase's fraction, where the phase ran more than once.
fn slowest_run(phase: &Phase, fraction: f64) -> String {
    if phase.runs > 1 {
        format!(" (slowest run {fraction:.1}%)")
    } else {
        String::new()
    }
}

/// The prefill and the decode phase of one engine at `preset`, each the fastest of [`MODEL_RUNS`] runs: the first
/// on `engine` (whose state then holds the prefilled prompt, as the report's state size says), the others on fresh
/// engines.
fn throughput(engine: &mut dyn Engine, preset: Preset, gauge: &Gauge) -> Result<(Phase, Phase)> {
    Phase::fastest_of(|k| match k {
        0 => throughput_once(engine, preset, gauge),
        _ => throughput_once(engine.fresh().as_mut(), preset, gauge),
    })
}

/// One run of the prefill and the decode phase of one engine at `preset`, each with its limit measured around it.
fn throughput_once(engine: &mut dyn Engine, preset: Preset, gauge: &Gauge) -> Result<(Phase, Phase)> {
    let (prefill_n, decode_n, _) = sizes(preset);
    let prompt = ids(prefill_n, 1);
    let w0 = work();
    let (r, peak) = gauge.peak_around(|| {
        engine.generate(&Request { id: 1, prompt, max_tokens: 1, ..Default::default() }, &mut NoObserver)
    });
    let r = r?;
    // the request's one token comes from prefill (its logits), so the whole request's work is prefill's
    let prefill = Phase::once(work().since(w0), secs(r.timings.prefill), prefill_n).with_limit(peak);
    // on fresh engines (nothing to reuse): the decode request's work less that of the same prompt's 1-token
    // request is its decode steps' work
    let short = Request { id: 2, prompt: ids(16, 2), max_tokens: 1, ..Default::default() };
    let w1 = work();
    engine.fresh().generate(&short, &mut NoObserver)?;
    let first = work().since(w1);
    let mut fresh = engine.fresh();
    let w2 = work();
    let (r, around) = gauge
        .read_around(|| fresh.generate(&Request { max_tokens: decode_n, ignore_eos: true, ..short }, &mut NoObserver));
    let r = r?;
    let total = work().since(w2);
    let decode = Phase::once(total.since(first), secs(r.timings.decode), r.tokens.len().saturating_sub(1));
    Ok((prefill, decode.with_limit(around)))
}

/// Turn 2 of a long conversation, warm (reusing turn 1) vs cold.
fn second_turn(engine: &mut dyn Engine, preset: Preset) -> Result<String> {
    let (_, _, first_n) = sizes(preset);
    let mut transcript = vec![Message::new(Role::User, ids(first_n, 3))];
    let p1 = render(&transcript, true);
    let r1 = engine.generate(
        &Request { id: 1, prompt: p1, max_tokens: 16, ignore_eos: true, ..Default::default() },
        &mut NoObserver,
    )?;
    transcript.push(Message::from_reply(&r1.tokens));
    transcript.push(Message::new(Role::User, ids(48, 4)));
    let p2 = render(&transcript, true);
    let req = Request { id: 2, prompt: p2, max_tokens: 16, ignore_eos: true, ..Default::default() };
    let warm = engine.generate(&req, &mut NoObserver)?;
    let mut cold_engine = engine.fresh();
    let cold = cold_engine.generate(&req, &mut NoObserver)?;
    let (tw, tc) = (warm.timings.prefill + warm.timings.decode, cold.timings.prefill + cold.timings.decode);
    // each side's prefill and decode apart: a warm prefill that also grows the state shows there, not as decode
    let split = |r: &Reply| format!("prefill {:.3}s + decode {:.3}s", secs(r.timings.prefill), secs(r.timings.decode));
    Ok(format!(
        "  turn 2: reuse {} of {} prompt tokens ({:.0}%), warm {:.3}s ({}), cold {:.3}s ({}), speedup {:.2}x, \
         identical {}\n",
        warm.reused,
        warm.prompt_tokens,
        100.0 * warm.reused as f64 / warm.prompt_tokens as f64,
        secs(tw),
        split(&warm),
        secs(tc),
        split(&cold),
        secs(tc) / secs(tw),
        if warm.tokens == cold.tokens { "YES" } else { "NO" }
    ))
}

/// The whole benchmark report for `arch` at each preset.
pub fn run(arch: &str, presets: &[Preset], seed: u64) -> Result<String> {
    let steal = StealMeter::start();
    let gauge = Gauge::new();
    let (mut out, limits) = kernels(Limits::measure(), &gauge);
    let _ = writeln!(out, "{} while the limits and kernels above were measured", cpu_steal::describe(steal.ticks()));
    for &preset in presets {
        let steal = StealMeter::start();
        let t = Instant::now();
        let mut engine = bundled::open_preset(arch, preset, seed, None)?;
        let load = t.elapsed();
        let (prefill_n, decode_n, _) = sizes(preset);
        let (p, d) = throughput(engine.as_mut(), preset, &gauge)?;
        let ((prefill, prefill_slowest), (decode, decode_slowest)) = (p.tokens_per_second(), d.tokens_per_second());
        let _ = writeln!(
            out,
            "{arch} {preset}: prefill {prefill:.0} tok/s ({prefill_n} tokens), decode {decode:.1} tok/s ({decode_n} \
             tokens), the fastest of {} runs (the slowest {prefill_slowest:.0} and {decode_slowest:.1}), fixture+load \
             {:.2}s, state {:.1} MiB",
            p.runs,
            secs(load),
            engine.state_bytes() as f64 / (1 << 20) as f64
        );
        let _ = writeln!(out, "  {}", model_fractions(&limits, p, d));
        let mut engine = engine.fresh();
        out.push_str(&second_turn(engine.as_mut(), preset)?);
        let _ = writeln!(out, "  {} during {arch} {preset}", cpu_steal::describe(steal.ticks()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_keeps_its_fastest_run_and_the_slowest_time() {
        let work = Work { flops: 100, weight_bytes: 10, cache_bytes: 1 };
        let runs = [3.0, 1.5, 2.0].map(|s| Phase::once(work, s, 30));
        let best = runs[1..].iter().fold(runs[0], |b, &p| b.best(p));
        assert_eq!((best.seconds, best.slowest_seconds, best.runs), (1.5, 3.0, 3));
        assert_eq!(best.tokens_per_second(), (20.0, 10.0));
        let limits = Limits {
            peak_gflops: 1e-7,
            peak_how: "test".into(),
            bandwidth_gbs: 1.0,
            bandwidth_how: "test".into(),
            llc_bytes: None,
            line_trips_ns: Vec::new(),
        };
        // 100 flops in 1.5 s of a 100-flop/s peak: 66.7%, the slowest run's 3 s half that
        let line = model_fractions(&limits, best, Phase::once(work, 1.0, 1));
        assert!(line.contains("= 66.7% of peak (slowest run 33.3%)"), "{line}");
        assert!(!line.contains("DRAM read (slowest"), "a phase run once has no slowest run: {line}");
    }

    #[test]
    fn each_run_is_put_against_the_limit_measured_around_it() {
        let work = Work { flops: 0, weight_bytes: 900_000_000, cache_bytes: 100_000_000 };
        let apart = Around { limit: 2.0, trips_ns: Some([170.0, 160.0]) };
        let together = Around { limit: 1.0, trips_ns: Some([33.0, 35.0]) };
        let runs = [
            Phase::once(work, 2.0, 10).with_limit(apart),
            Phase::once(work, 1.0, 10).with_limit(apart),
            Phase::once(work, 4.0, 10).with_limit(together),
        ];
        let decode = runs[1..].iter().fold(runs[0], |b, &p| b.best(p));
        assert_eq!((decode.limit, decode.slowest_limit), (Some(apart), Some(together)));
        let limits = Limits {
            peak_gflops: 1.0,
            peak_how: "test".into(),
            bandwidth_gbs: 100.0,
            bandwidth_how: "test".into(),
            llc_bytes: None,
            line_trips_ns: Vec::new(),
        };
        // 1 GB in 1 s against the 2 GB/s read around that run, not the block's 100; the slowest, 1 GB in 4 s,
        // against the 1 GB/s read around it
        // a prefill on two threads of one core, against the peak measured around it there (one core's)
        let one_core = Around { limit: 117.0, trips_ns: Some([16.0, 15.0]) };
        let prefill_work = Work { flops: 117_000_000_000, weight_bytes: 0, cache_bytes: 0 };
        let prefill = Phase::once(prefill_work, 2.0, 100).with_limit(one_core);
        let line = model_fractions(&limits, prefill, decode);
        assert!(
            line.contains(
                "58.5 GFLOP/s = 50.0% of the peak around it (117.0 GFLOP/s, two hardware threads of one core);"
            ),
            "{line}"
        );
        assert!(
            line.contains("1.0 GB/s = 50.0% of the DRAM read around it (2.0 GB/s, cores apart) (slowest run 25.0%)"),
            "{line}"
        );
    }

    #[test]
    fn turn_two_gives_each_sides_prefill_and_decode() {
        let mut engine = bundled::open_preset("inkling", Preset::Tiny, 0, None).expect("open");
        let line = second_turn(engine.as_mut(), Preset::Tiny).expect("turn 2");
        let sides: Vec<&str> = line.split(" (prefill ").skip(1).collect();
        assert_eq!(sides.len(), 2, "a warm and a cold split: {line}");
        for side in sides {
            let (prefill, rest) = side.split_once("s + decode ").expect(&line);
            let decode = rest.split_once("s)").expect(&line).0;
            assert!(prefill.parse::<f64>().is_ok() && decode.parse::<f64>().is_ok(), "{line}");
        }
        assert!(line.contains("identical YES"), "{line}");
    }
}
