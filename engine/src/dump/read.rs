//! Reading a dump into an empty store: the document is parsed as a stream
//! (serde visitors over `serde_json`'s reader), each node handed to the
//! engine's [`Restore`] when its object closes. What a node's records do
//! not say is derived as `juicefs load` derives it: lengths of directories
//! (4096) and symlinks (the target's), link counts (2 + subdirectories;
//! a file's number of names), parents, the usage counters, directory
//! statistics, quota usage and slice reference counts.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read;

use serde::de::{self, DeserializeSeed, MapAccess, Visitor};

use super::json::{
    DumpedAcl, DumpedAttr, DumpedChunk, DumpedCounters, DumpedDelFile, DumpedQuota,
    DumpedSustained, DumpedXattr, type_from_name, unescape,
};
use crate::error::{Error, Result};
use crate::format::Format;
use crate::meta::rules::align4k;
use crate::meta::{
    Attr, CHUNK_SIZE, Counters, DirQuota, DirStat, FileType, Ino, MAX_FILE_LENGTH, MAX_NAME_LEN,
    Meta, ROOT_INO, Restore, Slice, TRASH_INO, Timestamp,
};

/// What a load wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadSummary {
    /// Nodes loaded (a hard-linked file once).
    pub nodes: u64,
    /// The counters the volume got.
    pub counters: Counters,
    /// Files pending deletion in the dump (`DelFiles`), not loaded: their
    /// objects are left for `sluice gc`.
    pub del_files_skipped: usize,
}

/// A file with several names, written once all its names are known.
struct Link {
    attr: Attr,
    parents: Vec<(Ino, u32)>,
}

struct Loader<'a, 'p> {
    sink: Box<dyn Restore + 'a>,
    /// The engine's error behind a parse error that reports it.
    error: Option<Error>,
    format: Option<Format>,
    dumped: Option<DumpedCounters>,
    quotas: HashMap<Ino, DumpedQuota>,
    tree_started: bool,
    tree_done: bool,
    trash_done: bool,
    seen: HashSet<Ino>,
    links: BTreeMap<Ino, Link>,
    refs: HashMap<(u64, u32), u32>,
    computed: Counters,
    del_files: usize,
    nodes: u64,
    progress: &'p mut (dyn FnMut(u64) + Send),
}

impl Loader<'_, '_> {
    /// Records `e` as the failure and returns a parse error with its text.
    fn fail<E: de::Error>(&mut self, e: Error) -> E {
        let msg = e.to_string();
        self.error.get_or_insert(e);
        E::custom(msg)
    }

    fn invalid<E: de::Error>(&mut self, msg: String) -> E {
        self.fail(Error::Invalid(msg))
    }
}

/// Where an entry object sits.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    /// `FSTree`: the root.
    Root,
    /// `Trash`: the trash directory.
    Trash,
    /// Under a directory; `in_trash` when below the trash.
    Child { parent: Ino, in_trash: bool },
}

/// What a node's object adds to its directory.
struct NodeSummary {
    ino: Ino,
    typ: FileType,
    /// The length of a regular file (0 for anything else).
    file_length: u64,
    /// Space of the node and everything below it.
    space: i64,
    /// Nodes: it and everything below it.
    inodes: i64,
}

fn time(secs: i64, nsecs: u32, what: &str, ino: Ino) -> Result<Timestamp> {
    if nsecs >= 1_000_000_000 {
        return Err(Error::Invalid(format!(
            "inode {ino}: {what}nsec {nsecs} is not below one second"
        )));
    }
    Ok(Timestamp { secs, nsecs })
}

