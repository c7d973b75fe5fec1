//! Random and malformed FUSE messages fed through the dispatcher into the
//! real engine (a SQLite + local-directory volume in a temp dir): every
//! message gets at most one well-formed reply (or none, for operations the
//! kernel never expects a reply to), nothing panics, and the volume still
//! works afterwards.

use std::io;
use std::mem::size_of;

use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestRunner};
use sluice_engine::format::Compression;
use sluice_engine::meta::open_meta;
use sluice_engine::vfs::{Vfs, VfsConfig};
use sluice_engine::volume::{format_volume, open_volume};
use sluice_fuse::abi::{self, InHeader, OutHeader, opcode};
use sluice_fuse::request::expects_reply;
use sluice_fuse::{Config, Dispatcher, ReplyHead, ReplySink, Scratch};
use zerocopy::{FromBytes, IntoBytes};

#[derive(Default)]
struct Collect(Vec<Vec<u8>>);

impl ReplySink for Collect {
    fn send(&mut self, head: &ReplyHead, payload: &[u8]) -> io::Result<()> {
        let mut m = head.as_bytes().to_vec();
        m.extend_from_slice(payload);
        self.0.push(m);
        Ok(())
    }
}

fn message(op: u32, unique: u64, nodeid: u64, parts: &[&[u8]]) -> Vec<u8> {
    let body = parts.concat();
    let h = InHeader {
        len: (size_of::<InHeader>() + body.len()) as u32,
        opcode: op,
        unique,
        nodeid,
        uid: 0,
        gid: 0,
        pid: 1,
        total_extlen: 0,
        padding: 0,
    };
    let mut m = h.as_bytes().to_vec();
    m.extend_from_slice(&body);
    m
}

fn send(d: &Dispatcher<Vfs>, msg: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Collect::default();
    d.handle_message(msg, &mut Scratch::new(), &mut out)
        .expect("the collecting sink never fails");
    out.0
}

fn header(reply: &[u8]) -> OutHeader {
    OutHeader::read_from_prefix(reply).expect("reply header").0
}

/// Sends a well-formed request and returns its single successful reply.
fn ok(d: &Dispatcher<Vfs>, msg: &[u8]) -> Vec<u8> {
    let mut r = send(d, msg);
    assert_eq!(r.len(), 1);
    assert_eq!(header(&r[0]).error, 0, "request failed");
    r.remove(0)
}

fn engine() -> (tempfile::TempDir, Dispatcher<Vfs>) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite3://{}/meta.db", dir.path().display());
    let meta = open_meta(&url).unwrap();
    format_volume(
        &*meta,
        "fuzz",
        &dir.path().join("bucket"),
        1024,
        Compression::None,
        0,
    )
    .unwrap();
    drop(meta);
    let cfg = VfsConfig {
        cache_bytes: 16 << 20,
        cleanup_interval: None,
        ..VfsConfig::default()
    };
    let vfs = Vfs::new(open_volume(open_meta(&url).unwrap()).unwrap(), cfg).unwrap();
    let d = Dispatcher::new(vfs, Config::default());
    let init = abi::InitIn {
        major: 7,
        minor: 38,
        max_readahead: 1 << 17,
        flags: u32::MAX,
        flags2: 0,
        unused: [0; 11],
    };
    ok(&d, &message(opcode::INIT, 1, 0, &[init.as_bytes()]));
    (dir, d)
}

