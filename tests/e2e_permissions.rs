//! End-to-end permission rules through a kernel mount of the real `sluice`
//! binary, checked as an unprivileged user (the engine lets root do
//! anything): `ftruncate(2)` on a descriptor opened for writing works
//! whatever the file's mode, as on a local file system, while `truncate(2)`
//! by path still obeys the mode; a `--x` program runs for a user who may not
//! read it; and a write or fallocate by a user without CAP_FSETID drops
//! setuid, and setgid as Linux does, while root's keep them.

mod common;

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use common::{Volume, Watchdog};

/// Runs `f` in a forked child as the user and group nobody (65534) and
/// returns its exit code. The child of a multi-threaded process may only
/// make async-signal-safe calls, so `f` makes raw system calls only
/// (paths are prepared before the fork).
fn as_nobody(f: impl FnOnce() -> i32) -> i32 {
    // SAFETY: fork has no preconditions; the child only makes system calls
    // (setgroups, setgid, setuid, those of `f`) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: plain system calls; a null list with size 0 is valid.
        let dropped = unsafe {
            libc::setgroups(0, std::ptr::null()) == 0
                && libc::setgid(65534) == 0
                && libc::setuid(65534) == 0
        };
        let code = if dropped { f() } else { 100 };
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above; `status` is a valid int.
    let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(rc, pid, "waitpid: {}", std::io::Error::last_os_error());
    assert!(libc::WIFEXITED(status), "the child did not exit: {status}");
    libc::WEXITSTATUS(status)
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("a path without NUL")
}

#[test]
fn ftruncate_of_a_0444_file_opened_for_writing() {
    let _dog = Watchdog::new("ftruncate_0444", Duration::from_secs(300));
    let vol = Volume::format("ftrunc", &[]);
    // The user nobody must reach the mount point inside the test directory.
    fs::set_permissions(vol.dir.path(), fs::Permissions::from_mode(0o755))
        .expect("open the test directory to nobody");
    let mount = vol.mount("mnt");
    let dir = mount.path.join("shared");
    fs::create_dir(&dir).expect("mkdir");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).expect("chmod 777");
    let path = dir.join("ro");
    let p = cstr(&path);
    // Exit codes: 0 all as expected, 1 open failed, 2 ftruncate failed
    // with EACCES (the bug), 3 ftruncate failed otherwise, 4 write failed,
    // 5 truncate(2) succeeded, 6 truncate(2) failed but not with EACCES.
    let code = as_nobody(|| {
        // SAFETY: `p` is a NUL-terminated path alive across these calls;
        // `fd` is the descriptor opened here.
        unsafe {
            let fd = libc::open(
                p.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                0o444,
            );
            if fd < 0 {
                return 1;
            }
            if libc::ftruncate(fd, 100) != 0 {
                return if errno() == libc::EACCES { 2 } else { 3 };
            }
            if libc::pwrite(fd, b"abc".as_ptr().cast(), 3, 100) != 3 {
                return 4;
            }
            if libc::ftruncate(fd, 50) != 0 {
                return if errno() == libc::EACCES { 2 } else { 3 };
            }
            libc::close(fd);
            if libc::truncate(p.as_ptr(), 10) == 0 {
                return 5;
            }
            if errno() != libc::EACCES {
                return 6;
            }
        }
        0
    });
    assert_eq!(code, 0, "as nobody: see the exit codes above");
    let md = fs::metadata(&path).expect("stat");
    assert_eq!((md.len(), md.mode() & 0o7777, md.uid()), (50, 0o444, 65534));
    mount.unmount();
}

/// A volume mounted with a directory everyone may write, and the mount.
fn open_to_nobody(name: &str) -> (Volume, common::Mount, std::path::PathBuf) {
    let vol = Volume::format(name, &[]);
    fs::set_permissions(vol.dir.path(), fs::Permissions::from_mode(0o755))
        .expect("open the test directory to nobody");
    let mount = vol.mount("mnt");
    let dir = mount.path.join("shared");
    fs::create_dir(&dir).expect("mkdir");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).expect("chmod 777");
    (vol, mount, dir)
}

