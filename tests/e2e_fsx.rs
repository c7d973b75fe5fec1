//! xfstests' `fsx` and `fsstress` against a real kernel mount of the
//! `sluice` binary: the data-integrity checks every Linux file system is
//! held to (engine/DESIGN.md, "Coherence").
//!
//! - `fsx` drives one file through a random mix of reads, writes, mmap reads
//!   and writes, truncates, fallocate, punch hole, zero range and
//!   copy_file_range with operations up to 4 MiB, checking every read
//!   against its own model. Several fixed seeds run at once on the same
//!   mount (so background readahead, compaction and commits interleave).
//! - `fsstress` runs several processes of random namespace and data
//!   operations; afterwards `sluice gc` finds nothing leaked and, when the
//!   `juicefs` binary is at hand (SLUICE_JUICEFS_BIN), `juicefs fsck` finds
//!   nothing broken.
//!
//! The tools are the static builds in `../shared/tools/xfstests/` (or the
//! folder SLUICE_XFSTESTS_TOOLS names); without them the tests say why and
//! return. SLUICE_FSX_OPS and SLUICE_FSX_SEEDS (comma-separated) widen the
//! run for a soak.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::{Volume, Watchdog, sluice_ok, text};

/// Seeds run in CI. Each found a bug in an earlier build or covers a mix
/// of operations the others do not reach (see the commit that added it).
const SEEDS: &[u64] = &[1, 2, 3, 4];

/// Operations per seed in CI (`fsx -N`).
const OPS: u64 = 10_000;

/// The folder holding `fsx` and `fsstress`: SLUICE_XFSTESTS_TOOLS, else
/// the shared tools beside the checkout, else the workplace's copy (a fresh
/// clone elsewhere has no `../shared`).
fn tools(test: &str) -> Option<PathBuf> {
    let candidates: Vec<PathBuf> = match std::env::var_os("SLUICE_XFSTESTS_TOOLS") {
        Some(dir) => vec![PathBuf::from(dir)],
        None => vec![
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/tools/xfstests"),
            PathBuf::from("/work/shared/tools/xfstests"),
        ],
    };
    let found = candidates
        .iter()
        .find(|d| d.join("fsx").is_file() && d.join("fsstress").is_file());
    if found.is_none() {
        eprintln!("{test}: skipped: no fsx/fsstress in {candidates:?} (set SLUICE_XFSTESTS_TOOLS)");
    }
    found.cloned()
}

fn have_fuse(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let ok = std::path::Path::new("/dev/fuse").exists() && root;
    if !ok {
        eprintln!("{test}: skipped: needs root and /dev/fuse");
    }
    ok
}

fn env_list(name: &str) -> Option<Vec<u64>> {
    let v = std::env::var(name).ok()?;
    Some(
        v.split(',')
            .map(|s| s.trim().parse().expect("a number"))
            .collect(),
    )
}

#[test]
fn fsx_finds_no_bad_data_with_large_operations_and_mmap() {
    let test = "fsx";
    let Some(tools) = tools(test) else { return };
    if !have_fuse(test) {
        return;
    }
    let _dog = Watchdog::new(test, Duration::from_secs(1800));
    let vol = Volume::format("fsx", &["--trash-days", "0"]);
    let mnt = vol.mount("mnt");
    let seeds = env_list("SLUICE_FSX_SEEDS").unwrap_or_else(|| SEEDS.to_vec());
    let ops = std::env::var("SLUICE_FSX_OPS")
        .ok()
        .map(|v| v.parse::<u64>().expect("a number"))
        .unwrap_or(OPS);
    // Two at a time: enough to interleave background work, few enough for
    // a 2-core machine.
    for pair in seeds.chunks(2) {
        let runs: Vec<_> = pair
            .iter()
            .map(|seed| {
                let file = mnt.path.join(format!("fsx.{seed}"));
                let child = Command::new(tools.join("fsx"))
                    .args(["-N", &ops.to_string(), "-S", &seed.to_string()])
                    .args(["-l", "80000000", "-o", "4194304", "-q"])
                    .arg(&file)
                    .current_dir(vol.dir.path())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("fsx starts");
                (seed, file, child)
            })
            .collect();
        for (seed, file, child) in runs {
            let out = child.wait_with_output().expect("fsx runs");
            let report = text(&out);
            assert!(
                out.status.success(),
                "fsx seed {seed} ({ops} ops) failed; its log of operations is \
                 {}.fsxops:\n{report}\nsluice log:\n{}",
                file.display(),
                mnt.log_text()
            );
        }
    }
    mnt.unmount();
    let gc = sluice_ok(&["gc", &vol.meta_url]);
    assert!(gc.contains(" 0 leaked"), "sluice gc after fsx:\n{gc}");
}

#[test]
fn fsstress_leaves_a_volume_that_gc_and_both_fscks_find_clean() {
    let test = "fsstress";
    let Some(tools) = tools(test) else { return };
    if !have_fuse(test) {
        return;
    }
    let _dog = Watchdog::new(test, Duration::from_secs(1200));
    let vol = Volume::format("stress", &["--trash-days", "0"]);
    let mnt = vol.mount("mnt");
    let work = mnt.path.join("stress");
    std::fs::create_dir(&work).expect("a work directory");
    let ops = std::env::var("SLUICE_FSSTRESS_OPS").unwrap_or_else(|_| "2000".into());
    let out = Command::new(tools.join("fsstress"))
        .arg("-d")
        .arg(&work)
        .args(["-p", "4", "-n", &ops, "-s", "7"])
        .output()
        .expect("fsstress runs");
    assert!(
        out.status.success(),
        "fsstress failed:\n{}\nsluice log:\n{}",
        text(&out),
        mnt.log_text()
    );
    mnt.unmount();
    let gc = sluice_ok(&["gc", &vol.meta_url]);
    assert!(gc.contains(" 0 leaked"), "sluice gc after fsstress:\n{gc}");
    // Every counter, statistic, link count, reference and block the
    // random operations left agrees with the tree.
    let fsck = sluice_ok(&["fsck", &vol.meta_url]);
    assert!(
        fsck.contains("no problems found"),
        "sluice fsck after fsstress:\n{fsck}"
    );
    let Some(jfs) = std::env::var_os("SLUICE_JUICEFS_BIN") else {
        eprintln!("{test}: juicefs fsck skipped: SLUICE_JUICEFS_BIN is not set");
        return;
    };
    let out = Command::new(jfs)
        .args(["fsck", &vol.meta_url])
        .output()
        .expect("juicefs fsck runs");
    let report = text(&out);
    assert!(out.status.success(), "juicefs fsck failed:\n{report}");
    for bad in ["lost", "broken", "ERROR", "FATAL"] {
        assert!(
            !report.contains(bad),
            "juicefs fsck reports {bad}:\n{report}"
        );
    }
}
