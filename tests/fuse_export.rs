//! [`Export`]: a subdirectory served as the whole file system, read-only
//! or not. The confinement checks call the file system the way a hostile
//! client would (any node id, `..` at the root); the read-only check goes
//! through the real kernel mount.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use sluice_engine::Error;
use sluice_engine::Limit;
use sluice_engine::format::Compression;
use sluice_engine::meta::open_meta;
use sluice_engine::meta::{Context, CopyRange, Ino, ROOT_INO, RenameFlags, TRASH_INO};
use sluice_engine::vfs::{Vfs, VfsConfig};
use sluice_engine::volume::{format_volume, open_volume};
use sluice_fuse::export::ClientLimits;
use sluice_fuse::{Config, DevError, Export, Filesystem, Listed, MountOptions, Session};

fn volume(dir: &Path) -> Vfs {
    volume_with_trash(dir, 0)
}

fn volume_with_trash(dir: &Path, trash_days: u32) -> Vfs {
    let url = format!("sqlite3://{}/meta.db", dir.display());
    let meta = open_meta(&url).expect("open meta");
    format_volume(
        &*meta,
        "export",
        &dir.join("bucket"),
        1024,
        Compression::None,
        trash_days,
    )
    .expect("format");
    let config = VfsConfig {
        cache_bytes: 16 << 20,
        cleanup_interval: None,
        ..VfsConfig::default()
    };
    Vfs::new(open_volume(meta).expect("open volume"), config).expect("vfs")
}

/// `/outside/secret` and `/data/inside/file` on a fresh volume; returns the
/// vfs, the inode of `/data` and of `/outside/secret`.
fn populated(dir: &Path) -> (Vfs, Ino, Ino) {
    populated_on(volume(dir))
}

fn populated_on(vfs: Vfs) -> (Vfs, Ino, Ino) {
    let ctx = Context::internal();
    let outside = vfs.mkdir(&ctx, ROOT_INO, b"outside", 0o755, 0).unwrap();
    let (secret, out) = vfs
        .create(
            &ctx,
            outside.inode,
            b"secret",
            0o644,
            0,
            libc::O_RDWR as u32,
        )
        .unwrap();
    vfs.write_buf(&ctx, secret.inode, out.fh, 0, b"host only", false)
        .unwrap();
    vfs.release(&ctx, secret.inode, out.fh).unwrap();
    let data = vfs.mkdir(&ctx, ROOT_INO, b"data", 0o755, 0).unwrap();
    let inside = vfs.mkdir(&ctx, data.inode, b"inside", 0o755, 0).unwrap();
    let (file, out) = vfs
        .create(&ctx, inside.inode, b"file", 0o644, 0, libc::O_RDWR as u32)
        .unwrap();
    vfs.write_buf(&ctx, file.inode, out.fh, 0, b"guest data", false)
        .unwrap();
    vfs.release(&ctx, file.inode, out.fh).unwrap();
    (vfs, data.inode, secret.inode)
}

#[test]
fn export_root_is_node_one_and_dotdot_stays_inside() {
    let dir = tempfile::tempdir().unwrap();
    let (vfs, data, _) = populated(dir.path());
    let fs = Export::new(vfs, data, false);
    fs.init().unwrap();
    let ctx = Context::default();

    let inside = fs.lookup(&ctx, ROOT_INO, b"inside").unwrap();
    assert_eq!(inside.attr.parent, ROOT_INO, "the export root is node 1");
    let up = fs.lookup(&ctx, inside.inode, b"..").unwrap();
    assert_eq!(up.inode, ROOT_INO);
    let up = fs.lookup(&ctx, ROOT_INO, b"..").unwrap();
    assert_eq!(up.inode, ROOT_INO, "`..` at the export root is the root");
    assert!(matches!(
        fs.lookup(&ctx, ROOT_INO, b"outside"),
        Err(Error::NotFound)
    ));

    let dh = fs.opendir(&ctx, ROOT_INO).unwrap();
    let entries = fs.readdir_all(&ctx, ROOT_INO, dh, 0, true).unwrap();
    let names: Vec<&[u8]> = entries.iter().map(|e| e.name.as_slice()).collect();
    assert!(names.contains(&b"inside".as_slice()), "{names:?}");
    assert!(!names.contains(&b"outside".as_slice()), "{names:?}");
    for e in &entries {
        if e.name == b".." || e.name == b"." {
            assert_eq!(e.inode, ROOT_INO, "{:?}", String::from_utf8_lossy(&e.name));
        }
    }
    fs.releasedir(&ctx, ROOT_INO, dh).unwrap();
}

