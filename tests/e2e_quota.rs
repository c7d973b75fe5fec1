//! End-to-end: capacity and quotas through a kernel mount of the real
//! `sluice` binary. The volume's `--capacity` and `--inodes` give ENOSPC,
//! directory quotas (`sluice quota set`) give EDQUOT, usage follows the
//! writes, and `sluice quota check` finds the stored usage equal to the
//! tree's.

mod common;

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use common::{Volume, Watchdog, sluice, sluice_ok, text, write_refused};

const MIB: usize = 1 << 20;

/// Creates `path` with `len` bytes and fsyncs it: the first error, if any.
fn write_file(path: &Path, len: usize) -> std::io::Result<()> {
    let mut f = File::create(path)?;
    f.write_all(&vec![7u8; len])?;
    f.sync_all()
}

fn errno(r: std::io::Result<impl std::fmt::Debug>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e
            .raw_os_error()
            .unwrap_or_else(|| panic!("not an OS error: {e}")),
    }
}

/// Creates empty files in `dir` until one fails; returns how many were
/// made and the error number of the failure.
fn fill_inodes(dir: &Path, max: usize) -> (usize, i32) {
    for i in 0..max {
        if let Err(e) = File::create(dir.join(format!("n{i}"))) {
            return (i, e.raw_os_error().expect("an OS error"));
        }
    }
    panic!("{max} files fit in {}", dir.display());
}

fn statvfs(path: &Path) -> libc::statvfs {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("a path");
    // SAFETY: an all-zero statvfs is a valid value to be overwritten.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a valid out-pointer.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    assert_eq!(rc, 0, "statvfs: {}", std::io::Error::last_os_error());
    st
}

#[test]
fn volume_capacity_and_inodes_give_enospc() {
    let _dog = Watchdog::new("volume_limits", Duration::from_secs(300));
    let vol = Volume::format(
        "limits",
        &["--trash-days", "0", "--capacity", "1M", "--inodes", "8"],
    );
    let mount = vol.mount("mnt");
    let st = statvfs(&mount.path);
    assert_eq!(
        st.f_blocks * st.f_frsize,
        MIB as u64,
        "statfs reports the capacity as the total"
    );
    assert_eq!(st.f_files, 8, "statfs reports the inode limit");
    // 2 MiB do not fit 1 MiB: the commit is refused (at fsync here). What
    // of "big" landed before the refusal (`write_refused` says how much can)
    // goes as the file is emptied; the file itself stays, as unlinking it
    // would free its inode only at a RELEASE the kernel sends in the
    // background (an UNLINK may overtake it; below).
    write_refused(&mount.path.join("big"), 2 * MIB, libc::ENOSPC);
    // Half of it fits.
    write_file(&mount.path.join("half"), MIB / 2).expect("half the capacity fits");
    let st = statvfs(&mount.path);
    assert!(st.f_bavail * st.f_frsize <= (MIB / 2) as u64);
    // "big", "half" and the directory "e" are 3 of the 8 inodes.
    fs::create_dir(mount.path.join("e")).expect("mkdir e");
    let (made, err) = fill_inodes(&mount.path, 100);
    assert_eq!((made, err), (5, libc::ENOSPC), "8 inodes in all");
    assert_eq!(
        errno(fs::create_dir(mount.path.join("d"))),
        libc::ENOSPC,
        "a directory needs an inode too"
    );
    // Freeing an inode makes room. A directory, not one of the files: the
    // kernel sends a closed file's RELEASE in the background, and an
    // UNLINK may overtake it; the file is then still open when its last
    // name goes, and its inode is freed at that RELEASE, not at the unlink
    // (the likely cause of one failure under load). No handle keeps a
    // directory.
    fs::remove_dir(mount.path.join("e")).expect("rmdir");
    fs::create_dir(mount.path.join("d")).expect("room again");
    mount.unmount();
    // Raised while unmounted (as juicefs config does): the next mount takes it.
    sluice_ok(&["config", &vol.meta_url, "--inodes", "0"]);
    let mount = vol.mount("mnt");
    for i in 0..20 {
        File::create(mount.path.join(format!("d/m{i}"))).expect("no inode limit now");
    }
    mount.unmount();
}

