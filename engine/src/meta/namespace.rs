//! Namespace rules written once: making nodes, hard links, unlink, rmdir,
//! rename (plain,
//! `RENAME_NOREPLACE`, `RENAME_EXCHANGE`; removed and replaced names into
//! the trash) over the storage primitives each engine gives in a
//! transaction ([`NsTx`]).
//!
//! The engines run [`check_rename`] before their transaction, find the
//! trash directory a replaced target goes to (which may create the hour's
//! directory, in a transaction of its own), then call [`rename`] inside
//! one transaction with their [`NsTx`]. What differs between them stays
//! behind the trait: how an entry, a node, a hard link's parents, a
//! directory's statistics are stored, and what dropping a file's last
//! link does (delete it, or keep it for the sessions that hold it open).

use crate::error::Error;
use crate::meta::acl::AclType;
use crate::meta::acl::Rule;
use crate::meta::bounded::XATTR_LIST_MAX;
use crate::meta::rules::{self, MASK_R, MASK_W, MASK_X, align4k, check_name, entry_stat};
use crate::meta::trash::{TRASH_NAME, is_trash, trash_entry_name};
use crate::meta::{
    Attr, Context, FileType, Ino, MAX_NAME_LEN, ROOT_INO, RenameFlags, SetAttr, TRASH_INO,
    Timestamp, XattrMode,
};

/// A directory entry: the node it names and the node's type code.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Edge {
    pub(crate) inode: Ino,
    pub(crate) typ: u8,
}

/// What [`NsRead::list`] read: the records it visited (a corrupt one
/// included), where the next page starts (`None`: the directory ends), and
/// whether a later page may repeat an entry of an earlier one.
pub(crate) struct Listed {
    pub(crate) rows: usize,
    pub(crate) next: Option<crate::meta::DirCursor>,
    pub(crate) may_repeat: bool,
}

/// What reading the namespace needs of an engine, in a transaction or a
/// read-only snapshot.
pub(crate) trait NsRead {
    /// The engine's transaction error; a file-system answer converts into
    /// it.
    type Error: From<Error>;

    /// A node's attributes (None: no such node).
    fn node(&mut self, ino: Ino) -> Result<Option<Attr>, Self::Error>;
    /// Whether `ctx` may do `mask` (`MASK_*` bits) to `a` (its ACL read
    /// beside it).
    fn check(&mut self, ctx: &Context, a: &Attr, mask: u8) -> Result<(), Self::Error>;
    /// The entry `name` of `dir`.
    fn edge(&mut self, dir: Ino, name: &[u8]) -> Result<Option<Edge>, Self::Error>;
    /// An ACL rule by its id.
    fn rule(&mut self, id: u32) -> Result<std::sync::Arc<Rule>, Self::Error>;
    /// Every directory holding an entry for `ino`, with how many entries
    /// (Redis records them only for a hard-linked node).
    fn parents(&mut self, ino: Ino) -> Result<Vec<(Ino, i64)>, Self::Error>;
    /// A symlink's target, as stored.
    fn symlink(&mut self, ino: Ino) -> Result<Option<Vec<u8>>, Self::Error>;
    /// Appends the entries of directory `dir` to `into` (with their
    /// attributes when `plus`, their type alone otherwise; an entry whose
    /// record cannot be read is logged and left out): all of them
    /// (`page` None), or about `max` from the cursor (`Some((cursor,
    /// max))`; `Start` is the first page). Each engine pages in its own
    /// order: SQLite by name after the last one read, Redis by `HSCAN`
    /// cursor; a cursor of the other engine is refused.
    fn list(
        &mut self,
        dir: Ino,
        plus: bool,
        page: Option<(&crate::meta::DirCursor, usize)>,
        into: &mut Vec<crate::meta::Entry>,
    ) -> Result<Listed, Self::Error>;

    /// A node that must exist.
    fn must_node(&mut self, ino: Ino) -> Result<Attr, Self::Error> {
        self.node(ino)?.ok_or_else(|| Error::NotFound.into())
    }
}

