//! The system-call half of the sandbox: an allowlist of what `sluice serve`'s
//! threads call once set up (rust-vmm's `seccompiler`, as Firecracker and
//! virtiofsd use it), installed on every thread.
//!
//! The list was built from `strace -f -c` of the daemon under the
//! end-to-end serve tests (SQLite, a `file://` bucket, a disk cache,
//! writeback, `--guest-io uring`; S3 and Redis clients), on x86_64, and
//! mapped to aarch64, which lacks the legacy calls (`open`, `stat`, `poll`,
//! ...). Calls are allowed whatever their arguments: the filter's job is
//! to take away the kernel's attack surface the daemon never needs
//! (`execve`, `ptrace`, `mount`, `bpf`, `keyctl`, `unshare`, module loading,
//! ...), not to police arguments.

use std::collections::BTreeMap;

use anyhow::Context as _;
use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

use super::SeccompMode;

/// Calls both architectures know by these names.
const COMMON: &[libc::c_long] = &[
    // Files: SQLite, the file store, the disk cache, writeback staging.
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_preadv2,
    libc::SYS_pwritev2,
    libc::SYS_openat,
    libc::SYS_openat2,
    libc::SYS_close,
    libc::SYS_close_range,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_fstatfs,
    libc::SYS_statfs,
    libc::SYS_lseek,
    libc::SYS_fcntl,
    libc::SYS_flock,
    libc::SYS_ioctl,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_syncfs,
    libc::SYS_sync_file_range,
    libc::SYS_fallocate,
    libc::SYS_ftruncate,
    libc::SYS_truncate,
    libc::SYS_getdents64,
    libc::SYS_getcwd,
    libc::SYS_mkdirat,
    libc::SYS_unlinkat,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_linkat,
    libc::SYS_readlinkat,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_fchmod,
    libc::SYS_fchmodat,
    libc::SYS_fchown,
    libc::SYS_fchownat,
    libc::SYS_utimensat,
    libc::SYS_fgetxattr,
    libc::SYS_fsetxattr,
    libc::SYS_flistxattr,
    libc::SYS_fremovexattr,
    libc::SYS_getxattr,
    libc::SYS_lgetxattr,
    libc::SYS_setxattr,
    libc::SYS_lsetxattr,
    libc::SYS_removexattr,
    libc::SYS_copy_file_range,
    libc::SYS_fadvise64,
    // The host daemon's blocks (`sluice host`): a memfd per block, sealed
    // with fcntl; a `serve --host` maps them read-only (mmap below).
    libc::SYS_memfd_create,
    // Memory: allocator, guest memory maps, NUMA placement.
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mprotect,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_mbind,
    libc::SYS_get_mempolicy,
    libc::SYS_set_mempolicy,
    libc::SYS_move_pages,
    libc::SYS_mincore,
    // cachestat(2): whether a READ's range is in the page cache (guest I/O
    // with `--guest-io uring`); the same number on every architecture, which
    // the libc crate names on only a few.
    sluice_vhost::SYS_CACHESTAT,
    libc::SYS_mlock,
    libc::SYS_mlock2,
    libc::SYS_munlock,
    libc::SYS_membarrier,
    // io_uring (guest I/O, the disk cache's reactor).
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    // Event loops: vhost-user, tokio, the control socket.
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_eventfd2,
    libc::SYS_ppoll,
    libc::SYS_pselect6,
    libc::SYS_pipe2,
    libc::SYS_dup,
    libc::SYS_dup3,
    libc::SYS_timerfd_create,
    libc::SYS_timerfd_settime,
    libc::SYS_timerfd_gettime,
    // Sockets: vhost-user (SCM_RIGHTS), S3 over HTTP, Redis, DNS, the
    // host daemon's SOCK_SEQPACKET socket (SCM_RIGHTS both ways, the
    // peer's credentials with getsockopt).
    libc::SYS_socket,
    libc::SYS_socketpair,
    libc::SYS_connect,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_accept4,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_getsockopt,
    libc::SYS_setsockopt,
    libc::SYS_sendto,
    libc::SYS_recvfrom,
    libc::SYS_sendmsg,
    libc::SYS_recvmsg,
    libc::SYS_sendmmsg,
    libc::SYS_recvmmsg,
    libc::SYS_shutdown,
    // Threads, signals, time.
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_futex,
    libc::SYS_set_robust_list,
    libc::SYS_get_robust_list,
    libc::SYS_set_tid_address,
    libc::SYS_rseq,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_sigaltstack,
    libc::SYS_tgkill,
    libc::SYS_tkill,
    libc::SYS_getpid,
    libc::SYS_gettid,
    libc::SYS_getppid,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_getresuid,
    libc::SYS_getresgid,
    libc::SYS_getgroups,
    // Whether CAP_IPC_LOCK exempts io_uring fixed buffers from RLIMIT_MEMLOCK
    // (`sluice_numa::memlock::exempt`).
    libc::SYS_capget,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_setaffinity,
    libc::SYS_sched_yield,
    libc::SYS_sched_getparam,
    libc::SYS_sched_getscheduler,
    libc::SYS_getcpu,
    libc::SYS_clock_gettime,
    libc::SYS_clock_getres,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_gettimeofday,
    libc::SYS_restart_syscall,
    libc::SYS_getrandom,
    libc::SYS_prctl,
    libc::SYS_prlimit64,
    libc::SYS_getrlimit,
    libc::SYS_getrusage,
    libc::SYS_uname,
    libc::SYS_sysinfo,
];

