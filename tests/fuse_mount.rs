//! End-to-end tests: a SQLite + local-directory volume formatted in a temp
//! dir, mounted through the real kernel with `/dev/fuse` and our
//! [`Session`], driven with std::fs, libc calls and child processes.
//!
//! Each test skips (printing why) when `/dev/fuse` is missing or mounting is
//! not permitted (not root, no CAP_SYS_ADMIN).

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use sluice_engine::format::Compression;
use sluice_engine::meta::open_meta;
use sluice_engine::vfs::Filesystem as _;
use sluice_engine::vfs::{Vfs, VfsConfig};
use sluice_engine::volume::{format_volume, open_volume};
use sluice_fuse::{BackgroundSession, Config, DevError, MountOptions, Session};

/// A mounted volume; unmounts and stops the session when dropped.
struct Mounted {
    dir: tempfile::TempDir,
    mnt: PathBuf,
    session: Option<BackgroundSession<Vfs>>,
}

fn vfs_config() -> VfsConfig {
    VfsConfig {
        cache_bytes: 64 << 20,
        cleanup_interval: None,
        ..VfsConfig::default()
    }
}

fn open_vfs(dir: &Path) -> Vfs {
    let meta = open_meta(&format!("sqlite3://{}/meta.db", dir.display())).expect("open meta");
    Vfs::new(open_volume(meta).expect("open volume"), vfs_config()).expect("start vfs")
}

/// Formats a volume in a temp dir and mounts it; `None` (with the reason
/// printed) when this machine cannot mount FUSE file systems.
fn mount() -> Option<Mounted> {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: /dev/fuse is missing");
        return None;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let meta =
        open_meta(&format!("sqlite3://{}/meta.db", dir.path().display())).expect("open meta");
    format_volume(
        &*meta,
        "e2e",
        &dir.path().join("bucket"),
        1024,
        Compression::None,
        0,
    )
    .expect("format");
    drop(meta);
    let vfs = open_vfs(dir.path());
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).expect("mkdir mnt");
    let m = match sluice_fuse::dev::mount(&mnt, &MountOptions::default()) {
        Ok(m) => m,
        Err(DevError::Mount { source, .. })
            if matches!(source.raw_os_error(), Some(libc::EPERM | libc::EACCES)) =>
        {
            eprintln!("skipped: mounting FUSE is not permitted here ({source})");
            return None;
        }
        Err(DevError::Open(e)) => {
            eprintln!("skipped: /dev/fuse cannot be opened ({e})");
            return None;
        }
        Err(e) => panic!("mount failed: {e}"),
    };
    let session = Session::new(vfs, m, Config::default())
        .spawn(4)
        .expect("start session");
    Some(Mounted {
        dir,
        mnt,
        session: Some(session),
    })
}

impl Mounted {
    fn path(&self, name: &str) -> PathBuf {
        self.mnt.join(name)
    }

