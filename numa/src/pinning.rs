//! Pinning threads to cores: data workers to one core each, service threads to a node's
//! service set.

use std::io;
use std::thread::{self, JoinHandle};

use crate::cpuset::CpuSet;

/// A thread could not be pinned.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    /// The kernel refused the single-core affinity.
    #[error(
        "cannot pin thread to cpu {cpu}; it is offline or outside this process's allowed set \
         (check taskset/cgroup cpuset)"
    )]
    Core {
        /// The CPU.
        cpu: usize,
    },
    /// The kernel refused an affinity set.
    #[error("cannot pin thread to cpus {cpus}: {source}")]
    Set {
        /// The CPUs.
        cpus: CpuSet,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// Pins the calling thread to `cpu` alone.
pub fn pin_current_thread(cpu: usize) -> Result<(), PinError> {
    // core_affinity aborts on CPU numbers beyond cpu_set_t; refuse them here instead.
    if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
        return Err(PinError::Core { cpu });
    }
    if core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
        Ok(())
    } else {
        Err(PinError::Core { cpu })
    }
}

/// Pins the calling thread to any CPU of `cpus` (service threads float within their set).
pub fn pin_current_thread_to(cpus: &CpuSet) -> Result<(), PinError> {
    // SAFETY: cpu_set_t is a plain bit array; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let capacity = 8 * std::mem::size_of::<libc::cpu_set_t>();
    for cpu in cpus.iter().filter(|c| *c < capacity) {
        // SAFETY: cpu is below the set's capacity, checked by the filter.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: set is a valid cpu_set_t of the size passed; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(PinError::Set {
            cpus: cpus.clone(),
            source: io::Error::last_os_error(),
        })
    }
}

/// The CPUs the calling thread may run on.
pub fn allowed_cpus() -> io::Result<CpuSet> {
    // SAFETY: cpu_set_t is a plain bit array; all-zero is valid.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: set is a writable cpu_set_t of the size passed.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let capacity = 8 * std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: every index is below the set's capacity.
    Ok(CpuSet::from_cpus(
        (0..capacity).filter(|c| unsafe { libc::CPU_ISSET(*c, &set) }),
    ))
}

/// The CPU the calling thread is running on right now.
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu has no preconditions.
    usize::try_from(unsafe { libc::sched_getcpu() }).ok()
}

/// Starts a thread named `name` pinned to `cpu`; the closure runs only once the pin holds.
pub fn spawn_pinned<F, T>(
    name: String,
    cpu: usize,
    f: F,
) -> io::Result<JoinHandle<Result<T, PinError>>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    thread::Builder::new().name(name).spawn(move || {
        pin_current_thread(cpu)?;
        Ok(f())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_threads_run_on_their_core() {
        let allowed = allowed_cpus().unwrap();
        assert!(!allowed.is_empty());
        for cpu in allowed.iter() {
            let h = spawn_pinned(format!("pin-{cpu}"), cpu, move || {
                // Yield a few times: a pinned thread can only ever come back on its core.
                let mut seen = Vec::new();
                for _ in 0..5 {
                    thread::yield_now();
                    seen.push(current_cpu());
                }
                (allowed_cpus().unwrap(), seen)
            })
            .unwrap();
            let (mask, seen) = h.join().unwrap().unwrap();
            assert_eq!(mask.as_slice(), &[cpu]);
            assert!(seen.iter().all(|c| *c == Some(cpu)), "{seen:?} on {cpu}");
        }
    }

    #[test]
    fn pinning_to_a_set_and_to_a_missing_core() {
        let allowed = allowed_cpus().unwrap();
        let a = allowed.clone();
        let mask = thread::spawn(move || {
            pin_current_thread_to(&a).unwrap();
            allowed_cpus().unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(mask, allowed);
        let r = thread::spawn(|| pin_current_thread(100_000))
            .join()
            .unwrap();
        assert!(matches!(r, Err(PinError::Core { cpu: 100_000 })));
        let r = spawn_pinned("nowhere".into(), 100_000, || ())
            .unwrap()
            .join()
            .unwrap();
        assert!(r.is_err());
    }
}
