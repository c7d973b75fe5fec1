//! Sequences of FUSE requests through a confined, possibly read-only
//! [`Export`] over the real engine; see the crate docs for the invariants.
//!
//! One volume serves the whole process (formatting one per input would cost
//! more than the requests). Each input gets what `sluice serve` gives a VM
//! connection: a fresh `Vfs` session on the shared volume, here exporting a
//! fresh directory `/vmN` that the host fills first. Another tenant's files
//! live in `/other`, one removed into the trash; they hold [`SECRET`]. The
//! host can move directories out of the export in the middle of a sequence
//! (the export rechecks ancestry on every request here, so the check is
//! exact).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use sluice_engine::format::Compression;
use sluice_engine::meta::{Context, FileType, Ino, ROOT_INO, TRASH_INO, open_meta};
use sluice_engine::vfs::{Filesystem as _, Vfs, VfsConfig};
use sluice_engine::volume::{Volume, format_volume, open_volume};
use sluice_fuse::abi::{self, Dirent, DirentPlus, EntryOut, OutHeader, dirent_align, opcode};
use sluice_fuse::export::ClientLimits;
use sluice_fuse::request::expects_reply;
use sluice_fuse::{Config, Dispatcher, Export, ReplyHead, ReplySink, Scratch};
use zerocopy::{FromBytes, IntoBytes};

use crate::msg::{cstr, message};

/// What another tenant's files hold: no reply may carry it unless the
/// input itself did (a guest may write it into its own files).
pub const SECRET: &[u8] = b"other-tenant-secret:9c4e1f0a77d2";

/// Requests sent so far by this process (for the report of a long run).
static SENT: AtomicU64 = AtomicU64::new(0);

/// Requests [`run`] has sent so far in this process.
pub fn requests_sent() -> u64 {
    SENT.load(Ordering::Relaxed)
}

/// Requests per input at most.
const MAX_STEPS: usize = 64;

/// Names the fuzzer picks from: the export's own files, the other
/// tenant's, the trash, dots and odd ones.
const NAMES: &[&[u8]] = &[
    b"inside",
    b"file",
    b"held",
    b"link",
    b"a",
    b"b",
    b"c",
    b"..",
    b".",
    b".trash",
    b"other",
    b"secret",
    b"gone",
    b"",
    b"x/y",
    b"1-2-gone",
];

#[derive(Debug, Arbitrary)]
enum Node {
    Root,
    /// One of the nodes replies named so far.
    Seen(u8),
    /// A trash directory's id, guessed.
    Trash(u8),
    /// Another tenant's inode, guessed.
    Outside(u8),
    Raw(u64),
}

#[derive(Debug, Arbitrary)]
enum Name {
    Pick(u8),
    Raw(Vec<u8>),
}

#[derive(Debug, Arbitrary)]
enum Handle {
    /// One of the handles replies gave so far.
    Seen(u8),
    Raw(u64),
}

#[derive(Debug, Arbitrary)]
enum Offset {
    Small(u16),
    /// Near a chunk boundary (64 MiB).
    Chunk(u8, i16),
    /// Near 2^k.
    Power(u8),
    Raw(u64),
}

