//! Power loss, not only kill -9: sluice runs inside a QEMU guest whose
//! volume lives on virtio-blk disks with `cache=none` — the SQLite database
//! on one, the `file://` bucket on another, so that a sync of one disk
//! covers nothing on the other — and the host kills QEMU with SIGKILL while
//! the guest writes. Whatever the guest kernel had not sent to the disk — its page
//! cache, the ext4 journal it had not committed — is gone, as on a power
//! loss; what it had flushed stays.
//!
//! Each round boots the guest (`vm-images/powerloss-guest.sh`), mounts the
//! volume with `sluice mount`, checks every file, then writes until the
//! host kills QEMU at a random moment. The rounds take turns at three
//! workloads ([`Workload`]): files of varied sizes (some over a 4 MiB
//! block) from two threads, most fsync'ed, some only closed, some fsync'ed
//! ones unlinked later; small files from eight threads, only closed, some
//! unlinked again (the group commit's closes and background deletes); and a
//! checkpoint burst, eight threads writing 1 MiB files each fsync'ed. The
//! guest prints `PL-FSYNCED name size sha256` on the serial console once
//! fsync has returned, and `PL-CLOSED name size` after a close. The next
//! boot checks:
//!
//! - every file announced as fsync'ed (and not unlinked since) is there,
//!   whole, with the announced size and SHA-256;
//! - every file is a prefix of what was written to it (each file's bytes
//!   are a stream the name determines), so files cut off by the power loss
//!   are absent or shorter, never wrong, and reading never fails;
//! - after the last round, with the volume unmounted: `juicefs fsck` (when
//!   `SLUICE_JUICEFS_BIN` names JuiceFS 1.4) finds every object the metadata
//!   names, `sluice gc --delete` removes only leaked objects, and every
//!   file still checks out afterwards.
//!
//! `SLUICE_POWERLOSS_ROUNDS` (default 3: each workload once) sets how
//! many times QEMU is killed; `SLUICE_TEST_SEED` replays the kill times and the guest's
//! choices. Skips (printing why) with `SLUICE_SKIP_VM=1`, or when QEMU,
//! mkfs.ext4 or the guest image cannot be had. The guest side of the test
//! is the ignored test `guest_side` of this same binary, run in the guest.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use sha2::{Digest, Sha256};

use common::{SLUICE, Watchdog};

