//! `sluice fsck`: checks a volume's metadata against itself and against
//! its object store, and repairs what can be recomputed.
//!
//! What it finds (each problem names the file or directory it harms):
//!
//! - **Damaged blocks**: a block object some file's slice needs that is
//!   missing, has the wrong size, or (unless checks are `fast`) fails its
//!   CRC32C — the checksum sluice stores with every object it writes
//!   (`file://`: an xattr; S3: `x-amz-checksum-crc32c`) — or does not
//!   decompress. `juicefs fsck` finds the missing ones (its "lost
//!   blocks"); it never reads data, so it cannot see a flipped byte.
//! - **Broken slice references**: a chunk record naming a slice with no
//!   reference left (the engine may delete its objects while the file still
//!   needs them), a slice id the volume never handed out, or a record
//!   pointing past its slice's end.
//! - **Orphaned chunks**: chunk records of a node that no longer exists
//!   and is not a removed file awaiting deletion (whole-volume runs).
//! - **Wrong usage counters** (`usedSpace`, `totalInodes`) against the walk
//!   of the whole tree, the trash included (whole-volume runs).
//! - **Wrong directory statistics** (`DirStats`): the data length, space
//!   and entry count stored for a directory against its entries. A
//!   directory with none stored is sound: the engines compute them when
//!   next needed, as JuiceFS does.
//! - **Wrong directory link counts** (2 + subdirectories).
//! - **Unreferenced objects**: block objects no chunk names, older than an
//!   hour (younger ones may belong to a slice being written) — `sluice gc`
//!   removes them (whole-volume runs).
//!
//! `repair` rewrites the usage counters and the directory statistics,
//! which are pure functions of the tree. It cannot bring back lost or
//! corrupt data, and does not guess at references or link counts: those
//! stay in the report, with the paths they harm.
//!
//! The walk reads one directory page at a time, as `sluice dump` does. On
//! a volume in use, a change made while the walk passes can show up as a
//! counter or statistic off by that change: check (and above all repair)
//! a volume no client is writing.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

use crate::block_key::{block_count, block_key, block_len, chunks_prefix, parse_block_key};
use crate::compress::decompress;
use crate::error::{Error, Result};
use crate::format::Compression;
use crate::meta::rules::align4k;
use crate::meta::{Context, DirCursor, DirStat, FileType, Ino, ROOT_INO, Slice, TRASH_INO};
use crate::object::is_not_found;
use crate::volume::Volume;

/// Directory entries read per page.
const PAGE: usize = 1024;
/// Chunk indexes listed per call.
const CHUNK_PAGE: usize = 1024;
/// Block reads queued before they are done (in parallel).
const READ_BATCH: usize = 1024;
/// How often block reads report progress (a batch may take minutes).
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

/// What `sluice fsck` checks and whether it repairs.
#[derive(Debug, Clone)]
pub struct FsckOptions {
    /// The absolute path within the volume to check (`/`: everything,
    /// including the volume-wide checks).
    pub path: String,
    /// Rewrite the usage counters and directory statistics found wrong.
    pub repair: bool,
    /// Only list objects (as `juicefs fsck` does); without it every block
    /// a file needs is read and its CRC32C checked.
    pub fast: bool,
    /// Unreferenced objects younger than this are not reported.
    pub min_age: Duration,
    /// Blocks read at once (each read is one GET; an S3 store needs many
    /// in flight to be checked at its bandwidth).
    pub threads: usize,
}

impl Default for FsckOptions {
    fn default() -> Self {
        FsckOptions {
            path: "/".into(),
            repair: false,
            fast: false,
            min_age: Duration::from_secs(3600),
            threads: 16,
        }
    }
}

/// What is wrong with one block object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockDamage {
    /// The object does not exist.
    Missing,
    /// The object's size is not the one its key (and slice) says.
    Size {
        /// The size the block must have.
        expected: u64,
        /// The size it has.
        actual: u64,
    },
    /// Reading it failed its checksum or its decompression.
    Corrupt(String),
    /// It could not be read for another reason (the store's error).
    Unreadable(String),
}

/// A damaged block and the file that needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DamagedBlock {
    /// The object key.
    pub key: String,
    /// The file's inode.
    pub ino: Ino,
    /// What is wrong.
    pub damage: BlockDamage,
}

