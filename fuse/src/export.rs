//! [`Export`]: serve one directory of a volume as the whole file system, and
//! optionally read-only.
//!
//! A guest (or a host mount) addresses files by node ids the server handed
//! out. Inside an export the server must never act on a node that is not
//! under the export's directory. Two checks, both on every request:
//!
//! - *What was handed out.* A guest can put any number in a request's
//!   `nodeid`, so node ids are checked against the set this wrapper handed
//!   out (with the kernel's lookup counts, dropped again on FORGET); any
//!   other id is EBADF, and the export's root is node 1 to the client.
//! - *Where it is now* ([`crate::confine`]). A handed-out node can leave
//!   the export afterwards: the host or another client renames it away, or
//!   it is removed into the trash. Every request that names a node (not an
//!   open handle, which stays valid as an open descriptor does) checks that
//!   its parents still reach the export's root; one that left answers
//!   ESTALE, and RENAME or LINK into a directory that left answers EXDEV.
//!   `..` at the root stays at the root, and `..` elsewhere must be inside
//!   too. So the trash (`.trash` at the volume's root) and everything in
//!   it is out of reach of a confined client.
//!
//! `.` and `..` lookups (the kernel decoding a file handle) of a node the
//! client no longer holds answer ESTALE: a confined client's handles
//! outlive its own inode cache only for nodes it still holds. Without an
//! export directory the whole volume is visible and nothing is tracked.
//!
//! Read-only refuses every change with `EROFS`, opens for writing
//! included, before the engine sees the request.
//!
//! The export is also where a client's limits ([`ClientLimits`]) hold:
//! open handles, node ids held, the size of an extended attribute value
//! (and, in the engine, the entries its open directory listings hold). A
//! request past a limit does nothing and answers its errno
//! ([`sluice_api::Limit`]), with one rate-limited warning naming the
//! flag that raises it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_api::meta::{
    Attr, Context, CopyRange, Entry, FileType, Ino, ROOT_INO, RenameFlags, SetAttr, StatFs,
    XattrMode,
};
use sluice_api::{Error, Limit, Result};

use crate::confine::{Ancestry, RECHECK};
use crate::log_limit::{LogLimit, suppressed_note};
use sluice_api::{Fh, Filesystem, Listed, OpenOut, ReadDest, WriteSource};

/// A [`Filesystem`] that shows `inner` from the directory `root` down.
#[derive(Debug)]
pub struct Export<F> {
    inner: F,
    root: Ino,
    read_only: bool,
    /// Node ids handed out, with their lookup counts; only kept when
    /// `root` is not the volume's root.
    handed: Mutex<HashMap<Ino, u64>>,
    /// Whether a node is (still) below `root`.
    ancestry: Ancestry,
    /// Rate limits of the warnings a client causes: a node id it was never
    /// given, a `..` that leads out of the export.
    refused_node: LogLimit,
    refused_parent: LogLimit,
    limits: ClientLimits,
    /// Open handles (files and directories) the client holds.
    open_handles: AtomicU64,
    /// Rate limit of the warnings about limits reached.
    limit_hit: LogLimit,
}

/// What one client (a guest, a mount) may hold; see the module docs. The
/// defaults leave room for any workload a real kernel sends (the kernel
/// itself forgets nodes under memory pressure) while bounding what a
/// hostile guest can make the daemon keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientLimits {
    /// Open file and directory handles; OPEN, CREATE and OPENDIR past it
    /// answer ENFILE (before anything is created).
    pub max_handles: u64,
    /// Node ids the client holds (kept only in a confined export, where
    /// each costs an entry in the table of what was handed out): LOOKUP
    /// and the creating requests past it answer ENFILE, and READDIRPLUS
    /// gives further entries by name only. Concurrent requests on several
    /// queues may pass it by at most one node per queue.
    pub max_nodes: u64,
    /// The largest extended attribute value SETXATTR stores: E2BIG past it
    /// (Linux's own limit, 64 KiB, is the most the engine takes).
    pub max_xattr_size: u64,
}

impl ClientLimits {
    /// Default [`ClientLimits::max_handles`].
    pub const DEFAULT_MAX_HANDLES: u64 = 65_536;
    /// Default [`ClientLimits::max_nodes`].
    pub const DEFAULT_MAX_NODES: u64 = 1 << 20;
    /// Default and largest [`ClientLimits::max_xattr_size`] (`XATTR_SIZE_MAX`).
    pub const MAX_XATTR_SIZE: u64 = 65_536;
}

