//! Capacity and quotas, as JuiceFS keeps them: the volume's `Capacity` and
//! `Inodes` settings (ENOSPC) and directory quotas (EDQUOT) stored in
//! JuiceFS's `jfs_dir_quota` table or `dirQuota*` hashes.
//!
//! The rules live here, once; the engines provide storage and call two
//! hooks from inside their transactions: [`Quotas::check_volume`] where the
//! volume's usage counters grow, and [`Quotas::quota_dirs`] /
//! [`Quotas::check_dirs`] where a directory's statistics grow. What a
//! transaction adds is gathered in a [`UsageDelta`], written to the quota
//! records in the same transaction (so the stored usage is exact and
//! survives a crash) and added to the in-memory copy once it commits.
//!
//! Checks run against memory: the limits and usage read at load and at each
//! heartbeat (another client's changes show up within one), plus this
//! client's own committed changes. The quota directories above a directory
//! are found by walking an in-memory cache of directory parents; a volume
//! without directory quotas skips the walk. See `engine/DESIGN.md`,
//! "Capacity and quotas".

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

use crate::error::{Error, Result};
use crate::format::Format;
use crate::meta::rules::align4k;
use crate::meta::{Attr, Context, FileType, Ino, Meta, ROOT_INO, RenameFlags, TRASH_INO};

/// A directory quota as stored: limits (0 or negative = no limit) and the
/// usage of everything below the directory (the directory itself not
/// counted), JuiceFS's `Quota`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DirQuota {
    /// Bytes allowed (each node rounded up to 4 KiB, as `usedSpace`).
    pub max_space: i64,
    /// Nodes allowed.
    pub max_inodes: i64,
    /// Bytes used below the directory.
    pub used_space: i64,
    /// Nodes below the directory.
    pub used_inodes: i64,
}

impl DirQuota {
    /// Whether the quota limits anything (JuiceFS lists only those).
    pub fn limits(&self) -> bool {
        self.max_space > 0 || self.max_inodes > 0
    }
}

/// A change of a directory quota record; `None` leaves a field as it is
/// (a new record gets no limit and zero usage for the fields left out).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QuotaChange {
    /// New space limit in bytes (0 = none).
    pub max_space: Option<i64>,
    /// New inode limit (0 = none).
    pub max_inodes: Option<i64>,
    /// New usage: (space, inodes).
    pub usage: Option<(i64, i64)>,
}

/// What one transaction adds to the usage the quotas count.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct UsageDelta {
    /// Bytes added to the volume (`usedSpace`).
    pub space: i64,
    /// Nodes added to the volume (`totalInodes`).
    pub inodes: i64,
    /// Per quota directory: (bytes, nodes) added below it.
    pub dirs: BTreeMap<Ino, (i64, i64)>,
}

impl UsageDelta {
    /// Adds (space, inodes) to each of `dirs`.
    pub fn add_dirs(&mut self, dirs: &[Ino], space: i64, inodes: i64) {
        for d in dirs {
            let e = self.dirs.entry(*d).or_default();
            e.0 += space;
            e.1 += inodes;
        }
    }

    /// The quota directories whose usage changed, with the change.
    pub fn dir_changes(&self) -> impl Iterator<Item = (Ino, i64, i64)> + '_ {
        self.dirs
            .iter()
            .filter(|(_, (s, i))| *s != 0 || *i != 0)
            .map(|(d, (s, i))| (*d, *s, *i))
    }
}

/// The in-memory copy of one directory quota.
#[derive(Debug, Default)]
struct Limit {
    max_space: AtomicI64,
    max_inodes: AtomicI64,
    used_space: AtomicI64,
    used_inodes: AtomicI64,
}

impl Limit {
    /// Whether adding (space, inodes) to the usage, after `pending` of the
    /// same transaction, would pass a limit. Only growth is checked.
    fn exceeded(&self, pending: (i64, i64), space: i64, inodes: i64) -> bool {
        let over = |max: &AtomicI64, used: &AtomicI64, pending: i64, add: i64| {
            let max = max.load(Ordering::Relaxed);
            add > 0 && max > 0 && used.load(Ordering::Relaxed) + pending + add > max
        };
        over(&self.max_space, &self.used_space, pending.0, space)
            || over(&self.max_inodes, &self.used_inodes, pending.1, inodes)
    }
}

