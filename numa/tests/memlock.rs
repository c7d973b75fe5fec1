//! RLIMIT_MEMLOCK handling against the real limit. Its own test binary (one test) because it
//! changes a process-wide limit.

use sluice_numa::memlock;

#[test]
fn a_low_soft_limit_is_raised_and_a_low_hard_limit_raised_or_explained() {
    let (soft, hard) = memlock::current().unwrap();
    let low = 64 << 10;
    let lowered = libc::rlimit {
        rlim_cur: low,
        rlim_max: hard,
    };
    // SAFETY: setrlimit with a valid struct; lowering the soft limit is always allowed.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lowered) };
    assert_eq!(rc, 0);
    let need = (hard.min(16 << 20)).max(low + 1);
    memlock::ensure(need).unwrap();
    let (now, _) = memlock::current().unwrap();
    assert!(now >= need, "soft limit {now} below {need}");

    // Now a need above the hard limit: root raises both, anyone else gets the explanation.
    if hard != libc::RLIM_INFINITY {
        let beyond = hard + (1 << 20);
        match memlock::ensure(beyond) {
            Ok(()) => {
                // SAFETY: geteuid has no preconditions.
                let uid = unsafe { libc::geteuid() };
                let raised = memlock::current().unwrap().1 >= beyond;
                // Raised by a privileged process, or not needed under CAP_IPC_LOCK.
                assert!(
                    (uid == 0 && raised) || memlock::exempt(),
                    "ensure succeeded without raising the limit or CAP_IPC_LOCK"
                );
            }
            Err(e) => {
                assert!(e.to_string().contains("ulimit -l unlimited"), "{e}");
            }
        }
    }
    let restore = libc::rlimit {
        rlim_cur: soft,
        rlim_max: memlock::current().unwrap().1,
    };
    // SAFETY: as above.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &restore) };
}
