//! The trash, as JuiceFS keeps it: a directory `.trash` at the root (its
//! own inode, [`crate::meta::TRASH_INO`]), one subdirectory per hour named
//! `YYYY-MM-DD-HH` (UTC), and entries named `{parent}-{inode}-{name}` so
//! that a restore knows where a file came from.

use crate::meta::{Attr, FileType, Ino, MAX_NAME_LEN, Timestamp};

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
    }
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