/// Most directory parents the cache keeps before it starts over.
const MAX_CACHED_PARENTS: usize = 1 << 20;

/// The limits and usage a client checks against (one per engine instance).
#[derive(Debug, Default)]
pub struct Quotas {
    /// The volume's `Capacity` in bytes (0 = unlimited).
    capacity: AtomicU64,
    /// The volume's `Inodes` (0 = unlimited).
    max_inodes: AtomicU64,
    /// Whether `DirStats` is on (JuiceFS keeps directory quotas only then).
    dir_stats: AtomicBool,
    /// `usedSpace` as last read plus this client's commits since.
    used_space: AtomicI64,
    /// `totalInodes` as last read plus this client's commits since.
    used_inodes: AtomicI64,
    /// Directory quotas by directory inode.
    dirs: RwLock<HashMap<Ino, Limit>>,
    /// Whether `dirs` is not empty (the fast path of every check).
    any_dir: AtomicBool,
    /// Directory → its parent, for the walk up to the quota directories.
    /// Dropped at each reload, so another client's renames show up.
    parents: Mutex<HashMap<Ino, Ino>>,
}

impl Quotas {
    /// Installs what was read from the store: the settings, the usage
    /// counters and every directory quota. Forgets the cached parents.
    pub fn install(
        &self,
        fmt: &Format,
        used_space: i64,
        used_inodes: i64,
        dirs: &[(Ino, DirQuota)],
    ) {
        self.capacity.store(fmt.capacity, Ordering::Relaxed);
        self.max_inodes.store(fmt.inodes, Ordering::Relaxed);
        self.dir_stats.store(fmt.dir_stats, Ordering::Relaxed);
        self.used_space.store(used_space, Ordering::Relaxed);
        self.used_inodes.store(used_inodes, Ordering::Relaxed);
        let mut map = self.dirs.write();
        map.retain(|ino, _| dirs.iter().any(|(d, _)| d == ino));
        for (ino, q) in dirs {
            let l = map.entry(*ino).or_default();
            l.max_space.store(q.max_space, Ordering::Relaxed);
            l.max_inodes.store(q.max_inodes, Ordering::Relaxed);
            l.used_space.store(q.used_space, Ordering::Relaxed);
            l.used_inodes.store(q.used_inodes, Ordering::Relaxed);
        }
        self.any_dir
            .store(fmt.dir_stats && !map.is_empty(), Ordering::Release);
        drop(map);
        self.parents.lock().clear();
    }

    /// Fails with `NoSpace` when adding (space, inodes) to the volume, after
    /// what `pending` already adds, would pass its `Capacity` or `Inodes`.
    pub fn check_volume(&self, pending: &UsageDelta, space: i64, inodes: i64) -> Result<()> {
        let cap = self.capacity.load(Ordering::Relaxed) as i64;
        if space > 0
            && cap > 0
            && self.used_space.load(Ordering::Relaxed) + pending.space + space > cap
        {
            return Err(Error::NoSpace);
        }
        let max = self.max_inodes.load(Ordering::Relaxed) as i64;
        if inodes > 0
            && max > 0
            && self.used_inodes.load(Ordering::Relaxed) + pending.inodes + inodes > max
        {
            return Err(Error::NoSpace);
        }
        Ok(())
    }

    /// Whether any directory quota is in force.
    pub fn has_dir_quotas(&self) -> bool {
        self.any_dir.load(Ordering::Acquire)
    }

