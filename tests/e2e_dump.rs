//! End-to-end: `sluice dump` and `sluice load` move a volume's metadata
//! between SQLite and Redis and back, and to and from JuiceFS's own
//! `juicefs dump`/`juicefs load`; the files read back equal through a
//! mount each time (the blocks stay in the bucket, named by the same slice
//! ids).

mod common;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Mount, RedisServer, Volume, Watchdog, sluice, sluice_ok, text};

/// What a tree holds: relative path → (kind and content, nlink-relevant
/// inode group, xattr).
type Tree = BTreeMap<Vec<u8>, String>;

fn setxattr(path: &Path, name: &str, value: &[u8]) {
    let p = CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    // SAFETY: both strings are NUL-terminated; value is a valid buffer.
    let r = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "setxattr {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

fn getxattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let p = CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: as in setxattr; buf is writable for its length.
    let r = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (r >= 0).then(|| {
        buf.truncate(r as usize);
        buf
    })
}

/// Files of every kind the dump format carries.
fn populate(root: &Path) {
    let data: Vec<u8> = (0..(3 << 20) + 4321)
        .map(|i: u32| (i % 239) as u8)
        .collect();
    fs::write(root.join("data.bin"), &data).unwrap();
    fs::create_dir_all(root.join("dir/sub")).unwrap();
    fs::write(root.join("dir/sub/small.txt"), b"hello dump\n").unwrap();
    // Sparse, past the first 64 MiB chunk.
    let f = fs::File::create(root.join("sparse")).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"far away", 70 << 20).unwrap();
    drop(f);
    std::os::unix::fs::symlink("dir/sub/small.txt", root.join("link")).unwrap();
    fs::hard_link(root.join("dir/sub/small.txt"), root.join("hard")).unwrap();
    setxattr(&root.join("data.bin"), "user.note", b"a\0b\"c%d");
    let odd = root.join(std::ffi::OsString::from_vec(b"odd-\xff-name".to_vec()));
    fs::write(odd, b"not UTF-8").unwrap();
}

/// Everything `populate` made, as read through a mount.
fn read_tree(root: &Path) -> Tree {
    let mut out = Tree::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in fs::read_dir(root.join(&rel)).unwrap() {
            let e = e.unwrap();
            let rel = rel.join(e.file_name());
            let path = root.join(&rel);
            let meta = fs::symlink_metadata(&path).unwrap();
            let what = if meta.file_type().is_symlink() {
                format!("link -> {}", fs::read_link(&path).unwrap().display())
            } else if meta.is_dir() {
                stack.push(rel.clone());
                format!("dir {:o}", meta.mode() & 0o7777)
            } else {
                let bytes = fs::read(&path).unwrap();
                let sum: u64 = bytes
                    .iter()
                    .enumerate()
                    .map(|(i, &b)| (i as u64 + 1) * u64::from(b))
                    .sum();
                format!(
                    "file {:o} len {} nlink {} sum {sum} xattr {:?}",
                    meta.mode() & 0o7777,
                    bytes.len(),
                    meta.nlink(),
                    getxattr(&path, "user.note")
                )
            };
            out.insert(rel.into_os_string().into_vec(), what);
        }
    }
    out
}

fn mount_and_read(meta_url: &str, dir: &Path, name: &str) -> Tree {
    let mnt = dir.join(name);
    fs::create_dir_all(&mnt).unwrap();
    let mount = Mount::start(
        meta_url,
        &mnt,
        &dir.join(format!("{name}.log")),
        &["--no-metrics"],
    );
    let tree = read_tree(&mount.path);
    mount.unmount();
    tree
}

