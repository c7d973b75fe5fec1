//! The group-commit flag shared by `sluice mount` and `sluice serve`.

use std::time::Duration;

use anyhow::bail;
use sluice_engine::commit::{CommitConfig, DEFAULT_COMMIT_DELAY};
use sluice_engine::vfs::VfsConfig;

/// How long closes wait for company before their group commit starts.
#[derive(Debug, Clone, clap::Args)]
pub struct CommitArgs {
    /// How long, in milliseconds, a file's commit that no one waits for (a
    /// close) waits for others to share its sync; an fsync never waits for
    /// company. 0 starts each group as soon as the one before ends (commits
    /// still gather while a sync runs).
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_COMMIT_DELAY.as_secs_f64() * 1e3)]
    pub commit_delay: f64,
}

/// The longest `--commit-delay`: a close is visible to other processes of
/// the volume only once its group ran, so the wait must stay short.
const MAX_COMMIT_DELAY_MS: f64 = 1000.0;

impl CommitArgs {
    /// Checks the value and puts it into `cfg`.
    pub fn apply(&self, mut cfg: VfsConfig) -> anyhow::Result<VfsConfig> {
        if !(self.commit_delay.is_finite()
            && (0.0..=MAX_COMMIT_DELAY_MS).contains(&self.commit_delay))
        {
            bail!(
                "--commit-delay takes milliseconds from 0 to {MAX_COMMIT_DELAY_MS} (got {})",
                self.commit_delay
            );
        }
        cfg.commit = CommitConfig {
            delay: Duration::from_secs_f64(self.commit_delay / 1e3),
            ..cfg.commit
        };
        Ok(cfg)
    }
}
