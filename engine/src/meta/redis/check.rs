//! The records `sluice fsck` reads and repairs beyond the file-system
//! operations: directory statistics (`dirDataLength`, `dirUsedSpace`,
//! `dirUsedInodes`), the usage counters and the removed files awaiting
//! deletion (`delfiles`, members `ino:length`).

use super::Inner;
use super::keys::counter;
use crate::error::Result;
use crate::meta::{DirStat, Ino};

impl Inner {
    pub(super) fn dir_stat(&self, ino: Ino) -> Result<Option<DirStat>> {
        let keys = &self.keys;
        let field = ino.to_string();
        type Field = Option<i64>;
        let (length, space, inodes): (Field, Field, Field) = self.pool.with_conn(|c| {
            redis::pipe()
                .cmd("HGET")
                .arg(keys.dir_data_length())
                .arg(&field)
                .cmd("HGET")
                .arg(keys.dir_used_space())
                .arg(&field)
                .cmd("HGET")
                .arg(keys.dir_used_inodes())
                .arg(&field)
                .query(c)
        })?;
        if length.is_none() && space.is_none() && inodes.is_none() {
            return Ok(None);
        }
        // A field that is missing while the others are there reads as -1,
        // which fsck reports as a broken statistic.
        Ok(Some(DirStat {
            data_length: length.unwrap_or(-1),
            used_space: space.unwrap_or(-1),
            used_inodes: inodes.unwrap_or(-1),
        }))
    }

    pub(super) fn set_dir_stat(&self, ino: Ino, stat: &DirStat) -> Result<()> {
        let keys = &self.keys;
        let field = ino.to_string();
        self.pool.with_conn(|c| {
            redis::pipe()
                .atomic()
                .cmd("HSET")
                .arg(keys.dir_data_length())
                .arg(&field)
                .arg(stat.data_length)
                .ignore()
                .cmd("HSET")
                .arg(keys.dir_used_space())
                .arg(&field)
                .arg(stat.used_space)
                .ignore()
                .cmd("HSET")
                .arg(keys.dir_used_inodes())
                .arg(&field)
                .arg(stat.used_inodes)
                .ignore()
                .query::<()>(c)
        })
    }

    pub(super) fn add_usage(&self, space: i64, inodes: i64) -> Result<()> {
        let keys = &self.keys;
        self.pool.with_conn(|c| {
            redis::pipe()
                .atomic()
                .cmd("INCRBY")
                .arg(keys.counter(counter::USED_SPACE))
                .arg(space)
                .ignore()
                .cmd("INCRBY")
                .arg(keys.counter(counter::TOTAL_INODES))
                .arg(inodes)
                .ignore()
                .query::<()>(c)
        })?;
        // This client's copy of the usage follows the store.
        self.reload_quotas()
    }

    pub(super) fn deleted_files(&self) -> Result<Vec<Ino>> {
        let members: Vec<String> = self.pool.with_conn(|c| {
            redis::cmd("ZRANGE")
                .arg(self.keys.delfiles())
                .arg(0)
                .arg(-1)
                .query(c)
        })?;
        let mut out: Vec<Ino> = members
            .iter()
            .filter_map(|m| m.split_once(':')?.0.parse().ok())
            .collect();
        out.sort_unstable();
        Ok(out)
    }
}
