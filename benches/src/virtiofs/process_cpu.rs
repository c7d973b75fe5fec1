//! CPU time the serving daemons spend, read from `/proc/PID/stat`, so that
//! `sluice bench virtiofs --pid` can say what a GB delivered costs them.

use std::io;

/// Parses `utime + stime` (clock ticks, every thread of the process) out of
/// the text of `/proc/PID/stat`. The command name (field 2) is in
/// parentheses and may itself hold spaces and parentheses, so the fields
/// are counted from the last `)`: utime and stime are fields 14 and 15.
pub fn parse_stat_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Fields from 3 (state) on: utime is the 12th of them, stime the 13th.
    let mut fields = after_name.split_ascii_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    utime.checked_add(stime)
}

/// Clock ticks per second, the unit of `/proc/PID/stat`'s times.
fn ticks_per_second() -> f64 {
    // SAFETY: sysconf takes no pointers and has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// CPU-seconds (user + system) the processes `pids` have used so far, summed.
pub fn cpu_seconds(pids: &[u32]) -> io::Result<f64> {
    let mut ticks = 0u64;
    for pid in pids {
        let path = format!("/proc/{pid}/stat");
        let stat = std::fs::read_to_string(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot read {path}: {e}")))?;
        ticks += parse_stat_ticks(&stat).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{path} has no utime and stime"),
            )
        })?;
    }
    Ok(ticks as f64 / ticks_per_second())
}

/// CPU-seconds per GB (10^9 bytes) delivered; `None` when nothing was read.
pub fn per_gb(cpu_seconds: f64, bytes: u64) -> Option<f64> {
    (bytes > 0).then(|| cpu_seconds / (bytes as f64 / 1e9))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utime_and_stime_are_fields_14_and_15() {
        let stat = "1234 (sluice) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0 \
                    100 1000000 500 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(parse_stat_ticks(stat), Some(325));
    }

    #[test]
    fn a_command_name_with_spaces_and_parentheses_is_skipped() {
        let stat = "77 (tokio (worker) 2) R 1 77 77 0 -1 0 0 0 0 0 7 3 0 0 20 0 1 0 5 0 0";
        assert_eq!(parse_stat_ticks(stat), Some(10));
    }

    #[test]
    fn a_truncated_line_is_refused() {
        assert_eq!(parse_stat_ticks("1 (x) S 1 1 1"), None);
        assert_eq!(parse_stat_ticks("garbage"), None);
    }

    #[test]
    fn this_process_has_used_some_cpu() {
        let mut spin = 0u64;
        for i in 0..5_000_000u64 {
            spin = std::hint::black_box(spin.wrapping_add(i));
        }
        let seconds = cpu_seconds(&[std::process::id()]).expect("own stat");
        assert!(seconds >= 0.0);
        assert!(cpu_seconds(&[u32::MAX]).is_err());
    }

    #[test]
    fn per_gb_divides_by_gigabytes() {
        assert_eq!(per_gb(0.5, 2_000_000_000), Some(0.25));
        assert_eq!(per_gb(1.0, 0), None);
    }
}
