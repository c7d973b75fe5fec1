//! `jfs_node` rows, permission checks, setattr, and the usage counters and
//! directory statistics JuiceFS keeps beside the nodes.

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::{TxError, TxResult, counter};
use crate::error::Error;
use std::sync::Arc;

use crate::meta::acl::{self, Rule};
use crate::meta::rules::{self, align4k};
use crate::meta::space::SpaceRecord;
use crate::meta::{Attr, Context, FileType, Ino, Timestamp};

/// The columns [`from_row`] reads, in order: those of `jfs_node n`, then
/// those of its space record `s` (joined with `space_join!`).
macro_rules! columns {
    () => {
        "n.inode, n.type, n.flags, n.mode, n.uid, n.gid, n.atime, n.mtime, n.ctime, \
         n.atimensec, n.mtimensec, n.ctimensec, n.nlink, n.length, n.rdev, n.parent, \
         n.access_acl_id, n.default_acl_id, s.space, s.length, s.mtime, s.mtimensec"
    };
}

/// Joins a node `n` with its space record `s` (sluice's own table, see
/// [`crate::meta::space`]).
macro_rules! space_join {
    () => {
        "LEFT JOIN sluice_space s ON s.inode=n.inode"
    };
}

/// [`from_row`]'s columns.
pub(super) const COLUMNS: &str = columns!();
/// The join its columns need.
pub(super) const SPACE_JOIN: &str = space_join!();

const SELECT_NODE: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM jfs_node n ",
    space_join!(),
    " WHERE n.inode=?"
);

/// JuiceFS stores a time as microseconds plus the nanoseconds left over.
pub(super) fn split_time(t: Timestamp) -> (i64, i64) {
    let us = t
        .secs
        .saturating_mul(1_000_000)
        .saturating_add(i64::from(t.nsecs / 1000));
    (us, i64::from(t.nsecs % 1000))
}

fn join_time(us: i64, ns: i64) -> Timestamp {
    let secs = us.div_euclid(1_000_000);
    let sub_us = us.rem_euclid(1_000_000);
    let nsecs = (sub_us * 1000 + ns.clamp(0, 999)) as u32;
    Timestamp { secs, nsecs }
}

/// Decodes a row selected with [`COLUMNS`] (starting at column `at`).
pub(super) fn from_row(r: &Row<'_>, at: usize) -> rusqlite::Result<(Ino, Attr)> {
    let ino: i64 = r.get(at)?;
    let code: i64 = r.get(at + 1)?;
    let typ = u8::try_from(code)
        .ok()
        .and_then(FileType::from_code)
        .ok_or_else(|| {
            rusqlite::Error::FromSqlConversionFailure(
                at + 1,
                rusqlite::types::Type::Integer,
                format!("inode {ino} has unknown type {code}").into(),
            )
        })?;
    let attr = Attr {
        flags: r.get::<_, i64>(at + 2)? as u8,
        typ,
        mode: r.get::<_, i64>(at + 3)? as u16,
        uid: r.get::<_, i64>(at + 4)? as u32,
        gid: r.get::<_, i64>(at + 5)? as u32,
        atime: join_time(r.get(at + 6)?, r.get(at + 9)?),
        mtime: join_time(r.get(at + 7)?, r.get(at + 10)?),
        ctime: join_time(r.get(at + 8)?, r.get(at + 11)?),
        nlink: r.get::<_, i64>(at + 12)? as u32,
        length: r.get::<_, i64>(at + 13)? as u64,
        rdev: r.get::<_, Option<i64>>(at + 14)?.unwrap_or(0) as u32,
        parent: r.get::<_, Option<i64>>(at + 15)?.unwrap_or(0) as u64,
        access_acl: r.get::<_, Option<i64>>(at + 16)?.unwrap_or(0) as u32,
        default_acl: r.get::<_, Option<i64>>(at + 17)?.unwrap_or(0) as u32,
        space: None,
    };
    let mut attr = attr;
    if let Some(space) = r.get::<_, Option<i64>>(at + 18)? {
        SpaceRecord {
            space: space as u64,
            length: r.get::<_, i64>(at + 19)? as u64,
            mtime: Timestamp {
                secs: r.get(at + 20)?,
                nsecs: r.get::<_, i64>(at + 21)? as u32,
            },
        }
        .apply(&mut attr);
    }
    Ok((ino as u64, attr))
}

