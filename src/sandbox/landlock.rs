//! The file-system half of the sandbox: a Landlock domain that leaves the
//! daemon the volume's local files and what its libraries read, and nothing
//! else. Best effort: an older kernel enforces what it knows, one without
//! Landlock none of it (logged).

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use landlock::{
    ABI, Access, AccessFs, BitFlags, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
    path_beneath_rules,
};

use super::LocalState;

/// The newest ABI this code asks for; older kernels get what they support.
const ABI_WANTED: ABI = ABI::V5;

/// Read-only paths libraries use after setup besides the name service's
/// files (`resolver`): the NSS modules glibc loads to resolve S3 and Redis
/// hosts, TLS roots, time zones, randomness, this process's own /proc
/// entries (thread names, `/proc/self/fd/N` reopens) and the NUMA topology.
const READ_ONLY: &[&str] = &[
    "/etc/localtime",
    "/etc/ssl",
    "/etc/pki",
    "/etc/ca-certificates",
    "/usr/share/ca-certificates",
    "/usr/lib",
    "/usr/lib64",
    "/lib",
    "/lib64",
    "/proc/self",
    "/sys/devices/system/node",
    "/sys/devices/system/cpu",
    "/dev/urandom",
    "/dev/random",
];

/// Read and write, no directory changes.
const READ_WRITE_FILES: &[&str] = &["/dev/null"];

/// Restricts the calling thread, and every thread it starts later, to
/// `state`, the paths above and the name service's files; `as_root`: the
/// daemon keeps running as root (see `resolver::paths`).
pub fn restrict(state: &LocalState, as_root: bool) -> anyhow::Result<()> {
    let all = AccessFs::from_all(ABI_WANTED);
    let read = AccessFs::from_read(ABI_WANTED);
    let file_rw: BitFlags<AccessFs> = read | AccessFs::WriteFile | AccessFs::Truncate;
    let mut full: Vec<PathBuf> = state.trees.clone();
    if let Some(db) = &state.database {
        // SQLite creates and deletes its -wal, -shm and -journal beside the
        // database (and was given that directory for it).
        full.push(
            std::fs::canonicalize(db)?
                .parent()
                .unwrap_or(Path::new("/"))
                .to_owned(),
        );
    }
    let existing = |paths: Vec<PathBuf>| -> Vec<PathBuf> {
        paths.into_iter().filter(|p| p.exists()).collect()
    };
    let mut ro: Vec<PathBuf> = READ_ONLY.iter().map(PathBuf::from).collect();
    ro.extend(super::resolver::paths(as_root));
    ro.extend(state.read.iter().cloned());
    if state.tls_roots {
        ro.extend(super::tls_roots::paths());
    }
    let status = Ruleset::default()
        .handle_access(all)
        .context("cannot set up Landlock")?
        .create()
        .context("cannot set up Landlock")?
        .add_rules(path_beneath_rules(existing(full.clone()), all))
        .context("cannot add the volume's directories to the Landlock rules")?
        .add_rules(path_beneath_rules(existing(ro), read))
        .context("cannot add the read-only paths to the Landlock rules")?
        .add_rules(path_beneath_rules(
            existing(READ_WRITE_FILES.iter().map(PathBuf::from).collect()),
            file_rw,
        ))
        .context("cannot add /dev/null to the Landlock rules")?
        .restrict_self()
        .context("cannot enforce the Landlock rules")?;
    let dirs: Vec<String> = full.iter().map(|p| p.display().to_string()).collect();
    match status.ruleset {
        RulesetStatus::FullyEnforced => {
            log::info!("Landlock: files only under {}", dirs.join(", "))
        }
        RulesetStatus::PartiallyEnforced => log::info!(
            "Landlock (partly, this kernel's ABI is older): files only under {}",
            dirs.join(", ")
        ),
        RulesetStatus::NotEnforced => {
            log::warn!("this kernel has no Landlock: the file system is not confined")
        }
    }
    Ok(())
}
