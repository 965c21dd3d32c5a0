//! Fuzz entries for the serve protocol: arbitrary bytes through the real readers, on each side of the wire. Both
//! must return for any input without panicking, and hold no more than a small multiple of the input in memory
//! (every length a frame declares is read from the input, never allocated up front).

use std::io::BufReader;

use crate::engine::EngineInfo;
use crate::serve::frame::{read_command, Command, EngineFrame, EngineFrameReader};
use crate::serve::request;
use crate::serve::text::ServeText;

/// Fuzz entry: `data` as an engine's stdout, read as the stdio client's reader thread reads it (anything before
/// READY is noise; after READY, the first frame that does not parse ends the stream).
pub fn fuzz_frames(data: &[u8]) {
    let mut reader = EngineFrameReader::new(BufReader::new(data));
    let mut ready = false;
    loop {
        match reader.next_frame() {
            Ok(Some(Ok(frame))) => ready |= frame == EngineFrame::Ready,
            Ok(Some(Err(_))) if !ready => {}
            Ok(Some(Err(_))) | Ok(None) | Err(_) => return,
        }
    }
}

/// Fuzz entry: `data` as a client's bytes on an engine's stdin, read as `kvproof-engine` reads them: every frame,
/// and every SUBMIT built into a request for a tiny audio engine with the byte tokenizer.
pub fn fuzz_submit(data: &[u8]) {
    let info = fuzz_engine_info();
    let text = ServeText::bytes();
    let mut reader = BufReader::new(data);
    while let Ok(Some(command)) = read_command(&mut reader) {
        if let Ok(Command::Submit(frame)) = command {
            let _ = request::build(frame, &info, &text);
        }
    }
}

/// The engine a fuzzed SUBMIT is built for: the bundled tiny inkling (audio, a window), with a second slot so a
/// SUBMIT may name one past the first.
fn fuzz_engine_info() -> EngineInfo {
    EngineInfo { slots: 2, ..EngineInfo::tiny_inkling() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn seeds(name: &str) -> Vec<(PathBuf, Vec<u8>)> {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(name);
        let mut files: Vec<PathBuf> =
            std::fs::read_dir(&dir).expect("corpus folder").map(|e| e.expect("entry").path()).collect();
        files.sort();
        assert!(files.len() >= 3, "{}: too few seeds", dir.display());
        files.into_iter().map(|p| (p.clone(), std::fs::read(&p).expect("seed"))).collect()
    }

    #[test]
    fn every_frames_seed_runs_through_the_client_reader() {
        for (path, bytes) in seeds("frames") {
            assert!(bytes.len() < 64 << 10, "{}", path.display());
            fuzz_frames(&bytes);
            // and every cut of it: a stream that ends anywhere
            for cut in (0..bytes.len()).step_by(7) {
                fuzz_frames(&bytes[..cut]);
            }
        }
    }

    #[test]
    fn every_submit_seed_runs_through_the_engine_reader() {
        for (path, bytes) in seeds("submit") {
            assert!(bytes.len() < 64 << 10, "{}", path.display());
            fuzz_submit(&bytes);
            for cut in 0..bytes.len() {
                fuzz_submit(&bytes[..cut]);
            }
        }
    }
}
