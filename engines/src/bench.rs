//! Benchmarks that print numbers: kernel GFLOP/s against the machine's f32 peak, prefill and decode tokens/s per
//! preset, and the second-turn speedup that reuse buys on a long conversation.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::bundled;
use crate::chat::{render, Message, Role};
use crate::config::Preset;
use crate::engine::{Engine, NoObserver, Request};
use crate::error::Result;

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

/// Estimated f32 peak of this machine: cores x clock x SIMD lanes x 2 (FMA) x 2 (FMA ports).
fn peak_gflops() -> Option<(f64, String)> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let mhz: f64 = info.lines().find(|l| l.starts_with("cpu MHz"))?.split(':').nth(1)?.trim().parse().ok()?;
    let flags = info.lines().find(|l| l.starts_with("flags"))?;
    let has = |f: &str| flags.split_whitespace().any(|x| x == f);
    let lanes = if has("avx512f") {
        16.0
    } else if has("avx2") {
        8.0
    } else {
        4.0
    };
    let fma = if has("fma") { 2.0 } else { 1.0 };
    let cores = rayon::current_num_threads() as f64;
    let peak = cores * mhz / 1000.0 * lanes * fma * 2.0;
    Some((peak, format!("{cores} cores x {:.2} GHz x {lanes} lanes x {fma} (fma) x 2 ports", mhz / 1000.0)))
}

/// GFLOP/s of the batch-invariant matmul at a prefill-like and a decode-like shape.
pub fn kernels() -> String {
    let mut out = String::new();
    let (inp, outp) = (1024, 1024);
    let w: Vec<f32> = (0..inp * outp).map(|i| ((i % 97) as f32 - 48.0) / 97.0).collect();
    for rows in [256usize, 1] {
        let x: Vec<f32> = (0..rows * inp).map(|i| ((i % 89) as f32 - 44.0) / 89.0).collect();
        let mut y = vec![0.0; rows * outp];
        let reps = if rows == 1 { 200 } else { 8 };
        crate::kernels::matmul(&x, rows, &w, outp, inp, &mut y);
        let t = Instant::now();
        for _ in 0..reps {
            crate::kernels::matmul(&x, rows, &w, outp, inp, &mut y);
        }
        let gflops = 2.0 * (rows * inp * outp * reps) as f64 / secs(t.elapsed()) / 1e9;
        let _ = write!(out, "matmul {rows:>4} x {inp} x {outp}: {gflops:7.2} GFLOP/s");
        if let Some((peak, how)) = peak_gflops() {
            let _ = write!(out, "  ({:.1}% of an estimated {peak:.0} GFLOP/s peak: {how})", 100.0 * gflops / peak);
        }
        out.push('\n');
    }
    out
}

/// Prefill and decode tokens/s of one engine.
fn throughput(engine: &mut dyn Engine, preset: Preset) -> Result<(f64, f64)> {
    let (prefill_n, decode_n, _) = sizes(preset);
    let prompt = ids(prefill_n, 1);
    let r = engine.generate(&Request { id: 1, prompt, max_tokens: 1, ..Default::default() }, &mut NoObserver)?;
    let prefill = prefill_n as f64 / secs(r.timings.prefill);
    let r = engine.generate(
        &Request { id: 2, prompt: ids(16, 2), max_tokens: decode_n, ignore_eos: true, ..Default::default() },
        &mut NoObserver,
    )?;
    // the first token comes from prefill; the rest are decode steps
    let decode = (r.tokens.len().saturating_sub(1)) as f64 / secs(r.timings.decode);
    Ok((prefill, decode))
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
    Ok(format!(
        "  turn 2: reuse {} of {} prompt tokens ({:.0}%), warm {:.3}s, cold {:.3}s, speedup {:.2}x, identical {}\n",
        warm.reused,
        warm.prompt_tokens,
        100.0 * warm.reused as f64 / warm.prompt_tokens as f64,
        secs(tw),
        secs(tc),
        secs(tc) / secs(tw),
        if warm.tokens == cold.tokens { "YES" } else { "NO" }
    ))
}

/// The whole benchmark report for `arch` at each preset.
pub fn run(arch: &str, presets: &[Preset], seed: u64) -> Result<String> {
    let mut out = kernels();
    for &preset in presets {
        let t = Instant::now();
        let mut engine = bundled::open_preset(arch, preset, seed, None)?;
        let load = t.elapsed();
        let (prefill_n, decode_n, _) = sizes(preset);
        let (prefill, decode) = throughput(engine.as_mut(), preset)?;
        let _ = writeln!(
            out,
            "{arch} {preset}: prefill {prefill:.0} tok/s ({prefill_n} tokens), decode {decode:.1} tok/s ({decode_n} \
             tokens), fixture+load {:.2}s, state {:.1} MiB",
            secs(load),
            engine.state_bytes() as f64 / (1 << 20) as f64
        );
        let mut engine = engine.fresh();
        out.push_str(&second_turn(engine.as_mut(), preset)?);
    }
    Ok(out)
}