/// What the namespace rules need of an engine inside one transaction. Every
/// read sees the transaction's own writes before it.
pub(crate) trait NsTx: NsRead {
    /// Writes a node's attributes.
    fn put_node(&mut self, ino: Ino, a: &Attr) -> Result<(), Self::Error>;
    /// Removes a node (an empty directory replaced by a rename).
    fn delete_node(&mut self, ino: Ino) -> Result<(), Self::Error>;
    /// Adds the entry `name` to `dir` (absent before).
    fn insert_edge(
        &mut self,
        dir: Ino,
        name: &[u8],
        ino: Ino,
        typ: FileType,
    ) -> Result<(), Self::Error>;
    /// Points the existing entry `name` of `dir` at another node.
    fn replace_edge(
        &mut self,
        dir: Ino,
        name: &[u8],
        ino: Ino,
        typ: FileType,
    ) -> Result<(), Self::Error>;
    /// Removes the entry `name` of `dir`.
    fn delete_edge(&mut self, dir: Ino, name: &[u8]) -> Result<(), Self::Error>;
    /// Whether `dir` has entries.
    fn has_children(&mut self, dir: Ino) -> Result<bool, Self::Error>;
    /// Moves one of `a`'s names from the directory `from` to `to`: in its
    /// attributes for a directory or a singly linked node, in the engine's
    /// record of a hard-linked node's parents otherwise.
    fn move_parent(
        &mut self,
        ino: Ino,
        a: &mut Attr,
        from: Ino,
        to: Ino,
    ) -> Result<(), Self::Error>;
    /// One name of `a` in `dir` is gone and others remain: the parent
    /// `dir` no longer stands for all of them.
    fn drop_parent(&mut self, ino: Ino, a: &mut Attr, dir: Ino) -> Result<(), Self::Error>;
    /// Changes `dir`'s statistics (where the volume keeps them).
    fn add_dir_stat(
        &mut self,
        dir: Ino,
        len: i64,
        space: i64,
        inodes: i64,
    ) -> Result<(), Self::Error>;
    /// Forgets the statistics (and quota) of a directory that goes.
    fn drop_dir_stats(&mut self, dir: Ino) -> Result<(), Self::Error>;
    /// Changes the volume's usage.
    fn add_usage(&mut self, space: i64, inodes: i64) -> Result<(), Self::Error>;
    /// The last name of the file `ino` went: delete it, or keep it for the
    /// sessions holding it open.
    fn drop_last_link(&mut self, ino: Ino, a: &Attr) -> Result<(), Self::Error>;
    /// `a` gets another name, in `dir`: a node with several names has no
    /// single parent (0), and the engine records where its names are.
    fn add_link_parent(&mut self, ino: Ino, a: &mut Attr, dir: Ino) -> Result<(), Self::Error>;
    /// Writes the attributes of a node just made (no node of that number
    /// existed).
    fn new_node(&mut self, ino: Ino, a: &Attr) -> Result<(), Self::Error>;
    /// Stores a symlink's target.
    fn set_symlink(&mut self, ino: Ino, target: &[u8]) -> Result<(), Self::Error>;
    /// Starts the statistics of a directory just made (where kept).
    fn new_dir_stats(&mut self, dir: Ino) -> Result<(), Self::Error>;
    /// The id of `rule`, stored if new (0 for an empty rule).
    fn store_rule(&mut self, rule: &Rule) -> Result<u32, Self::Error>;
    /// An extended attribute's value.
    fn xattr(&mut self, ino: Ino, name: &[u8]) -> Result<Option<Vec<u8>>, Self::Error>;
    /// The bytes `listxattr` of `ino` returns now (each name and its NUL).
    fn xattr_list_len(&mut self, ino: Ino) -> Result<usize, Self::Error>;
    /// Sets an extended attribute (`existed`: it had a value before).
    fn put_xattr(
        &mut self,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        existed: bool,
    ) -> Result<(), Self::Error>;
    /// Removes an extended attribute that exists.
    fn delete_xattr(&mut self, ino: Ino, name: &[u8]) -> Result<(), Self::Error>;
    /// The next number of an hour's trash directory (the counter
    /// `nextTrash`, taken now: a conflict wastes one, harmlessly).
    fn next_trash_dir(&mut self) -> Result<u64, Self::Error>;
    /// Quotas were checked before this transaction (a rename's, by
    /// `quota::before_rename`): its changes are not checked again.
    fn quotas_checked(&mut self);

    /// Reads `dir`'s attributes and its entry `name` ahead, together (a
    /// round trip saved on Redis); nothing elsewhere.
    fn prefetch_entry(&mut self, _dir: Ino, _name: &[u8]) -> Result<(), Self::Error> {
        Ok(())
    }
    /// Reads what dropping a name of `ino` looks at, together.
    fn prefetch_node(&mut self, _ino: Ino) -> Result<(), Self::Error> {
        Ok(())
    }

