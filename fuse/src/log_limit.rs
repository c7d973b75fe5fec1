//! [`LogLimit`]: a cap on how often one kind of client-caused warning is
//! logged. A guest can send a request that earns a warning as fast as it
//! likes (a BATCH_FORGET of 262 144 ids it was never given); the daemon's
//! log must not grow with it. Each kind gets at most [`LogLimit::PER_SECOND`]
//! lines a second; the next line that gets through says how many were
//! left out.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The rate limit of one kind of log line.
#[derive(Debug)]
pub struct LogLimit {
    window: Mutex<Window>,
}

#[derive(Debug)]
struct Window {
    start: Option<Instant>,
    logged: u32,
    suppressed: u64,
}

impl Default for LogLimit {
    fn default() -> LogLimit {
        LogLimit::new()
    }
}

impl LogLimit {
    /// Lines of one kind logged per second at most.
    pub const PER_SECOND: u32 = 10;

    /// A limit with nothing logged yet (a `static` may hold one).
    pub const fn new() -> LogLimit {
        LogLimit {
            window: Mutex::new(Window {
                start: None,
                logged: 0,
                suppressed: 0,
            }),
        }
    }

    /// Whether a line may be logged now: `Some(n)` with the number of
    /// lines left out since the last one that got through, or `None` (the
    /// line is counted as left out).
    pub fn allow(&self) -> Option<u64> {
        self.allow_at(Instant::now())
    }

    fn allow_at(&self, now: Instant) -> Option<u64> {
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = w
            .start
            .is_none_or(|s| now.saturating_duration_since(s) >= Duration::from_secs(1));
        if fresh {
            w.start = Some(now);
            w.logged = 0;
        }
        if w.logged < Self::PER_SECOND {
            w.logged += 1;
            Some(std::mem::take(&mut w.suppressed))
        } else {
            w.suppressed += 1;
            None
        }
    }
}

/// The tail of a rate-limited line: how many like it were left out.
pub fn suppressed_note(n: u64) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(" ({n} more like it not logged)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_per_second_then_the_count_of_those_left_out() {
        let limit = LogLimit::new();
        let t0 = Instant::now();
        for _ in 0..LogLimit::PER_SECOND {
            assert_eq!(limit.allow_at(t0), Some(0));
        }
        for _ in 0..262_144 {
            assert_eq!(limit.allow_at(t0 + Duration::from_millis(500)), None);
        }
        assert_eq!(limit.allow_at(t0 + Duration::from_secs(1)), Some(262_144));
        assert_eq!(limit.allow_at(t0 + Duration::from_secs(1)), Some(0));
        assert_eq!(suppressed_note(0), "");
        assert_eq!(suppressed_note(3), " (3 more like it not logged)");
    }
}
