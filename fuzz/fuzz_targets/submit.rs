#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvproof_engines::serve::fuzz::fuzz_submit(data));
