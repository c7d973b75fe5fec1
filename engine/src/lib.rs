//! The sluice file system engine: the JuiceFS 1.x volume format, metadata
//! engines, object stores, and the chunk/slice/block data path.

pub mod error;
pub mod format;
pub mod meta;

pub use error::{Error, Result};
