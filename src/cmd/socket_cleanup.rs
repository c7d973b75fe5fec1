//! Removing `sluice serve`'s socket files however the daemon ends: a
//! SIGTERM (which exits at once, without unwinding), a start that fails
//! once the sockets exist, a crash.
//!
//! The daemon itself cannot: once sandboxed it runs as an unprivileged user
//! under Landlock and may not unlink in the directory of its sockets
//! (`/run/sluice`, root's). So before the sandbox is set up, while the
//! process still has one thread and is root, [`remove_at_exit`] starts a
//! helper that keeps those rights and does nothing else: a fork that
//! executes this program again as `sluice-sockets` (a fresh image, none of
//! the daemon's memory, a command line of its own), holding no descriptor
//! but one end of a pipe. It blocks in `read` until the daemon is gone (the
//! kernel closes the daemon's end whatever way it ends), removes each socket
//! that is still the one the daemon bound (same device and inode: a new
//! daemon may have bound the path since), and exits.

use std::ffi::{CString, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// The helper's `argv[0]`, what `ps` shows.
const HELPER: &str = "sluice-sockets";

/// The helper's first argument, so that no other command line is taken for
/// one.
const MARK: &str = "--remove-at-exit";

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
    let stays = "the sockets will stay behind if the daemon is killed";
    if threads() != Some(1) {
        log::warn!("{stays}: it has started threads");
        return;
    }
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two descriptors for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        log::warn!("{stays}: pipe2: {}", std::io::Error::last_os_error());
        return;
    }
    let [read_end, write_end] = fds;
    // Everything the child needs is made before the fork: between fork and
    // exec it only makes system calls.
    let mut args = vec![
        CString::from(c"sluice-sockets"),
        CString::new(MARK).unwrap_or_default(),
        CString::new(read_end.to_string()).unwrap_or_default(),
    ];
    for b in &bound {
        args.push(b.path.clone());
        args.push(CString::new(b.dev.to_string()).unwrap_or_default());
        args.push(CString::new(b.ino.to_string()).unwrap_or_default());
    }
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    // SAFETY: the process has one thread (checked above), so the child
    // inherits no lock held elsewhere; it only makes system calls on
    // memory prepared above, then executes or runs `wait_and_remove`,
    // neither of which returns.
    match unsafe { libc::fork() } {
        0 => {
            // SAFETY: this process's own descriptors and memory, used by
            // nothing else of the child; `argv` is a NULL-terminated array
            // of NUL-terminated strings alive here.
            unsafe {
                close_all_but(read_end);
                libc::fcntl(read_end, libc::F_SETFD, 0);
                libc::execv(c"/proc/self/exe".as_ptr(), argv.as_ptr());
                // The binary is gone (replaced by an upgrade): do it here.
                wait_and_remove(read_end, &bound)
            }
        }
        -1 => {
            log::warn!("{stays}: fork: {}", std::io::Error::last_os_error());
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

/// Runs the helper when this process is one (`sluice-sockets
/// --remove-at-exit FD PATH DEV INO...`, as [`remove_at_exit`] executes
/// it), and never returns then; returns at once otherwise. Called first
/// thing in `main`.
pub fn run_if_helper() {
    let args: Vec<OsString> = std::env::args_os().collect();
    if args.len() < 3 || args[0] != HELPER || args[1] != MARK {
        return;
    }
    let number = |a: &OsString| a.to_str().and_then(|s| s.parse::<u64>().ok());
    let Some(fd) = number(&args[2]).and_then(|n| i32::try_from(n).ok()) else {
        std::process::exit(2);
    };
    let mut bound = Vec::new();
    for triple in args[3..].chunks(3) {
        let [path, dev, ino] = triple else {
            std::process::exit(2);
        };
        let (Some(dev), Some(ino), Ok(path)) = (
            number(dev),
            number(ino),
            CString::new(path.clone().into_vec()),
        ) else {
            std::process::exit(2);
        };
        bound.push(Bound { path, dev, ino });
    }
    // SAFETY: `fd` is the pipe's read end this process was started with;
    // nothing else of this process uses it.
    unsafe { wait_and_remove(fd, &bound) }
}

/// Closes every descriptor of this process but `keep`.
///
/// # Safety
/// Nothing of this process may use the descriptors closed (a fork's child
/// about to execute, or the helper).
unsafe fn close_all_but(keep: i32) {
    let keep = keep as u32;
    // SAFETY: close_range only closes descriptors, as the caller allows.
    unsafe {
        if keep > 0 {
            libc::syscall(libc::SYS_close_range, 0u32, keep - 1, 0u32);
        }
        libc::syscall(libc::SYS_close_range, keep + 1, u32::MAX, 0u32);
    }
}

/// Waits until the pipe's write end is closed everywhere (the daemon has
/// ended), removes the sockets still the daemon's, exits.
///
/// # Safety
/// `read_end` is the pipe's read end, and nothing else of this process uses
/// its descriptors.
unsafe fn wait_and_remove(read_end: i32, bound: &[Bound]) -> ! {
    // SAFETY: plain system calls on this process's own descriptors and
    // signal dispositions; `bound`'s paths are NUL-terminated and alive.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, c"sluice-sockets".as_ptr());
        // SIGTERM and SIGINT stay blocked (the daemon blocked them before
        // it forked, and exec keeps the mask): the helper outlives a signal
        // sent to the group, and goes when the daemon has.
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
        // Hold nothing of the daemon's open: no socket that would keep a
        // client waiting, no file, no log pipe.
        close_all_but(read_end);
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
