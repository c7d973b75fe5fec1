//! `jfs_node` rows, permission checks, setattr, and the usage counters and
//! directory statistics JuiceFS keeps beside the nodes.

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::{Inner, TxError, TxResult, align4k, counter};
use crate::error::{Error, Result};
use crate::meta::{Attr, Context, FileType, Ino, SetAttr, TimeChange, Timestamp};

/// Read permission bit of a mode triplet.
pub(crate) const MASK_R: u8 = 4;
/// Write permission bit of a mode triplet.
pub(crate) const MASK_W: u8 = 2;
/// Execute/search permission bit of a mode triplet.
pub(crate) const MASK_X: u8 = 1;
/// JuiceFS `FlagImmutable`.
pub(crate) const FLAG_IMMUTABLE: u8 = 1;
/// JuiceFS `FlagAppend`.
pub(crate) const FLAG_APPEND: u8 = 2;

/// The columns [`from_row`] reads, in order.
pub(super) const COLUMNS: &str = "inode, type, flags, mode, uid, gid, atime, mtime, ctime, \
     atimensec, mtimensec, ctimensec, nlink, length, rdev, parent";

const SELECT_NODE: &str = "SELECT inode, type, flags, mode, uid, gid, atime, mtime, ctime, \
     atimensec, mtimensec, ctimensec, nlink, length, rdev, parent FROM jfs_node WHERE inode=?";

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
    };
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
         default_acl_id, tier_id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,0,0,0)",
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
        a.parent as i64
    ])?;
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
             atimensec=?, mtimensec=?, ctimensec=?, nlink=?, length=?, rdev=?, parent=? \
             WHERE inode=?",
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
            ino as i64
        ])?;
    if n == 0 {
        return Err(Error::NotFound.into());
    }
    Ok(())
}

/// Deletes a node with its symlink target and extended attributes.
pub(super) fn delete(c: &Connection, ino: Ino) -> TxResult<()> {
    let i = ino as i64;
    c.execute("DELETE FROM jfs_node WHERE inode=?", params![i])?;
    c.execute("DELETE FROM jfs_symlink WHERE inode=?", params![i])?;
    c.execute("DELETE FROM jfs_xattr WHERE inode=?", params![i])?;
    Ok(())
}

pub(crate) fn in_group(ctx: &Context, gid: u32) -> bool {
    ctx.gid == gid || ctx.gids.contains(&gid)
}

/// The permission triplet that applies to `ctx` on a node (JuiceFS `accessMode`).
fn access_mode(ctx: &Context, a: &Attr) -> u8 {
    if ctx.uid == 0 {
        return 7;
    }
    let m = a.mode;
    if ctx.uid == a.uid {
        ((m >> 6) & 7) as u8
    } else if in_group(ctx, a.gid) {
        ((m >> 3) & 7) as u8
    } else {
        (m & 7) as u8
    }
}

/// Whether `ctx` skips permission checks (root or engine-internal work).
pub(crate) fn is_root(ctx: &Context) -> bool {
    ctx.privileged || ctx.uid == 0
}

/// Fails with `Access` unless `ctx` has every bit of `mask` on the node.
/// Root passes every check but one, as in Linux's `generic_permission`: it
/// may execute a non-directory only when some execute bit is set.
pub(crate) fn check_access(ctx: &Context, a: &Attr, mask: u8) -> Result<()> {
    let ok = if ctx.privileged {
        true
    } else if ctx.uid == 0 {
        mask & MASK_X == 0 || a.typ == FileType::Directory || a.mode & 0o111 != 0
    } else {
        access_mode(ctx, a) & mask == mask
    };
    if ok { Ok(()) } else { Err(Error::Access) }
}

/// The kernel's `__FMODE_EXEC` in an open's flags: the open is execve(2)
/// (or uselib) loading the file, not a read.
pub(crate) const FMODE_EXEC: u32 = 0x20;

/// The permission an open with `flags` needs, as Linux's `may_open`: read,
/// write or both by `O_ACCMODE`; an exec open (`O_RDONLY|__FMODE_EXEC`, the
/// FUSE_OPEN execve sends) needs execute instead of read, so a file with
/// `--x` runs for a user who may not read it.
pub(crate) fn open_mask(flags: u32) -> u8 {
    match flags & libc::O_ACCMODE as u32 {
        x if x == libc::O_WRONLY as u32 => MASK_W,
        x if x == libc::O_RDWR as u32 => MASK_R | MASK_W,
        _ if flags & FMODE_EXEC != 0 => MASK_X,
        _ => MASK_R,
    }
}