    /// The access ACL of `a`, when it has one.
    fn access_rule(&mut self, a: &Attr) -> Result<Option<std::sync::Arc<Rule>>, Self::Error> {
        match a.access_acl {
            0 => Ok(None),
            id => self.rule(id).map(Some),
        }
    }

    /// Whether `dir` is `ancestor` or lies below it (following parents;
    /// a cycle is corruption, not a loop).
    fn is_under(&mut self, mut dir: Ino, ancestor: Ino) -> Result<bool, Self::Error> {
        for _ in 0..4096 {
            if dir == ancestor {
                return Ok(true);
            }
            if dir == ROOT_INO || dir == 0 || is_trash(dir) {
                return Ok(false);
            }
            match self.node(dir)? {
                Some(a) => dir = a.parent,
                None => return Ok(false),
            }
        }
        Err(Error::Corrupt(format!("directory {dir} has a parent cycle")).into())
    }
}

/// A directory ready to take a change of its entries, with JuiceFS's
/// checks: a directory, searchable and writable by `ctx`, and (`creating`)
/// not removed into the trash.
/// Looks up a name, with `.`, `..` and the root's `.trash` (the caller
/// needs search permission on `parent`).
pub(crate) fn lookup<T: NsRead>(
    tx: &mut T,
    ctx: &Context,
    parent: Ino,
    name: &[u8],
) -> Result<(Ino, Attr), T::Error> {
    if name.len() > MAX_NAME_LEN {
        return Err(Error::NameTooLong.into());
    }
    let pa = tx.must_node(parent)?;
    if pa.typ != FileType::Directory {
        return Err(Error::NotDir.into());
    }
    tx.check(ctx, &pa, MASK_X)?;
    match name {
        b"." => Ok((parent, pa)),
        b".." => {
            let up = if parent == ROOT_INO {
                ROOT_INO
            } else {
                pa.parent
            };
            Ok((up, tx.must_node(up)?))
        }
        _ if parent == ROOT_INO && name == TRASH_NAME => Ok((TRASH_INO, tx.must_node(TRASH_INO)?)),
        _ => {
            let e = tx.edge(parent, name)?.ok_or(Error::NotFound)?;
            Ok((e.inode, tx.must_node(e.inode)?))
        }
    }
}

/// The "." and ".." entries a listing of directory `ino` starts with,
/// after its checks (a directory; read permission, and search permission
/// too when the entries carry attributes).
pub(crate) fn dots<T: NsRead>(
    tx: &mut T,
    ctx: &Context,
    ino: Ino,
    plus: bool,
) -> Result<Vec<crate::meta::Entry>, T::Error> {
    let a = tx.must_node(ino)?;
    if a.typ != FileType::Directory {
        return Err(Error::NotDir.into());
    }
    let mask = if plus { MASK_R | MASK_X } else { MASK_R };
    tx.check(ctx, &a, mask)?;
    let up = if ino == ROOT_INO { ROOT_INO } else { a.parent };
    let up_attr = if plus { tx.node(up)? } else { None };
    Ok(rules::dot_entries(ino, a, up, up_attr, plus))
}

pub(crate) fn writable_dir<T: NsTx>(
    tx: &mut T,
    ctx: &Context,
    dir: Ino,
    creating: bool,
) -> Result<Attr, T::Error> {
    let a = tx.must_node(dir)?;
    if a.typ != FileType::Directory {
        return Err(Error::NotDir.into());
    }
    if creating && a.parent > TRASH_INO {
        return Err(Error::NotFound.into());
    }
    tx.check(ctx, &a, MASK_W | MASK_X)?;
    Ok(a)
}

/// A symlink's target: 1 to 4096 bytes (PATH_MAX), no NUL.
pub(crate) fn check_symlink_target(target: &[u8]) -> Result<(), Error> {
    if target.is_empty() || target.len() > 4096 || target.contains(&0) {
        return Err(Error::Invalid(
            "a symlink target must be 1..4096 bytes without NUL".into(),
        ));
    }
    Ok(())
}

/// What making a name (a new node or a hard link) in `parent` can refuse
/// before looking at the volume.
pub(crate) fn check_new_name(parent: Ino, name: &[u8]) -> Result<(), Error> {
    if is_trash(parent) || (parent == ROOT_INO && name == TRASH_NAME) {
        return Err(Error::Perm);
    }
    if name == b"." || name == b".." {
        return Err(Error::Exists);
    }
    check_name(name)
}

