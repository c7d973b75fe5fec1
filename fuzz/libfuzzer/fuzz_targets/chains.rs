//! Descriptor chains through the vhost-user-fs device: `sluice_fuzz::chains`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::chains::run(data));