#[derive(Debug, Arbitrary)]
enum Op {
    Lookup(Node, Name),
    Forget(Node, u8),
    BatchForget(Vec<(Node, u8)>),
    Getattr(Node),
    Setattr {
        node: Node,
        valid: u32,
        fh: Handle,
        size: Offset,
        mode: u32,
        uid: u32,
    },
    Readlink(Node),
    Symlink(Node, Name, Name),
    Mknod(Node, Name, u32, u32),
    Mkdir(Node, Name, u32),
    Unlink(Node, Name),
    Rmdir(Node, Name),
    Rename {
        from: Node,
        name: Name,
        to: Node,
        new_name: Name,
        flags: u32,
    },
    Link(Node, Node, Name),
    Open(Node, u32),
    Create(Node, Name, u32, u32),
    Read(Node, Handle, Offset, u16),
    Write(Node, Handle, Offset, Vec<u8>),
    Flush(Node, Handle),
    Release(Node, Handle),
    Fsync(Node, Handle, bool),
    Opendir(Node),
    Readdir {
        node: Node,
        fh: Handle,
        offset: u8,
        size: u16,
        plus: bool,
    },
    Releasedir(Node, Handle),
    Fsyncdir(Node, Handle),
    Statfs(Node),
    Setxattr(Node, Name, Vec<u8>, u32),
    Getxattr(Node, Name, u16),
    Listxattr(Node, u16),
    Removexattr(Node, Name),
    Access(Node, u32),
    Fallocate(Node, Handle, u32, Offset, Offset),
    Lseek(Node, Handle, Offset, u32),
    CopyFileRange {
        from: Node,
        fh_in: Handle,
        off_in: Offset,
        to: Node,
        fh_out: Handle,
        off_out: Offset,
        len: Offset,
    },
    /// Any opcode with any body (INIT and DESTROY aside).
    Raw(u32, Node, Vec<u8>),
    /// The host moves a directory of the export out of it.
    HostMovesOut(Name),
    /// The host removes a file of the export (into the trash).
    HostRemoves(Name),
}

/// The volume and the host's view of it, shared by all inputs.
struct World {
    _dir: tempfile::TempDir,
    /// The volume as the guests' daemon opened it (one session at a time).
    volume: Arc<Volume>,
    /// The host's own session on the volume, another client of it.
    host: Vfs,
    /// Inodes of the other tenant, live and trashed.
    outside: Vec<Ino>,
    round: u64,
}

fn small_config(read_only: bool) -> VfsConfig {
    VfsConfig {
        cache_bytes: 8 << 20,
        buffer_bytes: 1 << 20,
        total_buffer_bytes: 8 << 20,
        upload_threads: 1,
        compaction: false,
        cleanup_interval: None,
        prefetch_threads: 0,
        upload_drain: Some(Duration::from_secs(60)),
        read_only,
        ..VfsConfig::default()
    }
}

fn world() -> &'static Mutex<World> {
    static WORLD: OnceLock<Mutex<World>> = OnceLock::new();
    WORLD.get_or_init(|| {
        let shm = std::path::Path::new("/dev/shm");
        let dir = if shm.is_dir() {
            tempfile::tempdir_in(shm)
        } else {
            tempfile::tempdir()
        }
        .expect("temp dir");
        let url = format!("sqlite3://{}/meta.db", dir.path().display());
        let meta = open_meta(&url).expect("open meta");
        format_volume(
            &*meta,
            "fuzz",
            &dir.path().join("bucket"),
            1024,
            Compression::None,
            1,
        )
        .expect("format");
        let host = Vfs::new(open_volume(meta).expect("open volume"), small_config(false))
            .expect("host vfs");
        let volume = open_volume(open_meta(&url).expect("open meta")).expect("open volume");
        let ctx = Context::internal();
        let other = host.mkdir(&ctx, ROOT_INO, b"other", 0o755, 0).unwrap();
        let mut outside = vec![other.inode];
        for name in [b"secret".as_slice(), b"gone"] {
            let (e, out) = host
                .create(&ctx, other.inode, name, 0o644, 0, libc::O_RDWR as u32)
                .unwrap();
            host.write_buf(&ctx, e.inode, out.fh, 0, SECRET, false)
                .unwrap();
            host.setxattr(
                &ctx,
                e.inode,
                b"user.secret",
                SECRET,
                sluice_engine::meta::XattrMode::Any,
            )
            .unwrap();
            host.release(&ctx, e.inode, out.fh).unwrap();
            outside.push(e.inode);
        }
        host.unlink(&ctx, other.inode, b"gone").unwrap();
        let sub = host.mkdir(&ctx, other.inode, b"dir", 0o755, 0).unwrap();
        outside.push(sub.inode);
        Mutex::new(World {
            _dir: dir,
            volume,
            host,
            outside,
            round: 0,
        })
    })
}