/// The regression test of the e2e_quota flake: a child process forked
/// while a file is open closes its copy of the descriptor at exec, and the
/// kernel sends FLUSH for it. That FLUSH was the first to see the refused
/// commit and used up the handle's error: the owner's fsync then succeeded
/// on writes that were dropped. Only fsync may mark an error reported.
#[test]
fn fsync_reports_a_refused_commit_that_a_forked_childs_close_saw_first() {
    let _dog = Watchdog::new("forked_close", Duration::from_secs(300));
    let vol = Volume::format("forked", &["--trash-days", "0", "--capacity", "1M"]);
    let mount = vol.mount("mnt");
    let mut f = File::create(mount.path.join("big")).expect("create");
    f.write_all(&vec![7u8; 2 * MIB]).expect("buffered write");
    // fork + exec: the child's copy of `f` is closed at exec (close-on-exec),
    // which flushes the file's pages and sends FLUSH for the open file.
    let status = std::process::Command::new("true")
        .status()
        .expect("true runs");
    assert!(status.success());
    assert_eq!(
        errno(f.sync_all()),
        libc::ENOSPC,
        "fsync reports the refusal"
    );
    // Reported once: the next fsync and the close have nothing new.
    f.sync_all().expect("reported already");
    drop(f);
    mount.unmount();
}

#[test]
fn directory_quotas_give_edquot_and_check_clean() {
    let _dog = Watchdog::new("dir_quotas", Duration::from_secs(300));
    let vol = Volume::format("quotas", &["--trash-days", "0"]);
    let url = vol.meta_url.as_str();
    // Bad input gets a clear error.
    let bad = sluice(&["quota", "set", url, "--path", "/nope", "--inodes", "3"]);
    assert!(!bad.status.success() && text(&bad).contains("no such directory"));
    let bad = sluice(&["quota", "set", url, "--path", "/q", "--capacity", "-1"]);
    assert!(!bad.status.success() && text(&bad).contains("negative"));
    let bad = sluice(&["quota", "set", url, "--path", "q", "--inodes", "1"]);
    assert!(!bad.status.success() && text(&bad).contains("absolute"));

    sluice_ok(&[
        "quota",
        "set",
        url,
        "--path",
        "/q",
        "--capacity",
        "1M",
        "--create",
    ]);
    sluice_ok(&[
        "quota", "set", url, "--path", "/q/n", "--inodes", "3", "--create",
    ]);
    let mount = vol.mount("mnt");
    let q = mount.path.join("q");
    let n = q.join("n");
    // Space: 2 MiB do not fit /q's 1 MiB (nor do they below /q/n).
    write_refused(&q.join("big"), 2 * MIB, libc::EDQUOT);
    write_refused(&n.join("big"), 2 * MIB, libc::EDQUOT);
    write_file(&q.join("small"), 100_000).expect("fits");
    // Inodes: /q/n holds "big" (its data refused), two more fit.
    let (made, err) = fill_inodes(&n, 10);
    assert_eq!((made, err), (2, libc::EDQUOT));
    assert_eq!(errno(fs::create_dir(n.join("d"))), libc::EDQUOT);
    // A hard link into the full quota is refused too; outside it is not.
    assert_eq!(
        errno(fs::hard_link(q.join("small"), n.join("link"))),
        libc::EDQUOT
    );
    fs::hard_link(q.join("small"), mount.path.join("link")).expect("outside");
    // Unlimited outside the quotas.
    write_file(&mount.path.join("free"), 2 * MIB).expect("no quota at the root");
    // Moving a tree in moves its usage; removing frees.
    fs::create_dir_all(mount.path.join("t/u")).expect("tree");
    write_file(&mount.path.join("t/u/f"), 8192).expect("f");
    fs::rename(mount.path.join("t"), q.join("t")).expect("a tree moves in");
    fs::remove_file(n.join("n0")).expect("unlink");
    fs::create_dir(n.join("d")).expect("room again");
    mount.unmount();

    let check = sluice_ok(&["quota", "check", url, "--path", "/q"]);
    assert!(check.contains("consistent"), "{check}");
    let check = sluice_ok(&["quota", "check", url, "--path", "/q/n"]);
    assert!(check.contains("consistent"), "{check}");
    // /q/n: big, n1, d = 3 inodes; /q: big, small, n, t, t/u, t/u/f and
    // those 3.
    let got = sluice_ok(&["quota", "get", url, "--path", "/q/n"]);
    let row = got.lines().find(|l| l.starts_with("/q/n")).expect(&got);
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    assert_eq!((cells[4], cells[5]), ("3", "3"), "{got}");
    let listed = sluice_ok(&["quota", "list", url]);
    assert!(
        listed.contains("/q ") && listed.contains("/q/n"),
        "{listed}"
    );
    let got = sluice_ok(&["quota", "get", url, "--path", "/q"]);
    let row = got.lines().find(|l| l.starts_with("/q ")).expect(&got);
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    assert_eq!(cells[5], "9", "{got}");
    sluice_ok(&["quota", "delete", url, "--path", "/q/n"]);
    let gone = sluice(&["quota", "get", url, "--path", "/q/n"]);
    assert!(!gone.status.success() && text(&gone).contains("has no quota"));
}
