//! FUSE request sequences through a confined export: `sluice_fuzz::requests`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::requests::run(data));
