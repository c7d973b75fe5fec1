//! Confinement by ancestry: whether a node lies under an export's root,
//! answered from the nodes' parents, not from what was handed out.
//!
//! A node a confined client holds can leave the export after the client
//! got it: the host or another client renames its directory away, or it is
//! deleted into the trash. Every request that names a node by id (rather
//! than through an open handle, which stays valid as an open descriptor
//! does) therefore checks that the node is still below the root: a
//! directory's chain of parents (a directory has exactly one) must reach
//! the root before the volume's root; a file's single parent must be such a
//! directory. A file with several hard links has no single parent in the
//! JuiceFS format (`parent` 0, the parents in `jfs_edge`, which has no
//! index by inode in the SQL schema): it is taken to be inside, since the
//! client reached it through a name inside and a lookup of its parents
//! would scan the volume's directory table.
//!
//! Walking the parents on every request would cost one metadata read per
//! level, so nodes found inside are remembered. A memory is good while the
//! export has made no change that can move a node out (RENAME, RMDIR and
//! UNLINK through it bump an epoch, which forgets everything at once) and
//! for at most [`RECHECK`]: other daemons of the volume (the host, other
//! VMs) send no notice of their renames, so a node they move out is refused
//! at most that long after the move, the same bound a kernel client has
//! on its cached entries and attributes (JuiceFS's default timeouts).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_api::meta::{Attr, Context, FileType, Ino, ROOT_INO};
use sluice_api::{Error, Result};

use sluice_api::filesystem::Filesystem;

/// How long a node found inside the export is trusted without a new walk.
pub const RECHECK: Duration = Duration::from_secs(1);

/// The most parents a walk follows; a longer chain can only be a loop in
/// corrupt metadata, and is answered "outside".
pub const MAX_DEPTH: usize = 1 << 12;

/// The most nodes remembered; past it the memory starts over (a walk
/// remembers every directory it passes, so hot paths come back at once).
const MAX_KNOWN: usize = 1 << 16;

/// When a node was found inside.
#[derive(Debug, Clone, Copy)]
struct Seen {
    epoch: u64,
    at: Instant,
}

/// The ancestry check of one export (see the module documentation).
#[derive(Debug)]
pub struct Ancestry {
    root: Ino,
    recheck: Duration,
    epoch: AtomicU64,
    known: Mutex<HashMap<Ino, Seen>>,
    walks: AtomicU64,
    steps: AtomicU64,
}

impl Ancestry {
    /// The check for an export whose root is `root`.
    pub fn new(root: Ino, recheck: Duration) -> Ancestry {
        Ancestry {
            root,
            recheck,
            epoch: AtomicU64::new(0),
            known: Mutex::new(HashMap::new()),
            walks: AtomicU64::new(0),
            steps: AtomicU64::new(0),
        }
    }

    /// A change through the export that can move nodes out (rename, rmdir,
    /// unlink): everything remembered is checked again.
    pub fn moved(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// The client forgot `ino`.
    pub fn forget(&self, ino: Ino) {
        self.known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&ino);
    }

    /// `child` was just found by name in `dir`, which is inside: it is
    /// inside too (unless `dir` moved out in between, which the next check
    /// after the epoch or the recheck time catches).
    pub fn found_in(&self, dir: Ino, child: Ino) {
        let epoch = self.epoch.load(Ordering::Acquire);
        if dir == self.root || self.fresh(dir) {
            self.remember(&[child], epoch);
        }
    }

    /// (walks, parent reads) done so far: how much work the checks cost.
    pub fn work(&self) -> (u64, u64) {
        (
            self.walks.load(Ordering::Relaxed),
            self.steps.load(Ordering::Relaxed),
        )
    }

    fn fresh(&self, ino: Ino) -> bool {
        let epoch = self.epoch.load(Ordering::Acquire);
        let known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        known
            .get(&ino)
            .is_some_and(|s| s.epoch == epoch && s.at.elapsed() < self.recheck)
    }

    /// Remembers `nodes` as found inside by a check that began at `epoch`
    /// (if a change came since, the memory is stale from the start).
    fn remember(&self, nodes: &[Ino], epoch: u64) {
        let seen = Seen {
            epoch,
            at: Instant::now(),
        };
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        if known.len() + nodes.len() > MAX_KNOWN {
            known.clear();
        }
        for &n in nodes {
            known.insert(n, seen);
        }
    }

    /// Whether `ino` lies under the root. `attr`, when the caller has the
    /// node's attributes at hand, saves one read. A node that no longer
    /// exists is stale.
    pub fn inside<F: Filesystem>(&self, fs: &F, ino: Ino, attr: Option<&Attr>) -> Result<bool> {
        if ino == self.root || self.fresh(ino) {
            return Ok(true);
        }
        // Read the epoch before the walk: a change during it makes what
        // the walk found stale at once.
        let epoch = self.epoch.load(Ordering::Acquire);
        self.walks.fetch_add(1, Ordering::Relaxed);
        let ctx = Context::internal();
        let read = |n: Ino| -> Result<Attr> {
            self.steps.fetch_add(1, Ordering::Relaxed);
            fs.getattr(&ctx, n).map_err(|e| match e {
                Error::NotFound => Error::Stale,
                e => e,
            })
        };
        let attr = match attr {
            Some(a) => a.clone(),
            None => read(ino)?,
        };
        if attr.typ != FileType::Directory && attr.parent == 0 {
            // Several hard links: see the module documentation.
            return Ok(true);
        }
        let mut passed = vec![ino];
        let mut cur = attr.parent;
        for _ in 0..MAX_DEPTH {
            if cur == self.root || self.fresh(cur) {
                self.remember(&passed, epoch);
                return Ok(true);
            }
            if cur == ROOT_INO || cur == 0 {
                return Ok(false);
            }
            let up = read(cur)?;
            if up.typ != FileType::Directory || up.parent == cur {
                return Ok(false);
            }
            passed.push(cur);
            cur = up.parent;
        }
        Ok(false)
    }
}
