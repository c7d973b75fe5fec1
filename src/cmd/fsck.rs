//! `sluice fsck META_URL [--path P] [--repair] [--fast]`: checks a volume's
//! metadata against its object store and against itself (see
//! `sluice_engine::fsck`), and repairs the usage counters and directory
//! statistics. Exits 1 while anything it found stays wrong.

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::Context as _;
use sluice_engine::fsck::{BlockDamage, FsckOptions, FsckReport, fsck};
use sluice_engine::meta::{DirStat, MetaUrl};
use sluice_engine::size::{format_size, format_size_exact};
use sluice_engine::volume::open_volume_url;

/// Arguments of `sluice fsck`.
#[derive(Debug, clap::Args)]
pub struct FsckArgs {
    /// Metadata engine URL, e.g. sqlite3:///var/lib/sluice/vol.db
    pub meta_url: MetaUrl,
    /// Check only this absolute path within the volume (a file or a
    /// directory tree); the volume-wide checks (usage counters, orphaned
    /// chunks, unreferenced objects) need `/`.
    #[arg(long, default_value = "/")]
    pub path: String,
    /// Rewrite the usage counters and directory statistics found wrong
    /// (run it on a volume no client is writing).
    #[arg(long)]
    pub repair: bool,
    /// Only list and size the objects, as `juicefs fsck` does; without it
    /// every block a file needs is read and its CRC32C checked.
    #[arg(long)]
    pub fast: bool,
    /// Report objects no chunk names only when older than this many
    /// seconds (younger ones may belong to a slice being written).
    #[arg(long, default_value_t = 3600)]
    pub min_age: u64,
    /// Blocks read at once for the CRC32C check.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub threads: u64,
    /// Print what was found as one JSON object (for scripts) instead of
    /// text; the exit status is the same.
    #[arg(long)]
    pub json: bool,
}

fn stat(s: &DirStat) -> String {
    format!(
        "length {} space {} inodes {}",
        signed_size(s.data_length),
        signed_size(s.used_space),
        s.used_inodes
    )
}

/// A stored byte count, which a damaged record may have made negative.
fn signed_size(bytes: i64) -> String {
    match u64::try_from(bytes) {
        Ok(b) => format_size_exact(b),
        Err(_) => format!("{bytes} bytes"),
    }
}

/// The progress line while the check runs: what was walked and found, and
/// (unless `fast`) how much of it was read back.
fn progress_line(r: &FsckReport, fast: bool) -> String {
    let mut line = format!(
        "{} nodes, {} files, {} blocks ({})",
        r.nodes,
        r.files,
        r.blocks,
        format_size(r.block_bytes)
    );
    if !fast {
        line.push_str(&format!(
            "; read back {} blocks ({})",
            r.read_blocks,
            format_size(r.read_bytes)
        ));
    }
    line
}