#[test]
fn node_ids_never_handed_out_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (vfs, data, secret) = populated(dir.path());
    let fs = Export::new(vfs, data, false);
    fs.init().unwrap();
    let ctx = Context::default();

    // A client that guesses the inode of a file outside the export.
    assert!(matches!(fs.getattr(&ctx, secret), Err(Error::BadHandle)));
    assert!(matches!(fs.open(&ctx, secret, 0), Err(Error::BadHandle)));
    assert!(matches!(
        fs.lookup(&ctx, data + 1000, b"x"),
        Err(Error::BadHandle)
    ));
    // The volume's own root is not reachable by its number either: node 1
    // is the export's root.
    let attr = fs.getattr(&ctx, ROOT_INO).unwrap();
    assert_eq!(attr.typ, sluice_engine::meta::FileType::Directory);
    assert!(matches!(
        fs.lookup(&ctx, ROOT_INO, b"data"),
        Err(Error::NotFound)
    ));

    // A node the client looked up works until it is forgotten.
    let inside = fs.lookup(&ctx, ROOT_INO, b"inside").unwrap();
    let file = fs.lookup(&ctx, inside.inode, b"file").unwrap();
    let out = fs.open(&ctx, file.inode, 0).unwrap();
    let mut buf = [0u8; 64];
    let n = fs.read_buf(&ctx, file.inode, out.fh, 0, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"guest data");
    // copy_file_range to or from a node outside is refused, and works
    // between nodes inside.
    let (copy, wfh) = fs
        .create(&ctx, inside.inode, b"copy", 0o644, 0, libc::O_RDWR as u32)
        .unwrap();
    let req = |fin: Ino, fout: Ino| CopyRange {
        fin,
        off_in: 0,
        fout,
        off_out: 0,
        len: 64,
        flags: 0,
    };
    assert!(matches!(
        fs.copy_file_range(&ctx, &req(secret, copy.inode), out.fh, wfh.fh),
        Err(Error::BadHandle)
    ));
    assert!(matches!(
        fs.copy_file_range(&ctx, &req(file.inode, secret), out.fh, wfh.fh),
        Err(Error::BadHandle)
    ));
    let n = fs
        .copy_file_range(&ctx, &req(file.inode, copy.inode), out.fh, wfh.fh)
        .unwrap();
    assert_eq!(n, b"guest data".len() as u64);
    let n = fs.read_buf(&ctx, copy.inode, wfh.fh, 0, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"guest data");
    fs.release(&ctx, copy.inode, wfh.fh).unwrap();
    fs.release(&ctx, file.inode, out.fh).unwrap();
    fs.forget(file.inode, 1);
    assert!(matches!(
        fs.getattr(&ctx, file.inode),
        Err(Error::BadHandle)
    ));

    // Renaming into a directory outside the export is refused too.
    let outside_dir = secret - 1;
    assert!(matches!(
        fs.rename(
            &ctx,
            inside.inode,
            b"file",
            outside_dir,
            b"stolen",
            RenameFlags::default()
        ),
        Err(Error::BadHandle)
    ));
}