/// Whether `ctx` may open a node with `attr` with `flags` (open(2) and
/// execve(2)): the mode (see [`open_mask`]), and the immutable and
/// append-only flags and the trash, which refuse writing opens and
/// truncation.
pub(crate) fn check_open(ctx: &Context, attr: &Attr, flags: u32) -> Result<()> {
    let mask = open_mask(flags);
    check_access(ctx, attr, mask)?;
    let writing = mask & MASK_W != 0;
    if writing && (attr.flags & FLAG_IMMUTABLE != 0 || attr.parent > crate::meta::TRASH_INO) {
        return Err(Error::Perm);
    }
    if attr.flags & FLAG_APPEND != 0
        && ((writing && flags & libc::O_APPEND as u32 == 0) || flags & libc::O_TRUNC as u32 != 0)
    {
        return Err(Error::Perm);
    }
    Ok(())
}

/// The sticky-directory rule: in a sticky directory only the owner of the
/// entry, the owner of the directory or root may remove or rename it.
pub(crate) fn check_sticky(ctx: &Context, dir: &Attr, entry: &Attr) -> Result<()> {
    if !is_root(ctx) && dir.mode & 0o1000 != 0 && ctx.uid != dir.uid && ctx.uid != entry.uid {
        return Err(Error::Access);
    }
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
    if !tx.quotas.has_dir_quotas() || super::is_trash(dir) {
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

/// Applies a length/space change of a file to the usage counter and to the
/// statistics of every directory holding it (JuiceFS `updateParentStat`).
pub(super) fn add_file_stat(
    tx: &super::Tx<'_>,
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

/// Every directory holding an entry for `ino`, with how many entries.
pub(super) fn parents(c: &Connection, ino: Ino) -> TxResult<Vec<(Ino, i64)>> {
    let mut stmt =
        c.prepare("SELECT parent, count(*) FROM jfs_edge WHERE inode=? GROUP BY parent")?;
    let rows = stmt.query_map(params![ino as i64], |r| {
        Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)?))
    })?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}

fn resolve_time(t: TimeChange, now: Timestamp) -> Timestamp {
    match t {
        TimeChange::At(ts) => ts,
        TimeChange::Now => now,
    }
}

/// setattr with Linux's rules ([`apply_setattr`]).
pub(super) fn setattr(inner: &Inner, ctx: &Context, ino: Ino, set: &SetAttr) -> Result<Attr> {
    inner.write(|tx| {
        let cur = must_get(tx, ino)?;
        match apply_setattr(ctx, &cur, set)? {
            Some(a) => {
                update(tx, ino, &a)?;
                Ok(a)
            }
            None => Ok(cur),
        }
    })
}

/// Setuid bit.
const S_ISUID: u16 = 0o4000;
/// Setgid bit.
const S_ISGID: u16 = 0o2000;
/// Group-execute bit.
const S_IXGRP: u16 = 0o010;

/// Whether a change by `ctx` drops the setgid bit of `a` (Linux's
/// `setattr_should_drop_sgid`): when it is set and the file is
/// group-executable (a real setgid program), or when the caller is neither
/// in the file's group nor root (setgid without group-execute marks
/// mandatory locking, which only outsiders lose).
fn drops_sgid(ctx: &Context, a: &Attr) -> bool {
    a.mode & S_ISGID != 0 && (a.mode & S_IXGRP != 0 || (!is_root(ctx) && !in_group(ctx, a.gid)))
}

/// The setuid/setgid bits a change of a regular file's data (write,
/// truncate, fallocate) by `ctx` clears, as Linux's
/// `setattr_should_drop_suidgid`: none for root (CAP_FSETID), else setuid
/// always and setgid by [`drops_sgid`].
pub(crate) fn setid_bits_to_kill(ctx: &Context, a: &Attr) -> u16 {
    if is_root(ctx) || a.typ != FileType::File {
        return 0;
    }
    let mut kill = a.mode & S_ISUID;
    if drops_sgid(ctx, a) {
        kill |= S_ISGID;
    }
    kill
}

