//! `sluice mount` refuses bad flags with one line, before it mounts anything.

mod common;

use common::sluice;

#[test]
fn a_kernel_readahead_beyond_1_gib_is_refused_in_one_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite3://{}/meta.db", dir.path().display());
    let mnt = dir.path().display().to_string();
    for background in [false, true] {
        let mut args = vec!["mount", &url, &mnt, "--kernel-readahead", "4096"];
        if background {
            args.push("-d");
        }
        let out = sluice(&args);
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(
            err.contains("--kernel-readahead is in MiB; 4096 is more than 1 GiB"),
            "{err}"
        );
    }
}
