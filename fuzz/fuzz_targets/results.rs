#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvproof::report::results::fuzz_results(data));