/// What a new node is.
pub(crate) struct NewNode<'a> {
    pub(crate) typ: FileType,
    pub(crate) mode: u16,
    pub(crate) umask: u16,
    pub(crate) rdev: u32,
    /// A symlink's target (empty otherwise).
    pub(crate) target: &'a [u8],
}

/// Makes the node `ino` (a number the engine allocated) as `name` in
/// `parent`, in the caller's transaction: the mode from the umask or the
/// directory's default ACL, usage and statistics counted.
pub(crate) fn mknod<T: NsTx>(
    tx: &mut T,
    ctx: &Context,
    parent: Ino,
    name: &[u8],
    ino: Ino,
    new: &NewNode<'_>,
) -> Result<Attr, T::Error> {
    tx.prefetch_entry(parent, name)?;
    let mut pa = writable_dir(tx, ctx, parent, true)?;
    if pa.flags & rules::FLAG_IMMUTABLE != 0 {
        return Err(Error::Perm.into());
    }
    if tx.edge(parent, name)?.is_some() {
        return Err(Error::Exists.into());
    }
    let now = Timestamp::now();
    let default = match pa.default_acl {
        0 => None,
        id => Some(tx.rule(id)?),
    };
    let (mode, access) = rules::new_node_mode(new.typ, new.mode, new.umask, default.as_deref());
    let access_acl = match access {
        Some(rule) => tx.store_rule(&rule)?,
        None => 0,
    };
    let attr = rules::new_node_attr(
        ctx,
        &pa,
        parent,
        new.typ,
        mode,
        new.rdev,
        new.target.len(),
        access_acl,
        now,
    );
    tx.insert_edge(parent, name, ino, new.typ)?;
    tx.new_node(ino, &attr)?;
    match new.typ {
        FileType::Symlink => tx.set_symlink(ino, new.target)?,
        FileType::Directory => {
            tx.new_dir_stats(ino)?;
            pa.nlink += 1;
        }
        _ => {}
    }
    pa.mtime = now;
    pa.ctime = now;
    tx.put_node(parent, &pa)?;
    tx.add_usage(align4k(0), 1)?;
    tx.add_dir_stat(parent, 0, align4k(0), 1)?;
    Ok(attr)
}

/// Adds the name `name` in `parent` to the node `ino` (a hard link), in the
/// caller's transaction.
pub(crate) fn link<T: NsTx>(
    tx: &mut T,
    ctx: &Context,
    ino: Ino,
    parent: Ino,
    name: &[u8],
) -> Result<Attr, T::Error> {
    let mut pa = writable_dir(tx, ctx, parent, true)?;
    if pa.flags & rules::FLAG_IMMUTABLE != 0 {
        return Err(Error::Perm.into());
    }
    if tx.edge(parent, name)?.is_some() {
        return Err(Error::Exists.into());
    }
    let mut a = tx.must_node(ino)?;
    if a.typ == FileType::Directory {
        return Err(Error::Perm.into());
    }
    if a.flags & (rules::FLAG_APPEND | rules::FLAG_IMMUTABLE) != 0 || a.nlink == 0 {
        return Err(Error::Perm.into());
    }
    let now = Timestamp::now();
    pa.mtime = now;
    pa.ctime = now;
    tx.add_link_parent(ino, &mut a, parent)?;
    a.nlink += 1;
    a.ctime = now;
    tx.insert_edge(parent, name, ino, a.typ)?;
    tx.put_node(ino, &a)?;
    tx.put_node(parent, &pa)?;
    let (len, space, inodes) = entry_stat(&a);
    tx.add_dir_stat(parent, len, space, inodes)?;
    Ok(a)
}

/// What an unlink can refuse before looking at the volume.
pub(crate) fn check_unlink(ctx: &Context, parent: Ino, name: &[u8]) -> Result<(), Error> {
    if (parent == ROOT_INO && name == TRASH_NAME) || (is_trash(parent) && !rules::is_root(ctx)) {
        return Err(Error::Perm);
    }
    if name == b"." || name == b".." {
        return Err(Error::IsDir);
    }
    check_name(name)
}

