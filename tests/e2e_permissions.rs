//! End-to-end permission rules through a kernel mount of the real `sluice`
//! binary, checked as an unprivileged user (the engine lets root do
//! anything): `ftruncate(2)` on a descriptor opened for writing works
//! whatever the file's mode, as on a local file system, while `truncate(2)`
//! by path still obeys the mode.

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