/// Checks a dumped attribute and turns it into the node's attributes; the
/// length, link count and parent are filled in by the caller.
fn attr_of(d: &DumpedAttr, place: Place) -> Result<(Ino, Attr)> {
    let ino = match place {
        // JuiceFS's rule: the tree's top is the root whatever it says (a
        // dump of a subdirectory loads as a volume).
        Place::Root => ROOT_INO,
        Place::Trash => {
            if d.inode != TRASH_INO {
                return Err(Error::Invalid(format!(
                    "the Trash has inode {}, not {TRASH_INO}",
                    d.inode
                )));
            }
            TRASH_INO
        }
        Place::Child { in_trash, .. } => {
            let ok =
                d.inode > ROOT_INO && d.inode != TRASH_INO && (d.inode < TRASH_INO || in_trash);
            if !ok {
                return Err(Error::Invalid(format!(
                    "inode {} cannot appear at this place of the tree",
                    d.inode
                )));
            }
            d.inode
        }
    };
    let typ = type_from_name(&d.typ)
        .ok_or_else(|| Error::Invalid(format!("inode {ino} has unknown type {:?}", d.typ)))?;
    if matches!(place, Place::Root | Place::Trash) && typ != FileType::Directory {
        return Err(Error::Invalid(format!("inode {ino} must be a directory")));
    }
    if d.mode > 0o7777 {
        return Err(Error::Invalid(format!(
            "inode {ino} has mode {:o}, beyond permission bits",
            d.mode
        )));
    }
    if d.length > MAX_FILE_LENGTH {
        return Err(Error::Invalid(format!(
            "inode {ino} is {} bytes long, beyond the largest file",
            d.length
        )));
    }
    if d.tier != 0 {
        return Err(Error::NotSupported(format!(
            "inode {ino} is in storage tier {}; sluice serves tier 0 only",
            d.tier
        )));
    }
    Ok((
        ino,
        Attr {
            flags: d.flags,
            typ,
            mode: d.mode,
            uid: d.uid,
            gid: d.gid,
            rdev: d.rdev,
            atime: time(d.atime, d.atimensec, "atime", ino)?,
            mtime: time(d.mtime, d.mtimensec, "mtime", ino)?,
            ctime: time(d.ctime, d.ctimensec, "ctime", ino)?,
            nlink: d.nlink,
            length: if typ == FileType::File { d.length } else { 0 },
            parent: 0,
            access_acl: 0,
            default_acl: 0,
            space: None,
        },
    ))
}

/// Checks a chunk's slice records.
fn slices_of(ino: Ino, c: &DumpedChunk) -> Result<Vec<Slice>> {
    if u64::from(c.index) * CHUNK_SIZE >= MAX_FILE_LENGTH {
        return Err(Error::Invalid(format!(
            "inode {ino}: chunk index {} is beyond the largest file",
            c.index
        )));
    }
    c.slices
        .iter()
        .map(|s| {
            let id = if s.id == 0 { s.chunkid } else { s.id };
            let fits = u64::from(s.pos) + u64::from(s.len) <= CHUNK_SIZE
                && (id == 0 || u64::from(s.off) + u64::from(s.len) <= u64::from(s.size));
            if !fits {
                return Err(Error::Invalid(format!(
                    "inode {ino} chunk {}: slice {id} (pos {}, off {}, len {}, size {}) \
                     does not fit its chunk or slice",
                    c.index, s.pos, s.off, s.len, s.size
                )));
            }
            Ok(Slice {
                pos: s.pos,
                id,
                size: s.size,
                off: s.off,
                len: s.len,
            })
        })
        .collect()
}