/// Removes a non-directory entry, in the caller's transaction; with a
/// trash (`trash`: this hour's directory) the node moves there.
pub(crate) fn unlink<T: NsTx>(
    tx: &mut T,
    ctx: &Context,
    parent: Ino,
    name: &[u8],
    trash: Option<Ino>,
) -> Result<(), T::Error> {
    tx.prefetch_entry(parent, name)?;
    let mut pa = writable_dir(tx, ctx, parent, false)?;
    if pa.flags & (rules::FLAG_APPEND | rules::FLAG_IMMUTABLE) != 0 {
        return Err(Error::Perm.into());
    }
    let e = tx.edge(parent, name)?.ok_or(Error::NotFound)?;
    if e.typ == FileType::Directory as u8 {
        return Err(Error::IsDir.into());
    }
    tx.prefetch_node(e.inode)?;
    let now = Timestamp::now();
    let Some(mut a) = tx.node(e.inode)? else {
        log::warn!("entry {name:?} in {parent} names missing inode {}", e.inode);
        tx.delete_edge(parent, name)?;
        return Ok(());
    };
    rules::check_sticky(ctx, &pa, &a)?;
    if a.flags & (rules::FLAG_APPEND | rules::FLAG_IMMUTABLE) != 0 {
        return Err(Error::Perm.into());
    }
    let mut trash = trash;
    let trash_name = trash.map(|_| trash_entry_name(parent, e.inode, name));
    if let (Some(t), Some(tn)) = (trash, &trash_name)
        && a.nlink > 1
        && tx.edge(t, tn)?.is_some_and(|x| x.inode == e.inode)
    {
        // Another name of this node is in this hour's trash already.
        trash = None;
    }
    let (slen, sspace, sinodes) = entry_stat(&a);
    a.ctime = now;
    tx.delete_edge(parent, name)?;
    match (trash, &trash_name) {
        (Some(t), Some(tn)) => {
            tx.move_parent(e.inode, &mut a, parent, t)?;
            tx.put_node(e.inode, &a)?;
            tx.insert_edge(t, tn, e.inode, a.typ)?;
            tx.add_dir_stat(t, slen, sspace, sinodes)?;
        }
        _ => {
            a.nlink = a.nlink.saturating_sub(1);
            if a.nlink > 0 {
                tx.drop_parent(e.inode, &mut a, parent)?;
                tx.put_node(e.inode, &a)?;
            } else {
                tx.drop_last_link(e.inode, &a)?;
            }
        }
    }
    if !is_trash(parent) {
        pa.mtime = now;
        pa.ctime = now;
        tx.put_node(parent, &pa)?;
    }
    tx.add_dir_stat(parent, -slen, -sspace, -sinodes)?;
    Ok(())
}

/// What an rmdir can refuse before looking at the volume.
pub(crate) fn check_rmdir(ctx: &Context, parent: Ino, name: &[u8]) -> Result<(), Error> {
    match name {
        b"." => return Err(Error::Invalid("cannot remove '.'".into())),
        b".." => return Err(Error::NotEmpty),
        _ => {}
    }
    if (parent == ROOT_INO && name == TRASH_NAME)
        || parent == TRASH_INO
        || (is_trash(parent) && !rules::is_root(ctx))
    {
        return Err(Error::Perm);
    }
    check_name(name)
}

/// Removes an empty directory, in the caller's transaction; with a trash
/// it moves there.
pub(crate) fn rmdir<T: NsTx>(
    tx: &mut T,
    ctx: &Context,
    parent: Ino,
    name: &[u8],
    trash: Option<Ino>,
) -> Result<(), T::Error> {
    let mut pa = writable_dir(tx, ctx, parent, false)?;
    if pa.flags & (rules::FLAG_APPEND | rules::FLAG_IMMUTABLE) != 0 {
        return Err(Error::Perm.into());
    }
    let e = tx.edge(parent, name)?.ok_or(Error::NotFound)?;
    if e.typ != FileType::Directory as u8 {
        return Err(Error::NotDir.into());
    }
    if tx.has_children(e.inode)? {
        return Err(Error::NotEmpty.into());
    }
    let now = Timestamp::now();
    let found = tx.node(e.inode)?;
    if let Some(a) = &found {
        rules::check_sticky(ctx, &pa, a)?;
    }
    tx.delete_edge(parent, name)?;
    tx.drop_dir_stats(e.inode)?;
    match (found, trash) {
        (Some(mut a), Some(t)) => {
            a.ctime = now;
            a.parent = t;
            tx.put_node(e.inode, &a)?;
            let tn = trash_entry_name(parent, e.inode, name);
            tx.insert_edge(t, &tn, e.inode, FileType::Directory)?;
            tx.add_dir_stat(t, 0, align4k(0), 1)?;
        }
        (Some(_), None) => {
            tx.delete_node(e.inode)?;
            tx.add_usage(-align4k(0), -1)?;
        }
        (None, _) => {}
    }
    if !is_trash(parent) {
        pa.nlink = pa.nlink.saturating_sub(1);
        pa.mtime = now;
        pa.ctime = now;
        tx.put_node(parent, &pa)?;
    }
    tx.add_dir_stat(parent, 0, -align4k(0), -1)?;
    Ok(())
}

