//! Directory quotas in JuiceFS's hashes: `dirQuota` (inode → 16 bytes, the
//! space and inode limits as big-endian 64-bit integers),
//! `dirQuotaUsedSpace` and `dirQuotaUsedInodes` (inode → decimal usage);
//! and the reload of the limits and usage this client checks against. The
//! rules are `meta::quota`'s.

use std::collections::HashMap;

use super::Inner;
use super::keys::counter;
use crate::error::{Error, Result};
use crate::meta::{DirQuota, Ino, QuotaChange};

/// JuiceFS's `packQuota`: max space, then max inodes, big-endian.
pub(super) fn pack(space: i64, inodes: i64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&space.to_be_bytes());
    b[8..].copy_from_slice(&inodes.to_be_bytes());
    b
}

fn unpack(ino: &str, b: &[u8]) -> Result<(i64, i64)> {
    let b: &[u8; 16] = b.try_into().map_err(|_| {
        Error::Corrupt(format!(
            "the quota of inode {ino} is {} bytes, not JuiceFS's 16",
            b.len()
        ))
    })?;
    let mut s = [0u8; 8];
    let mut i = [0u8; 8];
    s.copy_from_slice(&b[..8]);
    i.copy_from_slice(&b[8..]);
    Ok((i64::from_be_bytes(s), i64::from_be_bytes(i)))
}

fn number(v: Option<Vec<u8>>) -> i64 {
    v.and_then(|v| std::str::from_utf8(&v).ok()?.parse().ok())
        .unwrap_or(0)
}

impl Inner {
    /// Every quota record (the fields of `dirQuota`).
    pub(super) fn dir_quotas(&self) -> Result<Vec<(Ino, DirQuota)>> {
        let [quota, used_space, used_inodes] = self.keys.dir_quota_keys();
        type Hash = HashMap<String, Vec<u8>>;
        let (limits, spaces, inodes): (Hash, Hash, Hash) = self.pool.with_conn(|c| {
            redis::pipe()
                .cmd("HGETALL")
                .arg(&quota)
                .cmd("HGETALL")
                .arg(&used_space)
                .cmd("HGETALL")
                .arg(&used_inodes)
                .query(c)
        })?;
        let mut out = Vec::with_capacity(limits.len());
        for (field, packed) in limits {
            let Ok(ino) = field.parse::<Ino>() else {
                continue;
            };
            let (max_space, max_inodes) = unpack(&field, &packed)?;
            out.push((
                ino,
                DirQuota {
                    max_space,
                    max_inodes,
                    used_space: number(spaces.get(&field).cloned()),
                    used_inodes: number(inodes.get(&field).cloned()),
                },
            ));
        }
        out.sort_by_key(|(ino, _)| *ino);
        Ok(out)
    }

    /// One directory's quota record.
    pub(super) fn get_dir_quota(&self, ino: Ino) -> Result<Option<DirQuota>> {
        let [quota, used_space, used_inodes] = self.keys.dir_quota_keys();
        let field = ino.to_string();
        type Field = Option<Vec<u8>>;
        let (packed, space, inodes): (Field, Field, Field) = self.pool.with_conn(|c| {
            redis::pipe()
                .cmd("HGET")
                .arg(&quota)
                .arg(&field)
                .cmd("HGET")
                .arg(&used_space)
                .arg(&field)
                .cmd("HGET")
                .arg(&used_inodes)
                .arg(&field)
                .query(c)
        })?;
        let Some(packed) = packed else {
            return Ok(None);
        };
        let (max_space, max_inodes) = unpack(&field, &packed)?;
        Ok(Some(DirQuota {
            max_space,
            max_inodes,
            used_space: number(space),
            used_inodes: number(inodes),
        }))
    }

    /// Creates or changes a quota record (JuiceFS `doSetQuota`).
    pub(super) fn set_dir_quota(&self, ino: Ino, change: &QuotaChange) -> Result<bool> {
        let [quota, used_space, used_inodes] = self.keys.dir_quota_keys();
        let field = ino.to_string();
        self.write(ino, |tx| {
            let old = tx.hget(&quota, field.as_bytes())?;
            let created = old.is_none();
            let (mut max_space, mut max_inodes) = match &old {
                Some(b) => unpack(&field, b)?,
                None => (0, 0),
            };
            if let Some(m) = change.max_space {
                max_space = m;
            }
            if let Some(m) = change.max_inodes {
                max_inodes = m;
            }
            tx.hset(&quota, field.as_bytes(), &pack(max_space, max_inodes));
            let usage = change.usage.or(created.then_some((0, 0)));
            if let Some((s, i)) = usage {
                tx.hset(&used_space, field.as_bytes(), s.to_string().as_bytes());
                tx.hset(&used_inodes, field.as_bytes(), i.to_string().as_bytes());
            }
            Ok(created)
        })
    }

    /// Removes a quota record.
    pub(super) fn delete_dir_quota(&self, ino: Ino) -> Result<()> {
        let field = ino.to_string();
        self.write(ino, |tx| {
            for k in tx.keys.dir_quota_keys() {
                tx.hdel(&k, field.as_bytes());
            }
            Ok(())
        })
    }

    /// Adds to the usage of quota records, in one transaction.
    pub(super) fn add_dir_quota_usage(&self, changes: &[(Ino, i64, i64)]) -> Result<()> {
        let stripe = changes.first().map_or(0, |c| c.0);
        self.write(stripe, |tx| {
            let [_, used_space, used_inodes] = tx.keys.dir_quota_keys();
            for (ino, space, inodes) in changes {
                let field = ino.to_string();
                tx.hincrby(&used_space, field.as_bytes(), *space);
                tx.hincrby(&used_inodes, field.as_bytes(), *inodes);
            }
            Ok(())
        })
    }

    /// Reads the settings, the usage counters and the quota records again
    /// into `quotas`.
    pub(super) fn reload_quotas(&self) -> Result<()> {
        let Some(fmt) = self.read_format()? else {
            return Ok(());
        };
        *self.format.write() = Some(fmt.clone());
        let used = self.counter_value(counter::USED_SPACE)?;
        let inodes = self.counter_value(counter::TOTAL_INODES)?;
        let dirs = self.dir_quotas()?;
        self.quotas.install(&fmt, used, inodes, &dirs);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_pack_as_juicefs_does() {
        let b = pack(1 << 30, 100);
        assert_eq!(&b[..8], &[0, 0, 0, 0, 0x40, 0, 0, 0]);
        assert_eq!(&b[8..], &[0, 0, 0, 0, 0, 0, 0, 100]);
        assert_eq!(unpack("1", &b).expect("unpack"), (1 << 30, 100));
        assert_eq!(unpack("1", &pack(-1, -1)).expect("unpack"), (-1, -1));
        assert!(unpack("1", &[0; 8]).is_err());
    }
}