#[test]
fn garbage_against_the_engine_never_panics() {
    let (_dir, d) = engine();
    // Some real nodes and open handles for random requests to hit.
    let mkdir = abi::MkdirIn {
        mode: 0o755,
        umask: 0,
    };
    ok(
        &d,
        &message(opcode::MKDIR, 2, 1, &[mkdir.as_bytes(), b"dir\0"]),
    );
    let create = abi::CreateIn {
        flags: libc::O_RDWR as u32,
        mode: libc::S_IFREG | 0o644,
        umask: 0,
        open_flags: 0,
    };
    let r = ok(
        &d,
        &message(opcode::CREATE, 3, 1, &[create.as_bytes(), b"file\0"]),
    );
    let entry = abi::EntryOut::read_from_prefix(&r[16..]).unwrap().0;
    let w = abi::WriteIn {
        fh: 1,
        offset: 0,
        size: 5,
        ..Default::default()
    };
    ok(
        &d,
        &message(opcode::WRITE, 4, entry.nodeid, &[w.as_bytes(), b"hello"]),
    );

    // DESTROY is left out: it ends the session, after which every request
    // is refused without reaching the engine.
    let opcodes = prop_oneof![9 => 1u32..=52, 1 => any::<u32>()]
        .prop_filter("DESTROY ends the session", |op| *op != opcode::DESTROY);
    let strategy = (
        opcodes,
        0u64..8,
        proptest::collection::vec(any::<u8>(), 0..200),
        0usize..260,
    );
    let mut runner = TestRunner::new(RunnerConfig {
        cases: 1500,
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    let next = std::sync::atomic::AtomicU64::new(100);
    runner
        .run(&strategy, |(op, node, body, cut)| {
            let unique = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let msg = message(op, unique, node, &[&body]);
            let msg = &msg[..msg.len().min(40 + cut)];
            let replies = send(&d, msg);
            prop_assert!(replies.len() <= 1);
            if let Some(r) = replies.first() {
                let h = header(r);
                prop_assert_eq!(h.len as usize, r.len());
                prop_assert_eq!(h.unique, unique);
                prop_assert!(h.error <= 0 && h.error > -4096);
            }
            if !expects_reply(op) {
                prop_assert!(replies.is_empty());
            }
            Ok(())
        })
        .unwrap();

    // The volume still serves: the file written at the start reads back.
    let look = ok(&d, &message(opcode::LOOKUP, 9000, 1, &[b"dir\0"]));
    assert_eq!(header(&look).len as usize, 16 + size_of::<abi::EntryOut>());
    let read = abi::ReadIn {
        fh: 1,
        offset: 0,
        size: 4096,
        ..Default::default()
    };
    let r = send(
        &d,
        &message(opcode::READ, 9001, entry.nodeid, &[read.as_bytes()]),
    );
    if header(&r[0]).error == 0 {
        assert!(r[0].len() >= 16);
    }
    d.shutdown();
}

/// Numbers that find edge cases: zero, block and chunk boundaries, and
/// values near the limits of the integer types.
fn interesting() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(4095),
        Just(4096),
        Just((64 << 20) - 1),
        Just(64 << 20),
        Just(1 << 40),
        Just(i64::MAX as u64),
        Just(u64::MAX),
        Just(u64::MAX - 4096),
        0u64..(256 << 20),
        any::<u64>(),
    ]
}

fn name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"a".to_vec()),
        Just(b"b".to_vec()),
        Just(b"dir".to_vec()),
        Just(b"file".to_vec()),
        Just(b".".to_vec()),
        Just(vec![b'x'; 255]),
    ]
}

fn xattr_name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"user.a".to_vec()),
        Just(b"user.b".to_vec()),
        Just(b"trusted.t".to_vec()),
        Just(b"system.posix_acl_access".to_vec()),
        Just(b"bogus".to_vec()),
    ]
}

fn nul(v: &[u8]) -> Vec<u8> {
    let mut v = v.to_vec();
    v.push(0);
    v
}

