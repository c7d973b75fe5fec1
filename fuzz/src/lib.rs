//! Fuzz harnesses for the two ways a guest talks to sluice, each a function
//! of the fuzzer's bytes that panics when an invariant breaks:
//!
//! - [`requests::run`]: a sequence of FUSE requests through the dispatcher,
//!   a confined [`sluice_fuse::Export`] (trash on, `--read-only` or not,
//!   small per-guest limits) and the real engine on a SQLite + local
//!   directory volume. After every request: the reply is well framed, no
//!   node outside the export is ever named, no byte of another tenant's
//!   files (live or in the trash) is returned; under read-only nothing in
//!   the export changed; at the end the session still answers.
//! - [`chains::run`]: hand-made descriptor chains through the vhost-user-fs
//!   device (the real `VirtioFsDevice` serving the same engine, driven over
//!   its socket by the harness's driver): every chain comes back within the
//!   driver's timeout with no more bytes written than it offered, and the
//!   device still answers a well-formed request afterwards.
//! - [`host::run`]: one client's packets (HELLOs, GETs of any block with
//!   any flags, DAMAGED reports, garbage, oversized packets, descriptors)
//!   to the real host daemon over its socket: every reply decodes, no tag
//!   is answered twice, another client is still served byte for byte, and
//!   the fuzzed client is forgotten once it goes.
//!
//! `fuzz/libfuzzer/` wraps each in a cargo-fuzz (libFuzzer) target;
//! `fuzz/tests/corpus.rs` replays the seed corpus under `fuzz/corpus/` and
//! a few hundred generated inputs in the ordinary test run.

pub mod chains;
pub mod host;
pub mod msg;
pub mod requests;