    /// The directories with a quota among `dir` and its ancestors (nearest
    /// first). `parent_of` reads a directory's parent from the store when
    /// the cache lacks it (`None`: the directory is gone). Trash directories
    /// count for no quota. Free when the volume has no directory quota.
    pub fn quota_dirs<E>(
        &self,
        dir: Ino,
        mut parent_of: impl FnMut(Ino) -> std::result::Result<Option<Ino>, E>,
    ) -> std::result::Result<Vec<Ino>, E> {
        let mut out = Vec::new();
        if !self.has_dir_quotas() || dir >= TRASH_INO {
            return Ok(out);
        }
        let mut ino = dir;
        // A cycle can only come from a corrupt store; the depth bound ends it.
        for _ in 0..4096 {
            if self.dirs.read().contains_key(&ino) {
                out.push(ino);
            }
            if ino <= ROOT_INO {
                break;
            }
            let cached = self.parents.lock().get(&ino).copied();
            let parent = match cached {
                Some(p) => p,
                None => match parent_of(ino)? {
                    Some(p) => {
                        let mut cache = self.parents.lock();
                        if cache.len() >= MAX_CACHED_PARENTS {
                            cache.clear();
                        }
                        cache.insert(ino, p);
                        p
                    }
                    None => break,
                },
            };
            if parent == 0 || parent >= TRASH_INO {
                break;
            }
            ino = parent;
        }
        Ok(out)
    }

    /// Fails with `QuotaExceeded` when adding (space, inodes) below each of
    /// `dirs` (from [`Quotas::quota_dirs`]), after `pending`, passes a limit.
    pub fn check_dirs(
        &self,
        dirs: &[Ino],
        pending: &UsageDelta,
        space: i64,
        inodes: i64,
    ) -> Result<()> {
        if space <= 0 && inodes <= 0 {
            return Ok(());
        }
        let map = self.dirs.read();
        for d in dirs {
            if let Some(l) = map.get(d) {
                let p = pending.dirs.get(d).copied().unwrap_or_default();
                if l.exceeded(p, space, inodes) {
                    return Err(Error::QuotaExceeded);
                }
            }
        }
        Ok(())
    }

    /// Adds a committed transaction's usage to the in-memory copy.
    pub fn apply(&self, delta: &UsageDelta) {
        self.used_space.fetch_add(delta.space, Ordering::Relaxed);
        self.used_inodes.fetch_add(delta.inodes, Ordering::Relaxed);
        if delta.dirs.is_empty() {
            return;
        }
        let map = self.dirs.read();
        for (d, s, i) in delta.dir_changes() {
            if let Some(l) = map.get(&d) {
                l.used_space.fetch_add(s, Ordering::Relaxed);
                l.used_inodes.fetch_add(i, Ordering::Relaxed);
            }
        }
    }

    /// Records that directory `dir` now lives in `parent` (after a rename).
    pub fn moved_dir(&self, dir: Ino, parent: Ino) {
        let mut cache = self.parents.lock();
        if cache.contains_key(&dir) {
            cache.insert(dir, parent);
        }
    }

    /// The in-memory copy of a directory's quota, if it has one.
    pub fn dir_quota(&self, dir: Ino) -> Option<DirQuota> {
        self.dirs.read().get(&dir).map(|l| DirQuota {
            max_space: l.max_space.load(Ordering::Relaxed),
            max_inodes: l.max_inodes.load(Ordering::Relaxed),
            used_space: l.used_space.load(Ordering::Relaxed),
            used_inodes: l.used_inodes.load(Ordering::Relaxed),
        })
    }
}

/// Warns (at load) about JuiceFS quotas sluice does not keep: user and
/// group quotas (`UserGroupQuota`, JuiceFS 1.3+), which sluice neither
/// enforces nor counts.
pub fn warn_unsupported(fmt: &Format) {
    if fmt.extra.get("UserGroupQuota") == Some(&serde_json::Value::Bool(true)) {
        log::warn!(
            "volume {:?} has user/group quotas (juicefs quota --uid/--gid): sluice does not \
             enforce them or count its changes in them; `juicefs quota check --repair` \
             recomputes their usage",
            fmt.name
        );
    }
}

/// What a node contributes to a quota's usage: its space (a file's length
/// rounded up to 4 KiB, 4 KiB for anything else) and one inode.
pub fn node_usage(typ: FileType, length: u64) -> (i64, i64) {
    let len = if typ == FileType::File { length } else { 0 };
    (align4k(len), 1)
}