/// A well-formed request (opcode, node id, body) with edge-case values.
fn structured(
    file: u64,
    handles: std::ops::Range<u64>,
) -> impl Strategy<Value = (u32, u64, Vec<u8>)> {
    // Half the time the open test file and one of its handles.
    let node = prop_oneof![Just(file), 1u64..6];
    let fh = prop_oneof![handles, 0u64..64];
    prop_oneof![
        (
            node.clone(),
            fh.clone(),
            any::<u32>(),
            interesting(),
            interesting(),
            interesting(),
            any::<u32>(),
            any::<u32>()
        )
            .prop_map(|(n, fh, valid, size, at, mt, ns, mode)| {
                let s = abi::SetattrIn {
                    valid: valid & 0xfff,
                    fh,
                    size,
                    atime: at,
                    mtime: mt,
                    atimensec: ns % 2_000_000_000,
                    mtimensec: ns % 1_000_000_000,
                    mode,
                    uid: mode % 3,
                    gid: mode % 5,
                    ..Default::default()
                };
                (opcode::SETATTR, n, s.as_bytes().to_vec())
            }),
        (
            node.clone(),
            fh.clone(),
            interesting(),
            interesting(),
            prop_oneof![Just(0u32), Just(1), Just(3), Just(0x10), any::<u32>()]
        )
            .prop_map(|(n, fh, offset, length, mode)| {
                let f = abi::FallocateIn {
                    fh,
                    offset,
                    length,
                    mode,
                    padding: 0,
                };
                (opcode::FALLOCATE, n, f.as_bytes().to_vec())
            }),
        (
            node.clone(),
            fh.clone(),
            interesting(),
            proptest::collection::vec(any::<u8>(), 0..64)
        )
            .prop_map(|(n, fh, offset, data)| {
                let w = abi::WriteIn {
                    fh,
                    offset,
                    size: data.len() as u32,
                    ..Default::default()
                };
                let mut b = w.as_bytes().to_vec();
                b.extend_from_slice(&data);
                (opcode::WRITE, n, b)
            }),
        (
            node.clone(),
            fh.clone(),
            interesting(),
            0u32..=(1 << 20),
            prop_oneof![
                Just(opcode::READ),
                Just(opcode::READDIR),
                Just(opcode::READDIRPLUS)
            ]
        )
            .prop_map(|(n, fh, offset, size, op)| {
                let r = abi::ReadIn {
                    fh,
                    offset,
                    size,
                    ..Default::default()
                };
                (op, n, r.as_bytes().to_vec())
            }),
        (node.clone(), fh.clone(), interesting(), 0u32..6).prop_map(|(n, fh, offset, whence)| {
            let l = abi::LseekIn {
                fh,
                offset,
                whence,
                padding: 0,
            };
            (opcode::LSEEK, n, l.as_bytes().to_vec())
        }),
        (
            node.clone(),
            name(),
            prop_oneof![
                Just(opcode::MKDIR),
                Just(opcode::MKNOD),
                Just(opcode::CREATE)
            ],
            any::<u32>()
        )
            .prop_map(|(n, nm, op, mode)| {
                let mut b = match op {
                    opcode::MKDIR => abi::MkdirIn {
                        mode: mode & 0o7777,
                        umask: 0o22,
                    }
                    .as_bytes()
                    .to_vec(),
                    opcode::MKNOD => abi::MknodIn {
                        mode,
                        rdev: 0,
                        umask: 0,
                        padding: 0,
                    }
                    .as_bytes()
                    .to_vec(),
                    _ => abi::CreateIn {
                        flags: libc::O_RDWR as u32,
                        mode,
                        umask: 0,
                        open_flags: 0,
                    }
                    .as_bytes()
                    .to_vec(),
                };
                b.extend_from_slice(&nul(&nm));
                (op, n, b)
            }),
        (
            node.clone(),
            name(),
            prop_oneof![
                Just(opcode::UNLINK),
                Just(opcode::RMDIR),
                Just(opcode::LOOKUP)
            ]
        )
            .prop_map(|(n, nm, op)| (op, n, nul(&nm))),
        (node.clone(), name(), node.clone(), name(), 0u32..4).prop_map(|(n, a, np, b, flags)| {
            let r = abi::Rename2In {
                newdir: np,
                flags,
                padding: 0,
            };
            let mut body = r.as_bytes().to_vec();
            body.extend_from_slice(&nul(&a));
            body.extend_from_slice(&nul(&b));
            (opcode::RENAME2, n, body)
        }),
        (node.clone(), node.clone(), name()).prop_map(|(n, old, nm)| {
            let mut body = abi::LinkIn { oldnodeid: old }.as_bytes().to_vec();
            body.extend_from_slice(&nul(&nm));
            (opcode::LINK, n, body)
        }),
        (node.clone(), name(), name()).prop_map(|(n, nm, target)| {
            let mut body = nul(&nm);
            body.extend_from_slice(&nul(&target));
            (opcode::SYMLINK, n, body)
        }),
        (
            node.clone(),
            xattr_name(),
            proptest::collection::vec(any::<u8>(), 0..100),
            0u32..3
        )
            .prop_map(|(n, nm, value, flags)| {
                let s = abi::SetxattrIn {
                    size: value.len() as u32,
                    flags,
                };
                let mut body = s.as_bytes().to_vec();
                body.extend_from_slice(&nul(&nm));
                body.extend_from_slice(&value);
                (opcode::SETXATTR, n, body)
            }),
        (
            node.clone(),
            xattr_name(),
            0u32..200,
            prop_oneof![
                Just(opcode::GETXATTR),
                Just(opcode::LISTXATTR),
                Just(opcode::REMOVEXATTR)
            ]
        )
            .prop_map(|(n, nm, size, op)| {
                let body = match op {
                    opcode::GETXATTR => {
                        [abi::GetxattrIn { size, padding: 0 }.as_bytes(), &nul(&nm)].concat()
                    }
                    opcode::LISTXATTR => abi::GetxattrIn { size, padding: 0 }.as_bytes().to_vec(),
                    _ => nul(&nm),
                };
                (op, n, body)
            }),
        (
            node.clone(),
            fh,
            prop_oneof![
                Just(opcode::OPEN),
                Just(opcode::OPENDIR),
                Just(opcode::RELEASE),
                Just(opcode::RELEASEDIR),
                Just(opcode::FLUSH),
                Just(opcode::FSYNC),
                Just(opcode::FSYNCDIR),
                Just(opcode::GETATTR),
                Just(opcode::ACCESS),
                Just(opcode::STATFS),
                Just(opcode::READLINK)
            ],
            any::<u32>()
        )
            .prop_map(|(n, fh, op, flags)| {
                let mut body = vec![0u8; 40];
                body[..8].copy_from_slice(&fh.to_ne_bytes());
                if matches!(op, opcode::OPEN | opcode::OPENDIR | opcode::ACCESS) {
                    body[..4].copy_from_slice(&(flags & 0o3).to_ne_bytes());
                }
                (op, n, body)
            }),
    ]
}