/// Rounds (QEMU kills) when `SLUICE_POWERLOSS_ROUNDS` is not set.
const DEFAULT_ROUNDS: usize = 3;
/// The host kills QEMU this long after the writer started (uniformly).
const KILL_AFTER_MS: std::ops::Range<u64> = 1500..9000;
/// How long one boot may take to reach the writer (or to finish).
const BOOT_LIMIT: Duration = Duration::from_secs(300);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn runs(cmd: &str, arg: &str) -> bool {
    Command::new(cmd)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Why this host cannot run the test, if it cannot.
fn missing_prerequisite() -> Option<String> {
    if std::env::var("SLUICE_SKIP_VM").as_deref() == Ok("1") {
        return Some("SLUICE_SKIP_VM=1".into());
    }
    if !runs("qemu-system-x86_64", "--version") {
        return Some("qemu-system-x86_64 is not installed (test.sh installs it)".into());
    }
    if !runs("mkfs.ext4", "-V") {
        return Some("mkfs.ext4 is not installed (e2fsprogs)".into());
    }
    if !runs("ldd", "--version") {
        return Some("ldd is not installed (libc-bin)".into());
    }
    None
}

// ---------------------------------------------------------------------------
// What the guest writes: each file's bytes are a stream its name determines,
// so any length of it can be checked without a record of what was written.

/// The stream of a file name (FNV-1a of the name).
fn stream_seed(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// splitmix64: the stream's 8-byte word `k` is `mix(seed + k * GOLDEN)`.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fills `buf` with the stream of `seed` from byte `off` on.
fn fill(seed: u64, off: u64, buf: &mut [u8]) {
    let mut at = off;
    let mut done = 0;
    while done < buf.len() {
        let word = mix(seed.wrapping_add((at / 8).wrapping_mul(0x9e37_79b9_7f4a_7c15)));
        let skip = (at % 8) as usize;
        let n = (8 - skip).min(buf.len() - done);
        buf[done..done + n].copy_from_slice(&word.to_le_bytes()[skip..skip + n]);
        done += n;
        at += n as u64;
    }
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

// ---------------------------------------------------------------------------
// The guest side.

/// The writer and the checker, run inside the guest by
/// `vm-images/powerloss-guest.sh` (`PL_ROLE=write|check`, `PL_DIR`,
/// `PL_ROUND`, `PL_SEED`). On the host it has nothing to do.
#[test]
#[ignore = "the guest side of fsynced_files_survive_power_loss, run inside its VM"]
fn guest_side() {
    let Ok(role) = std::env::var("PL_ROLE") else {
        eprintln!("guest_side runs inside the power-loss test's VM; nothing to do here");
        return;
    };
    let dir = PathBuf::from(std::env::var("PL_DIR").expect("PL_DIR"));
    // libtest has printed "test guest_side ... " without ending the line.
    println!();
    match role.as_str() {
        "check" => guest_check(&dir),
        "write" => {
            let num = |v: &str| -> u64 {
                std::env::var(v)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or_else(|| panic!("{v} is not a number"))
            };
            guest_write(&dir, num("PL_ROUND"), num("PL_SEED"));
        }
        other => panic!("unknown PL_ROLE {other}"),
    }
}

/// Prints `PL-FILE name length sha256 prefix|wrong` (or `PL-FILE name
/// ERROR message`) for every file in `dir`, then `PL-CHECKED n`.
fn guest_check(dir: &Path) {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("list the volume")
        .map(|e| e.expect("a directory entry").file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut buf = vec![0u8; 1 << 20];
    let mut want = vec![0u8; 1 << 20];
    for name in &names {
        let mut f = match fs::File::open(dir.join(name)) {
            Ok(f) => f,
            Err(e) => {
                println!("PL-FILE {name} ERROR open: {e}");
                continue;
            }
        };
        let seed = stream_seed(name);
        let mut sha = Sha256::new();
        let mut len = 0u64;
        let mut prefix = true;
        let res = loop {
            match f.read(&mut buf) {
                Ok(0) => break Ok(()),
                Ok(n) => {
                    sha.update(&buf[..n]);
                    fill(seed, len, &mut want[..n]);
                    prefix &= buf[..n] == want[..n];
                    len += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        match res {
            Ok(()) => println!(
                "PL-FILE {name} {len} {} {}",
                hex(&sha.finalize()),
                if prefix { "prefix" } else { "wrong" }
            ),
            Err(e) => println!("PL-FILE {name} ERROR read at {len}: {e}"),
        }
    }
    println!("PL-CHECKED {}", names.len());
}

/// What a round's writers do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    /// Two threads, files of varied sizes (some past a 4 MiB block), 80 %
    /// fsync'ed, some unlinked later.
    Mixed,
    /// Eight threads, files of at most 16 KiB, only closed (their commits
    /// go to the group commit without the close waiting), a fifth of them
    /// unlinked again (their deletion runs in the background).
    SmallFiles,
    /// Eight threads, 1 MiB files, each fsync'ed: a checkpoint.
    Checkpoint,
}

impl Workload {
    fn of_round(round: u64) -> Workload {
        match round % 3 {
            0 => Workload::Mixed,
            1 => Workload::SmallFiles,
            _ => Workload::Checkpoint,
        }
    }
}

/// Writes files until the host kills the VM: the round's [`Workload`],
/// each thread making `r{round}-t{thread}-{i}` files in sequential pieces,
/// while one more thread unlinks what rounds before the last
/// [`KEEP_ROUNDS`] wrote (so a long soak keeps a bounded volume, and
/// unlinks race the writes).
fn guest_write(dir: &Path, round: u64, seed: u64) {
    let workload = Workload::of_round(round);
    println!("PL-WORKLOAD {workload:?}");
    let writers = if workload == Workload::Mixed { 2 } else { 8 };
    let mut threads: Vec<_> = (0..writers)
        .map(|t| {
            let dir = dir.to_path_buf();
            std::thread::spawn(move || guest_writer(&dir, round, t, seed, workload))
        })
        .collect();
    let old = dir.to_path_buf();
    threads.push(std::thread::spawn(move || guest_prune(&old, round)));
    for t in threads {
        if t.join().is_err() {
            panic!("a writer thread failed");
        }
    }
}

/// Announces that `name` is about to be unlinked, and waits until the
/// console has sent the line: the host must know of every unlink that may
/// have happened, or it would take a file unlinked and then lost with the
/// machine for an fsync'ed file that vanished. (Announcing an fsync is the
/// other way round: a line lost with the machine only checks less.)
fn announce_unlink(name: &str) {
    println!("PL-UNLINK {name}");
    // SAFETY: tcdrain(3) on our standard output; no memory is passed. On a
    // descriptor that is not a terminal it fails harmlessly (ENOTTY).
    unsafe { libc::tcdrain(1) };
}

/// Rounds whose files the writer of a later round leaves alone.
const KEEP_ROUNDS: u64 = 3;

/// Unlinks the files of rounds older than the last [`KEEP_ROUNDS`],
/// announcing each before it goes.
fn guest_prune(dir: &Path, round: u64) {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("list the volume")
        .map(|e| e.expect("a directory entry").file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| {
            n.strip_prefix('r')
                .and_then(|r| r.split('-').next())
                .and_then(|r| r.parse::<u64>().ok())
                .is_some_and(|r| r + KEEP_ROUNDS <= round)
        })
        .collect();
    names.sort();
    for name in names {
        announce_unlink(&name);
        fs::remove_file(dir.join(&name)).unwrap_or_else(|e| panic!("unlink {name}: {e}"));
        println!("PL-UNLINKED {name}");
    }
}

fn guest_writer(dir: &Path, round: u64, thread: u64, seed: u64, workload: Workload) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (round << 40) ^ (thread << 32));
    let mut fsynced: Vec<String> = Vec::new();
    let mut closed: Vec<String> = Vec::new();
    let mut piece = vec![0u8; 256 << 10];
    for i in 0u64.. {
        let name = format!("r{round}-t{thread}-{i:05}");
        let (size, fsync): (u64, bool) = match workload {
            Workload::Mixed => (
                match rng.random_range(0..100) {
                    0..55 => rng.random_range(0..=64 << 10),
                    55..88 => rng.random_range((64 << 10)..(1 << 20)),
                    // Past one 4 MiB block.
                    _ => rng.random_range((4 << 20) + 1..=(6 << 20)),
                },
                rng.random_bool(0.8),
            ),
            Workload::SmallFiles => (rng.random_range(0..=16 << 10), false),
            Workload::Checkpoint => (1 << 20, true),
        };
        let path = dir.join(&name);
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("create {name}: {e}"));
        let stream = stream_seed(&name);
        let mut sha = Sha256::new();
        let mut at = 0u64;
        while at < size {
            let n = rng.random_range(1..=piece.len() as u64).min(size - at) as usize;
            fill(stream, at, &mut piece[..n]);
            f.write_all(&piece[..n])
                .unwrap_or_else(|e| panic!("write {name} at {at}: {e}"));
            sha.update(&piece[..n]);
            at += n as u64;
        }
        if fsync {
            f.sync_all().unwrap_or_else(|e| panic!("fsync {name}: {e}"));
            println!("PL-FSYNCED {name} {size} {}", hex(&sha.finalize()));
        }
        drop(f);
        if fsync {
            fsynced.push(name);
        } else {
            println!("PL-CLOSED {name} {size}");
            closed.push(name);
        }
        let unlink_from = match workload {
            Workload::Mixed if rng.random_bool(0.1) => &mut fsynced,
            Workload::SmallFiles if rng.random_bool(0.2) => &mut closed,
            _ => continue,
        };
        if !unlink_from.is_empty() {
            let gone = unlink_from.swap_remove(rng.random_range(0..unlink_from.len()));
            announce_unlink(&gone);
            fs::remove_file(dir.join(&gone)).unwrap_or_else(|e| panic!("unlink {gone}: {e}"));
            println!("PL-UNLINKED {gone}");
        }
    }
}

// ---------------------------------------------------------------------------
// The host side.

/// Copies `bin` into `dir/bin` (without debug info, which the guest does
/// not need) and the shared libraries it needs into `dir/lib`.
fn install(bin: &Path, name: &str, dir: &Path) {
    let dest = dir.join("bin").join(name);
    let stripped = Command::new("objcopy")
        .arg("--strip-debug")
        .arg(bin)
        .arg(&dest)
        .status()
        .is_ok_and(|s| s.success());
    if !stripped {
        fs::copy(bin, &dest).expect("copy a program for the guest");
    }
    let out = Command::new("ldd").arg(bin).output().expect("ldd runs");
    let text = common::text(&out);
    if text.contains("not a dynamic executable") || text.contains("statically linked") {
        return;
    }
    assert!(out.status.success(), "ldd {}: {text}", bin.display());
    for line in text.lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
        // "/lib64/ld-linux-x86-64.so.2 (0x...)"; the vDSO has no file.
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/')),
        };
        let Some(path) = path.filter(|p| p.starts_with('/')) else {
            continue;
        };
        let lib = Path::new(path);
        let target = dir
            .join("lib")
            .join(lib.file_name().expect("a library file name"));
        if !target.exists() {
            fs::copy(lib, &target).unwrap_or_else(|e| panic!("copy {path}: {e}"));
        }
    }
}

fn mkfs(image: &Path, from: Option<&Path>, bytes: u64) {
    fs::File::create(image)
        .and_then(|f| f.set_len(bytes))
        .expect("create a disk image");
    let mut cmd = Command::new("mkfs.ext4");
    cmd.args(["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"]);
    if let Some(dir) = from {
        cmd.arg("-d").arg(dir);
    }
    let out = cmd.arg(image).output().expect("mkfs.ext4 runs");
    assert!(
        out.status.success(),
        "mkfs.ext4 {}: {}",
        image.display(),
        common::text(&out)
    );
}

fn dir_bytes(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .expect("list")
        .map(|e| {
            let e = e.expect("entry");
            let md = e.metadata().expect("metadata");
            if md.is_dir() {
                dir_bytes(&e.path())
            } else {
                md.len()
            }
        })
        .sum()
}

/// One boot of the guest, its console read line by line.
struct Boot {
    child: Option<Child>,
    lines: mpsc::Receiver<String>,
    pidfile: PathBuf,
    console: Vec<String>,
}

impl Boot {
    fn start(work: &Path, round: usize, final_round: bool, seed: u64) -> Boot {
        let pidfile = work.join("qemu.pid");
        let _ = fs::remove_file(&pidfile);
        let append = format!(
            "pl.round={round} pl.final={} pl.seed={seed}",
            u8::from(final_round)
        );
        let mut child = Command::new(repo().join("vm-images/run-vm.sh"))
            .arg("--script")
            .arg(repo().join("vm-images/powerloss-guest.sh"))
            .arg("--disk-ro")
            .arg(work.join("tools.img"))
            .arg("--disk")
            .arg(work.join("meta.img"))
            .arg("--disk")
            .arg(work.join("data.img"))
            .arg("--pidfile")
            .arg(&pidfile)
            .args(["--cpus", "2", "--mem", "1G", "--timeout", "600"])
            .arg("--append")
            .arg(append)
            .arg("--log")
            .arg(work.join(format!("console-{round}.log")))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("vm-images/run-vm.sh runs");
        let out = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).split(b'\n') {
                let Ok(line) = line else { break };
                let line = String::from_utf8_lossy(&line)
                    .trim_end_matches('\r')
                    .to_string();
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Boot {
            child: Some(child),
            lines,
            pidfile,
            console: Vec::new(),
        }
    }

    /// Boots until the guest runs its script. A guest kernel that dies
    /// while booting (under TCG, Linux 6.12 now and then oopses in its
    /// first second) is booted again: nothing has touched the disks yet.
    fn up(work: &Path, round: usize, final_round: bool, seed: u64) -> Boot {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut boot = Boot::start(work, round, final_round, seed);
            if boot.wait_for("SLUICE-GUEST-SCRIPT", BOOT_LIMIT) {
                return boot;
            }
            let rc = boot.finish();
            assert!(
                attempt < 3,
                "round {round}: the guest did not boot ({attempt} tries, run-vm.sh {rc}):\n{}",
                tail(&boot.console)
            );
            eprintln!(
                "round {round}: the guest died while booting (run-vm.sh {rc}); booting again:\n{}",
                tail(&boot.console)
            );
        }
    }

    /// Reads console lines until one starts with `marker` (true) or the
    /// guest ends (false).
    fn wait_for(&mut self, marker: &str, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let hit = line.starts_with(marker);
                    self.console.push(line);
                    if hit {
                        return true;
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return false,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!(
                        "no {marker} from the guest within {limit:?}:\n{}",
                        self.console.join("\n")
                    )
                }
            }
        }
    }

    /// Kills QEMU at once, as a power loss would stop the machine.
    fn pull_the_plug(&mut self) {
        let pid: i32 = fs::read_to_string(&self.pidfile)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .expect("QEMU wrote its pid file");
        // SAFETY: kill(2) with a pid QEMU (our grandchild, still running:
        // its console is open) wrote; no memory is passed.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0, "kill QEMU");
    }

    /// Waits for run-vm.sh to end and returns its exit code and the rest of
    /// the console.
    fn finish(&mut self) -> i32 {
        while let Ok(line) = self.lines.recv() {
            self.console.push(line);
        }
        let status = self
            .child
            .take()
            .expect("running")
            .wait()
            .expect("wait for run-vm.sh");
        status.code().unwrap_or(-1)
    }
}