/// xfstests generic/126: execve opens the program with
/// `O_RDONLY|__FMODE_EXEC`, which needs execute, not read.
#[test]
fn a_program_without_read_permission_runs() {
    let _dog = Watchdog::new("exec_711", Duration::from_secs(300));
    let (_vol, mount, dir) = open_to_nobody("exec");
    let prog = dir.join("true");
    fs::copy("/bin/true", &prog).expect("copy /bin/true");
    fs::set_permissions(&prog, fs::Permissions::from_mode(0o711)).expect("chmod 711");
    let p = cstr(&prog);
    let argv = [p.as_ptr(), std::ptr::null()];
    // Exit codes: 0 the program ran, 1 execv failed with EACCES (the bug),
    // 2 execv failed otherwise.
    let code = as_nobody(|| {
        // SAFETY: `p` and `argv` (NULL-terminated) outlive the call, which
        // only returns on failure.
        unsafe { libc::execv(p.as_ptr(), argv.as_ptr()) };
        if errno() == libc::EACCES { 1 } else { 2 }
    });
    assert_eq!(code, 0, "exec of a 0711 file as nobody: see the exit codes");
    mount.unmount();
}

/// A root-owned file with `mode` (and `gid`) holding some data.
fn setid_file(path: &Path, mode: u32, gid: u32) -> CString {
    fs::write(path, b"a").expect("write");
    std::os::unix::fs::chown(path, Some(0), Some(gid)).expect("chown");
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
    assert_eq!(fs::metadata(path).expect("stat").mode() & 0o7777, mode);
    cstr(path)
}

/// Opens `p` read-write and changes its data with `change`; exit code 0
/// when both worked, 1 when the open failed, 2 when the change did.
fn change_data(p: &CString, change: impl FnOnce(i32) -> bool) -> i32 {
    // SAFETY: `p` is a NUL-terminated path alive across the call.
    let fd = unsafe { libc::open(p.as_ptr(), libc::O_RDWR) };
    if fd < 0 {
        return 1;
    }
    let ok = change(fd);
    // SAFETY: closes the descriptor opened above.
    unsafe { libc::close(fd) };
    if ok { 0 } else { 2 }
}

fn mode_of(path: &Path) -> u32 {
    fs::metadata(path).expect("stat").mode() & 0o7777
}

/// xfstests generic/683–685 (and the write case of generic/193's rules):
/// a write, fallocate, punch hole or zero range by a user without
/// CAP_FSETID drops setuid always and setgid when the file is
/// group-executable or the user is outside its group; root's keep both.
#[test]
fn data_changes_by_a_user_drop_setuid_and_setgid() {
    let _dog = Watchdog::new("kill_suidgid", Duration::from_secs(300));
    let (_vol, mount, dir) = open_to_nobody("killpriv");
    type Change = fn(i32) -> bool;
    let write: Change = |fd| {
        // SAFETY: writes one byte from a static buffer to an open descriptor.
        unsafe { libc::pwrite(fd, b"b".as_ptr().cast(), 1, 1) == 1 }
    };
    let falloc: Change = |fd| {
        // SAFETY: fallocate on an open descriptor.
        unsafe { libc::fallocate(fd, 0, 0, 8192) == 0 }
    };
    let punch: Change = |fd| {
        // SAFETY: as above.
        unsafe {
            libc::fallocate(
                fd,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                0,
                4096,
            ) == 0
        }
    };
    let zero: Change = |fd| {
        // SAFETY: as above.
        unsafe { libc::fallocate(fd, libc::FALLOC_FL_ZERO_RANGE, 0, 4096) == 0 }
    };
    // (what, change, mode before, group, mode after a change by nobody)
    let cases: [(&str, Change, u32, u32, u32); 7] = [
        ("write", write, 0o6666, 0, 0o0666),
        ("write", write, 0o6666, 65534, 0o2666),
        ("write", write, 0o6676, 65534, 0o0676),
        ("fallocate", falloc, 0o6666, 0, 0o0666),
        ("fallocate", falloc, 0o6666, 65534, 0o2666),
        ("punch hole", punch, 0o6676, 65534, 0o0676),
        ("zero range", zero, 0o6666, 0, 0o0666),
    ];
    for (i, (what, change, before, gid, after)) in cases.into_iter().enumerate() {
        let path = dir.join(format!("s{i}"));
        let p = setid_file(&path, before, gid);
        assert_eq!(change_data(&p, change), 0, "{what} by root");
        assert_eq!(mode_of(&path), before, "{what} by root keeps {before:o}");
        let code = as_nobody(|| change_data(&p, change));
        assert_eq!(code, 0, "{what} of {before:o} (group {gid}) by nobody");
        assert_eq!(
            mode_of(&path),
            after,
            "{what} of {before:o} (group {gid}) by nobody"
        );
    }
    mount.unmount();
}