/// What a rename can refuse before looking at the volume.
pub(crate) fn check_rename(
    ctx: &Context,
    psrc: Ino,
    nsrc: &[u8],
    pdst: Ino,
    ndst: &[u8],
    flags: RenameFlags,
) -> Result<(), Error> {
    if (psrc == ROOT_INO && nsrc == TRASH_NAME) || (pdst == ROOT_INO && ndst == TRASH_NAME) {
        return Err(Error::Perm);
    }
    if is_trash(pdst) || (is_trash(psrc) && !rules::is_root(ctx)) {
        return Err(Error::Perm);
    }
    for n in [nsrc, ndst] {
        if n == b"." || n == b".." {
            return Err(Error::Invalid("cannot rename '.' or '..'".into()));
        }
        check_name(n)?;
    }
    if flags.noreplace && flags.exchange {
        return Err(Error::Invalid(
            "rename cannot both exchange and refuse to replace".into(),
        ));
    }
    Ok(())
}

/// Whether a rename with `flags` may replace its target (and so may need
/// the trash): the engines make the trash's hour directory only then.
pub(crate) fn may_replace(flags: RenameFlags) -> bool {
    !flags.exchange && !flags.noreplace
}

/// Renames or exchanges an entry (JuiceFS `Rename`), in the caller's
/// transaction; a replaced target goes to `trash` when given. Returns the
/// moved node and its attributes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rename<T: NsTx>(
    tx: &mut T,
    ctx: &Context,
    psrc: Ino,
    nsrc: &[u8],
    pdst: Ino,
    ndst: &[u8],
    flags: RenameFlags,
    trash: Option<Ino>,
) -> Result<(Ino, Attr), T::Error> {
    let spa = tx.must_node(psrc)?;
    let dpa = tx.must_node(pdst)?;
    if spa.typ != FileType::Directory || dpa.typ != FileType::Directory {
        return Err(Error::NotDir.into());
    }
    if spa.flags & (rules::FLAG_APPEND | rules::FLAG_IMMUTABLE) != 0
        || dpa.flags & rules::FLAG_IMMUTABLE != 0
    {
        return Err(Error::Perm.into());
    }
    if dpa.parent > TRASH_INO {
        return Err(Error::NotFound.into());
    }
    tx.check(ctx, &spa, MASK_W | MASK_X)?;
    tx.check(ctx, &dpa, MASK_W | MASK_X)?;
    let se = tx.edge(psrc, nsrc)?.ok_or(Error::NotFound)?;
    let mut sa = tx.must_node(se.inode)?;
    if psrc == pdst && nsrc == ndst {
        return Ok((se.inode, sa));
    }
    if sa.typ == FileType::Directory && tx.is_under(pdst, se.inode)? {
        return Err(Error::Invalid("cannot move a directory into itself".into()).into());
    }
    rules::check_sticky(ctx, &spa, &sa)?;
    if sa.flags & (rules::FLAG_APPEND | rules::FLAG_IMMUTABLE) != 0 {
        return Err(Error::Perm.into());
    }
    let de = tx.edge(pdst, ndst)?;
    let mut da = match de {
        Some(de) => {
            if flags.noreplace {
                return Err(Error::Exists.into());
            }
            let da = tx.node(de.inode)?;
            if let Some(da) = &da {
                if da.flags & (rules::FLAG_APPEND | rules::FLAG_IMMUTABLE) != 0 {
                    return Err(Error::Perm.into());
                }
                rules::check_sticky(ctx, &dpa, da)?;
            }
            if flags.exchange {
                if de.typ == FileType::Directory as u8 && tx.is_under(psrc, de.inode)? {
                    return Err(Error::Invalid("cannot move a directory into itself".into()).into());
                }
            } else if de.inode == se.inode {
                // Two names of one node: POSIX says do nothing.
                return Ok((se.inode, sa));
            } else if sa.typ == FileType::Directory && de.typ != FileType::Directory as u8 {
                return Err(Error::NotDir.into());
            } else if de.typ == FileType::Directory as u8 {
                if sa.typ != FileType::Directory {
                    return Err(Error::IsDir.into());
                }
                if tx.has_children(de.inode)? {
                    return Err(Error::NotEmpty.into());
                }
            }
            da
        }
        None => {
            if flags.exchange {
                return Err(Error::NotFound.into());
            }
            None
        }
    };
    let now = Timestamp::now();
    let same_dir = psrc == pdst;
    let (slen, sspace, sinodes) = entry_stat(&sa);
    let (mut src_nlink, mut dst_nlink) = (0i64, 0i64);
    if flags.exchange {
        let de = de.ok_or(Error::NotFound)?;
        let dtyp = FileType::from_code(de.typ)
            .ok_or_else(|| Error::Corrupt(format!("entry type {} is unknown", de.typ)))?;
        tx.replace_edge(psrc, nsrc, de.inode, dtyp)?;
        tx.replace_edge(pdst, ndst, se.inode, sa.typ)?;
        if let Some(da) = da.as_mut() {
            if !same_dir {
                if da.typ == FileType::Directory {
                    dst_nlink -= 1;
                    src_nlink += 1;
                }
                tx.move_parent(de.inode, da, pdst, psrc)?;
                let (dlen, dspace, dinodes) = entry_stat(da);
                tx.add_dir_stat(pdst, -dlen, -dspace, -dinodes)?;
                tx.add_dir_stat(psrc, dlen, dspace, dinodes)?;
            }
            da.ctime = now;
            tx.put_node(de.inode, da)?;
        }
    } else {
        tx.delete_edge(psrc, nsrc)?;
        if let Some(de) = de {
            tx.delete_edge(pdst, ndst)?;
            if let Some(mut d) = da.take() {
                let (dlen, dspace, dinodes) = entry_stat(&d);
                d.ctime = now;
                if d.typ == FileType::Directory {
                    dst_nlink -= 1;
                    tx.drop_dir_stats(de.inode)?;
                }
                if let Some(t) = trash {
                    tx.move_parent(de.inode, &mut d, pdst, t)?;
                    tx.put_node(de.inode, &d)?;
                    let tn = trash_entry_name(pdst, de.inode, ndst);
                    tx.insert_edge(t, &tn, de.inode, d.typ)?;
                    tx.add_dir_stat(t, dlen, dspace, dinodes)?;
                } else if d.typ == FileType::Directory {
                    tx.delete_node(de.inode)?;
                    tx.add_usage(-align4k(0), -1)?;
                } else {
                    d.nlink = d.nlink.saturating_sub(1);
                    if d.nlink > 0 {
                        tx.drop_parent(de.inode, &mut d, pdst)?;
                        tx.put_node(de.inode, &d)?;
                    } else {
                        tx.drop_last_link(de.inode, &d)?;
                    }
                }
                tx.add_dir_stat(pdst, -dlen, -dspace, -dinodes)?;
            }
        }
        tx.insert_edge(pdst, ndst, se.inode, sa.typ)?;
    }
    if !same_dir {
        if sa.typ == FileType::Directory {
            src_nlink -= 1;
            dst_nlink += 1;
        }
        tx.move_parent(se.inode, &mut sa, psrc, pdst)?;
        tx.add_dir_stat(psrc, -slen, -sspace, -sinodes)?;
        tx.add_dir_stat(pdst, slen, sspace, sinodes)?;
    }
    sa.ctime = now;
    tx.put_node(se.inode, &sa)?;
    // Re-read: the entries moved above may have been these directories
    // (the transaction reads its own writes).
    if same_dir {
        let mut spa = tx.must_node(psrc)?;
        spa.nlink = (i64::from(spa.nlink) + src_nlink + dst_nlink).max(0) as u32;
        spa.mtime = now;
        spa.ctime = now;
        tx.put_node(psrc, &spa)?;
    } else {
        let mut spa = tx.must_node(psrc)?;
        let mut dpa = tx.must_node(pdst)?;
        spa.nlink = (i64::from(spa.nlink) + src_nlink).max(0) as u32;
        dpa.nlink = (i64::from(dpa.nlink) + dst_nlink).max(0) as u32;
        for (ino, a) in [(psrc, &mut spa), (pdst, &mut dpa)] {
            if !is_trash(ino) {
                a.mtime = now;
                a.ctime = now;
            }
            tx.put_node(ino, a)?;
        }
    }
    Ok((se.inode, sa))
}

