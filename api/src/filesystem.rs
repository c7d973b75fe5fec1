//! The [`Filesystem`] trait: what the FUSE dispatcher calls for each
//! decoded request. The engine's `Vfs` implements it directly
//! (`engine/src/vfs.rs`); an `Export` (in `sluice-fuse`) wraps any
//! implementation to confine a client to a subtree.

use crate::error::Result;
use crate::fragment::{BufDest, ReadDest};
use crate::meta::{Attr, Context, CopyRange, Entry, Ino, RenameFlags, SetAttr, StatFs, XattrMode};
use crate::source::{SliceSource, WriteSource};

/// A file handle a file system hands out; 0 is never a valid handle.
pub type Fh = u64;

/// What `open` and `create` return.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenOut {
    /// The new handle.
    pub fh: Fh,
    /// The file's attributes (length includes buffered writes).
    pub attr: Attr,
    /// Whether the kernel may keep its page cache from earlier opens.
    pub keep_cache: bool,
    /// Whether the kernel should bypass its page cache.
    pub direct_io: bool,
}

/// How a READDIRPLUS entry reaches the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listed {
    /// With its node id and attributes: the client counts it as a lookup.
    Node,
    /// Name and type only, no node (FUSE's `nodeid` 0, which the kernel
    /// takes as "no attributes for this one" and looks the name up when it
    /// needs it): what an export past its node limit sends, so a listing
    /// still completes.
    NameOnly,
}

