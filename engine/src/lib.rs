//! The sluice file system engine: the JuiceFS 1.x volume format, metadata
//! engines, object stores, and the chunk/slice/block data path.

pub mod error;
pub mod format;
pub mod meta;

pub use error::{Error, Limit, Result};
pub mod backoff;
pub mod block_cache;
pub mod block_key;
pub mod block_source;
pub mod chunk;
pub mod chunk_cache;
pub mod commit;
pub mod compaction;
pub mod compress;
pub mod dump;
pub mod fsck;
pub mod gc;
pub mod info;
pub mod metrics;
pub mod object;
pub mod readahead;
pub mod reader;
pub mod redact;
pub mod size;
pub mod vfs;
pub mod volume;
pub mod warmup;
pub mod writer;