    /// Unmounts and waits for the session to end (destroy runs).
    fn unmount(&mut self) {
        if let Some(s) = self.session.take() {
            s.unmount_and_join().expect("unmount");
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(s) = self.session.take()
            && let Err(e) = s.unmount_and_join()
        {
            eprintln!("unmount at drop failed: {e}");
        }
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed)
        .collect()
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

#[test]
fn mount_shows_up_as_fuse_sluice() {
    let Some(m) = mount() else { return };
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    let line = mounts
        .lines()
        .find(|l| l.split(' ').nth(1) == Some(m.mnt.to_str().unwrap()))
        .expect("the mount is listed");
    assert!(line.starts_with("sluice "), "{line}");
    assert!(line.contains(" fuse.sluice "), "{line}");
    assert!(line.contains("allow_other"), "{line}");
    let md = fs::metadata(&m.mnt).unwrap();
    assert!(md.is_dir());
    assert_eq!(md.ino(), 1);
}

#[test]
fn write_at_offsets_and_read_back() {
    let Some(m) = mount() else { return };
    let p = m.path("data.bin");
    let mut f = File::create(&p).unwrap();
    let a = pattern(3 << 20, 1);
    f.write_all(&a).unwrap();
    // Overwrite in the middle, and write past the end leaving a hole.
    let b = pattern(100_000, 2);
    f.write_all_at(&b, 1_000_000).unwrap();
    f.write_all_at(b"tail", (5 << 20) + 7).unwrap();
    drop(f);

    let mut want = a.clone();
    want[1_000_000..1_100_000].copy_from_slice(&b);
    want.resize((5 << 20) + 7, 0);
    want.extend_from_slice(b"tail");

    let got = fs::read(&p).unwrap();
    assert_eq!(got.len(), want.len());
    assert!(got == want, "file content differs");
    assert_eq!(fs::metadata(&p).unwrap().len(), want.len() as u64);

    // Positioned reads across the overwrite boundary.
    let f = File::open(&p).unwrap();
    let mut buf = vec![0u8; 4096];
    f.read_exact_at(&mut buf, 1_100_000 - 2048).unwrap();
    assert_eq!(&buf[..], &want[1_100_000 - 2048..1_100_000 + 2048]);
    // Reading at and past the end.
    let mut f = f;
    f.seek(SeekFrom::Start(want.len() as u64 - 2)).unwrap();
    let mut rest = Vec::new();
    f.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, b"il");
}

#[test]
fn rename_unlink_mkdir_rmdir() {
    let Some(m) = mount() else { return };
    fs::create_dir(m.path("d")).unwrap();
    fs::create_dir_all(m.path("d/e/f")).unwrap();
    fs::write(m.path("d/e/f/x"), b"x").unwrap();
    fs::rename(m.path("d/e/f/x"), m.path("d/y")).unwrap();
    assert_eq!(fs::read(m.path("d/y")).unwrap(), b"x");
    assert!(!m.path("d/e/f/x").exists());
    // Rename over an existing file replaces it.
    fs::write(m.path("d/z"), b"zzz").unwrap();
    fs::rename(m.path("d/y"), m.path("d/z")).unwrap();
    assert_eq!(fs::read(m.path("d/z")).unwrap(), b"x");
    // A non-empty directory cannot be removed.
    let e = fs::remove_dir(m.path("d/e")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTEMPTY));
    fs::remove_dir(m.path("d/e/f")).unwrap();
    fs::remove_dir(m.path("d/e")).unwrap();
    fs::remove_file(m.path("d/z")).unwrap();
    assert_eq!(fs::read_dir(m.path("d")).unwrap().count(), 0);
    // Directory renames move subtrees.
    fs::create_dir_all(m.path("a/b")).unwrap();
    fs::rename(m.path("a"), m.path("d/a2")).unwrap();
    assert!(m.path("d/a2/b").is_dir());
    let e = fs::remove_file(m.path("missing")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    let e = fs::create_dir(m.path("d")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
}

fn renameat2(from: &Path, to: &Path, flags: u32) -> std::io::Result<()> {
    let (from, to) = (cstr(from), cstr(to));
    // SAFETY: both paths are NUL-terminated strings alive across the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            flags,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[test]
fn rename2_noreplace_and_exchange() {
    let Some(m) = mount() else { return };
    fs::write(m.path("one"), b"1").unwrap();
    fs::write(m.path("two"), b"2").unwrap();
    let e = renameat2(&m.path("one"), &m.path("two"), libc::RENAME_NOREPLACE).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
    renameat2(&m.path("one"), &m.path("two"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(fs::read(m.path("one")).unwrap(), b"2");
    assert_eq!(fs::read(m.path("two")).unwrap(), b"1");
    renameat2(&m.path("one"), &m.path("three"), libc::RENAME_NOREPLACE).unwrap();
    assert_eq!(fs::read(m.path("three")).unwrap(), b"2");
}

#[test]
fn symlinks_and_hard_links() {
    let Some(m) = mount() else { return };
    fs::write(m.path("target"), b"payload").unwrap();
    std::os::unix::fs::symlink("target", m.path("sym")).unwrap();
    assert_eq!(fs::read_link(m.path("sym")).unwrap(), Path::new("target"));
    assert_eq!(fs::read(m.path("sym")).unwrap(), b"payload");
    assert!(
        fs::symlink_metadata(m.path("sym"))
            .unwrap()
            .file_type()
            .is_symlink()
    );

    fs::hard_link(m.path("target"), m.path("hard")).unwrap();
    let a = fs::metadata(m.path("target")).unwrap();
    let b = fs::metadata(m.path("hard")).unwrap();
    assert_eq!(a.ino(), b.ino());
    assert_eq!(b.nlink(), 2);
    fs::remove_file(m.path("target")).unwrap();
    assert_eq!(fs::read(m.path("hard")).unwrap(), b"payload");
    assert_eq!(fs::metadata(m.path("hard")).unwrap().nlink(), 1);
    // The symlink now dangles.
    let e = fs::read(m.path("sym")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
}

#[test]
fn extended_attributes() {
    let Some(m) = mount() else { return };
    let p = m.path("x");
    fs::write(&p, b"").unwrap();
    let path = cstr(&p);
    let name = CString::new("user.sluice").unwrap();
    let name2 = CString::new("user.other").unwrap();
    let value = b"some value";
    // SAFETY: the path and names are NUL-terminated strings and the
    // buffers are valid for the lengths passed, all alive across each call.
    unsafe {
        assert_eq!(
            libc::setxattr(
                path.as_ptr(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0
            ),
            0
        );
        assert_eq!(
            libc::setxattr(path.as_ptr(), name2.as_ptr(), b"2".as_ptr().cast(), 1, 0),
            0
        );
        // XATTR_CREATE on an existing attribute fails.
        assert_eq!(
            libc::setxattr(
                path.as_ptr(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                libc::XATTR_CREATE
            ),
            -1
        );
        assert_eq!(*libc::__errno_location(), libc::EEXIST);
        // Size query, then the value.
        let size = libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0);
        assert_eq!(size, value.len() as isize);
        let mut buf = [0u8; 64];
        let n = libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        );
        assert_eq!(&buf[..n as usize], value);
        // A too-small buffer gets ERANGE.
        let n = libc::getxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), 3);
        assert_eq!((n, *libc::__errno_location()), (-1, libc::ERANGE));
        // List.
        let n = libc::listxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len());
        let mut names: Vec<&[u8]> = buf[..n as usize]
            .split(|&b| b == 0)
            .filter(|s| !s.is_empty())
            .collect();
        names.sort();
        assert_eq!(names, vec![&b"user.other"[..], &b"user.sluice"[..]]);
        // Remove, then it is gone.
        assert_eq!(libc::removexattr(path.as_ptr(), name.as_ptr()), 0);
        let n = libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        );
        assert_eq!((n, *libc::__errno_location()), (-1, libc::ENODATA));
    }
}

#[test]
fn truncate_shrinks_and_grows() {
    let Some(m) = mount() else { return };
    let p = m.path("t");
    fs::write(&p, pattern(200_000, 3)).unwrap();
    let f = OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(1000).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().len(), 1000);
    f.set_len(10_000).unwrap();
    drop(f);
    let got = fs::read(&p).unwrap();
    assert_eq!(got.len(), 10_000);
    assert_eq!(&got[..1000], &pattern(200_000, 3)[..1000]);
    assert!(got[1000..].iter().all(|&b| b == 0));
    // O_TRUNC on open goes through SETATTR (ATOMIC_O_TRUNC is not negotiated).
    fs::write(&p, b"short").unwrap();
    assert_eq!(fs::read(&p).unwrap(), b"short");
}

#[test]
fn readdir_of_a_thousand_files() {
    let Some(m) = mount() else { return };
    fs::create_dir(m.path("many")).unwrap();
    for i in 0..1000 {
        File::create(m.path(&format!("many/file-with-a-longish-name-{i:04}"))).unwrap();
    }
    let mut names: Vec<String> = fs::read_dir(m.path("many"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let want: Vec<String> = (0..1000)
        .map(|i| format!("file-with-a-longish-name-{i:04}"))
        .collect();
    assert_eq!(names, want);
    // `ls -l` style: every entry's attributes via readdirplus.
    for e in fs::read_dir(m.path("many")).unwrap() {
        let e = e.unwrap();
        assert!(e.file_type().unwrap().is_file());
        assert_eq!(e.metadata().unwrap().len(), 0);
    }
}

#[test]
fn append_from_two_processes() {
    let Some(m) = mount() else { return };
    let p = m.path("log");
    File::create(&p).unwrap();
    let script = |tag: &str| {
        format!(
            "i=0; while [ $i -lt 200 ]; do echo {tag}-$i >> '{}'; i=$((i+1)); done",
            p.display()
        )
    };
    let mut a = Command::new("sh")
        .arg("-c")
        .arg(script("A"))
        .spawn()
        .unwrap();
    let mut b = Command::new("sh")
        .arg("-c")
        .arg(script("B"))
        .spawn()
        .unwrap();
    assert!(a.wait().unwrap().success());
    assert!(b.wait().unwrap().success());
    let text = fs::read_to_string(&p).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 400, "every appended line is kept: {text:?}");
    for tag in ["A", "B"] {
        let mine: Vec<&str> = lines
            .iter()
            .copied()
            .filter(|l| l.starts_with(tag))
            .collect();
        let want: Vec<String> = (0..200).map(|i| format!("{tag}-{i}")).collect();
        assert_eq!(mine, want, "lines of {tag} are whole and in order");
    }
}

#[test]
fn permissions_and_modes() {
    let Some(m) = mount() else { return };
    let p = m.path("perm");
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o640)
        .open(&p)
        .unwrap();
    let md = fs::metadata(&p).unwrap();
    assert_eq!(md.mode() & 0o777, 0o640 & !current_umask());
    fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().mode() & 0o7777, 0o600);
    let path = cstr(&p);
    // SAFETY: `path` is a NUL-terminated string alive across the call.
    let rc = unsafe { libc::access(path.as_ptr(), libc::R_OK | libc::W_OK) };
    assert_eq!(rc, 0);
}