#[test]
fn read_only_refuses_every_change() {
    let dir = tempfile::tempdir().unwrap();
    let (vfs, _, _) = populated(dir.path());
    let fs = Export::new(vfs, ROOT_INO, true);
    fs.init().unwrap();
    let ctx = Context::default();
    let data = fs.lookup(&ctx, ROOT_INO, b"data").unwrap();
    let inside = fs.lookup(&ctx, data.inode, b"inside").unwrap();
    let file = fs.lookup(&ctx, inside.inode, b"file").unwrap();
    let ro = |r: Result<(), Error>| assert!(matches!(r, Err(Error::ReadOnly)), "{r:?}");
    ro(fs.mkdir(&ctx, ROOT_INO, b"new", 0o755, 0).map(drop));
    ro(fs
        .create(&ctx, ROOT_INO, b"new", 0o644, 0, libc::O_WRONLY as u32)
        .map(drop));
    ro(fs.unlink(&ctx, inside.inode, b"file"));
    ro(fs.rmdir(&ctx, data.inode, b"inside"));
    ro(fs.open(&ctx, file.inode, libc::O_RDWR as u32).map(drop));
    ro(fs.open(&ctx, file.inode, libc::O_TRUNC as u32).map(drop));
    ro(fs.access(&ctx, file.inode, libc::W_OK as u32));
    ro(fs.symlink(&ctx, ROOT_INO, b"l", b"t").map(drop));
    ro(fs.link(&ctx, file.inode, ROOT_INO, b"h").map(drop));
    ro(fs.rename(
        &ctx,
        inside.inode,
        b"file",
        ROOT_INO,
        b"moved",
        RenameFlags::default(),
    ));
    ro(fs.setxattr(
        &ctx,
        file.inode,
        b"user.a",
        b"1",
        sluice_engine::meta::XattrMode::Any,
    ));
    let out = fs.open(&ctx, file.inode, libc::O_RDONLY as u32).unwrap();
    ro(fs
        .write_buf(&ctx, file.inode, out.fh, 0, b"x", false)
        .map(drop));
    let req = CopyRange {
        fin: file.inode,
        off_in: 0,
        fout: file.inode,
        off_out: 100,
        len: 10,
        flags: 0,
    };
    ro(fs.copy_file_range(&ctx, &req, out.fh, out.fh).map(drop));
    fs.release(&ctx, file.inode, out.fh).unwrap();
}

#[test]
fn read_only_export_through_the_kernel() {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: /dev/fuse is missing");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (vfs, data, _) = populated(dir.path());
    let mnt: PathBuf = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let m = match sluice_fuse::dev::mount(&mnt, &MountOptions::default()) {
        Ok(m) => m,
        Err(DevError::Mount { source, .. })
            if matches!(source.raw_os_error(), Some(libc::EPERM | libc::EACCES)) =>
        {
            eprintln!("skipped: mounting FUSE is not permitted here ({source})");
            return;
        }
        Err(DevError::Open(e)) => {
            eprintln!("skipped: /dev/fuse cannot be opened ({e})");
            return;
        }
        Err(e) => panic!("mount failed: {e}"),
    };
    let session = Session::new(Export::new(vfs, data, true), m, Config::default())
        .spawn(2)
        .unwrap();
    let check = || {
        assert_eq!(
            fs::read(mnt.join("inside/file")).unwrap(),
            b"guest data".to_vec()
        );
        let names: Vec<_> = fs::read_dir(&mnt)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("inside")]);
        let err = fs::write(mnt.join("new"), b"x").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
        let err = fs::OpenOptions::new()
            .write(true)
            .open(mnt.join("inside/file"))
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
        let err = fs::remove_file(mnt.join("inside/file")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
        assert_eq!(
            fs::metadata(mnt.join("outside")).unwrap_err().kind(),
            ErrorKind::NotFound
        );
    };
    let result = std::panic::catch_unwind(check);
    session.unmount_and_join().unwrap();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// `.` and `..` lookups (how the kernel decodes a file handle) of a
