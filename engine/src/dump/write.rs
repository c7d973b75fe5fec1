//! Writing a dump: the header records, then the tree, one directory page
//! at a time, as JuiceFS lays it out (two-space indent, one `attr` line per
//! node, one line per chunk).

use std::collections::{BTreeMap, HashSet};
use std::io::Write;

use serde::Serialize;

use super::json::{
    DumpedAcl, DumpedAttr, DumpedChunk, DumpedCounters, DumpedDelFile, DumpedQuota, DumpedSlice,
    DumpedSustained, DumpedXattr, escape, type_name,
};
use crate::error::{Error, Result};
use crate::format::{Format, SECRET_FIELDS};
use crate::meta::acl::{self, AclType};
use crate::meta::{Attr, Context, DirCursor, Entry, FileType, Ino, Meta, ROOT_INO, TRASH_INO};

/// How many entries one directory page asks for.
const PAGE: usize = 1024;
/// How many chunk indexes one listing asks for.
const CHUNK_PAGE: usize = 1024;

/// What `sluice dump` may change in what it writes.
#[derive(Debug, Clone, Copy, Default)]
pub struct DumpOptions {
    /// Keep the secret key, session token and encryption key (as stored:
    /// sealed with the volume's UUID when `KeyEncrypted`); otherwise they
    /// are written as `"removed"`, as `juicefs dump` does.
    pub keep_secret_key: bool,
}

/// What a dump wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DumpSummary {
    /// Nodes written (a hard-linked file once per name).
    pub nodes: u64,
}

/// The records before the tree, in JuiceFS's order.
#[derive(Serialize)]
struct Header<'a> {
    #[serde(rename = "Setting")]
    setting: &'a Format,
    #[serde(rename = "Counters")]
    counters: DumpedCounters,
    #[serde(rename = "Sustained")]
    sustained: Vec<DumpedSustained>,
    #[serde(rename = "DelFiles")]
    del_files: Vec<DumpedDelFile>,
    #[serde(rename = "Quotas", skip_serializing_if = "BTreeMap::is_empty")]
    quotas: BTreeMap<Ino, DumpedQuota>,
}

/// The settings as a dump shows them: secrets replaced by `"removed"`
/// unless they are kept.
fn dumped_setting(format: &Format, opts: &DumpOptions) -> Format {
    let mut f = format.clone();
    if opts.keep_secret_key {
        return f;
    }
    for key in SECRET_FIELDS {
        if let Some(serde_json::Value::String(v)) = f.extra.get_mut(key)
            && !v.is_empty()
        {
            *v = "removed".into();
        }
    }
    if !f.encrypt_key.is_empty() {
        f.encrypt_key = "removed".into();
    }
    f
}

fn dumped_attr(ino: Ino, a: &Attr) -> DumpedAttr {
    DumpedAttr {
        inode: ino,
        flags: a.flags,
        typ: type_name(a.typ).into(),
        mode: a.mode,
        uid: a.uid,
        gid: a.gid,
        atime: a.atime.secs,
        mtime: a.mtime.secs,
        ctime: a.ctime.secs,
        atimensec: a.atime.nsecs,
        mtimensec: a.mtime.nsecs,
        ctimensec: a.ctime.nsecs,
        nlink: a.nlink,
        length: if a.typ == FileType::File { a.length } else { 0 },
        rdev: a.rdev,
        tier: 0,
    }
}

fn to_json<T: Serialize>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|e| Error::Invalid(format!("cannot encode the dump: {e}")))
}

/// A directory whose entries are being written.
struct Frame {
    ino: Ino,
    /// Where its listing goes on; `None` once the last page was read.
    cursor: Option<DirCursor>,
    /// Entries read but not yet written.
    page: std::collections::VecDeque<Entry>,
    /// Whether an entry was written already (a comma goes before the next).
    wrote_any: bool,
    /// Names already written, kept only when the engine may repeat one
    /// across pages (Redis `HSCAN`).
    seen: Option<HashSet<Vec<u8>>>,
}

struct Writer<'a, W: Write> {
    meta: &'a dyn Meta,
    out: W,
    ctx: Context,
    summary: DumpSummary,
    progress: &'a mut dyn FnMut(u64),
}