impl Default for ClientLimits {
    fn default() -> Self {
        ClientLimits {
            max_handles: Self::DEFAULT_MAX_HANDLES,
            max_nodes: Self::DEFAULT_MAX_NODES,
            max_xattr_size: Self::MAX_XATTR_SIZE,
        }
    }
}

impl<F: Filesystem> Export<F> {
    /// Exports the directory `root` of `inner` (use [`ROOT_INO`] for the
    /// whole volume).
    pub fn new(inner: F, root: Ino, read_only: bool) -> Export<F> {
        Export {
            inner,
            root,
            read_only,
            handed: Mutex::new(HashMap::new()),
            ancestry: Ancestry::new(root, RECHECK),
            refused_node: LogLimit::new(),
            refused_parent: LogLimit::new(),
            limits: ClientLimits::default(),
            open_handles: AtomicU64::new(0),
            limit_hit: LogLimit::new(),
        }
    }

    /// Holds the client to `limits` instead of the defaults.
    pub fn with_limits(mut self, limits: ClientLimits) -> Export<F> {
        self.limits = limits;
        self
    }

    /// Open handles the client holds now.
    pub fn open_handles(&self) -> u64 {
        self.open_handles.load(Ordering::Relaxed)
    }

    /// Node ids the client holds now (confined exports only; 0 otherwise).
    pub fn held_nodes(&self) -> usize {
        self.handed.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// The error of a request past `limit`, after one rate-limited warning.
    fn reached(&self, limit: Limit) -> Error {
        if let Some(left_out) = self.limit_hit.allow() {
            log::warn!(
                "export: a request was refused: {limit}{}",
                suppressed_note(left_out)
            );
        }
        Error::Limit(limit)
    }

    /// Runs `open`, which makes one handle, if the client may hold one
    /// more; the handle is counted if it succeeds.
    fn new_handle<T>(&self, open: impl FnOnce() -> Result<T>) -> Result<T> {
        let max = self.limits.max_handles;
        if self.open_handles.fetch_add(1, Ordering::AcqRel) >= max {
            self.open_handles.fetch_sub(1, Ordering::AcqRel);
            return Err(self.reached(Limit::Handles(max)));
        }
        let r = open();
        if r.is_err() {
            self.open_handles.fetch_sub(1, Ordering::AcqRel);
        }
        r
    }

    /// Counts a handle the engine released (`r` is Ok).
    fn handle_closed(&self, r: Result<()>) -> Result<()> {
        if r.is_ok() {
            let _ = self
                .open_handles
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        }
        r
    }

    /// Whether the client may be given one more node it does not hold.
    fn room_for_node(&self) -> Result<()> {
        if self.confined() && self.held_nodes() as u64 >= self.limits.max_nodes {
            return Err(self.reached(Limit::Nodes(self.limits.max_nodes)));
        }
        Ok(())
    }

    /// Whether the client may be given `ino`: one it holds already, or one
    /// more within its limit. Checked after a lookup (so looking up held
    /// nodes never fails at the limit); a refused lookup is given back to
    /// the inner file system.
    fn admit(&self, entry: &Entry) -> Result<()> {
        if !self.confined() || entry.inode == self.root || entry.inode == ROOT_INO {
            return Ok(());
        }
        let held = {
            let handed = self.handed.lock().unwrap_or_else(|e| e.into_inner());
            handed.contains_key(&entry.inode) || (handed.len() as u64) < self.limits.max_nodes
        };
        if held {
            Ok(())
        } else {
            self.inner.forget(entry.inode, 1);
            Err(self.reached(Limit::Nodes(self.limits.max_nodes)))
        }
    }

    /// How long a node found inside the export is trusted before its
    /// parents are read again ([`RECHECK`] by default; zero checks on every
    /// request). Changes through this export are seen at once either way.
    pub fn with_recheck(mut self, recheck: std::time::Duration) -> Export<F> {
        self.ancestry = Ancestry::new(self.root, recheck);
        self
    }

    /// (walks, parent reads) the ancestry checks have done so far.
    pub fn ancestry_work(&self) -> (u64, u64) {
        self.ancestry.work()
    }

    /// The wrapped file system.
    pub fn inner(&self) -> &F {
        &self.inner
    }

    /// Whether a subdirectory (not the whole volume) is exported.
    fn confined(&self) -> bool {
        self.root != ROOT_INO
    }

    fn writable(&self) -> Result<()> {
        if self.read_only {
            Err(Error::ReadOnly)
        } else {
            Ok(())
        }
    }

    /// The engine inode a client node id names, if the client may use it.
    fn inode(&self, node: Ino) -> Result<Ino> {
        if !self.confined() {
            return Ok(node);
        }
        if node == ROOT_INO {
            return Ok(self.root);
        }
        let handed = self.handed.lock().unwrap_or_else(|e| e.into_inner());
        if handed.contains_key(&node) {
            Ok(node)
        } else {
            if let Some(left_out) = self.refused_node.allow() {
                log::warn!(
                    "export: refused node id {node}, which was never handed out{}",
                    suppressed_note(left_out)
                );
            }
            Err(Error::BadHandle)
        }
    }

    /// The engine inode a client node id names, if the client may use it
    /// and it still lies in the export: what every request that names a
    /// node (rather than an open handle) goes through. A node that left
    /// the export is a stale handle.
    fn reach(&self, node: Ino) -> Result<Ino> {
        let ino = self.inode(node)?;
        self.still_inside(node, ino, None)?;
        Ok(ino)
    }

    /// [`Export::reach`] for a node whose attributes are at hand.
    fn still_inside(&self, node: Ino, ino: Ino, attr: Option<&Attr>) -> Result<()> {
        if !self.confined() || ino == self.root {
            return Ok(());
        }
        if self.ancestry.inside(&self.inner, ino, attr)? {
            Ok(())
        } else {
            log::debug!("export: refused node {node}: it is no longer in the export");
            Err(Error::Stale)
        }
    }

    /// [`Export::reach`] for the target directories of RENAME and LINK: one
    /// the client holds that left the export is another file system to it.
    fn reach_target(&self, node: Ino) -> Result<Ino> {
        self.reach(node).map_err(|e| match e {
            Error::Stale => Error::CrossDevice,
            e => e,
        })
    }

    /// The node id the client sees for an engine inode.
    fn node(&self, ino: Ino) -> Ino {
        if ino == self.root { ROOT_INO } else { ino }
    }

    fn fix_attr(&self, mut attr: Attr) -> Attr {
        attr.parent = self.node(attr.parent);
        attr
    }

    /// LOOKUP of `.` (the node itself) or `..` (a directory's parent): the
    /// kernel decoding a file handle. A node id this client does not hold
    /// is a stale handle (ESTALE, which the kernel reports as such), not a
    /// bad one. `..` of the export's root is the root, and `..` anywhere
    /// else must lead to a directory inside the export: a directory the
    /// host moved out of the export after the client got it has a parent
    /// the client must not reach, so that answers ESTALE too.
    fn lookup_dot(&self, ctx: &Context, node: Ino, name: &[u8]) -> Result<Entry> {
        let ino = self.inode(node).map_err(|e| match e {
            Error::BadHandle => Error::Stale,
            e => e,
        })?;
        if !self.confined() {
            return Ok(self.hand_out(self.inner.lookup(ctx, ino, name)?));
        }
        if name == b".." && ino == self.root {
            let attr = self.inner.getattr(ctx, self.root)?;
            return Ok(self.hand_out(Entry {
                inode: self.root,
                name: name.to_vec(),
                attr,
            }));
        }
        self.still_inside(node, ino, None)?;
        let entry = self.inner.lookup(ctx, ino, name)?;
        if name == b".."
            && !self
                .ancestry
                .inside(&self.inner, entry.inode, Some(&entry.attr))?
        {
            // The inner file system counted the lookup; give it back.
            self.inner.forget(entry.inode, 1);
            if let Some(left_out) = self.refused_parent.allow() {
                log::warn!(
                    "export: refused `..` of node {node}: its parent {} is outside the export{}",
                    entry.inode,
                    suppressed_note(left_out)
                );
            }
            return Err(Error::Stale);
        }
        self.admit(&entry)?;
        Ok(self.hand_out(entry))
    }

    /// Turns an entry the engine returned into the one the client sees, and
    /// counts it as one lookup. The export's root and its parent (`..` at
    /// the root) both come back as the root.
    fn hand_out(&self, mut entry: Entry) -> Entry {
        if self.confined() {
            self.count_lookup(entry.inode);
            if entry.inode == self.root || entry.inode == ROOT_INO {
                entry.inode = ROOT_INO;
            }
        }
        entry.attr = self.fix_attr(entry.attr);
        entry
    }

    /// Whether a READDIRPLUS entry for engine inode `ino` may carry its
    /// node: one the client holds, or one more within its limit.
    fn admit_listed(&self, ino: Ino) -> bool {
        if ino == self.root || ino == ROOT_INO {
            return true;
        }
        let handed = self.handed.lock().unwrap_or_else(|e| e.into_inner());
        handed.contains_key(&ino) || (handed.len() as u64) < self.limits.max_nodes
    }

    /// Counts one lookup of an engine inode handed to the client (the
    /// export's root and the volume's root are node 1, never counted).
    fn count_lookup(&self, ino: Ino) {
        if ino != self.root && ino != ROOT_INO {
            let mut handed = self.handed.lock().unwrap_or_else(|e| e.into_inner());
            *handed.entry(ino).or_insert(0) += 1;
        }
    }
}

impl<F: Filesystem> Filesystem for Export<F> {
    fn init(&self) -> Result<()> {
        self.inner.init()?;
        if self.confined() {
            // The exported root must still be a directory when the session
            // starts; a file there would make every request fail oddly.
            let attr = self.inner.getattr(&Context::internal(), self.root)?;
            if attr.typ != FileType::Directory {
                return Err(Error::NotDir);
            }
        }
        Ok(())
    }

