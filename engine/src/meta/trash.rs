//! The trash, as JuiceFS keeps it: a directory `.trash` at the root (its
//! own inode, [`crate::meta::TRASH_INO`]), one subdirectory per hour named
//! `YYYY-MM-DD-HH` (UTC), and entries named `{parent}-{inode}-{name}` so
//! that a restore knows where a file came from.

use crate::error::{Error, Result};
use crate::meta::namespace::NsTx;
use crate::meta::rules::align4k;
use crate::meta::{Attr, Context, Entry, FileType, Ino, MAX_NAME_LEN, TRASH_INO, Timestamp};

/// Whether an inode is the trash directory or one of its hourly children.
pub(crate) fn is_trash(ino: Ino) -> bool {
    ino >= crate::meta::TRASH_INO
}

/// The name `.trash` has in the root directory.
pub(crate) const TRASH_NAME: &[u8] = b".trash";

/// The name a removed entry gets in the trash (JuiceFS `trashEntry`).
pub(crate) fn trash_entry_name(parent: Ino, inode: Ino, name: &[u8]) -> Vec<u8> {
    let mut s = format!("{parent}-{inode}-").into_bytes();
    s.extend_from_slice(name);
    s.truncate(MAX_NAME_LEN);
    s
}

/// The attributes of the trash directory or one of its hourly children.
pub(crate) fn new_trash_attr(parent: Ino) -> Attr {
    let now = Timestamp::now();
    Attr {
        flags: 0,
        typ: FileType::Directory,
        mode: 0o555,
        uid: 0,
        gid: 0,
        rdev: 0,
        atime: now,
        mtime: now,
        ctime: now,
        nlink: 2,
        length: 4096,
        parent,
        access_acl: 0,
        default_acl: 0,
        space: None,
    }
}

/// What emptying the trash needs of an engine, each call its own
/// transaction (or several: a long directory is read in pages).
pub(crate) trait TrashOps {
    /// The entries of directory `dir`, without "." and "..".
    fn entries(&self, ctx: &Context, dir: Ino) -> Result<Vec<Entry>>;
    /// Unlinks `name` in `dir` (inside the trash: for good).
    fn unlink(&self, ctx: &Context, dir: Ino, name: &[u8]) -> Result<()>;
    /// Removes the empty directory `name` in `dir`.
    fn rmdir(&self, ctx: &Context, dir: Ino, name: &[u8]) -> Result<()>;
    /// Removes the empty hourly directory `name` ([`remove_hour`] in a
    /// transaction of its own) and forgets it as the hour's trash.
    fn remove_hour(&self, name: &[u8]) -> Result<()>;
}

/// Empties and removes the hourly trash directories named before `edge`
/// (unix seconds), each child before its directory (JuiceFS `cleanTrash`).
/// A trash left from when the volume kept more days empties the same way.
pub(crate) fn empty_before(ops: &dyn TrashOps, edge: i64) -> Result<()> {
    let ctx = Context::internal();
    for h in ops.entries(&ctx, TRASH_INO)? {
        let Some(start) = parse_hour_name(&h.name) else {
            log::warn!("unexpected entry {:?} in the trash", h.name);
            continue;
        };
        if start >= edge {
            continue;
        }
        remove_tree(ops, &ctx, h.inode)?;
        ops.remove_hour(&h.name)?;
    }
    Ok(())
}

/// Deletes everything below directory `dir` (children first).
fn remove_tree(ops: &dyn TrashOps, ctx: &Context, dir: Ino) -> Result<()> {
    for e in ops.entries(ctx, dir)? {
        if e.attr.typ == FileType::Directory {
            remove_tree(ops, ctx, e.inode)?;
            ops.rmdir(ctx, dir, &e.name)?;
        } else {
            ops.unlink(ctx, dir, &e.name)?;
        }
    }
    Ok(())
}

/// Removes the hourly trash directory `name`, which no user may rmdir (its
/// mode is 0555, its parent the trash), inside the caller's transaction:
/// its entry, statistics and node, and its inode from the volume's usage.
/// One that is gone already is not an error; one that is not empty is.
pub(crate) fn remove_hour<T: NsTx>(tx: &mut T, name: &[u8]) -> Result<(), T::Error> {
    let Some(edge) = tx.edge(TRASH_INO, name)? else {
        return Ok(());
    };
    if tx.has_children(edge.inode)? {
        return Err(Error::NotEmpty.into());
    }
    tx.delete_edge(TRASH_INO, name)?;
    tx.drop_dir_stats(edge.inode)?;
    tx.delete_node(edge.inode)?;
    tx.add_usage(-align4k(0), -1)
}

/// The UTC hour `secs` falls in, as JuiceFS names hourly trash directories
/// ("2006-01-02-15").
pub(crate) fn hour_name(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let hour = secs.rem_euclid(86_400) / 3600;
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}-{hour:02}")
}

/// The start of the hour an hourly trash directory is named after.
pub(crate) fn parse_hour_name(name: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(name).ok()?;
    let parts: Vec<&str> = s.split('-').collect();
    if parts.len() != 4 || parts[0].len() != 4 || parts[1..].iter().any(|p| p.len() != 2) {
        return None;
    }
    let y: i64 = parts[0].parse().ok()?;
    let m: u32 = parts[1].parse().ok()?;
    let d: u32 = parts[2].parse().ok()?;
    let h: i64 = parts[3].parse().ok()?;
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || !(0..24).contains(&h) {
        return None;
    }
    Some(days_from_civil(y, m, d) * 86_400 + h * 3600)
}

pub(crate) fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hour_names_match_juicefs_layout() {
        // 2026-12-02 15:21:53 UTC
        assert_eq!(hour_name(1_796_224_913), "2026-12-02-15");
        assert_eq!(hour_name(0), "1970-01-01-00");
        let start = parse_hour_name(b"2026-12-02-15").expect("valid name");
        assert_eq!(hour_name(start), "2026-12-02-15");
        assert_eq!(start % 3600, 0);
        assert!(parse_hour_name(b"2026-13-02-15").is_none());
        assert!(parse_hour_name(b"not-a-trash-dir").is_none());
    }

    #[test]
    fn trash_names_are_parent_inode_name_and_fit() {
        assert_eq!(trash_entry_name(1, 4, b"f2"), b"1-4-f2".to_vec());
        let long = vec![b'x'; 255];
        assert_eq!(trash_entry_name(12, 34, &long).len(), MAX_NAME_LEN);
    }
}