impl<W: Write> Writer<'_, W> {
    fn put(&mut self, s: &str) -> Result<()> {
        self.out.write_all(s.as_bytes()).map_err(Error::Io)
    }

    /// Writes `"name": {` with the node's own records; a directory is left
    /// open after `"entries": {`.
    fn node_head(&mut self, name: &str, ino: Ino, attr: &Attr, depth: usize) -> Result<()> {
        let pad = "  ".repeat(depth);
        let field = "  ".repeat(depth + 1);
        let mut s = format!(
            "\n{pad}\"{name}\": {{\n{field}\"attr\": {}",
            to_json(&dumped_attr(ino, attr))?
        );
        if attr.typ == FileType::Symlink {
            let target = self.meta.readlink(ino)?;
            s.push_str(&format!(",\n{field}\"symlink\": \"{}\"", escape(&target)));
        }
        let mut xattrs = Vec::new();
        for xname in self.meta.listxattr(ino)? {
            let value = match self.meta.getxattr(ino, &xname) {
                Ok(v) => v,
                // Removed since the listing: a live volume moves on.
                Err(Error::NoXattr) => continue,
                Err(e) => return Err(e),
            };
            xattrs.push(DumpedXattr {
                name: String::from_utf8_lossy(&xname).into_owned(),
                value: escape(&value).into_owned(),
            });
        }
        if !xattrs.is_empty() {
            s.push_str(&format!(",\n{field}\"xattrs\": {}", to_json(&xattrs)?));
        }
        for typ in [AclType::Access, AclType::Default] {
            if acl::acl_id(attr, typ) == 0 {
                continue;
            }
            if let Some(rule) = self.meta.get_facl(ino, typ)? {
                let key = String::from_utf8_lossy(&typ.xattr_name()[b"system.".len()..]);
                s.push_str(&format!(
                    ",\n{field}\"{key}\": {}",
                    to_json(&DumpedAcl::of(&rule))?
                ));
            }
        }
        if attr.typ == FileType::File {
            let chunks = self.chunks(ino)?;
            if chunks.len() == 1 {
                s.push_str(&format!(",\n{field}\"chunks\": {}", to_json(&chunks)?));
            } else if chunks.len() > 1 {
                s.push_str(&format!(",\n{field}\"chunks\": ["));
                for (i, c) in chunks.iter().enumerate() {
                    let sep = if i + 1 < chunks.len() { "," } else { "" };
                    s.push_str(&format!("\n{field}  {}{sep}", to_json(c)?));
                }
                s.push_str(&format!("\n{field}]"));
            }
        }
        if attr.typ == FileType::Directory {
            s.push_str(&format!(",\n{field}\"entries\": {{"));
        } else {
            s.push_str(&format!("\n{pad}}}"));
        }
        self.put(&s)?;
        self.summary.nodes += 1;
        (self.progress)(self.summary.nodes);
        Ok(())
    }

    /// Every chunk of a file that holds slices, ascending.
    fn chunks(&mut self, ino: Ino) -> Result<Vec<DumpedChunk>> {
        let mut out = Vec::new();
        let mut from = 0u32;
        loop {
            let indexes = self.meta.chunk_indices(ino, from..=u32::MAX, CHUNK_PAGE)?;
            for &indx in &indexes {
                let slices = self.meta.read_chunk(ino, indx)?;
                if slices.is_empty() {
                    continue;
                }
                out.push(DumpedChunk {
                    index: indx,
                    slices: slices
                        .iter()
                        .map(|s| DumpedSlice {
                            chunkid: 0,
                            id: s.id,
                            pos: s.pos,
                            size: s.size,
                            off: s.off,
                            len: s.len,
                        })
                        .collect(),
                });
            }
            match indexes.last() {
                Some(&last) if indexes.len() >= CHUNK_PAGE && last < u32::MAX => from = last + 1,
                _ => return Ok(out),
            }
        }
    }

    /// Writes the tree under directory `top` (whose head is written),
    /// closing it; the walk keeps one frame per open directory.
    fn tree(&mut self, top: Ino, depth: usize) -> Result<()> {
        let mut stack = vec![Frame {
            ino: top,
            cursor: Some(DirCursor::Start),
            page: Default::default(),
            wrote_any: false,
            seen: None,
        }];
        while let Some(frame) = stack.last_mut() {
            if frame.page.is_empty() {
                if let Some(cursor) = frame.cursor.take() {
                    let page = self
                        .meta
                        .readdir_page(&self.ctx, frame.ino, true, &cursor, PAGE)?;
                    if page.may_repeat && frame.seen.is_none() {
                        frame.seen = Some(HashSet::new());
                    }
                    frame.cursor = page.next;
                    let dir = frame.ino;
                    frame.page = page
                        .entries
                        .into_iter()
                        .filter(|e| {
                            e.name != b"."
                                && e.name != b".."
                                && !(dir == ROOT_INO && e.inode == TRASH_INO)
                        })
                        .collect();
                    continue;
                }
                // Frame k's directory head is at depth + 2k: its entries
                // object one level in.
                let level = depth + 2 * (stack.len() - 1);
                let field = "  ".repeat(level + 1);
                let pad = "  ".repeat(level);
                self.put(&format!("\n{field}}}\n{pad}}}"))?;
                stack.pop();
                continue;
            }
            let Some(entry) = frame.page.pop_front() else {
                continue;
            };
            if let Some(seen) = &mut frame.seen
                && !seen.insert(entry.name.clone())
            {
                continue;
            }
            if frame.wrote_any {
                self.put(",")?;
            }
            if let Some(frame) = stack.last_mut() {
                frame.wrote_any = true;
            }
            let level = depth + 2 * stack.len();
            let name = escape(&entry.name).into_owned();
            self.node_head(&name, entry.inode, &entry.attr, level)?;
            if entry.attr.typ == FileType::Directory {
                stack.push(Frame {
                    ino: entry.inode,
                    cursor: Some(DirCursor::Start),
                    page: Default::default(),
                    wrote_any: false,
                    seen: None,
                });
            }
        }
        Ok(())
    }
}

