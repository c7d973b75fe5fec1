//! The host daemon's protocol (`sluice-host`): the fuzzer's bytes become
//! the packets of one client of a real [`Host`] over its socket — a HELLO
//! or not, GETs of any block with any flags and tags, DAMAGED reports,
//! garbage, oversized packets, descriptors, a client that goes away with
//! requests in flight. Invariants: nothing panics; every reply the host
//! sends decodes; a GET is answered at most once, by tag; and after each
//! input a well-behaved client still gets a block, byte for byte, and the
//! host forgets the fuzzed client (no state left behind).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sluice_engine::block_key::block_key;
use sluice_engine::block_source::{Ask, BlockSource, SourcedBlock};
use sluice_engine::format::Compression;
use sluice_engine::meta::open_meta;
use sluice_engine::volume::{Volume, format_volume, open_volume};
use sluice_host::wire::{self, BlockName, MAX_MESSAGE, Reply, Request};
use sluice_host::{ClientConfig, Host, HostClient, HostConfig, socket};

/// The block size of the fuzzed volume (small: inputs fetch many).
const BLOCK: u32 = 64 << 10;
/// Blocks stored in slice 1 (the rest of any slice is missing).
const BLOCKS: u32 = 8;

struct World {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    vol: Arc<Volume>,
    host: Arc<Host>,
    good: Arc<HostClient>,
}

fn block_bytes(i: u32) -> Vec<u8> {
    (0..BLOCK)
        .map(|j| (j as u8).wrapping_mul(31) ^ i as u8)
        .collect()
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let meta =
            open_meta(&format!("sqlite3://{}/meta.db", dir.path().display())).expect("a database");
        format_volume(
            &*meta,
            "fuzz",
            &dir.path().join("bucket"),
            BLOCK >> 10,
            Compression::None,
            0,
        )
        .expect("a volume");
        let vol = open_volume(meta).expect("the volume");
        for i in 0..BLOCKS {
            let key = block_key(vol.name(), 1, i, BLOCK);
            vol.store.put(&key, &block_bytes(i), None).expect("a block");
        }
        let path = dir.path().join("host.sock");
        let listener = socket::listen(&path, None).expect("the socket");
        let cfg = HostConfig {
            cache_bytes: u64::from(BLOCK) * 4,
            fetchers: 2,
            max_outstanding: 4,
            max_clients: 64,
            // The fuzzed clients may hold half the table.
            vm_cache_share: u64::from(BLOCK) * 2,
            // A client that takes no reply (one whose own socket waits in
            // the host's queue keeps itself open) goes soon.
            reply_timeout: Duration::from_millis(300),
            fill: None,
            // Two memory tables (node 1 need not exist: its pages are then
            // placed nowhere), so fuzzed clients that name a node cross
            // the per-node flights and copies.
            nodes: vec![0, 1],
        };
        let host = Host::start(vol.clone(), cfg, listener).expect("the host");
        let good = HostClient::start(ClientConfig {
            path: path.clone(),
            volume: vol.format.uuid.clone(),
            name: "good".into(),
            // No mappings: every check below asks the host.
            mappings: 0,
            locate: None,
            node: None,
        });
        World {
            _dir: dir,
            path,
            vol,
            host,
            good,
        }
    })
}

/// Reads whatever the host sent to `sock` without waiting; every packet
/// must decode, and a tag be answered at most as often as it was asked
/// (`asked`: GETs sent per tag not yet answered).
fn drain(sock: &OwnedFd, asked: &mut std::collections::HashMap<u64, u64>) {
    let mut buf = Box::new([0u8; MAX_MESSAGE]);
    loop {
        let mut pfd = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(sock),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the call; no timeout.
        if unsafe { libc::poll(&mut pfd, 1, 0) } <= 0 {
            return;
        }
        match socket::recv(sock.as_fd(), &mut buf) {
            Ok(Some(p)) => match Reply::decode(&buf[..p.len]) {
                Ok(Reply::Block { tag, .. }) => {
                    let left = asked.get_mut(&tag).filter(|n| **n > 0);
                    let left = left.unwrap_or_else(|| panic!("tag {tag} answered unasked"));
                    *left -= 1;
                }
                Ok(Reply::Welcome { .. }) => {}
                Err(e) => panic!("the host sent a packet that does not decode: {e}"),
            },
            _ => return,
        }
    }
}