impl Drop for Boot {
    fn drop(&mut self) {
        if self.child.is_some() {
            if fs::metadata(&self.pidfile).is_ok() {
                self.pull_the_plug();
            }
            if let Some(mut c) = self.child.take() {
                let _ = c.wait();
            }
        }
    }
}

/// A file as the guest's check found it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Found {
    Read { len: u64, sha: String, prefix: bool },
    Error(String),
}

/// One `PL-FILE` line: the name and what was found (None: not one).
fn parse_file(line: &str) -> Option<(String, Found)> {
    let rest = line.strip_prefix("PL-FILE ")?;
    let mut f = rest.splitn(4, ' ');
    let name = f.next()?.to_string();
    let found = match f.next()? {
        "ERROR" => Found::Error(rest.to_string()),
        len => Found::Read {
            len: len.parse().ok()?,
            sha: f.next().filter(|s| s.len() == 64)?.to_string(),
            prefix: match f.next()? {
                "prefix" => true,
                "wrong" => false,
                _ => return None,
            },
        },
    };
    Some((name, found))
}

/// The `PL-FILE` lines of the first check in `lines` (its `PL-CHECKED`
/// ends it); None when no check ended there.
fn parse_check<'a>(lines: impl Iterator<Item = &'a String>) -> Option<BTreeMap<String, Found>> {
    let mut files = BTreeMap::new();
    for line in lines {
        if let Some((name, found)) = parse_file(line) {
            files.insert(name, found);
        } else if line.starts_with("PL-CHECKED ") {
            return Some(files);
        }
    }
    None
}

