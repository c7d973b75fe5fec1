//! The Prometheus text exposition format (version 0.0.4) as Go's client
//! writes it, which is what a JuiceFS mount serves: a counter keeps its
//! name as given (JuiceFS's have no `_total`: `juicefs_blockcache_hits` is
//! a `counter`), each sample's labels are sorted by name with a
//! histogram's `le` last, and families come sorted by name. OpenMetrics
//! (and the `prometheus-client` crate that writes it) would rename such a
//! counter `…_total`, which no JuiceFS dashboard or alert queries.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use sluice_metrics::HistogramSnapshot;

/// The content type of the text this module writes.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A family's `# TYPE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (a restart starts it again at 0).
    Counter,
    /// Any value now.
    Gauge,
    /// Buckets, a sum and a count.
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A sample's own labels (the common ones are added to each).
pub type Labels<'a> = &'a [(&'a str, &'a str)];

/// One scrape's text, built family by family.
#[derive(Debug)]
pub struct Exposition {
    /// Labels every sample carries, sorted by name.
    common: Vec<(String, String)>,
    /// Family name → its text (HELP, TYPE, samples).
    families: BTreeMap<String, String>,
}

impl Exposition {
    /// An empty exposition whose samples all carry `common`.
    pub fn new(mut common: Vec<(String, String)>) -> Exposition {
        common.sort();
        Exposition {
            common,
            families: BTreeMap::new(),
        }
    }

    /// Starts family `name` (its `# HELP` and `# TYPE` lines); its samples
    /// follow through the [`Family`].
    pub fn family<'x>(&'x mut self, name: &'x str, help: &str, kind: Kind) -> Family<'x> {
        let mut text = String::new();
        text.push_str("# HELP ");
        text.push_str(name);
        text.push(' ');
        for c in help.chars() {
            match c {
                '\\' => text.push_str("\\\\"),
                '\n' => text.push_str("\\n"),
                c => text.push(c),
            }
        }
        let _ = write!(text, "\n# TYPE {name} {}\n", kind.as_str());
        Family {
            common: &self.common,
            name,
            text,
            families: &mut self.families,
        }
    }

    /// A family of one unlabelled sample.
    pub fn single(&mut self, name: &str, help: &str, kind: Kind, value: f64) {
        self.family(name, help, kind).sample(&[], value);
    }

    /// The text of every family, sorted by name.
    pub fn finish(self) -> String {
        self.families.into_values().collect()
    }
}

/// One family being written; it joins the exposition when dropped.
#[derive(Debug)]
pub struct Family<'x> {
    common: &'x [(String, String)],
    name: &'x str,
    text: String,
    families: &'x mut BTreeMap<String, String>,
}

impl Family<'_> {
    /// A sample of the family with `labels` (besides the common ones).
    pub fn sample(&mut self, labels: Labels<'_>, value: f64) -> &mut Self {
        self.line("", labels, None, value);
        self
    }

    /// A histogram's samples: its buckets (cumulative, `+Inf` last), sum
    /// and count; recorded values are divided by `per_unit` (1e9:
    /// nanoseconds to seconds; a division, so that bounds such as 10 µs
    /// print as `1e-05`, not with a multiplication's rounding noise).
    pub fn histogram(
        &mut self,
        labels: Labels<'_>,
        h: &HistogramSnapshot,
        per_unit: f64,
    ) -> &mut Self {
        let mut total = 0u64;
        for (i, &count) in h.counts.iter().enumerate() {
            total += count;
            let le = match h.bounds.get(i) {
                Some(&b) => number(b as f64 / per_unit),
                None => "+Inf".to_owned(),
            };
            self.line("_bucket", labels, Some(&le), total as f64);
        }
        if h.counts.is_empty() {
            self.line("_bucket", labels, Some("+Inf"), 0.0);
        }
        self.line("_sum", labels, None, h.sum as f64 / per_unit);
        self.line("_count", labels, None, h.count() as f64);
        self
    }

    fn line(&mut self, suffix: &str, labels: Labels<'_>, le: Option<&str>, value: f64) {
        let t = &mut self.text;
        t.push_str(self.name);
        t.push_str(suffix);
        let mut all: Vec<(&str, &str)> = self
            .common
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .filter(|(k, _)| !labels.iter().any(|(l, _)| l == k))
            .chain(labels.iter().copied())
            .collect();
        all.sort_by(|a, b| a.0.cmp(b.0));
        if let Some(le) = le {
            all.push(("le", le));
        }
        if !all.is_empty() {
            t.push('{');
            for (i, (k, v)) in all.iter().enumerate() {
                if i > 0 {
                    t.push(',');
                }
                t.push_str(k);
                t.push_str("=\"");
                for c in v.chars() {
                    match c {
                        '\\' => t.push_str("\\\\"),
                        '"' => t.push_str("\\\""),
                        '\n' => t.push_str("\\n"),
                        c => t.push(c),
                    }
                }
                t.push('"');
            }
            t.push('}');
        }
        t.push(' ');
        t.push_str(&number(value));
        t.push('\n');
    }
}