/// The usage of everything below directory `dir` (the directory itself not
/// counted), computed from the tree as `juicefs quota check --strict` does:
/// every entry counts (a hard link once per entry). Walks one directory
/// listing at a time; memory holds the listing and the directories still
/// to visit.
pub fn tree_usage(meta: &dyn Meta, dir: Ino) -> Result<(i64, i64)> {
    let ctx = Context::internal();
    let (mut space, mut inodes) = (0i64, 0i64);
    let mut todo = VecDeque::from([dir]);
    while let Some(d) = todo.pop_front() {
        let entries = match meta.readdir(&ctx, d, true) {
            Ok(e) => e,
            // Removed while we walked: it no longer counts.
            Err(Error::NotFound) if d != dir => continue,
            Err(e) => return Err(e),
        };
        for e in entries {
            if e.name == b"." || e.name == b".." || e.inode >= TRASH_INO {
                continue;
            }
            let (s, i) = node_usage(e.attr.typ, e.attr.length);
            space += s;
            inodes += i;
            if e.attr.typ == FileType::Directory {
                todo.push_back(e.inode);
            }
        }
    }
    Ok((space, inodes))
}

/// A directory rename's effect on the quotas, JuiceFS's rule: when the
/// nearest quota directories above the source and the destination differ,
/// the moved node's whole usage leaves the source's quotas and joins the
/// destination's, and must fit there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenameMove {
    /// The quota directories the moved directory was below.
    src: Vec<Ino>,
    /// The usage below it, which the engine's per-entry accounting leaves
    /// out: (space, inodes).
    below: (i64, i64),
}

/// Checks a rename against the destination's quotas before it runs. For a
/// moved directory across quota boundaries, returns the usage below it,
/// which [`after_rename`] moves once the rename committed (the entry itself
/// is counted by the engine in the rename's own transaction).
pub fn before_rename(
    meta: &dyn Meta,
    ctx: &Context,
    parent_src: Ino,
    name_src: &[u8],
    parent_dst: Ino,
) -> Result<Option<RenameMove>> {
    let q = meta.quotas();
    if !q.has_dir_quotas() || parent_src == parent_dst {
        return Ok(None);
    }
    let parent_of = |ino: Ino| match meta.getattr(ino) {
        Ok(a) => Ok(Some(a.parent)),
        Err(Error::NotFound) => Ok(None),
        Err(e) => Err(e),
    };
    let src = q.quota_dirs(parent_src, parent_of)?;
    let dst = q.quota_dirs(parent_dst, parent_of)?;
    if src.first() == dst.first() {
        return Ok(None);
    }
    let (ino, attr) = meta.lookup(ctx, parent_src, name_src)?;
    let own = node_usage(attr.typ, attr.length);
    let below = if attr.typ == FileType::Directory {
        match q.dir_quota(ino) {
            Some(dq) => (dq.used_space, dq.used_inodes),
            None => tree_usage(meta, ino)?,
        }
    } else {
        (0, 0)
    };
    // Only the quotas the node enters must hold it.
    let entering: Vec<Ino> = dst.iter().copied().filter(|d| !src.contains(d)).collect();
    q.check_dirs(
        &entering,
        &UsageDelta::default(),
        own.0 + below.0,
        own.1 + below.1,
    )?;
    Ok((attr.typ == FileType::Directory && below != (0, 0)).then_some(RenameMove { src, below }))
}

