//! `kvproof-engine`: serve any bundled engine over stdin/stdout (docs/protocol.md) or over an OpenAI-compatible
//! HTTP API (`--http PORT`, docs/http.md), or run the engine benchmarks.

use std::io::{BufWriter, ErrorKind, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{ArgGroup, Parser};
use kvproof_engines::bundled;
use kvproof_engines::bundled::ModelConfig;
use kvproof_engines::config::Preset;
use kvproof_engines::fault::Fault;
use kvproof_engines::serve::{serve, serve_http, HttpOptions, ServeError, ServeOptions};
use serde_json::{Map, Value};

/// Large blocks line-aligned, so the kernels' 64-byte row loads never straddle two cache lines.
#[global_allocator]
static ALLOCATOR: kvproof_engines::line_aligned::LineAligned = kvproof_engines::line_aligned::LineAligned;

/// Serve a bundled engine over stdio, speaking the kvproof serve protocol (see docs/protocol.md).
///
/// Set KVPROOF_PREFIX_LOG=1 to print one `[PREFIX]` line per request on stderr.
#[derive(Debug, Parser)]
#[command(name = "kvproof-engine", version)]
#[command(group(ArgGroup::new("source").required(true).multiple(true).args(["model", "preset", "bench", "gguf"])))]
struct Cli {
    /// Engine family (e.g. inkling). Required with --preset; with --model it must match config.json.
    #[arg(long)]
    arch: Option<String>,

    /// Model directory (config.json + model.safetensors).
    #[arg(long, conflicts_with_all = ["preset", "bench"])]
    model: Option<PathBuf>,

    /// A GGUF model file, or `smollm2` for SmolLM2 from the cache (`bash ci/fetch-smollm2.sh`); serves --arch
    /// llama. With --bench, its prefill and decode speed.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["model", "preset"])]
    gguf: Option<PathBuf>,

    /// Generate a deterministic random-init model in memory: tiny, small or bench.
    #[arg(long, value_parser = parse_preset, conflicts_with = "bench", requires = "arch")]
    preset: Option<Preset>,

    /// Seed of the generated model (with --preset), and of the benchmark models.
    #[arg(long, default_value_t = 0)]
    seed: u64,

    /// Turn on one named fault (a deliberate reuse bug; see `kvproof list`).
    #[arg(long, value_parser = parse_fault, conflicts_with = "bench")]
    fault: Option<Fault>,

    /// With --preset: a JSON object overriding fields of the preset's model config before the weights are
    /// generated, e.g. '{"kv_share": true}' (as a scenario's `engine.config`). With --gguf: how the model is
    /// served (slots, initial_capacity, prefill_chunk, max_ctx).
    #[arg(long, value_name = "JSON", value_parser = parse_overrides, conflicts_with = "model")]
    config: Option<Map<String, Value>>,

    /// Run the benchmarks instead of serving, and print the report.
    #[arg(long)]
    bench: bool,

    /// Benchmark presets, comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = parse_preset, requires = "bench", default_value = "small,bench")]
    presets: Vec<Preset>,

    /// Serve an OpenAI-compatible HTTP API on 127.0.0.1:PORT instead of stdio (docs/http.md); 0 picks a free
    /// port. The first line on stdout is `listening on http://127.0.0.1:PORT/v1`.
    #[arg(long, value_name = "PORT", conflicts_with = "bench")]
    http: Option<u16>,
}

fn parse_preset(s: &str) -> Result<Preset, String> {
    s.parse::<Preset>().map_err(|e| e.to_string())
}

fn parse_fault(s: &str) -> Result<Fault, String> {
    s.parse::<Fault>().map_err(|e| e.to_string())
}

fn parse_overrides(s: &str) -> Result<Map<String, Value>, String> {
    match serde_json::from_str(s) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err("not a JSON object".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// The preset's config with `overrides` applied and validated by the arch's registry entry (errors name the key
/// at fault, as for a scenario's `engine.config`).
fn model_config(arch: &str, preset: Preset, overrides: &Map<String, Value>) -> anyhow::Result<ModelConfig> {
    ModelConfig::with_overrides(arch, preset, overrides).map_err(|e| anyhow::anyhow!("--config: {e}"))
}

fn main() -> ExitCode {
    kvproof_engines::huge_pages::rerun_with_huge_pages();
    let mut cli = Cli::parse();
    if let Some(model) = &cli.gguf {
        match kvproof_engines::gguf::resolve(&model.to_string_lossy()) {
            Ok(path) => cli.gguf = Some(path),
            Err(e) => {
                eprintln!("kvproof-engine: --gguf {e}");
                return ExitCode::from(2);
            }
        }
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvproof-engine: {}", chain(&e));
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    if let Some(path) = &cli.gguf {
        if let Some(arch) = cli.arch.as_deref().filter(|a| *a != "llama") {
            bail!("--gguf serves --arch llama, not {arch}");
        }
        if cli.bench {
            return bench_gguf(path);
        }
    }
    if cli.bench {
        let arches: Vec<&str> = match &cli.arch {
            Some(arch) => vec![bundled::arch(arch)?.name],
            None => bundled::arches().map(|a| a.name).collect(),
        };
        for arch in arches {
            let report = kvproof_engines::bench::run(arch, &cli.presets, cli.seed)
                .with_context(|| format!("benchmarking {arch}"))?;
            print!("{report}");
        }
        return Ok(());
    }

    let (mut engine, kv_share) = match (&cli.model, cli.preset) {
        _ if cli.gguf.is_some() => {
            let path = cli.gguf.as_deref().context("--gguf")?;
            let overrides = cli.config.clone().unwrap_or_default();
            let engine = kvproof_engines::arch::llama::open_gguf(path, &overrides, cli.fault)
                .with_context(|| format!("opening {}", path.display()))?;
            (engine, false)
        }
        (Some(dir), None) => {
            let engine = bundled::open_dir(dir, cli.fault).with_context(|| format!("opening {}", dir.display()))?;
            let arch = engine.info().arch;
            if let Some(want) = cli.arch.as_deref().filter(|want| *want != arch) {
                bail!("--arch {want} given, but {} holds a {arch} model", dir.display());
            }
            let config = ModelConfig::load(&dir.join("config.json"))?;
            (engine, config.kv_share())
        }
        (None, Some(preset)) => {
            // clap makes --preset require --arch
            let arch = cli.arch.as_deref().context("--preset needs --arch")?;
            let opening = || format!("opening {arch} --preset {preset} --seed {}", cli.seed);
            let config = model_config(arch, preset, &cli.config.clone().unwrap_or_default()).with_context(opening)?;
            let kv_share = config.kv_share();
            // The same weights an in-process engine of this arch, preset, seed and config gets.
            let weights = kvproof_engines::fixture::generate_weights(&config, cli.seed).with_context(opening)?;
            (bundled::open(config, weights, cli.fault).with_context(opening)?, kv_share)
        }
        // clap requires exactly one of --model, --preset (or --bench)
        _ => bail!("give --model DIR or --arch A --preset tiny|small|bench [--seed N] (or --bench)"),
    };

    // declared over either transport, so the harness's oracle can hold the engine to an exact count
    let rule = bundled::declared_rule(&engine.info());
    if let Some(port) = cli.http {
        return serve_over_http(engine.as_mut(), port, kv_share, rule);
    }

    let mut options = ServeOptions::from_env();
    if let Some(rule) = rule {
        options.caps.push(("reuse_rule".into(), rule));
    }
    if kv_share {
        options.caps.push(("kv_share".into(), "1".into()));
    }
    let output = BufWriter::new(std::io::stdout().lock());
    match serve(engine.as_mut(), std::io::stdin(), output, std::io::stderr(), options) {
        Ok(()) => Ok(()),
        // The client went away: nobody is left to answer, which is a normal end.
        Err(ServeError::Write(e)) if e.kind() == ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Prefill and decode tokens/s of the GGUF model at `path` for prompts of 128, 512 and 2048 ids (the fastest of
/// `bench::MODEL_RUNS` runs, the slowest beside it), each as a fraction of this machine's measured limits (prefill
/// of the f32 FMA peak, decode of the DRAM read bandwidth and, where its bytes fit in the last-level cache, of a
/// read of as many bytes).
fn bench_gguf(path: &std::path::Path) -> anyhow::Result<()> {
    use kvproof_engines::bench::{describe, model_fractions, Gauge, Limits};
    let model = kvproof_engines::arch::llama::load(path).with_context(|| format!("opening {}", path.display()))?;
    let steal = kvproof_engines::cpu_steal::StealMeter::start();
    let gauge = Gauge::new();
    let before = Limits::measure();
    let rows = kvproof_engines::arch::llama::bench(&model, &[128, 512, 2048], 32, &gauge);
    // the best of the limits measured before and after (a shared machine only ever makes them come out low)
    let limits = before.best(Limits::measure());
    print!("{}", describe(&limits));
    println!("# {} ({} threads)", path.display(), rayon::current_num_threads());
    // the fastest of the runs first (the columns ci/bench-llama.sh reads), the slowest after
    println!(
        "{:>7} {:>12} {:>7} {:>12}   slowest of {}: {:>12} {:>12}",
        "prompt",
        "prefill t/s",
        "decode",
        "decode t/s",
        kvproof_engines::bench::MODEL_RUNS,
        "prefill t/s",
        "decode t/s"
    );
    for r in rows {
        let ((prefill, prefill_slowest), (decode, decode_slowest)) =
            (r.prefill.tokens_per_second(), r.decode_phase.tokens_per_second());
        println!(
            "{:>7} {prefill:>12.1} {:>7} {decode:>12.1}   {:>12} {prefill_slowest:>12.1} {decode_slowest:>12.1}",
            r.prompt, r.decode, ""
        );
        println!("        {}", model_fractions(&limits, r.prefill, r.decode_phase));
    }
    println!("{}", kvproof_engines::cpu_steal::describe(steal.ticks()));
    Ok(())
}

/// Serve `engine` over HTTP on 127.0.0.1:`port` until the process is stopped.
fn serve_over_http(
    engine: &mut dyn kvproof_engines::engine::Engine,
    port: u16,
    kv_share: bool,
    reuse_rule: Option<String>,
) -> anyhow::Result<()> {
    let listener =
        std::net::TcpListener::bind(("127.0.0.1", port)).with_context(|| format!("binding 127.0.0.1:{port}"))?;
    let addr = listener.local_addr()?;
    let options =
        HttpOptions { prefix_log: ServeOptions::from_env().prefix_log, kv_share, reuse_rule, ..HttpOptions::default() };
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on http://{addr}/v1")?;
    stdout.flush()?;
    drop(stdout);
    serve_http(engine, listener, options).context("serving HTTP")
}

/// The error and its causes on one line, skipping a cause its parent's message already ends with.
fn chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}
