//! Nodes (`i{ino}`), hard-link parents (`p{ino}`), the usage counters and
//! the directory statistics JuiceFS keeps beside them.

use super::codec::{attr_tail, decode_attr, encode_attr};
use super::keys::counter;
use super::tx::{Tx, TxError, TxResult};
use crate::error::Error;
use crate::meta::rules::align4k;
use crate::meta::{Attr, FileType, Ino, TRASH_INO};

/// The attributes of `ino`, if the node exists.
pub(super) fn get(tx: &mut Tx<'_>, ino: Ino) -> TxResult<Option<Attr>> {
    let key = tx.keys.inode(ino);
    match tx.get(&key)? {
        None => Ok(None),
        Some(raw) => decode_attr(&raw).map(Some).ok_or_else(|| {
            TxError::Fs(Error::Corrupt(format!(
                "the attributes of inode {ino} ({} bytes) cannot be decoded",
                raw.len()
            )))
        }),
    }
}

/// The attributes of `ino`, or `NotFound`.
pub(super) fn must_get(tx: &mut Tx<'_>, ino: Ino) -> TxResult<Attr> {
    get(tx, ino)?.ok_or(TxError::Fs(Error::NotFound))
}

/// Writes a node's attributes, keeping what JuiceFS stored after the fixed
/// fields (ACL ids, tier).
pub(super) fn put(tx: &mut Tx<'_>, ino: Ino, a: &Attr) {
    let key = tx.keys.inode(ino);
    let tail = tx.raw(&key).map(attr_tail).unwrap_or_default().to_vec();
    tx.set(&key, &encode_attr(a, &tail));
}

/// Deletes a node with its symlink target, extended attributes and parents.
pub(super) fn delete(tx: &mut Tx<'_>, ino: Ino) {
    for key in [
        tx.keys.inode(ino),
        tx.keys.symlink(ino),
        tx.keys.xattr(ino),
        tx.keys.parent(ino),
    ] {
        tx.del(&key);
    }
}

/// Adds to the volume's usage counters; growth past the volume's
/// `Capacity` or `Inodes` fails with `NoSpace`.
pub(super) fn add_usage(tx: &mut Tx<'_>, space: i64, inodes: i64) -> TxResult<()> {
    tx.quotas.check_volume(&tx.usage, space, inodes)?;
    tx.usage.space += space;
    tx.usage.inodes += inodes;
    if space != 0 {
        let k = tx.keys.counter(counter::USED_SPACE);
        tx.incrby(&k, space);
    }
    if inodes != 0 {
        let k = tx.keys.counter(counter::TOTAL_INODES);
        tx.incrby(&k, inodes);
    }
    Ok(())
}

/// Counts a change below directory `dir` in the quotas of it and its
/// ancestors; growth past one fails with `QuotaExceeded` (unless the
/// transaction checks before, as a rename does). Trash directories count
/// for no quota. Parents missing from the cache are read outside the
/// transaction (a directory's parent changes only by a rename, which the
/// cache follows).
fn add_quota_usage(tx: &mut Tx<'_>, dir: Ino, space: i64, inodes: i64) -> TxResult<()> {
    if !tx.quotas.has_dir_quotas() || dir >= TRASH_INO {
        return Ok(());
    }
    let quotas = tx.quotas;
    let dirs = quotas.quota_dirs(dir, |ino| -> TxResult<Option<Ino>> {
        let key = tx.keys.inode(ino);
        let raw: Option<Vec<u8>> = tx.now(redis::cmd("GET").arg(&key))?;
        Ok(raw.and_then(|r| decode_attr(&r)).map(|a| a.parent))
    })?;
    if dirs.is_empty() {
        return Ok(());
    }
    if tx.check_quota {
        quotas.check_dirs(&dirs, &tx.usage, space, inodes)?;
    }
    tx.usage.add_dirs(&dirs, space, inodes);
    Ok(())
}

/// Creates a new directory's statistics at zero (JuiceFS does so on mkdir).
pub(super) fn new_dir_stats(tx: &mut Tx<'_>, dir: Ino) {
    let field = dir.to_string();
    for k in [
        tx.keys.dir_used_inodes(),
        tx.keys.dir_data_length(),
        tx.keys.dir_used_space(),
    ] {
        tx.hset(&k, field.as_bytes(), b"0");
    }
}