/// The attributes of `ino`, if the node exists.
pub(super) fn get(c: &Connection, ino: Ino) -> TxResult<Option<Attr>> {
    let mut stmt = c.prepare_cached(SELECT_NODE)?;
    Ok(stmt
        .query_row(params![ino as i64], |r| from_row(r, 0).map(|(_, a)| a))
        .optional()?)
}

/// The attributes of `ino`, or `NotFound`.
pub(super) fn must_get(c: &Connection, ino: Ino) -> TxResult<Attr> {
    get(c, ino)?.ok_or(TxError::Fs(Error::NotFound))
}

/// Inserts a new node.
pub(super) fn insert(c: &Connection, ino: Ino, a: &Attr) -> TxResult<()> {
    let (at, atn) = split_time(a.atime);
    let (mt, mtn) = split_time(a.mtime);
    let (ct, ctn) = split_time(a.ctime);
    c.prepare_cached(
        "INSERT INTO jfs_node (inode, type, flags, mode, uid, gid, atime, mtime, ctime, \
         atimensec, mtimensec, ctimensec, nlink, length, rdev, parent, access_acl_id, \
         default_acl_id, tier_id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,0)",
    )?
    .execute(params![
        ino as i64,
        a.typ as u8,
        a.flags,
        a.mode,
        a.uid,
        a.gid,
        at,
        mt,
        ct,
        atn,
        mtn,
        ctn,
        a.nlink,
        a.length as i64,
        a.rdev,
        a.parent as i64,
        a.access_acl,
        a.default_acl
    ])?;
    if a.space.is_some() {
        put_space(c, ino, a)?;
    }
    Ok(())
}

/// Writes a node's space record, or deletes it when the node has none.
fn put_space(c: &Connection, ino: Ino, a: &Attr) -> TxResult<()> {
    match SpaceRecord::of(a) {
        Some(r) => {
            c.prepare_cached(
                "INSERT OR REPLACE INTO sluice_space (inode, space, length, mtime, mtimensec) \
                 VALUES (?,?,?,?,?)",
            )?
            .execute(params![
                ino as i64,
                r.space as i64,
                r.length as i64,
                r.mtime.secs,
                r.mtime.nsecs
            ])?;
        }
        None => {
            c.prepare_cached("DELETE FROM sluice_space WHERE inode=?")?
                .execute(params![ino as i64])?;
        }
    }
    Ok(())
}

/// Writes back every mutable column of a node.
pub(super) fn update(c: &Connection, ino: Ino, a: &Attr) -> TxResult<()> {
    let (at, atn) = split_time(a.atime);
    let (mt, mtn) = split_time(a.mtime);
    let (ct, ctn) = split_time(a.ctime);
    let n = c
        .prepare_cached(
            "UPDATE jfs_node SET flags=?, mode=?, uid=?, gid=?, atime=?, mtime=?, ctime=?, \
             atimensec=?, mtimensec=?, ctimensec=?, nlink=?, length=?, rdev=?, parent=?, \
             access_acl_id=?, default_acl_id=? WHERE inode=?",
        )?
        .execute(params![
            a.flags,
            a.mode,
            a.uid,
            a.gid,
            at,
            mt,
            ct,
            atn,
            mtn,
            ctn,
            a.nlink,
            a.length as i64,
            a.rdev,
            a.parent as i64,
            a.access_acl,
            a.default_acl,
            ino as i64
        ])?;
    if n == 0 {
        return Err(Error::NotFound.into());
    }
    put_space(c, ino, a)
}