fn check_name(dir: Ino, name: &[u8]) -> Result<()> {
    let bad = name.is_empty()
        || name == b"."
        || name == b".."
        || name.len() > MAX_NAME_LEN
        || name.iter().any(|&b| b == b'/' || b == 0);
    if bad {
        return Err(Error::Invalid(format!(
            "directory {dir} has an entry named {:?}, which no file may have",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(())
}

struct EntrySeed<'l, 'a, 'p> {
    loader: &'l mut Loader<'a, 'p>,
    place: Place,
}

impl<'de> DeserializeSeed<'de> for EntrySeed<'_, '_, '_> {
    type Value = NodeSummary;
    fn deserialize<D: de::Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<NodeSummary, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for EntrySeed<'_, '_, '_> {
    type Value = NodeSummary;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a node object with attr first")
    }

    fn visit_map<M: MapAccess<'de>>(
        self,
        mut map: M,
    ) -> std::result::Result<NodeSummary, M::Error> {
        let l = self.loader;
        let (parent, in_trash) = match self.place {
            Place::Root => (ROOT_INO, false),
            Place::Trash => (ROOT_INO, true),
            Place::Child { parent, in_trash } => (parent, in_trash),
        };
        let mut node: Option<(Ino, Attr)> = None;
        // A further name of a hard-linked file: its records were loaded
        // with the first.
        let mut repeat = false;
        let mut symlink: Option<Vec<u8>> = None;
        let mut xattrs: Vec<DumpedXattr> = Vec::new();
        let mut access_acl: Option<DumpedAcl> = None;
        let mut default_acl: Option<DumpedAcl> = None;
        let mut chunks: Vec<(u32, Vec<Slice>)> = Vec::new();
        let mut stat = DirStat::default();
        let (mut subdirs, mut below_space, mut below_inodes) = (0u32, 0i64, 0i64);
        while let Some(key) = map.next_key::<String>()? {
            if key != "attr" && node.is_none() {
                return Err(l.invalid(format!(
                    "a node's \"attr\" must come before its {key:?} (under directory {parent})"
                )));
            }
            match key.as_str() {
                "attr" => {
                    if node.is_some() {
                        return Err(l.invalid(format!("a node under {parent} has two \"attr\"")));
                    }
                    let d: DumpedAttr = map.next_value()?;
                    let (ino, attr) = attr_of(&d, self.place).map_err(|e| l.fail(e))?;
                    if !l.seen.insert(ino) {
                        if attr.typ == FileType::Directory || !l.links.contains_key(&ino) {
                            return Err(l.invalid(format!(
                                "inode {ino} appears more than once in the tree but is not a \
                                 hard-linked file (nlink {})",
                                d.nlink
                            )));
                        }
                        repeat = true;
                    } else if attr.typ != FileType::Directory && d.nlink > 1 {
                        l.links.insert(
                            ino,
                            Link {
                                attr: attr.clone(),
                                parents: Vec::new(),
                            },
                        );
                    }
                    node = Some((ino, attr));
                }
                "symlink" => {
                    let s: String = map.next_value()?;
                    symlink = Some(unescape(&s));
                }
                "xattrs" => xattrs = map.next_value()?,
                "chunks" => {
                    let list: Vec<DumpedChunk> = map.next_value()?;
                    let ino = node.as_ref().map_or(0, |n| n.0);
                    for c in &list {
                        let slices = slices_of(ino, c).map_err(|e| l.fail(e))?;
                        chunks.push((c.index, slices));
                    }
                }
                "entries" => {
                    let (ino, typ) = node
                        .as_ref()
                        .map_or((0, FileType::File), |n| (n.0, n.1.typ));
                    if typ != FileType::Directory {
                        return Err(
                            l.invalid(format!("inode {ino} has entries but is no directory"))
                        );
                    }
                    let out = map.next_value_seed(EntriesSeed {
                        loader: &mut *l,
                        dir: ino,
                        in_trash: in_trash || ino >= TRASH_INO,
                    })?;
                    stat = out.stat;
                    subdirs = out.subdirs;
                    below_space = out.space;
                    below_inodes = out.inodes;
                }
                "posix_acl_access" => access_acl = map.next_value()?,
                "posix_acl_default" => default_acl = map.next_value()?,
                other => {
                    return Err(l.invalid(format!(
                        "unknown field {other:?} in a node under directory {parent}"
                    )));
                }
            }
        }
        let Some((ino, mut attr)) = node else {
            return Err(l.invalid(format!("a node under directory {parent} has no \"attr\"")));
        };
        let typ = attr.typ;
        let file_length = attr.length;
        let summary = NodeSummary {
            ino,
            typ,
            file_length,
            space: align4k(file_length) + below_space,
            inodes: 1 + below_inodes,
        };
        if let Some(link) = l.links.get_mut(&ino) {
            match link.parents.last_mut() {
                Some((p, n)) if *p == parent => *n += 1,
                _ => link.parents.push((parent, 1)),
            }
        }
        if repeat {
            return Ok(summary);
        }
        if symlink.is_some() != (typ == FileType::Symlink)
            || (!chunks.is_empty() && typ != FileType::File)
        {
            return Err(l.invalid(format!(
                "inode {ino} ({typ:?}) has records its type cannot have (or lacks its symlink target)"
            )));
        }
        attr.length = match typ {
            FileType::File => file_length,
            FileType::Directory => 4096,
            FileType::Symlink => symlink.as_ref().map_or(0, |t| t.len() as u64),
            _ => 0,
        };
        attr.parent = parent;
        attr.nlink = match typ {
            FileType::Directory if ino < TRASH_INO => 2 + subdirs,
            FileType::Directory => 2,
            _ => 1,
        };
        let r = (|| -> Result<()> {
            // The node names its ACLs by the ids the new store gives them.
            if let Some(d) = &access_acl {
                attr.access_acl = l.sink.acl(&d.rule()?)?;
            }
            if let Some(d) = &default_acl {
                attr.default_acl = l.sink.acl(&d.rule()?)?;
            }
            if let Some(link) = l.links.get_mut(&ino) {
                link.attr = attr.clone();
            } else {
                l.sink.node(ino, &attr, &[])?;
            }
            if let Some(target) = &symlink {
                l.sink.symlink(ino, target)?;
            }
            for x in &xattrs {
                l.sink.xattr(ino, x.name.as_bytes(), &unescape(&x.value))?;
            }
            for (indx, slices) in &chunks {
                if slices.is_empty() {
                    continue;
                }
                l.sink.chunk(ino, *indx, slices)?;
                for s in slices.iter().filter(|s| s.id != 0) {
                    *l.refs.entry((s.id, s.size)).or_default() += 1;
                    l.computed.next_slice = l.computed.next_slice.max(s.id as i64 + 1);
                }
            }
            if typ == FileType::Directory && ino != TRASH_INO {
                l.sink.dir_stat(ino, &stat)?;
            }
            if let Some(q) = l.quotas.get(&ino) {
                if typ != FileType::Directory {
                    return Err(Error::Invalid(format!(
                        "the quota of inode {ino} is not on a directory"
                    )));
                }
                l.sink.dir_quota(
                    ino,
                    &DirQuota {
                        max_space: q.max_space,
                        max_inodes: q.max_inodes,
                        used_space: below_space,
                        used_inodes: below_inodes,
                    },
                )?;
            }
            Ok(())
        })();
        r.map_err(|e| l.fail(e))?;
        if ino != ROOT_INO && ino != TRASH_INO {
            l.computed.used_space += align4k(file_length);
            l.computed.used_inodes += 1;
        }
        if ino < TRASH_INO {
            l.computed.next_inode = l.computed.next_inode.max(ino as i64 + 1);
        } else {
            l.computed.next_trash = l.computed.next_trash.max((ino - TRASH_INO) as i64);
        }
        l.nodes += 1;
        (l.progress)(l.nodes);
        Ok(summary)
    }
}

