#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvproof_engines::gguf::fuzz_gguf(data));