#[test]
fn edge_case_requests_against_the_engine_never_panic() {
    let (_dir, d) = engine();
    let create = abi::CreateIn {
        flags: libc::O_RDWR as u32,
        mode: libc::S_IFREG | 0o644,
        umask: 0,
        open_flags: 0,
    };
    let r = ok(
        &d,
        &message(opcode::CREATE, 2, 1, &[create.as_bytes(), b"f\0"]),
    );
    let file = abi::EntryOut::read_from_prefix(&r[16..]).unwrap().0.nodeid;
    let first = abi::OpenOut::read_from_prefix(&r[16 + 128..]).unwrap().0.fh;
    let open = abi::OpenIn {
        flags: libc::O_RDWR as u32,
        open_flags: 0,
    };
    for i in 0..20 {
        ok(&d, &message(opcode::OPEN, 3 + i, file, &[open.as_bytes()]));
    }
    let mut runner = TestRunner::new(RunnerConfig {
        cases: 4000,
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    let next = std::sync::atomic::AtomicU64::new(100);
    let succeeded = std::sync::Mutex::new(std::collections::BTreeMap::<u32, u32>::new());
    runner
        .run(&structured(file, first..first + 21), |(op, node, body)| {
            let unique = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let msg = message(op, unique, node, &[&body]);
            let replies = send(&d, &msg);
            prop_assert_eq!(replies.len(), 1, "opcode {} gets one reply", op);
            let h = header(&replies[0]);
            prop_assert_eq!(h.len as usize, replies[0].len());
            prop_assert_eq!(h.unique, unique);
            prop_assert!(h.error <= 0 && h.error > -4096);
            if h.error == 0 {
                *succeeded.lock().unwrap().entry(op).or_default() += 1;
            }
            Ok(())
        })
        .unwrap();
    // The requests reached the engine and most kinds succeeded at times
    // (the rest are refused for good reasons: no such handle, bad flags).
    let succeeded = succeeded.into_inner().unwrap();
    eprintln!("successful replies per opcode: {succeeded:?}");
    assert!(
        succeeded.len() >= 15,
        "too few kinds succeeded: {succeeded:?}"
    );
    // Still serving.
    ok(&d, &message(opcode::STATFS, 9000, 1, &[]));
    d.shutdown();
}
