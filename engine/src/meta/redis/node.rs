//! Nodes (`i{ino}`), hard-link parents (`p{ino}`), the usage counters and
//! the directory statistics JuiceFS keeps beside them.

use super::codec::{attr_tier, decode_attr, encode_attr};
use super::keys::counter;
use super::tx::{Read, Tx, TxError, TxResult};
use std::sync::Arc;

use crate::error::Error;
use crate::meta::acl::Rule;
use crate::meta::rules;
use crate::meta::space::SpaceRecord;
use crate::meta::{Attr, Context, Ino, TRASH_INO};

/// The attributes of `ino`, if the node exists, with its space record
/// (read in the same round trip: [`Tx::prefetch`] reads a node's record
/// with it).
pub(super) fn get(tx: &mut Tx<'_>, ino: Ino) -> TxResult<Option<Attr>> {
    let key = tx.keys.inode(ino);
    tx.prefetch(&[Read::Get(&key)])?;
    let Some(raw) = tx.get(&key)? else {
        return Ok(None);
    };
    let space = tx.get(&tx.keys.space(ino))?;
    Ok(Some(decode(ino, &raw, space.as_deref())?))
}

/// Decodes a node's attributes, with its space record if one was read.
pub(super) fn decode(ino: Ino, raw: &[u8], space: Option<&[u8]>) -> crate::error::Result<Attr> {
    let mut a = decode_attr(raw).ok_or_else(|| {
        Error::Corrupt(format!(
            "the attributes of inode {ino} ({} bytes) cannot be decoded",
            raw.len()
        ))
    })?;
    if let Some(r) = space.and_then(SpaceRecord::decode) {
        r.apply(&mut a);
    }
    Ok(a)
}

/// The attributes of `ino`, or `NotFound`.
pub(super) fn must_get(tx: &mut Tx<'_>, ino: Ino) -> TxResult<Attr> {
    get(tx, ino)?.ok_or(TxError::Fs(Error::NotFound))
}

/// Writes a node's attributes, keeping the storage tier JuiceFS stored,
/// and its space record: written when it has one, deleted unless it is
/// known to have none.
pub(super) fn put(tx: &mut Tx<'_>, ino: Ino, a: &Attr) {
    let key = tx.keys.inode(ino);
    let tier = tx.raw(&key).map(attr_tier).unwrap_or(0);
    tx.set(&key, &encode_attr(a, tier));
    let space = tx.keys.space(ino);
    match SpaceRecord::of(a) {
        Some(r) => tx.set(&space, &r.encode()),
        None if tx.known_absent(&space) => {}
        None => tx.del(&space),
    }
}

/// The access ACL of a node, when it has one.
pub(super) fn access_rule(tx: &mut Tx<'_>, a: &Attr) -> TxResult<Option<Arc<Rule>>> {
    if a.access_acl == 0 {
        return Ok(None);
    }
    rule(tx, a.access_acl).map(Some)
}

/// [`rules::check_access`] of a node, its access ACL read where it has one.
pub(super) fn check(tx: &mut Tx<'_>, ctx: &Context, a: &Attr, mask: u8) -> TxResult<()> {
    let acl = access_rule(tx, a)?;
    Ok(rules::check_access(ctx, a, acl.as_deref(), mask)?)
}

/// The ACL rule stored under `id` (a field of the `acl` hash). Rules never
/// change, so one read once is kept ([`acl::RuleCache`]) and needs no
/// watch.
pub(super) fn rule(tx: &mut Tx<'_>, id: u32) -> TxResult<Arc<Rule>> {
    if let Some(r) = tx.acls.get(id) {
        return Ok(r);
    }
    let key = tx.keys.acl();
    let raw: Option<Vec<u8>> = tx.now(redis::cmd("HGET").arg(&key).arg(id))?;
    let raw = raw.ok_or_else(|| {
        TxError::Fs(Error::Corrupt(format!(
            "ACL {id} is named by a node but not stored in {key}"
        )))
    })?;
    let rule = Rule::decode(&raw, &format!("ACL {id} in {key}"))?;
    Ok(tx.acls.put(id, rule))
}

/// The id of a rule with `rule`'s content, stored now if this client knows
/// none (JuiceFS shares one id among identical rules); 0 for a rule that is
/// no ACL. A new rule is written at once, outside the transaction, under a
/// new id from `aclMaxId`: a transaction that then fails leaves an unused
/// rule behind, which harms nothing (rules are never removed, as in
/// JuiceFS), while a rule a committed node names always exists.
pub(super) fn store_rule(tx: &mut Tx<'_>, rule: &Rule) -> TxResult<u32> {
    if rule.is_empty() {
        return Ok(0);
    }
    if let Some(id) = tx.acls.id_of(rule) {
        return Ok(id);
    }
    let counter = tx.keys.counter(counter::ACL_MAX_ID);
    let id: i64 = tx.now(redis::cmd("INCR").arg(&counter))?;
    let id = u32::try_from(id)
        .map_err(|_| TxError::Fs(Error::Corrupt(format!("{counter} is past 2^32: {id}"))))?;
    let key = tx.keys.acl();
    let _: i64 = tx.now(redis::cmd("HSETNX").arg(&key).arg(id).arg(rule.encode()))?;
    tx.acls.put(id, rule.clone());
    Ok(id)
}

/// Deletes a node with its symlink target, extended attributes and parents.
pub(super) fn delete(tx: &mut Tx<'_>, ino: Ino) {
    for key in [
        tx.keys.inode(ino),
        tx.keys.symlink(ino),
        tx.keys.xattr(ino),
        tx.keys.parent(ino),
        tx.keys.space(ino),
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