/// What the run found as `--json` prints it: the counts, each problem with
/// the fields the text names, and whether the volume is clean.
fn report_json(r: &FsckReport) -> serde_json::Value {
    use serde_json::json;
    let damage = |d: &BlockDamage| match d {
        BlockDamage::Missing => json!({"kind": "missing"}),
        BlockDamage::Size { expected, actual } => {
            json!({"kind": "size", "expected": expected, "actual": actual})
        }
        BlockDamage::Corrupt(why) => json!({"kind": "corrupt", "why": why}),
        BlockDamage::Unreadable(why) => json!({"kind": "unreadable", "why": why}),
    };
    let stat = |s: &DirStat| json!({"length": s.data_length, "space": s.used_space, "inodes": s.used_inodes});
    json!({
        "nodes": r.nodes,
        "files": r.files,
        "slices": r.slices,
        "blocks": r.blocks,
        "block_bytes": r.block_bytes,
        "read_blocks": r.read_blocks,
        "read_bytes": r.read_bytes,
        "damaged_blocks": r.damaged.iter().map(|d| json!({
            "key": d.key,
            "inode": d.ino,
            "path": r.broken_files.get(&d.ino),
            "damage": damage(&d.damage),
        })).collect::<Vec<_>>(),
        "broken_slices": r.broken_slices.iter().map(|b| json!({
            "inode": b.ino,
            "chunk": b.indx,
            "slice": b.slice.id,
            "size": b.slice.size,
            "pos": b.slice.pos,
            "off": b.slice.off,
            "len": b.slice.len,
            "reason": b.reason,
        })).collect::<Vec<_>>(),
        "broken_files": r.broken_files.iter().map(|(ino, path)| json!({
            "inode": ino,
            "path": path,
        })).collect::<Vec<_>>(),
        "orphan_chunks": r.orphan_chunks.iter().map(|(ino, indx)| json!({
            "inode": ino,
            "chunk": indx,
        })).collect::<Vec<_>>(),
        "usage": r.usage.as_ref().map(|m| json!({
            "stored": m.stored.map(|(s, i)| json!({"space": s, "inodes": i})),
            "actual": {"space": m.actual.0, "inodes": m.actual.1},
        })),
        "dir_stats": r.dir_stats.iter().map(|m| json!({
            "inode": m.ino,
            "path": m.path,
            "stored": m.stored.as_ref().map(stat),
            "actual": stat(&m.actual),
        })).collect::<Vec<_>>(),
        "dir_nlinks": r.nlinks.iter().map(|m| json!({
            "inode": m.ino,
            "path": m.path,
            "stored": m.stored,
            "actual": m.actual,
        })).collect::<Vec<_>>(),
        "unreferenced_objects": r.unreferenced,
        "unreferenced_bytes": r.unreferenced_bytes,
        "orphan_space_records": r.orphan_space_records,
        "repaired": r.repaired,
        "clean": r.clean(),
    })
}

/// Prints what the run found, one line per problem.
fn print_report(r: &FsckReport, repair: bool) {
    for d in &r.damaged {
        let path = r.broken_files.get(&d.ino).map_or("?", String::as_str);
        match &d.damage {
            BlockDamage::Missing => {
                println!("lost block {} of {path} (inode {})", d.key, d.ino)
            }
            BlockDamage::Size { expected, actual } => println!(
                "block {} of {path} (inode {}) is {actual} bytes, not {expected}",
                d.key, d.ino
            ),
            BlockDamage::Corrupt(why) => {
                println!("corrupt block {} of {path} (inode {}): {why}", d.key, d.ino)
            }
            BlockDamage::Unreadable(why) => {
                println!(
                    "unreadable block {} of {path} (inode {}): {why}",
                    d.key, d.ino
                )
            }
        }
    }
    for b in &r.broken_slices {
        let path = r.broken_files.get(&b.ino).map_or("?", String::as_str);
        println!(
            "broken slice reference in chunk {} of {path} (inode {}): slice {} ({} bytes): {}",
            b.indx, b.ino, b.slice.id, b.slice.size, b.reason
        );
    }
    for (ino, indx) in &r.orphan_chunks {
        println!("orphaned chunk {indx} of inode {ino}: the node does not exist");
    }
    let done = if repair { "repaired" } else { "wrong" };
    if let Some(m) = &r.usage {
        let (s, i) = m.stored.unwrap_or_default();
        println!(
            "usage counters {done}: usedSpace {} totalInodes {i}; the tree holds {} in {} inodes",
            signed_size(s),
            signed_size(m.actual.0),
            m.actual.1
        );
    }
    for m in &r.dir_stats {
        println!(
            "directory statistics of {} (inode {}) {done}: stored {}, entries say {}",
            m.path,
            m.ino,
            m.stored.as_ref().map_or("nothing".into(), stat),
            stat(&m.actual)
        );
    }
    for m in &r.nlinks {
        println!(
            "link count of directory {} (inode {}) is {}, should be {} (fsck does not change it)",
            m.path,
            m.ino,
            m.stored.unwrap_or_default(),
            m.actual
        );
    }
    println!(
        "checked {} nodes, {} files, {} slices, {} blocks ({})",
        r.nodes,
        r.files,
        r.slices,
        r.blocks,
        format_size(r.block_bytes)
    );
    if r.unreferenced > 0 {
        println!(
            "{} objects ({}) are referenced by no chunk; `sluice gc --delete` removes them",
            r.unreferenced,
            format_size(r.unreferenced_bytes)
        );
    }
    if r.orphan_space_records > 0 {
        let what = if repair {
            "removed"
        } else {
            "`--repair` removes them"
        };
        println!(
            "{} space records name files that no longer exist (removed by a client that keeps none); {what}",
            r.orphan_space_records
        );
    }
    if !r.broken_files.is_empty() {
        let lost = r.damaged.len();
        println!(
            "{lost} damaged blocks, {} broken slice references, {} broken files:",
            r.broken_slices.len(),
            r.broken_files.len()
        );
        println!("{:>13}: PATH", "INODE");
        for (ino, path) in &r.broken_files {
            println!("{ino:>13}: {path}");
        }
    }
}