/// What the writers announced so far.
#[derive(Debug, Default)]
struct Announced {
    /// fsync returned: name → (size, sha256).
    fsynced: HashMap<String, (u64, String)>,
    /// Closed without fsync: name → size.
    closed: HashMap<String, u64>,
    /// Unlink started (perhaps finished): these may be gone.
    unlinked: HashSet<String>,
}

impl Announced {
    /// Takes the writer's complete console lines (a line cut by the kill is
    /// dropped by the reader or fails to parse, and counts as unsaid).
    fn take(&mut self, console: &[String]) -> usize {
        let mut fsynced = 0;
        for line in console {
            let words: Vec<&str> = line.split(' ').collect();
            match words.as_slice() {
                ["PL-FSYNCED", name, size, sha] if sha.len() == 64 => {
                    if let Ok(size) = size.parse() {
                        self.fsynced
                            .insert(name.to_string(), (size, sha.to_string()));
                        fsynced += 1;
                    }
                }
                ["PL-CLOSED", name, size] => {
                    if let Ok(size) = size.parse() {
                        self.closed.insert(name.to_string(), size);
                    }
                }
                ["PL-UNLINK", name] => {
                    self.unlinked.insert(name.to_string());
                }
                _ => {}
            }
        }
        fsynced
    }

    /// What is wrong with a check's findings; empty when all is well.
    fn problems(&self, files: &BTreeMap<String, Found>) -> Vec<String> {
        let mut bad = Vec::new();
        for (name, found) in files {
            match found {
                Found::Error(e) => bad.push(format!("{name}: cannot be read: {e}")),
                Found::Read { prefix: false, .. } => {
                    bad.push(format!("{name}: holds bytes that were never written there"))
                }
                Found::Read { len, .. } => {
                    let intended = self
                        .fsynced
                        .get(name)
                        .map(|f| f.0)
                        .or_else(|| self.closed.get(name).copied());
                    if intended.is_some_and(|n| *len > n) {
                        bad.push(format!("{name}: {len} bytes, more than were written"));
                    }
                }
            }
        }
        for (name, (size, sha)) in &self.fsynced {
            match files.get(name) {
                None if self.unlinked.contains(name) => {}
                None => bad.push(format!("{name}: fsync'ed ({size} bytes) but gone")),
                Some(Found::Read { len, sha: got, .. }) if len == size && got == sha => {}
                Some(other) => bad.push(format!(
                    "{name}: fsync'ed with {size} bytes, sha256 {sha}; found {other:?}"
                )),
            }
        }
        bad
    }
}

