//! Extended attributes on Redis: one hash `x{ino}`, name → value.

use super::Inner;
use super::namespace::Ns;
use super::node;
use super::tx::{Tx, TxError};
use crate::error::{Error, Result};
use crate::meta::namespace as ns;
use crate::meta::{Context, Ino, XattrMode};

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
    ns::check_xattr(name, None)?;
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
    inner.write(ino, |tx| {
        ns::set_xattr(&mut Ns::new(tx, inner), ctx, ino, name, value, mode)
    })
}

/// Removes an attribute.
pub(super) fn remove(inner: &Inner, ctx: &Context, ino: Ino, name: &[u8]) -> Result<()> {
    ns::check_xattr(name, None)?;
    inner.write(ino, |tx| {
        ns::remove_xattr(&mut Ns::new(tx, inner), ctx, ino, name)
    })
}
