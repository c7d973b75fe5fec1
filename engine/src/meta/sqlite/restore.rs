//! Filling an empty SQLite store from a dump (`sluice load`) and reading
//! the counters for `sluice dump`. The whole load is one transaction on the
//! writer connection: tables, records, counters and, last, the settings
//! commit together or not at all.

use parking_lot::MutexGuard;
use rusqlite::{Connection, params};

use super::schema::{CREATE_SPACE, CREATE_TABLES, counter};
use super::{Inner, TxError, get_counter, node, sql_error};
use crate::error::{Error, Result};
use crate::format::Format;
use crate::meta::settings;
use crate::meta::{Attr, Counters, DirQuota, DirStat, FileType, Ino, Restore, Slice};

fn tx_error(e: TxError) -> Error {
    match e {
        TxError::Sql(e) => sql_error(e),
        TxError::Fs(e) => e,
    }
}

impl Inner {
    /// The counters, with JuiceFS's dump names (SQL counters already hold
    /// the next ids).
    pub(super) fn counters(&self) -> Result<Counters> {
        self.read(|c| {
            Ok(Counters {
                used_space: get_counter(c, counter::USED_SPACE)?,
                used_inodes: get_counter(c, counter::TOTAL_INODES)?,
                next_inode: get_counter(c, counter::NEXT_INODE)?,
                next_slice: get_counter(c, counter::NEXT_SLICE)?,
                next_session: get_counter(c, counter::NEXT_SESSION)?,
                next_trash: get_counter(c, counter::NEXT_TRASH)?,
            })
        })
    }

    /// Begins a load: checks that the database holds no volume and no
    /// nodes, then opens the transaction the load runs in.
    pub(super) fn restore(&self) -> Result<SqliteRestore<'_>> {
        let conn = self.writer.lock();
        let not_empty = || {
            Error::Invalid(format!(
                "the SQLite database {} is not empty; load into a new database",
                self.path.display()
            ))
        };
        let tables: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type='table' AND name LIKE 'jfs_%'",
                [],
                |r| r.get(0),
            )
            .map_err(sql_error)?;
        if tables > 0 {
            let has = |table: &str| -> Result<bool> {
                let exists: bool = conn
                    .query_row(
                        "SELECT count(*) > 0 FROM sqlite_master WHERE type='table' AND name=?",
                        params![table],
                        |r| r.get(0),
                    )
                    .map_err(sql_error)?;
                if !exists {
                    return Ok(false);
                }
                conn.query_row(&format!("SELECT count(*) > 0 FROM {table}"), [], |r| {
                    r.get(0)
                })
                .map_err(sql_error)
            };
            if has("jfs_setting")? || has("jfs_node")? || has("jfs_edge")? {
                return Err(not_empty());
            }
        }
        conn.execute_batch("BEGIN IMMEDIATE").map_err(sql_error)?;
        if let Err(e) = conn
            .execute_batch(CREATE_TABLES)
            .and_then(|()| conn.execute_batch(CREATE_SPACE))
        {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(sql_error(e));
        }
        Ok(SqliteRestore {
            conn,
            open: true,
            inner: self,
        })
    }
}

/// A load into SQLite in progress: one open transaction on the writer
/// connection, rolled back when dropped unfinished.
pub(super) struct SqliteRestore<'a> {
    conn: MutexGuard<'a, Connection>,
    /// Whether the transaction is still open (rolled back on drop).
    open: bool,
    inner: &'a Inner,
}

impl Drop for SqliteRestore<'_> {
    fn drop(&mut self) {
        if self.open {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
    }
}

impl SqliteRestore<'_> {
    fn exec(&self, sql: &str, p: impl rusqlite::Params) -> Result<()> {
        self.conn
            .prepare_cached(sql)
            .and_then(|mut s| s.execute(p))
            .map_err(sql_error)?;
        Ok(())
    }
}

impl Restore for SqliteRestore<'_> {
    fn node(&mut self, ino: Ino, attr: &Attr, _parents: &[(Ino, u32)]) -> Result<()> {
        node::insert(&self.conn, ino, attr).map_err(tx_error)
    }

    fn entry(&mut self, parent: Ino, name: &[u8], ino: Ino, typ: FileType) -> Result<()> {
        self.exec(
            "INSERT INTO jfs_edge (parent, name, inode, type) VALUES (?,?,?,?)",
            params![parent as i64, name, ino as i64, typ as u8],
        )
    }

    fn symlink(&mut self, ino: Ino, target: &[u8]) -> Result<()> {
        self.exec(
            "INSERT INTO jfs_symlink (inode, target) VALUES (?,?)",
            params![ino as i64, target],
        )
    }

    fn acl(&mut self, rule: &crate::meta::acl::Rule) -> Result<u32> {
        node::store_rule(&self.conn, rule).map_err(tx_error)
    }

    fn xattr(&mut self, ino: Ino, name: &[u8], value: &[u8]) -> Result<()> {
        // JuiceFS's column is TEXT; names are stored as their bytes.
        let name = String::from_utf8_lossy(name);
        self.exec(
            "INSERT INTO jfs_xattr (inode, name, value) VALUES (?,?,?)",
            params![ino as i64, name.as_ref(), value],
        )
    }

    fn chunk(&mut self, ino: Ino, indx: u32, slices: &[Slice]) -> Result<()> {
        let blob: Vec<u8> = slices.iter().flat_map(|s| s.encode()).collect();
        self.exec(
            "INSERT INTO jfs_chunk (inode, indx, slices) VALUES (?,?,?)",
            params![ino as i64, indx, blob],
        )
    }

    fn slice_refs(&mut self, id: u64, size: u32, refs: u32) -> Result<()> {
        self.exec(
            "INSERT INTO jfs_chunk_ref (chunkid, size, refs) VALUES (?,?,?)",
            params![id as i64, size, refs],
        )
    }

    fn dir_stat(&mut self, ino: Ino, stat: &DirStat) -> Result<()> {
        self.exec(
            "INSERT INTO jfs_dir_stats (inode, data_length, used_space, used_inodes) \
             VALUES (?,?,?,?)",
            params![
                ino as i64,
                stat.data_length,
                stat.used_space,
                stat.used_inodes
            ],
        )
    }

    fn dir_quota(&mut self, ino: Ino, q: &DirQuota) -> Result<()> {
        self.exec(
            "INSERT INTO jfs_dir_quota (inode, max_space, max_inodes, used_space, used_inodes) \
             VALUES (?,?,?,?,?)",
            params![
                ino as i64,
                q.max_space,
                q.max_inodes,
                q.used_space,
                q.used_inodes
            ],
        )
    }

    fn finish(mut self: Box<Self>, format: &Format, counters: &Counters) -> Result<()> {
        for (name, value) in [
            (counter::NEXT_INODE, counters.next_inode),
            (counter::NEXT_SLICE, counters.next_slice),
            (counter::NEXT_SESSION, counters.next_session),
            (counter::USED_SPACE, counters.used_space),
            (counter::TOTAL_INODES, counters.used_inodes),
            (counter::NEXT_TRASH, counters.next_trash),
            ("nextCleanupSlices", 0),
        ] {
            self.exec(
                "INSERT INTO jfs_counter (name, value) VALUES (?,?)",
                params![name, value],
            )?;
        }
        let json = settings::to_json(format)?;
        self.exec(
            "INSERT INTO jfs_setting (name, value) VALUES ('format', ?)",
            params![json],
        )?;
        self.conn.execute_batch("COMMIT").map_err(sql_error)?;
        self.open = false;
        self.inner
            .commits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}