/// Deletes a node with its symlink target and extended attributes.
pub(super) fn delete(c: &Connection, ino: Ino) -> TxResult<()> {
    let i = ino as i64;
    c.execute("DELETE FROM jfs_node WHERE inode=?", params![i])?;
    c.execute("DELETE FROM jfs_symlink WHERE inode=?", params![i])?;
    c.execute("DELETE FROM jfs_xattr WHERE inode=?", params![i])?;
    c.execute("DELETE FROM sluice_space WHERE inode=?", params![i])?;
    Ok(())
}

/// Adds to the volume's usage counters (`usedSpace`, `totalInodes`);
/// growth past the volume's `Capacity` or `Inodes` fails with `NoSpace`.
pub(super) fn add_usage(tx: &super::Tx<'_>, space: i64, inodes: i64) -> TxResult<()> {
    {
        let mut usage = tx.usage.borrow_mut();
        tx.quotas.check_volume(&usage, space, inodes)?;
        usage.space += space;
        usage.inodes += inodes;
    }
    if space != 0 {
        super::incr_counter(tx, counter::USED_SPACE, space)?;
    }
    if inodes != 0 {
        super::incr_counter(tx, counter::TOTAL_INODES, inodes)?;
    }
    Ok(())
}

/// Counts a change below directory `dir` in the quotas of it and its
/// ancestors; growth past one fails with `QuotaExceeded` (unless the
/// transaction checks before, as a rename does). Trash directories count
/// for no quota.
fn add_quota_usage(tx: &super::Tx<'_>, dir: Ino, space: i64, inodes: i64) -> TxResult<()> {
    if !tx.quotas.has_dir_quotas() || crate::meta::trash::is_trash(dir) {
        return Ok(());
    }
    let dirs = tx
        .quotas
        .quota_dirs(dir, |ino| Ok::<_, TxError>(get(tx, ino)?.map(|a| a.parent)))?;
    if dirs.is_empty() {
        return Ok(());
    }
    let mut usage = tx.usage.borrow_mut();
    if tx.check_quota {
        tx.quotas.check_dirs(&dirs, &usage, space, inodes)?;
    }
    usage.add_dirs(&dirs, space, inodes);
    Ok(())
}

/// Adds to a directory's `jfs_dir_stats` row; a directory without a row gets
/// one computed from its entries (as JuiceFS's sync does), which already
/// includes the change because it runs after it.
pub(super) fn add_dir_stat(
    tx: &super::Tx<'_>,
    dir: Ino,
    length: i64,
    space: i64,
    inodes: i64,
) -> TxResult<()> {
    if !tx.dir_stats || dir == crate::meta::TRASH_INO || (length == 0 && space == 0 && inodes == 0)
    {
        return Ok(());
    }
    add_quota_usage(tx, dir, space, inodes)?;
    let n = tx.execute(
        "UPDATE jfs_dir_stats SET data_length=data_length+?, used_space=used_space+?, \
         used_inodes=used_inodes+? WHERE inode=?",
        params![length, space, inodes, dir as i64],
    )?;
    if n == 0 {
        let Some(attr) = get(tx, dir)? else {
            return Ok(());
        };
        if attr.typ != FileType::Directory {
            return Ok(());
        }
        let (len, spc, cnt) = compute_dir_stat(tx, dir)?;
        tx.execute(
            "INSERT INTO jfs_dir_stats (inode, data_length, used_space, used_inodes) \
             VALUES (?,?,?,?)",
            params![dir as i64, len, spc, cnt],
        )?;
    }
    Ok(())
}

/// A directory's statistics computed from its entries (JuiceFS `calcDirStat`).
pub(super) fn compute_dir_stat(c: &Connection, dir: Ino) -> TxResult<(i64, i64, i64)> {
    let mut stmt = c.prepare(
        "SELECT n.type, n.length FROM jfs_edge e JOIN jfs_node n ON e.inode=n.inode \
         WHERE e.parent=?",
    )?;
    let mut rows = stmt.query(params![dir as i64])?;
    let (mut len, mut space, mut count) = (0i64, 0i64, 0i64);
    while let Some(r) = rows.next()? {
        let typ: i64 = r.get(0)?;
        let l = if typ == FileType::File as i64 {
            r.get::<_, i64>(1)? as u64
        } else {
            0
        };
        len += l as i64;
        space += align4k(l);
        count += 1;
    }
    Ok((len, space, count))
}

