//! Extended attributes on Redis: one hash `x{ino}`, name → value.

use super::Inner;
use super::node;
use super::tx::{Tx, TxError};
use crate::error::{Error, Result};
use crate::meta::Ino;
use crate::meta::namespace as ns;

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