/// The longest extended attribute name Linux accepts (`XATTR_NAME_MAX`).
const MAX_XATTR_NAME: usize = 255;
/// The largest extended attribute value Linux accepts (`XATTR_SIZE_MAX`).
const MAX_XATTR_VALUE: usize = 65536;

/// What a `setxattr`, `getxattr` or `removexattr` can refuse before looking
/// at the volume: the name (and `value`'s size).
pub(crate) fn check_xattr(name: &[u8], value: Option<&[u8]>) -> Result<(), Error> {
    if name.is_empty() {
        return Err(Error::Invalid("an extended attribute needs a name".into()));
    }
    if name.len() > MAX_XATTR_NAME || value.is_some_and(|v| v.len() > MAX_XATTR_VALUE) {
        return Err(Error::Range);
    }
    Ok(())
}

/// The node's attributes, if `ctx` may change its extended attributes.
fn xattr_writable<T: NsTx>(tx: &mut T, ctx: &Context, ino: Ino) -> Result<Attr, T::Error> {
    let a = tx.must_node(ino)?;
    if a.flags & (rules::FLAG_IMMUTABLE | rules::FLAG_APPEND) != 0 {
        return Err(Error::Perm.into());
    }
    tx.check(ctx, &a, MASK_W)?;
    Ok(a)
}

