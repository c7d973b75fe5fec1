//! Extended attributes (`jfs_xattr`: a TEXT name and a BLOB value per row).

use rusqlite::{Connection, OptionalExtension, params};

use super::node;
use super::{Inner, TxError, TxResult};
use crate::error::{Error, Result};
use crate::meta::bounded::XATTR_LIST_MAX;
use crate::meta::rules::{self, MASK_W};
use crate::meta::{Attr, Context, Ino, Timestamp, XattrMode};

/// The longest attribute name Linux accepts (`XATTR_NAME_MAX`).
const MAX_NAME: usize = 255;
/// The largest attribute value Linux accepts (`XATTR_SIZE_MAX`).
const MAX_VALUE: usize = 65536;

/// JuiceFS keeps names in a TEXT column, so they must be UTF-8.
fn text_name(name: &[u8]) -> Result<&str> {
    if name.is_empty() {
        return Err(Error::Invalid("an extended attribute needs a name".into()));
    }
    if name.len() > MAX_NAME {
        return Err(Error::Range);
    }
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

/// The node's attributes, if `ctx` may change its extended attributes.
fn check_writable(c: &Connection, ctx: &Context, ino: Ino) -> TxResult<Attr> {
    let a = node::must_get(c, ino)?;
    if a.flags & (rules::FLAG_IMMUTABLE | rules::FLAG_APPEND) != 0 {
        return Err(Error::Perm.into());
    }
    node::check(c, ctx, &a, MASK_W)?;
    Ok(a)
}

/// An extended attribute changed: the node's ctime moves, as on Linux.
fn touch_ctime(c: &Connection, ino: Ino, mut a: Attr) -> TxResult<()> {
    a.ctime = Timestamp::now();
    node::update(c, ino, &a)
}

/// Sets an attribute with create/replace semantics.
pub(super) fn set(
    inner: &Inner,
    ctx: &Context,
    ino: Ino,
    name: &[u8],
    value: &[u8],
    mode: XattrMode,
) -> Result<()> {
    let name = text_name(name)?;
    if value.len() > MAX_VALUE {
        return Err(Error::Range);
    }
    inner.write(|tx| {
        let attr = check_writable(tx, ctx, ino)?;
        let cur: Option<Vec<u8>> = tx
            .query_row(
                "SELECT value FROM jfs_xattr WHERE inode=? AND name=?",
                params![ino as i64, name],
                |r| r.get(0),
            )
            .optional()?;
        match (mode, &cur) {
            (XattrMode::Create, Some(_)) => return Err(Error::Exists.into()),
            (XattrMode::Replace, None) => return Err(Error::NoXattr.into()),
            (_, Some(v)) if v.as_slice() == value => {}
            (_, Some(_)) => {
                tx.execute(
                    "UPDATE jfs_xattr SET value=? WHERE inode=? AND name=?",
                    params![value, ino as i64, name],
                )?;
            }
            (_, None) => {
                let used: i64 = tx.query_row(
                    "SELECT COALESCE(SUM(length(CAST(name AS BLOB)) + 1), 0) \
                     FROM jfs_xattr WHERE inode=?",
                    params![ino as i64],
                    |r| r.get(0),
                )?;
                if used as usize + name.len() + 1 > XATTR_LIST_MAX {
                    return Err(Error::NoSpace.into());
                }
                tx.execute(
                    "INSERT INTO jfs_xattr (inode, name, value) VALUES (?,?,?)",
                    params![ino as i64, name, value],
                )?;
            }
        }
        touch_ctime(tx, ino, attr)
    })
}

/// Removes an attribute.
pub(super) fn remove(inner: &Inner, ctx: &Context, ino: Ino, name: &[u8]) -> Result<()> {
    let name = text_name(name)?;
    inner.write(|tx| {
        let attr = check_writable(tx, ctx, ino)?;
        let n = tx.execute(
            "DELETE FROM jfs_xattr WHERE inode=? AND name=?",
            params![ino as i64, name],
        )?;
        if n == 0 {
            return Err(Error::NoXattr.into());
        }
        touch_ctime(tx, ino, attr)
    })
}