    fn destroy(&self) {
        self.handed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.open_handles.store(0, Ordering::Relaxed);
        self.inner.destroy()
    }

    fn metadata_is_remote(&self) -> bool {
        self.inner.metadata_is_remote()
    }

    fn posix_acl(&self) -> bool {
        self.inner.posix_acl()
    }

    fn lookup(&self, ctx: &Context, parent: Ino, name: &[u8]) -> Result<Entry> {
        if name == b"." || name == b".." {
            return self.lookup_dot(ctx, parent, name);
        }
        let parent = self.reach(parent)?;
        let entry = self.inner.lookup(ctx, parent, name)?;
        self.admit(&entry)?;
        self.ancestry.found_in(parent, entry.inode);
        Ok(self.hand_out(entry))
    }

    fn forget(&self, node: Ino, nlookup: u64) {
        // Resolved before the count drops: the last FORGET must still reach
        // the engine.
        let ino = self.inode(node);
        if self.confined() && node != ROOT_INO {
            let mut handed = self.handed.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(count) = handed.get_mut(&node) {
                *count = count.saturating_sub(nlookup);
                if *count == 0 {
                    handed.remove(&node);
                    self.ancestry.forget(node);
                }
            }
        }
        if let Ok(ino) = ino {
            self.inner.forget(ino, nlookup)
        }
    }

