//! Extended attributes (`jfs_xattr`: a TEXT name and a BLOB value per row).

use rusqlite::{Connection, OptionalExtension, params};

use super::namespace::Ns;
use super::node;
use super::{Inner, TxError};
use crate::error::{Error, Result};
use crate::meta::namespace as ns;
use crate::meta::{Context, Ino, XattrMode};

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

/// Sets an attribute with create/replace semantics (the rules in
/// `meta/namespace.rs`).
pub(super) fn set(
    inner: &Inner,
    ctx: &Context,
    ino: Ino,
    name: &[u8],
    value: &[u8],
    mode: XattrMode,
) -> Result<()> {
    ns::check_xattr(name, Some(value))?;
    text_name(name)?;
    inner.write(|tx| ns::set_xattr(&mut Ns::new(tx, inner), ctx, ino, name, value, mode))
}

/// Removes an attribute.
pub(super) fn remove(inner: &Inner, ctx: &Context, ino: Ino, name: &[u8]) -> Result<()> {
    ns::check_xattr(name, None)?;
    text_name(name)?;
    inner.write(|tx| ns::remove_xattr(&mut Ns::new(tx, inner), ctx, ino, name))
}
