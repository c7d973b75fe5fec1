//! The one implementation of [`Meta`]: the namespace's changes, access
//! checks, attributes, extended attributes and ACLs, written once over
//! [`Engine`] — an engine's transactions of storage primitives
//! ([`NsTx`], [`NsRead`]) and a few hooks. SQLite and Redis implement
//! `Engine` and [`Store`] (their storage-shaped operations: chunks,
//! listings, sessions, dump and load) and get `Meta` from here, as
//! JuiceFS's `baseMeta` sits over its engines' `do*` methods.
//! engine/DESIGN.md, "The metadata rules and the engines", says what is
//! where.

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::format::Format;
use crate::meta::acl::{self, AclType, acl_id};
use crate::meta::chunks::{self, ChunkTx};
use crate::meta::copy_range;
use crate::meta::namespace::{self as ns, NsRead, NsTx};
use crate::meta::rules::{align4k, statfs_from};
use crate::meta::trash::{self, TrashOps, hour_name, is_trash, new_trash_attr};
use crate::meta::{
    Attr, Context, CopyRange, DirCursor, DirPage, Entry, FileType, Ino, Meta, ROOT_INO,
    RenameFlags, SetAttr, StatFs, Store, TRASH_INO, Timestamp, TruncateVia, WorkCounters,
    WorkStats, XattrMode, quota,
};

/// What an engine gives the shared operations: transactions over its
/// storage primitives, and what it adds around a new node.
pub(crate) trait Engine: Store {
    /// The engine's transaction error (a file-system answer converts into
    /// it).
    type TxError: From<Error>;
    /// A write transaction's primitives; `'a` borrows the transaction,
    /// `'c` is the transaction's own lifetime.
    type Ns<'a, 'c>: ChunkTx<Error = Self::TxError>
    where
        'c: 'a;
    /// A read's primitives (a snapshot on SQLite; reads with nothing
    /// watched on Redis).
    type View<'a, 'c>: NsRead<Error = Self::TxError>
    where
        'c: 'a;

    /// Runs `f` as one write transaction — all of it or none, rerun from
    /// scratch on a conflict — then the work that follows a commit
    /// (deleting released data). `hint`: the inode the change centres on
    /// (Redis picks a local lock by it).
    fn write_ns<R>(
        &self,
        hint: Ino,
        f: impl FnMut(&mut Self::Ns<'_, '_>) -> std::result::Result<R, Self::TxError>,
    ) -> Result<R>;
    /// Runs `f` as reads of one consistent state where the engine has
    /// one (SQLite's snapshot), with nothing locked or watched.
    fn read_ns<R>(
        &self,
        f: impl FnMut(&mut Self::View<'_, '_>) -> std::result::Result<R, Self::TxError>,
    ) -> Result<R>;

    /// A new inode number (from the counter, in batches); fails when no
    /// volume is loaded.
    fn next_inode(&self) -> Result<Ino>;
    /// Makes node `ino` in `parent` by `make`, in one write transaction,
    /// with what the engine records beside it: `open`, the creating open
    /// (Redis records it in the same transaction and tells its metadata
    /// cache the node has no extended attributes; SQLite records the open
    /// after the commit).
    fn make_node(
        &self,
        parent: Ino,
        ino: Ino,
        open: bool,
        make: impl FnMut(&mut Self::Ns<'_, '_>) -> std::result::Result<Attr, Self::TxError>,
    ) -> Result<Attr>;
    /// The volume's settings (kept from `load`).
    fn format(&self) -> Result<Format>;
    /// The volume's usage counters: bytes (4 KiB-aligned per file) and
    /// inodes.
    fn usage(&self) -> Result<(i64, i64)>;
    /// The chunks of `ino` a fallocate writes holes into (it writes holes:
    /// `Fallocate::writes_holes`), listed once before its transactions,
    /// after or with its checks.
    fn fallocate_chunks(&self, f: &chunks::Fallocate<'_>, ino: Ino) -> Result<Vec<u32>>;
    /// What range operations and listings visited.
    fn work_counters(&self) -> &WorkCounters;
    /// The hour's trash directory this client made or found last (its
    /// name and inode), so a removal does not look for it again.
    fn trash_hour(&self) -> &Mutex<Option<(String, Ino)>>;
    /// A name the engine cannot store as an extended attribute's (SQLite
    /// keeps names as UTF-8 text).
    fn check_xattr_name(&self, _name: &[u8]) -> Result<()> {
        Ok(())
    }
}

impl<E: Engine> Meta for E {
    fn statfs(&self, _ctx: &Context, _ino: Ino) -> Result<StatFs> {
        let fmt = self.format()?;
        let (used, inodes) = self.usage()?;
        Ok(statfs_from(&fmt, used, inodes))
    }

    fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        self.read_ns(|v| {
            let a = v.must_node(ino)?;
            if a.typ != FileType::Symlink {
                return Err(Error::Invalid(format!("inode {ino} is not a symlink")).into());
            }
            v.symlink(ino)?
                .ok_or_else(|| Error::Corrupt(format!("symlink {ino} has no target")).into())
        })
    }

    fn readdir(&self, ctx: &Context, ino: Ino, plus: bool) -> Result<Vec<Entry>> {
        self.read_ns(|v| {
            let mut out = ns::dots(v, ctx, ino, plus)?;
            v.list(ino, plus, None, &mut out)?;
            Ok(out)
        })
    }

    fn readdir_page(
        &self,
        ctx: &Context,
        ino: Ino,
        plus: bool,
        cursor: &DirCursor,
        max: usize,
    ) -> Result<DirPage> {
        let (entries, listed) = self.read_ns(|v| {
            let mut out = match cursor {
                DirCursor::Start => ns::dots(v, ctx, ino, plus)?,
                _ => Vec::new(),
            };
            let listed = v.list(ino, plus, Some((cursor, max)), &mut out)?;
            Ok((out, listed))
        })?;
        self.work_counters().listed(listed.rows);
        Ok(DirPage {
            entries,
            next: listed.next,
            may_repeat: listed.may_repeat,
        })
    }

    fn work(&self) -> WorkStats {
        self.work_counters().snapshot()
    }

    fn setattr(&self, ctx: &Context, ino: Ino, set: &SetAttr) -> Result<Attr> {
        self.write_ns(ino, |tx| ns::setattr(tx, ctx, ino, set))
    }

    fn mknod(
        &self,
        ctx: &Context,
        parent: Ino,
        name: &[u8],
        typ: FileType,
        mode: u16,
        umask: u16,
        rdev: u32,
    ) -> Result<(Ino, Attr)> {
        if matches!(typ, FileType::Directory | FileType::Symlink) {
            return Err(Error::Invalid(
                "mknod makes neither directories nor symlinks".into(),
            ));
        }
        let new = ns::NewNode {
            typ,
            mode,
            umask,
            rdev,
            target: b"",
        };
        make(self, ctx, parent, name, &new, false)
    }

    fn mkdir(
        &self,
        ctx: &Context,
        parent: Ino,
        name: &[u8],
        mode: u16,
        umask: u16,
    ) -> Result<(Ino, Attr)> {
        let new = ns::NewNode {
            typ: FileType::Directory,
            mode,
            umask,
            rdev: 0,
            target: b"",
        };
        make(self, ctx, parent, name, &new, false)
    }

    fn symlink(
        &self,
        ctx: &Context,
        parent: Ino,
        name: &[u8],
        target: &[u8],
    ) -> Result<(Ino, Attr)> {
        ns::check_symlink_target(target)?;
        let new = ns::NewNode {
            typ: FileType::Symlink,
            mode: 0o777,
            umask: 0,
            rdev: 0,
            target,
        };
        make(self, ctx, parent, name, &new, false)
    }

    fn create(
        &self,
        ctx: &Context,
        parent: Ino,
        name: &[u8],
        mode: u16,
        umask: u16,
    ) -> Result<(Ino, Attr)> {
        let new = ns::NewNode {
            typ: FileType::File,
            mode,
            umask,
            rdev: 0,
            target: b"",
        };
        make(self, ctx, parent, name, &new, true)
    }

    fn unlink(&self, ctx: &Context, parent: Ino, name: &[u8]) -> Result<()> {
        ns::check_unlink(ctx, parent, name)?;
        let trash = trash_for(self, parent)?;
        self.write_ns(parent, |tx| ns::unlink(tx, ctx, parent, name, trash))
    }

