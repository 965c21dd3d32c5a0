#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvproof::scenario::fuzz_scenario(data));
