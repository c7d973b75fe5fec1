//! End-to-end concurrency through a kernel mount of the real `sluice` binary:
//! parallel writers and readers on distinct files, and two processes
//! appending to one file with O_APPEND.

mod common;

use std::io::{Read, Write};
use std::process::Command;
use std::time::Duration;

use common::{Volume, Watchdog, seed};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

#[test]
fn four_writers_and_four_readers_on_distinct_files() {
    let _dog = Watchdog::new("four_writers_and_four_readers", Duration::from_secs(600));
    let base = seed("four_writers_and_four_readers");
    let vol = Volume::format("conc", &[]);
    let mount = vol.mount("mnt");
    let mnt = mount.path.clone();
    // The readers' files exist before the race starts.
    for r in 0..4u64 {
        std::fs::write(mnt.join(format!("r{r}")), content(base + 100 + r, 9 << 20)).expect("write");
    }
    std::thread::scope(|s| {
        for w in 0..4u64 {
            let mnt = &mnt;
            s.spawn(move || {
                let data = content(base + w, 11 << 20);
                let mut rng = StdRng::seed_from_u64(base + 50 + w);
                let path = mnt.join(format!("w{w}"));
                let mut f = std::fs::File::create(&path).expect("create");
                let mut off = 0;
                while off < data.len() {
                    let n = rng.random_range(1..(700 << 10)).min(data.len() - off);
                    f.write_all(&data[off..off + n]).expect("write");
                    off += n;
                }
                drop(f);
                assert!(
                    std::fs::read(&path).expect("read back") == data,
                    "writer {w}: content differs"
                );
            });
        }
        for r in 0..4u64 {
            let mnt = &mnt;
            s.spawn(move || {
                let want = content(base + 100 + r, 9 << 20);
                for round in 0..3 {
                    let mut got = Vec::new();
                    std::fs::File::open(mnt.join(format!("r{r}")))
                        .expect("open")
                        .read_to_end(&mut got)
                        .expect("read");
                    assert!(got == want, "reader {r} round {round}: content differs");
                }
            });
        }
    });
    mount.unmount();
    let mount = vol.mount("mnt");
    for w in 0..4u64 {
        assert!(
            std::fs::read(mnt.join(format!("w{w}"))).expect("read") == content(base + w, 11 << 20),
            "w{w} after remount"
        );
    }
    mount.unmount();
}

const RECORDS: usize = 400;
const RECORD: usize = 64;

/// `python3` appending RECORDS fixed-size records, one write(2) each, with O_APPEND.
fn appender(path: &std::path::Path, tag: char) -> std::process::Child {
    let script = format!(
        "import os\n\
         fd = os.open({path:?}, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)\n\
         for i in range({RECORDS}):\n\
         \x20   rec = ('{tag} %08d ' % i).ljust({RECORD} - 1, '{tag}') + '\\n'\n\
         \x20   assert os.write(fd, rec.encode()) == {RECORD}\n\
         os.close(fd)\n",
        path = path.to_str().expect("UTF-8")
    );
    Command::new("python3")
        .arg("-c")
        .arg(script)
        .spawn()
        .expect("python3 runs")
}

#[test]
fn two_processes_append_to_one_file() {
    let _dog = Watchdog::new("two_processes_append_to_one_file", Duration::from_secs(300));
    let vol = Volume::format("append", &[]);
    let mount = vol.mount("mnt");
    let path = mount.path.join("log");
    let mut a = appender(&path, 'A');
    let mut b = appender(&path, 'B');
    assert!(a.wait().expect("wait").success(), "appender A failed");
    assert!(b.wait().expect("wait").success(), "appender B failed");
    let check = |data: Vec<u8>, when: &str| {
        assert_eq!(
            data.len(),
            2 * RECORDS * RECORD,
            "{when}: every record is kept"
        );
        let mut next = [0usize; 2];
        for (i, rec) in data.chunks(RECORD).enumerate() {
            let s = std::str::from_utf8(rec)
                .unwrap_or_else(|_| panic!("{when}: record {i} is not text"));
            let tag = s.as_bytes()[0];
            let who = match tag {
                b'A' => 0,
                b'B' => 1,
                _ => panic!("{when}: record {i} is torn: {s:?}"),
            };
            let head = format!("{} {:08} ", tag as char, next[who]);
            let fill = String::from(tag as char).repeat(RECORD - 1 - head.len());
            let want = format!("{head}{fill}\n");
            assert_eq!(s, want, "{when}: record {i}");
            next[who] += 1;
        }
        assert_eq!(next, [RECORDS, RECORDS], "{when}");
    };
    check(std::fs::read(&path).expect("read"), "through the mount");
    mount.unmount();
    let mount = vol.mount("mnt");
    check(std::fs::read(&path).expect("read"), "after a remount");
    mount.unmount();
}