#[derive(Default)]
struct Collect(Vec<Vec<u8>>);

impl ReplySink for Collect {
    fn send(&mut self, head: &ReplyHead, payload: &[u8]) -> std::io::Result<()> {
        let mut m = head.as_bytes().to_vec();
        m.extend_from_slice(payload);
        self.0.push(m);
        Ok(())
    }
}

/// One input's session and what its replies handed out.
struct Session<'w> {
    world: &'w World,
    d: Dispatcher<Export<Vfs>>,
    root: Ino,
    uid: u32,
    unique: u64,
    nodes: Vec<u64>,
    handles: Vec<u64>,
    /// Whether the input itself carries the secret (then a reply may too).
    input_has_secret: bool,
    scratch: Scratch,
}

impl Session<'_> {
    fn node(&self, n: &Node) -> u64 {
        match n {
            Node::Root => 1,
            Node::Seen(i) => self.nodes[usize::from(*i) % self.nodes.len()],
            Node::Trash(k) => TRASH_INO + u64::from(*k % 4),
            Node::Outside(i) => self.world.outside[usize::from(*i) % self.world.outside.len()],
            Node::Raw(v) => *v,
        }
    }

    fn fh(&self, h: &Handle) -> u64 {
        match h {
            Handle::Seen(i) if !self.handles.is_empty() => {
                self.handles[usize::from(*i) % self.handles.len()]
            }
            Handle::Seen(i) => u64::from(*i),
            Handle::Raw(v) => *v,
        }
    }

    /// Sends one request; checks the framing of what comes back and returns
    /// the payload of a successful reply.
    fn send(&mut self, op: u32, nodeid: u64, parts: &[&[u8]]) -> Option<Vec<u8>> {
        self.unique += 1;
        let sent = SENT.fetch_add(1, Ordering::Relaxed) + 1;
        if sent.is_multiple_of(1_000_000) {
            eprintln!("requests: {sent} sent by this process");
        }
        let unique = self.unique;
        let msg = message(op, unique, nodeid, self.uid, parts);
        let mut out = Collect::default();
        self.d
            .handle_message(&msg, &mut self.scratch, &mut out)
            .expect("the collecting sink never fails");
        assert!(out.0.len() <= 1, "{} replies to one request", out.0.len());
        if !expects_reply(op) {
            assert!(out.0.is_empty(), "a reply to opcode {op}, which takes none");
        }
        let reply = out.0.pop()?;
        let (h, payload) = OutHeader::read_from_prefix(&reply).expect("reply header");
        assert_eq!(h.len as usize, reply.len(), "reply length of opcode {op}");
        assert_eq!(h.unique, unique);
        assert!(h.error <= 0 && h.error > -4096, "errno {}", h.error);
        if !self.input_has_secret {
            assert!(
                !payload.windows(SECRET.len()).any(|w| w == SECRET),
                "opcode {op} on node {nodeid} returned another tenant's bytes"
            );
        }
        (h.error == 0).then(|| payload.to_vec())
    }

    /// Whether engine inode `ino` lies in the export now, by the host's
    /// view of its parents.
    fn inside(&self, ino: Ino) -> bool {
        let ctx = Context::internal();
        let mut at = ino;
        for _ in 0..4096 {
            if at == self.root {
                return true;
            }
            if at == ROOT_INO || at >= TRASH_INO {
                return false;
            }
            match self.world.host.getattr(&ctx, at) {
                // Several links: no single parent; only the guest's own
                // LINKs (inside) make them here.
                Ok(attr) if attr.parent == 0 => return true,
                Ok(attr) => at = attr.parent,
                Err(e) => panic!("node {ino} named by a reply does not exist ({e})"),
            }
        }
        false
    }

    /// A reply named node `nodeid`: it must be in the export.
    fn named(&mut self, nodeid: u64, what: &str) {
        if nodeid == 0 || nodeid == ROOT_INO {
            return;
        }
        assert!(
            !self.world.outside.contains(&nodeid),
            "{what} named the other tenant's inode {nodeid}"
        );
        assert!(
            self.inside(nodeid),
            "{what} named node {nodeid}, outside the export"
        );
        if self.nodes.len() < 256 {
            self.nodes.push(nodeid);
        }
    }

    fn entry(&mut self, payload: Option<Vec<u8>>, what: &str) {
        if let Some(p) = payload {
            let (e, rest) = EntryOut::read_from_prefix(&p).expect("entry_out");
            self.named(e.nodeid, what);
            if let Ok((o, _)) = abi::OpenOut::read_from_prefix(rest) {
                self.handle(o.fh);
            }
        }
    }

    fn handle(&mut self, fh: u64) {
        if self.handles.len() < 256 {
            self.handles.push(fh);
        }
    }

    fn run(&mut self, op: &Op) {
        let world = self.world;
        match op {
            Op::Lookup(n, name) => {
                let (node, name) = (self.node(n), name_of(name));
                let r = self.send(opcode::LOOKUP, node, &[&cstr(&name)]);
                self.entry(r, "LOOKUP");
            }
            Op::Forget(n, k) => {
                let node = self.node(n);
                let f = abi::ForgetIn {
                    nlookup: u64::from(*k),
                };
                self.send(opcode::FORGET, node, &[f.as_bytes()]);
            }
            Op::BatchForget(list) => {
                let mut body = abi::BatchForgetIn {
                    count: list.len() as u32,
                    dummy: 0,
                }
                .as_bytes()
                .to_vec();
                for (n, k) in list.iter().take(512) {
                    let one = abi::ForgetOne {
                        nodeid: self.node(n),
                        nlookup: u64::from(*k),
                    };
                    body.extend_from_slice(one.as_bytes());
                }
                self.send(opcode::BATCH_FORGET, 0, &[&body]);
            }
            Op::Getattr(n) => {
                let node = self.node(n);
                let g = abi::GetattrIn::default();
                self.send(opcode::GETATTR, node, &[g.as_bytes()]);
            }
            Op::Setattr {
                node,
                valid,
                fh,
                size,
                mode,
                uid,
            } => {
                let s = abi::SetattrIn {
                    valid: *valid,
                    fh: self.fh(fh),
                    size: offset(size),
                    mode: *mode,
                    uid: *uid,
                    gid: *uid,
                    ..Default::default()
                };
                let node = self.node(node);
                self.send(opcode::SETATTR, node, &[s.as_bytes()]);
            }
            Op::Readlink(n) => {
                let node = self.node(n);
                self.send(opcode::READLINK, node, &[]);
            }
            Op::Symlink(n, name, target) => {
                let node = self.node(n);
                let r = self.send(
                    opcode::SYMLINK,
                    node,
                    &[&cstr(&name_of(name)), &cstr(&name_of(target))],
                );
                self.entry(r, "SYMLINK");
            }
            Op::Mknod(n, name, mode, rdev) => {
                let m = abi::MknodIn {
                    mode: *mode,
                    rdev: *rdev,
                    umask: 0,
                    padding: 0,
                };
                let node = self.node(n);
                let r = self.send(opcode::MKNOD, node, &[m.as_bytes(), &cstr(&name_of(name))]);
                self.entry(r, "MKNOD");
            }
            Op::Mkdir(n, name, mode) => {
                let m = abi::MkdirIn {
                    mode: *mode,
                    umask: 0,
                };
                let node = self.node(n);
                let r = self.send(opcode::MKDIR, node, &[m.as_bytes(), &cstr(&name_of(name))]);
                self.entry(r, "MKDIR");
            }
            Op::Unlink(n, name) => {
                let node = self.node(n);
                self.send(opcode::UNLINK, node, &[&cstr(&name_of(name))]);
            }
            Op::Rmdir(n, name) => {
                let node = self.node(n);
                self.send(opcode::RMDIR, node, &[&cstr(&name_of(name))]);
            }
            Op::Rename {
                from,
                name,
                to,
                new_name,
                flags,
            } => {
                let r = abi::Rename2In {
                    newdir: self.node(to),
                    flags: *flags,
                    padding: 0,
                };
                let node = self.node(from);
                self.send(
                    opcode::RENAME2,
                    node,
                    &[
                        r.as_bytes(),
                        &cstr(&name_of(name)),
                        &cstr(&name_of(new_name)),
                    ],
                );
            }
            Op::Link(n, to, name) => {
                let l = abi::LinkIn {
                    oldnodeid: self.node(n),
                };
                let node = self.node(to);
                let r = self.send(opcode::LINK, node, &[l.as_bytes(), &cstr(&name_of(name))]);
                self.entry(r, "LINK");
            }
            Op::Open(n, flags) => {
                let o = abi::OpenIn {
                    flags: *flags,
                    open_flags: 0,
                };
                let node = self.node(n);
                if let Some(p) = self.send(opcode::OPEN, node, &[o.as_bytes()]) {
                    let (o, _) = abi::OpenOut::read_from_prefix(&p).expect("open_out");
                    self.handle(o.fh);
                }
            }
            Op::Create(n, name, flags, mode) => {
                let c = abi::CreateIn {
                    flags: *flags,
                    mode: *mode,
                    umask: 0,
                    open_flags: 0,
                };
                let node = self.node(n);
                let r = self.send(opcode::CREATE, node, &[c.as_bytes(), &cstr(&name_of(name))]);
                self.entry(r, "CREATE");
            }
            Op::Read(n, fh, off, size) => {
                let r = abi::ReadIn {
                    fh: self.fh(fh),
                    offset: offset(off),
                    size: u32::from(*size),
                    ..Default::default()
                };
                let node = self.node(n);
                self.send(opcode::READ, node, &[r.as_bytes()]);
            }
            Op::Write(n, fh, off, data) => {
                let data = &data[..data.len().min(16 << 10)];
                let w = abi::WriteIn {
                    fh: self.fh(fh),
                    offset: offset(off),
                    size: data.len() as u32,
                    ..Default::default()
                };
                let node = self.node(n);
                self.send(opcode::WRITE, node, &[w.as_bytes(), data]);
            }
            Op::Flush(n, fh) => {
                let f = abi::FlushIn {
                    fh: self.fh(fh),
                    ..Default::default()
                };
                let node = self.node(n);
                self.send(opcode::FLUSH, node, &[f.as_bytes()]);
            }
            Op::Release(n, fh) | Op::Releasedir(n, fh) => {
                let op = if matches!(op, Op::Release(..)) {
                    opcode::RELEASE
                } else {
                    opcode::RELEASEDIR
                };
                let r = abi::ReleaseIn {
                    fh: self.fh(fh),
                    ..Default::default()
                };
                let node = self.node(n);
                self.send(op, node, &[r.as_bytes()]);
            }
            Op::Fsync(n, fh, datasync) => {
                let f = abi::FsyncIn {
                    fh: self.fh(fh),
                    fsync_flags: u32::from(*datasync),
                    padding: 0,
                };
                let node = self.node(n);
                self.send(opcode::FSYNC, node, &[f.as_bytes()]);
            }
            Op::Opendir(n) => {
                let o = abi::OpenIn::default();
                let node = self.node(n);
                if let Some(p) = self.send(opcode::OPENDIR, node, &[o.as_bytes()]) {
                    let (o, _) = abi::OpenOut::read_from_prefix(&p).expect("open_out");
                    self.handle(o.fh);
                }
            }
            Op::Readdir {
                node,
                fh,
                offset,
                size,
                plus,
            } => {
                let r = abi::ReadIn {
                    fh: self.fh(fh),
                    offset: u64::from(*offset),
                    size: u32::from(*size),
                    ..Default::default()
                };
                let node = self.node(node);
                let op = if *plus {
                    opcode::READDIRPLUS
                } else {
                    opcode::READDIR
                };
                if let Some(p) = self.send(op, node, &[r.as_bytes()]) {
                    self.dirents(&p, *plus);
                }
            }
            Op::Fsyncdir(n, fh) => {
                let f = abi::FsyncIn {
                    fh: self.fh(fh),
                    ..Default::default()
                };
                let node = self.node(n);
                self.send(opcode::FSYNCDIR, node, &[f.as_bytes()]);
            }
            Op::Statfs(n) => {
                let node = self.node(n);
                self.send(opcode::STATFS, node, &[]);
            }
            Op::Setxattr(n, name, value, flags) => {
                let s = abi::SetxattrIn {
                    size: value.len() as u32,
                    flags: *flags,
                };
                let node = self.node(n);
                self.send(
                    opcode::SETXATTR,
                    node,
                    &[s.as_bytes(), &cstr(&xattr_name(name)), value],
                );
            }
            Op::Getxattr(n, name, size) => {
                let g = abi::GetxattrIn {
                    size: u32::from(*size),
                    padding: 0,
                };
                let node = self.node(n);
                self.send(
                    opcode::GETXATTR,
                    node,
                    &[g.as_bytes(), &cstr(&xattr_name(name))],
                );
            }
            Op::Listxattr(n, size) => {
                let g = abi::GetxattrIn {
                    size: u32::from(*size),
                    padding: 0,
                };
                let node = self.node(n);
                self.send(opcode::LISTXATTR, node, &[g.as_bytes()]);
            }
            Op::Removexattr(n, name) => {
                let node = self.node(n);
                self.send(opcode::REMOVEXATTR, node, &[&cstr(&xattr_name(name))]);
            }
            Op::Access(n, mask) => {
                let a = abi::AccessIn {
                    mask: *mask,
                    padding: 0,
                };
                let node = self.node(n);
                self.send(opcode::ACCESS, node, &[a.as_bytes()]);
            }
            Op::Fallocate(n, fh, mode, off, len) => {
                let f = abi::FallocateIn {
                    fh: self.fh(fh),
                    offset: offset(off),
                    length: offset(len),
                    mode: *mode,
                    padding: 0,
                };
                let node = self.node(n);
                self.send(opcode::FALLOCATE, node, &[f.as_bytes()]);
            }
            Op::Lseek(n, fh, off, whence) => {
                let l = abi::LseekIn {
                    fh: self.fh(fh),
                    offset: offset(off),
                    whence: *whence % 8,
                    padding: 0,
                };
                let node = self.node(n);
                self.send(opcode::LSEEK, node, &[l.as_bytes()]);
            }
            Op::CopyFileRange {
                from,
                fh_in,
                off_in,
                to,
                fh_out,
                off_out,
                len,
            } => {
                let c = abi::CopyFileRangeIn {
                    fh_in: self.fh(fh_in),
                    off_in: offset(off_in),
                    nodeid_out: self.node(to),
                    fh_out: self.fh(fh_out),
                    off_out: offset(off_out),
                    len: offset(len),
                    flags: 0,
                };
                let node = self.node(from);
                self.send(opcode::COPY_FILE_RANGE, node, &[c.as_bytes()]);
            }
            Op::Raw(op, n, body) => {
                if *op == opcode::DESTROY || *op == opcode::INIT {
                    return;
                }
                let node = self.node(n);
                self.send(*op, node, &[body]);
            }
            Op::HostMovesOut(name) => {
                let ctx = Context::internal();
                let name = name_of(name);
                let moved = format!("moved-{}-{}", world.round, self.unique);
                let other = world.outside[0];
                // Only directories: a file with its data moved out is the
                // same test, and plain files may be the guest's own links.
                if let Ok(e) = world.host.lookup(&ctx, self.root, &name)
                    && e.attr.typ == FileType::Directory
                {
                    let _ = world.host.rename(
                        &ctx,
                        self.root,
                        &name,
                        other,
                        moved.as_bytes(),
                        Default::default(),
                    );
                }
            }
            Op::HostRemoves(name) => {
                let ctx = Context::internal();
                let _ = world.host.unlink(&ctx, self.root, &name_of(name));
            }
        }
    }

    /// Checks every node a READDIR(PLUS) reply names.
    fn dirents(&mut self, mut p: &[u8], plus: bool) {
        while !p.is_empty() {
            let (nodeid, dirent, rest) = if plus {
                let (d, rest) = DirentPlus::read_from_prefix(p).expect("direntplus");
                (d.entry_out.nodeid, d.dirent, rest)
            } else {
                let (d, rest) = Dirent::read_from_prefix(p).expect("dirent");
                (0, d, rest)
            };
            let namelen = dirent.namelen as usize;
            assert!(namelen <= rest.len(), "dirent name past the reply");
            let name = &rest[..namelen];
            let what = if plus { "READDIRPLUS" } else { "READDIR" };
            if name != b"." && name != b".." {
                self.named(dirent.ino, what);
                self.named(nodeid, what);
            }
            let record = if plus {
                std::mem::size_of::<DirentPlus>()
            } else {
                std::mem::size_of::<Dirent>()
            } + namelen;
            let step = dirent_align(record);
            if step >= p.len() {
                break;
            }
            p = &p[step..];
        }
    }
}