/// confined client: `.` of a node it holds is that node, of any other node
/// a stale handle; `..` of a directory the host moved out of the export,
/// or of one removed since, is stale too, never the parent outside.
#[test]
fn dot_lookups_stay_inside_the_export() {
    let dir = tempfile::tempdir().unwrap();
    let (vfs, data, secret) = populated(dir.path());
    let fs = Export::new(vfs, data, false);
    fs.init().unwrap();
    let ctx = Context::default();
    let host = Context::internal();

    let inside = fs.lookup(&ctx, ROOT_INO, b"inside").unwrap();
    let file = fs.lookup(&ctx, inside.inode, b"file").unwrap();
    let me = fs.lookup(&ctx, file.inode, b".").unwrap();
    assert_eq!((me.inode, me.attr.length), (file.inode, 10));
    assert_eq!(
        fs.lookup(&ctx, inside.inode, b"..").unwrap().inode,
        ROOT_INO
    );
    assert_eq!(fs.lookup(&ctx, ROOT_INO, b"..").unwrap().inode, ROOT_INO);
    assert_eq!(fs.lookup(&ctx, ROOT_INO, b".").unwrap().inode, ROOT_INO);
    assert!(matches!(fs.lookup(&ctx, secret, b"."), Err(Error::Stale)));
    assert!(matches!(
        fs.lookup(&ctx, secret - 1, b".."),
        Err(Error::Stale)
    ));

    // A directory made and removed: its `..` is gone with it.
    let gone = fs.mkdir(&ctx, ROOT_INO, b"x", 0o755, 0).unwrap();
    fs.rmdir(&ctx, ROOT_INO, b"x").unwrap();
    assert!(matches!(
        fs.lookup(&ctx, gone.inode, b".."),
        Err(Error::Stale)
    ));

    // The host moves `inside` out of the export: its parent is out of reach.
    let outside = secret - 1;
    fs.inner()
        .rename(
            &host,
            data,
            b"inside",
            outside,
            b"moved",
            RenameFlags::default(),
        )
        .unwrap();
    assert!(matches!(
        fs.lookup(&ctx, inside.inode, b".."),
        Err(Error::Stale)
    ));
}

/// The trash escape: a confined client that makes and removes a directory,
/// then asks for its `..`, must not land in the trash, whose contents are
/// another tenant's deleted files; nor may it guess the trash's node ids.
#[test]
fn the_trash_is_out_of_reach() {
    let dir = tempfile::tempdir().unwrap();
    let (vfs, data, secret) = populated_on(volume_with_trash(dir.path(), 1));
    let host = Context::internal();
    // Another tenant's file goes to the trash.
    vfs.unlink(&host, secret - 1, b"secret").unwrap();
    let fs = Export::new(vfs, data, false).with_recheck(std::time::Duration::ZERO);
    fs.init().unwrap();
    let ctx = Context::default();

    let d = fs.mkdir(&ctx, ROOT_INO, b"x", 0o755, 0).unwrap();
    fs.rmdir(&ctx, ROOT_INO, b"x").unwrap();
    for name in [b"..".as_slice(), b".", b"secret"] {
        let r = fs.lookup(&ctx, d.inode, name);
        assert!(matches!(r, Err(Error::Stale)), "{name:?}: {r:?}");
    }
    assert!(matches!(fs.getattr(&ctx, d.inode), Err(Error::Stale)));
    assert!(matches!(fs.opendir(&ctx, d.inode), Err(Error::Stale)));
    // A file removed by the client goes to the trash too: out of reach by
    // node id (an open handle would keep reading, as a descriptor does).
    let (f, out) = fs
        .create(&ctx, ROOT_INO, b"mine", 0o644, 0, libc::O_RDWR as u32)
        .unwrap();
    fs.release(&ctx, f.inode, out.fh).unwrap();
    fs.unlink(&ctx, ROOT_INO, b"mine").unwrap();
    assert!(matches!(fs.getattr(&ctx, f.inode), Err(Error::Stale)));
    assert!(matches!(
        fs.open(&ctx, f.inode, libc::O_RDONLY as u32),
        Err(Error::Stale)
    ));
    // Trash node ids were never handed out.
    for guess in [TRASH_INO, TRASH_INO + 1, TRASH_INO + 2] {
        assert!(matches!(fs.getattr(&ctx, guess), Err(Error::BadHandle)));
        assert!(matches!(fs.lookup(&ctx, guess, b".."), Err(Error::Stale)));
    }
    assert!(matches!(
        fs.lookup(&ctx, ROOT_INO, b".trash"),
        Err(Error::NotFound)
    ));
}

