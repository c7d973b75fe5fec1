//! The namespace: directory entries (`jfs_edge`), node creation and removal,
//! renames, hard links, symlinks and the trash, with JuiceFS's rules for link
//! counts, usage counters and directory statistics.

use rusqlite::{Connection, OptionalExtension, params};

use super::node;
use super::{Inner, Tx, TxError, TxResult, counter, session};
use crate::error::{Error, Result};
use crate::meta::rules::align4k;
use crate::meta::rules::type_only;
use crate::meta::trash::is_trash;
use crate::meta::trash::{hour_name, new_trash_attr};
use crate::meta::{
    Attr, Context, DirCursor, DirPage, Entry, FileType, Ino, ROOT_INO, RenameFlags, TRASH_INO,
    Timestamp,
};

use crate::meta::namespace::{self as ns, Edge};

fn get_edge(c: &Connection, parent: Ino, name: &[u8]) -> TxResult<Option<Edge>> {
    let mut stmt =
        c.prepare_cached("SELECT inode, type FROM jfs_edge WHERE parent=? AND name=?")?;
    Ok(stmt
        .query_row(params![parent as i64, name], |r| {
            Ok(Edge {
                inode: r.get::<_, i64>(0)? as u64,
                typ: r.get::<_, i64>(1)? as u8,
            })
        })
        .optional()?)
}

fn insert_edge(
    c: &Connection,
    parent: Ino,
    name: &[u8],
    inode: Ino,
    typ: FileType,
) -> TxResult<()> {
    c.execute(
        "INSERT INTO jfs_edge (parent, name, inode, type) VALUES (?,?,?,?)",
        params![parent as i64, name, inode as i64, typ as u8],
    )?;
    Ok(())
}

fn delete_edge(c: &Connection, parent: Ino, name: &[u8]) -> TxResult<()> {
    c.execute(
        "DELETE FROM jfs_edge WHERE parent=? AND name=?",
        params![parent as i64, name],
    )?;
    Ok(())
}

fn has_children(c: &Connection, dir: Ino) -> TxResult<bool> {
    Ok(c.query_row(
        "SELECT EXISTS (SELECT 1 FROM jfs_edge WHERE parent=?)",
        params![dir as i64],
        |r| r.get(0),
    )?)
}

/// The hourly trash directory for a removal from `parent`, created on first
/// use; `None` when the volume keeps no trash or `parent` is in it already.
pub(super) fn trash_for(inner: &Inner, parent: Ino) -> Result<Option<Ino>> {
    let days = inner.format()?.trash_days;
    if days == 0 || is_trash(parent) {
        return Ok(None);
    }
    let name = hour_name(Timestamp::now().secs);
    if let Some((cached, ino)) = inner.trash_dir.lock().as_ref()
        && *cached == name
    {
        return Ok(Some(*ino));
    }
    let ino = inner.write(|tx| {
        if let Some(e) = get_edge(tx, TRASH_INO, name.as_bytes())? {
            return Ok(e.inode);
        }
        if node::get(tx, TRASH_INO)?.is_none() {
            node::insert(tx, TRASH_INO, &new_trash_attr(ROOT_INO))?;
        }
        let next = super::incr_counter(tx, counter::NEXT_TRASH, 1)?;
        let ino = TRASH_INO + next as u64;
        node::insert(tx, ino, &new_trash_attr(TRASH_INO))?;
        insert_edge(tx, TRASH_INO, name.as_bytes(), ino, FileType::Directory)?;
        insert_dir_stats(tx, ino)?;
        node::add_usage(tx, align4k(0), 1)?;
        Ok(ino)
    })?;
    *inner.trash_dir.lock() = Some((name, ino));
    Ok(Some(ino))
}

fn insert_dir_stats(c: &Connection, dir: Ino) -> TxResult<()> {
    c.execute(
        "INSERT OR IGNORE INTO jfs_dir_stats (inode, data_length, used_space, used_inodes) \
         VALUES (?,0,0,0)",
        params![dir as i64],
    )?;
    Ok(())
}