fn name_of(n: &Name) -> Vec<u8> {
    match n {
        Name::Pick(i) => NAMES[usize::from(*i) % NAMES.len()].to_vec(),
        Name::Raw(v) => v.iter().copied().filter(|&b| b != 0).take(300).collect(),
    }
}

fn xattr_name(n: &Name) -> Vec<u8> {
    match n {
        Name::Pick(i) => [
            b"user.secret".as_slice(),
            b"user.a",
            b"trusted.x",
            b"security.capability",
            b"system.posix_acl_access",
        ][usize::from(*i) % 5]
            .to_vec(),
        Name::Raw(_) => name_of(n),
    }
}

fn offset(o: &Offset) -> u64 {
    match o {
        Offset::Small(v) => u64::from(*v),
        Offset::Chunk(k, d) => (u64::from(*k) << 26).wrapping_add_signed(i64::from(*d)),
        Offset::Power(k) => 1u64.wrapping_shl(u32::from(*k % 64)).wrapping_sub(1),
        Offset::Raw(v) => *v,
    }
}

/// What the host sees of the export: every name, inode, type, mode,
/// owner, length, link count, times (access times aside), extended
/// attributes and file contents.
fn digest(host: &Vfs, root: Ino) -> BTreeMap<Vec<u8>, String> {
    let ctx = Context::internal();
    let mut out = BTreeMap::new();
    let mut stack = vec![(root, b"/".to_vec())];
    while let Some((dir, path)) = stack.pop() {
        let fh = host.opendir(&ctx, dir).expect("host opendir");
        let entries = host
            .readdir_all(&ctx, dir, fh, 0, true)
            .expect("host readdir");
        host.releasedir(&ctx, dir, fh).unwrap();
        for e in entries {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let mut p = path.clone();
            p.extend_from_slice(&e.name);
            let a = &e.attr;
            let mut line = format!(
                "{} {:?} {:o} {}:{} len {} nlink {} mtime {:?} ctime {:?}",
                e.inode, a.typ, a.mode, a.uid, a.gid, a.length, a.nlink, a.mtime, a.ctime
            );
            if let Ok(names) = host.listxattr(&ctx, e.inode) {
                for n in names {
                    let v = host.getxattr(&ctx, e.inode, &n).unwrap_or_default();
                    line.push_str(&format!(" x {n:?}={v:?}"));
                }
            }
            match a.typ {
                FileType::Directory => {
                    p.push(b'/');
                    stack.push((e.inode, p.clone()));
                }
                FileType::File => {
                    let out = host
                        .open(&ctx, e.inode, libc::O_RDONLY as u32)
                        .expect("host open");
                    let mut buf = vec![0u8; 1 << 16];
                    let n = host
                        .read_buf(&ctx, e.inode, out.fh, 0, &mut buf)
                        .unwrap_or(0);
                    host.release(&ctx, e.inode, out.fh).unwrap();
                    line.push_str(&format!(" data {:?}", &buf[..n]));
                }
                _ => {}
            }
            out.insert(p, line);
        }
    }
    out
}

