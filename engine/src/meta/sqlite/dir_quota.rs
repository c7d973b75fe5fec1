//! Directory quotas in JuiceFS's `jfs_dir_quota` table (inode, max_space,
//! max_inodes, used_space, used_inodes), and the reload of the limits and
//! usage this client checks against. The rules are `meta::quota`'s.

use rusqlite::{OptionalExtension, params};

use super::schema::counter;
use super::{Inner, TxResult, get_counter};
use crate::error::Result;
use crate::meta::{DirQuota, Ino, QuotaChange};

fn quota_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(Ino, DirQuota)> {
    Ok((
        r.get::<_, i64>(0)? as Ino,
        DirQuota {
            max_space: r.get(1)?,
            max_inodes: r.get(2)?,
            used_space: r.get(3)?,
            used_inodes: r.get(4)?,
        },
    ))
}

const SELECT: &str =
    "SELECT inode, max_space, max_inodes, used_space, used_inodes FROM jfs_dir_quota";

/// What a reload reads: used space, used inodes, the directory quotas.
type Loaded = (i64, i64, Vec<(Ino, DirQuota)>);

impl Inner {
    /// Every quota record.
    pub(super) fn dir_quotas(&self) -> Result<Vec<(Ino, DirQuota)>> {
        self.read(|c| {
            let mut stmt = c.prepare(SELECT)?;
            let rows = stmt.query_map([], quota_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    /// One directory's quota record.
    pub(super) fn get_dir_quota(&self, ino: Ino) -> Result<Option<DirQuota>> {
        self.read(|c| {
            Ok(c.query_row(
                &format!("{SELECT} WHERE inode=?"),
                params![ino as i64],
                |r| quota_from_row(r).map(|(_, q)| q),
            )
            .optional()?)
        })
    }

    /// Creates or changes a quota record (JuiceFS `doSetQuota`).
    pub(super) fn set_dir_quota(&self, ino: Ino, change: &QuotaChange) -> Result<bool> {
        self.write(|tx| {
            let old: Option<DirQuota> = tx
                .query_row(
                    &format!("{SELECT} WHERE inode=?"),
                    params![ino as i64],
                    |r| quota_from_row(r).map(|(_, q)| q),
                )
                .optional()?;
            let mut q = old.unwrap_or_default();
            if let Some(m) = change.max_space {
                q.max_space = m;
            }
            if let Some(m) = change.max_inodes {
                q.max_inodes = m;
            }
            if let Some((s, i)) = change.usage {
                q.used_space = s;
                q.used_inodes = i;
            }
            tx.execute(
                "INSERT OR REPLACE INTO jfs_dir_quota \
                 (inode, max_space, max_inodes, used_space, used_inodes) VALUES (?,?,?,?,?)",
                params![
                    ino as i64,
                    q.max_space,
                    q.max_inodes,
                    q.used_space,
                    q.used_inodes
                ],
            )?;
            Ok(old.is_none())
        })
    }

    /// Removes a quota record.
    pub(super) fn delete_dir_quota(&self, ino: Ino) -> Result<()> {
        self.write(|tx| {
            tx.execute(
                "DELETE FROM jfs_dir_quota WHERE inode=?",
                params![ino as i64],
            )?;
            Ok(())
        })
    }

    /// Adds to the usage of quota records, in one transaction.
    pub(super) fn add_dir_quota_usage(&self, changes: &[(Ino, i64, i64)]) -> Result<()> {
        self.write(|tx| {
            for (ino, space, inodes) in changes {
                tx.execute(
                    "UPDATE jfs_dir_quota SET used_space=used_space+?, \
                     used_inodes=used_inodes+? WHERE inode=?",
                    params![space, inodes, *ino as i64],
                )?;
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
        // Read and installed under the writer lock, on the writer's
        // connection: a commit applies its usage to the in-memory counts
        // while it holds that lock, so a reload can never install counts
        // read before a commit over that commit's update (which would let
        // the next write pass the volume's capacity).
        let conn = self.writer.lock();
        let read = || -> TxResult<Loaded> {
            let used = get_counter(&conn, counter::USED_SPACE)?;
            let inodes = get_counter(&conn, counter::TOTAL_INODES)?;
            let mut stmt = conn.prepare(SELECT)?;
            let dirs = stmt
                .query_map([], quota_from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok((used, inodes, dirs))
        };
        let (used, inodes, dirs) = match read() {
            Ok(v) => v,
            Err(super::TxError::Sql(e)) => return Err(super::sql_error(e)),
            Err(super::TxError::Fs(e)) => return Err(e),
        };
        self.quotas.install(&fmt, used, inodes, &dirs);
        Ok(())
    }
}
