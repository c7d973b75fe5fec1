//! `--writeback` and the flags that go with it, shared by `sluice mount` and
//! `sluice serve`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use sluice_engine::meta::{Meta, MetaUrl};
use sluice_engine::object::writeback::volume_dir;
use sluice_engine::object::{S3Options, WritebackOptions, WritebackStore};
use sluice_engine::volume::{Volume, open_volume_with};

/// Where cache and staging directories live when `--cache-dir` is not given
/// (JuiceFS uses /var/jfsCache; ours is the FHS place for a cache).
pub const DEFAULT_CACHE_DIR: &str = "/var/cache/sluice";

/// Writeback and upload flags.
#[derive(Debug, Clone, clap::Args)]
pub struct WritebackArgs {
    /// Stage written blocks on local disk (under --cache-dir) and upload them
    /// in the background: fsync returns once the data is durable on this
    /// host's disk, before it reaches object storage.
    #[arg(long)]
    pub writeback: bool,
    /// With --writeback, seconds a staged block waits before its upload
    /// starts (a block deleted meanwhile is never uploaded).
    #[arg(long, value_name = "SECS", default_value_t = 0.0)]
    pub upload_delay: f64,
    /// Uploads to object storage at once: the background uploads of
    /// --writeback, and S3 requests.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub max_uploads: usize,
}

/// The first directory of a `--cache-dir` list (without its `@NODE`): the
/// one that holds writeback staging.
pub fn first_cache_dir(list: &str) -> anyhow::Result<PathBuf> {
    let first = list.split(':').next().map(str::trim).unwrap_or_default();
    let path = match first.rsplit_once('@') {
        Some((p, n)) if !p.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => p,
        _ => first,
    };
    if path.is_empty() {
        bail!(
            "--cache-dir {list:?} names no directory; give one, e.g. --cache-dir /var/cache/sluice"
        );
    }
    Ok(PathBuf::from(path))
}

impl WritebackArgs {
    /// Checks the values before anything starts.
    pub fn validate(&self) -> anyhow::Result<()> {
        if !self.upload_delay.is_finite() || self.upload_delay < 0.0 {
            bail!("--upload-delay takes a number of seconds ≥ 0");
        }
        if self.max_uploads == 0 {
            bail!("--max-uploads must be at least 1");
        }
        Ok(())
    }

    /// Opens the volume at `meta_url` (warning when its metadata engine
    /// cannot make fsync'ed writes durable), its S3 client bounded by
    /// `--max-uploads`, and with `--writeback` wraps its object store in the
    /// staging store under `root` (which queues blocks an earlier run left
    /// staged).
    pub fn open_volume(&self, meta_url: &MetaUrl, root: &Path) -> anyhow::Result<Arc<Volume>> {
        self.validate()?;
        let meta = sluice_engine::meta::open_existing_meta(meta_url.expose())
            .with_context(|| format!("cannot open the volume at {meta_url}"))?;
        self.open_volume_on(meta, meta_url, root)
    }

    /// [`WritebackArgs::open_volume`] on a metadata engine already open.
    pub fn open_volume_on(
        &self,
        meta: Arc<dyn Meta>,
        meta_url: &MetaUrl,
        root: &Path,
    ) -> anyhow::Result<Arc<Volume>> {
        self.validate()?;
        let s3 = S3Options {
            max_uploads: self.max_uploads,
            ..S3Options::default()
        };
        let volume = open_volume_with(meta, &s3)
            .with_context(|| format!("cannot open the volume at {meta_url}"))?;
        // Said once, when the file system starts: fsync is only as durable
        // as the metadata engine's commits.
        if let Some(gap) = volume.meta.durability_gap() {
            log::warn!("{gap}");
        }
        if !self.writeback {
            return Ok(volume);
        }
        let opts = WritebackOptions {
            dir: volume_dir(root, &volume.format.uuid),
            upload_delay: Duration::from_secs_f64(self.upload_delay),
            max_uploads: self.max_uploads,
        };
        let store = WritebackStore::open(volume.store.clone(), &opts).map_err(|e| {
            anyhow::anyhow!(
                "--writeback cannot stage blocks in {}: {e}; give a writable local directory with --cache-dir",
                root.display()
            )
        })?;
        log::info!(
            "writeback: staging blocks in {} (upload delay {} s, {} uploads at once)",
            store.staging_dir().display(),
            self.upload_delay,
            self.max_uploads
        );
        Ok(volume.with_store(Arc::new(store)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(writeback: bool, delay: f64, uploads: usize) -> WritebackArgs {
        WritebackArgs {
            writeback,
            upload_delay: delay,
            max_uploads: uploads,
        }
    }

    #[test]
    fn the_first_cache_dir_holds_staging_and_bad_values_are_refused() {
        assert_eq!(
            first_cache_dir("/a:/b").unwrap(),
            PathBuf::from("/a"),
            "the first of a colon list"
        );
        assert_eq!(
            first_cache_dir("/nvme0@1:/nvme1@0").unwrap(),
            PathBuf::from("/nvme0"),
            "the NUMA node is not part of the path"
        );
        assert!(first_cache_dir(":/b").is_err());
        assert!(args(true, 0.0, 4).validate().is_ok());
        assert!(args(true, -1.0, 4).validate().is_err());
        assert!(args(true, f64::NAN, 4).validate().is_err());
        assert!(args(true, 0.0, 0).validate().is_err());
    }
}
