//! The engine's error type: [`sluice_api::Error`], re-exported so engine
//! code names it `crate::error::Error` as before. The errno mapping
//! (`Error::errno`) lives with the type, in `sluice-api`.

pub use sluice_api::error::{Error, Limit, Result};
