//! Model-based end-to-end test: a seeded random sequence of namespace and
//! data operations is applied to a sluice mount (the real binary, the real
//! kernel) and to a plain local directory side by side. Every operation must
//! succeed or fail the same way on both, and the trees must be equal
//! (listings, sizes, link counts, contents) after every step and after an
//! unmount + remount.

mod common;

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Volume, Watchdog, seed};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

const STEPS: usize = 240;
const NAMES: [&str; 6] = ["a", "b", "c", "d", "e", "f"];
const BLOCK: u64 = 4 << 20;
const CHUNK: u64 = 64 << 20;

/// One entry of a tree: kind, size (files), link count.
#[derive(Debug, PartialEq, Eq, Clone)]
struct Entry {
    dir: bool,
    size: u64,
    nlink: u64,
}

fn tree(root: &Path) -> BTreeMap<PathBuf, Entry> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Entry>) {
        for e in fs::read_dir(dir).expect("read_dir") {
            let e = e.expect("a directory entry");
            let p = e.path();
            let m = fs::symlink_metadata(&p).expect("lstat");
            let rel = p.strip_prefix(root).expect("under root").to_owned();
            out.insert(
                rel,
                Entry {
                    dir: m.is_dir(),
                    size: if m.is_dir() { 0 } else { m.len() },
                    nlink: m.nlink(),
                },
            );
            if m.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn compare_file(a: &Path, b: &Path, what: &str) {
    let x = fs::read(a).unwrap_or_else(|e| panic!("{what}: read {}: {e}", a.display()));
    let y = fs::read(b).unwrap_or_else(|e| panic!("{what}: read {}: {e}", b.display()));
    assert_eq!(x.len(), y.len(), "{what}: length of {}", a.display());
    if let Some(i) = x.iter().zip(&y).position(|(p, q)| p != q) {
        panic!(
            "{what}: {} differs from the model at byte {i} (sluice {:#04x}, model {:#04x})",
            a.display(),
            x[i],
            y[i]
        );
    }
}

/// Trees equal; contents of `files` (or of every file when `None`) equal.
fn compare(mnt: &Path, model: &Path, files: Option<&[PathBuf]>, what: &str) {
    let t_mnt = tree(mnt);
    let t_model = tree(model);
    assert_eq!(t_mnt, t_model, "{what}: trees differ (sluice, model)");
    match files {
        Some(list) => {
            for rel in list {
                if let Some(e) = t_model.get(rel)
                    && !e.dir
                {
                    compare_file(&mnt.join(rel), &model.join(rel), what);
                }
            }
        }
        None => {
            for (rel, e) in &t_model {
                if !e.dir {
                    compare_file(&mnt.join(rel), &model.join(rel), what);
                }
            }
        }
    }
}

fn errno<T>(r: std::io::Result<T>) -> Result<(), i32> {
    r.map(|_| ()).map_err(|e| e.raw_os_error().unwrap_or(-1))
}

/// An operation, on paths relative to the roots.
#[derive(Debug)]
enum Op {
    Create(PathBuf),
    Write(PathBuf, u64, usize),
    Truncate(PathBuf, u64),
    Rename(PathBuf, PathBuf),
    Unlink(PathBuf),
    Link(PathBuf, PathBuf),
    Mkdir(PathBuf),
    Rmdir(PathBuf),
    Fsync(PathBuf),
}

fn apply(op: &Op, root: &Path, data: &[u8]) -> Result<(), i32> {
    match op {
        Op::Create(p) => errno(
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(root.join(p)),
        ),
        Op::Write(p, off, len) => errno((|| {
            let mut f = OpenOptions::new().write(true).open(root.join(p))?;
            f.seek(SeekFrom::Start(*off))?;
            f.write_all(&data[..*len])
        })()),
        Op::Truncate(p, len) => errno(
            OpenOptions::new()
                .write(true)
                .open(root.join(p))
                .and_then(|f| f.set_len(*len)),
        ),
        Op::Rename(a, b) => errno(fs::rename(root.join(a), root.join(b))),
        Op::Unlink(p) => errno(fs::remove_file(root.join(p))),
        Op::Link(a, b) => errno(fs::hard_link(root.join(a), root.join(b))),
        Op::Mkdir(p) => errno(fs::create_dir(root.join(p))),
        Op::Rmdir(p) => errno(fs::remove_dir(root.join(p))),
        Op::Fsync(p) => errno(
            OpenOptions::new()
                .write(true)
                .open(root.join(p))
                .and_then(|f| f.sync_all()),
        ),
    }
}

fn pick<'a, T>(rng: &mut StdRng, v: &'a [T]) -> Option<&'a T> {
    if v.is_empty() {
        None
    } else {
        Some(&v[rng.random_range(0..v.len())])
    }
}

