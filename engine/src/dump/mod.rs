//! `sluice dump` and `sluice load`: a volume's metadata as JuiceFS 1.x's
//! JSON dump (what `juicefs dump` writes and `juicefs load` reads), so a
//! volume moves between metadata engines — SQLite and Redis, ours or
//! JuiceFS's — with its inode numbers, slice ids and counters unchanged,
//! and the blocks in the object store still match.
//!
//! The document, in JuiceFS's order: `Setting` (the volume settings, with
//! the secret key, session token and encryption key replaced by
//! `"removed"` unless kept), `Counters`, `Sustained`, `DelFiles`, `Quotas`
//! (directory quotas, when there are any), `FSTree` (the root and, nested
//! under `entries`, every node: `attr`, `symlink`, `xattrs`, `chunks`) and
//! `Trash`. Names, symlink targets and xattr values are JuiceFS-escaped
//! (`json.rs`): bytes that are not UTF-8, control characters, `%`, `"` and
//! `\` become `%XX`. A hard-linked file appears, complete, under each of
//! its names.
//!
//! Both directions stream: the dump walks one directory page at a time and
//! writes as it goes (`write.rs`); the load parses the document
//! incrementally and hands each node to the engine's [`Restore`] as soon as
//! its object closes (`read.rs`), keeping only the open directories, the
//! slice reference counts and the hard links in memory.
//!
//! [`Restore`]: crate::meta::Restore

mod json;
mod read;
mod write;

pub use read::{LoadSummary, load};
pub use write::{DumpOptions, DumpSummary, dump};