/// Sets an extended attribute with `setxattr`'s create/replace semantics,
/// in the caller's transaction; the node's ctime moves, as on Linux.
pub(crate) fn set_xattr<T: NsTx>(
    tx: &mut T,
    ctx: &Context,
    ino: Ino,
    name: &[u8],
    value: &[u8],
    mode: XattrMode,
) -> Result<(), T::Error> {
    let mut attr = xattr_writable(tx, ctx, ino)?;
    let cur = tx.xattr(ino, name)?;
    match (mode, &cur) {
        (XattrMode::Create, Some(_)) => return Err(Error::Exists.into()),
        (XattrMode::Replace, None) => return Err(Error::NoXattr.into()),
        (_, Some(v)) if v.as_slice() == value => {}
        (_, Some(_)) => tx.put_xattr(ino, name, value, true)?,
        (_, None) => {
            if tx.xattr_list_len(ino)? + name.len() + 1 > XATTR_LIST_MAX {
                return Err(Error::NoSpace.into());
            }
            tx.put_xattr(ino, name, value, false)?;
        }
    }
    attr.ctime = Timestamp::now();
    tx.put_node(ino, &attr)
}

/// Removes an extended attribute, in the caller's transaction.
pub(crate) fn remove_xattr<T: NsTx>(
    tx: &mut T,
    ctx: &Context,
    ino: Ino,
    name: &[u8],
) -> Result<(), T::Error> {
    let mut attr = xattr_writable(tx, ctx, ino)?;
    if tx.xattr(ino, name)?.is_none() {
        return Err(Error::NoXattr.into());
    }
    tx.delete_xattr(ino, name)?;
    attr.ctime = Timestamp::now();
    tx.put_node(ino, &attr)
}

/// Changes a node's attributes (`setattr`'s rules: `rules::apply_setattr`),
/// in the caller's transaction; a chmod moves the access ACL's entries
/// with the mode.
pub(crate) fn setattr<T: NsTx>(
    tx: &mut T,
    ctx: &Context,
    ino: Ino,
    set: &SetAttr,
) -> Result<Attr, T::Error> {
    let cur = tx.must_node(ino)?;
    let acl = tx.access_rule(&cur)?;
    match rules::apply_setattr(ctx, &cur, acl.as_deref(), set)? {
        Some(mut a) => {
            if let Some(rule) = acl.filter(|_| a.mode != cur.mode) {
                a.access_acl = tx.store_rule(&rules::chmod_acl(&rule, a.mode))?;
            }
            tx.put_node(ino, &a)?;
            Ok(a)
        }
        None => Ok(cur),
    }
}

/// Sets a node's access or default ACL (`rules::apply_facl`), in the
/// caller's transaction.
pub(crate) fn set_facl<T: NsTx>(
    tx: &mut T,
    ctx: &Context,
    ino: Ino,
    typ: AclType,
    rule: &Rule,
) -> Result<(), T::Error> {
    let cur = tx.must_node(ino)?;
    if let Some((mut a, store)) = rules::apply_facl(ctx, &cur, typ, rule)? {
        if let Some(r) = store {
            let id = tx.store_rule(&r)?;
            match typ {
                AclType::Access => a.access_acl = id,
                AclType::Default => a.default_acl = id,
            }
        }
        tx.put_node(ino, &a)?;
    }
    Ok(())
}