/// Takes bytes off the front of the input.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*b)
    }
    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
    fn u32(&mut self) -> u32 {
        let mut w = [0u8; 4];
        let b = self.take(4);
        w[..b.len()].copy_from_slice(b);
        u32::from_le_bytes(w)
    }
}

/// One input: a client's packets, then the well-behaved client's check.
pub fn run(data: &[u8]) {
    let w = world();
    let mut input = Input(data);
    let sock = match socket::connect(&w.path) {
        Ok(s) => s,
        Err(e) => panic!("the host stopped accepting: {e}"),
    };
    // A send that would block means the host stopped reading this client
    // (its bound): the input goes on, the check below must still pass.
    let _ = rustix::net::sockopt::set_socket_timeout(
        &sock,
        rustix::net::sockopt::Timeout::Send,
        Some(Duration::from_millis(50)),
    );
    let mut asked = std::collections::HashMap::new();
    let mut tag = 0u64;
    while let Some(op) = input.byte() {
        let packet = match op % 8 {
            0 | 1 => {
                let name = String::from_utf8_lossy(input.take(8)).into_owned();
                let volume = if op & 0x80 == 0 {
                    w.vol.format.uuid.clone()
                } else {
                    "0".repeat(wire::UUID_LEN)
                };
                Request::Hello {
                    version: if op & 0x40 == 0 { wire::VERSION } else { 9 },
                    volume,
                    name,
                    node: (op & 0x20 != 0).then_some(u16::from(op & 3)),
                }
                .encode()
            }
            2..=4 => {
                tag += 1;
                let shape = input.byte().unwrap_or(0);
                let block = BlockName {
                    slice: u64::from(shape % 3),
                    index: u32::from(input.byte().unwrap_or(0) % 12),
                    slice_size: if shape & 4 == 0 {
                        BLOCK * BLOCKS
                    } else {
                        input.u32()
                    },
                };
                let tag = if shape & 8 == 0 { tag } else { 1 };
                *asked.entry(tag).or_insert(0) += 1;
                Request::Get {
                    tag,
                    block,
                    flags: u32::from(shape >> 4) & 3,
                }
                .encode()
            }
            5 => Request::Damaged(BlockName {
                slice: 1,
                index: u32::from(input.byte().unwrap_or(0) % 10),
                slice_size: BLOCK * BLOCKS,
            })
            .encode(),
            6 => {
                let n = usize::from(input.byte().unwrap_or(0)) * 24;
                input.take(n).to_vec()
            }
            _ => {
                // A drain now and then, a descriptor, or a huge packet.
                match input.byte().unwrap_or(0) % 3 {
                    0 => {
                        drain(&sock, &mut asked);
                        continue;
                    }
                    1 => {
                        let _ = socket::send(sock.as_fd(), b"\x02", Some(sock.as_fd()));
                        continue;
                    }
                    _ => vec![2; MAX_MESSAGE + 1],
                }
            }
        };
        if socket::send(sock.as_fd(), &packet, None).is_err() {
            break;
        }
    }
    drain(&sock, &mut asked);
    // The client goes away with whatever it had in flight.
    drop(sock);
    // Everyone else is still served, each block fetched at most once.
    let i = u32::from(data.first().copied().unwrap_or(0)) % BLOCKS;
    let got = w
        .good
        .block(1, BLOCK * BLOCKS, i, Ask::Fetch)
        .expect("the good client is attached")
        .expect("the good client gets its block");
    let SourcedBlock::Memory(m) = got else {
        panic!("a memory block expected");
    };
    assert!((*m).as_ref() == &block_bytes(i)[..], "block {i} differs");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while w.host.clients().len() > 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the host never forgot a client that went away: {:?}",
            w.host.clients()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Blocks the host fetched so far (for the corpus test's summary).
pub fn fetches() -> u64 {
    world().host.stats().fetches.load(Ordering::Relaxed)
}
