//! The wait between two tries of something that failed for a while (a
//! lost connection, a busy store): exponential, capped, and where many
//! threads fail at once, with jitter. One rule for every retry loop of the
//! engine — S3 requests, writeback uploads, Redis reconnections — each
//! with its own first wait and cap.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Waits that double from `first` up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The wait before the first retry.
    pub first: Duration,
    /// The longest wait.
    pub max: Duration,
}

impl Backoff {
    /// Waits from `first`, doubling, at most `max`.
    pub const fn new(first: Duration, max: Duration) -> Backoff {
        Backoff { first, max }
    }

    /// The wait before retry `n` (1-based; 0 counts as 1): `first`
    /// doubled `n - 1` times, at most `max`.
    pub fn delay(&self, n: u32) -> Duration {
        let doublings = n.saturating_sub(1).min(30);
        self.first.saturating_mul(1 << doublings).min(self.max)
    }

    /// [`Backoff::delay`] with "equal jitter": half of it fixed, the other
    /// half drawn from `jitter`, so that threads which failed together do
    /// not come back together.
    pub fn jittered(&self, n: u32, jitter: &Jitter) -> Duration {
        let full = u64::try_from(self.delay(n).as_nanos()).unwrap_or(u64::MAX);
        let half = full / 2;
        Duration::from_nanos(half + jitter.next() % (half + 1))
    }
}

/// A cheap source of jitter shared by threads (xorshift64): good enough to
/// spread retries, nothing more.
#[derive(Debug)]
pub struct Jitter(AtomicU64);

impl Jitter {
    /// A source started from `seed` (0 is taken as 1: xorshift never
    /// leaves 0).
    pub fn new(seed: u64) -> Jitter {
        Jitter(AtomicU64::new(seed.max(1)))
    }

    /// The next number. Two threads may draw the same one; that costs
    /// only spread.
    pub fn next(&self) -> u64 {
        let mut x = self.0.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0.store(x, Ordering::Relaxed);
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn waits_double_up_to_the_cap() {
        let b = Backoff::new(100 * MS, 1000 * MS);
        let waits: Vec<_> = (0..7).map(|n| b.delay(n)).collect();
        assert_eq!(
            waits,
            [
                100 * MS,
                100 * MS,
                200 * MS,
                400 * MS,
                800 * MS,
                1000 * MS,
                1000 * MS
            ]
        );
        assert_eq!(b.delay(u32::MAX), 1000 * MS);
    }

    #[test]
    fn jitter_keeps_half_and_spreads_the_rest() {
        let b = Backoff::new(100 * MS, 1000 * MS);
        let j = Jitter::new(0);
        let waits: Vec<_> = (0..64).map(|_| b.jittered(3, &j)).collect();
        assert!(
            waits.iter().all(|w| *w >= 200 * MS && *w <= 400 * MS),
            "{waits:?}"
        );
        let mut distinct = waits.clone();
        distinct.sort();
        distinct.dedup();
        assert!(distinct.len() > 32, "{distinct:?}");
    }
}