/// The attributes `set` makes of `cur` for `ctx` (engine-independent), or
/// `None` when nothing changes. Linux's `setattr_prepare` rules: only root
/// changes the owner (the owner may name itself), the owner the group (to
/// its group or one it is in), only the owner the mode (setgid dropped when
/// the owner is not in the group) — except a bare clear of setuid/setgid by
/// a writer, which the kernel sends on a write without
/// `HANDLE_KILLPRIV_V2`; explicit times need ownership, "now" write access.
/// A chown clears setuid/setgid as Linux does; `kill_suidgid` clears them as
/// a write does ([`setid_bits_to_kill`]).
pub(crate) fn apply_setattr(ctx: &Context, cur: &Attr, set: &SetAttr) -> Result<Option<Attr>> {
    if cur.parent > crate::meta::TRASH_INO {
        // A file in the trash keeps its attributes; a write through a
        // handle still open to it goes on without dropping anything.
        let kill_only = SetAttr {
            kill_suidgid: true,
            ..SetAttr::default()
        };
        if *set == kill_only {
            return Ok(None);
        }
        return Err(Error::Perm);
    }
    let root = is_root(ctx);
    let owner = root || ctx.uid == cur.uid;
    let now = Timestamp::now();
    let mut a = cur.clone();
    let mut changed = false;
    // Linux's chown_ok: the owner may "change" the owner to itself, root to
    // anyone; a no-op chown by anyone else is refused all the same.
    if let Some(uid) = set.uid {
        if !root && (ctx.uid != cur.uid || uid != cur.uid) {
            return Err(Error::Perm);
        }
        a.uid = uid;
        changed = true;
    }
    // chgrp_ok: the owner may set the group it has or one it is in.
    if let Some(gid) = set.gid {
        if !root && (ctx.uid != cur.uid || (gid != cur.gid && !in_group(ctx, gid))) {
            return Err(Error::Perm);
        }
        a.gid = gid;
        changed = true;
    }
    if (set.uid.is_some() || set.gid.is_some()) && a.typ != FileType::Directory {
        // chown(2) of a non-directory clears setuid, even by root, and
        // setgid by the rule writes follow (judged on the group before
        // the change), as Linux's chown_common.
        if drops_sgid(ctx, cur) {
            a.mode &= !S_ISGID;
        }
        a.mode &= !S_ISUID;
    }
    if let Some(mode) = set.mode {
        let mut mode = mode & 0o7777;
        if !owner {
            // Without FUSE_HANDLE_KILLPRIV_V2 (kernels before 5.11) the
            // kernel clears setuid/setgid before a write or truncate by
            // sending SETATTR(mode) with the writer's credentials. Accept
            // exactly that: a change that only clears those bits, from a
            // caller that may write the file (and so could clear them by
            // writing it).
            let clears_only = mode != cur.mode
                && mode | S_ISUID | S_ISGID == cur.mode | S_ISUID | S_ISGID
                && mode & !cur.mode == 0;
            if !clears_only || cur.typ != FileType::File || check_access(ctx, cur, MASK_W).is_err()
            {
                return Err(Error::Perm);
            }
        } else if !root && mode & S_ISGID != 0 && !in_group(ctx, a.gid) {
            mode &= !S_ISGID;
        }
        a.mode = mode;
        changed = true;
    }
    if set.kill_suidgid {
        let kill = setid_bits_to_kill(ctx, &a);
        if a.mode & kill != 0 {
            a.mode &= !kill;
            changed = true;
        }
    }
    for (want, slot) in [(set.atime, &mut a.atime), (set.mtime, &mut a.mtime)] {
        let Some(t) = want else { continue };
        match t {
            TimeChange::Now => {
                if !owner && check_access(ctx, cur, MASK_W).is_err() {
                    return Err(Error::Access);
                }
            }
            TimeChange::At(_) => {
                if !owner {
                    return Err(Error::Perm);
                }
            }
        }
        *slot = resolve_time(t, now);
        changed = true;
    }
    if !changed {
        return Ok(None);
    }
    a.ctime = now;
    Ok(Some(a))
}
