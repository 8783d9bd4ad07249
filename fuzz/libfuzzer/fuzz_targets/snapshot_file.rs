#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| regolith_fuzz::snapshot::snapshot_file(data));
