//! What the data path counts, at the cost of a few relaxed atomic adds per
//! request, and what a metrics endpoint reads when it is scraped.
//!
//! Nothing here formats or serves metrics: the daemon (`src/metrics/` of
//! the `sluice` binary) sums these at scrape time and writes them in the
//! Prometheus text format. Values shared by many threads (the host FUSE
//! workers, the engine's upload and prefetch threads) are kept in
//! [`Sharded`] slots, one cache line each, so that threads do not bounce a
//! line between cores on every request; a virtio-fs queue is served by one
//! thread and keeps plain per-queue counters.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use crossbeam_utils::CachePadded;

/// How many slots a [`Sharded`] value has: threads beyond this share them.
pub const SHARDS: usize = 16;

/// A value kept in [`SHARDS`] cache-line-aligned slots; each thread updates
/// the slot it was given when it first touched one, and readers sum them.
#[derive(Debug)]
pub struct Sharded<T> {
    slots: Box<[CachePadded<T>]>,
}

impl<T> Sharded<T> {
    /// Slots made by `make`.
    pub fn new(mut make: impl FnMut() -> T) -> Sharded<T> {
        Sharded {
            slots: (0..SHARDS).map(|_| CachePadded::new(make())).collect(),
        }
    }

    /// This thread's slot.
    pub fn local(&self) -> &T {
        &self.slots[thread_slot()]
    }

    /// All slots, for summing.
    pub fn slots(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().map(|s| &**s)
    }
}

impl<T: Default> Default for Sharded<T> {
    fn default() -> Self {
        Sharded::new(T::default)
    }
}

/// The slot of the calling thread: handed out round-robin as threads first
/// ask, so the workers of one pool land in different slots.
fn thread_slot() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    SLOT.with(|s| {
        let mut slot = s.get();
        if slot == usize::MAX {
            slot = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
            s.set(slot);
        }
        slot
    })
}

/// Adds `n` to `counter` (relaxed: counters order nothing).
#[inline]
pub fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// Reads `counter`.
#[inline]
pub fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// Upper bounds `start, start·factor, …` (`count` of them), as Prometheus'
/// `ExponentialBuckets`, in the unit the histogram records (e.g.
/// nanoseconds for `start` given in nanoseconds).
pub fn exponential_bounds(start: f64, factor: f64, count: usize) -> Vec<u64> {
    (0..count)
        .map(|i| (start * factor.powi(i as i32)).round() as u64)
        .collect()
}

/// Upper bounds `start, start+width, …` (`count` of them), as Prometheus'
/// `LinearBuckets`.
pub fn linear_bounds(start: u64, width: u64, count: usize) -> Vec<u64> {
    (0..count as u64).map(|i| start + i * width).collect()
}

/// A histogram of integer observations (nanoseconds, bytes) with fixed
/// upper bounds; the last bucket counts everything above them (`+Inf`).
/// One observation: a short search over the bounds and two relaxed adds.
#[derive(Debug)]
pub struct Histogram {
    bounds: Box<[u64]>,
    buckets: Box<[AtomicU64]>,
    sum: AtomicU64,
}

impl Histogram {
    /// A histogram with these upper bounds (sorted ascending).
    pub fn new(bounds: Vec<u64>) -> Histogram {
        debug_assert!(bounds.windows(2).all(|w| w[0] <= w[1]));
        let buckets = (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect();
        Histogram {
            bounds: bounds.into_boxed_slice(),
            buckets,
            sum: AtomicU64::new(0),
        }
    }

    /// Counts one observation of `value`.
    #[inline]
    pub fn observe(&self, value: u64) {
        let i = self.bounds.partition_point(|&b| b < value);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
    }

    /// Counts the time since `start`, in nanoseconds.
    #[inline]
    pub fn observe_since(&self, start: Instant) {
        self.observe(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX));
    }