/// Writes the dump of the volume in `meta` to `out`, calling `progress`
/// with the number of nodes written so far. The volume may be in use;
/// each directory page, file and record is read consistently, the whole
/// tree is not (as with `juicefs dump` on a live volume).
pub fn dump(
    meta: &dyn Meta,
    out: impl Write,
    opts: &DumpOptions,
    progress: &mut dyn FnMut(u64),
) -> Result<DumpSummary> {
    let format = meta.load()?;
    let c = meta.counters()?;
    let quotas = meta
        .dir_quotas()?
        .into_iter()
        .map(|(ino, q)| {
            (
                ino,
                DumpedQuota {
                    max_space: q.max_space,
                    max_inodes: q.max_inodes,
                },
            )
        })
        .collect();
    let header = Header {
        setting: &dumped_setting(&format, opts),
        counters: DumpedCounters {
            used_space: c.used_space,
            used_inodes: c.used_inodes,
            next_inode: c.next_inode,
            next_chunk: c.next_slice,
            next_session: c.next_session,
            next_trash: c.next_trash,
            next_cleanup_slices: 0,
            last_changelog: 0,
        },
        sustained: Vec::new(),
        del_files: Vec::new(),
        quotas,
    };
    let head = serde_json::to_string_pretty(&header)
        .map_err(|e| Error::Invalid(format!("cannot encode the dump header: {e}")))?;
    // Drop the closing "\n}" and go on with the tree.
    let head = head.strip_suffix("\n}").unwrap_or(&head);
    let mut w = Writer {
        meta,
        out: std::io::BufWriter::with_capacity(64 << 10, out),
        ctx: Context::internal(),
        summary: DumpSummary::default(),
        progress,
    };
    w.put(head)?;
    w.put(",")?;
    let root = meta.getattr(ROOT_INO)?;
    w.node_head("FSTree", ROOT_INO, &root, 1)?;
    w.tree(ROOT_INO, 1)?;
    match meta.getattr(TRASH_INO) {
        Ok(trash) => {
            w.put(",")?;
            w.node_head("Trash", TRASH_INO, &trash, 1)?;
            w.tree(TRASH_INO, 1)?;
        }
        Err(Error::NotFound) => {}
        Err(e) => return Err(e),
    }
    w.put("\n}\n")?;
    w.out.flush().map_err(Error::Io)?;
    Ok(w.summary)
}