/// What a directory's entries add up to.
#[derive(Default)]
struct EntriesSummary {
    stat: DirStat,
    subdirs: u32,
    space: i64,
    inodes: i64,
}

struct EntriesSeed<'l, 'a, 'p> {
    loader: &'l mut Loader<'a, 'p>,
    dir: Ino,
    in_trash: bool,
}

impl<'de> DeserializeSeed<'de> for EntriesSeed<'_, '_, '_> {
    type Value = EntriesSummary;
    fn deserialize<D: de::Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<EntriesSummary, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for EntriesSeed<'_, '_, '_> {
    type Value = EntriesSummary;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an object of entries by name")
    }

    fn visit_map<M: MapAccess<'de>>(
        self,
        mut map: M,
    ) -> std::result::Result<EntriesSummary, M::Error> {
        let l = self.loader;
        let mut out = EntriesSummary::default();
        let mut names: HashSet<Vec<u8>> = HashSet::new();
        while let Some(escaped) = map.next_key::<String>()? {
            let name = unescape(&escaped);
            check_name(self.dir, &name).map_err(|e| l.fail(e))?;
            if !names.insert(name.clone()) {
                return Err(l.invalid(format!(
                    "directory {} has two entries named {escaped:?}",
                    self.dir
                )));
            }
            let child = map.next_value_seed(EntrySeed {
                loader: &mut *l,
                place: Place::Child {
                    parent: self.dir,
                    in_trash: self.in_trash,
                },
            })?;
            l.sink
                .entry(self.dir, &name, child.ino, child.typ)
                .map_err(|e| l.fail(e))?;
            out.stat.data_length += child.file_length as i64;
            out.stat.used_space += align4k(child.file_length);
            out.stat.used_inodes += 1;
            if child.typ == FileType::Directory {
                out.subdirs += 1;
            }
            out.space += child.space;
            out.inodes += child.inodes;
        }
        Ok(out)
    }
}

