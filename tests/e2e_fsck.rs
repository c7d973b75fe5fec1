//! End-to-end: `sluice fsck` on volumes written through a real mount finds
//! nothing; on volumes damaged on purpose — an object deleted, a byte of
//! another flipped, the usage counters and a directory's statistics
//! corrupted — it finds each damage, agrees with `juicefs fsck` on what
//! both can see, and `--repair` fixes the counters and statistics (which
//! `juicefs fsck` then finds sound too). SQLite and Redis metadata.

mod common;

use std::fs;
use std::os::unix::fs::{FileExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::{Mount, RedisServer, Volume, Watchdog, sluice, sluice_ok, text};
use sluice_engine::meta::open_meta;

/// 5 MiB + 3 bytes: blocks of 4 MiB and 1 MiB + 3.
const DATA_LEN: usize = (5 << 20) + 3;
/// One block of 100 000 bytes.
const OTHER_LEN: usize = 100_000;

/// A tree with every kind of node the counters and statistics count: a
/// file of two blocks, a small one, a hard link, a symlink, a sparse file,
/// nested directories, a renamed directory and a removed file (in the
/// trash, when the volume has one).
fn populate(root: &Path) -> u64 {
    let data: Vec<u8> = (0..DATA_LEN).map(|i| (i % 251) as u8).collect();
    fs::write(root.join("data.bin"), &data).unwrap();
    fs::create_dir_all(root.join("dir/sub")).unwrap();
    fs::write(root.join("dir/other.bin"), vec![7u8; OTHER_LEN]).unwrap();
    fs::write(root.join("dir/sub/small.txt"), b"hello fsck\n").unwrap();
    fs::hard_link(root.join("dir/sub/small.txt"), root.join("hard")).unwrap();
    std::os::unix::fs::symlink("dir/sub/small.txt", root.join("link")).unwrap();
    let f = fs::File::create(root.join("sparse")).unwrap();
    f.write_all_at(b"far away", 70 << 20).unwrap();
    drop(f);
    fs::create_dir(root.join("tmp")).unwrap();
    fs::rename(root.join("tmp"), root.join("dir/moved")).unwrap();
    fs::write(root.join("gone"), b"removed").unwrap();
    fs::remove_file(root.join("gone")).unwrap();
    fs::metadata(root.join("dir")).unwrap().ino()
}

/// The block object whose key ends with `suffix` (`_{indx}_{size}`).
fn object_ending(vol: &Volume, suffix: &str) -> PathBuf {
    let found: Vec<PathBuf> = vol
        .objects()
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    assert_eq!(found.len(), 1, "one object ends with {suffix}: {found:?}");
    found.into_iter().next().unwrap()
}

fn juicefs() -> Option<PathBuf> {
    std::env::var_os("SLUICE_JUICEFS_BIN").map(PathBuf::from)
}

fn run_juicefs(jfs: &Path, args: &[&str]) -> Output {
    Command::new(jfs)
        .args(args)
        .env("JFS_NO_CHECK_OBJECT_STORAGE", "1")
        .output()
        .expect("juicefs runs")
}

/// Writes the tree through a mount of `meta_url` and unmounts.
fn write_tree(meta_url: &str, dir: &Path, name: &str) -> u64 {
    let mnt = dir.join(name);
    fs::create_dir_all(&mnt).unwrap();
    let m = Mount::start(meta_url, &mnt, &dir.join(format!("{name}.log")), &[]);
    let dir_ino = populate(&m.path);
    m.unmount();
    dir_ino
}

/// Corrupts the usage counters and the statistics of directory `dir_ino`
/// through the engine's own records.
fn corrupt_counters(meta_url: &str, dir_ino: u64) {
    let meta = open_meta(meta_url).expect("the metadata opens");
    meta.load().expect("a volume");
    meta.add_usage(12_345 * 4096, 7).unwrap();
    let mut stat = meta.dir_stat(dir_ino).unwrap().expect("dir has statistics");
    stat.used_inodes += 5;
    stat.data_length -= 1000;
    meta.set_dir_stat(dir_ino, &stat).unwrap();
}

#[test]
fn fsck_finds_each_damage_agrees_with_juicefs_and_repairs_the_counters() {
    let _dog = Watchdog::new("fsck-sqlite", Duration::from_secs(600));
    let vol = Volume::format("fsckvol", &[]);
    let dir = vol.dir.path();
    let dir_ino = write_tree(&vol.meta_url, dir, "mnt");

    // A volume written through a mount is sound, to both tools.
    let out = sluice_ok(&["fsck", &vol.meta_url]);
    assert!(out.contains("no problems found"), "{out}");
    assert!(!out.contains("wrong"), "{out}");
    let jfs = juicefs();
    if let Some(jfs) = &jfs {
        let out = run_juicefs(jfs, &["fsck", &vol.meta_url]);
        assert!(
            out.status.success(),
            "juicefs fsck on a sound volume: {}",
            text(&out)
        );
    } else {
        eprintln!("juicefs comparisons skipped: SLUICE_JUICEFS_BIN is not set");
    }
    // So is one loaded from its dump (the load computes the counters and
    // statistics itself).
    let dump = dir.join("dump.json");
    sluice_ok(&["dump", &vol.meta_url, dump.to_str().unwrap()]);
    let loaded = format!("sqlite3://{}", dir.join("loaded.db").display());
    sluice_ok(&["load", &loaded, dump.to_str().unwrap()]);
    let out = sluice_ok(&["fsck", &loaded]);
    assert!(out.contains("no problems found"), "loaded volume: {out}");

    // Damage: the second block of data.bin goes, a byte of other.bin
    // flips, the counters and dir's statistics are corrupted.
    let lost = object_ending(&vol, &format!("_1_{}", DATA_LEN - (4 << 20)));
    fs::remove_file(&lost).unwrap();
    let lost_name = lost.file_name().unwrap().to_string_lossy().into_owned();
    let flipped = object_ending(&vol, &format!("_0_{OTHER_LEN}"));
    let f = fs::OpenOptions::new().write(true).open(&flipped).unwrap();
    f.write_all_at(&[8u8], 4321).unwrap();
    drop(f);
    let flipped_name = flipped.file_name().unwrap().to_string_lossy().into_owned();
    corrupt_counters(&vol.meta_url, dir_ino);

    let out = sluice(&["fsck", &vol.meta_url]);
    let report = text(&out);
    assert!(
        !out.status.success(),
        "fsck of a damaged volume fails: {report}"
    );
    assert!(
        report.contains("lost block fsckvol/chunks/")
            && report.contains(&format!("{lost_name} of /data.bin")),
        "the lost block: {report}"
    );
    assert!(
        report.contains("corrupt block")
            && report.contains(&format!("{flipped_name} of /dir/other.bin")),
        "the flipped byte: {report}"
    );
    assert!(
        report.contains("usage counters wrong"),
        "the counters: {report}"
    );
    assert!(
        report.contains(&format!(
            "directory statistics of /dir (inode {dir_ino}) wrong"
        )),
        "dir's statistics: {report}"
    );
    // The same findings as JSON, for scripts; the exit status the same.
    let out = sluice(&["fsck", &vol.meta_url, "--json"]);
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let j: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert_eq!(j["clean"], false, "{j}");
    let kinds: Vec<(String, String)> = j["damaged_blocks"]
        .as_array()
        .expect("damaged_blocks")
        .iter()
        .map(|d| {
            (
                d["path"].as_str().unwrap_or_default().to_owned(),
                d["damage"]["kind"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert!(
        kinds.contains(&("/data.bin".into(), "missing".into())),
        "{j}"
    );
    assert!(
        kinds.contains(&("/dir/other.bin".into(), "corrupt".into())),
        "{j}"
    );
    assert!(j["usage"].is_object(), "{j}");
    assert!(
        j["dir_stats"]
            .as_array()
            .is_some_and(|a| a.iter().any(|m| m["path"] == "/dir")),
        "{j}"
    );
    // `--fast` lists objects only, as juicefs does: the flipped byte hides.
    let fast = text(&sluice(&["fsck", &vol.meta_url, "--fast"]));
    assert!(fast.contains(&lost_name), "{fast}");
    assert!(!fast.contains(&flipped_name), "{fast}");

    if let Some(jfs) = &jfs {
        // juicefs finds the same lost block of the same file, and (never
        // reading data) not the flipped byte.
        let out = run_juicefs(jfs, &["fsck", &vol.meta_url]);
        let theirs = text(&out);
        assert!(!out.status.success(), "juicefs fsck fails too: {theirs}");
        assert!(
            theirs.contains(&lost_name) && theirs.contains("/data.bin"),
            "juicefs names the lost block: {theirs}"
        );
        assert!(!theirs.contains(&flipped_name), "{theirs}");
        // And the same broken statistics of dir.
        let out = run_juicefs(
            jfs,
            &[
                "fsck",
                &vol.meta_url,
                "--path",
                "/dir",
                "--recursive",
                "--sync-dir-stat",
            ],
        );
        let theirs = text(&out);
        assert!(
            theirs.contains("usage stat of /dir "),
            "juicefs on dir: {theirs}"
        );
    }

    // --repair fixes the counters and the statistics, not the data.
    let out = sluice(&["fsck", &vol.meta_url, "--repair"]);
    let repaired = text(&out);
    assert!(
        !out.status.success(),
        "lost data stays a failure: {repaired}"
    );
    assert!(repaired.contains("usage counters repaired"), "{repaired}");
    assert!(
        repaired.contains("directory statistics of /dir"),
        "{repaired}"
    );
    let after = text(&sluice(&["fsck", &vol.meta_url]));
    assert!(!after.contains("usage counters wrong"), "{after}");
    assert!(!after.contains("directory statistics of"), "{after}");
    assert!(
        after.contains(&lost_name) && after.contains(&flipped_name),
        "{after}"
    );
    if let Some(jfs) = &jfs {
        let out = run_juicefs(
            jfs,
            &[
                "fsck",
                &vol.meta_url,
                "--path",
                "/dir",
                "--recursive",
                "--sync-dir-stat",
            ],
        );
        let theirs = text(&out);
        assert!(
            !theirs.contains("usage stat of"),
            "juicefs after the repair: {theirs}"
        );
    }

    // A path limits the check to its tree: dir holds no lost block, only
    // the flipped one.
    let out = sluice(&["fsck", &vol.meta_url, "--path", "/dir"]);
    let sub = text(&out);
    assert!(
        sub.contains(&flipped_name) && !sub.contains(&lost_name),
        "{sub}"
    );
    let out = sluice(&["fsck", &vol.meta_url, "--path", "dir"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("absolute path"), "{}", text(&out));
}

#[test]
fn fsck_repairs_a_redis_volume() {
    let _dog = Watchdog::new("fsck-redis", Duration::from_secs(600));
    let Some(redis) = RedisServer::start("fsck") else {
        eprintln!("fsck_repairs_a_redis_volume: skipped: no redis-server");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let meta_url = redis.url(3);
    let bucket = dir.join("bucket");
    sluice_ok(&[
        "format",
        &meta_url,
        "rfsck",
        "--bucket",
        bucket.to_str().unwrap(),
    ]);
    let dir_ino = write_tree(&meta_url, dir, "mnt");
    let out = sluice_ok(&["fsck", &meta_url]);
    assert!(out.contains("no problems found"), "{out}");

    corrupt_counters(&meta_url, dir_ino);
    let out = sluice(&["fsck", &meta_url]);
    let report = text(&out);
    assert!(!out.status.success(), "{report}");
    assert!(report.contains("usage counters wrong"), "{report}");
    assert!(report.contains("directory statistics of /dir"), "{report}");
    if let Some(jfs) = juicefs() {
        let out = run_juicefs(
            &jfs,
            &[
                "fsck",
                &meta_url,
                "--path",
                "/dir",
                "--recursive",
                "--sync-dir-stat",
            ],
        );
        assert!(text(&out).contains("usage stat of /dir "), "{}", text(&out));
    }
    let out = sluice_ok(&["fsck", &meta_url, "--repair"]);
    assert!(out.contains("usage counters repaired"), "{out}");
    let out = sluice_ok(&["fsck", &meta_url]);
    assert!(out.contains("no problems found"), "{out}");
}