/// Looks up a name ([`ns::lookup`]), in a read snapshot.
pub(super) fn lookup(
    inner: &Inner,
    ctx: &Context,
    parent: Ino,
    name: &[u8],
) -> Result<(Ino, Attr)> {
    inner.read(|c| ns::lookup(&mut View(c), ctx, parent, name))
}

/// Creates a node of any type (the rules in `meta/namespace.rs`).
#[allow(clippy::too_many_arguments)]
pub(super) fn mknod(
    inner: &Inner,
    ctx: &Context,
    parent: Ino,
    name: &[u8],
    typ: FileType,
    mode: u16,
    umask: u16,
    rdev: u32,
    target: &[u8],
) -> Result<(Ino, Attr)> {
    ns::check_new_name(parent, name)?;
    inner.format()?;
    let ino = inner.next_inode()?;
    let new = ns::NewNode {
        typ,
        mode,
        umask,
        rdev,
        target,
    };
    let attr = inner.write(|tx| ns::mknod(&mut Ns { tx, inner }, ctx, parent, name, ino, &new))?;
    Ok((ino, attr))
}

/// The target of a symlink.
pub(super) fn readlink(inner: &Inner, ino: Ino) -> Result<Vec<u8>> {
    inner.read(|c| {
        let a = node::must_get(c, ino)?;
        if a.typ != FileType::Symlink {
            return Err(Error::Invalid(format!("inode {ino} is not a symlink")).into());
        }
        c.query_row(
            "SELECT target FROM jfs_symlink WHERE inode=?",
            params![ino as i64],
            |r| Ok(r.get_ref(0)?.as_bytes()?.to_vec()),
        )
        .optional()?
        .ok_or_else(|| TxError::Fs(Error::Corrupt(format!("symlink {ino} has no target"))))
    })
}

/// How a non-directory node is dropped from the namespace when its last
/// entry goes (shared by unlink and rename-over).
fn drop_last_link(tx: &mut Tx<'_>, inner: &Inner, ino: Ino, attr: &Attr) -> TxResult<()> {
    if attr.typ == FileType::File {
        if session::mark_removed_if_open(inner, ino) {
            let sid = inner.sid.load(std::sync::atomic::Ordering::Relaxed);
            if sid > 0 {
                tx.execute(
                    "INSERT OR IGNORE INTO jfs_sustained (sid, inode) VALUES (?,?)",
                    params![sid as i64, ino as i64],
                )?;
            }
            node::update(tx, ino, attr)?;
            return Ok(());
        }
        tx.execute(
            "INSERT OR REPLACE INTO jfs_delfile (inode, length, expire) VALUES (?,?,?)",
            params![ino as i64, attr.length as i64, Timestamp::now().secs],
        )?;
        node::delete(tx, ino)?;
        node::add_usage(tx, -align4k(attr.length), -1)?;
        tx.post.deleted_files.push(ino);
    } else {
        node::delete(tx, ino)?;
        node::add_usage(tx, -align4k(0), -1)?;
    }
    Ok(())
}

/// Removes a non-directory entry; with a trash the node moves there (the
/// rules in `meta/namespace.rs`).
pub(super) fn unlink(inner: &Inner, ctx: &Context, parent: Ino, name: &[u8]) -> Result<()> {
    ns::check_unlink(ctx, parent, name)?;
    let trash = trash_for(inner, parent)?;
    inner.write(|tx| ns::unlink(&mut Ns { tx, inner }, ctx, parent, name, trash))
}

/// Removes an empty directory; with a trash it moves there.
pub(super) fn rmdir(inner: &Inner, ctx: &Context, parent: Ino, name: &[u8]) -> Result<()> {
    ns::check_rmdir(ctx, parent, name)?;
    let trash = trash_for(inner, parent)?;
    inner.write(|tx| ns::rmdir(&mut Ns { tx, inner }, ctx, parent, name, trash))
}

/// The namespace rules' view of a SQLite transaction (`meta/namespace.rs`).
pub(super) struct Ns<'a, 'c> {
    pub(super) tx: &'a mut Tx<'c>,
    pub(super) inner: &'a Inner,
}

impl<'a, 'c> Ns<'a, 'c> {
    pub(super) fn new(tx: &'a mut Tx<'c>, inner: &'a Inner) -> Self {
        Ns { tx, inner }
    }
}

