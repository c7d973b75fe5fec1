//! A volume's settings as both engines store them (JuiceFS's `format`
//! record, JSON): what formatting a store writes, and which changes an
//! existing volume's settings accept.

use serde::Serialize;

use crate::error::{Error, Result};
use crate::format::Format;

/// Settings a store can be formatted with: a name, and what this build
/// supports.
pub(crate) fn check_new(f: &Format) -> Result<()> {
    f.check_supported()?;
    if f.name.is_empty() {
        return Err(Error::Invalid("a volume needs a name".into()));
    }
    Ok(())
}

/// What to store for `new`: the merge into the settings the store holds
/// (`existing`, which must be supported too), or `new` itself for an empty
/// store, given a UUID and JuiceFS's meta version 1 if it has none.
pub(crate) fn to_store(existing: Option<&Format>, new: &Format) -> Result<Format> {
    match existing {
        Some(old) => {
            old.check_supported()?;
            merge(old, new)
        }
        None => {
            let mut f = new.clone();
            if f.uuid.is_empty() {
                f.uuid = uuid::Uuid::new_v4().to_string();
            }
            if f.meta_version == 0 {
                f.meta_version = 1;
            }
            Ok(f)
        }
    }
}

/// Whether storing `fmt` over `existing` turns directory statistics on:
/// the ones left from before were kept by nobody and are stale, so the
/// engine drops them (they are rebuilt on use).
pub(crate) fn drops_dir_stats(existing: Option<&Format>, fmt: &Format) -> bool {
    existing.is_some_and(|o| !o.dir_stats && fmt.dir_stats)
}

/// The settings as JuiceFS stores them: JSON, one field per line, no indent.
pub(crate) fn to_json(f: &Format) -> Result<String> {
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
fn merge(old: &Format, new: &Format) -> Result<Format> {
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