    fn rmdir(&self, ctx: &Context, parent: Ino, name: &[u8]) -> Result<()> {
        ns::check_rmdir(ctx, parent, name)?;
        let trash = trash_for(self, parent)?;
        self.write_ns(parent, |tx| ns::rmdir(tx, ctx, parent, name, trash))
    }

    fn rename(
        &self,
        ctx: &Context,
        psrc: Ino,
        nsrc: &[u8],
        pdst: Ino,
        ndst: &[u8],
        flags: RenameFlags,
    ) -> Result<(Ino, Attr)> {
        ns::check_rename(ctx, psrc, nsrc, pdst, ndst, flags)?;
        // Directory quotas are checked before the transaction, as JuiceFS
        // does (a move between quota trees needs the moved tree's usage).
        let moved = quota::before_rename(self, ctx, psrc, nsrc, pdst)?;
        // Only a replaced target goes to the trash; look before making the
        // hour's directory.
        let replaces =
            ns::may_replace(flags) && self.read_ns(|v| Ok(v.edge(pdst, ndst)?.is_some()))?;
        let trash = if replaces {
            trash_for(self, pdst)?
        } else {
            None
        };
        let out = self.write_ns(psrc.min(pdst), |tx| {
            tx.quotas_checked();
            ns::rename(tx, ctx, psrc, nsrc, pdst, ndst, flags, trash)
        })?;
        quota::after_rename(self, moved, pdst, flags, &out)?;
        Ok(out)
    }

    fn truncate(&self, ctx: &Context, ino: Ino, length: u64, via: TruncateVia) -> Result<Attr> {
        chunks::check_truncate(length)?;
        self.format()?;
        self.write_ns(ino, |tx| chunks::truncate(tx, ctx, ino, length, via))
    }

    /// Holes go in `CHUNKS_PER_TX` chunks per transaction, in index order;
    /// the last transaction sets the length and times
    /// ([`chunks::Fallocate`]), so no transaction's work grows with the
    /// range.
    fn fallocate(&self, ctx: &Context, ino: Ino, mode: u32, offset: u64, len: u64) -> Result<Attr> {
        let f = chunks::Fallocate::new(ctx, ino, mode, offset, len)?;
        self.format()?;
        let found = if f.writes_holes() {
            self.fallocate_chunks(&f, ino)?
        } else {
            Vec::new()
        };
        for (batch, last) in chunks::batches(&found) {
            let a = self.write_ns(ino, |tx| f.batch(tx, batch, last))?;
            self.work_counters().transaction();
            if last {
                return Ok(a);
            }
        }
        unreachable!("batches ends with a last one")
    }

    /// The source's chunks are read inside the transaction (watched on
    /// Redis), so a compaction that replaces them meanwhile makes the copy
    /// start again.
    fn copy_file_range(&self, req: &CopyRange) -> Result<(u64, Attr)> {
        copy_range::check(req)?;
        self.format()?;
        self.write_ns(req.fout, |tx| chunks::copy_file_range(tx, req))
    }

    fn link(&self, ctx: &Context, ino: Ino, parent: Ino, name: &[u8]) -> Result<Attr> {
        ns::check_new_name(parent, name)?;
        self.write_ns(parent, |tx| ns::link(tx, ctx, ino, parent, name))
    }

    fn access(&self, ctx: &Context, ino: Ino, mask: u32) -> Result<()> {
        self.read_ns(|v| {
            let a = v.must_node(ino)?;
            v.check(ctx, &a, (mask & 7) as u8)
        })
    }

    fn set_atime(&self, ino: Ino, atime: Timestamp) -> Result<()> {
        self.write_ns(ino, |tx| {
            let mut a = tx.must_node(ino)?;
            a.atime = atime;
            tx.put_node(ino, &a)
        })
    }

    fn setxattr(
        &self,
        ctx: &Context,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
    ) -> Result<()> {
        ns::check_xattr(name, Some(value))?;
        self.check_xattr_name(name)?;
        self.write_ns(ino, |tx| ns::set_xattr(tx, ctx, ino, name, value, mode))
    }

