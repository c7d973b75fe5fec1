//! Sets of CPU (or node) numbers in the kernel's list format (`0-3,8,10-11`).

use std::fmt;
use std::str::FromStr;

/// An ordered set of CPU numbers, as sysfs prints them in `cpulist` files.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CpuSet {
    /// Sorted, without duplicates.
    cpus: Vec<usize>,
}

/// A `cpulist` string that is not in the kernel's list format.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("CPU list {text:?} is not in the kernel's list format (like \"0-3,8\"): {reason}")]
pub struct CpuListError {
    /// The text that failed to parse.
    pub text: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// The largest CPU number accepted from a list; guards against a corrupt file asking for a huge
/// allocation.
const MAX_CPU: usize = 1 << 16;

impl CpuSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds a set from any CPU numbers (sorted and deduplicated here).
    pub fn from_cpus(cpus: impl IntoIterator<Item = usize>) -> Self {
        let mut cpus: Vec<usize> = cpus.into_iter().collect();
        cpus.sort_unstable();
        cpus.dedup();
        Self { cpus }
    }

    /// Parses the kernel's list format; an empty (or all-blank) string is the empty set.
    pub fn parse(text: &str) -> Result<Self, CpuListError> {
        let err = |reason| CpuListError {
            text: text.to_string(),
            reason,
        };
        let mut cpus = Vec::new();
        for part in text.trim().split(',').filter(|p| !p.is_empty()) {
            let (lo, hi) = match part.split_once('-') {
                Some((lo, hi)) => (lo, hi),
                None => (part, part),
            };
            let lo: usize = lo.trim().parse().map_err(|_| err("not a number"))?;
            let hi: usize = hi.trim().parse().map_err(|_| err("not a number"))?;
            if lo > hi {
                return Err(err("a range runs backwards"));
            }
            if hi > MAX_CPU {
                return Err(err("a CPU number is implausibly large"));
            }
            cpus.extend(lo..=hi);
        }
        Ok(Self::from_cpus(cpus))
    }

    /// The CPUs in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.cpus.iter().copied()
    }

    /// The CPUs as a sorted slice.
    pub fn as_slice(&self) -> &[usize] {
        &self.cpus
    }

    /// How many CPUs the set holds.
    pub fn len(&self) -> usize {
        self.cpus.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.cpus.is_empty()
    }

    /// Whether `cpu` is in the set.
    pub fn contains(&self, cpu: usize) -> bool {
        self.cpus.binary_search(&cpu).is_ok()
    }

    /// Adds `cpu` to the set.
    pub fn insert(&mut self, cpu: usize) {
        if let Err(at) = self.cpus.binary_search(&cpu) {
            self.cpus.insert(at, cpu);
        }
    }
}

impl FromStr for CpuSet {
    type Err = CpuListError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// Prints the kernel's list format, folding runs into ranges.
impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut i = 0;
        while i < self.cpus.len() {
            let start = self.cpus[i];
            let mut end = start;
            while i + 1 < self.cpus.len() && self.cpus[i + 1] == end + 1 {
                i += 1;
                end = self.cpus[i];
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
            i += 1;
        }
        if first {
            f.write_str("(none)")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_the_kernel_list_format() {
        let set = CpuSet::parse("0-3,8,10-11\n").unwrap();
        assert_eq!(set.as_slice(), &[0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(set.to_string(), "0-3,8,10-11");
        assert!(CpuSet::parse("").unwrap().is_empty());
        assert_eq!(CpuSet::parse("\n").unwrap().to_string(), "(none)");
        assert_eq!(CpuSet::from_cpus([5, 1, 5, 2]).to_string(), "1-2,5");
    }

    #[test]
    fn rejects_malformed_lists() {
        assert!(CpuSet::parse("3-1").is_err());
        assert!(CpuSet::parse("a-b").is_err());
        assert!(CpuSet::parse("0-99999999").is_err());
        let err = CpuSet::parse("x").unwrap_err();
        assert!(err.to_string().contains("not in the kernel's list format"));
    }
}
