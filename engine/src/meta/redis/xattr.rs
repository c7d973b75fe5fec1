//! Extended attributes on Redis: one hash `x{ino}`, name → value.

use super::Inner;
use super::node;
use super::tx::{Tx, TxError, TxResult};
use crate::error::{Error, Result};
use crate::meta::bounded::XATTR_LIST_MAX;
use crate::meta::rules::{self, MASK_W};
use crate::meta::{Attr, Context, Ino, Timestamp, XattrMode};

/// The longest attribute name Linux accepts (`XATTR_NAME_MAX`).
const MAX_NAME: usize = 255;
/// The largest attribute value Linux accepts (`XATTR_SIZE_MAX`).
const MAX_VALUE: usize = 65536;

fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() {
        return Err(Error::Invalid("an extended attribute needs a name".into()));
    }
    if name.len() > MAX_NAME {
        return Err(Error::Range);
    }
    Ok(())
}

fn missing(tx: &mut Tx<'_>, ino: Ino) -> TxError {
    match node::get(tx, ino) {
        Ok(Some(_)) => TxError::Fs(Error::NoXattr),
        Ok(None) => TxError::Fs(Error::NotFound),
        Err(e) => e,
    }
}

/// Reads one attribute.
/// The kernel asks for `security.capability` before writes (to drop file
/// capabilities): the host-local cache answers repeated asks, and knows a
/// node made here has none.
pub(super) fn get(inner: &Inner, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
    check_name(name)?;
    let cache = inner.cache();
    if let Some(known) = cache.and_then(|c| c.xattr(ino, name)) {
        return known.ok_or(Error::NoXattr);
    }
    let ticket = cache.and_then(|c| c.ticket());
    let r = inner.read(|tx| {
        let key = tx.keys.xattr(ino);
        match tx.hget(&key, name)? {
            Some(v) => Ok(v),
            None => Err(missing(tx, ino)),
        }
    });
    if let Some(c) = cache {
        match &r {
            Ok(v) => c.put_xattr(ticket, ino, name, Some(v)),
            Err(Error::NoXattr) => c.put_xattr(ticket, ino, name, None),
            Err(_) => {}
        }
    }
    r
}

/// Lists attribute names.
pub(super) fn list(inner: &Inner, ino: Ino) -> Result<Vec<Vec<u8>>> {
    inner.read(|tx| {
        node::must_get(tx, ino)?;
        let key = tx.keys.xattr(ino);
        Ok(tx.hgetall(&key)?.into_iter().map(|(n, _)| n).collect())
    })
}

/// The node's attributes, if `ctx` may change its extended attributes.
fn check_writable(tx: &mut Tx<'_>, ctx: &Context, ino: Ino) -> TxResult<Attr> {
    let a = node::must_get(tx, ino)?;
    if a.flags & (rules::FLAG_IMMUTABLE | rules::FLAG_APPEND) != 0 {
        return Err(Error::Perm.into());
    }
    node::check(tx, ctx, &a, MASK_W)?;
    Ok(a)
}

/// An extended attribute changed: the node's ctime moves, as on Linux.
fn touch_ctime(tx: &mut Tx<'_>, ino: Ino, mut a: Attr) {
    a.ctime = Timestamp::now();
    node::put(tx, ino, &a);
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
    check_name(name)?;
    if value.len() > MAX_VALUE {
        return Err(Error::Range);
    }
    inner.write(ino, |tx| {
        let attr = check_writable(tx, ctx, ino)?;
        let key = tx.keys.xattr(ino);
        let cur = tx.hget(&key, name)?;
        match (mode, &cur) {
            (XattrMode::Create, Some(_)) => return Err(Error::Exists.into()),
            (XattrMode::Replace, None) => return Err(Error::NoXattr.into()),
            (_, Some(v)) if v.as_slice() == value => {}
            (_, Some(_)) => tx.hset(&key, name, value),
            (_, None) => {
                let names: Vec<Vec<u8>> = tx.now(redis::cmd("HKEYS").arg(&key))?;
                let used: usize = names.iter().map(|n| n.len() + 1).sum();
                if used + name.len() + 1 > XATTR_LIST_MAX {
                    return Err(Error::NoSpace.into());
                }
                tx.hset(&key, name, value)
            }
        }
        touch_ctime(tx, ino, attr);
        Ok(())
    })
}

/// Removes an attribute.
pub(super) fn remove(inner: &Inner, ctx: &Context, ino: Ino, name: &[u8]) -> Result<()> {
    check_name(name)?;
    inner.write(ino, |tx| {
        let attr = check_writable(tx, ctx, ino)?;
        let key = tx.keys.xattr(ino);
        if tx.hget(&key, name)?.is_none() {
            return Err(Error::NoXattr.into());
        }
        tx.hdel(&key, name);
        touch_ctime(tx, ino, attr);
        Ok(())
    })
}