fn current_umask() -> u32 {
    // SAFETY: umask only swaps the process's mask; it is restored at once.
    unsafe {
        let old = libc::umask(0o022);
        libc::umask(old);
        old
    }
}

#[test]
fn statfs_and_fsync() {
    let Some(m) = mount() else { return };
    let mut f = File::create(m.path("s")).unwrap();
    f.write_all(&pattern(1 << 20, 9)).unwrap();
    f.sync_all().unwrap();
    f.sync_data().unwrap();
    let path = cstr(&m.mnt);
    // SAFETY: `st` is a plain C struct filled in by statvfs; `path` lives
    // across the call.
    let st = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        assert_eq!(libc::statvfs(path.as_ptr(), &mut st), 0);
        st
    };
    assert_eq!(st.f_bsize, 4096);
    assert_eq!(st.f_namemax, 255);
    assert!(st.f_blocks >= st.f_bavail);
    assert!(st.f_files >= 2);
}

#[test]
fn data_survives_unmount_and_remount() {
    let Some(mut m) = mount() else { return };
    let data = pattern(2 << 20, 5);
    fs::create_dir(m.path("keep")).unwrap();
    fs::write(m.path("keep/file"), &data).unwrap();
    m.unmount();
    assert!(
        !m.path("keep").exists(),
        "the mount point is empty after unmount"
    );
    // The same volume, opened afresh, holds what was written.
    let vfs = Arc::new(open_vfs(m.dir.path()));
    let ctx = sluice_engine::meta::Context::default();
    let dir = vfs.lookup(&ctx, 1, b"keep").unwrap();
    let file = vfs.lookup(&ctx, dir.inode, b"file").unwrap();
    assert_eq!(file.attr.length, data.len() as u64);
    let out = vfs.open(&ctx, file.inode, libc::O_RDONLY as u32).unwrap();
    let mut buf = vec![0u8; data.len()];
    let n = vfs.read_buf(&ctx, file.inode, out.fh, 0, &mut buf).unwrap();
    assert_eq!(n, data.len());
    assert!(buf == data);
    vfs.release(&ctx, file.inode, out.fh).unwrap();
    vfs.destroy();
}

