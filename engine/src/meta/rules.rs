//! The POSIX rules both metadata engines apply, written once: permission
//! checks (the mode triplets, root, open modes, the sticky bit, the
//! immutable and append-only flags), setattr with Linux's set-id rules, and
//! what a write, truncate or chown clears. Pure functions of attributes and
//! the caller: the engines read the nodes, these decide, the engines write.

use crate::error::{Error, Result};
use crate::format::Format;
use crate::meta::acl::{AclType, Rule};
use crate::meta::{
    Attr, Context, Entry, FileType, Ino, MAX_NAME_LEN, SetAttr, StatFs, TimeChange, Timestamp,
};

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
/// may execute a non-directory only when some execute bit is set. A node
/// with an access ACL (`a.access_acl`) is judged by its rule, `acl`, which
/// the engine read ([`Rule::permits`]); a node whose rule was not
/// given fails with `Corrupt` rather than be judged by its mode alone. A
/// request the kernel already checked ([`Context::kernel_checked`]) passes.
pub(crate) fn check_access(ctx: &Context, a: &Attr, acl: Option<&Rule>, mask: u8) -> Result<()> {
    // The kernel checked with the caller's full credentials (see
    // `Context::kernel_checked`).
    let ok = if ctx.privileged || ctx.kernel_checked {
        true
    } else if ctx.uid == 0 {
        mask & MASK_X == 0 || a.typ == FileType::Directory || a.mode & 0o111 != 0
    } else if a.access_acl != 0 {
        let rule = acl.ok_or_else(|| {
            Error::Corrupt(format!(
                "the access ACL {} of a node was not read before a permission check",
                a.access_acl
            ))
        })?;
        let mut gids = ctx.gids.clone();
        gids.push(ctx.gid);
        rule.permits(ctx.uid, &gids, a.uid, a.gid, mask)
    } else {
        access_mode(ctx, a) & mask == mask
    };
    if ok { Ok(()) } else { Err(Error::Access) }
}

/// The mode and access ACL of a new node of type `typ` created with `mode`
/// and `umask` in a directory whose default ACL is `default` (Linux's
/// `posix_acl_create`): without one the umask applies; with one the umask
/// does not, and the default ACL's entries are and'ed with the mode — a
/// minimal one shapes the mode alone, another becomes the node's access
/// ACL (returned, for the engine to store), the mode its summary. A
/// symlink takes no ACL.
pub(crate) fn new_node_mode(
    typ: FileType,
    mode: u16,
    umask: u16,
    default: Option<&Rule>,
) -> (u16, Option<Rule>) {
    let mode = mode & 0o7777;
    match default {
        Some(rule) if typ != FileType::Symlink => {
            if rule.is_minimal() {
                (mode & (0o7000 | rule.mode()), None)
            } else {
                let child = rule.child_access(mode);
                ((mode & 0o7000) | child.mode(), Some(child))
            }
        }
        _ => (mode & !umask, None),
    }
}

/// The attributes of a new node `typ` in directory `parent` (attributes
/// `pa`), made by `ctx` with `mode` as [`new_node_mode`] shaped it: a
/// setgid directory passes its group on (and its setgid bit to a new
/// directory); otherwise a caller outside the parent's group loses the
/// setgid bit of a group-executable file, as Linux's `inode_init_owner`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn new_node_attr(
    ctx: &Context,
    pa: &Attr,
    parent: Ino,
    typ: FileType,
    mode: u16,
    rdev: u32,
    target_len: usize,
    access_acl: u32,
    now: Timestamp,
) -> Attr {
    let mut mode = mode;
    let mut gid = ctx.gid;
    if pa.mode & 0o2000 != 0 {
        gid = pa.gid;
        if typ == FileType::Directory {
            mode |= 0o2000;
        }
    } else if mode & 0o2010 == 0o2010 && !is_root(ctx) && !ctx.gids.contains(&pa.gid) {
        mode &= !0o2000;
    }
    Attr {
        flags: 0,
        typ,
        mode,
        uid: ctx.uid,
        gid,
        rdev: if matches!(typ, FileType::BlockDev | FileType::CharDev) {
            rdev
        } else {
            0
        },
        atime: now,
        mtime: now,
        ctime: now,
        nlink: if typ == FileType::Directory { 2 } else { 1 },
        length: match typ {
            FileType::Directory => 4096,
            FileType::Symlink => target_len as u64,
            _ => 0,
        },
        parent,
        access_acl,
        // A new directory passes its parent's default ACL on.
        default_acl: if typ == FileType::Directory {
            pa.default_acl
        } else {
            0
        },
        space: None,
    }
}

