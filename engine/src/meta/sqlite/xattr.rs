//! Extended attributes (`jfs_xattr`: a TEXT name and a BLOB value per row).

use rusqlite::{Connection, OptionalExtension, params};

use super::node;
use super::{Inner, TxError};
use crate::error::{Error, Result};
use crate::meta::Ino;
use crate::meta::namespace as ns;

/// JuiceFS keeps names in a TEXT column, so they must be UTF-8.
pub(super) fn text_name(name: &[u8]) -> Result<&str> {
    ns::check_xattr(name, None)?;
    std::str::from_utf8(name)
        .map_err(|_| Error::Invalid("extended attribute names must be UTF-8".into()))
}

fn missing(c: &Connection, ino: Ino) -> TxError {
    match node::get(c, ino) {
        Ok(Some(_)) => TxError::Fs(Error::NoXattr),
        Ok(None) => TxError::Fs(Error::NotFound),
        Err(e) => e,
    }
}

/// Reads one attribute.
pub(super) fn get(inner: &Inner, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
    let name = text_name(name)?;
    inner.read(|c| {
        c.query_row(
            "SELECT value FROM jfs_xattr WHERE inode=? AND name=?",
            params![ino as i64, name],
            |r| Ok(r.get_ref(0)?.as_bytes()?.to_vec()),
        )
        .optional()?
        .ok_or_else(|| missing(c, ino))
    })
}

/// Lists attribute names.
pub(super) fn list(inner: &Inner, ino: Ino) -> Result<Vec<Vec<u8>>> {
    inner.read(|c| {
        node::must_get(c, ino)?;
        let mut stmt = c.prepare("SELECT name FROM jfs_xattr WHERE inode=? ORDER BY id")?;
        let rows = stmt.query_map(params![ino as i64], |r| {
            Ok(r.get_ref(0)?
                .as_bytes()
                .map(<[u8]>::to_vec)
                .unwrap_or_default())
        })?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    })
}