#[test]
fn fifo_nodes() {
    let Some(m) = mount() else { return };
    let p = cstr(&m.path("fifo"));
    // SAFETY: `p` is a NUL-terminated string alive across the call.
    let rc = unsafe { libc::mkfifo(p.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    use std::os::unix::fs::FileTypeExt;
    let md = fs::symlink_metadata(m.path("fifo")).unwrap();
    assert!(md.file_type().is_fifo());
    assert_eq!(md.mode() & 0o777, 0o600 & !current_umask());
}

#[test]
fn fallocate_and_seek_data_hole() {
    let Some(m) = mount() else { return };
    let p = m.path("sparse");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&p)
        .unwrap();
    use std::os::fd::AsRawFd;
    let fd = f.as_raw_fd();
    // SAFETY: `fd` is an open descriptor owned by `f` for the whole test.
    let rc = unsafe { libc::fallocate(fd, 0, 0, 1 << 20) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    assert_eq!(fs::metadata(&p).unwrap().len(), 1 << 20);
    f.write_all_at(&[7u8; 4096], 0).unwrap();
    f.write_all_at(&[9u8; 4096], 10 << 20).unwrap();
    // SAFETY: as above.
    let (data, hole) = unsafe {
        (
            libc::lseek(fd, 5000, libc::SEEK_DATA),
            libc::lseek(fd, 0, libc::SEEK_HOLE),
        )
    };
    assert_eq!(data, 10 << 20);
    assert_eq!(hole, 4096);
    // Punch the first page: it reads back as zeros, the size stays.
    // SAFETY: as above.
    let rc = unsafe {
        libc::fallocate(
            fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            0,
            4096,
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    let mut buf = [1u8; 4096];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    assert_eq!(fs::metadata(&p).unwrap().len(), (10 << 20) + 4096);
}

/// `st_blocks` counts what a file with holes stores, as `du` reads it:
/// xfstests' `_require_sparse_files` (50 KiB written at 1.6 MiB shows
/// 50 KiB, not 1.6 MiB) right after the close, a file without holes, and
/// a punched hole.
#[test]
fn du_counts_what_a_sparse_file_stores() {
    let Some(m) = mount() else { return };
    let p = m.path("sparse");
    {
        let f = File::create(&p).unwrap();
        f.write_all_at(&[0x61u8; 51_200], 1_638_400).unwrap();
    }
    let st = fs::metadata(&p).unwrap();
    assert_eq!((st.len(), st.blocks()), (1_689_600, 100), "after the close");
    let du = Command::new("du").arg("-sk").arg(&p).output().expect("du");
    let du = String::from_utf8_lossy(&du.stdout);
    assert_eq!(du.split_whitespace().next(), Some("50"), "du -sk: {du}");
    // Filling the holes leaves a file that stores its length.
    let f = OpenOptions::new().write(true).open(&p).unwrap();
    f.write_all_at(&vec![1u8; 1_638_400], 0).unwrap();
    f.sync_all().unwrap();
    assert_eq!(fs::metadata(&p).unwrap().blocks(), 1_689_600 / 512);
    // A punched hole gives its space back.
    use std::os::fd::AsRawFd;
    // SAFETY: `f` owns the descriptor for the whole call.
    let rc = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            0,
            1 << 20,
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    drop(f);
    let st = fs::metadata(&p).unwrap();
    assert_eq!(st.blocks(), (1_689_600 - (1 << 20)) / 512, "punched");
}

#[test]
fn parallel_readers_see_the_same_bytes() {
    let Some(m) = mount() else { return };
    let p = m.path("shared");
    let data = Arc::new(pattern(16 << 20, 4));
    fs::write(&p, &*data).unwrap();
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let (p, data) = (p.clone(), Arc::clone(&data));
            std::thread::spawn(move || {
                let f = File::open(&p).unwrap();
                let mut buf = vec![0u8; 1 << 20];
                for i in 0..16u64 {
                    // A different, unaligned order of ranges per thread.
                    let off = ((i * 7 + t * 3) % 15) * (1 << 20) + t * 4097;
                    f.read_exact_at(&mut buf, off).unwrap();
                    let off = off as usize;
                    assert!(
                        buf[..] == data[off..off + buf.len()],
                        "thread {t} range {i}"
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn busy_unmount_detaches_and_the_session_ends_at_last_close() {
    let Some(mut m) = mount() else { return };
    fs::write(m.path("held"), b"still here").unwrap();
    let held = File::open(m.path("held")).unwrap();
    let session = m.session.take().unwrap();
    // The open file makes the mount busy: unmount falls back to MNT_DETACH.
    sluice_fuse::unmount(&m.mnt).unwrap();
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(!mounts.contains(m.mnt.to_str().unwrap()));
    // The detached file system still serves the open file.
    let mut buf = [0u8; 10];
    held.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"still here");
    drop(held);
    // The last reference is gone: the kernel ends the connection.
    session.join().unwrap();
}