/// The namespace rules' view of a read snapshot (no writes).
pub(super) struct View<'c>(pub(super) &'c Connection);

impl ns::NsRead for View<'_> {
    type Error = TxError;

    fn node(&mut self, ino: Ino) -> TxResult<Option<Attr>> {
        node::get(self.0, ino)
    }
    fn check(&mut self, ctx: &Context, a: &Attr, mask: u8) -> TxResult<()> {
        node::check(self.0, ctx, a, mask)
    }
    fn edge(&mut self, dir: Ino, name: &[u8]) -> TxResult<Option<Edge>> {
        get_edge(self.0, dir, name)
    }
}

impl ns::NsRead for Ns<'_, '_> {
    type Error = TxError;

    fn node(&mut self, ino: Ino) -> TxResult<Option<Attr>> {
        node::get(self.tx, ino)
    }
    fn check(&mut self, ctx: &Context, a: &Attr, mask: u8) -> TxResult<()> {
        node::check(self.tx, ctx, a, mask)
    }
    fn edge(&mut self, dir: Ino, name: &[u8]) -> TxResult<Option<Edge>> {
        get_edge(self.tx, dir, name)
    }
}

impl ns::NsTx for Ns<'_, '_> {
    fn put_node(&mut self, ino: Ino, a: &Attr) -> TxResult<()> {
        node::update(self.tx, ino, a)
    }
    fn delete_node(&mut self, ino: Ino) -> TxResult<()> {
        node::delete(self.tx, ino)
    }
    fn insert_edge(&mut self, dir: Ino, name: &[u8], ino: Ino, typ: FileType) -> TxResult<()> {
        insert_edge(self.tx, dir, name, ino, typ)
    }
    fn replace_edge(&mut self, dir: Ino, name: &[u8], ino: Ino, typ: FileType) -> TxResult<()> {
        self.tx.execute(
            "UPDATE jfs_edge SET inode=?, type=? WHERE parent=? AND name=?",
            params![ino as i64, typ as u8, dir as i64, name],
        )?;
        Ok(())
    }
    fn delete_edge(&mut self, dir: Ino, name: &[u8]) -> TxResult<()> {
        delete_edge(self.tx, dir, name)
    }
    fn has_children(&mut self, dir: Ino) -> TxResult<bool> {
        has_children(self.tx, dir)
    }
    /// Every name of a node is a row of `jfs_edge`: only the attribute's
    /// parent (a directory's, a singly linked node's) moves.
    fn move_parent(&mut self, _ino: Ino, a: &mut Attr, _from: Ino, to: Ino) -> TxResult<()> {
        if a.typ == FileType::Directory || a.parent > 0 {
            a.parent = to;
        }
        Ok(())
    }
    fn drop_parent(&mut self, _ino: Ino, a: &mut Attr, dir: Ino) -> TxResult<()> {
        if a.parent == dir {
            a.parent = 0;
        }
        Ok(())
    }
    fn add_dir_stat(&mut self, dir: Ino, len: i64, space: i64, inodes: i64) -> TxResult<()> {
        node::add_dir_stat(self.tx, dir, len, space, inodes)
    }
    fn drop_dir_stats(&mut self, dir: Ino) -> TxResult<()> {
        self.tx.execute(
            "DELETE FROM jfs_dir_stats WHERE inode=?",
            params![dir as i64],
        )?;
        self.tx.execute(
            "DELETE FROM jfs_dir_quota WHERE inode=?",
            params![dir as i64],
        )?;
        Ok(())
    }
    fn add_usage(&mut self, space: i64, inodes: i64) -> TxResult<()> {
        node::add_usage(self.tx, space, inodes)
    }
    fn drop_last_link(&mut self, ino: Ino, a: &Attr) -> TxResult<()> {
        drop_last_link(self.tx, self.inner, ino, a)
    }
    /// The names are the node's rows in `jfs_edge`: nothing else records
    /// them.
    fn add_link_parent(&mut self, _ino: Ino, a: &mut Attr, _dir: Ino) -> TxResult<()> {
        a.parent = 0;
        Ok(())
    }
    fn new_node(&mut self, ino: Ino, a: &Attr) -> TxResult<()> {
        node::insert(self.tx, ino, a)
    }
    fn set_symlink(&mut self, ino: Ino, target: &[u8]) -> TxResult<()> {
        self.tx.execute(
            "INSERT INTO jfs_symlink (inode, target) VALUES (?,?)",
            params![ino as i64, target],
        )?;
        Ok(())
    }
    fn new_dir_stats(&mut self, dir: Ino) -> TxResult<()> {
        insert_dir_stats(self.tx, dir)
    }
    fn rule(&mut self, id: u32) -> TxResult<std::sync::Arc<crate::meta::acl::Rule>> {
        node::rule(self.tx, id)
    }
    fn store_rule(&mut self, rule: &crate::meta::acl::Rule) -> TxResult<u32> {
        node::store_rule(self.tx, rule)
    }
    fn xattr(&mut self, ino: Ino, name: &[u8]) -> TxResult<Option<Vec<u8>>> {
        let name = super::xattr::text_name(name)?;
        Ok(self
            .tx
            .query_row(
                "SELECT value FROM jfs_xattr WHERE inode=? AND name=?",
                params![ino as i64, name],
                |r| r.get(0),
            )
            .optional()?)
    }
    fn xattr_list_len(&mut self, ino: Ino) -> TxResult<usize> {
        let used: i64 = self.tx.query_row(
            "SELECT COALESCE(SUM(length(CAST(name AS BLOB)) + 1), 0) \
             FROM jfs_xattr WHERE inode=?",
            params![ino as i64],
            |r| r.get(0),
        )?;
        Ok(used.max(0) as usize)
    }
    fn put_xattr(&mut self, ino: Ino, name: &[u8], value: &[u8], existed: bool) -> TxResult<()> {
        let name = super::xattr::text_name(name)?;
        if existed {
            self.tx.execute(
                "UPDATE jfs_xattr SET value=? WHERE inode=? AND name=?",
                params![value, ino as i64, name],
            )?;
        } else {
            self.tx.execute(
                "INSERT INTO jfs_xattr (inode, name, value) VALUES (?,?,?)",
                params![ino as i64, name, value],
            )?;
        }
        Ok(())
    }
    fn delete_xattr(&mut self, ino: Ino, name: &[u8]) -> TxResult<()> {
        let name = super::xattr::text_name(name)?;
        self.tx.execute(
            "DELETE FROM jfs_xattr WHERE inode=? AND name=?",
            params![ino as i64, name],
        )?;
        Ok(())
    }
}