/// A directory the client holds that the host renames out of the export:
/// every request naming it, or a node below it, is refused (ESTALE), and
/// a RENAME or LINK into it is EXDEV; an open handle keeps working.
#[test]
fn a_directory_moved_out_by_the_host_is_out_of_reach() {
    for read_only in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (vfs, data, secret) = populated(dir.path());
        let fs = Export::new(vfs, data, read_only).with_recheck(std::time::Duration::ZERO);
        fs.init().unwrap();
        let ctx = Context::default();
        let host = Context::internal();
        let inside = fs.lookup(&ctx, ROOT_INO, b"inside").unwrap();
        let file = fs.lookup(&ctx, inside.inode, b"file").unwrap();
        let out = fs.open(&ctx, file.inode, libc::O_RDONLY as u32).unwrap();
        // Deep `..` works while it is inside.
        let deep = if read_only {
            None
        } else {
            let a = fs.mkdir(&ctx, inside.inode, b"a", 0o755, 0).unwrap();
            let b = fs.mkdir(&ctx, a.inode, b"b", 0o755, 0).unwrap();
            assert_eq!(fs.lookup(&ctx, b.inode, b"..").unwrap().inode, a.inode);
            Some(b)
        };

        let outside = secret - 1;
        fs.inner()
            .rename(
                &host,
                data,
                b"inside",
                outside,
                b"moved",
                RenameFlags::default(),
            )
            .unwrap();
        let stale = |r: Result<(), Error>| assert!(matches!(r, Err(Error::Stale)), "{r:?}");
        stale(fs.getattr(&ctx, inside.inode).map(drop));
        stale(fs.lookup(&ctx, inside.inode, b"file").map(drop));
        stale(fs.lookup(&ctx, inside.inode, b"..").map(drop));
        stale(fs.getattr(&ctx, file.inode).map(drop));
        stale(fs.open(&ctx, file.inode, libc::O_RDONLY as u32).map(drop));
        stale(fs.getxattr(&ctx, file.inode, b"user.a").map(drop));
        stale(fs.listxattr(&ctx, file.inode).map(drop));
        stale(fs.readlink(&ctx, file.inode).map(drop));
        stale(fs.access(&ctx, file.inode, libc::R_OK as u32));
        stale(fs.opendir(&ctx, inside.inode).map(drop));
        if let Some(b) = &deep {
            stale(fs.lookup(&ctx, b.inode, b"..").map(drop));
            stale(fs.getattr(&ctx, b.inode).map(drop));
        }
        // The open handle still reads, as a descriptor would.
        let mut buf = [0u8; 64];
        let n = fs.read_buf(&ctx, file.inode, out.fh, 0, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"guest data");
        fs.release(&ctx, file.inode, out.fh).unwrap();
        if !read_only {
            let (f, o) = fs
                .create(&ctx, ROOT_INO, b"f", 0o644, 0, libc::O_RDWR as u32)
                .unwrap();
            fs.release(&ctx, f.inode, o.fh).unwrap();
            let xdev =
                |r: Result<(), Error>| assert!(matches!(r, Err(Error::CrossDevice)), "{r:?}");
            xdev(fs.rename(
                &ctx,
                ROOT_INO,
                b"f",
                inside.inode,
                b"f",
                RenameFlags::default(),
            ));
            xdev(fs.link(&ctx, f.inode, inside.inode, b"g").map(drop));
            // Nothing reached the directory outside.
            assert!(fs.inner().lookup(&host, inside.inode, b"f").is_err());
            assert!(fs.inner().lookup(&host, inside.inode, b"g").is_err());
        }
    }
}