    fn removexattr(&self, ctx: &Context, ino: Ino, name: &[u8]) -> Result<()> {
        ns::check_xattr(name, None)?;
        self.check_xattr_name(name)?;
        self.write_ns(ino, |tx| ns::remove_xattr(tx, ctx, ino, name))
    }

    fn trash_links(&self, ino: Ino) -> Result<u32> {
        self.read_ns(|v| {
            let n: i64 = v
                .parents(ino)?
                .into_iter()
                .filter(|&(p, _)| p >= TRASH_INO)
                .map(|(_, n)| n)
                .sum();
            Ok(u32::try_from(n.max(0)).unwrap_or(u32::MAX))
        })
    }

    fn get_facl(&self, ino: Ino, typ: AclType) -> Result<Option<acl::Rule>> {
        self.read_ns(|v| {
            let a = v.must_node(ino)?;
            match acl_id(&a, typ) {
                0 => Ok(None),
                id => Ok(Some(v.rule(id)?.as_ref().clone())),
            }
        })
    }

    fn set_facl(&self, ctx: &Context, ino: Ino, typ: AclType, rule: &acl::Rule) -> Result<()> {
        self.write_ns(ino, |tx| ns::set_facl(tx, ctx, ino, typ, rule))
    }
}

/// Makes a node of any type ([`ns::mknod`]'s rules), numbered before its
/// transaction (a number a conflict wastes is harmless).
fn make<E: Engine>(
    e: &E,
    ctx: &Context,
    parent: Ino,
    name: &[u8],
    new: &ns::NewNode<'_>,
    open: bool,
) -> Result<(Ino, Attr)> {
    ns::check_new_name(parent, name)?;
    let ino = e.next_inode()?;
    let attr = e.make_node(parent, ino, open, |tx| {
        ns::mknod(tx, ctx, parent, name, ino, new)
    })?;
    Ok((ino, attr))
}

/// The hour's trash directory for a removal from `parent` (JuiceFS's
/// layout, `meta/trash.rs`), made on first use in a transaction of its
/// own; `None` when the volume keeps no trash or `parent` is in it.
fn trash_for<E: Engine>(e: &E, parent: Ino) -> Result<Option<Ino>> {
    if e.format()?.trash_days == 0 || is_trash(parent) {
        return Ok(None);
    }
    let name = hour_name(Timestamp::now().secs);
    if let Some((known, ino)) = e.trash_hour().lock().as_ref()
        && *known == name
    {
        return Ok(Some(*ino));
    }
    let ino = e.write_ns(TRASH_INO, |tx| {
        if let Some(found) = tx.edge(TRASH_INO, name.as_bytes())? {
            return Ok(found.inode);
        }
        if tx.node(TRASH_INO)?.is_none() {
            tx.new_node(TRASH_INO, &new_trash_attr(ROOT_INO))?;
        }
        let ino = TRASH_INO + tx.next_trash_dir()?;
        tx.new_node(ino, &new_trash_attr(TRASH_INO))?;
        tx.insert_edge(TRASH_INO, name.as_bytes(), ino, FileType::Directory)?;
        tx.new_dir_stats(ino)?;
        tx.add_usage(align4k(0), 1)?;
        Ok(ino)
    })?;
    *e.trash_hour().lock() = Some((name, ino));
    Ok(Some(ino))
}

/// Emptying the trash ([`trash::empty_before`]) through the shared
/// operations.
impl<E: Engine> TrashOps for E {
    fn entries(&self, ctx: &Context, dir: Ino) -> Result<Vec<Entry>> {
        let mut all = self.readdir(ctx, dir, false)?;
        all.drain(..2.min(all.len()));
        Ok(all)
    }
    fn unlink(&self, ctx: &Context, dir: Ino, name: &[u8]) -> Result<()> {
        Meta::unlink(self, ctx, dir, name)
    }
    fn rmdir(&self, ctx: &Context, dir: Ino, name: &[u8]) -> Result<()> {
        Meta::rmdir(self, ctx, dir, name)
    }
    fn remove_hour(&self, name: &[u8]) -> Result<()> {
        self.write_ns(TRASH_INO, |tx| trash::remove_hour(tx, name))?;
        *self.trash_hour().lock() = None;
        Ok(())
    }
}
