//! A dump loads in Python with the safetensors package, and its writers and positions are readable there.

use std::process::Command;

use kvproof_engines::config::Preset;
use kvproof_engines::engine::{NoObserver, Request};

fn python_has_safetensors() -> bool {
    Command::new("python3")
        .args(["-c", "import safetensors.numpy, numpy"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

#[test]
#[ignore = "needs python3 with safetensors and numpy; .ci/run installs them and runs the ignored tests"]
fn python_reads_positions_and_writers() {
    assert!(
        python_has_safetensors(),
        "python3 with safetensors and numpy is needed (python3 -m pip install safetensors numpy)"
    );
    let mut e = kvproof_engines::bundled::open_preset("inkling", Preset::Tiny, 0, None).expect("engine");
    let prompt: Vec<u32> = (0..40).map(|i| 97 + i % 26).collect();
    e.generate(&Request { id: 9, prompt, max_tokens: 4, ignore_eos: true, ..Default::default() }, &mut NoObserver)
        .expect("generate");
    let dir = kvproof_engines::scratch_dir::ScratchDir::new(&format!("pydump-{}", std::process::id()));
    let path = dir.join("state.safetensors");
    kvproof_engines::dump::write_file(&e.dump(0).expect("dump"), &path).expect("write");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/load_dump.py");
    let out = Command::new("python3").arg(script).arg(&path).output().expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("inkling slot 0 len 43"), "{stdout}");
    // layer 7 is the global layer: its newest row was written by decode step 2 of request 9
    assert!(stdout.contains("layers.7.k full rows=64 max_pos=42 writer[42]=decode req=9 a=2"), "{stdout}");
    // ring rows hold absolute positions past the window
    assert!(stdout.contains("layers.0.k ring rows=8 max_pos=42"), "{stdout}");
    assert!(stdout.contains("OK "), "{stdout}");
}