impl Drop for Family<'_> {
    fn drop(&mut self) {
        self.families
            .entry(self.name.to_owned())
            .or_default()
            .push_str(&std::mem::take(&mut self.text));
    }
}

/// A sample value as the format spells it (`+Inf`, `NaN`, shortest
/// round-trip decimal otherwise).
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_owned()
    } else if v == f64::INFINITY {
        "+Inf".to_owned()
    } else if v == f64::NEG_INFINITY {
        "-Inf".to_owned()
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn common() -> Vec<(String, String)> {
        vec![
            ("vol_name".into(), "v".into()),
            ("mp".into(), "/m \"x\"\\".into()),
        ]
    }

    #[test]
    fn counters_keep_their_names_and_labels_are_sorted() {
        let mut x = Exposition::new(common());
        x.single(
            "juicefs_blockcache_hits",
            "read from cached block",
            Kind::Counter,
            3.0,
        );
        x.family(
            "juicefs_fuse_ops_total",
            "Total number of operations.",
            Kind::Counter,
        )
        .sample(&[("method", "read")], 2.0)
        .sample(&[("method", "write")], 1.5);
        let text = x.finish();
        assert_eq!(
            text,
            "# HELP juicefs_blockcache_hits read from cached block\n\
             # TYPE juicefs_blockcache_hits counter\n\
             juicefs_blockcache_hits{mp=\"/m \\\"x\\\"\\\\\",vol_name=\"v\"} 3\n\
             # HELP juicefs_fuse_ops_total Total number of operations.\n\
             # TYPE juicefs_fuse_ops_total counter\n\
             juicefs_fuse_ops_total{method=\"read\",mp=\"/m \\\"x\\\"\\\\\",vol_name=\"v\"} 2\n\
             juicefs_fuse_ops_total{method=\"write\",mp=\"/m \\\"x\\\"\\\\\",vol_name=\"v\"} 1.5\n"
        );
    }

    #[test]
    fn histograms_are_cumulative_with_le_last() {
        let h = sluice_metrics::Histogram::new(vec![1_000, 2_000]);
        for v in [500, 1_500, 1_500, 9_000] {
            h.observe(v);
        }
        let mut x = Exposition::new(Vec::new());
        x.family("h_seconds", "help\nmore", Kind::Histogram)
            .histogram(&[("method", "GET")], &h.snapshot(), 1e6);
        assert_eq!(
            x.finish(),
            "# HELP h_seconds help\\nmore\n\
             # TYPE h_seconds histogram\n\
             h_seconds_bucket{method=\"GET\",le=\"0.001\"} 1\n\
             h_seconds_bucket{method=\"GET\",le=\"0.002\"} 3\n\
             h_seconds_bucket{method=\"GET\",le=\"+Inf\"} 4\n\
             h_seconds_sum{method=\"GET\"} 0.0125\n\
             h_seconds_count{method=\"GET\"} 4\n"
        );
    }

    #[test]
    fn special_values_are_spelled_as_the_format_says() {
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(number(f64::NEG_INFINITY), "-Inf");
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(5242880.0), "5242880");
        assert_eq!(number(0.25), "0.25");
    }
}
