//! `--metrics ADDR` / `--no-metrics` of `sluice mount` and `sluice serve`.

use crate::metrics::http::{self, DEFAULT_ADDR};

/// Where the daemon serves its Prometheus metrics.
#[derive(Debug, Clone, clap::Args)]
pub struct MetricsArgs {
    /// Serve Prometheus metrics at http://ADDR/metrics (JuiceFS's names
    /// where they mean the same, plus `sluice_` ones); when the port is
    /// taken, the next free one. `sluice stats` needs no endpoint (it asks
    /// the control socket).
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_ADDR)]
    pub metrics: String,
    /// Serve no metrics endpoint.
    #[arg(long)]
    pub no_metrics: bool,
}

impl MetricsArgs {
    /// Binds the endpoint's socket (None with `--no-metrics`). An address
    /// that does not parse is an error; a daemon that cannot bind a valid
    /// one says why and runs on without an endpoint, as JuiceFS does:
    /// metrics must never keep a volume from being served.
    pub fn bind(&self) -> anyhow::Result<Option<http::Bound>> {
        if self.no_metrics {
            return Ok(None);
        }
        let addr = http::parse(&self.metrics)?;
        Ok(http::bind(addr)
            .map_err(|e| log::warn!("no metrics endpoint: {e:#}"))
            .ok())
    }
}