fn gen_op(rng: &mut StdRng, t: &BTreeMap<PathBuf, Entry>) -> Op {
    let mut dirs: Vec<PathBuf> = vec![PathBuf::new()];
    let mut files = Vec::new();
    let mut all = Vec::new();
    for (p, e) in t {
        all.push(p.clone());
        if e.dir {
            if p.components().count() < 3 {
                dirs.push(p.clone());
            }
        } else {
            files.push((p.clone(), e.size));
        }
    }
    let fresh = |rng: &mut StdRng| -> PathBuf {
        let d = dirs[rng.random_range(0..dirs.len())].clone();
        d.join(NAMES[rng.random_range(0..NAMES.len())])
    };
    let any_path = |rng: &mut StdRng| -> PathBuf {
        if rng.random_bool(0.7) {
            pick(rng, &all).cloned().unwrap_or_else(|| fresh(rng))
        } else {
            fresh(rng)
        }
    };
    let file_or_fresh = |rng: &mut StdRng| -> (PathBuf, u64) {
        match pick(rng, &files) {
            Some(f) if rng.random_bool(0.9) => f.clone(),
            _ => (fresh(rng), 0),
        }
    };
    match rng.random_range(0..100) {
        0..12 => Op::Create(fresh(rng)),
        12..45 => {
            let (p, size) = file_or_fresh(rng);
            let len = match rng.random_range(0..10) {
                0..4 => rng.random_range(1..4096),
                4..8 => rng.random_range(1..(300 << 10)),
                _ => rng.random_range(1..(5 << 20)),
            };
            let off = match rng.random_range(0..20) {
                // Straddle a block boundary.
                0..4 => (rng.random_range(1..3) * BLOCK)
                    .saturating_sub(rng.random_range(0..len as u64 + 1)),
                // Straddle the first chunk boundary (a sparse file).
                4 => CHUNK - rng.random_range(0..len as u64 + 1),
                // Append.
                5..10 => size,
                _ => rng.random_range(0..size + (1 << 20)),
            };
            Op::Write(p, off, len)
        }
        45..55 => {
            let (p, size) = file_or_fresh(rng);
            let len = match rng.random_range(0..10) {
                0 => CHUNK + rng.random_range(0..BLOCK),
                1 => 0,
                2..4 => rng.random_range(1..3) * BLOCK + rng.random_range(0..3) - 1,
                _ => rng.random_range(0..size + (1 << 20)),
            };
            Op::Truncate(p, len)
        }
        55..67 => Op::Rename(any_path(rng), any_path(rng)),
        67..77 => Op::Unlink(file_or_fresh(rng).0),
        77..84 => Op::Link(file_or_fresh(rng).0, fresh(rng)),
        84..91 => Op::Mkdir(fresh(rng)),
        91..97 => Op::Rmdir(any_path(rng)),
        _ => Op::Fsync(file_or_fresh(rng).0),
    }
}

#[test]
fn random_operations_match_a_local_directory() {
    let _dog = Watchdog::new(
        "random_operations_match_a_local_directory",
        Duration::from_secs(600),
    );
    run_model(seed("random_operations_match_a_local_directory"));
}

/// A seed that failed: a write's length lost right after the close (the
/// kernel's RELEASE forgot the file's open state while a GETATTR that had
/// read the engine before the commit looked for it; the forget was not
/// counted, so the GETATTR trusted what it read and the kernel shrank the
/// file's size to it). Fixed in the Vfs: every forget is counted under the
/// lock that removes the state (`Vfs::adjusted`, engine/DESIGN.md "What a
/// stat shows of a closed file's writes"). It raced: about one run in
/// six failed before the fix.
#[test]
fn a_stat_racing_a_release_shows_the_last_write() {
    let _dog = Watchdog::new(
        "a_stat_racing_a_release_shows_the_last_write",
        Duration::from_secs(600),
    );
    run_model(1796588928589598516);
}

fn run_model(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    // No trash: with one, an unlinked hard link stays counted (it moves to the
    // trash), as in JuiceFS, and link counts would differ from POSIX.
    let vol = Volume::format("model", &["--trash-days", "0"]);
    let model = vol.dir.path().join("model");
    fs::create_dir(&model).expect("the model directory");
    let mut mount = vol.mount("mnt");
    let mnt = mount.path.clone();
    let mut data = vec![0u8; 5 << 20];
    for step in 0..STEPS {
        let t = tree(&model);
        let op = gen_op(&mut rng, &t);
        if let Op::Write(_, _, len) = &op {
            rng.fill_bytes(&mut data[..*len]);
        }
        let on_model = apply(&op, &model, &data);
        let on_mnt = apply(&op, &mnt, &data);
        let what = format!("seed {seed} step {step} {op:?}");
        eprintln!("{what}: {on_model:?}");
        assert_eq!(on_mnt, on_model, "{what}: results differ (sluice, model)");
        let touched: Vec<PathBuf> = match &op {
            Op::Write(p, ..) | Op::Truncate(p, _) | Op::Create(p) => vec![p.clone()],
            Op::Rename(_, b) => vec![b.clone()],
            Op::Link(a, b) => vec![a.clone(), b.clone()],
            _ => Vec::new(),
        };
        let full = step % 40 == 39;
        compare(
            &mnt,
            &model,
            if full { None } else { Some(&touched) },
            &what,
        );
        if step == STEPS / 2 {
            mount.unmount();
            mount = vol.mount("mnt");
            compare(
                &mnt,
                &model,
                None,
                &format!("seed {seed}: after remount at step {step}"),
            );
        }
    }
    mount.unmount();
    let mount = vol.mount("mnt");
    compare(
        &mnt,
        &model,
        None,
        &format!("seed {seed}: after the final remount"),
    );
    mount.unmount();
}
