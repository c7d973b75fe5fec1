//! What a client says of itself in its session record (JuiceFS's
//! `sessionInfos` / `jfs_session2.info`): JSON with the version, host, process
//! and mount point, and the times JuiceFS writes in it.

use crate::meta::Timestamp;
use crate::meta::trash::civil_from_days;

/// The session info JuiceFS clients write: JSON with version, host, mount
/// point and process. `info` is used as is when it is a JSON object already.
pub(crate) fn session_info(info: &str) -> String {
    if serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(info).is_ok() {
        return info.to_string();
    }
    serde_json::json!({
        "Version": concat!("sluice-", env!("CARGO_PKG_VERSION")),
        "HostName": host_name(),
        "IPAddrs": [],
        "MountPoint": info,
        "MountTime": rfc3339(Timestamp::now()),
        "ProcessID": std::process::id(),
    })
    .to_string()
}

/// This machine's host name, for the session record (`juicefs status`).
/// From uname(2), not /proc/sys/kernel/hostname: sessions are opened after
/// `sluice serve` has confined itself, and a system call needs no file the
/// sandbox would have to allow.
pub(crate) fn host_name() -> String {
    // SAFETY: `utsname` is plain data (byte arrays); all zeros is a valid
    // value, overwritten by the call.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `uts` is a valid, writable utsname.
    if unsafe { libc::uname(&mut uts) } != 0 {
        return String::new();
    }
    let bytes: Vec<u8> = uts
        .nodename
        .iter()
        .take_while(|&&c| c != 0)
        .map(|c| c.to_ne_bytes()[0])
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A time as Go's `time.Time` reads it from JSON (RFC 3339, UTC).
fn rfc3339(t: Timestamp) -> String {
    let (y, m, d) = civil_from_days(t.secs.div_euclid(86_400));
    let sod = t.secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:09}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60,
        t.nsecs
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_info_is_juicefs_json() {
        let t = Timestamp {
            secs: 1_796_224_914,
            nsecs: 116_000_023,
        };
        assert_eq!(rfc3339(t), "2026-12-02T15:21:54.116000023Z");
        let v: serde_json::Value = serde_json::from_str(&session_info("/mnt/x")).expect("json");
        assert_eq!(v["MountPoint"], "/mnt/x");
        assert!(v["MountTime"].as_str().is_some_and(|s| s.ends_with('Z')));
        assert_eq!(
            session_info("{\"MountPoint\":\"/m\"}"),
            "{\"MountPoint\":\"/m\"}"
        );
    }

    #[test]
    fn the_host_name_is_the_kernels() {
        let proc = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("a host name");
        assert_eq!(host_name(), proc.trim());
        assert!(!host_name().is_empty());
    }
}
