//! Accelerator utilisation (AU) and throughput, computed exactly as DLIO v2.0's
//! `StatsCounter.compute_metrics_train` computes them.
//!
//! Per rank and epoch, with `proc[i]` the load + compute time of step `i` and
//! `start`/`end` the epoch's timestamps:
//!
//! - AU = Σ compute[1..] ÷ (end − start − proc[0]) — the first step is excluded from both
//!   sides, so the cold start of the loader does not count; the time a rank spends waiting
//!   at the per-step barrier for slower ranks stays in the denominator.
//! - throughput = steps × batch ÷ (end − start), in samples/s.
//!
//! An epoch's AU is the mean over ranks, its throughput the sum over ranks; the run's AU and
//! throughput are the means over epochs. DLIO's "MB/s" is samples/s × the nominal record
//! length ÷ 2^20.

use serde::{Deserialize, Serialize};

/// The timings of one step of one rank, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StepTiming {
    /// Time spent waiting for the batch from the data loader.
    pub load: f64,
    /// Emulated compute time (the measured sleep).
    pub compute: f64,
}

impl StepTiming {
    /// DLIO's `proc` time: load plus compute.
    pub fn proc(&self) -> f64 {
        self.load + self.compute
    }
}

/// One rank's epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankEpoch {
    /// When the epoch started, in seconds from any fixed origin.
    pub start: f64,
    /// When the epoch's last step (and its barrier) ended, same origin.
    pub end: f64,
    /// The steps in order.
    pub steps: Vec<StepTiming>,
}

impl RankEpoch {
    /// This rank's AU for the epoch, as a fraction (DLIO reports it ×100).
    pub fn au(&self) -> f64 {
        let compute: f64 = self.steps.iter().skip(1).map(|s| s.compute).sum();
        if compute == 0.0 {
            return 0.0;
        }
        let first = self.steps.first().map_or(0.0, StepTiming::proc);
        let total = self.end - self.start - first;
        if total <= 0.0 {
            return 0.0;
        }
        compute / total
    }

    /// This rank's throughput for the epoch in samples/s.
    pub fn throughput(&self, batch_size: u64) -> f64 {
        let wall = self.end - self.start;
        if wall <= 0.0 {
            return 0.0;
        }
        self.steps.len() as f64 * batch_size as f64 / wall
    }
}

/// The metrics of one epoch over all ranks.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EpochMetrics {
    /// Mean AU over ranks, as a fraction.
    pub au: f64,
    /// Samples/s summed over ranks.
    pub throughput: f64,
}

/// Combines the ranks of one epoch.
pub fn epoch_metrics(ranks: &[RankEpoch], batch_size: u64) -> EpochMetrics {
    if ranks.is_empty() {
        return EpochMetrics {
            au: 0.0,
            throughput: 0.0,
        };
    }
    let au = ranks.iter().map(RankEpoch::au).sum::<f64>() / ranks.len() as f64;
    let throughput = ranks.iter().map(|r| r.throughput(batch_size)).sum();
    EpochMetrics { au, throughput }
}

/// Combines the epochs of a run: the mean AU and the mean throughput.
pub fn run_metrics(epochs: &[EpochMetrics]) -> EpochMetrics {
    if epochs.is_empty() {
        return EpochMetrics {
            au: 0.0,
            throughput: 0.0,
        };
    }
    let n = epochs.len() as f64;
    EpochMetrics {
        au: epochs.iter().map(|e| e.au).sum::<f64>() / n,
        throughput: epochs.iter().map(|e| e.throughput).sum::<f64>() / n,
    }
}

/// DLIO's "MB/s": samples/s × nominal record length, in MiB/s.
pub fn nominal_mib_per_second(samples_per_second: f64, record_length: u64) -> f64 {
    samples_per_second * record_length as f64 / (1u64 << 20) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    fn step(load: f64, compute: f64) -> StepTiming {
        StepTiming { load, compute }
    }

    #[test]
    fn first_step_is_excluded() {
        // A slow first load (3 s) then 3 steps that each wait 0.5 s and compute 1 s.
        // Wall = 3 + 1 + 3 × 1.5 = 8.5 s. AU = 3 / (8.5 − 4) = 2/3, not 4 / 8.5.
        let rank = RankEpoch {
            start: 10.0,
            end: 18.5,
            steps: vec![
                step(3.0, 1.0),
                step(0.5, 1.0),
                step(0.5, 1.0),
                step(0.5, 1.0),
            ],
        };
        assert!(close(rank.au(), 3.0 / 4.5));
        // Throughput counts every step over the whole wall time: 4 × 10 / 8.5.
        assert!(close(rank.throughput(10), 40.0 / 8.5));
    }

    #[test]
    fn perfect_storage_gives_full_au() {
        let rank = RankEpoch {
            start: 0.0,
            end: 4.0,
            steps: vec![step(0.0, 1.0); 4],
        };
        assert!(close(rank.au(), 1.0));
    }

    #[test]
    fn the_barrier_makes_fast_ranks_pay_for_slow_ones() {
        // Two ranks, 3 steps of 1 s compute. Rank 1 waits 1 s for data on steps 2 and 3;
        // rank 0 gets data at once but waits the same 1 s at each barrier, so both ranks'
        // epochs last 1 + 2 × 2 = 5 s. Both get AU = 2 / (5 − 1) = 50 %.
        let fast = RankEpoch {
            start: 0.0,
            end: 5.0,
            steps: vec![step(0.0, 1.0); 3],
        };
        let slow = RankEpoch {
            start: 0.0,
            end: 5.0,
            steps: vec![step(0.0, 1.0), step(1.0, 1.0), step(1.0, 1.0)],
        };
        assert!(close(fast.au(), 0.5));
        assert!(close(slow.au(), 0.5));
        let epoch = epoch_metrics(&[fast, slow], 4);
        assert!(close(epoch.au, 0.5));
        // Each rank: 3 steps × 4 samples / 5 s; summed over the two ranks.
        assert!(close(epoch.throughput, 2.0 * 12.0 / 5.0));
    }

    #[test]
    fn ranks_then_epochs_are_averaged() {
        let a = RankEpoch {
            start: 0.0,
            end: 3.0,
            steps: vec![step(0.0, 1.0); 3],
        };
        let b = RankEpoch {
            start: 0.0,
            end: 5.0,
            steps: vec![step(0.0, 1.0), step(1.0, 1.0), step(1.0, 1.0)],
        };
        let e1 = epoch_metrics(&[a.clone(), b], 1); // (1.0 + 0.5) / 2
        let e2 = epoch_metrics(&[a.clone(), a], 1); // 1.0
        assert!(close(e1.au, 0.75));
        let run = run_metrics(&[e1, e2]);
        assert!(close(run.au, 0.875));
        assert!(close(run.throughput, (e1.throughput + e2.throughput) / 2.0));
        // 1000 samples/s of 1 MiB records is 1000 MiB/s.
        assert!(close(nominal_mib_per_second(1000.0, 1 << 20), 1000.0));
    }

    #[test]
    fn no_compute_means_zero_au() {
        let rank = RankEpoch {
            start: 0.0,
            end: 1.0,
            steps: vec![step(0.5, 0.0), step(0.5, 0.0)],
        };
        assert_eq!(rank.au(), 0.0);
        assert_eq!(epoch_metrics(&[], 1).au, 0.0);
        assert_eq!(run_metrics(&[]).throughput, 0.0);
    }
}