/// The ancestry check remembers what it found, so a client working inside
/// the export pays a walk of the parents once, not per request; a change
/// through the export (here a rename) makes it check again.
#[test]
fn ancestry_checks_are_remembered() {
    let dir = tempfile::tempdir().unwrap();
    let (vfs, data, _) = populated(dir.path());
    let fs = Export::new(vfs, data, false).with_recheck(std::time::Duration::from_secs(3600));
    fs.init().unwrap();
    let ctx = Context::default();
    let inside = fs.lookup(&ctx, ROOT_INO, b"inside").unwrap();
    let file = fs.lookup(&ctx, inside.inode, b"file").unwrap();
    let before = fs.ancestry_work();
    for _ in 0..1000 {
        fs.getattr(&ctx, file.inode).unwrap();
        fs.getattr(&ctx, inside.inode).unwrap();
        fs.lookup(&ctx, inside.inode, b"file").unwrap();
    }
    assert_eq!(fs.ancestry_work(), before, "found by name inside: no walk");
    fs.rename(
        &ctx,
        inside.inode,
        b"file",
        inside.inode,
        b"file2",
        RenameFlags::default(),
    )
    .unwrap();
    fs.getattr(&ctx, file.inode).unwrap();
    let (walks, steps) = fs.ancestry_work();
    assert_eq!(walks, before.0 + 1);
    assert!(steps - before.1 <= 2, "{steps}");
    for _ in 0..1000 {
        fs.getattr(&ctx, file.inode).unwrap();
    }
    assert_eq!(fs.ancestry_work().0, walks);
}

/// READDIRPLUS counts a lookup only for the entries that fit the reply: an
/// entry the reply had no room for was never seen by the client, which
/// will never FORGET it, so it is not handed out.
#[test]
fn readdirplus_hands_out_only_the_entries_that_fit() {
    let dir = tempfile::tempdir().unwrap();
    let (vfs, data, _) = populated(dir.path());
    let ctx = Context::internal();
    for name in [b"a".as_slice(), b"b", b"c"] {
        vfs.mkdir(&ctx, data, name, 0o755, 0).unwrap();
    }
    let fs = Export::new(vfs, data, false);
    fs.init().unwrap();
    let ctx = Context::default();
    let dh = fs.opendir(&ctx, ROOT_INO).unwrap();
    let (mut sent, mut refused) = (Vec::new(), Vec::new());
    fs.readdir(&ctx, ROOT_INO, dh, 0, true, &mut |e, _| {
        // Room for `.`, `..` and one entry.
        if sent.len() < 3 {
            sent.push(e.inode);
            true
        } else {
            refused.push(e.inode);
            false
        }
    })
    .unwrap();
    assert_eq!(refused.len(), 1, "the packer stops at the first refusal");
    fs.getattr(&ctx, sent[2])
        .expect("the entry sent was handed out");
    assert!(matches!(
        fs.getattr(&ctx, refused[0]),
        Err(Error::BadHandle)
    ));
    // The next call, from the refused entry's offset, hands it out.
    let mut next = Vec::new();
    fs.readdir(&ctx, ROOT_INO, dh, 3, true, &mut |e, _| {
        next.push(e.inode);
        true
    })
    .unwrap();
    assert_eq!(next.first(), refused.first());
    fs.getattr(&ctx, refused[0]).expect("handed out once sent");
    fs.releasedir(&ctx, ROOT_INO, dh).unwrap();
}