/// Runs `sluice fsck`.
pub fn run(args: FsckArgs) -> anyhow::Result<()> {
    let volume = open_volume_url(args.meta_url.expose())
        .with_context(|| format!("cannot open the volume at {}", args.meta_url))?;
    let opts = FsckOptions {
        path: args.path.clone(),
        repair: args.repair,
        fast: args.fast,
        min_age: Duration::from_secs(args.min_age),
        threads: args.threads as usize,
    };
    let bar = if std::io::stderr().is_terminal() {
        let b = indicatif::ProgressBar::new_spinner();
        if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {msg} [{elapsed}]") {
            b.set_style(style);
        }
        b.enable_steady_tick(Duration::from_millis(200));
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let report = fsck(&volume, &opts, &mut |r| {
        bar.set_message(progress_line(r, args.fast))
    })
    .with_context(|| format!("cannot check {}", args.meta_url))?;
    bar.finish_and_clear();
    if args.json {
        println!("{}", report_json(&report));
    } else {
        print_report(&report, args.repair);
    }
    if report.unrepaired() {
        let repairable = report.usage.is_some() || !report.dir_stats.is_empty();
        anyhow::bail!(
            "{} has problems{}",
            args.meta_url,
            if args.repair {
                " fsck cannot repair (listed above)"
            } else if repairable {
                " (listed above); --repair fixes the usage counters and directory statistics"
            } else {
                " fsck cannot repair (listed above)"
            }
        );
    }
    if report.clean() && !args.json {
        println!("no problems found");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_and_sizes_carry_units() {
        let r = FsckReport {
            nodes: 7,
            files: 3,
            blocks: 5,
            block_bytes: 9 << 20,
            read_blocks: 2,
            read_bytes: 3 << 19,
            ..FsckReport::default()
        };
        assert_eq!(
            progress_line(&r, false),
            "7 nodes, 3 files, 5 blocks (9.00 MiB); read back 2 blocks (1.50 MiB)"
        );
        assert_eq!(
            progress_line(&r, true),
            "7 nodes, 3 files, 5 blocks (9.00 MiB)"
        );
        assert_eq!(signed_size(-5), "-5 bytes");
        let j = report_json(&r);
        assert_eq!(
            (j["blocks"].clone(), j["clean"].clone()),
            (5.into(), true.into())
        );
        let damaged = FsckReport {
            damaged: vec![sluice_engine::fsck::DamagedBlock {
                key: "v/chunks/0/0/1_0_4".into(),
                ino: 9,
                damage: BlockDamage::Size {
                    expected: 4,
                    actual: 3,
                },
            }],
            broken_files: [(9, "/f".to_owned())].into(),
            usage: Some(sluice_engine::fsck::Mismatch {
                ino: 0,
                path: "/".into(),
                stored: Some((1, 2)),
                actual: (4096, 3),
            }),
            ..FsckReport::default()
        };
        let j = report_json(&damaged);
        assert_eq!(j["clean"], false);
        assert_eq!(j["damaged_blocks"][0]["path"], "/f");
        assert_eq!(j["damaged_blocks"][0]["damage"]["kind"], "size");
        assert_eq!(j["damaged_blocks"][0]["damage"]["actual"], 3);
        assert_eq!(j["usage"]["actual"]["inodes"], 3);
        assert_eq!(j["usage"]["stored"]["space"], 1);
        assert_eq!(signed_size(4096), "4.00 KiB (4096 bytes)");
    }
}
