//! The namespace on Redis: entries (`d{ino}` hashes), node creation and
//! removal, renames, hard links (`p{ino}`), symlinks (`s{ino}`) and the
//! trash, with the same rules as the SQLite engine.

use super::Inner;
use super::codec::{decode_attr, decode_entry, encode_entry};
use super::keys::counter;
use super::node;
use super::session;
use super::tx::{Read, Tx, TxError, TxResult};
use crate::error::{Error, Result};
use crate::meta::rules::align4k;
use crate::meta::rules::type_only;
use crate::meta::rules::{self, MASK_X};
use crate::meta::trash::TRASH_NAME;
use crate::meta::{
    Attr, Context, DirCursor, Entry, FileType, Ino, MAX_NAME_LEN, ROOT_INO, Timestamp,
};

pub(super) use crate::meta::trash::new_trash_attr;

use crate::meta::namespace::{self as ns, Edge};

fn get_edge(tx: &mut Tx<'_>, parent: Ino, name: &[u8]) -> TxResult<Option<Edge>> {
    let key = tx.keys.entry(parent);
    match tx.hget(&key, name)? {
        None => Ok(None),
        Some(v) => {
            let (typ, inode) = decode_entry(&v).ok_or_else(|| {
                TxError::Fs(Error::Corrupt(format!(
                    "entry {:?} of directory {parent} is {} bytes, not 9",
                    String::from_utf8_lossy(name),
                    v.len()
                )))
            })?;
            Ok(Some(Edge { inode, typ }))
        }
    }
}

/// Reads a directory's attributes and one of its entries in one round
/// trip (what a create, an unlink or a rename looks at first).
fn prefetch_entry(tx: &mut Tx<'_>, parent: Ino, name: &[u8]) -> TxResult<()> {
    let (node, dir) = (tx.keys.inode(parent), tx.keys.entry(parent));
    tx.prefetch(&[Read::Get(&node), Read::HGet(&dir, name)])
}

/// Reads a node's attributes and the sessions holding it open, in one
/// round trip (what dropping a name of it looks at).
fn prefetch_node(tx: &mut Tx<'_>, ino: Ino) -> TxResult<()> {
    let (node, opened) = (tx.keys.inode(ino), tx.keys.opened(ino));
    tx.prefetch(&[Read::Get(&node), Read::HGetAll(&opened)])
}

fn insert_edge(tx: &mut Tx<'_>, parent: Ino, name: &[u8], inode: Ino, typ: FileType) {
    let key = tx.keys.entry(parent);
    tx.hset(&key, name, &encode_entry(typ, inode));
}

fn delete_edge(tx: &mut Tx<'_>, parent: Ino, name: &[u8]) {
    let key = tx.keys.entry(parent);
    tx.hdel(&key, name);
}

fn has_children(tx: &mut Tx<'_>, dir: Ino) -> TxResult<bool> {
    let key = tx.keys.entry(dir);
    Ok(tx.hlen(&key)? > 0)
}

/// Looks up a name ([`ns::lookup`]).
pub(super) fn lookup(
    inner: &Inner,
    ctx: &Context,
    parent: Ino,
    name: &[u8],
) -> Result<(Ino, Attr)> {
    inner.read(|tx| ns::lookup(&mut Ns::new(tx, inner), ctx, parent, name))
}

/// One lookup in one round trip (JuiceFS's `scriptLookup`, plus the parent's
/// attributes): `{i{parent}, d{parent}[name], i{child}}`, cut short where a
/// value is missing. An inode past 2^52 (a Lua number loses digits there)
/// comes back without its attributes; the caller reads them itself.
const LOOKUP_SCRIPT: &str = r#"
local pa = redis.call('GET', KEYS[1])
if not pa then return {} end
local e = redis.call('HGET', KEYS[2], ARGV[1])
if not e then return {pa} end
if string.len(e) ~= 9 then return {pa, e} end
local ino = struct.unpack('>I8', string.sub(e, 2))
if ino > 4503599627370495 then return {pa, e} end
local a = redis.call('GET', ARGV[2] .. 'i' .. string.format('%.f', ino))
if not a then return {pa, e} end
local s = redis.call('GET', ARGV[2] .. 'sluiceSpace' .. string.format('%.f', ino))
if not s then return {pa, e, a} end
return {pa, e, a, s}
"#;