/// Renames or exchanges an entry (JuiceFS `Rename`; the rules in
/// `meta/namespace.rs`).
pub(super) fn rename(
    inner: &Inner,
    ctx: &Context,
    psrc: Ino,
    nsrc: &[u8],
    pdst: Ino,
    ndst: &[u8],
    flags: RenameFlags,
) -> Result<(Ino, Attr)> {
    ns::check_rename(ctx, psrc, nsrc, pdst, ndst, flags)?;
    // Only a replaced target goes to the trash; look before making the
    // hour's directory.
    let replaces =
        ns::may_replace(flags) && inner.read(|c| Ok(get_edge(c, pdst, ndst)?.is_some()))?;
    let trash = if replaces {
        trash_for(inner, pdst)?
    } else {
        None
    };
    inner.write(|tx| {
        // Checked before the transaction (`quota::before_rename`).
        tx.check_quota = false;
        ns::rename(
            &mut Ns { tx, inner },
            ctx,
            psrc,
            nsrc,
            pdst,
            ndst,
            flags,
            trash,
        )
    })
}

/// Adds a hard link (the rules in `meta/namespace.rs`).
pub(super) fn link(
    inner: &Inner,
    ctx: &Context,
    ino: Ino,
    parent: Ino,
    name: &[u8],
) -> Result<Attr> {
    ns::check_new_name(parent, name)?;
    inner.write(|tx| ns::link(&mut Ns { tx, inner }, ctx, ino, parent, name))
}

/// Lists a directory, `.` and `..` first.
pub(super) fn readdir(inner: &Inner, ctx: &Context, ino: Ino, plus: bool) -> Result<Vec<Entry>> {
    inner.read(|c| {
        let mut out = ns::dots(&mut View(c), ctx, ino, plus)?;
        edges(c, ino, plus, None, None, &mut out)?;
        Ok(out)
    })
}