/// The legacy calls only x86_64 has (glibc and std still use some).
#[cfg(target_arch = "x86_64")]
const ARCH: &[libc::c_long] = &[
    libc::SYS_open,
    libc::SYS_stat,
    libc::SYS_lstat,
    libc::SYS_access,
    libc::SYS_poll,
    libc::SYS_epoll_wait,
    libc::SYS_readlink,
    libc::SYS_unlink,
    libc::SYS_rename,
    libc::SYS_mkdir,
    libc::SYS_rmdir,
    libc::SYS_chmod,
    libc::SYS_chown,
    libc::SYS_lchown,
    libc::SYS_pipe,
    libc::SYS_dup2,
    libc::SYS_arch_prctl,
    libc::SYS_time,
    libc::SYS_getdents,
    libc::SYS_select,
];

#[cfg(not(target_arch = "x86_64"))]
const ARCH: &[libc::c_long] = &[];

/// The filter for `mode`, or `None` for no filter.
fn program(mode: SeccompMode) -> anyhow::Result<Option<BpfProgram>> {
    let mismatch = match mode {
        SeccompMode::Kill => SeccompAction::KillProcess,
        SeccompMode::Log => SeccompAction::Log,
        SeccompMode::None => return Ok(None),
    };
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| anyhow::anyhow!("seccomp: {e:?}"))?;
    let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> = COMMON
        .iter()
        .chain(ARCH)
        .map(|&nr| (nr, Vec::new()))
        .collect();
    let filter = SeccompFilter::new(rules, mismatch, SeccompAction::Allow, arch)
        .context("cannot build the seccomp filter")?;
    Ok(Some(
        filter
            .try_into()
            .context("cannot compile the seccomp filter")?,
    ))
}

/// Installs the filter for `mode` on every thread of the process.
pub fn install(mode: SeccompMode) -> anyhow::Result<()> {
    let Some(program) = program(mode)? else {
        log::warn!("--seccomp none: every system call is allowed");
        return Ok(());
    };
    let allowed = COMMON.len() + ARCH.len();
    match seccompiler::apply_filter_all_threads(&program) {
        Ok(()) => {}
        Err(seccompiler::Error::Seccomp(e))
            if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EINVAL)) =>
        {
            // qemu-user (the arm64 tests) cannot filter on behalf of the
            // program it emulates; neither can a kernel built without
            // CONFIG_SECCOMP_FILTER.
            log::warn!("this system cannot install seccomp filters ({e}): no filter");
            return Ok(());
        }
        Err(e) => return Err(e).context("cannot install the seccomp filter on every thread"),
    }
    log::info!(
        "seccomp: {allowed} system calls allowed, others {}",
        match mode {
            SeccompMode::Kill => "kill the daemon",
            _ => "logged",
        }
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_compiles_for_this_architecture_and_kill_and_log_differ() {
        let kill = program(SeccompMode::Kill).unwrap().unwrap();
        let log = program(SeccompMode::Log).unwrap().unwrap();
        assert_eq!(kill.len(), log.len());
        assert_ne!(kill, log, "the default action differs");
        assert!(program(SeccompMode::None).unwrap().is_none());
        assert!(!COMMON.contains(&libc::SYS_execve));
        assert!(!COMMON.contains(&libc::SYS_ptrace));
        assert!(!COMMON.contains(&libc::SYS_personality));
    }
}