/// A chunk record that names a slice wrongly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokenSlice {
    /// The file's inode.
    pub ino: Ino,
    /// The chunk index.
    pub indx: u32,
    /// The record.
    pub slice: Slice,
    /// What is wrong with it.
    pub reason: String,
}

/// A value stored in the metadata that disagrees with the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch<T> {
    /// The directory's inode (0 for the volume counters).
    pub ino: Ino,
    /// Its path.
    pub path: String,
    /// What is stored (`None`: nothing).
    pub stored: Option<T>,
    /// What the tree says it must be.
    pub actual: T,
}

/// Everything one run found and did.
#[derive(Debug, Clone, Default)]
pub struct FsckReport {
    /// Nodes walked.
    pub nodes: u64,
    /// Regular files whose chunks were checked.
    pub files: u64,
    /// Slice records checked.
    pub slices: u64,
    /// Block objects checked, and their bytes.
    pub blocks: u64,
    /// Bytes of the blocks checked.
    pub block_bytes: u64,
    /// Blocks read back and their checksums checked so far (none with
    /// `fast`).
    pub read_blocks: u64,
    /// Bytes of the blocks read back (their lengths in the file).
    pub read_bytes: u64,
    /// Damaged blocks.
    pub damaged: Vec<DamagedBlock>,
    /// Broken slice records.
    pub broken_slices: Vec<BrokenSlice>,
    /// Files harmed by a damaged block or broken slice: inode → path.
    pub broken_files: BTreeMap<Ino, String>,
    /// Chunk records (inode, index) of nodes that do not exist.
    pub orphan_chunks: Vec<(Ino, u32)>,
    /// The usage counters (space, inodes), when wrong.
    pub usage: Option<Mismatch<(i64, i64)>>,
    /// Directories whose stored statistics are wrong.
    pub dir_stats: Vec<Mismatch<DirStat>>,
    /// Directories whose link count is wrong.
    pub nlinks: Vec<Mismatch<u32>>,
    /// Block objects no chunk names (older than the age limit).
    pub unreferenced: u64,
    /// Bytes of those objects.
    pub unreferenced_bytes: u64,
    /// sluice's space records of nodes that no longer exist (a JuiceFS
    /// client removed a file with holes): waste, never read again (inode
    /// numbers are not reused); removed with `repair`.
    pub orphan_space_records: u64,
    /// Whether the usage counters and directory statistics found wrong
    /// were rewritten.
    pub repaired: bool,
}

impl FsckReport {
    /// Whether nothing is wrong (unreferenced objects are waste, not
    /// damage: they do not count).
    pub fn clean(&self) -> bool {
        self.damaged.is_empty()
            && self.broken_slices.is_empty()
            && self.orphan_chunks.is_empty()
            && self.usage.is_none()
            && self.dir_stats.is_empty()
            && self.nlinks.is_empty()
    }

    /// Whether something is wrong that this run did not repair.
    pub fn unrepaired(&self) -> bool {
        let fixed = self.repaired;
        !self.damaged.is_empty()
            || !self.broken_slices.is_empty()
            || !self.orphan_chunks.is_empty()
            || !self.nlinks.is_empty()
            || (!fixed && (self.usage.is_some() || !self.dir_stats.is_empty()))
    }
}

/// One open directory of the walk.
struct Frame {
    ino: Ino,
    path: String,
    nlink: u32,
    cursor: Option<DirCursor>,
    seen: Option<HashSet<Vec<u8>>>,
    stat: DirStat,
    subdirs: u32,
}

/// Where the check of a slice's blocks stands.
enum SliceState {
    /// Checked: whether every block is sound.
    Done { ok: bool },
    /// Reads queued; the files naming the slice so far.
    Queued { users: Vec<(Ino, String)> },
}

/// A block read queued for its CRC32C check.
struct PendingRead {
    key: String,
    want: u32,
    ino: Ino,
    slice: (u64, u32),
}