    fn getattr(&self, ctx: &Context, ino: Ino) -> Result<Attr> {
        let node = ino;
        let ino = self.inode(node)?;
        let attr = self.inner.getattr(ctx, ino)?;
        self.still_inside(node, ino, Some(&attr))?;
        Ok(self.fix_attr(attr))
    }

    fn setattr(
        &self,
        ctx: &Context,
        ino: Ino,
        fh: Option<Fh>,
        set: &SetAttr,
        size: Option<u64>,
    ) -> Result<Attr> {
        self.writable()?;
        let ino = self.reach(ino)?;
        Ok(self.fix_attr(self.inner.setattr(ctx, ino, fh, set, size)?))
    }

    fn readlink(&self, ctx: &Context, ino: Ino) -> Result<Vec<u8>> {
        self.inner.readlink(ctx, self.reach(ino)?)
    }

    fn mknod(
        &self,
        ctx: &Context,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<Entry> {
        self.writable()?;
        let parent = self.reach(parent)?;
        self.room_for_node()?;
        let entry = self.inner.mknod(ctx, parent, name, mode, umask, rdev)?;
        self.ancestry.found_in(parent, entry.inode);
        Ok(self.hand_out(entry))
    }

    fn mkdir(
        &self,
        ctx: &Context,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<Entry> {
        self.writable()?;
        let parent = self.reach(parent)?;
        self.room_for_node()?;
        let entry = self.inner.mkdir(ctx, parent, name, mode, umask)?;
        self.ancestry.found_in(parent, entry.inode);
        Ok(self.hand_out(entry))
    }

    fn unlink(&self, ctx: &Context, parent: Ino, name: &[u8]) -> Result<()> {
        self.writable()?;
        let r = self.inner.unlink(ctx, self.reach(parent)?, name);
        // The file may have gone to the trash, out of the export.
        self.ancestry.moved();
        r
    }

    fn rmdir(&self, ctx: &Context, parent: Ino, name: &[u8]) -> Result<()> {
        self.writable()?;
        let r = self.inner.rmdir(ctx, self.reach(parent)?, name);
        self.ancestry.moved();
        r
    }

    fn symlink(&self, ctx: &Context, parent: Ino, name: &[u8], target: &[u8]) -> Result<Entry> {
        self.writable()?;
        let parent = self.reach(parent)?;
        self.room_for_node()?;
        let entry = self.inner.symlink(ctx, parent, name, target)?;
        self.ancestry.found_in(parent, entry.inode);
        Ok(self.hand_out(entry))
    }

    fn rename(
        &self,
        ctx: &Context,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        self.writable()?;
        let parent = self.reach_target(parent)?;
        let new_parent = self.reach_target(new_parent)?;
        let r = self
            .inner
            .rename(ctx, parent, name, new_parent, new_name, flags);
        self.ancestry.moved();
        r
    }

    fn link(&self, ctx: &Context, ino: Ino, new_parent: Ino, new_name: &[u8]) -> Result<Entry> {
        self.writable()?;
        let ino = self.reach_target(ino)?;
        let new_parent = self.reach_target(new_parent)?;
        let entry = self.inner.link(ctx, ino, new_parent, new_name)?;
        // The node is one the client holds: no new node to count.
        self.ancestry.found_in(new_parent, entry.inode);
        Ok(self.hand_out(entry))
    }

    fn open(&self, ctx: &Context, ino: Ino, flags: u32) -> Result<OpenOut> {
        if opens_for_change(flags) {
            self.writable()?;
        }
        let ino = self.reach(ino)?;
        let mut out = self.new_handle(|| self.inner.open(ctx, ino, flags))?;
        out.attr = self.fix_attr(out.attr);
        Ok(out)
    }

    fn create(
        &self,
        ctx: &Context,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
        flags: u32,
    ) -> Result<(Entry, OpenOut)> {
        self.writable()?;
        let parent = self.reach(parent)?;
        self.room_for_node()?;
        let (entry, mut out) =
            self.new_handle(|| self.inner.create(ctx, parent, name, mode, umask, flags))?;
        self.ancestry.found_in(parent, entry.inode);
        out.attr = self.fix_attr(out.attr);
        Ok((self.hand_out(entry), out))
    }

    fn read(
        &self,
        ctx: &Context,
        ino: Ino,
        fh: Fh,
        offset: u64,
        size: usize,
        dst: &mut dyn ReadDest,
    ) -> Result<usize> {
        self.inner
            .read(ctx, self.inode(ino)?, fh, offset, size, dst)
    }

    fn write(
        &self,
        ctx: &Context,
        ino: Ino,
        fh: Fh,
        offset: u64,
        data: &mut dyn WriteSource,
        kill_suidgid: bool,
    ) -> Result<usize> {
        self.writable()?;
        self.inner
            .write(ctx, self.inode(ino)?, fh, offset, data, kill_suidgid)
    }

    fn flush(&self, ctx: &Context, ino: Ino, fh: Fh) -> Result<()> {
        self.inner.flush(ctx, self.inode(ino)?, fh)
    }

    fn release(&self, ctx: &Context, ino: Ino, fh: Fh) -> Result<()> {
        self.handle_closed(self.inner.release(ctx, self.inode(ino)?, fh))
    }

    fn fsync(&self, ctx: &Context, ino: Ino, fh: Fh, datasync: bool) -> Result<()> {
        self.inner.fsync(ctx, self.inode(ino)?, fh, datasync)
    }

    fn opendir(&self, ctx: &Context, ino: Ino) -> Result<Fh> {
        let ino = self.reach(ino)?;
        self.new_handle(|| self.inner.opendir(ctx, ino))
    }

    fn readdir(
        &self,
        ctx: &Context,
        ino: Ino,
        fh: Fh,
        offset: u64,
        plus: bool,
        add: &mut dyn FnMut(&Entry, Listed) -> bool,
    ) -> Result<()> {
        // A listing names nodes: the directory must still be in the export,
        // even through a handle opened while it was.
        let dir = self.reach(ino)?;
        let r = if !self.confined() {
            self.inner.readdir(ctx, dir, fh, offset, plus, add)
        } else {
            self.inner
                .readdir(ctx, dir, fh, offset, plus, &mut |e, listed| {
                    let mut entry = e.clone();
                    if dir == self.root && entry.name == b".." {
                        entry.inode = self.root;
                    }
                    let ino = entry.inode;
                    entry.inode = self.node(ino);
                    entry.attr = self.fix_attr(entry.attr);
                    let dots = entry.name == b"." || entry.name == b"..";
                    // Past the node limit, an entry for a node the client does
                    // not hold goes by name only: the listing still completes.
                    let listed = if !plus || dots || listed == Listed::NameOnly {
                        listed
                    } else if self.admit_listed(ino) {
                        Listed::Node
                    } else {
                        let _ = self.reached(Limit::Nodes(self.limits.max_nodes));
                        Listed::NameOnly
                    };
                    let sent = add(&entry, listed);
                    if sent && plus && !dots && listed == Listed::Node {
                        // The kernel counts a READDIRPLUS entry it received as a
                        // lookup; one that did not fit the reply it never saw.
                        self.ancestry.found_in(dir, ino);
                        self.count_lookup(ino);
                    }
                    sent
                })
        };
        match r {
            Err(Error::Limit(limit)) => Err(self.reached(limit)),
            r => r,
        }
    }

    fn releasedir(&self, ctx: &Context, ino: Ino, fh: Fh) -> Result<()> {
        self.handle_closed(self.inner.releasedir(ctx, self.inode(ino)?, fh))
    }

    fn fsyncdir(&self, ctx: &Context, ino: Ino, fh: Fh, datasync: bool) -> Result<()> {
        self.inner.fsyncdir(ctx, self.inode(ino)?, fh, datasync)
    }

    /// The whole volume is synced: syncing more than the export promises
    /// nothing about other tenants' files beyond what they were promised.
    fn syncfs(&self, ctx: &Context) -> Result<()> {
        self.inner.syncfs(ctx)
    }

    fn statfs(&self, ctx: &Context, ino: Ino) -> Result<StatFs> {
        self.inner.statfs(ctx, self.reach(ino)?)
    }

    fn setxattr(
        &self,
        ctx: &Context,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
    ) -> Result<()> {
        self.writable()?;
        let ino = self.reach(ino)?;
        if value.len() as u64 > self.limits.max_xattr_size {
            return Err(self.reached(Limit::XattrSize(self.limits.max_xattr_size)));
        }
        self.inner.setxattr(ctx, ino, name, value, mode)
    }

    fn getxattr(&self, ctx: &Context, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        self.inner.getxattr(ctx, self.reach(ino)?, name)
    }

    fn listxattr(&self, ctx: &Context, ino: Ino) -> Result<Vec<Vec<u8>>> {
        self.inner.listxattr(ctx, self.reach(ino)?)
    }

    fn removexattr(&self, ctx: &Context, ino: Ino, name: &[u8]) -> Result<()> {
        self.writable()?;
        self.inner.removexattr(ctx, self.reach(ino)?, name)
    }

    fn access(&self, ctx: &Context, ino: Ino, mask: u32) -> Result<()> {
        if mask & libc::W_OK as u32 != 0 {
            self.writable()?;
        }
        self.inner.access(ctx, self.reach(ino)?, mask)
    }

    fn fallocate(
        &self,
        ctx: &Context,
        ino: Ino,
        fh: Fh,
        mode: u32,
        offset: u64,
        len: u64,
    ) -> Result<()> {
        self.writable()?;
        self.inner
            .fallocate(ctx, self.inode(ino)?, fh, mode, offset, len)
    }

    fn lseek(&self, ctx: &Context, ino: Ino, fh: Fh, offset: u64, whence: u32) -> Result<u64> {
        self.inner.lseek(ctx, self.inode(ino)?, fh, offset, whence)
    }

    fn copy_file_range(
        &self,
        ctx: &Context,
        req: &CopyRange,
        fh_in: Fh,
        fh_out: Fh,
    ) -> Result<u64> {
        self.writable()?;
        // Both ends must be nodes this client was given; the engine then
        // checks that each handle belongs to its node.
        let req = CopyRange {
            fin: self.inode(req.fin)?,
            fout: self.inode(req.fout)?,
            ..*req
        };
        self.inner.copy_file_range(ctx, &req, fh_in, fh_out)
    }
}

/// Whether open flags ask to change the file (write access or truncate).
fn opens_for_change(flags: u32) -> bool {
    let acc = flags & libc::O_ACCMODE as u32;
    acc == libc::O_WRONLY as u32 || acc == libc::O_RDWR as u32 || flags & libc::O_TRUNC as u32 != 0
}
