//! `sluice gc META_URL [--delete]`: objects no slice references.

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::Context as _;
use sluice_engine::gc::{GcReport, collect_garbage};
use sluice_engine::meta::MetaUrl;
use sluice_engine::size::format_size;
use sluice_engine::volume::open_volume_url;

/// Arguments of `sluice gc`.
#[derive(Debug, clap::Args)]
pub struct GcArgs {
    /// Metadata engine URL, e.g. sqlite3:///var/lib/sluice/vol.db
    pub meta_url: MetaUrl,
    /// Delete the leaked objects (without it, only report them).
    #[arg(long)]
    pub delete: bool,
    /// Spare objects younger than this many seconds (slices still being written).
    #[arg(long, default_value_t = 3600)]
    pub min_age: u64,
    /// Print the result as one JSON object (for scripts) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `sluice gc`.
pub fn run(args: GcArgs) -> anyhow::Result<()> {
    let volume = open_volume_url(args.meta_url.expose())
        .with_context(|| format!("cannot open the volume at {}", args.meta_url))?;
    let bar = if std::io::stderr().is_terminal() {
        let b = indicatif::ProgressBar::new_spinner();
        b.set_message("listing the objects");
        b.enable_steady_tick(Duration::from_millis(200));
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut styled = false;
    let report = collect_garbage(
        &volume,
        Duration::from_secs(args.min_age),
        !args.delete,
        &mut |r| {
            // Listed: now the length of the sweep is known.
            if !styled {
                bar.set_length(r.listed as u64);
                if let Ok(style) = indicatif::ProgressStyle::with_template(
                    "{bar:30} {pos}/{len} objects, {msg} [{elapsed}]",
                ) {
                    bar.set_style(style);
                }
                styled = true;
            }
            bar.set_position(r.scanned as u64);
            bar.set_message(progress_message(r));
        },
    )
    .with_context(|| format!("cannot sweep the objects of {}", args.meta_url))?;
    bar.finish_and_clear();
    if args.json {
        println!("{}", report_json(&report, args.delete));
        return Ok(());
    }
    println!(
        "scanned {} objects: {} referenced, {} unreferenced but recent (spared), {} leaked ({}){}",
        report.scanned,
        report.referenced,
        report.too_recent,
        report.orphans.len(),
        format_size(report.orphan_bytes),
        if args.delete {
            ", deleted"
        } else {
            "; run with --delete to remove them"
        }
    );
    for key in &report.orphans {
        println!("  {key}");
    }
    Ok(())
}

/// The result as `--json` prints it: the counts, the leaked objects'
/// bytes and keys, and whether they were deleted.
fn report_json(r: &GcReport, deleted: bool) -> serde_json::Value {
    serde_json::json!({
        "scanned": r.scanned,
        "referenced": r.referenced,
        "spared_recent": r.too_recent,
        "leaked": r.orphans.len(),
        "leaked_bytes": r.orphan_bytes,
        "deleted": deleted,
        "leaked_objects": r.orphans,
    })
}

/// What the progress bar says beside the count of objects looked at.
fn progress_message(r: &GcReport) -> String {
    format!(
        "{} leaked ({})",
        r.orphans.len(),
        format_size(r.orphan_bytes)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_names_the_leaked_bytes_with_a_unit() {
        let r = GcReport {
            listed: 10,
            scanned: 4,
            orphans: vec!["a".into(), "b".into()],
            orphan_bytes: 5 << 20,
            ..GcReport::default()
        };
        assert_eq!(progress_message(&r), "2 leaked (5.00 MiB)");
        let j = report_json(&r, false);
        assert_eq!(j["leaked"], 2);
        assert_eq!(j["leaked_bytes"], 5 << 20);
        assert_eq!(j["leaked_objects"][1], "b");
        assert_eq!(j["deleted"], false);
    }
}
