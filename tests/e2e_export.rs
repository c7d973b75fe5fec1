//! End-to-end: a guest confined with `sluice serve --export` (the real
//! daemon, driven by the virtio-fs driver harness) cannot reach another
//! tenant's deleted files through the trash, nor keep using a directory
//! the host moved out of its export; with and without `--read-only`.

mod common;

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{Serve, Volume, Watchdog};
use sluice_benches::virtiofs::wire::ROOT_ID;
use sluice_benches::virtiofs::{Device, DeviceOptions, FuseQueue, HarnessError};

/// The trash's first hour directory: the node id a guest would guess.
const TRASH_HOUR: u64 = 0x7FFF_FFFF_1000_0001;

fn serve(vol: &Volume, socket: &Path, read_only: bool) -> Serve {
    serve_with(vol, socket, if read_only { &["--read-only"] } else { &[] })
}

fn serve_with(vol: &Volume, socket: &Path, extra: &[&str]) -> Serve {
    let mut args = vec!["--export", "vm1", "--no-pin", "--cache-size", "64"];
    args.extend_from_slice(extra);
    Serve::start(&vol.meta_url, socket, &args)
}

fn errno<T: std::fmt::Debug>(r: Result<T, HarnessError>) -> i32 {
    match r {
        Err(HarnessError::Errno { errno, .. }) => errno,
        other => panic!("expected an error reply, got {other:?}"),
    }
}