/// Each per-client limit answers its errno, does nothing, and frees up
/// again when the client gives back what it holds.
#[test]
fn client_limits_answer_their_errno_and_free_up() {
    let dir = tempfile::tempdir().unwrap();
    let vfs = volume(dir.path());
    let ctx = Context::internal();
    let data = vfs.mkdir(&ctx, ROOT_INO, b"data", 0o755, 0).unwrap().inode;
    for name in [b"a".as_slice(), b"b", b"c", b"d"] {
        vfs.mkdir(&ctx, data, name, 0o755, 0).unwrap();
    }
    let limits = ClientLimits {
        max_handles: 2,
        max_nodes: 2,
        max_xattr_size: 100,
    };
    let fs = Export::new(vfs, data, false).with_limits(limits);
    fs.init().unwrap();
    let ctx = Context::default();

    // Nodes: two held; a third is refused, a held one is not.
    let a = fs.lookup(&ctx, ROOT_INO, b"a").unwrap().inode;
    let b = fs.lookup(&ctx, ROOT_INO, b"b").unwrap().inode;
    let err = fs.lookup(&ctx, ROOT_INO, b"c").unwrap_err();
    assert!(matches!(err, Error::Limit(Limit::Nodes(2))), "{err:?}");
    assert_eq!(err.errno(), libc::ENFILE);
    assert_eq!(fs.lookup(&ctx, ROOT_INO, b"a").unwrap().inode, a);
    let err = fs.mkdir(&ctx, ROOT_INO, b"new", 0o755, 0).unwrap_err();
    assert_eq!(err.errno(), libc::ENFILE);
    assert!(
        matches!(
            fs.inner().lookup(&Context::internal(), data, b"new"),
            Err(Error::NotFound)
        ),
        "a refused create creates nothing"
    );
    assert_eq!(fs.held_nodes(), 2);

    // READDIRPLUS past the node limit still lists every name: the nodes
    // the client does not hold go by name only and are not handed out.
    let dh = fs.opendir(&ctx, ROOT_INO).unwrap();
    let mut listed = Vec::new();
    fs.readdir(&ctx, ROOT_INO, dh, 0, true, &mut |e, how| {
        listed.push((String::from_utf8_lossy(&e.name).into_owned(), how));
        true
    })
    .unwrap();
    let how = |n: &str| listed.iter().find(|(name, _)| name == n).map(|(_, h)| *h);
    assert_eq!(how("a"), Some(Listed::Node));
    assert_eq!(how("b"), Some(Listed::Node));
    assert_eq!(how("c"), Some(Listed::NameOnly));
    assert_eq!(how("d"), Some(Listed::NameOnly));
    assert_eq!(fs.held_nodes(), 2);

    // Handles: the directory handle above and one more; a third is
    // refused; a RELEASE of a handle that is not there frees nothing.
    let fh = fs.opendir(&ctx, a).unwrap();
    let err = fs.opendir(&ctx, b).unwrap_err();
    assert!(matches!(err, Error::Limit(Limit::Handles(2))), "{err:?}");
    assert_eq!(err.errno(), libc::ENFILE);
    assert!(fs.releasedir(&ctx, a, fh + 1000).is_err());
    assert_eq!(fs.open_handles(), 2);
    assert_eq!(fs.opendir(&ctx, b).unwrap_err().errno(), libc::ENFILE);
    fs.releasedir(&ctx, a, fh).unwrap();
    let fh = fs.opendir(&ctx, b).expect("a handle given back frees room");
    fs.releasedir(&ctx, b, fh).unwrap();
    fs.releasedir(&ctx, ROOT_INO, dh).unwrap();
    assert_eq!(fs.open_handles(), 0);

    // A FORGET frees room for another node.
    fs.forget(b, 2);
    fs.lookup(&ctx, ROOT_INO, b"c")
        .expect("room again after FORGET");

    // Extended attribute values: up to the limit, E2BIG past it.
    use sluice_engine::meta::XattrMode;
    fs.setxattr(&ctx, a, b"user.ok", &[7; 100], XattrMode::Any)
        .unwrap();
    let err = fs
        .setxattr(&ctx, a, b"user.big", &[7; 101], XattrMode::Any)
        .unwrap_err();
    assert_eq!(err.errno(), libc::E2BIG);
    assert!(matches!(
        fs.getxattr(&ctx, a, b"user.big"),
        Err(Error::NoXattr)
    ));
}

