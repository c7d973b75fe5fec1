//! `sluice format`, run once and again: what it stores, what it keeps, and
//! what it refuses.

mod common;

use common::{Volume, sha256_file, sluice, sluice_ok, text};

/// The volume's settings as stored.
fn settings(meta_url: &str) -> sluice_engine::format::Format {
    let meta = sluice_engine::meta::open_meta(meta_url).expect("the metadata opens");
    meta.load().expect("a volume")
}

/// A volume an older sluice formatted with `--block-size 3M` (stored as
/// 3072 KiB, which JuiceFS never formats) is still read and written
/// correctly, across a chunk's end; the mount, `sluice info` and `format`
/// run again warn that JuiceFS cannot read it, and `format` keeps its
/// block size (a new request is refused, never applied).
#[test]
fn a_volume_with_an_older_sluices_3_mib_blocks_is_served_and_the_operator_warned() {
    let vol = Volume::format("oldvol", &["--block-size", "2M"]);
    // What an older `sluice format --block-size 3M` stored.
    let db = rusqlite::Connection::open(vol.dir.path().join("meta.db")).expect("the database");
    let json: String = db
        .query_row(
            "SELECT value FROM jfs_setting WHERE name = 'format'",
            [],
            |r| r.get(0),
        )
        .expect("the settings");
    let json = json.replace("\"BlockSize\": 2048", "\"BlockSize\": 3072");
    assert!(json.contains("3072"), "{json}");
    db.execute(
        "UPDATE jfs_setting SET value = ?1 WHERE name = 'format'",
        [&json],
    )
    .expect("settings stored");
    drop(db);

    let data: Vec<u8> = (0..(70u32 << 20) / 4)
        .flat_map(|i| i.wrapping_mul(2_654_435_761).to_le_bytes())
        .collect();
    let m = vol.mount("mnt");
    std::fs::write(m.path.join("f"), &data).expect("write 70 MiB");
    m.unmount();
    let m = vol.mount("mnt");
    let want: [u8; 32] = {
        use sha2::Digest;
        sha2::Sha256::digest(&data).into()
    };
    assert_eq!(
        sha256_file(&m.path.join("f")),
        want,
        "read back from objects"
    );
    // `info FILE --json`: the file's chunks, each slice with its objects.
    let f = m.path.join("f");
    let j = json_of(&["info", f.to_str().expect("a UTF-8 path"), "--json"]);
    assert_eq!(j["length"], 70u64 << 20, "{j}");
    let chunks = j["chunks"].as_array().expect("chunks");
    assert_eq!(chunks.len(), 2, "70 MiB is two 64 MiB chunks: {j}");
    let objects = chunks[0]["slices"][0]["objects"]
        .as_array()
        .expect("objects");
    assert!(
        objects[0].as_str().is_some_and(|k| k.ends_with("_3145728")),
        "{j}"
    );
    let log = m.log_text();
    m.unmount();
    assert!(log.contains("3072 KiB") && log.contains("JuiceFS"), "{log}");
    let chunks = vol.objects();
    assert!(
        chunks
            .iter()
            .any(|p| p.to_string_lossy().ends_with("_3145728")),
        "3 MiB blocks: {chunks:?}"
    );

    let info = sluice_ok(&["info", &vol.meta_url]);
    assert!(
        info.contains("3072 KiB") && info.contains("JuiceFS"),
        "{info}"
    );
    let j = json_of(&["info", &vol.meta_url, "--json"]);
    assert_eq!(j["settings"]["BlockSize"], 3072, "{j}");
    assert!(j["usage"]["used_bytes"].as_u64() >= Some(70 << 20), "{j}");
    let again = sluice_ok(&["format", &vol.meta_url, "oldvol"]);
    assert!(
        again.contains("block size 3072 KiB") && again.contains("JuiceFS"),
        "{again}"
    );
    let out = sluice(&["format", &vol.meta_url, "oldvol", "--block-size", "3M"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("block size cannot change"),
        "{}",
        text(&out)
    );
    assert_eq!(settings(&vol.meta_url).block_size, 3072);
}

/// Formatting again keeps what is left out (compression, bucket, block
/// size, trash days, limits), as `juicefs format` does, and changes what is
/// given and may change (trash days).
#[test]
fn format_run_again_keeps_every_setting_it_is_not_given() {
    let vol = Volume::format(
        "keepvol",
        &[
            "--compress",
            "lz4",
            "--block-size",
            "1M",
            "--trash-days",
            "2",
            "--capacity",
            "5",
        ],
    );
    let before = settings(&vol.meta_url);
    let out = sluice_ok(&["format", &vol.meta_url, "keepvol"]);
    assert!(out.contains("every setting kept"), "{out}");
    // Sizes with their unit, the exact count beside them; 0 is no limit.
    assert!(
        out.contains("capacity 5.00 GiB (5368709120 bytes), inodes unlimited"),
        "{out}"
    );
    assert_eq!(settings(&vol.meta_url), before);
    let out = sluice_ok(&["format", &vol.meta_url, "keepvol", "--trash-days", "7"]);
    assert!(out.contains("trash days 2 → 7"), "{out}");
    let out = sluice_ok(&["format", &vol.meta_url, "keepvol", "--capacity", "0"]);
    assert!(
        out.contains("capacity 5.00 GiB (5368709120 bytes) → unlimited"),
        "{out}"
    );
    let out = sluice_ok(&["format", &vol.meta_url, "keepvol", "--capacity", "5G"]);
    assert!(out.contains("unlimited → 5.00 GiB"), "{out}");
    // ACLs turned on: the summary names them after the sizes with their
    // units, and the change says so.
    let out = sluice_ok(&["format", &vol.meta_url, "keepvol", "--enable-acl"]);
    assert!(out.contains("POSIX ACLs false → true"), "{out}");
    assert!(
        out.contains("capacity 5.00 GiB (5368709120 bytes), inodes unlimited, POSIX ACLs"),
        "{out}"
    );
    let after = settings(&vol.meta_url);
    assert_eq!(
        (
            after.compression.as_str(),
            after.block_size,
            after.trash_days,
            after.capacity
        ),
        ("lz4", 1024, 7, 5 << 30)
    );
    assert_eq!(after.bucket, before.bucket);
    // A compression or block size that differs is refused, and changes nothing.
    for (flag, value, says) in [
        ("--compress", "none", "compressed with lz4"),
        ("--block-size", "4M", "block size 1024 KiB"),
    ] {
        let out = sluice(&["format", &vol.meta_url, "keepvol", flag, value]);
        assert_eq!(out.status.code(), Some(1), "{flag} {value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says) && err.contains("leave"), "{err}");
        assert_eq!(settings(&vol.meta_url), after);
    }
}

/// Another `--bucket` never repoints a volume silently: refused (nothing
/// created, nothing changed) unless `--change-bucket`, and then only to a
/// place that holds a copy of the volume's objects.
#[test]
fn another_bucket_needs_change_bucket_and_a_copy_of_the_objects() {
    let vol = Volume::format("movevol", &[]);
    let m = vol.mount("mnt");
    std::fs::write(m.path.join("f"), b"data that lives in the bucket").expect("write");
    m.unmount();
    let before = settings(&vol.meta_url);
    let elsewhere = vol.dir.path().join("elsewhere");
    let elsewhere_s = elsewhere.to_str().expect("UTF-8");
    let out = sluice(&["format", &vol.meta_url, "movevol", "--bucket", elsewhere_s]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--change-bucket") && err.contains(&before.bucket),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        !elsewhere.exists(),
        "a refused format created {elsewhere_s}"
    );
    assert_eq!(settings(&vol.meta_url), before);
    // With the flag, a place that does not hold the data is still refused
    // (missing, or an empty directory), and nothing is made there.
    for _ in 0..2 {
        let out = sluice(&[
            "format",
            &vol.meta_url,
            "movevol",
            "--bucket",
            elsewhere_s,
            "--change-bucket",
        ]);
        assert_eq!(out.status.code(), Some(1));
        assert!(
            text(&out).contains("copy the volume's objects there first"),
            "{}",
            text(&out)
        );
        assert_eq!(settings(&vol.meta_url), before);
        if elsewhere.exists() {
            assert_eq!(std::fs::read_dir(&elsewhere).expect("ls").count(), 0);
        }
        std::fs::create_dir_all(&elsewhere).expect("an empty directory");
    }
    // A copy of the objects is where the volume may move.
    let copy = vol.dir.path().join("copy");
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(&vol.bucket)
        .arg(&copy)
        .status()
        .expect("cp runs");
    assert!(status.success());
    std::fs::remove_dir_all(&vol.bucket).expect("the old bucket goes");
    let copy_s = copy.to_str().expect("UTF-8");
    let out = sluice_ok(&[
        "format",
        &vol.meta_url,
        "movevol",
        "--bucket",
        copy_s,
        "--change-bucket",
    ]);
    assert!(out.contains("changed bucket"), "{out}");
    assert_eq!(settings(&vol.meta_url).bucket, format!("{copy_s}/"));
    let m = vol.mount("mnt");
    assert_eq!(
        std::fs::read(m.path.join("f")).expect("read"),
        b"data that lives in the bucket"
    );
    m.unmount();
}

/// The one JSON object `sluice ARGS` prints on stdout (its log goes to
/// stderr).
fn json_of(args: &[&str]) -> serde_json::Value {
    let out = sluice(args);
    assert!(out.status.success(), "sluice {args:?}: {}", text(&out));
    serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).expect("one JSON object")
}
