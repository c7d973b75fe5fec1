//! One client's packets to the host daemon: `sluice_fuzz::host`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::host::run(data));