/// Moves the usage below a renamed directory from the source's quotas to
/// the destination's (see [`before_rename`]) and keeps the cache of
/// directory parents right: `moved` is what the rename returned.
pub fn after_rename(
    meta: &dyn Meta,
    below: Option<RenameMove>,
    parent_dst: Ino,
    flags: RenameFlags,
    moved: &(Ino, Attr),
) -> Result<()> {
    let q = meta.quotas();
    if flags.exchange {
        // The other node moved too, and the reply does not name it.
        q.parents.lock().clear();
    } else if moved.1.typ == FileType::Directory {
        q.moved_dir(moved.0, parent_dst);
    }
    let Some(m) = below else {
        return Ok(());
    };
    let parent_of = |ino: Ino| match meta.getattr(ino) {
        Ok(a) => Ok(Some(a.parent)),
        Err(Error::NotFound) => Ok(None),
        Err(e) => Err(e),
    };
    let mut delta = UsageDelta::default();
    delta.add_dirs(&m.src, -m.below.0, -m.below.1);
    let dst = q.quota_dirs(parent_dst, parent_of)?;
    delta.add_dirs(&dst, m.below.0, m.below.1);
    let changes: Vec<(Ino, i64, i64)> = delta.dir_changes().collect();
    if changes.is_empty() {
        return Ok(());
    }
    meta.add_dir_quota_usage(&changes)?;
    q.apply(&delta);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fmt(capacity: u64, inodes: u64) -> Format {
        let mut f: Format = serde_json::from_str(
            r#"{"Name":"t","UUID":"u","Storage":"file","Bucket":"/b/","BlockSize":4096,"TrashDays":0}"#,
        )
        .expect("format");
        f.capacity = capacity;
        f.inodes = inodes;
        f.dir_stats = true;
        f
    }

    #[test]
    fn volume_limits_count_pending_and_only_growth() {
        let q = Quotas::default();
        q.install(&fmt(10 * 4096, 3), 8 * 4096, 2, &[]);
        let mut pending = UsageDelta::default();
        q.check_volume(&pending, 2 * 4096, 1).expect("fits exactly");
        assert!(matches!(
            q.check_volume(&pending, 3 * 4096, 0),
            Err(Error::NoSpace)
        ));
        assert!(matches!(
            q.check_volume(&pending, 0, 2),
            Err(Error::NoSpace)
        ));
        pending.space = 4096;
        assert!(matches!(
            q.check_volume(&pending, 2 * 4096, 0),
            Err(Error::NoSpace)
        ));
        // Shrinking never fails, even over the limit.
        q.check_volume(&pending, -4096, -1).expect("shrink");
    }

    #[test]
    fn nested_quotas_are_found_through_the_parent_walk() {
        let q = Quotas::default();
        let outer = DirQuota {
            max_space: 0,
            max_inodes: 5,
            used_space: 0,
            used_inodes: 4,
        };
        let inner = DirQuota {
            max_space: 100 * 4096,
            max_inodes: 0,
            ..DirQuota::default()
        };
        q.install(&fmt(0, 0), 0, 0, &[(2, outer), (3, inner)]);
        // 1 ← 2 ← 3 ← 4
        let parents = HashMap::from([(4, 3), (3, 2), (2, 1)]);
        let mut reads = 0;
        let dirs = q
            .quota_dirs(4, |i| {
                reads += 1;
                Ok::<_, Error>(parents.get(&i).copied())
            })
            .expect("walk");
        assert_eq!(dirs, vec![3, 2]);
        assert_eq!(reads, 3);
        // Cached now.
        let again = q
            .quota_dirs(4, |_| -> Result<Option<Ino>> { panic!("cached") })
            .expect("walk");
        assert_eq!(again, vec![3, 2]);
        let none = UsageDelta::default();
        q.check_dirs(&dirs, &none, 4096, 1)
            .expect("one more inode fits");
        assert!(matches!(
            q.check_dirs(&dirs, &none, 4096, 2),
            Err(Error::QuotaExceeded)
        ));
        let mut d = UsageDelta::default();
        d.add_dirs(&dirs, 4096, 1);
        q.apply(&d);
        assert_eq!(q.dir_quota(2).map(|x| x.used_inodes), Some(5));
        assert!(matches!(
            q.check_dirs(&dirs, &none, 4096, 1),
            Err(Error::QuotaExceeded)
        ));
    }

    #[test]
    fn no_walk_without_directory_quotas() {
        let q = Quotas::default();
        q.install(&fmt(0, 0), 0, 0, &[]);
        let dirs = q
            .quota_dirs(7, |_| -> Result<Option<Ino>> { panic!("no walk") })
            .expect("walk");
        assert!(dirs.is_empty());
    }
}
