//! The API between the sluice engine and its transports: the types a file
//! system operation speaks in, the error type with its one errno mapping,
//! the fragments a read is walked as, the source a write's bytes are taken
//! from, and the [`Filesystem`] trait the FUSE dispatcher calls.
//!
//! `sluice-engine` implements [`Filesystem`] on its `Vfs` and re-exports
//! every item here under its old path (`sluice_engine::meta::Attr`,
//! `sluice_engine::Error`, ...). `sluice-fuse` and `sluice-vhost` depend on
//! this crate alone, so a protocol change does not rebuild — and a protocol
//! crate does not compile — the S3 client, the async runtime or the
//! metadata engines' drivers. Keep it that way: this crate holds plain
//! types and a few traits, and depends on `libc`, `thiserror` and the
//! `sluice-simd` copy kernels only
//! (`DESIGN.md` beside this crate says what belongs here).
//!
//! - [`meta`]: inode numbers, attributes, entries, credentials, and the
//!   arguments of setattr, rename, setxattr and copy_file_range.
//! - [`error`]: [`Error`], [`Limit`], [`Result`] and `Error::errno`.
//! - [`fragment`]: [`Fragment`], the [`ReadDest`] a read is pushed into,
//!   [`BufDest`] (a plain buffer) and [`read_file_exact`].
//! - [`source`]: the bytes of a write, taken in order: [`WriteSource`]
//!   and [`SliceSource`].
//! - [`filesystem`]: [`Filesystem`], [`Listed`], [`Fh`], [`OpenOut`].
//! - [`wait`]: whether the calling thread may wait ([`Error::WouldBlock`]).

pub mod error;
pub mod filesystem;
pub mod fragment;
pub mod meta;
pub mod source;
pub mod wait;

pub use error::{Error, Limit, Result};
pub use filesystem::{Fh, Filesystem, Listed, OpenOut};
pub use fragment::{BufDest, Fragment, ReadDest, SegmentCrcs, read_file_exact};
pub use source::{SliceSource, WriteSource};