/// What setting ACL `typ` of a node to `rule` makes of its attributes
/// `cur` (JuiceFS `doSetFacl`, Linux's `posix_acl_update_mode`): only the
/// owner or root may; an immutable node refuses; a default ACL is for
/// directories alone. An empty rule removes the ACL; a minimal access
/// rule is the mode and removes it too; another rule, its missing owner,
/// group and other entries taken from the mode, is stored (returned for
/// the engine to store and name in the attributes' id) and an access rule
/// sets the mode's bits. A caller outside the node's group, not root,
/// drops its setgid bit, as the kernel asks with
/// `FUSE_SETXATTR_ACL_KILL_SGID`. `None` when nothing changes.
pub(crate) fn apply_facl(
    ctx: &Context,
    cur: &Attr,
    typ: AclType,
    rule: &Rule,
) -> Result<Option<(Attr, Option<Rule>)>> {
    let root = is_root(ctx);
    if !root && ctx.uid != cur.uid {
        return Err(Error::Perm);
    }
    if cur.flags & FLAG_IMMUTABLE != 0 || cur.parent > crate::meta::TRASH_INO {
        return Err(Error::Perm);
    }
    if typ == AclType::Default && cur.typ != FileType::Directory {
        return if rule.is_empty() {
            Ok(None)
        } else {
            Err(Error::Access)
        };
    }
    let mut a = cur.clone();
    if !root && !in_group(ctx, a.gid) {
        a.mode &= !S_ISGID;
    }
    let mut store = None;
    let id = match typ {
        AclType::Access => &mut a.access_acl,
        AclType::Default => &mut a.default_acl,
    };
    if rule.is_empty() {
        *id = 0;
    } else if rule.is_minimal() && typ == AclType::Access {
        *id = 0;
        a.mode = (a.mode & 0o7000) | rule.mode();
    } else {
        let mut r = rule.clone();
        r.inherit_perms(cur.mode);
        if typ == AclType::Access {
            a.mode = (a.mode & 0o7000) | r.mode();
        }
        store = Some(r);
    }
    if store.is_none() && a == *cur {
        return Ok(None);
    }
    a.ctime = Timestamp::now();
    Ok(Some((a, store)))
}

/// The access ACL a chmod to `mode` leaves a node whose ACL is `acl`:
/// the owner, mask (or group) and other entries follow the mode.
pub(crate) fn chmod_acl(acl: &Rule, mode: u16) -> Rule {
    let mut r = acl.clone();
    r.set_mode(mode);
    r
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
pub(crate) fn check_open(ctx: &Context, attr: &Attr, acl: Option<&Rule>, flags: u32) -> Result<()> {
    let mask = open_mask(flags);
    check_access(ctx, attr, acl, mask)?;
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

fn resolve_time(t: TimeChange, now: Timestamp) -> Timestamp {
    match t {
        TimeChange::At(ts) => ts,
        TimeChange::Now => now,
    }
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
pub(crate) fn apply_setattr(
    ctx: &Context,
    cur: &Attr,
    acl: Option<&Rule>,
    set: &SetAttr,
) -> Result<Option<Attr>> {
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
            if !clears_only
                || cur.typ != FileType::File
                || check_access(ctx, cur, acl, MASK_W).is_err()
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
                if !owner && check_access(ctx, cur, acl, MASK_W).is_err() {
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

/// JuiceFS's space accounting: a length rounded up to 4 KiB, and an empty
/// node (directory, symlink, empty file) still counts 4 KiB.
pub(crate) fn align4k(length: u64) -> i64 {
    if length == 0 {
        return 4096;
    }
    (((length - 1) >> 12) + 1).saturating_mul(4096) as i64
}

/// JuiceFS's statfs for the whole volume: the capacity quota (or 1 PiB,
/// doubled while usage passes 80 %), and the inode quota (or 10 Mi, doubled
/// the same way).
pub(crate) fn statfs_from(fmt: &Format, used: i64, inodes: i64) -> StatFs {
    let used = used.max(0) as u64;
    let total = if fmt.capacity > 0 {
        fmt.capacity.max(used)
    } else {
        let mut t: u64 = 1 << 50;
        while t.saturating_mul(8) < used.saturating_mul(10) {
            t = t.saturating_mul(2);
        }
        t
    };
    let iused = inodes.max(0) as u64;
    let iavail = if fmt.inodes > 0 {
        fmt.inodes.saturating_sub(iused)
    } else {
        let mut a: u64 = 10 << 20;
        while iused.saturating_mul(10) > (iused + a).saturating_mul(8) {
            a = a.saturating_mul(2);
        }
        a
    };
    StatFs {
        total_space: total,
        avail_space: total - used,
        used_inodes: iused,
        avail_inodes: iavail,
    }
}
/// Rejects names no entry may have.
pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() {
        return Err(Error::Invalid("a name must not be empty".into()));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(Error::NameTooLong);
    }
    if name.contains(&b'/') || name.contains(&0) {
        return Err(Error::Invalid("a name must not contain '/' or NUL".into()));
    }
    Ok(())
}

/// What an entry contributes to its directory's statistics:
/// (data length, space, inodes).
pub(crate) fn entry_stat(a: &Attr) -> (i64, i64, i64) {
    let len = if a.typ == FileType::File { a.length } else { 0 };
    (len as i64, align4k(len), 1)
}

/// An attribute record that carries only a type (readdir without `plus`).
pub(crate) fn type_only(typ: FileType) -> Attr {
    Attr {
        flags: 0,
        typ,
        mode: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        atime: Timestamp::default(),
        mtime: Timestamp::default(),
        ctime: Timestamp::default(),
        nlink: 0,
        length: 0,
        parent: 0,
        access_acl: 0,
        default_acl: 0,
        space: None,
    }
}

/// `.` and `..` of directory `ino` (attributes `a`) whose parent is `up`:
/// with `plus`, their attributes (`up_attr`, or the directory's own when
/// the parent is gone); otherwise their type alone. Both engines list them.
pub(crate) fn dot_entries(
    ino: Ino,
    a: Attr,
    up: Ino,
    up_attr: Option<Attr>,
    plus: bool,
) -> Vec<Entry> {
    let dir = || type_only(FileType::Directory);
    let (attr, up_attr) = if plus {
        (a.clone(), up_attr.unwrap_or(a))
    } else {
        (dir(), dir())
    };
    vec![
        Entry {
            inode: ino,
            name: b".".to_vec(),
            attr,
        },
        Entry {
            inode: up,
            name: b"..".to_vec(),
            attr: up_attr,
        },
    ]
}