#[test]
fn a_confined_guest_never_reaches_the_trash_or_what_left_its_export() {
    let _dog = Watchdog::new("export", Duration::from_secs(300));
    let vol = Volume::format("export", &["--trash-days", "1"]);
    let mount = vol.mount("host");
    let host = mount.path.clone();
    fs::create_dir_all(host.join("other-tenant")).unwrap();
    fs::create_dir_all(host.join("vm1/held")).unwrap();
    fs::create_dir_all(host.join("vm1/held2")).unwrap();
    fs::write(host.join("vm1/held/data"), b"guest data").unwrap();
    fs::write(host.join("vm1/held2/data"), b"guest data").unwrap();
    fs::write(host.join("other-tenant/passwords.txt"), b"secret").unwrap();
    fs::remove_file(host.join("other-tenant/passwords.txt")).unwrap();

    for (round, read_only) in [(0, false), (1, true)] {
        let socket = vol.dir.path().join(format!("vm1-{round}.sock"));
        let _serve = serve(&vol, &socket, read_only);
        let mut device = Device::connect(
            &socket,
            DeviceOptions {
                request_queues: 1,
                queue_size: 256,
                memory_size: 4 << 20,
            },
        )
        .expect("connect");
        let mut q = FuseQueue::new(&mut device, 1, 64 << 10).expect("queue");
        q.init().expect("INIT");

        // The escape of issue 19: a directory made and removed goes to
        // the trash; its `..` must not lead there.
        if !read_only {
            let d = q.mkdir(ROOT_ID, b"x", 0o755).expect("MKDIR");
            q.rmdir(ROOT_ID, b"x").expect("RMDIR");
            assert_eq!(errno(q.lookup(d.nodeid, b"..")), libc::ESTALE);
            assert_eq!(errno(q.getattr(d.nodeid)), libc::ESTALE);
        } else {
            assert_eq!(errno(q.mkdir(ROOT_ID, b"x", 0o755)), libc::EROFS);
        }
        // Guessed node ids of the trash, and its name.
        assert_eq!(errno(q.getattr(TRASH_HOUR)), libc::EBADF);
        assert_eq!(errno(q.lookup(TRASH_HOUR, b"..")), libc::ESTALE);
        assert_eq!(errno(q.lookup(ROOT_ID, b".trash")), libc::ENOENT);
        let root = q.lookup(ROOT_ID, b"..").expect("`..` at the root");
        assert_eq!(root.nodeid, ROOT_ID, "`..` at the root is the root");
        // `..` from deep inside stays inside.
        let held_name = ["held", "held2"][round];
        let held = q
            .lookup(ROOT_ID, held_name.as_bytes())
            .expect("LOOKUP held");
        let up = q.lookup(held.nodeid, b"..").expect("`..` of held");
        assert_eq!(up.nodeid, ROOT_ID);
        let data = q.lookup(held.nodeid, b"data").expect("LOOKUP data");
        assert_eq!(q.getattr(data.nodeid).expect("GETATTR").size, 10);

        // The host moves the held directory out of the export: within the
        // recheck time (1 s) the guest can no longer use it, or the file in it.
        fs::rename(
            host.join("vm1").join(held_name),
            host.join("other-tenant").join(held_name),
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match q.getattr(held.nodeid) {
                Err(HarnessError::Errno { errno, .. }) => {
                    assert_eq!(errno, libc::ESTALE);
                    break;
                }
                Ok(_) => {
                    assert!(Instant::now() < deadline, "still reachable after 30 s");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(errno(q.lookup(held.nodeid, b"data")), libc::ESTALE);
        assert_eq!(errno(q.lookup(held.nodeid, b"..")), libc::ESTALE);
        assert_eq!(errno(q.opendir(held.nodeid)), libc::ESTALE);
        assert_eq!(errno(q.getattr(data.nodeid)), libc::ESTALE);
        assert_eq!(
            errno(q.open(data.nodeid, libc::O_RDONLY as u32)),
            libc::ESTALE
        );
    }
    mount.unmount();
}

/// The per-guest limits of `sluice serve`, on the wire: past each one a
/// request answers its errno and does nothing, READDIRPLUS still lists
/// every name, and the daemon says once which flag to raise.
#[test]
fn a_guest_is_held_to_its_limits() {
    let _dog = Watchdog::new("export-limits", Duration::from_secs(300));
    let vol = Volume::format("limits", &[]);
    let mount = vol.mount("host");
    for d in ["d0", "d1", "d2", "d3"] {
        fs::create_dir_all(mount.path.join("vm1").join(d)).unwrap();
    }
    let socket = vol.dir.path().join("vm1.sock");
    let serve = serve_with(
        &vol,
        &socket,
        &[
            "--max-handles",
            "2",
            "--max-nodes",
            "2",
            "--max-xattr-size",
            "16",
        ],
    );
    let mut device = Device::connect(
        &socket,
        DeviceOptions {
            request_queues: 1,
            queue_size: 256,
            memory_size: 4 << 20,
        },
    )
    .expect("connect");
    let mut q = FuseQueue::new(&mut device, 1, 64 << 10).expect("queue");
    q.init().expect("INIT");

    let d0 = q.lookup(ROOT_ID, b"d0").expect("LOOKUP d0");
    q.lookup(ROOT_ID, b"d1").expect("LOOKUP d1");
    assert_eq!(errno(q.lookup(ROOT_ID, b"d2")), libc::ENFILE);
    assert_eq!(errno(q.mkdir(ROOT_ID, b"new", 0o755)), libc::ENFILE);
    assert!(
        !mount.path.join("vm1/new").exists(),
        "a refused MKDIR made nothing"
    );

    let dh = q.opendir(ROOT_ID).expect("OPENDIR");
    let listed = q
        .readdirplus(ROOT_ID, dh, 0, 64 << 10)
        .expect("READDIRPLUS");
    let mut names: Vec<(String, bool)> = listed
        .iter()
        .filter(|e| e.name != b"." && e.name != b"..")
        .map(|e| {
            (
                String::from_utf8_lossy(&e.name).into_owned(),
                e.entry.nodeid != 0,
            )
        })
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            ("d0".to_string(), true),
            ("d1".to_string(), true),
            ("d2".to_string(), false),
            ("d3".to_string(), false)
        ],
        "every name is listed; nodes only within the limit"
    );

    let dh2 = q.opendir(d0.nodeid).expect("a second handle");
    assert_eq!(errno(q.opendir(d0.nodeid)), libc::ENFILE);
    q.releasedir(d0.nodeid, dh2).expect("RELEASEDIR");
    let dh2 = q.opendir(d0.nodeid).expect("room again");
    q.releasedir(d0.nodeid, dh2).expect("RELEASEDIR");
    q.releasedir(ROOT_ID, dh).expect("RELEASEDIR");
    drop(q);
    drop(device);
    drop(serve);
    let log = fs::read_to_string(socket.with_extension("log")).unwrap();
    assert!(
        log.contains("--max-nodes") && log.contains("--max-handles"),
        "{log}"
    );
    mount.unmount();
}
