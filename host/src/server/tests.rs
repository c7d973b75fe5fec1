//! The block service over a real Unix socket, on a real SQLite + `file://`
//! volume: clients are [`HostClient`]s and, for bad input, raw sockets.

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use sluice_engine::block_key::block_key;
use sluice_engine::block_source::{Ask, BlockSource, SourcedBlock};
use sluice_engine::compress::compress;
use sluice_engine::format::Compression;
use sluice_engine::meta::open_meta;
use sluice_engine::object::disk_cache::{CacheDir, CachedStore, DiskCache, DiskCacheConfig};
use sluice_engine::volume::{Volume, format_volume, open_volume};

use super::*;
use crate::client::{ClientConfig, HostClient};

const BLOCK: u32 = 1 << 20;

struct Fixture {
    dir: tempfile::TempDir,
    vol: Arc<Volume>,
}

impl Fixture {
    /// A volume of 1 MiB blocks with `blocks` blocks of slice 7 stored.
    fn new(blocks: u32) -> Fixture {
        Fixture::compressed(blocks, Compression::None)
    }

    /// [`Fixture::new`] on a volume that compresses its blocks with `algo`.
    fn compressed(blocks: u32, algo: Compression) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let meta = open_meta(&format!("sqlite3://{}/meta.db", dir.path().display())).unwrap();
        format_volume(
            &*meta,
            "hostvol",
            &dir.path().join("bucket"),
            BLOCK >> 10,
            algo,
            0,
        )
        .unwrap();
        let vol = open_volume(meta).unwrap();
        for i in 0..blocks {
            let key = block_key(vol.name(), 7, i, BLOCK);
            vol.store
                .put(&key, &compress(algo, &block_bytes(i)).unwrap(), None)
                .unwrap();
        }
        Fixture { dir, vol }
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("host.sock")
    }

    fn host(&self, vol: Arc<Volume>, cfg: HostConfig) -> Arc<Host> {
        let listener = socket::listen(&self.socket(), None).unwrap();
        Host::start(vol, cfg, listener).unwrap()
    }

    fn client(&self, name: &str) -> Arc<HostClient> {
        self.client_on(name, None)
    }

    /// A client whose guest memory is on NUMA node `node`.
    fn client_on(&self, name: &str, node: Option<u16>) -> Arc<HostClient> {
        HostClient::start(ClientConfig {
            path: self.socket(),
            volume: self.vol.format.uuid.clone(),
            name: name.into(),
            mappings: 64,
            locate: None,
            node,
        })
    }

    /// The volume with a disk cache in front of its store.
    fn cached_volume(&self) -> Arc<Volume> {
        let mut cfg = DiskCacheConfig::new(
            vec![CacheDir {
                path: self.dir.path().join("cache"),
                node: None,
            }],
            64 << 20,
        );
        // Whatever the test machine's disk holds (the default floor keeps
        // 10% of it free and refuses inserts below that).
        cfg.free_space_ratio = 0.0;
        let cache = DiskCache::open(self.vol.name(), &self.vol.format.uuid, cfg).unwrap();
        let store: Arc<dyn sluice_engine::object::ObjectStore> =
            Arc::new(CachedStore::new(self.vol.store.clone(), cache));
        self.vol.with_store(store)
    }
}

/// Block `i`'s bytes: different in every block and every offset.
fn block_bytes(i: u32) -> Vec<u8> {
    (0..BLOCK)
        .map(|j| (j.wrapping_mul(2_654_435_761) >> 24) as u8 ^ i as u8)
        .collect()
}

/// The bytes of a block as a source handed it out.
fn bytes_of(got: SourcedBlock) -> Vec<u8> {
    match got {
        SourcedBlock::Memory(m) => (*m).as_ref().to_vec(),
        SourcedBlock::File(cf) => {
            let mut buf = vec![0u8; BLOCK as usize];
            let mut dst = BufDest::new(&mut buf);
            let crcs = cf.crcs.as_ref().map(|(crcs, payload)| SegmentCrcs {
                segment: SEGMENT,
                crcs,
                payload: *payload,
            });
            dst.put(Fragment::File {
                file: &cf.file,
                off: 0,
                len: BLOCK as usize,
                crcs,
            })
            .unwrap();
            buf
        }
    }
}

