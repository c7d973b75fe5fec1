//! End-to-end: file handles (`name_to_handle_at`/`open_by_handle_at`, what
//! an NFS server re-exporting the mount uses) of a kernel mount of the real
//! `sluice` binary stay valid across a remount, where the new kernel mount
//! has none of the inodes cached and must ask the daemon (LOOKUP of "." and
//! ".."): files and directories open again, also after a rename or after
//! their first name went, and a deleted file's handle is stale (ESTALE).

mod common;

use std::ffi::CString;
use std::fs::{self, File};
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use common::{Volume, Watchdog};

/// A `struct file_handle` with room for the largest handle.
#[repr(C)]
struct Handle {
    head: libc::file_handle,
    bytes: [u8; libc::MAX_HANDLE_SZ as usize],
}

/// The kernel's file handle of `path`.
fn handle_of(path: &Path) -> Box<Handle> {
    let mut h = Box::new(Handle {
        head: libc::file_handle {
            handle_bytes: libc::MAX_HANDLE_SZ as u32,
            handle_type: 0,
            f_handle: [],
        },
        bytes: [0; libc::MAX_HANDLE_SZ as usize],
    });
    let c = CString::new(path.as_os_str().as_bytes()).expect("a path without NUL");
    let mut mount_id = 0;
    // SAFETY: `h` is a file_handle followed by MAX_HANDLE_SZ bytes, as
    // handle_bytes says; the path is a NUL-terminated string.
    let r = unsafe {
        libc::name_to_handle_at(libc::AT_FDCWD, c.as_ptr(), &mut h.head, &mut mount_id, 0)
    };
    assert_eq!(
        r,
        0,
        "name_to_handle_at {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    h
}

/// Opens the file a handle names, through any descriptor of the mount.
fn open_handle(mount: &File, h: &mut Handle, flags: i32) -> std::io::Result<File> {
    // SAFETY: `h` came from name_to_handle_at; the descriptor returned is
    // owned by the File.
    let fd = unsafe { libc::open_by_handle_at(mount.as_raw_fd(), &mut h.head, flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

#[test]
fn handles_outlive_the_kernels_inode_cache() {
    let _dog = Watchdog::new("handles", Duration::from_secs(300));
    let vol = Volume::format("handles", &["--trash-days", "0"]);
    let mount = vol.mount("mnt");
    let root = mount.path.clone();
    fs::create_dir_all(root.join("a/sub")).unwrap();
    fs::write(root.join("a/sub/f"), b"the file's bytes").unwrap();
    fs::write(root.join("a/g"), b"deleted later").unwrap();
    fs::hard_link(root.join("a/sub/f"), root.join("link")).unwrap();
    let ino = |p: &str| fs::metadata(root.join(p)).unwrap().ino();
    let (f_ino, sub_ino, a_ino) = (ino("a/sub/f"), ino("a/sub"), ino("a"));
    let mut hf = handle_of(&root.join("a/sub/f"));
    let mut hsub = handle_of(&root.join("a/sub"));
    let mut hg = handle_of(&root.join("a/g"));
    mount.unmount();

    // A new kernel mount: no inode is cached, every handle is decoded by
    // the daemon.
    let mount = vol.mount("mnt");
    let mfd = File::open(&root).unwrap();
    let mut f = open_handle(&mfd, &mut hf, libc::O_RDONLY).expect("open the file by handle");
    assert_eq!(f.metadata().unwrap().ino(), f_ino);
    let mut got = String::new();
    f.read_to_string(&mut got).unwrap();
    assert_eq!(got, "the file's bytes");
    drop(f);
    let d = open_handle(&mfd, &mut hsub, libc::O_RDONLY | libc::O_DIRECTORY)
        .expect("open the directory by handle");
    assert_eq!(d.metadata().unwrap().ino(), sub_ino);
    // The directory's path is rebuilt through LOOKUP(sub, ".."):
    // /proc shows where it is.
    let at = fs::read_link(format!("/proc/self/fd/{}", d.as_raw_fd())).unwrap();
    assert_eq!(at, root.join("a/sub"));
    drop(d);

    // Renamed, its first name gone: the handle still names it.
    fs::rename(root.join("a"), root.join("b")).unwrap();
    fs::remove_file(root.join("b/sub/f")).unwrap();
    drop(mfd);
    mount.unmount();
    let mount = vol.mount("mnt");
    let mfd = File::open(&root).unwrap();
    let d = open_handle(&mfd, &mut hsub, libc::O_RDONLY | libc::O_DIRECTORY).unwrap();
    assert_eq!(
        fs::read_link(format!("/proc/self/fd/{}", d.as_raw_fd())).unwrap(),
        root.join("b/sub")
    );
    assert_eq!(fs::metadata(root.join("b")).unwrap().ino(), a_ino);
    drop(d);
    let mut f = open_handle(&mfd, &mut hf, libc::O_RDONLY).expect("the hard link keeps it");
    got.clear();
    f.read_to_string(&mut got).unwrap();
    assert_eq!(got, "the file's bytes");
    drop(f);

    // Deleted: the handle is stale.
    fs::remove_file(root.join("b/g")).unwrap();
    let e = open_handle(&mfd, &mut hg, libc::O_RDONLY).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
    drop(mfd);
    mount.unmount();
}