/// Returns the first 60 and the last 60 console lines, for failure messages.
fn tail(console: &[String]) -> String {
    if console.len() <= 120 {
        return console.join("\n");
    }
    format!(
        "{}\n[...]\n{}",
        console[..60].join("\n"),
        console[console.len() - 60..].join("\n")
    )
}

#[test]
fn fsynced_files_survive_power_loss() {
    if let Some(why) = missing_prerequisite() {
        eprintln!("skipped: {why}");
        return;
    }
    let rounds: usize = std::env::var("SLUICE_POWERLOSS_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_ROUNDS);
    let _dog = Watchdog::new(
        "e2e_powerloss",
        BOOT_LIMIT * (rounds as u32 + 1) + Duration::from_secs(300),
    );
    let build = Command::new(repo().join("vm-images/build.sh"))
        .output()
        .expect("vm-images/build.sh runs");
    assert!(
        build.status.success(),
        "vm-images/build.sh failed: {}",
        common::text(&build)
    );
    let seed = common::seed("e2e_powerloss");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);

    // The programs' disk (read-only in the guest) and the volume's two.
    let work = tempfile::tempdir().expect("a temporary directory");
    let tools = work.path().join("tools");
    fs::create_dir_all(tools.join("bin")).unwrap();
    fs::create_dir_all(tools.join("lib")).unwrap();
    install(Path::new(SLUICE), "sluice", &tools);
    install(
        &std::env::current_exe().expect("this test's binary"),
        "e2e_powerloss",
        &tools,
    );
    match std::env::var_os("SLUICE_JUICEFS_BIN").map(PathBuf::from) {
        Some(jfs) if jfs.is_file() => install(&jfs, "juicefs", &tools),
        _ => eprintln!(
            "no juicefs fsck at the end: set SLUICE_JUICEFS_BIN to a juicefs 1.4 binary (test.sh does)"
        ),
    }
    let fsck = tools.join("bin/juicefs").exists();
    mkfs(
        &work.path().join("tools.img"),
        Some(&tools),
        dir_bytes(&tools) * 5 / 4 + (64 << 20),
    );
    fs::remove_dir_all(&tools).unwrap();
    mkfs(&work.path().join("meta.img"), None, 256 << 20);
    // Rounds write up to ~150 MiB each and the writer unlinks what the
    // rounds before the last three wrote; the image is sparse.
    mkfs(&work.path().join("data.img"), None, 2 << 30);

    let mut said = Announced::default();
    let mut summary = Vec::new();
    for round in 0..=rounds {
        let final_round = round == rounds;
        let started = Instant::now();
        let mut boot = Boot::up(
            work.path(),
            round,
            final_round,
            seed.wrapping_add(round as u64),
        );
        if !final_round {
            assert!(
                boot.wait_for("PL-STEP write", BOOT_LIMIT),
                "round {round}: the guest ended before writing:\n{}",
                tail(&boot.console)
            );
        }
        // The check of what the previous round left (the first round's
        // volume is new and empty).
        let check = parse_check(boot.console.iter()).or_else(|| {
            (final_round && boot.wait_for("PL-CHECKED", BOOT_LIMIT))
                .then(|| parse_check(boot.console.iter()))
                .flatten()
        });
        let check = check.unwrap_or_else(|| {
            panic!(
                "round {round}: no check in the console:\n{}",
                tail(&boot.console)
            )
        });
        let problems = said.problems(&check);
        assert!(
            problems.is_empty(),
            "round {round}, after the power loss of round {}: {} problem(s):\n{}\nconsole:\n{}",
            round.saturating_sub(1),
            problems.len(),
            problems.join("\n"),
            tail(&boot.console)
        );
        let whole = check
            .iter()
            .filter(|(n, f)| {
                matches!(f, Found::Read { len, .. }
                    if said.fsynced.get(*n).map(|s| s.0).or(said.closed.get(*n).copied()) == Some(*len))
            })
            .count();
        let line = if final_round {
            let rc = boot.finish();
            assert!(
                rc == 0 && boot.console.iter().any(|l| l == "PL-DONE"),
                "the final round failed (run-vm.sh {rc}):\n{}",
                tail(&boot.console)
            );
            if fsck {
                let fsck_rc = boot.console.iter().find(|l| l.starts_with("PL-FSCK "));
                assert_eq!(
                    fsck_rc.map(String::as_str),
                    Some("PL-FSCK rc=0"),
                    "juicefs fsck found problems:\n{}",
                    tail(&boot.console)
                );
            }
            let gc: Vec<&String> = boot
                .console
                .iter()
                .filter(|l| l.starts_with("PL-GC scanned "))
                .collect();
            assert!(
                !gc.is_empty(),
                "no sluice gc report:\n{}",
                tail(&boot.console)
            );
            // The check after gc: nothing gc deleted was still needed.
            let recheck_at = boot
                .console
                .iter()
                .position(|l| l.starts_with("PL-STEP recheck"))
                .expect("a recheck");
            let recheck =
                parse_check(boot.console[recheck_at..].iter()).expect("the recheck's files");
            let problems = said.problems(&recheck);
            assert!(
                problems.is_empty(),
                "after sluice gc: {}\n{}",
                problems.join("\n"),
                tail(&boot.console)
            );
            assert_eq!(recheck, check, "sluice gc changed what the files hold");
            format!(
                "final: {} files ({whole} whole), fsck {}, {}",
                check.len(),
                if fsck { "clean" } else { "not run" },
                gc[0].trim_start_matches("PL-GC ")
            )
        } else {
            let delay = Duration::from_millis(rng.random_range(KILL_AFTER_MS));
            // Keep reading the console while waiting: a guest that fails
            // meanwhile says so.
            let deadline = Instant::now() + delay;
            while let Some(left) = deadline.checked_duration_since(Instant::now()) {
                match boot.lines.recv_timeout(left) {
                    Ok(line) => boot.console.push(line),
                    Err(_) => break,
                }
            }
            assert!(
                !boot.console.iter().any(|l| l.starts_with("PL-ERROR")),
                "round {round}: the guest failed while writing:\n{}",
                tail(&boot.console)
            );
            boot.pull_the_plug();
            boot.finish();
            let fsynced = said.take(&boot.console);
            format!(
                "round {round}: {} files checked ({whole} whole), {:?} killed {:.1} s into writing after {fsynced} fsyncs",
                check.len(),
                Workload::of_round(round as u64),
                delay.as_secs_f64()
            )
        };
        eprintln!("{line} [{:.0} s]", started.elapsed().as_secs_f64());
        summary.push(line);
    }
    eprintln!("power-loss test, seed {seed}:\n  {}", summary.join("\n  "));
}