/// One page of a directory, in name order (the `(parent, name)` index, so
/// a page costs its own entries: no sort, no scan of what came before).
pub(super) fn readdir_page(
    inner: &Inner,
    ctx: &Context,
    ino: Ino,
    plus: bool,
    cursor: &DirCursor,
    max: usize,
) -> Result<DirPage> {
    let max = max.max(1);
    let (entries, rows, last) = inner.read(|c| {
        let mut out = Vec::new();
        let after = match cursor {
            DirCursor::Start => {
                out = ns::dots(&mut View(c), ctx, ino, plus)?;
                None
            }
            DirCursor::AfterName(name) => Some(name.as_slice()),
            DirCursor::Scan(_) => {
                return Err(Error::Invalid("a Redis cursor for a SQLite listing".into()).into());
            }
        };
        let (rows, last) = edges(c, ino, plus, after, Some(max), &mut out)?;
        Ok((out, rows, last))
    })?;
    inner.work.listed(rows);
    // A short page is the last; after a full one the next may be empty.
    let next = if rows >= max {
        last.map(DirCursor::AfterName)
    } else {
        None
    };
    Ok(DirPage {
        entries,
        next,
        may_repeat: false,
    })
}

/// Appends the entries of directory `ino` to `out`: all of them in
/// creation order, or at most `limit` rows after the name `after` in name
/// order. Returns the rows read and the name of the last (a row that makes
/// no entry — an unknown type — still moves the cursor).
fn edges(
    c: &Connection,
    ino: Ino,
    plus: bool,
    after: Option<&[u8]>,
    limit: Option<usize>,
    out: &mut Vec<Entry>,
) -> TxResult<(usize, Option<Vec<u8>>)> {
    let paged = limit.is_some();
    let filter = match (paged, after.is_some()) {
        (false, _) => "e.parent=?1 ORDER BY e.id",
        (true, false) => "e.parent=?1 ORDER BY e.name LIMIT ?3",
        (true, true) => "e.parent=?1 AND e.name>?2 ORDER BY e.name LIMIT ?3",
    };
    let parent = ino as i64;
    let after = after.unwrap_or_default();
    let limit = limit.map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX));
    let args: &[&dyn rusqlite::ToSql] = if paged {
        &[&parent, &after, &limit]
    } else {
        &[&parent]
    };
    let (mut rows_read, mut last) = (0usize, None);
    if plus {
        let (columns, join) = (node::COLUMNS, node::SPACE_JOIN);
        let mut stmt = c.prepare_cached(&format!(
            "SELECT e.name, {columns} FROM jfs_edge e JOIN jfs_node n ON e.inode=n.inode \
             {join} WHERE {filter}"
        ))?;
        let rows = stmt.query_map(args, |r| {
            let name = r.get_ref(0)?.as_bytes()?.to_vec();
            let (inode, attr) = node::from_row(r, 1)?;
            Ok(Entry { inode, name, attr })
        })?;
        for e in rows {
            let e = e?;
            rows_read += 1;
            last = Some(e.name.clone());
            if !e.name.is_empty() {
                out.push(e);
            }
        }
    } else {
        let mut stmt = c.prepare_cached(&format!(
            "SELECT e.name, e.inode, e.type FROM jfs_edge e WHERE {filter}"
        ))?;
        let rows = stmt.query_map(args, |r| {
            Ok((
                r.get_ref(0)?.as_bytes()?.to_vec(),
                r.get::<_, i64>(1)? as u64,
                r.get::<_, i64>(2)?,
            ))
        })?;
        for row in rows {
            let (name, inode, code) = row?;
            rows_read += 1;
            last = Some(name.clone());
            let Some(typ) = u8::try_from(code).ok().and_then(FileType::from_code) else {
                log::warn!("entry {name:?} in {ino} has unknown type {code}");
                continue;
            };
            if !name.is_empty() {
                out.push(Entry {
                    inode,
                    name,
                    attr: type_only(typ),
                });
            }
        }
    }
    Ok((rows_read, last))
}