#[test]
fn a_volume_moves_from_sqlite_to_redis_and_back() {
    let _dog = Watchdog::new("dump-move", Duration::from_secs(600));
    let Some(redis) = RedisServer::start("e2e_dump") else {
        return;
    };
    let vol = Volume::format("dump", &["--trash-days", "0"]);
    let mount = vol.mount("mnt");
    populate(&mount.path);
    let original = read_tree(&mount.path);
    mount.unmount();
    assert!(original.len() >= 8, "{original:?}");

    let dir = vol.dir.path();
    let first = dir.join("first.json");
    sluice_ok(&["dump", &vol.meta_url, first.to_str().unwrap()]);
    let redis_url = redis.url(1);
    sluice_ok(&["load", &redis_url, first.to_str().unwrap()]);
    assert_eq!(mount_and_read(&redis_url, dir, "on-redis"), original);

    let second = dir.join("second.json");
    sluice_ok(&["dump", &redis_url, second.to_str().unwrap()]);
    let back = format!("sqlite3://{}", dir.join("back.db").display());
    sluice_ok(&["load", &back, second.to_str().unwrap()]);
    assert_eq!(mount_and_read(&back, dir, "back"), original);
    // The same metadata, whichever engine held it.
    let third = dir.join("third.json");
    sluice_ok(&["dump", &back, third.to_str().unwrap()]);
    // (Mounting `back` opened one more session: the session counter moved.)
    let without_sessions = |p: &Path| -> String {
        fs::read_to_string(p)
            .unwrap()
            .lines()
            .filter(|l| !l.contains("\"nextSession\""))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(without_sessions(&second), without_sessions(&third));

    // A store that already holds a volume is never loaded over.
    let again = sluice(&["load", &back, first.to_str().unwrap()]);
    assert!(!again.status.success(), "{}", text(&again));
    // A broken dump is refused with a clear error and loads nothing.
    let full = fs::read_to_string(&first).unwrap();
    let cut = dir.join("cut.json");
    fs::write(&cut, &full[..full.len() / 2]).unwrap();
    let fresh = format!("sqlite3://{}", dir.join("fresh.db").display());
    let bad = sluice(&["load", &fresh, cut.to_str().unwrap()]);
    assert!(!bad.status.success(), "{}", text(&bad));
    let after = sluice(&["load", &fresh, first.to_str().unwrap()]);
    assert!(
        after.status.success(),
        "a failed load left the store unusable: {}",
        text(&after)
    );
}

#[test]
fn a_dump_goes_to_standard_output_without_a_file() {
    let vol = Volume::format("dump", &[]);
    // To standard output when no FILE is given.
    let out = sluice(&["dump", &vol.meta_url]);
    assert!(out.status.success(), "{}", text(&out));
    let dumped: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(dumped["FSTree"].is_object() && dumped["Counters"].is_object());
    assert_eq!(dumped["Setting"]["Name"], "dump");
}

#[test]
fn dumps_move_between_sluice_and_juicefs() {
    let _dog = Watchdog::new("dump-juicefs", Duration::from_secs(600));
    let Some(jfs) = std::env::var_os("SLUICE_JUICEFS_BIN").map(PathBuf::from) else {
        eprintln!("dumps_move_between_sluice_and_juicefs: skipped: SLUICE_JUICEFS_BIN is not set");
        return;
    };
    let vol = Volume::format("dump", &["--trash-days", "0"]);
    let mount = vol.mount("mnt");
    populate(&mount.path);
    let original = read_tree(&mount.path);
    mount.unmount();
    let dir = vol.dir.path();
    let run = |args: &[&str]| {
        let out = Command::new(&jfs)
            .args(args)
            .output()
            .expect("juicefs runs");
        assert!(out.status.success(), "juicefs {args:?}: {}", text(&out));
    };

    // juicefs dump → sluice load.
    let theirs = dir.join("theirs.json");
    run(&["dump", &vol.meta_url, theirs.to_str().unwrap()]);
    let ours_db = format!("sqlite3://{}", dir.join("from-juicefs.db").display());
    sluice_ok(&["load", &ours_db, theirs.to_str().unwrap()]);
    assert_eq!(mount_and_read(&ours_db, dir, "from-juicefs"), original);

    // sluice dump → juicefs load, read back by sluice.
    let ours = dir.join("ours.json");
    sluice_ok(&["dump", &vol.meta_url, ours.to_str().unwrap()]);
    let their_db = format!("sqlite3://{}", dir.join("by-juicefs.db").display());
    run(&["load", &their_db, ours.to_str().unwrap()]);
    assert_eq!(mount_and_read(&their_db, dir, "by-juicefs"), original);
}