/// `lookup` of a plain name (not `.`, `..` or the trash) in one round trip.
pub(super) fn lookup_name(
    inner: &Inner,
    ctx: &Context,
    parent: Ino,
    name: &[u8],
) -> Result<(Ino, Attr)> {
    if name.len() > MAX_NAME_LEN {
        return Err(Error::NameTooLong);
    }
    if matches!(name, b"." | b"..") || (parent == ROOT_INO && name == TRASH_NAME) {
        return lookup(inner, ctx, parent, name);
    }
    let cache = inner.cache();
    if let Some(c) = cache
        && let Some(hit) = cached_lookup(inner, c, ctx, parent, name)
    {
        return hit;
    }
    let ticket = cache.and_then(|c| c.ticket());
    let (ikey, dkey) = (inner.keys.inode(parent), inner.keys.entry(parent));
    // By its digest (`EVALSHA`): the script is sent once per server, and
    // again only when the server answers that it lost it (`NOSCRIPT`: a
    // restart, a failover, a `SCRIPT FLUSH`).
    static SCRIPT: std::sync::LazyLock<redis::Script> =
        std::sync::LazyLock::new(|| redis::Script::new(LOOKUP_SCRIPT));
    let found: Vec<Vec<u8>> = inner.pool.with_conn(|c| {
        SCRIPT
            .key(&ikey)
            .key(&dkey)
            .arg(name)
            .arg(inner.keys.prefix())
            .invoke(c)
    })?;
    let mut found = found.into_iter();
    let pa = found.next().ok_or(Error::NotFound)?;
    let pa = decode_attr(&pa).ok_or_else(|| {
        Error::Corrupt(format!(
            "the attributes of inode {parent} ({} bytes) cannot be decoded",
            pa.len()
        ))
    })?;
    if let Some(c) = cache {
        c.put_attr(ticket, parent, &pa);
    }
    check_parent(inner, ctx, &pa)?;
    let Some(e) = found.next() else {
        if let Some(c) = cache {
            c.put_entry(ticket, parent, name, None);
        }
        return Err(Error::NotFound);
    };
    let (_, ino) = decode_entry(&e).ok_or_else(|| {
        Error::Corrupt(format!(
            "entry {:?} of directory {parent} is {} bytes, not 9",
            String::from_utf8_lossy(name),
            e.len()
        ))
    })?;
    let attr = match found.next() {
        Some(raw) => node::decode(ino, &raw, found.next().as_deref())?,
        None => inner.read(|tx| node::must_get(tx, ino))?,
    };
    if let Some(c) = cache {
        c.put_entry(ticket, parent, name, Some(ino));
        c.put_attr(ticket, ino, &attr);
    }
    Ok((ino, attr))
}

/// Whether `ctx` may look names up in the directory `pa`.
fn check_parent(inner: &Inner, ctx: &Context, pa: &Attr) -> Result<()> {
    if pa.typ != FileType::Directory {
        return Err(Error::NotDir);
    }
    let acl = match pa.access_acl {
        0 => None,
        _ => inner.read(|tx| node::access_rule(tx, pa))?,
    };
    rules::check_access(ctx, pa, acl.as_deref(), MASK_X)
}

/// A lookup answered from the host-local cache alone (the directory's
/// attributes, the entry, and the child's attributes all kept); `None`
/// when something is not.
fn cached_lookup(
    inner: &Inner,
    cache: &super::cache::MetaCache,
    ctx: &Context,
    parent: Ino,
    name: &[u8],
) -> Option<Result<(Ino, Attr)>> {
    let (pa, found) = cache.lookup(parent, name)?;
    Some(check_parent(inner, ctx, &pa).and_then(|()| found.ok_or(Error::NotFound)))
}

/// Drops a non-directory node from the namespace when its last entry goes.
fn drop_last_link(tx: &mut Tx<'_>, inner: &Inner, ino: Ino, attr: &Attr) -> TxResult<()> {
    if attr.typ == FileType::File {
        // Kept while open here or in another live session; the last close
        // of each holder (or the cleanup of its session) deletes it.
        let sid = inner.sid.load(std::sync::atomic::Ordering::Relaxed);
        let here = session::mark_removed_if_open(inner, ino) && sid > 0;
        let mut holders = session::other_holders(tx, inner, sid, ino)?;
        if here {
            holders.push(sid);
        } else if sid > 0 {
            // A record of this session's last close not sent yet would
            // make the file look held here to a cleanup elsewhere.
            let opened = tx.keys.opened(ino);
            tx.hdel(&opened, sid.to_string().as_bytes());
        }
        if !holders.is_empty() {
            for holder in holders {
                let key = tx.keys.sustained(holder);
                let mut c = redis::cmd("SADD");
                c.arg(&key).arg(ino.to_string());
                tx.cmd(c);
            }
            node::put(tx, ino, attr);
            return Ok(());
        }
        let opened = tx.keys.opened(ino);
        tx.del(&opened);
        let key = tx.keys.delfiles();
        let mut c = redis::cmd("ZADD");
        c.arg(&key)
            .arg(Timestamp::now().secs)
            .arg(format!("{ino}:{}", attr.length));
        tx.cmd(c);
        node::delete(tx, ino);
        node::add_usage(tx, -align4k(attr.length), -1)?;
        tx.post.deleted_files.push((ino, attr.length));
    } else {
        node::delete(tx, ino);
        node::add_usage(tx, -align4k(0), -1)?;
    }
    Ok(())
}

