#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvproof::provenance::fuzz::fuzz_dump(data));
