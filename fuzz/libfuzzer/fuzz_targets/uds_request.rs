#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| regolith_fuzz::uds::uds_request(data));