fn get(c: &HostClient, i: u32) -> Option<sluice_engine::Result<SourcedBlock>> {
    c.block(7, 64 * BLOCK, i, Ask::Fetch)
}

/// Polls `what` for up to a minute (a condition that must come true, not
/// a speed).
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_block_asked_by_two_clients_at_once_is_fetched_once() {
    let fx = Fixture::new(1);
    let host = fx.host(fx.vol.clone(), HostConfig::default());
    let clients = [fx.client("a"), fx.client("b")];
    assert!(clients.iter().all(|c| c.attached()));
    let barrier = Arc::new(Barrier::new(2));
    let got: Vec<Vec<u8>> = std::thread::scope(|s| {
        let handles: Vec<_> = clients
            .iter()
            .map(|c| {
                let barrier = barrier.clone();
                s.spawn(move || {
                    barrier.wait();
                    bytes_of(get(c, 0).unwrap().unwrap())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(got.iter().all(|b| *b == block_bytes(0)));
    let stats = host.stats();
    assert_eq!(stats.fetches.load(Ordering::Relaxed), 1, "one object GET");
    // The second ask joined the first one's fetch, or found its block.
    assert_eq!(
        stats.joined.load(Ordering::Relaxed) + stats.memory_hits.load(Ordering::Relaxed),
        1
    );
    assert_eq!(host.memory_used(), (u64::from(BLOCK), 1), "held once");
    let views = host.clients();
    assert_eq!(views.len(), 2);
    assert!(views.iter().any(|v| v.name.starts_with("a-")));
}

#[test]
fn many_clients_reading_one_data_set_fetch_each_block_once() {
    let fx = Fixture::new(16);
    let host = fx.host(fx.vol.clone(), HostConfig::default());
    let clients: Vec<_> = (0..4).map(|i| fx.client(&format!("vm{i}"))).collect();
    std::thread::scope(|s| {
        for (n, c) in clients.iter().enumerate() {
            s.spawn(move || {
                // Each client walks the blocks from another start.
                for k in 0..16 {
                    let i = (k + 4 * n as u32) % 16;
                    let b = bytes_of(get(c, i).unwrap().unwrap());
                    assert!(b == block_bytes(i), "block {i}");
                }
            });
        }
    });
    assert_eq!(host.stats().fetches.load(Ordering::Relaxed), 16);
    assert_eq!(host.memory_used().1, 16);
    // Each client holds its blocks mapped: asking again costs no request.
    let before: Vec<u64> = host.clients().iter().map(|v| v.counts[0]).collect();
    bytes_of(get(&clients[0], 3).unwrap().unwrap());
    let after: Vec<u64> = host.clients().iter().map(|v| v.counts[0]).collect();
    assert_eq!(before, after);
}

/// A fetch reads (or decompresses) the object straight into the memfd it
/// hands out: with every compression, for a last block shorter than a page
/// multiple too, and an object of the wrong length is an error, not a
/// block.
#[test]
fn fetched_blocks_land_in_shared_memory_whole_and_checked() {
    let modes = [FillMode::InPlace, FillMode::Copy];
    let algos = [Compression::None, Compression::Lz4, Compression::Zstd];
    for (fill, algo) in modes.into_iter().flat_map(|m| algos.map(|a| (m, a))) {
        let fx = Fixture::compressed(0, algo);
        let (name, store) = (fx.vol.name(), &fx.vol.store);
        let tail = block_bytes(1)[..10_000].to_vec();
        let short = block_bytes(2)[..BLOCK as usize - 1].to_vec();
        for (key, raw) in [
            (block_key(name, 9, 0, BLOCK), block_bytes(0)),
            (block_key(name, 9, 1, 10_000), tail.clone()),
            (block_key(name, 10, 0, BLOCK), short),
        ] {
            store
                .put(&key, &compress(algo, &raw).unwrap(), None)
                .unwrap();
        }
        let cfg = HostConfig {
            fill: Some(fill),
            ..HostConfig::default()
        };
        let host = fx.host(fx.vol.clone(), cfg);
        let c = fx.client("z");
        let whole = c.block(9, BLOCK + 10_000, 0, Ask::Fetch).unwrap().unwrap();
        assert!(bytes_of(whole) == block_bytes(0), "{fill:?} {algo:?}");
        match c.block(9, BLOCK + 10_000, 1, Ask::Fetch).unwrap().unwrap() {
            SourcedBlock::Memory(m) => assert!((*m).as_ref() == &tail[..], "{fill:?} {algo:?}"),
            SourcedBlock::File(_) => panic!("no disk cache here"),
        }
        assert!(
            c.block(10, BLOCK, 0, Ask::Fetch).unwrap().is_err(),
            "{algo:?}"
        );
        assert_eq!(host.stats().fetch_errors.load(Ordering::Relaxed), 1);
        assert_eq!(
            host.stats().fetched_bytes.load(Ordering::Relaxed),
            u64::from(BLOCK) + 10_000
        );
    }
}

/// With a memory table per NUMA node, each node's VMs get blocks held in
/// their node's table: a block is fetched once for the host (GET count)
/// and copied to each other node that asks, whether the nodes ask one
/// after the other or at once. (Node 1 need not exist here: placing the
/// pages is then refused and logged, and the tables still work.)
#[test]
fn blocks_are_fetched_once_and_held_once_per_numa_node() {
    let fx = Fixture::new(9);
    let cfg = HostConfig {
        nodes: vec![0, 1],
        ..HostConfig::default()
    };
    let host = fx.host(fx.vol.clone(), cfg);
    let (a, b) = (fx.client_on("a", Some(0)), fx.client_on("b", Some(1)));
    // Node 0 first, then node 1: copies, no second GET.
    for i in 0..4 {
        assert!(bytes_of(get(&a, i).unwrap().unwrap()) == block_bytes(i));
    }
    for i in 0..4 {
        assert!(bytes_of(get(&b, i).unwrap().unwrap()) == block_bytes(i));
    }
    let stats = host.stats();
    assert_eq!(stats.fetches.load(Ordering::Relaxed), 4);
    assert_eq!(stats.node_copies.load(Ordering::Relaxed), 4);
    // Both nodes at once: still one GET per block.
    let go = Barrier::new(2);
    std::thread::scope(|s| {
        for c in [&a, &b] {
            let go = &go;
            s.spawn(move || {
                go.wait();
                for i in 4..8 {
                    assert!(bytes_of(get(c, i).unwrap().unwrap()) == block_bytes(i));
                }
            });
        }
    });
    assert_eq!(stats.fetches.load(Ordering::Relaxed), 8);
    assert_eq!(stats.node_copies.load(Ordering::Relaxed), 8);
    let by_node = host.memory_by_node();
    assert_eq!(
        by_node,
        vec![
            (Some(0), 8 * u64::from(BLOCK), 8),
            (Some(1), 8 * u64::from(BLOCK), 8)
        ]
    );
    // A small read asks only for a cached copy: another node's will do,
    // with no copy to its own node and no GET.
    assert!(bytes_of(get(&a, 8).unwrap().unwrap()) == block_bytes(8));
    let only = |c: &HostClient, i| c.block(7, 64 * BLOCK, i, Ask::CachedOnly);
    let b2 = fx.client_on("b2", Some(1));
    assert!(bytes_of(only(&b2, 8).unwrap().unwrap()) == block_bytes(8));
    assert!(only(&b2, 5).is_some(), "its own node's copy");
    let c9 = fx.client_on("c9", Some(0));
    assert!(only(&c9, 9).is_none(), "a block nobody holds");
    assert_eq!(stats.fetches.load(Ordering::Relaxed), 9);
    assert_eq!(stats.node_copies.load(Ordering::Relaxed), 8);
    assert_eq!(host.memory_by_node()[1].2, 8, "nothing copied to node 1");
    // A VM whose node the host does not list uses the first table: hits.
    let c = fx.client_on("c", Some(7));
    let hits = stats.memory_hits.load(Ordering::Relaxed);
    assert!(bytes_of(get(&c, 2).unwrap().unwrap()) == block_bytes(2));
    assert_eq!(stats.memory_hits.load(Ordering::Relaxed), hits + 1);
    assert_eq!(stats.fetches.load(Ordering::Relaxed), 9);
}

#[test]
fn errors_and_cached_only_misses_are_answered_not_fetched_twice() {
    let fx = Fixture::new(1);
    let host = fx.host(fx.vol.clone(), HostConfig::default());
    let c = fx.client("c");
    // A small random read's miss: nothing fetched, the reader goes on alone.
    assert!(c.block(7, 64 * BLOCK, 0, Ask::CachedOnly).is_none());
    assert_eq!(host.stats().fetches.load(Ordering::Relaxed), 0);
    // A block that is not in the bucket: an error, not a hang.
    let missing = c.block(8, BLOCK, 0, Ask::Fetch).unwrap();
    assert!(missing.is_err());
    // An index past the slice's end names no block.
    assert!(c.block(7, BLOCK, 5, Ask::Fetch).unwrap().is_err());
    // On a thread that must not wait: `WouldBlock` at once, and the fetch
    // started, so the retry finds it.
    {
        let _mark = sluice_api::wait::no_wait();
        let e = c.block(7, 64 * BLOCK, 0, Ask::Fetch).unwrap().unwrap_err();
        assert!(matches!(e, Error::WouldBlock), "{e:?}");
    }
    let b = bytes_of(c.block(7, 64 * BLOCK, 0, Ask::Fetch).unwrap().unwrap());
    assert!(b == block_bytes(0));
    assert_eq!(
        host.stats().fetches.load(Ordering::Relaxed),
        2,
        "8/0 and 7/0"
    );
}

#[test]
fn a_disk_cache_hit_is_a_checked_read_only_file_and_damage_is_checked_by_the_host() {
    let fx = Fixture::new(2);
    let cached = fx.cached_volume();
    let key = block_key(fx.vol.name(), 7, 1, BLOCK);
    {
        let host = fx.host(cached.clone(), HostConfig::default());
        let c = fx.client("warm");
        bytes_of(get(&c, 1).unwrap().unwrap());
        eventually("the block reaches the disk cache", || {
            cached.store.is_cached(&key)
        });
        drop(host);
    }
    // A new host (a restart): its memory is empty, its disk cache is not.
    let host = fx.host(cached.clone(), HostConfig::default());
    let c = fx.client("cold");
    let got = get(&c, 1).unwrap().unwrap();
    let SourcedBlock::File(cf) = &got else {
        panic!("not a file: {got:?}");
    };
    assert!(cf.crcs.is_some(), "the CRCs come with it");
    // Opened read-only: the client cannot write the host's cache file.
    assert!(rustix::io::pwrite(cf.file.as_fd(), b"x", 0).is_err());
    assert!(bytes_of(got) == block_bytes(1));
    assert_eq!(host.stats().fetches.load(Ordering::Relaxed), 0);
    assert_eq!(host.stats().file_hits.load(Ordering::Relaxed), 1);
    // A false report does not make the host drop a sound copy...
    c.damaged(7, 64 * BLOCK, 1, "a lie");
    let again = get(&c, 1).unwrap().unwrap();
    assert!(matches!(again, SourcedBlock::File(_)));
    assert!(cached.store.is_cached(&key));
    // ...a true one does: a byte flipped on disk fails the client's check
    // where it landed, the host finds it too and drops the file, and the
    // block is fetched again (from memory from then on).
    let mut files = Vec::new();
    walk(&fx.dir.path().join("cache"), &mut files);
    let file = files
        .iter()
        .find(|f| f.to_string_lossy().ends_with(&format!("7_1_{BLOCK}")))
        .expect("the cache file");
    let mut bytes = std::fs::read(file).unwrap();
    bytes[1000] ^= 0xff;
    std::fs::write(file, &bytes).unwrap();
    let SourcedBlock::File(cf) = get(&c, 1).unwrap().unwrap() else {
        panic!("not a file");
    };
    let mut buf = vec![0u8; BLOCK as usize];
    let (crcs, payload) = cf.crcs.clone().unwrap();
    let landed = BufDest::new(&mut buf).put(Fragment::File {
        file: &cf.file,
        off: 0,
        len: BLOCK as usize,
        crcs: Some(SegmentCrcs {
            segment: SEGMENT,
            crcs: &crcs,
            payload,
        }),
    });
    let Err(Error::Corrupt(why)) = landed else {
        panic!("a damaged copy passed: {landed:?}");
    };
    c.damaged(7, 64 * BLOCK, 1, &why);
    eventually("the host drops the damaged copy", || {
        !cached.store.is_cached(&key)
    });
    assert!(bytes_of(get(&c, 1).unwrap().unwrap()) == block_bytes(1));
    assert_eq!(host.stats().fetches.load(Ordering::Relaxed), 1);
}

fn walk(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, out);
        } else {
            out.push(p);
        }
    }
}

#[test]
fn garbage_floods_and_dead_clients_never_stop_the_others() {
    let fx = Fixture::new(4);
    let cfg = HostConfig {
        max_outstanding: 8,
        ..HostConfig::default()
    };
    let host = fx.host(fx.vol.clone(), cfg);
    let good = fx.client("good");
    // Garbage before and after a HELLO, a descriptor sent to the host, an
    // oversized packet, a second HELLO: each is dropped.
    let hello = Request::Hello {
        version: wire::VERSION,
        volume: fx.vol.format.uuid.clone(),
        name: "bad".into(),
        node: None,
    }
    .encode();
    let raw = |first: &[&[u8]]| {
        let s = socket::connect(&fx.socket()).unwrap();
        for p in first {
            let _ = socket::send(s.as_fd(), p, None);
        }
        s
    };
    let _g1 = raw(&[b"\x01garbage"]);
    let _g2 = raw(&[&hello, &[0x02; 31]]);
    let _g3 = raw(&[&hello, &hello]);
    let _g4 = raw(&[&hello, &vec![0x02; MAX_MESSAGE + 100]]);
    let g5 = raw(&[&hello]);
    let get = |tag: u64| {
        Request::Get {
            tag,
            block: BlockName {
                slice: 7,
                index: (tag % 4) as u32,
                slice_size: 64 * BLOCK,
            },
            flags: 0,
        }
        .encode()
    };
    socket::send(g5.as_fd(), &get(1), Some(g5.as_fd())).unwrap();
    eventually("the bad clients are dropped", || {
        host.stats().dropped.load(Ordering::Relaxed) >= 5
    });
    // A flood: GETs sent and replies never read. The host stops reading
    // it at its bound; the others are served meanwhile.
    let flood = raw(&[&hello]);
    rustix::net::sockopt::set_socket_timeout(
        &flood,
        rustix::net::sockopt::Timeout::Send,
        Some(Duration::from_millis(200)),
    )
    .unwrap();
    let mut sent = 0u64;
    while socket::send(flood.as_fd(), &get(sent), None).is_ok() {
        sent += 1;
        assert!(sent < 1_000_000, "the host never stopped reading the flood");
    }
    for i in 0..4 {
        assert!(bytes_of(super::tests::get(&good, i).unwrap().unwrap()) == block_bytes(i));
    }
    let flooder = host
        .clients()
        .into_iter()
        .find(|v| v.name.starts_with("bad-") && v.counts[0] > 0)
        .expect("the flooding client is connected");
    assert!(
        flooder.outstanding <= 8 && flooder.counts[0] < sent,
        "read past its bound ({sent} sent): {flooder:?}"
    );
    // Dying mid-request: the flood's GETs are in flight when it goes.
    drop(flood);
    eventually("the dead clients are forgotten", || {
        host.clients().iter().all(|v| v.name.starts_with("good-"))
    });
    assert!(bytes_of(super::tests::get(&good, 2).unwrap().unwrap()) == block_bytes(2));
}

#[test]
fn a_vm_over_its_cache_share_pushes_out_its_own_blocks_not_the_others() {
    let fx = Fixture::new(12);
    let cfg = HostConfig {
        cache_bytes: 8 * u64::from(BLOCK),
        vm_cache_share: 4 * u64::from(BLOCK),
        ..HostConfig::default()
    };
    let host = fx.host(fx.vol.clone(), cfg);
    // No mappings of their own: every read asks the host.
    let client = |name: &str| {
        HostClient::start(ClientConfig {
            path: fx.socket(),
            volume: fx.vol.format.uuid.clone(),
            name: name.into(),
            mappings: 0,
            locate: None,
            node: None,
        })
    };
    let (quiet, streamer) = (client("quiet"), client("streamer"));
    for i in 0..3 {
        bytes_of(get(&quiet, i).unwrap().unwrap());
    }
    // The streamer reads 9 blocks: it may hold 4 of the table's 8.
    for i in 3..12 {
        assert!(bytes_of(get(&streamer, i).unwrap().unwrap()) == block_bytes(i));
    }
    assert_eq!(
        host.memory_used().1,
        7,
        "3 of the quiet VM's, 4 of the streamer's"
    );
    let fetches = host.stats().fetches.load(Ordering::Relaxed);
    let hits = host.stats().memory_hits.load(Ordering::Relaxed);
    for i in 0..3 {
        assert!(bytes_of(get(&quiet, i).unwrap().unwrap()) == block_bytes(i));
    }
    assert_eq!(
        host.stats().fetches.load(Ordering::Relaxed),
        fetches,
        "none fetched again"
    );
    assert_eq!(host.stats().memory_hits.load(Ordering::Relaxed), hits + 3);
}

#[test]
fn a_client_of_another_volume_is_refused() {
    let fx = Fixture::new(1);
    let host = fx.host(fx.vol.clone(), HostConfig::default());
    let other = HostClient::start(ClientConfig {
        path: fx.socket(),
        volume: "00000000-0000-0000-0000-000000000000".into(),
        name: "stranger".into(),
        mappings: 4,
        locate: None,
        node: None,
    });
    assert!(!other.attached());
    assert!(other.block(7, 64 * BLOCK, 0, Ask::Fetch).is_none());
    assert!(host.clients().is_empty());
    assert_eq!(host.stats().fetches.load(Ordering::Relaxed), 0);
}

#[test]
fn clients_serve_standalone_while_the_host_restarts_and_attach_again() {
    let fx = Fixture::new(2);
    let c = fx.client("early");
    assert!(!c.attached(), "no host yet");
    assert!(get(&c, 0).is_none(), "standalone");
    let host = fx.host(fx.vol.clone(), HostConfig::default());
    eventually("attached", || c.attached());
    let mapped = get(&c, 0).unwrap().unwrap();
    drop(host);
    // Gone: blocks it had mapped stay readable; others are standalone.
    eventually("detached", || get(&c, 1).is_none());
    assert!(bytes_of(mapped) == block_bytes(0));
    let host = fx.host(fx.vol.clone(), HostConfig::default());
    eventually("attached again", || c.attached());
    assert!(bytes_of(get(&c, 1).unwrap().unwrap()) == block_bytes(1));
    assert_eq!(host.clients().len(), 1);
    assert!(c.counters().attaches.load(Ordering::Relaxed) >= 2);
}

#[test]
fn the_control_socket_is_born_private() {
    let fx = Fixture::new(0);
    let _host = fx.host(fx.vol.clone(), HostConfig::default());
    let mode = std::os::unix::fs::MetadataExt::mode(&std::fs::metadata(fx.socket()).unwrap());
    assert_eq!(mode & 0o777, 0o600);
}
