//! Formatting a volume: the schema, the settings record (`jfs_setting`), the
//! counters, the root and the trash directory, as JuiceFS `doInit` writes them.

use rusqlite::params;
use serde::Serialize;

use super::schema::{CREATE_SPACE, CREATE_TABLES, INITIAL_COUNTERS};
use super::{Inner, node};
use crate::error::{Error, Result};
use crate::format::Format;
use crate::meta::trash::new_trash_attr;
use crate::meta::{ROOT_INO, TRASH_INO};

/// The settings as JuiceFS stores them: JSON, one field per line, no indent.
pub(crate) fn settings_json(f: &Format) -> Result<String> {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(
        &mut out,
        serde_json::ser::PrettyFormatter::with_indent(b""),
    );
    f.serialize(&mut ser)
        .map_err(|e| Error::Invalid(format!("the volume settings cannot be encoded: {e}")))?;
    String::from_utf8(out).map_err(|e| Error::Invalid(format!("settings are not UTF-8: {e}")))
}

/// Merges new settings into an existing volume's, refusing a different volume
/// or a change JuiceFS would refuse too.
pub(crate) fn merge(old: &Format, new: &Format) -> Result<Format> {
    if old.name != new.name || (!new.uuid.is_empty() && old.uuid != new.uuid) {
        return Err(Error::Exists);
    }
    if old.block_size != new.block_size {
        return Err(Error::Invalid(format!(
            "volume {:?} has block size {} KiB; it cannot change to {} KiB",
            old.name, old.block_size, new.block_size
        )));
    }
    if old.compression()? != new.compression()? {
        return Err(Error::Invalid(format!(
            "volume {:?} uses compression {:?}; it cannot change",
            old.name, old.compression
        )));
    }
    let mut merged = old.clone();
    merged.storage = new.storage.clone();
    merged.bucket = new.bucket.clone();
    merged.capacity = new.capacity;
    merged.inodes = new.inodes;
    merged.trash_days = new.trash_days;
    merged.dir_stats = new.dir_stats || old.dir_stats;
    // ACLs, once on, stay on: nodes name their rules (JuiceFS refuses to
    // turn them off too).
    merged.enable_acl = new.enable_acl || old.enable_acl;
    for (k, v) in &new.extra {
        merged.extra.insert(k.clone(), v.clone());
    }
    Ok(merged)
}

impl Inner {
    /// Formats the store, or updates the settings of the same volume.
    pub(super) fn init(&self, format: &Format) -> Result<()> {
        format.check_supported()?;
        if format.name.is_empty() {
            return Err(Error::Invalid("a volume needs a name".into()));
        }
        self.write(|tx| {
            tx.execute_batch(CREATE_TABLES)?;
            tx.execute_batch(CREATE_SPACE)?;
            Ok(())
        })?;
        let existing = self.read_format()?;
        if let Some(old) = &existing {
            old.check_supported()?;
        }
        let fmt = match &existing {
            Some(old) => merge(old, format)?,
            None => {
                let mut f = format.clone();
                if f.uuid.is_empty() {
                    f.uuid = uuid::Uuid::new_v4().to_string();
                }
                if f.meta_version == 0 {
                    f.meta_version = 1;
                }
                f
            }
        };
        let json = settings_json(&fmt)?;
        let drop_dir_stats = existing
            .as_ref()
            .is_some_and(|o| !o.dir_stats && fmt.dir_stats);
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