/// A file system the FUSE dispatcher serves. Every method may be called from
/// several threads at once. Errors become errno values through
/// [`Error::errno`](crate::Error::errno), in the dispatcher only.
pub trait Filesystem: Send + Sync {
    /// Called once when the kernel (or guest) opens the session (FUSE_INIT).
    fn init(&self) -> Result<()>;
    /// Called once when the session ends (FUSE_DESTROY or unmount): flush
    /// everything and close.
    fn destroy(&self);
    /// Whether metadata operations wait on another machine (a remote
    /// metadata engine: a network round trip each). A transport's worker
    /// that must not wait ([`crate::wait`]) then hands every operation that
    /// changes metadata to a waiter up front, and a read-only one it tried
    /// fails with [`crate::Error::WouldBlock`] before its round trip; with
    /// local metadata the worker runs them itself.
    fn metadata_is_remote(&self) -> bool {
        false
    }
    /// Whether the file system keeps and checks POSIX ACLs (kept in its
    /// `system.posix_acl_*` attributes). The transport then asks the
    /// kernel for `FUSE_POSIX_ACL` (the kernel caches ACLs and invalidates
    /// a node's attributes when one is set) and `FUSE_DONT_MASK` (the
    /// umask comes to the file system unapplied, for a directory's default
    /// ACL replaces it).
    fn posix_acl(&self) -> bool {
        false
    }
    /// Looks up `name` in directory `parent`.
    fn lookup(&self, ctx: &Context, parent: Ino, name: &[u8]) -> Result<Entry>;
    /// The kernel dropped `nlookup` references to `ino`.
    fn forget(&self, ino: Ino, nlookup: u64);
    /// The attributes of `ino` (the length includes buffered writes).
    fn getattr(&self, ctx: &Context, ino: Ino) -> Result<Attr>;
    /// Changes attributes; `size` truncates or extends a regular file.
    fn setattr(
        &self,
        ctx: &Context,
        ino: Ino,
        fh: Option<Fh>,
        set: &SetAttr,
        size: Option<u64>,
    ) -> Result<Attr>;
    /// The target of a symbolic link.
    fn readlink(&self, ctx: &Context, ino: Ino) -> Result<Vec<u8>>;
    /// Creates a node; `mode` is `st_mode` including the `S_IF*` bits.
    fn mknod(
        &self,
        ctx: &Context,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<Entry>;
    /// Creates a directory.
    fn mkdir(
        &self,
        ctx: &Context,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<Entry>;
    /// Removes a non-directory entry.
    fn unlink(&self, ctx: &Context, parent: Ino, name: &[u8]) -> Result<()>;
    /// Removes an empty directory.
    fn rmdir(&self, ctx: &Context, parent: Ino, name: &[u8]) -> Result<()>;
    /// Creates a symbolic link to `target`.
    fn symlink(&self, ctx: &Context, parent: Ino, name: &[u8], target: &[u8]) -> Result<Entry>;
    /// Renames (or with `flags.exchange`, swaps) an entry.
    fn rename(
        &self,
        ctx: &Context,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<()>;
    /// Adds a hard link to `ino`.
    fn link(&self, ctx: &Context, ino: Ino, new_parent: Ino, new_name: &[u8]) -> Result<Entry>;
    /// Opens a file with `open(2)` flags.
    fn open(&self, ctx: &Context, ino: Ino, flags: u32) -> Result<OpenOut>;
    /// Creates and opens a regular file.
    fn create(
        &self,
        ctx: &Context,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
        flags: u32,
    ) -> Result<(Entry, OpenOut)>;
    /// Reads up to `size` bytes at `offset` into `dst`: the transport's
    /// destination (guest memory, a reply buffer), handed down once. The
    /// file system pushes the bytes as fragments, in order (a cached
    /// block's bytes, a local file range, zeros for a hole), so each is
    /// copied once, into the destination. Returns the bytes pushed, fewer
    /// than `size` only at end of file. An error leaves whatever was pushed
    /// undefined: the transport answers the error instead.
    fn read(
        &self,
        ctx: &Context,
        ino: Ino,
        fh: Fh,
        offset: u64,
        size: usize,
        dst: &mut dyn ReadDest,
    ) -> Result<usize>;
    /// [`Filesystem::read`] into a plain buffer, `buf.len()` bytes (tools
    /// and tests). Not meant to be overridden.
    fn read_buf(
        &self,
        ctx: &Context,
        ino: Ino,
        fh: Fh,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize> {
        let size = buf.len();
        self.read(ctx, ino, fh, offset, size, &mut BufDest::new(buf))
    }
    /// Writes the bytes of `data` (its [`WriteSource::len`]) at `offset`,
    /// taking them from it in order, straight into wherever the file
    /// system keeps them (virtio-fs: one copy from guest memory); returns
    /// the bytes written. Bytes not taken stay in `data`. With
    /// `kill_suidgid` (FUSE_WRITE_KILL_SUIDGID: the writer lacks
    /// CAP_FSETID) the write first drops setuid/setgid as Linux's
    /// `file_remove_privs` does.
    fn write(
        &self,
        ctx: &Context,
        ino: Ino,
        fh: Fh,
        offset: u64,
        data: &mut dyn WriteSource,
        kill_suidgid: bool,
    ) -> Result<usize>;
    /// [`Filesystem::write`] of the bytes of one buffer (`/dev/fuse`
    /// messages, tests and tools).
    fn write_buf(
        &self,
        ctx: &Context,
        ino: Ino,
        fh: Fh,
        offset: u64,
        data: &[u8],
        kill_suidgid: bool,
    ) -> Result<usize> {
        self.write(
            ctx,
            ino,
            fh,
            offset,
            &mut SliceSource::new(data),
            kill_suidgid,
        )
    }
    /// `close(2)` of one file descriptor: commit buffered writes.
    fn flush(&self, ctx: &Context, ino: Ino, fh: Fh) -> Result<()>;
    /// The last reference to the open file is gone: flush and close.
    fn release(&self, ctx: &Context, ino: Ino, fh: Fh) -> Result<()>;
    /// Makes the file durable.
    fn fsync(&self, ctx: &Context, ino: Ino, fh: Fh, datasync: bool) -> Result<()>;
    /// Opens a directory.
    fn opendir(&self, ctx: &Context, ino: Ino) -> Result<Fh>;
    /// Hands directory entries from index `offset` on (`.` and `..` first;
    /// entry `i` has offset `i + 1`) to `add`, in order, until it returns
    /// `false`: the reply is full, and that entry was not sent. With `plus`,
    /// entries carry full attributes, and each entry `add` accepted as
    /// [`Listed::Node`] counts as a lookup (the kernel will FORGET it); one
    /// it refused, or one given as [`Listed::NameOnly`], does not. A call
    /// costs the entries it hands out, not the rest of the directory.
    fn readdir(
        &self,
        ctx: &Context,
        ino: Ino,
        fh: Fh,
        offset: u64,
        plus: bool,
        add: &mut dyn FnMut(&Entry, Listed) -> bool,
    ) -> Result<()>;
    /// Every directory entry from index `offset` on (tests and tools).
    fn readdir_all(
        &self,
        ctx: &Context,
        ino: Ino,
        fh: Fh,
        offset: u64,
        plus: bool,
    ) -> Result<Vec<Entry>> {
        let mut out = Vec::new();
        self.readdir(ctx, ino, fh, offset, plus, &mut |e, _| {
            out.push(e.clone());
            true
        })?;
        Ok(out)
    }
    /// Closes a directory handle.
    fn releasedir(&self, ctx: &Context, ino: Ino, fh: Fh) -> Result<()>;
    /// Makes a directory durable.
    fn fsyncdir(&self, ctx: &Context, ino: Ino, fh: Fh, datasync: bool) -> Result<()>;
    /// Makes everything written so far durable, as `syncfs(2)` (FUSE_SYNCFS:
    /// what a virtio-fs guest's `sync` and `syncfs` send). A file system
    /// whose changes are durable at once has nothing to do.
    fn syncfs(&self, ctx: &Context) -> Result<()> {
        let _ = ctx;
        Ok(())
    }
    /// Space and inode usage.
    fn statfs(&self, ctx: &Context, ino: Ino) -> Result<StatFs>;
    /// Sets an extended attribute.
    fn setxattr(
        &self,
        ctx: &Context,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
    ) -> Result<()>;
    /// Reads an extended attribute.
    fn getxattr(&self, ctx: &Context, ino: Ino, name: &[u8]) -> Result<Vec<u8>>;
    /// Lists extended attribute names.
    fn listxattr(&self, ctx: &Context, ino: Ino) -> Result<Vec<Vec<u8>>>;
    /// Removes an extended attribute.
    fn removexattr(&self, ctx: &Context, ino: Ino, name: &[u8]) -> Result<()>;
    /// Checks access `mask` (`R_OK | W_OK | X_OK`, or `F_OK`).
    fn access(&self, ctx: &Context, ino: Ino, mask: u32) -> Result<()>;
    /// Allocates, punches or zeroes a range (`FALLOC_FL_*` in `mode`).
    fn fallocate(
        &self,
        ctx: &Context,
        ino: Ino,
        fh: Fh,
        mode: u32,
        offset: u64,
        len: u64,
    ) -> Result<()>;
    /// `SEEK_DATA` / `SEEK_HOLE` from `offset`.
    fn lseek(&self, ctx: &Context, ino: Ino, fh: Fh, offset: u64, whence: u32) -> Result<u64>;
    /// `copy_file_range(2)` from `req.fin` (open as `fh_in`, readable) to
    /// `req.fout` (open as `fh_out`, writable); returns the bytes copied,
    /// which may be fewer than asked (the caller loops).
    fn copy_file_range(&self, ctx: &Context, req: &CopyRange, fh_in: Fh, fh_out: Fh)
    -> Result<u64>;
}