/// Every directory holding an entry for `ino`, with how many entries.
pub(super) fn parents(c: &Connection, ino: Ino) -> TxResult<Vec<(Ino, i64)>> {
    let mut stmt =
        c.prepare("SELECT parent, count(*) FROM jfs_edge WHERE inode=? GROUP BY parent")?;
    let rows = stmt.query_map(params![ino as i64], |r| {
        Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)?))
    })?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}

/// The access ACL of a node, when it has one.
pub(super) fn access_rule(c: &Connection, a: &Attr) -> TxResult<Option<Arc<Rule>>> {
    if a.access_acl == 0 {
        return Ok(None);
    }
    rule(c, a.access_acl).map(Some)
}

/// [`rules::check_access`] of a node, its access ACL read where it has one.
pub(super) fn check(c: &Connection, ctx: &Context, a: &Attr, mask: u8) -> TxResult<()> {
    let acl = access_rule(c, a)?;
    Ok(rules::check_access(ctx, a, acl.as_deref(), mask)?)
}

/// The ACL rule stored under `id` (a `jfs_acl` row).
pub(super) fn rule(c: &Connection, id: u32) -> TxResult<Arc<Rule>> {
    let row = c
        .prepare_cached(
            "SELECT owner, `group`, mask, other, named_users, named_groups FROM jfs_acl \
             WHERE id=?",
        )?
        .query_row(params![id], |r| {
            Ok((
                r.get::<_, Option<i64>>(0)?.unwrap_or(0xFFFF) as u16,
                r.get::<_, Option<i64>>(1)?.unwrap_or(0xFFFF) as u16,
                r.get::<_, Option<i64>>(2)?.unwrap_or(0xFFFF) as u16,
                r.get::<_, Option<i64>>(3)?.unwrap_or(0xFFFF) as u16,
                r.get::<_, Option<Vec<u8>>>(4)?.unwrap_or_default(),
                r.get::<_, Option<Vec<u8>>>(5)?.unwrap_or_default(),
            ))
        })
        .optional()?;
    let Some((owner, group, mask, other, users, groups)) = row else {
        return Err(Error::Corrupt(format!("ACL {id} is named by a node but not stored")).into());
    };
    let what = format!("ACL {id}");
    Ok(Arc::new(Rule {
        owner,
        group,
        mask,
        other,
        named_users: acl::decode_named(&users, &what)?,
        named_groups: acl::decode_named(&groups, &what)?,
    }))
}

/// The id of a rule with `rule`'s content, stored now if none is (JuiceFS
/// shares one id among identical rules); 0 for a rule that is no ACL.
pub(super) fn store_rule(c: &Connection, rule: &Rule) -> TxResult<u32> {
    if rule.is_empty() {
        return Ok(0);
    }
    let users = acl::encode_named(&rule.named_users);
    let groups = acl::encode_named(&rule.named_groups);
    let found: Option<i64> = c
        .prepare_cached(
            "SELECT id FROM jfs_acl WHERE owner=? AND `group`=? AND mask=? AND other=? \
             AND named_users=? AND named_groups=? LIMIT 1",
        )?
        .query_row(
            params![rule.owner, rule.group, rule.mask, rule.other, users, groups],
            |r| r.get(0),
        )
        .optional()?;
    if let Some(id) = found {
        return Ok(id as u32);
    }
    c.prepare_cached(
        "INSERT INTO jfs_acl (owner, `group`, mask, other, named_users, named_groups) \
         VALUES (?,?,?,?,?,?)",
    )?
    .execute(params![
        rule.owner, rule.group, rule.mask, rule.other, users, groups
    ])?;
    u32::try_from(c.last_insert_rowid())
        .map_err(|_| Error::Corrupt("the jfs_acl ids ran past 2^32".into()).into())
}