#[test]
fn announcements_and_checks_parse() {
    let console: Vec<String> = [
        "PL-FSYNCED r0-t0-00000 5 aaaa",
        "PL-FSYNCED r0-t0-00001 3 ".to_string().as_str(),
        &format!("PL-FSYNCED r0-t0-00002 7 {}", "b".repeat(64)),
        "PL-CLOSED r0-t1-00000 9",
        "PL-UNLINK r0-t0-00002",
        "PL-FSYNCED r0-t0-0000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut said = Announced::default();
    assert_eq!(said.take(&console), 1);
    assert!(said.unlinked.contains("r0-t0-00002"));
    let check = parse_check(
        [
            format!("PL-FILE r0-t1-00000 4 {} prefix", "c".repeat(64)),
            "PL-FILE r0-t1-00001 ERROR read at 0: Input/output error".into(),
            "PL-CHECKED 2".into(),
        ]
        .iter(),
    )
    .expect("a check");
    let problems = said.problems(&check);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("cannot be read"));
    // The unlinked fsync'ed file may be gone; a missing fsync'ed one is not.
    said.fsynced
        .insert("r0-t0-00009".into(), (1, "d".repeat(64)));
    assert!(said.problems(&BTreeMap::new())[0].contains("but gone"));
    // The stream is the same whatever the offsets it is read at.
    let mut whole = vec![0u8; 100];
    fill(7, 0, &mut whole);
    let mut part = vec![0u8; 37];
    fill(7, 13, &mut part);
    assert_eq!(&whole[13..50], &part[..]);
}