/// Moves the parent of a moved node from `from` to `to`: in its attribute
/// for singly linked nodes, in `p{ino}` for hard-linked ones.
fn move_parent(tx: &mut Tx<'_>, ino: Ino, a: &mut Attr, from: Ino, to: Ino) {
    if a.typ == FileType::Directory || a.parent > 0 {
        a.parent = to;
    } else {
        node::add_parent(tx, ino, to, 1);
        node::add_parent(tx, ino, from, -1);
    }
}

/// The namespace rules' view of a Redis transaction (`meta/namespace.rs`).
pub(crate) struct Ns<'a, 'c> {
    pub(super) tx: &'a mut Tx<'c>,
    pub(super) inner: &'a Inner,
}

impl<'a, 'c> Ns<'a, 'c> {
    pub(super) fn new(tx: &'a mut Tx<'c>, inner: &'a Inner) -> Self {
        Ns { tx, inner }
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
        let key = self.tx.keys.symlink(ino);
        self.tx.get(&key)
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
        node::put(self.tx, ino, a);
        Ok(())
    }
    fn delete_node(&mut self, ino: Ino) -> TxResult<()> {
        node::delete(self.tx, ino);
        Ok(())
    }
    fn insert_edge(&mut self, dir: Ino, name: &[u8], ino: Ino, typ: FileType) -> TxResult<()> {
        insert_edge(self.tx, dir, name, ino, typ);
        Ok(())
    }
    fn replace_edge(&mut self, dir: Ino, name: &[u8], ino: Ino, typ: FileType) -> TxResult<()> {
        insert_edge(self.tx, dir, name, ino, typ);
        Ok(())
    }
    fn delete_edge(&mut self, dir: Ino, name: &[u8]) -> TxResult<()> {
        delete_edge(self.tx, dir, name);
        Ok(())
    }
    fn has_children(&mut self, dir: Ino) -> TxResult<bool> {
        has_children(self.tx, dir)
    }
    fn move_parent(&mut self, ino: Ino, a: &mut Attr, from: Ino, to: Ino) -> TxResult<()> {
        move_parent(self.tx, ino, a, from, to);
        Ok(())
    }
    fn drop_parent(&mut self, ino: Ino, a: &mut Attr, dir: Ino) -> TxResult<()> {
        if a.parent == 0 {
            node::add_parent(self.tx, ino, dir, -1);
        } else if a.parent == dir {
            a.parent = 0;
        }
        Ok(())
    }
    fn add_dir_stat(&mut self, dir: Ino, len: i64, space: i64, inodes: i64) -> TxResult<()> {
        node::add_dir_stat(self.tx, dir, len, space, inodes)
    }
    fn drop_dir_stats(&mut self, dir: Ino) -> TxResult<()> {
        node::drop_dir_stats(self.tx, dir);
        Ok(())
    }
    fn add_usage(&mut self, space: i64, inodes: i64) -> TxResult<()> {
        node::add_usage(self.tx, space, inodes)
    }
    fn drop_last_link(&mut self, ino: Ino, a: &Attr) -> TxResult<()> {
        drop_last_link(self.tx, self.inner, ino, a)
    }
    fn add_link_parent(&mut self, ino: Ino, a: &mut Attr, dir: Ino) -> TxResult<()> {
        // The names of a hard-linked node are counted by directory in
        // `p{ino}`.
        if a.parent > 0 {
            node::add_parent(self.tx, ino, a.parent, 1);
        }
        node::add_parent(self.tx, ino, dir, 1);
        a.parent = 0;
        Ok(())
    }
    fn new_node(&mut self, ino: Ino, a: &Attr) -> TxResult<()> {
        node::put(self.tx, ino, a);
        Ok(())
    }
    fn set_symlink(&mut self, ino: Ino, target: &[u8]) -> TxResult<()> {
        let key = self.tx.keys.symlink(ino);
        self.tx.set(&key, target);
        Ok(())
    }
    fn new_dir_stats(&mut self, dir: Ino) -> TxResult<()> {
        node::new_dir_stats(self.tx, dir);
        Ok(())
    }
    fn store_rule(&mut self, rule: &crate::meta::acl::Rule) -> TxResult<u32> {
        node::store_rule(self.tx, rule)
    }
    fn xattr(&mut self, ino: Ino, name: &[u8]) -> TxResult<Option<Vec<u8>>> {
        let key = self.tx.keys.xattr(ino);
        self.tx.hget(&key, name)
    }
    fn xattr_list_len(&mut self, ino: Ino) -> TxResult<usize> {
        let key = self.tx.keys.xattr(ino);
        let names: Vec<Vec<u8>> = self.tx.now(redis::cmd("HKEYS").arg(&key))?;
        Ok(names.iter().map(|n| n.len() + 1).sum())
    }
    fn put_xattr(&mut self, ino: Ino, name: &[u8], value: &[u8], _existed: bool) -> TxResult<()> {
        let key = self.tx.keys.xattr(ino);
        self.tx.hset(&key, name, value);
        Ok(())
    }
    fn delete_xattr(&mut self, ino: Ino, name: &[u8]) -> TxResult<()> {
        let key = self.tx.keys.xattr(ino);
        self.tx.hdel(&key, name);
        Ok(())
    }
    fn next_trash_dir(&mut self) -> TxResult<u64> {
        let key = self.tx.keys.counter(counter::NEXT_TRASH);
        let next: i64 = self.tx.now(redis::cmd("INCR").arg(&key))?;
        Ok(next as u64)
    }
    fn quotas_checked(&mut self) {
        self.tx.check_quota = false;
    }
    fn prefetch_entry(&mut self, dir: Ino, name: &[u8]) -> TxResult<()> {
        prefetch_entry(self.tx, dir, name)
    }
    fn prefetch_node(&mut self, ino: Ino) -> TxResult<()> {
        prefetch_node(self.tx, ino)
    }
}

