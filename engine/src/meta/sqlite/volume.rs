//! Formatting a volume: the schema, the settings record (`jfs_setting`), the
//! counters, the root and the trash directory, as JuiceFS `doInit` writes them.

use rusqlite::params;

use super::schema::{CREATE_SPACE, CREATE_TABLES, INITIAL_COUNTERS};
use super::{Inner, node};
use crate::error::Result;
use crate::format::Format;
use crate::meta::settings;
use crate::meta::trash::new_trash_attr;
use crate::meta::{ROOT_INO, TRASH_INO};

impl Inner {
    /// Formats the store, or updates the settings of the same volume.
    pub(super) fn init(&self, format: &Format) -> Result<()> {
        settings::check_new(format)?;
        self.write(|tx| {
            tx.execute_batch(CREATE_TABLES)?;
            tx.execute_batch(CREATE_SPACE)?;
            Ok(())
        })?;
        let existing = self.read_format()?;
        let fmt = settings::to_store(existing.as_ref(), format)?;
        let json = settings::to_json(&fmt)?;
        let drop_dir_stats = settings::drops_dir_stats(existing.as_ref(), &fmt);
        self.write(|tx| {
            if drop_dir_stats {
                // Stats kept by nobody are stale; they are rebuilt on use.
                tx.execute("DELETE FROM jfs_dir_stats", [])?;
            }
            if fmt.trash_days > 0 && node::get(tx, TRASH_INO)?.is_none() {
                node::insert(tx, TRASH_INO, &new_trash_attr(ROOT_INO))?;
            }
            if existing.is_some() {
                tx.execute(
                    "UPDATE jfs_setting SET value=? WHERE name='format'",
                    params![json],
                )?;
                return Ok(());
            }
            tx.execute(
                "INSERT INTO jfs_setting (name, value) VALUES ('format', ?)",
                params![json],
            )?;
            let mut root = new_trash_attr(ROOT_INO);
            root.mode = 0o777;
            node::insert(tx, ROOT_INO, &root)?;
            for (name, value) in INITIAL_COUNTERS {
                tx.execute(
                    "INSERT OR IGNORE INTO jfs_counter (name, value) VALUES (?,?)",
                    params![name, value],
                )?;
            }
            Ok(())
        })?;
        *self.format.write() = Some(fmt);
        Ok(())
    }
}