/// Runs one input; panics when an invariant breaks.
pub fn run(data: &[u8]) {
    let world = world().lock().unwrap_or_else(|e| e.into_inner());
    let mut u = Unstructured::new(data);
    let read_only = u.arbitrary::<bool>().unwrap_or(false);
    let uid = if u.arbitrary::<bool>().unwrap_or(false) {
        1000
    } else {
        0
    };
    let limits = ClientLimits {
        max_handles: u.int_in_range(1..=32).unwrap_or(16),
        max_nodes: u.int_in_range(1..=64).unwrap_or(32),
        max_xattr_size: u.int_in_range(0..=65_536).unwrap_or(256),
    };
    let max_dir_entries = u.int_in_range(1..=64).unwrap_or(64);

    // The host makes this input's export.
    let mut world = world;
    world.round += 1;
    let ctx = Context::internal();
    let name = format!("vm{}", world.round);
    let root = world
        .host
        .mkdir(&ctx, ROOT_INO, name.as_bytes(), 0o777, 0)
        .expect("host mkdir")
        .inode;
    let inside = world.host.mkdir(&ctx, root, b"inside", 0o777, 0).unwrap();
    let (file, out) = world
        .host
        .create(&ctx, inside.inode, b"file", 0o666, 0, libc::O_RDWR as u32)
        .unwrap();
    world
        .host
        .write_buf(&ctx, file.inode, out.fh, 0, b"guest data", false)
        .unwrap();
    world.host.release(&ctx, file.inode, out.fh).unwrap();
    world.host.mkdir(&ctx, root, b"held", 0o777, 0).unwrap();
    world
        .host
        .symlink(&ctx, root, b"link", b"../other/secret")
        .unwrap();
    let world = &*world;

    let before = read_only.then(|| digest(&world.host, root));
    let vfs = Vfs::new(
        world.volume.clone(),
        VfsConfig {
            max_dir_entries,
            ..small_config(read_only)
        },
    )
    .expect("guest vfs");
    let export = Export::new(vfs, root, read_only)
        .with_limits(limits)
        .with_recheck(Duration::ZERO);
    let mut s = Session {
        world,
        d: Dispatcher::new(export, Config::default()),
        root,
        uid,
        unique: 0,
        nodes: vec![1],
        handles: Vec::new(),
        input_has_secret: data.windows(SECRET.len()).any(|w| w == SECRET),
        scratch: Scratch::new(),
    };
    let init = abi::InitIn {
        major: 7,
        minor: 38,
        max_readahead: 1 << 17,
        flags: u32::MAX,
        flags2: 0,
        unused: [0; 11],
    };
    s.send(opcode::INIT, 0, &[init.as_bytes()])
        .expect("INIT answers");

    let mut steps = 0;
    while steps < MAX_STEPS && !u.is_empty() {
        let Ok(op) = u.arbitrary::<Op>() else { break };
        if read_only && matches!(op, Op::HostMovesOut(_) | Op::HostRemoves(_)) {
            continue;
        }
        s.run(&op);
        steps += 1;
    }

    // The session still answers, and ends cleanly.
    let g = abi::GetattrIn::default();
    s.send(opcode::GETATTR, 1, &[g.as_bytes()])
        .expect("GETATTR of the root still answers");
    s.send(opcode::STATFS, 1, &[])
        .expect("STATFS still answers");
    s.d.shutdown();
    drop(s);
    if let Some(before) = before {
        let after = digest(&world.host, root);
        assert_eq!(before, after, "a read-only export changed");
    }
}