/// A field of a hash and its value.
type Field = (Vec<u8>, Vec<u8>);

/// A directory's entries: its whole entry hash, or one `HSCAN` step over
/// it (about `max` fields; a small hash, kept as a listpack, comes whole).
/// A scan may return a field twice when the hash is resized meanwhile,
/// hence `may_repeat`.
fn list(
    tx: &mut Tx<'_>,
    dir: Ino,
    plus: bool,
    page: Option<(&DirCursor, usize)>,
    into: &mut Vec<Entry>,
) -> TxResult<ns::Listed> {
    let first = into.len();
    let key = tx.keys.entry(dir);
    let (fields, next): (Vec<Field>, u64) = match page {
        None => (tx.hgetall(&key)?, 0),
        Some((cursor, max)) => {
            let at = match cursor {
                DirCursor::Start => 0,
                DirCursor::Scan(at) => *at,
                DirCursor::AfterName(_) => {
                    return Err(Error::Invalid("a SQLite cursor for a Redis listing".into()).into());
                }
            };
            let (next, fields) = tx.now(
                redis::cmd("HSCAN")
                    .arg(&key)
                    .arg(at)
                    .arg("COUNT")
                    .arg(max.max(1)),
            )?;
            (fields, next)
        }
    };
    let rows = fields.len();
    for (name, v) in fields {
        push_entry(into, dir, name, &v);
    }
    if plus {
        fill_attrs(tx, dir, &mut into[first..])?;
    }
    Ok(ns::Listed {
        rows,
        next: (next != 0).then_some(DirCursor::Scan(next)),
        may_repeat: true,
    })
}

/// Appends the entry of field `name` (value `v`) of directory `ino`'s hash,
/// with its type alone; a corrupt one is logged and left out.
fn push_entry(out: &mut Vec<Entry>, ino: Ino, name: Vec<u8>, v: &[u8]) {
    if name.is_empty() {
        return;
    }
    let Some((code, inode)) = decode_entry(v) else {
        log::warn!("entry {name:?} in {ino} is corrupt");
        return;
    };
    let Some(typ) = FileType::from_code(code) else {
        log::warn!("entry {name:?} in {ino} has unknown type {code}");
        return;
    };
    out.push(Entry {
        inode,
        name,
        attr: type_only(typ),
    });
}

/// Reads the attributes of `entries` (of directory `ino`), with their
/// space records, 1024 entries per `MGET`.
fn fill_attrs(tx: &mut Tx<'_>, ino: Ino, entries: &mut [Entry]) -> TxResult<()> {
    for batch in entries.chunks_mut(1024) {
        let mut get = redis::cmd("MGET");
        for e in batch.iter() {
            get.arg(tx.keys.inode(e.inode)).arg(tx.keys.space(e.inode));
        }
        let values: Vec<Option<Vec<u8>>> = tx.now(&get)?;
        for (e, v) in batch.iter_mut().zip(values.chunks(2)) {
            let (node, space) = (v.first().and_then(Option::as_deref), v.get(1));
            match node.map(|raw| node::decode(e.inode, raw, space.and_then(Option::as_deref))) {
                Some(Ok(attr)) => e.attr = attr,
                Some(Err(_)) | None => {
                    log::warn!("no attributes for inode {} in {ino}", e.inode)
                }
            }
        }
    }
    Ok(())
}