/// Directory snapshots are counted against the engine's limit while a
/// handle holds them; a listing past it holds nothing (ENOMEM), and a
/// closed handle gives its entries back.
#[test]
fn directory_listings_are_held_to_their_entry_limit() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite3://{}/meta.db", dir.path().display());
    let meta = open_meta(&url).expect("open meta");
    format_volume(
        &*meta,
        "export",
        &dir.path().join("bucket"),
        1024,
        Compression::None,
        0,
    )
    .expect("format");
    let config = VfsConfig {
        cache_bytes: 16 << 20,
        cleanup_interval: None,
        max_dir_entries: 15,
        ..VfsConfig::default()
    };
    let vfs = Vfs::new(open_volume(meta).expect("open volume"), config).expect("vfs");
    let ctx = Context::internal();
    for i in 0..10 {
        vfs.mkdir(&ctx, ROOT_INO, format!("d{i}").as_bytes(), 0o755, 0)
            .unwrap();
    }
    let fs = Export::new(vfs, ROOT_INO, false);
    fs.init().unwrap();
    let ctx = Context::default();
    let first = fs.opendir(&ctx, ROOT_INO).unwrap();
    let listed = fs.readdir_all(&ctx, ROOT_INO, first, 0, false).unwrap();
    assert!(listed.len() >= 10 && listed.len() <= 15, "{}", listed.len());
    // Rewinding the same handle replaces its snapshot: still within.
    fs.readdir_all(&ctx, ROOT_INO, first, 0, false).unwrap();
    let second = fs.opendir(&ctx, ROOT_INO).unwrap();
    let err = fs
        .readdir_all(&ctx, ROOT_INO, second, 0, false)
        .unwrap_err();
    assert!(
        matches!(err, Error::Limit(Limit::DirEntries(15))),
        "{err:?}"
    );
    assert_eq!(err.errno(), libc::ENOMEM);
    fs.releasedir(&ctx, ROOT_INO, first).unwrap();
    assert_eq!(
        fs.readdir_all(&ctx, ROOT_INO, second, 0, false)
            .unwrap()
            .len(),
        listed.len()
    );
    fs.releasedir(&ctx, ROOT_INO, second).unwrap();
}

/// The real kernel takes READDIRPLUS entries given by name only (node id
/// 0) as plain entries: past the node limit `ls` still lists every name,
/// and a stat of a name the client may not hold answers ENFILE.
#[test]
fn the_kernel_lists_every_name_past_the_node_limit() {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: /dev/fuse is missing");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let vfs = volume(dir.path());
    let ctx = Context::internal();
    let data = vfs.mkdir(&ctx, ROOT_INO, b"data", 0o755, 0).unwrap().inode;
    for i in 0..8 {
        vfs.mkdir(&ctx, data, format!("d{i}").as_bytes(), 0o755, 0)
            .unwrap();
    }
    let mnt: PathBuf = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let m = match sluice_fuse::dev::mount(&mnt, &MountOptions::default()) {
        Ok(m) => m,
        Err(DevError::Mount { source, .. })
            if matches!(source.raw_os_error(), Some(libc::EPERM | libc::EACCES)) =>
        {
            eprintln!("skipped: mounting FUSE is not permitted here ({source})");
            return;
        }
        Err(DevError::Open(e)) => {
            eprintln!("skipped: /dev/fuse cannot be opened ({e})");
            return;
        }
        Err(e) => panic!("mount failed: {e}"),
    };
    let limits = ClientLimits {
        max_nodes: 3,
        ..ClientLimits::default()
    };
    let fs_ = Export::new(vfs, data, false).with_limits(limits);
    let session = Session::new(fs_, m, Config::default()).spawn(2).unwrap();
    let check = || {
        let mut names: Vec<_> = fs::read_dir(&mnt)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["d0", "d1", "d2", "d3", "d4", "d5", "d6", "d7"]);
        let (mut held, mut refused) = (0, 0);
        for n in &names {
            match fs::metadata(mnt.join(n)) {
                Ok(m) => {
                    assert!(m.is_dir());
                    held += 1;
                }
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(libc::ENFILE), "{n}: {e}");
                    refused += 1;
                }
            }
        }
        assert_eq!(held, 3, "{refused} refused");
    };
    let result = std::panic::catch_unwind(check);
    session.unmount_and_join().unwrap();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}
