#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| regolith_fuzz::sled::sled_record(data));
