//! `--find-max`: the largest number of emulated accelerators whose AU still passes.
//!
//! Double the count from 1 until a run fails (or the data set cannot feed more ranks),
//! bisect between the last pass and the first fail with short runs, then confirm the
//! answer with a full-length run, stepping down while the confirmation fails.

use serde::Serialize;

use super::MlperfError;
use super::loader::RunReport;

/// One run of the search.
#[derive(Debug, Clone, Serialize)]
pub struct Trial {
    /// Emulated accelerators.
    pub accelerators: usize,
    /// Epochs run.
    pub epochs: u32,
    /// AU in percent.
    pub au_percent: f64,
    /// Samples/s.
    pub samples_per_second: f64,
    /// DLIO's MiB/s.
    pub mib_per_second: f64,
    /// Whether it passed.
    pub pass: bool,
    /// Whether this was a confirming (full-length) run.
    pub confirming: bool,
}

/// The result of the search.
#[derive(Debug, Clone, Serialize)]
pub struct FindMaxReport {
    /// The largest passing count confirmed by a full run (0: even 1 accelerator fails).
    pub max_accelerators: usize,
    /// True when the data set, not the storage, limited the search: more accelerators might pass.
    pub capped_by_dataset: bool,
    /// Every run, in the order they ran.
    pub trials: Vec<Trial>,
    /// The confirming run that passed.
    pub confirmed: Option<RunReport>,
}

/// Searches with `trial(accelerators, epochs)`; `cap` is the most accelerators the data set
/// can feed; `search_epochs` and `full_epochs` the lengths of search and confirming runs.
pub fn find_max(
    cap: usize,
    search_epochs: u32,
    full_epochs: u32,
    mut trial: impl FnMut(usize, u32) -> Result<RunReport, MlperfError>,
) -> Result<FindMaxReport, MlperfError> {
    let mut trials = Vec::new();
    let mut record = |report: &RunReport, epochs: u32, confirming: bool| {
        trials.push(Trial {
            accelerators: report.accelerators,
            epochs,
            au_percent: report.au_percent,
            samples_per_second: report.samples_per_second,
            mib_per_second: report.mib_per_second,
            pass: report.pass,
            confirming,
        });
        report.pass
    };
    let mut pass = 0usize;
    let mut fail: Option<usize> = None;
    let mut n = 1usize;
    while n <= cap {
        let report = trial(n, search_epochs)?;
        if record(&report, search_epochs, false) {
            pass = n;
            if n == cap {
                break;
            }
            n = (n * 2).min(cap);
        } else {
            fail = Some(n);
            break;
        }
    }
    if let Some(mut hi) = fail {
        while hi - pass > 1 {
            let mid = pass + (hi - pass) / 2;
            let report = trial(mid, search_epochs)?;
            if record(&report, search_epochs, false) {
                pass = mid;
            } else {
                hi = mid;
            }
        }
    }
    let capped_by_dataset = fail.is_none() && pass == cap && cap > 0;
    let mut confirmed = None;
    while pass > 0 {
        let report = trial(pass, full_epochs)?;
        if record(&report, full_epochs, true) {
            confirmed = Some(report);
            break;
        }
        pass -= 1;
    }
    Ok(FindMaxReport {
        max_accelerators: pass,
        capped_by_dataset,
        trials,
        confirmed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlperf::workload::{Accelerator, Workload, WorkloadKind};

    /// A storage system whose AU falls linearly with the accelerator count.
    fn storage(limit: usize, n: usize, epochs: u32, confirm_penalty: bool) -> RunReport {
        let workload = Workload::preset(WorkloadKind::Unet3d, Accelerator::H100).unwrap();
        let mut au = if n <= limit {
            95.0
        } else {
            95.0 - 10.0 * (n - limit) as f64
        };
        if confirm_penalty && epochs > 1 && n == limit {
            au = 80.0;
        }
        RunReport {
            workload,
            accelerators: n,
            source: "test".into(),
            steps_per_epoch: 2,
            epochs: Vec::new(),
            au_percent: au,
            samples_per_second: n as f64,
            mib_per_second: n as f64,
            measured_mib_per_second: n as f64,
            pass: au >= 90.0,
            step_wait_ms: Vec::new(),
            warnings: Vec::new(),
        }
    }

    #[test]
    fn finds_the_largest_passing_count() {
        for limit in [1, 2, 3, 7, 8, 13, 40] {
            let report = find_max(64, 1, 5, |n, e| Ok(storage(limit, n, e, false))).unwrap();
            assert_eq!(report.max_accelerators, limit);
            assert!(!report.capped_by_dataset);
            let last = report.trials.last().unwrap();
            assert!(last.confirming && last.pass && last.epochs == 5);
            assert_eq!(report.confirmed.unwrap().accelerators, limit);
        }
    }

    #[test]
    fn a_failed_confirmation_steps_down() {
        let report = find_max(64, 1, 5, |n, e| Ok(storage(6, n, e, true))).unwrap();
        assert_eq!(report.max_accelerators, 5);
        let confirms: Vec<_> = report
            .trials
            .iter()
            .filter(|t| t.confirming)
            .map(|t| t.accelerators)
            .collect();
        assert_eq!(confirms, vec![6, 5]);
    }

    #[test]
    fn the_data_set_can_cap_the_search() {
        let report = find_max(5, 1, 2, |n, e| Ok(storage(100, n, e, false))).unwrap();
        assert_eq!(report.max_accelerators, 5);
        assert!(report.capped_by_dataset);
        let report = find_max(64, 1, 2, |n, e| Ok(storage(0, n, e, false))).unwrap();
        assert_eq!(report.max_accelerators, 0);
        assert!(report.confirmed.is_none());
    }
}