struct DocumentSeed<'l, 'a, 'p> {
    loader: &'l mut Loader<'a, 'p>,
}

impl<'de> DeserializeSeed<'de> for DocumentSeed<'_, '_, '_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for DocumentSeed<'_, '_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JuiceFS metadata dump (a JSON object with Setting, Counters and FSTree)")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> std::result::Result<(), M::Error> {
        let l = self.loader;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "Setting" => l.format = Some(map.next_value()?),
                "Counters" => l.dumped = Some(map.next_value()?),
                "Sustained" => {
                    // Sessions do not move with a volume.
                    let _: Vec<DumpedSustained> = map.next_value()?;
                }
                "DelFiles" => {
                    let files: Vec<DumpedDelFile> = map.next_value()?;
                    l.del_files = files.len();
                }
                "Quotas" => {
                    if l.tree_started {
                        return Err(l.invalid("\"Quotas\" must come before \"FSTree\"".into()));
                    }
                    let quotas: Option<BTreeMap<String, DumpedQuota>> = map.next_value()?;
                    for (ino, q) in quotas.unwrap_or_default() {
                        let Ok(ino) = ino.parse::<Ino>() else {
                            return Err(l.invalid(format!("quota for {ino:?}, which is no inode")));
                        };
                        l.quotas.insert(ino, q);
                    }
                }
                "UserQuotas" | "GroupQuotas" => {
                    let v: serde_json::Value = map.next_value()?;
                    if v.as_object().is_some_and(|m| !m.is_empty()) {
                        return Err(l.fail(Error::NotSupported(format!(
                            "the dump has {key}; sluice does not serve user or group quotas"
                        ))));
                    }
                }
                "FSTree" | "Trash" => {
                    let root = key == "FSTree";
                    if (root && l.tree_done) || (!root && l.trash_done) {
                        return Err(l.invalid(format!("the dump has two {key:?}")));
                    }
                    l.tree_started = true;
                    map.next_value_seed(EntrySeed {
                        loader: &mut *l,
                        place: if root { Place::Root } else { Place::Trash },
                    })?;
                    if root {
                        l.tree_done = true;
                    } else {
                        l.trash_done = true;
                    }
                }
                other => {
                    return Err(l.invalid(format!("unknown section {other:?} in the dump")));
                }
            }
        }
        Ok(())
    }
}

/// The settings a loaded volume gets: what the dump says, less the secrets
/// a dump without `--keep-secret-key` replaced by `"removed"`.
fn loaded_setting(mut f: Format) -> Result<Format> {
    if f.name.is_empty() || f.uuid.is_empty() || f.block_size == 0 {
        return Err(Error::Invalid(
            "the dump's Setting lacks the volume name, UUID or block size".into(),
        ));
    }
    for key in ["SecretKey", "SessionToken"] {
        if f.extra.get(key).and_then(|v| v.as_str()) == Some("removed") {
            f.extra.remove(key);
            log::warn!(
                "the dump was made without --keep-secret-key: the volume has no {key} now; \
                 set the object store's credentials again before mounting"
            );
        }
    }
    if f.encrypt_key == "removed" {
        log::warn!(
            "the dump was made without --keep-secret-key: the volume's encryption key is \
             missing, and its data cannot be read until the key is restored"
        );
    }
    Ok(f)
}

