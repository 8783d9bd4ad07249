#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| regolith_fuzz::dataplane::rdma_upgrade(data));
