//! RLIMIT_MEMLOCK for io_uring fixed buffers.
//!
//! Registering a buffer pins its pages and (without CAP_IPC_LOCK) counts them against the
//! user's RLIMIT_MEMLOCK. Before registering, the reactor raises the soft limit up to the hard
//! one, and the hard one too when the process may; otherwise it fails with an error that says
//! how to raise it.

use std::io;

/// The limit is too low and the process may not raise it.
#[derive(Debug, thiserror::Error)]
#[error(
    "fixed buffers need {needed_mib} MiB of locked memory but RLIMIT_MEMLOCK allows {hard_mib} MiB \
     and cannot be raised ({source}); raise it with `ulimit -l unlimited` before starting sluice, \
     `LimitMEMLOCK=infinity` in its systemd unit, `--ulimit memlock=-1` for docker, or a \
     `memlock` line in /etc/security/limits.conf; or turn fixed buffers off"
)]
pub struct MemlockError {
    /// Bytes that must be lockable, rounded up to MiB.
    pub needed_mib: u64,
    /// The hard limit in MiB.
    pub hard_mib: u64,
    /// Why raising it failed.
    #[source]
    pub source: io::Error,
}

/// What to do about a limit pair for a need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Adjustment {
    /// The soft limit already covers the need.
    Enough,
    /// Raise the soft limit (the hard limit allows it).
    RaiseSoft {
        /// The new soft limit.
        soft: u64,
    },
    /// Raise both limits (needs CAP_SYS_RESOURCE).
    RaiseBoth {
        /// The new limit.
        limit: u64,
    },
}

/// Decides how to make `needed` bytes lockable given the current `soft`/`hard` limits.
pub fn adjustment(soft: u64, hard: u64, needed: u64) -> Adjustment {
    if soft == libc::RLIM_INFINITY || soft >= needed {
        Adjustment::Enough
    } else if hard == libc::RLIM_INFINITY || hard >= needed {
        Adjustment::RaiseSoft { soft: hard }
    } else {
        Adjustment::RaiseBoth { limit: needed }
    }
}

/// The current (soft, hard) RLIMIT_MEMLOCK in bytes.
pub fn current() -> io::Result<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: lim is a writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((lim.rlim_cur, lim.rlim_max))
}

fn set(soft: u64, hard: u64) -> io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: lim is a valid rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `CAP_IPC_LOCK`'s bit in the capability sets.
const CAP_IPC_LOCK: u32 = 14;

/// Whether this process holds CAP_IPC_LOCK, which exempts it from RLIMIT_MEMLOCK accounting
/// (the kernel then does not count fixed buffers against the limit at all). Asked with
/// `capget(2)`, which needs no file: a sandbox may not let the process read `/proc` (Landlock),
/// and `/proc/self/status` is read only where `capget` fails.
pub fn exempt() -> bool {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    /// `_LINUX_CAPABILITY_VERSION_3`: two `Data` words (64 capabilities).
    const VERSION_3: u32 = 0x2008_0522;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: `header` and the two-element `data` are what capget writes for version 3; the
    // kernel writes nothing else.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &raw mut header, data.as_mut_ptr()) };
    if rc == 0 {
        return data[0].effective & (1 << CAP_IPC_LOCK) != 0;
    }
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| ipc_lock_in(&status))
}

/// Whether the `CapEff:` line of a /proc/PID/status text includes CAP_IPC_LOCK.
fn ipc_lock_in(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|caps| u64::from_str_radix(caps.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// Makes sure this process may lock `needed` bytes, raising RLIMIT_MEMLOCK if allowed; a
/// process with CAP_IPC_LOCK needs no raise.
pub fn ensure(needed: u64) -> Result<(), MemlockError> {
    match raise(needed) {
        Err(_) if exempt() => {
            log::debug!("RLIMIT_MEMLOCK stays low; CAP_IPC_LOCK exempts this process from it");
            Ok(())
        }
        other => other,
    }
}

fn raise(needed: u64) -> Result<(), MemlockError> {
    let fail = |hard: u64, source| MemlockError {
        needed_mib: needed.div_ceil(1 << 20),
        hard_mib: hard >> 20,
        source,
    };
    let (soft, hard) = current().map_err(|e| fail(0, e))?;
    match adjustment(soft, hard, needed) {
        Adjustment::Enough => Ok(()),
        Adjustment::RaiseSoft { soft } => set(soft, hard).map_err(|e| fail(hard, e)),
        Adjustment::RaiseBoth { limit } => {
            set(limit, limit).map_err(|e| fail(hard, e))?;
            log::info!("raised RLIMIT_MEMLOCK to {} MiB", limit >> 20);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_ipc_lock_capability() {
        // A container's root: everything but CAP_SYS_RESOURCE.
        assert!(ipc_lock_in("Name:\tx\nCapEff:\t000001fffeffffff\n"));
        assert!(!ipc_lock_in("CapEff:\t0000000000000000\n"));
        assert!(!ipc_lock_in("CapEff:\t0000000000004000x\n"));
        assert!(ipc_lock_in("CapEff:\t0000000000004000\n"));
        assert!(!ipc_lock_in(""));
        // capget says what the process's status file says.
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        assert_eq!(exempt(), ipc_lock_in(&status));
    }

    #[test]
    fn decides_how_to_raise() {
        let inf = libc::RLIM_INFINITY;
        assert_eq!(adjustment(8 << 20, 8 << 20, 1 << 20), Adjustment::Enough);
        assert_eq!(adjustment(inf, inf, u64::MAX / 2), Adjustment::Enough);
        assert_eq!(
            adjustment(8 << 20, inf, 1 << 30),
            Adjustment::RaiseSoft { soft: inf }
        );
        assert_eq!(
            adjustment(8 << 20, 64 << 20, 1 << 30),
            Adjustment::RaiseBoth { limit: 1 << 30 }
        );
    }

    #[test]
    fn error_says_how_to_raise_the_limit() {
        let e = MemlockError {
            needed_mib: 1024,
            hard_mib: 8,
            source: io::Error::from_raw_os_error(libc::EPERM),
        };
        let text = e.to_string();
        assert!(
            text.contains("1024 MiB") && text.contains("ulimit -l unlimited"),
            "{text}"
        );
        assert!(text.contains("LimitMEMLOCK=infinity"), "{text}");
    }
}
