//! The records `sluice fsck` reads and repairs beyond the file-system
//! operations: directory statistics, the usage counters and the removed
//! files awaiting deletion.

use rusqlite::{OptionalExtension, params};

use super::Inner;
use super::schema::counter;
use crate::error::Result;
use crate::meta::{DirStat, Ino};

impl Inner {
    pub(super) fn dir_stat(&self, ino: Ino) -> Result<Option<DirStat>> {
        self.read(|c| {
            Ok(c.query_row(
                "SELECT data_length, used_space, used_inodes FROM jfs_dir_stats WHERE inode=?",
                params![ino as i64],
                |r| {
                    Ok(DirStat {
                        data_length: r.get(0)?,
                        used_space: r.get(1)?,
                        used_inodes: r.get(2)?,
                    })
                },
            )
            .optional()?)
        })
    }

    pub(super) fn set_dir_stat(&self, ino: Ino, stat: &DirStat) -> Result<()> {
        self.write(|tx| {
            tx.execute(
                "INSERT OR REPLACE INTO jfs_dir_stats (inode, data_length, used_space, used_inodes) \
                 VALUES (?,?,?,?)",
                params![
                    ino as i64,
                    stat.data_length,
                    stat.used_space,
                    stat.used_inodes
                ],
            )?;
            Ok(())
        })
    }

    pub(super) fn add_usage(&self, space: i64, inodes: i64) -> Result<()> {
        self.write(|tx| {
            for (name, by) in [
                (counter::USED_SPACE, space),
                (counter::TOTAL_INODES, inodes),
            ] {
                tx.execute(
                    "INSERT INTO jfs_counter (name, value) VALUES (?, ?) \
                     ON CONFLICT(name) DO UPDATE SET value=value+excluded.value",
                    params![name, by],
                )?;
            }
            Ok(())
        })?;
        // This client's copy of the usage follows the store.
        self.reload_quotas()
    }

    pub(super) fn deleted_files(&self) -> Result<Vec<Ino>> {
        self.read(|c| {
            let mut stmt = c.prepare("SELECT inode FROM jfs_delfile ORDER BY inode")?;
            let rows = stmt.query_map([], |r| r.get::<_, i64>(0))?;
            let mut out = Vec::new();
            for r in rows {
                out.push(r? as Ino);
            }
            Ok(out)
        })
    }
}