/// Drops a removed directory's statistics and quota.
pub(super) fn drop_dir_stats(tx: &mut Tx<'_>, dir: Ino) {
    let field = dir.to_string();
    let mut keys = vec![
        tx.keys.dir_data_length(),
        tx.keys.dir_used_space(),
        tx.keys.dir_used_inodes(),
    ];
    keys.extend(tx.keys.dir_quota_keys());
    for k in keys {
        tx.hdel(&k, field.as_bytes());
    }
}

/// Adds to a directory's statistics where the directory has them, as one
/// script queued with the transaction's writes: a directory without them is
/// left alone (JuiceFS computes missing statistics when they are read), and
/// asking first would cost a round trip. The script is sent whole (`EVAL`,
/// a hundred bytes): inside `MULTI` a missing cached script (`NOSCRIPT`
/// after a restart or a failover) would fail that one command while the
/// rest of the transaction is applied.
const ADD_DIR_STAT: &str = "if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then \
redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2]) \
redis.call('HINCRBY', KEYS[2], ARGV[1], ARGV[3]) \
redis.call('HINCRBY', KEYS[3], ARGV[1], ARGV[4]) end return 0";

/// Adds to a directory's statistics (see [`ADD_DIR_STAT`]).
pub(super) fn add_dir_stat(
    tx: &mut Tx<'_>,
    dir: Ino,
    length: i64,
    space: i64,
    inodes: i64,
) -> TxResult<()> {
    if !tx.dir_stats || dir == TRASH_INO || (length == 0 && space == 0 && inodes == 0) {
        return Ok(());
    }
    add_quota_usage(tx, dir, space, inodes)?;
    let mut c = redis::cmd("EVAL");
    c.arg(ADD_DIR_STAT)
        .arg(3)
        .arg(tx.keys.dir_used_space())
        .arg(tx.keys.dir_data_length())
        .arg(tx.keys.dir_used_inodes())
        .arg(dir.to_string())
        .arg(space)
        .arg(length)
        .arg(inodes);
    tx.cmd(c);
    Ok(())
}

/// Every directory holding an entry for a hard-linked node, with how many.
pub(super) fn parents(tx: &mut Tx<'_>, ino: Ino) -> TxResult<Vec<(Ino, i64)>> {
    let key = tx.keys.parent(ino);
    Ok(tx
        .hgetall(&key)?
        .into_iter()
        .filter_map(|(p, n)| {
            let p: Ino = std::str::from_utf8(&p).ok()?.parse().ok()?;
            let n: i64 = std::str::from_utf8(&n).ok()?.parse().ok()?;
            (n > 0).then_some((p, n))
        })
        .collect())
}

/// Counts one more (or fewer) link of `ino` from `dir` in `p{ino}`.
pub(super) fn add_parent(tx: &mut Tx<'_>, ino: Ino, dir: Ino, by: i64) {
    let key = tx.keys.parent(ino);
    tx.hincrby(&key, dir.to_string().as_bytes(), by);
}

/// Applies a length/space change of a file to the usage counter and to the
/// statistics of every directory holding it.
pub(super) fn add_file_stat(
    tx: &mut Tx<'_>,
    ino: Ino,
    attr: &Attr,
    length: i64,
    space: i64,
) -> TxResult<()> {
    if length == 0 && space == 0 {
        return Ok(());
    }
    add_usage(tx, space, 0)?;
    if attr.nlink == 0 {
        return Ok(());
    }
    if attr.parent > 0 {
        return add_dir_stat(tx, attr.parent, length, space, 0);
    }
    for (parent, links) in parents(tx, ino)? {
        add_dir_stat(tx, parent, length * links, space * links, 0)?;
    }
    Ok(())
}

/// What an entry contributes to its directory's statistics.
pub(super) fn entry_stat(a: &Attr) -> (i64, i64, i64) {
    let len = if a.typ == FileType::File { a.length } else { 0 };
    (len as i64, align4k(len), 1)
}