struct Checker<'a> {
    vol: &'a Volume,
    opts: &'a FsckOptions,
    ctx: Context,
    /// Object key → (size, modification time), listed before the walk
    /// (whole-volume runs).
    listed: Option<HashMap<String, (u64, SystemTime)>>,
    /// Slices (id, size) met already: settled, or with reads queued.
    slices_seen: HashMap<(u64, u32), SliceState>,
    /// Block reads queued (not `fast`), done `READ_BATCH` at a time.
    pending: Vec<PendingRead>,
    next_slice: u64,
    report: FsckReport,
    progress: &'a mut dyn FnMut(&FsckReport),
}

/// Checks the volume (see the module docs) and, with `opts.repair`,
/// rewrites what it can. `progress` is called now and then with the report
/// so far.
pub fn fsck(
    vol: &Volume,
    opts: &FsckOptions,
    progress: &mut dyn FnMut(&FsckReport),
) -> Result<FsckReport> {
    if !opts.path.starts_with('/') {
        return Err(Error::Invalid(format!(
            "fsck needs an absolute path within the volume, not {:?}",
            opts.path
        )));
    }
    let whole = opts.path.trim_end_matches('/').is_empty();
    let meta = &*vol.meta;
    let ctx = Context::internal();
    let mut top = ROOT_INO;
    let mut top_attr = meta.getattr(ROOT_INO)?;
    for name in opts.path.split('/').filter(|n| !n.is_empty()) {
        let (ino, attr) = meta
            .lookup(&ctx, top, name.as_bytes())
            .map_err(|e| Error::Invalid(format!("cannot find {} in the volume: {e}", opts.path)))?;
        top = ino;
        top_attr = attr;
    }
    // List the objects before reading any chunk (as `sluice gc` does): a
    // slice committed in between then has its objects listed, and one
    // committed later is looked up by HEAD.
    let listed = if whole {
        let mut m = HashMap::new();
        for o in vol.store.list(&chunks_prefix(vol.name()))? {
            m.insert(o.key, (o.size, o.mtime));
        }
        Some(m)
    } else {
        None
    };
    let counters = meta.counters()?;
    let mut c = Checker {
        vol,
        opts,
        ctx,
        listed,
        slices_seen: HashMap::new(),
        pending: Vec::new(),
        next_slice: counters.next_slice.max(0) as u64,
        report: FsckReport::default(),
        progress,
    };
    let path = if whole {
        "/".to_string()
    } else {
        format!("/{}", opts.path.trim_matches('/'))
    };
    let mut counted: HashSet<Ino> = HashSet::new();
    let (mut space, mut inodes) = (0i64, 0i64);
    if top_attr.typ == FileType::Directory {
        c.walk(
            top,
            &path,
            top_attr.nlink,
            &mut counted,
            &mut space,
            &mut inodes,
        )?;
        // The trash is not listed in the root; what it holds counts.
        if whole {
            match meta.getattr(TRASH_INO) {
                Ok(trash) => c.walk(
                    TRASH_INO,
                    "/.trash",
                    trash.nlink,
                    &mut counted,
                    &mut space,
                    &mut inodes,
                )?,
                Err(Error::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
    } else {
        c.report.nodes = 1;
        if top_attr.typ == FileType::File {
            c.check_file(top, &path)?;
        }
    }
    c.flush_reads();
    if whole {
        if counters.used_space != space || counters.used_inodes != inodes {
            c.report.usage = Some(Mismatch {
                ino: 0,
                path: "the volume".into(),
                stored: Some((counters.used_space, counters.used_inodes)),
                actual: (space, inodes),
            });
        }
        c.volume_checks(&counted)?;
    }
    if opts.repair {
        c.repair(&counters)?;
    }
    (c.progress)(&c.report);
    Ok(c.report)
}

impl Checker<'_> {
    /// Walks the tree under directory `top`, checking each directory's
    /// statistics and link count as its listing completes and each file's
    /// chunks when first seen; adds every node below `top` to the volume
    /// usage (each hard-linked file once; the trash directory itself not).
    fn walk(
        &mut self,
        top: Ino,
        path: &str,
        nlink: u32,
        counted: &mut HashSet<Ino>,
        space: &mut i64,
        inodes: &mut i64,
    ) -> Result<()> {
        let meta = &*self.vol.meta;
        self.report.nodes += 1;
        let mut stack = vec![self.frame(top, path.to_string(), nlink)];
        while let Some(frame) = stack.last_mut() {
            let Some(cursor) = frame.cursor.take() else {
                let done = stack.pop().expect("a frame");
                self.finish_dir(done)?;
                continue;
            };
            let page = meta.readdir_page(&self.ctx, frame.ino, true, &cursor, PAGE)?;
            if page.may_repeat && frame.seen.is_none() {
                frame.seen = Some(HashSet::new());
            }
            frame.cursor = page.next;
            let dir = frame.ino;
            let dir_path = frame.path.clone();
            let mut subdirs = Vec::new();
            for e in page.entries {
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                let frame = stack.last_mut().expect("a frame");
                if let Some(seen) = &mut frame.seen
                    && !seen.insert(e.name.clone())
                {
                    continue;
                }
                let name = String::from_utf8_lossy(&e.name);
                let child_path = if dir_path == "/" {
                    format!("/{name}")
                } else {
                    format!("{dir_path}/{name}")
                };
                let trash_root = dir == ROOT_INO && e.inode == TRASH_INO;
                let typ = e.attr.typ;
                let length = if typ == FileType::File {
                    e.attr.length
                } else {
                    0
                };
                // The trash directory is in no statistic and no counter.
                if !trash_root {
                    frame.stat.data_length += length as i64;
                    frame.stat.used_space += align4k(length);
                    frame.stat.used_inodes += 1;
                    if typ == FileType::Directory {
                        frame.subdirs += 1;
                    }
                }
                let first = counted.insert(e.inode);
                if first && !trash_root {
                    *space += align4k(length);
                    *inodes += 1;
                }
                if !first {
                    continue;
                }
                self.report.nodes += 1;
                match typ {
                    FileType::Directory => subdirs.push((e.inode, child_path, e.attr.nlink)),
                    FileType::File => self.check_file(e.inode, &child_path)?,
                    _ => {}
                }
            }
            for (ino, p, n) in subdirs.into_iter().rev() {
                let f = self.frame(ino, p, n);
                stack.push(f);
            }
            (self.progress)(&self.report);
        }
        Ok(())
    }

    fn frame(&self, ino: Ino, path: String, nlink: u32) -> Frame {
        Frame {
            ino,
            path,
            nlink,
            cursor: Some(DirCursor::Start),
            seen: None,
            stat: DirStat::default(),
            subdirs: 0,
        }
    }

    /// Compares a listed directory's statistics and link count with what
    /// its entries say.
    fn finish_dir(&mut self, f: Frame) -> Result<()> {
        // The trash and its hourly directories keep no link count of
        // their subdirectories; the trash keeps no statistics.
        if f.ino < TRASH_INO && f.nlink != 2 + f.subdirs {
            self.report.nlinks.push(Mismatch {
                ino: f.ino,
                path: f.path.clone(),
                stored: Some(f.nlink),
                actual: 2 + f.subdirs,
            });
        }
        if self.vol.format.dir_stats && f.ino != TRASH_INO {
            // A directory without statistics is sound: the engines compute
            // them when they are next needed (as JuiceFS does).
            let stored = self.vol.meta.dir_stat(f.ino)?;
            if stored.is_some_and(|s| s != f.stat) {
                self.report.dir_stats.push(Mismatch {
                    ino: f.ino,
                    path: f.path,
                    stored,
                    actual: f.stat,
                });
            }
        }
        Ok(())
    }

    /// Checks every slice record of a file and every block they need.
    fn check_file(&mut self, ino: Ino, path: &str) -> Result<()> {
        let meta = &*self.vol.meta;
        self.report.files += 1;
        let mut from = 0u32;
        loop {
            let indexes = meta.chunk_indices(ino, from..=u32::MAX, CHUNK_PAGE)?;
            for &indx in &indexes {
                for s in meta.read_chunk(ino, indx)? {
                    if s.id == 0 {
                        continue;
                    }
                    self.report.slices += 1;
                    self.check_slice(ino, path, indx, &s)?;
                }
            }
            match indexes.last() {
                Some(&last) if indexes.len() >= CHUNK_PAGE && last < u32::MAX => from = last + 1,
                _ => return Ok(()),
            }
        }
    }

    /// Checks one slice record, and (the first time the slice is named)
    /// queues its blocks; the file is marked broken now or when they are
    /// read.
    fn check_slice(&mut self, ino: Ino, path: &str, indx: u32, s: &Slice) -> Result<()> {
        let broken = |reason: String, report: &mut FsckReport| {
            report.broken_slices.push(BrokenSlice {
                ino,
                indx,
                slice: *s,
                reason,
            });
            report.broken_files.insert(ino, path.to_string());
        };
        if u64::from(s.off) + u64::from(s.len) > u64::from(s.size) {
            broken(
                format!(
                    "it reads bytes {}..{} of a {}-byte slice",
                    s.off,
                    u64::from(s.off) + u64::from(s.len),
                    s.size
                ),
                &mut self.report,
            );
        }
        if s.id >= self.next_slice {
            broken(
                format!(
                    "slice id {} was never handed out (the next is {})",
                    s.id, self.next_slice
                ),
                &mut self.report,
            );
        }
        match self.slices_seen.get_mut(&(s.id, s.size)) {
            Some(SliceState::Done { ok: true }) => return Ok(()),
            Some(SliceState::Done { ok: false }) => {
                self.report.broken_files.insert(ino, path.to_string());
                return Ok(());
            }
            Some(SliceState::Queued { users }) => {
                users.push((ino, path.to_string()));
                return Ok(());
            }
            None => {}
        }
        if !self.vol.meta.slice_referenced(s.id, s.size)? {
            broken(
                "its slice has no reference left: the engine may delete its objects".into(),
                &mut self.report,
            );
        }
        self.queue_blocks(ino, path, s.id, s.size)
    }

    /// Sizes the blocks of slice `(id, size)` and queues their reads.
    fn queue_blocks(&mut self, ino: Ino, path: &str, id: u64, size: u32) -> Result<()> {
        let bs = self.vol.block_size;
        let mut ok = true;
        let mut reads = Vec::new();
        for i in 0..block_count(size, bs) {
            let want = block_len(size, bs, i);
            let key = block_key(self.vol.name(), id, i, want);
            self.report.blocks += 1;
            self.report.block_bytes += u64::from(want);
            match self.size_damage(&key, want) {
                Some(damage) => {
                    ok = false;
                    self.report.damaged.push(DamagedBlock { key, ino, damage });
                }
                None => reads.push(PendingRead {
                    key,
                    want,
                    ino,
                    slice: (id, size),
                }),
            }
        }
        if !ok {
            self.report.broken_files.insert(ino, path.to_string());
        }
        if !ok || self.opts.fast || reads.is_empty() {
            self.slices_seen.insert((id, size), SliceState::Done { ok });
            return Ok(());
        }
        self.slices_seen.insert(
            (id, size),
            SliceState::Queued {
                users: vec![(ino, path.to_string())],
            },
        );
        self.pending.extend(reads);
        if self.pending.len() >= READ_BATCH {
            self.flush_reads();
        }
        Ok(())
    }

    /// Whether block `key` is missing or has the wrong size.
    fn size_damage(&self, key: &str, want: u32) -> Option<BlockDamage> {
        let size = match self.listed.as_ref().and_then(|l| l.get(key)) {
            Some(&(size, _)) => size,
            None => match self.vol.store.head(key) {
                Ok(info) => info.size,
                Err(e) if is_not_found(&e) => return Some(BlockDamage::Missing),
                Err(e) => return Some(BlockDamage::Unreadable(e.to_string())),
            },
        };
        // A compressed block's stored size says nothing; its read does.
        if self.vol.compression == Compression::None && size != u64::from(want) {
            return Some(BlockDamage::Size {
                expected: u64::from(want),
                actual: size,
            });
        }
        None
    }

    /// Reads every queued block, `opts.threads` at a time, and settles
    /// the slices they belong to.
    fn flush_reads(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        if pending.is_empty() {
            return;
        }
        let next = AtomicUsize::new(0);
        let results: Vec<Mutex<Option<BlockDamage>>> =
            pending.iter().map(|_| Mutex::new(None)).collect();
        let workers = self.opts.threads.clamp(1, pending.len());
        let vol = self.vol;
        let (next, pending_ref, results_ref) = (&next, &pending, &results);
        // Each read done is told to this thread, which counts it and
        // reports progress while the batch runs.
        let (done_tx, done_rx) = std::sync::mpsc::channel::<u32>();
        std::thread::scope(|scope| {
            for _ in 0..workers {
                let done = done_tx.clone();
                scope.spawn(move || {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(p) = pending_ref.get(i) else { break };
                        *results_ref[i].lock() = read_damage(vol, &p.key, p.want);
                        let _ = done.send(p.want);
                    }
                });
            }
            drop(done_tx);
            let mut shown = Instant::now();
            for want in done_rx {
                self.report.read_blocks += 1;
                self.report.read_bytes += u64::from(want);
                if shown.elapsed() >= PROGRESS_EVERY {
                    (self.progress)(&self.report);
                    shown = Instant::now();
                }
            }
        });
        let mut failed: HashSet<(u64, u32)> = HashSet::new();
        for (p, r) in pending.iter().zip(results) {
            if let Some(damage) = r.into_inner() {
                failed.insert(p.slice);
                self.report.damaged.push(DamagedBlock {
                    key: p.key.clone(),
                    ino: p.ino,
                    damage,
                });
            }
        }
        for p in &pending {
            let ok = !failed.contains(&p.slice);
            let state = self.slices_seen.insert(p.slice, SliceState::Done { ok });
            if let Some(SliceState::Queued { users }) = state
                && !ok
            {
                for (ino, path) in users {
                    self.report.broken_files.insert(ino, path);
                }
            }
        }
    }

    /// The checks that need the whole volume: chunk records of nodes that
    /// do not exist, and objects no chunk names.
    fn volume_checks(&mut self, walked: &HashSet<Ino>) -> Result<()> {
        let meta = &*self.vol.meta;
        let deleted: HashSet<Ino> = meta.deleted_files()?.into_iter().collect();
        let mut named: HashMap<u64, u32> = HashMap::new();
        let mut exists: HashMap<Ino, bool> = HashMap::new();
        for (ino, indx, slices) in meta.list_chunks()? {
            for s in slices.iter().filter(|s| s.id != 0) {
                named.insert(s.id, s.size);
            }
            if ino == ROOT_INO || walked.contains(&ino) || deleted.contains(&ino) {
                continue;
            }
            // Not in the tree: a file removed while open still has its node
            // (no links) until it is closed; anything else is an orphan.
            let alive = match exists.get(&ino) {
                Some(&a) => a,
                None => {
                    let a = match meta.getattr(ino) {
                        Ok(_) => true,
                        Err(Error::NotFound) => false,
                        Err(e) => return Err(e),
                    };
                    exists.insert(ino, a);
                    a
                }
            };
            if !alive {
                self.report.orphan_chunks.push((ino, indx));
            }
        }
        self.report.orphan_space_records = meta.orphan_space_records(self.opts.repair)?;
        let now = SystemTime::now();
        let listed = self.listed.take().unwrap_or_default();
        for (key, &(size, mtime)) in &listed {
            let Some((id, indx, bsize)) = parse_block_key(key) else {
                continue;
            };
            let referenced = named.get(&id).is_some_and(|&s| {
                indx < block_count(s, self.vol.block_size)
                    && block_len(s, self.vol.block_size, indx) == bsize
            });
            if referenced {
                continue;
            }
            if now.duration_since(mtime).unwrap_or_default() >= self.opts.min_age {
                self.report.unreferenced += 1;
                self.report.unreferenced_bytes += size;
            }
        }
        Ok(())
    }

    /// Rewrites the usage counters and the directory statistics found
    /// wrong.
    fn repair(&mut self, counters: &crate::meta::Counters) -> Result<()> {
        let meta = &*self.vol.meta;
        if let Some(m) = &self.report.usage {
            let (space, inodes) = m.actual;
            meta.add_usage(space - counters.used_space, inodes - counters.used_inodes)?;
        }
        for m in &self.report.dir_stats {
            meta.set_dir_stat(m.ino, &m.actual)?;
        }
        self.report.repaired = true;
        Ok(())
    }
}

/// Reads block `key` whole: whether it fails its checksum, cannot be
/// read, or (compressed) does not decompress to `want` bytes.
fn read_damage(vol: &Volume, key: &str, want: u32) -> Option<BlockDamage> {
    let data = match vol.store.get(key) {
        Ok(d) => d,
        Err(e) if is_not_found(&e) => return Some(BlockDamage::Missing),
        Err(Error::Corrupt(msg)) => return Some(BlockDamage::Corrupt(msg)),
        Err(e) => return Some(BlockDamage::Unreadable(e.to_string())),
    };
    if vol.compression == Compression::None {
        return None;
    }
    match decompress(vol.compression, data, want as usize, key) {
        Ok(raw) if raw.len() == want as usize => None,
        Ok(raw) => Some(BlockDamage::Size {
            expected: u64::from(want),
            actual: raw.len() as u64,
        }),
        Err(e) => Some(BlockDamage::Corrupt(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::meta::conformance::test_format;
    use crate::meta::{Meta, SqliteMeta, Store, Timestamp};
    use crate::object::{FileStore, ObjectStore};

    /// A SQLite volume in `dir` holding /f (one 5000-byte slice, stored) and
    /// /g (a slice of 3000 bytes, stored); returns (volume, f, g).
    fn volume(dir: &std::path::Path) -> (Volume, Ino, Ino) {
        let meta = SqliteMeta::open(dir.join("meta.db")).unwrap();
        let format = test_format(0);
        meta.init(&format).unwrap();
        meta.load().unwrap();
        let store = FileStore::new(dir.join("bucket")).unwrap();
        let ctx = Context::internal();
        let mut files = Vec::new();
        for (name, size) in [(&b"f"[..], 5000u32), (b"g", 3000)] {
            let (ino, _) = meta.create(&ctx, ROOT_INO, name, 0o644, 0).unwrap();
            let id = meta.new_slice_id().unwrap();
            let s = Slice {
                pos: 0,
                id,
                size,
                off: 0,
                len: size,
            };
            meta.write_chunk(ino, 0, s, Timestamp::now()).unwrap();
            let key = block_key(&format.name, id, 0, size);
            store.put(&key, &vec![1u8; size as usize], None).unwrap();
            files.push(ino);
        }
        let vol = Volume {
            meta: Arc::new(meta),
            block_size: format.block_size * 1024,
            format,
            store: Arc::new(store),
            compression: Compression::None,
        };
        (vol, files[0], files[1])
    }

    fn run(vol: &Volume) -> FsckReport {
        fsck(vol, &FsckOptions::default(), &mut |_| {}).unwrap()
    }

    fn sql(dir: &std::path::Path, stmt: &str) {
        let c = rusqlite::Connection::open(dir.join("meta.db")).unwrap();
        c.execute_batch(stmt).unwrap();
    }

    #[test]
    fn a_sound_volume_is_clean() {
        let dir = tempfile::tempdir().unwrap();
        let (vol, _, _) = volume(dir.path());
        let mut seen = Vec::new();
        let r = fsck(&vol, &FsckOptions::default(), &mut |r| {
            seen.push((r.nodes, r.read_blocks, r.read_bytes))
        })
        .unwrap();
        assert!(r.clean(), "{r:?}");
        assert_eq!((r.files, r.slices, r.blocks), (2, 2, 2));
        // Both blocks were read back: 5000 + 3000 bytes.
        assert_eq!((r.read_blocks, r.read_bytes), (2, 8000));
        // Progress only goes up, and ends with the report's counts.
        assert!(seen.is_sorted(), "{seen:?}");
        assert_eq!(seen.last(), Some(&(r.nodes, 2, 8000)));
        // Listing alone reads nothing back.
        let fast = FsckOptions {
            fast: true,
            ..FsckOptions::default()
        };
        let r = fsck(&vol, &fast, &mut |_| {}).unwrap();
        assert_eq!((r.blocks, r.block_bytes, r.read_blocks), (2, 8000, 0));
    }

    #[test]
    fn broken_references_and_orphaned_chunks_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let (vol, f, g) = volume(dir.path());
        let f_slice = vol.meta.read_chunk(f, 0).unwrap()[0];
        // f's slice loses its reference record; g's node and entry vanish,
        // leaving its chunk behind.
        sql(
            dir.path(),
            &format!(
                "DELETE FROM jfs_chunk_ref WHERE chunkid={}; \
                 DELETE FROM jfs_node WHERE inode={g}; DELETE FROM jfs_edge WHERE inode={g};",
                f_slice.id
            ),
        );
        let r = run(&vol);
        assert_eq!(r.broken_slices.len(), 1, "{r:?}");
        assert_eq!(r.broken_slices[0].ino, f);
        assert!(r.broken_slices[0].reason.contains("no reference"), "{r:?}");
        assert_eq!(r.broken_files.get(&f).map(String::as_str), Some("/f"));
        assert_eq!(r.orphan_chunks, vec![(g, 0)]);
        // The usage counters still count g.
        assert!(r.usage.is_some(), "{r:?}");
        assert!(r.unrepaired());

        // A removed file awaiting deletion has chunks and no node: sound.
        sql(
            dir.path(),
            &format!("INSERT INTO jfs_delfile (inode, length, expire) VALUES ({g}, 3000, 0)"),
        );
        assert!(run(&vol).orphan_chunks.is_empty());
    }

    #[test]
    fn a_corrupt_block_breaks_every_file_sharing_its_slice() {
        let dir = tempfile::tempdir().unwrap();
        let (vol, f, g) = volume(dir.path());
        let s = vol.meta.read_chunk(f, 0).unwrap()[0];
        let ctx = Context::internal();
        let (h, _) = vol.meta.create(&ctx, ROOT_INO, b"h", 0o644, 0).unwrap();
        vol.meta.write_chunk(h, 0, s, Timestamp::now()).unwrap();
        // The block's bytes no longer match the checksum stored with them.
        let key = block_key(vol.name(), s.id, 0, s.size);
        vol.store
            .put(&key, &vec![2u8; s.size as usize], Some(0xdead_beef))
            .unwrap();
        let r = run(&vol);
        assert_eq!(r.damaged.len(), 1, "{r:?}");
        assert!(
            matches!(r.damaged[0].damage, BlockDamage::Corrupt(_)),
            "{r:?}"
        );
        let broken: Vec<Ino> = r.broken_files.keys().copied().collect();
        assert_eq!(broken, vec![f, h], "{r:?}");
        assert!(!r.broken_files.contains_key(&g));
        // Listing alone cannot see it.
        let fast = FsckOptions {
            fast: true,
            ..FsckOptions::default()
        };
        assert!(fsck(&vol, &fast, &mut |_| {}).unwrap().clean());
    }

    #[test]
    fn slice_ids_never_handed_out_are_broken() {
        let dir = tempfile::tempdir().unwrap();
        let (vol, f, _) = volume(dir.path());
        sql(
            dir.path(),
            "UPDATE jfs_counter SET value=1 WHERE name='nextChunk'",
        );
        let r = run(&vol);
        assert!(
            r.broken_slices
                .iter()
                .any(|b| b.ino == f && b.reason.contains("never handed out")),
            "{r:?}"
        );
    }

    #[test]
    fn missing_short_and_unreferenced_objects_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let (vol, f, g) = volume(dir.path());
        let fs_ = vol.meta.read_chunk(f, 0).unwrap()[0];
        let gs = vol.meta.read_chunk(g, 0).unwrap()[0];
        vol.store
            .delete(&block_key(vol.name(), fs_.id, 0, fs_.size))
            .unwrap();
        vol.store
            .put(&block_key(vol.name(), gs.id, 0, gs.size), b"short", None)
            .unwrap();
        vol.store
            .put(&block_key(vol.name(), 999, 0, 10), b"0123456789", None)
            .unwrap();
        let opts = FsckOptions {
            min_age: Duration::ZERO,
            fast: true,
            ..FsckOptions::default()
        };
        let r = fsck(&vol, &opts, &mut |_| {}).unwrap();
        assert_eq!(r.damaged.len(), 2, "{r:?}");
        assert!(
            r.damaged
                .iter()
                .any(|d| d.ino == f && d.damage == BlockDamage::Missing)
        );
        assert!(r.damaged.iter().any(|d| d.ino == g
            && d.damage
                == BlockDamage::Size {
                    expected: 3000,
                    actual: 5
                }));
        assert_eq!((r.unreferenced, r.unreferenced_bytes), (1, 10));
        assert_eq!(r.broken_files.len(), 2);
    }
}
