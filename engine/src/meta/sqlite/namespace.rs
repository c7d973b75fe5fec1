//! The namespace: directory entries (`jfs_edge`), node creation and removal,
//! renames, hard links, symlinks and the trash, with JuiceFS's rules for link
//! counts, usage counters and directory statistics.

use rusqlite::{Connection, OptionalExtension, params};

use super::node;
use super::{Inner, Tx, TxError, TxResult, counter, session};
use crate::error::{Error, Result};
use crate::meta::rules::align4k;
use crate::meta::rules::type_only;
use crate::meta::{Attr, Context, DirCursor, Entry, FileType, Ino, Timestamp};

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

/// Looks up a name ([`ns::lookup`]), in a read snapshot.
pub(super) fn lookup(
    inner: &Inner,
    ctx: &Context,
    parent: Ino,
    name: &[u8],
) -> Result<(Ino, Attr)> {
    inner.read(|c| ns::lookup(&mut View(c), ctx, parent, name))
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

/// The namespace rules' view of a SQLite transaction (`meta/namespace.rs`).
pub(crate) struct Ns<'a, 'c> {
    pub(super) tx: &'a mut Tx<'c>,
    pub(super) inner: &'a Inner,
}

impl<'a, 'c> Ns<'a, 'c> {
    pub(super) fn new(tx: &'a mut Tx<'c>, inner: &'a Inner) -> Self {
        Ns { tx, inner }
    }
}

/// The namespace rules' view of a read snapshot (no writes).
pub(crate) struct View<'c>(pub(super) &'c Connection);

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
    fn rule(&mut self, id: u32) -> TxResult<std::sync::Arc<crate::meta::acl::Rule>> {
        node::rule(self.0, id)
    }
    fn parents(&mut self, ino: Ino) -> TxResult<Vec<(Ino, i64)>> {
        node::parents(self.0, ino)
    }
    fn symlink(&mut self, ino: Ino) -> TxResult<Option<Vec<u8>>> {
        symlink(self.0, ino)
    }
    fn list(
        &mut self,
        dir: Ino,
        plus: bool,
        page: Option<(&DirCursor, usize)>,
        into: &mut Vec<Entry>,
    ) -> TxResult<ns::Listed> {
        list(self.0, dir, plus, page, into)
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
    fn rule(&mut self, id: u32) -> TxResult<std::sync::Arc<crate::meta::acl::Rule>> {
        node::rule(self.tx, id)
    }
    fn parents(&mut self, ino: Ino) -> TxResult<Vec<(Ino, i64)>> {
        node::parents(self.tx, ino)
    }
    fn symlink(&mut self, ino: Ino) -> TxResult<Option<Vec<u8>>> {
        symlink(self.tx, ino)
    }
    fn list(
        &mut self,
        dir: Ino,
        plus: bool,
        page: Option<(&DirCursor, usize)>,
        into: &mut Vec<Entry>,
    ) -> TxResult<ns::Listed> {
        list(self.tx, dir, plus, page, into)
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
        self.tx.execute(
            "INSERT OR IGNORE INTO jfs_dir_stats (inode, data_length, used_space, used_inodes) \
             VALUES (?,0,0,0)",
            params![dir as i64],
        )?;
        Ok(())
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
    fn next_trash_dir(&mut self) -> TxResult<u64> {
        Ok(super::incr_counter(self.tx, counter::NEXT_TRASH, 1)? as u64)
    }
    fn quotas_checked(&mut self) {
        self.tx.check_quota = false;
    }
}

/// A symlink's target.
fn symlink(c: &Connection, ino: Ino) -> TxResult<Option<Vec<u8>>> {
    Ok(c.query_row(
        "SELECT target FROM jfs_symlink WHERE inode=?",
        params![ino as i64],
        |r| Ok(r.get_ref(0)?.as_bytes()?.to_vec()),
    )
    .optional()?)
}

/// A directory's entries: all of them, or a page in name order (the
/// `(parent, name)` index, so a page costs its own entries: no sort, no
/// scan of what came before).
fn list(
    c: &Connection,
    dir: Ino,
    plus: bool,
    page: Option<(&DirCursor, usize)>,
    into: &mut Vec<Entry>,
) -> TxResult<ns::Listed> {
    let Some((cursor, max)) = page else {
        let (rows, _) = edges(c, dir, plus, None, None, into)?;
        return Ok(ns::Listed {
            rows,
            next: None,
            may_repeat: false,
        });
    };
    let max = max.max(1);
    let after = match cursor {
        DirCursor::Start => None,
        DirCursor::AfterName(name) => Some(name.as_slice()),
        DirCursor::Scan(_) => {
            return Err(Error::Invalid("a Redis cursor for a SQLite listing".into()).into());
        }
    };
    let (rows, last) = edges(c, dir, plus, after, Some(max), into)?;
    // A short page is the last; after a full one the next may be empty.
    let next = if rows >= max {
        last.map(DirCursor::AfterName)
    } else {
        None
    };
    Ok(ns::Listed {
        rows,
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