    /// Adds this histogram's counts to `into` (which must have the same
    /// bounds, or be empty).
    pub fn add_to(&self, into: &mut HistogramSnapshot) {
        if into.counts.is_empty() {
            into.bounds = self.bounds.to_vec();
            into.counts = vec![0; self.buckets.len()];
        }
        for (c, b) in into.counts.iter_mut().zip(self.buckets.iter()) {
            *c += b.load(Ordering::Relaxed);
        }
        into.sum += self.sum.load(Ordering::Relaxed);
    }

    /// Its counts now.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut s = HistogramSnapshot::default();
        self.add_to(&mut s);
        s
    }
}

/// A histogram's counts at one moment (possibly summed over several).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistogramSnapshot {
    /// Upper bounds, in the recorded unit.
    pub bounds: Vec<u64>,
    /// Observations per bucket (not cumulative); one more than `bounds`:
    /// the last counts those above every bound.
    pub counts: Vec<u64>,
    /// The sum of the observations.
    pub sum: u64,
}

impl HistogramSnapshot {
    /// Observations in all.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// (upper bound × `scale`, cumulative count) per bucket, `+Inf` last:
    /// what the Prometheus exposition format lists.
    pub fn cumulative(&self, scale: f64) -> Vec<(f64, u64)> {
        let mut total = 0;
        self.counts
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                total += c;
                let bound = self
                    .bounds
                    .get(i)
                    .map_or(f64::INFINITY, |&b| b as f64 * scale);
                (bound, total)
            })
            .collect()
    }

    /// The value below which `q` (0..=1) of the observations fall, as the
    /// upper bound of the bucket it lies in (`None` without observations;
    /// `u64::MAX` when it lies above every bound).
    pub fn quantile(&self, q: f64) -> Option<u64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let want = ((n as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return Some(self.bounds.get(i).copied().unwrap_or(u64::MAX));
            }
        }
        Some(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_that_holds_them() {
        let h = Histogram::new(vec![10, 20, 40]);
        for v in [0, 10, 11, 20, 39, 40, 41, 1000] {
            h.observe(v);
        }
        let s = h.snapshot();
        assert_eq!(s.counts, vec![2, 2, 2, 2]);
        assert_eq!(s.sum, 1161);
        assert_eq!(s.count(), 8);
        assert_eq!(
            s.cumulative(0.5),
            vec![(5.0, 2), (10.0, 4), (20.0, 6), (f64::INFINITY, 8)]
        );
    }

    #[test]
    fn quantiles_name_a_bucket_bound() {
        let h = Histogram::new(vec![1, 2, 4, 8]);
        assert_eq!(h.snapshot().quantile(0.99), None);
        for _ in 0..99 {
            h.observe(1);
        }
        h.observe(7);
        let s = h.snapshot();
        assert_eq!(s.quantile(0.5), Some(1));
        assert_eq!(s.quantile(0.99), Some(1));
        assert_eq!(s.quantile(1.0), Some(8));
        h.observe(100);
        assert_eq!(h.snapshot().quantile(1.0), Some(u64::MAX));
    }

    #[test]
    fn bounds_follow_prometheus_bucket_helpers() {
        assert_eq!(exponential_bounds(100.0, 2.0, 4), vec![100, 200, 400, 800]);
        assert_eq!(linear_bounds(4096, 4096, 3), vec![4096, 8192, 12288]);
    }

    #[test]
    fn shards_sum_across_threads() {
        let s: Sharded<AtomicU64> = Sharded::default();
        std::thread::scope(|scope| {
            for _ in 0..40 {
                scope.spawn(|| add(s.local(), 3));
            }
        });
        assert_eq!(s.slots().map(get).sum::<u64>(), 120);
    }

    #[test]
    fn histograms_of_several_threads_add_up() {
        let a = Histogram::new(vec![5]);
        let b = Histogram::new(vec![5]);
        a.observe(1);
        b.observe(9);
        let mut sum = HistogramSnapshot::default();
        a.add_to(&mut sum);
        b.add_to(&mut sum);
        assert_eq!(sum.counts, vec![1, 1]);
        assert_eq!(sum.sum, 10);
    }
}
