//! Removing `sluice serve`'s socket files however the daemon ends: a
//! SIGTERM (which exits at once, without unwinding), a start that fails
//! once the sockets exist, a crash.
//!
//! The daemon itself cannot: once sandboxed it runs as an unprivileged user
//! under Landlock and may not unlink in the directory of its sockets
//! (`/run/sluice`, root's). So before the sandbox is set up, while the
//! process still has one thread and is root, [`remove_at_exit`] forks a
//! helper that keeps those rights and does nothing else: it closes every
//! descriptor but one end of a pipe, blocks in `read` until the daemon is
//! gone (the kernel closes the daemon's end whatever way it ends), removes
//! each socket that is still the one the daemon bound (same device and
//! inode: a new daemon may have bound the path since), and exits.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// A socket file to remove: its path and the identity it had when bound.
struct Bound {
    path: CString,
    dev: u64,
    ino: u64,
}

/// Starts the helper that removes `paths` (socket files this process bound)
/// when this process has ended. Does nothing when none of them exists, and
/// only logs why when the process already has several threads (a fork
/// could copy a lock another thread holds) or the fork fails: the sockets
/// are then removed only where the daemon ends by returning.
pub fn remove_at_exit(paths: &[PathBuf]) {
    let bound: Vec<Bound> = paths
        .iter()
        .filter_map(|p| {
            let meta = std::fs::symlink_metadata(p).ok()?;
            Some(Bound {
                path: CString::new(p.as_os_str().as_bytes()).ok()?,
                dev: meta.dev(),
                ino: meta.ino(),
            })
        })
        .collect();
    if bound.is_empty() {
        return;
    }
    if threads() != Some(1) {
        log::warn!("the sockets will stay behind if the daemon is killed: it has started threads");
        return;
    }
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two descriptors for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        log::warn!(
            "the sockets will stay behind if the daemon is killed: pipe2: {}",
            std::io::Error::last_os_error()
        );
        return;
    }
    let [read_end, write_end] = fds;
    // SAFETY: the process has one thread (checked above), so the child
    // inherits no lock held elsewhere; it runs `helper`, which never
    // returns.
    match unsafe { libc::fork() } {
        0 => helper(read_end, &bound),
        -1 => {
            log::warn!(
                "the sockets will stay behind if the daemon is killed: fork: {}",
                std::io::Error::last_os_error()
            );
            // SAFETY: both descriptors are ours and used nowhere else.
            unsafe {
                libc::close(read_end);
                libc::close(write_end);
            }
        }
        // The daemon keeps the write end open for its whole life (it is
        // close-on-exec, and the daemon never executes anything).
        _ => {
            // SAFETY: the read end is the helper's; the daemon closes its copy.
            unsafe { libc::close(read_end) };
        }
    }
}

/// The helper process: waits for the daemon to end, removes the sockets
/// still its own, exits.
fn helper(read_end: i32, bound: &[Bound]) -> ! {
    // SAFETY: plain system calls on this process's own descriptors and
    // signal dispositions; `bound`'s paths are NUL-terminated and alive.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, c"sluice-sockets".as_ptr());
        // SIGTERM and SIGINT stay blocked (the daemon blocked them before
        // it forked): the helper outlives a signal sent to the group, and
        // goes when the daemon has.
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
        // Hold nothing of the daemon's open: no socket that would keep a
        // client waiting, no file, no log pipe. Only the pipe's read end.
        let keep = read_end as u32;
        if keep > 0 {
            libc::syscall(libc::SYS_close_range, 0u32, keep - 1, 0u32);
        }
        libc::syscall(libc::SYS_close_range, keep + 1, u32::MAX, 0u32);
        let mut byte = 0u8;
        loop {
            let n = libc::read(read_end, (&mut byte as *mut u8).cast(), 1);
            let interrupted = std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR);
            if n == 0 || (n < 0 && !interrupted) {
                break;
            }
        }
        for b in bound {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::lstat(b.path.as_ptr(), &mut st) == 0
                && st.st_dev == b.dev
                && st.st_ino == b.ino
            {
                libc::unlink(b.path.as_ptr());
            }
        }
        libc::_exit(0)
    }
}

/// The number of threads of this process (`Threads:` in /proc/self/status).
fn threads() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))?
        .trim()
        .parse()
        .ok()
}