fn run(
    meta: &dyn Meta,
    input: &mut dyn Read,
    progress: &mut (dyn FnMut(u64) + Send),
) -> Result<LoadSummary> {
    let sink = meta.restore()?;
    let mut l = Loader {
        sink,
        error: None,
        format: None,
        dumped: None,
        quotas: HashMap::new(),
        tree_started: false,
        tree_done: false,
        trash_done: false,
        seen: HashSet::new(),
        links: BTreeMap::new(),
        refs: HashMap::new(),
        computed: Counters {
            next_inode: 2,
            next_slice: 1,
            ..Counters::default()
        },
        del_files: 0,
        nodes: 0,
        progress,
    };
    let mut de =
        serde_json::Deserializer::from_reader(std::io::BufReader::with_capacity(256 << 10, input));
    // Directories nest as deep as the tree; the parse runs on a thread
    // with a stack sized for it (see `load`).
    de.disable_recursion_limit();
    let parsed = DocumentSeed { loader: &mut l }
        .deserialize(&mut de)
        .and_then(|()| de.end());
    if let Err(e) = parsed {
        return Err(l.error.take().unwrap_or_else(|| {
            Error::Invalid(format!("the dump is not valid JuiceFS JSON: {e}"))
        }));
    }
    let format = loaded_setting(
        l.format
            .take()
            .ok_or_else(|| Error::Invalid("the dump has no \"Setting\"".into()))?,
    )?;
    let dumped = l
        .dumped
        .ok_or_else(|| Error::Invalid("the dump has no \"Counters\"".into()))?;
    if !l.tree_done {
        return Err(Error::Invalid("the dump has no \"FSTree\"".into()));
    }
    for (ino, link) in std::mem::take(&mut l.links) {
        let mut attr = link.attr;
        let names: u32 = link.parents.iter().map(|p| p.1).sum();
        attr.nlink = names.max(1);
        if let [(parent, 1)] = link.parents[..] {
            attr.parent = parent;
            l.sink.node(ino, &attr, &[])?;
        } else {
            attr.parent = 0;
            l.sink.node(ino, &attr, &link.parents)?;
        }
    }
    for (&(id, size), &refs) in &l.refs {
        l.sink.slice_refs(id, size, refs)?;
    }
    if !l.trash_done && format.trash_days > 0 {
        let trash = crate::meta::trash::new_trash_attr(ROOT_INO);
        l.sink.node(TRASH_INO, &trash, &[])?;
    }
    let counters = Counters {
        used_space: l.computed.used_space,
        used_inodes: l.computed.used_inodes,
        next_inode: l.computed.next_inode.max(dumped.next_inode),
        next_slice: l.computed.next_slice.max(dumped.next_chunk),
        next_session: dumped.next_session.max(0),
        next_trash: l.computed.next_trash.max(dumped.next_trash),
    };
    l.sink.finish(&format, &counters)?;
    meta.sync()?;
    Ok(LoadSummary {
        nodes: l.nodes,
        counters,
        del_files_skipped: l.del_files,
    })
}

/// Stack for the parse: each directory level costs a few frames of
/// visitors; 256 MiB (reserved, touched only as deep as the tree goes)
/// holds trees far deeper than any path the kernel resolves.
const PARSE_STACK: usize = 256 << 20;

/// Loads a dump from `input` into the empty store of `meta`, calling
/// `progress` with the number of nodes loaded so far. Fails, leaving no
/// volume in the store (SQLite: nothing at all), on a store that is not
/// empty, on a document that is not a JuiceFS dump, and on a tree that
/// breaks the file system's rules (a name twice in a directory, an inode in
/// two places that is not a hard-linked file, slices outside their chunk).
pub fn load(
    meta: &dyn Meta,
    input: &mut (dyn Read + Send),
    progress: &mut (dyn FnMut(u64) + Send),
) -> Result<LoadSummary> {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("sluice-load".into())
            .stack_size(PARSE_STACK)
            .spawn_scoped(s, || run(meta, input, progress))
            .map_err(Error::Io)?
            .join()
            .map_err(|_| Error::Invalid("the load stopped on an internal error".into()))?
    })
}
