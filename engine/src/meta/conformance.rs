//! The behaviour every metadata engine must show, as functions over
//! `&dyn Meta`. Each takes a fresh, unformatted store; an engine's tests run
//! every function on it (see `sqlite/tests.rs`), so the Redis engine later
//! runs the same suite.

use std::collections::HashSet;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::Error;
use crate::format::Format;
use crate::meta::bounded::{CHUNKS_PER_TX, PROBE_SPAN};
use crate::meta::{
    CHUNK_SIZE, Context, CopyRange, DirCursor, Entry, FileType, Ino, MAX_COPY_LEN, MAX_FILE_LENGTH,
    Meta, ROOT_INO, ReleasedSlice, RenameFlags, SetAttr, Slice, TRASH_INO, TimeChange, Timestamp,
    TruncateVia, XattrMode,
};

/// One conformance check: it gets a fresh, unformatted store.
pub(crate) type Check = fn(&dyn Meta);

/// Every conformance check, by name.
pub(crate) const ALL: &[(&str, Check)] = &[
    ("format_and_load", format_and_load),
    ("refuse_different_volume", refuse_different_volume),
    ("refuse_encrypted", refuse_encrypted),
    ("posix_acls", posix_acls),
    ("create_lookup_getattr", create_lookup_getattr),
    ("names_are_checked", names_are_checked),
    ("mkdir_rmdir_nlink", mkdir_rmdir_nlink),
    ("readdir_lists_entries", readdir_lists_entries),
    ("readdir_pages", readdir_pages),
    ("rename_moves_and_replaces", rename_moves_and_replaces),
    ("rename_flags", rename_flags),
    ("rename_directories", rename_directories),
    ("hard_links", hard_links),
    ("symlinks", symlinks),
    ("mknod_special_files", mknod_special_files),
    ("xattrs", xattrs),
    ("setattr_rules", setattr_rules),
    ("chown_chgrp_rules", chown_chgrp_rules),
    ("data_changes_drop_setid", data_changes_drop_setid),
    ("permissions", permissions),
    ("exec_open_needs_execute", exec_open_needs_execute),
    ("write_read_and_refs", write_read_and_refs),
    ("truncate_and_fallocate", truncate_and_fallocate),
    (
        "sparse_files_show_what_they_store",
        sparse_files_show_what_they_store,
    ),
    (
        "range_work_visits_existing_chunks",
        range_work_visits_existing_chunks,
    ),
    ("xattr_names_are_bounded", xattr_names_are_bounded),
    ("compact_chunk", compact_chunk),
    (
        "copy_file_range_shares_slices",
        copy_file_range_shares_slices,
    ),
    ("copy_file_range_rules", copy_file_range_rules),
    ("truncate_through_a_handle", truncate_through_a_handle),
    ("open_unlink_close", open_unlink_close),
    ("trash_keeps_removed_files", trash_keeps_removed_files),
    ("trash_links_are_counted", trash_links_are_counted),
    ("no_trash_releases_at_once", no_trash_releases_at_once),
    ("statfs_counts_usage", statfs_counts_usage),
    ("volume_limits_give_enospc", volume_limits_give_enospc),
    ("dir_quotas_give_edquot", dir_quotas_give_edquot),
    ("renames_move_quota_usage", renames_move_quota_usage),
    ("concurrent_creates", concurrent_creates),
    ("sessions", sessions),
];

/// A volume's settings for tests.
pub(crate) fn test_format(trash_days: u32) -> Format {
    Format {
        name: "conformance".into(),
        uuid: "5a1c0e11-0000-4000-8000-000000000001".into(),
        storage: "file".into(),
        bucket: "/tmp/conformance-bucket/".into(),
        block_size: 4096,
        compression: "none".into(),
        capacity: 0,
        inodes: 0,
        encrypt_algo: "aes256gcm-rsa".into(),
        encrypt_key: String::new(),
        trash_days,
        meta_version: 1,
        min_client_version: "1.1.0-A".into(),
        dir_stats: true,
        enable_acl: false,
        extra: serde_json::Map::new(),
    }
}

fn root() -> Context {
    Context::default()
}

fn user(uid: u32) -> Context {
    Context {
        uid,
        gid: uid,
        gids: vec![uid],
        pid: 1,
        privileged: false,
        kernel_checked: false,
    }
}

/// Collects what the engine releases.
fn track_releases(m: &dyn Meta) -> Arc<Mutex<Vec<ReleasedSlice>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    m.set_slice_releaser(Arc::new(move |r| {
        s.lock().push(r);
        true
    }));
    seen
}

fn formatted(m: &dyn Meta, trash_days: u32) {
    m.init(&test_format(trash_days)).expect("format the volume");
    m.load().expect("load the volume");
}

fn names(m: &dyn Meta, dir: Ino) -> Vec<Vec<u8>> {
    m.readdir(&root(), dir, false)
        .expect("readdir")
        .into_iter()
        .map(|e| e.name)
        .collect()
}

fn assert_err<T: std::fmt::Debug>(r: crate::Result<T>, want: fn(&Error) -> bool, what: &str) {
    match r {
        Ok(v) => panic!("{what}: expected an error, got {v:?}"),
        Err(e) => assert!(want(&e), "{what}: unexpected error {e:?}"),
    }
}

/// Writes one slice covering `len` bytes at `off` of chunk 0.
fn write(m: &dyn Meta, ino: Ino, off: u32, len: u32) -> Slice {
    let id = m.new_slice_id().expect("slice id");
    let s = Slice {
        pos: off,
        id,
        size: len,
        off: 0,
        len,
    };
    m.write_chunk(ino, 0, s, Timestamp::now()).expect("write");
    s
}

/// Format, load, and the root directory JuiceFS makes.
pub(crate) fn format_and_load(m: &dyn Meta) {
    assert_err(
        m.load(),
        |e| matches!(e, Error::NotFound),
        "load before format",
    );
    formatted(m, 1);
    let f = m.load().expect("load");
    assert_eq!(f.name, "conformance");
    assert_eq!(f.uuid, test_format(1).uuid);
    assert_eq!(f.trash_days, 1);
    let a = m.getattr(ROOT_INO).expect("root");
    assert_eq!(a.typ, FileType::Directory);
    assert_eq!(a.mode, 0o777);
    assert_eq!(a.nlink, 2);
    assert_eq!(a.length, 4096);
    // The same volume again (trash days changed) is an update, not an error.
    m.init(&test_format(3)).expect("re-format the same volume");
    assert_eq!(m.load().expect("load").trash_days, 3);
}

/// A store holding a volume refuses to become another one.
pub(crate) fn refuse_different_volume(m: &dyn Meta) {
    formatted(m, 0);
    let mut other = test_format(0);
    other.name = "another".into();
    assert_err(m.init(&other), |e| matches!(e, Error::Exists), "other name");
    let mut other = test_format(0);
    other.uuid = "5a1c0e11-0000-4000-8000-000000000002".into();
    assert_err(m.init(&other), |e| matches!(e, Error::Exists), "other uuid");
    assert_eq!(m.load().expect("load").name, "conformance");
}

/// Encrypted volumes are refused with a message that says so.
pub(crate) fn refuse_encrypted(m: &dyn Meta) {
    let mut f = test_format(0);
    f.encrypt_key = "-----BEGIN ENCRYPTED PRIVATE KEY-----".into();
    match m.init(&f) {
        Err(Error::NotSupported(msg)) => assert!(msg.contains("encrypted"), "{msg}"),
        other => panic!("encrypted volume accepted: {other:?}"),
    }
}

/// POSIX ACLs on a volume formatted with them: access decided by the
/// rule, the mode kept as its summary, chmod moving the mask, default ACLs
/// inherited by new nodes instead of the umask, and who may set them.
pub(crate) fn posix_acls(m: &dyn Meta) {
    use crate::meta::acl::{AclEntry, AclType, Rule, UNSET};
    let mut f = test_format(0);
    f.enable_acl = true;
    m.init(&f).expect("format a volume with ACLs");
    m.load().expect("load it");
    let (owner, friend, stranger) = (user(1000), user(2000), user(3000));
    let (dir, _) = m.mkdir(&root(), ROOT_INO, b"d", 0o777, 0).expect("mkdir");
    let (file, attr) = m.create(&owner, dir, b"f", 0o640, 0).expect("create");
    m.close(file).expect("close");
    assert_eq!((attr.mode, attr.access_acl), (0o640, 0));
    assert_eq!(m.get_facl(file, AclType::Access).expect("get"), None);
    assert!(matches!(m.access(&friend, file, 4), Err(Error::Access)));

    // user:2000:rw-, mask rw-: the friend may read and write, the mode's
    // group bits become the mask.
    let rule = Rule {
        owner: 6,
        group: 4,
        mask: 6,
        other: 0,
        named_users: vec![AclEntry { id: 2000, perm: 6 }],
        named_groups: vec![],
    };
    assert!(matches!(
        m.set_facl(&friend, file, AclType::Access, &rule),
        Err(Error::Perm)
    ));
    m.set_facl(&owner, file, AclType::Access, &rule)
        .expect("setfacl");
    let a = m.getattr(file).expect("getattr");
    assert_eq!(a.mode, 0o660);
    assert_ne!(a.access_acl, 0);
    assert_eq!(
        m.get_facl(file, AclType::Access).expect("get"),
        Some(rule.clone())
    );
    m.access(&friend, file, 6)
        .expect("the named user may read and write");
    assert!(matches!(m.access(&stranger, file, 4), Err(Error::Access)));
    m.open(&friend, file, libc::O_RDWR as u32)
        .expect("open by the named user");
    m.close(file).expect("close");
    // The owning group reads (group::r--), writes not, though the mode's
    // group bits (the mask) say rw-.
    let member = Context {
        gids: vec![3000, 1000],
        ..user(3000)
    };
    m.access(&member, file, 4).expect("group read");
    assert!(matches!(m.access(&member, file, 2), Err(Error::Access)));

    // chmod moves the mask: 0600 leaves the friend nothing.
    m.setattr(
        &owner,
        file,
        &SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        },
    )
    .expect("chmod");
    let got = m
        .get_facl(file, AclType::Access)
        .expect("get")
        .expect("an ACL");
    assert_eq!((got.owner, got.group, got.mask, got.other), (6, 4, 0, 0));
    assert!(matches!(m.access(&friend, file, 4), Err(Error::Access)));

    // A minimal access ACL is the mode: the ACL goes, the mode follows.
    let minimal = Rule {
        owner: 7,
        group: 5,
        mask: UNSET,
        other: 4,
        named_users: vec![],
        named_groups: vec![],
    };
    m.set_facl(&owner, file, AclType::Access, &minimal)
        .expect("setfacl minimal");
    let a = m.getattr(file).expect("getattr");
    assert_eq!((a.mode, a.access_acl), (0o754, 0));
    m.access(&friend, file, 4).expect("other may read now");

    // A default ACL is for directories only.
    assert!(matches!(
        m.set_facl(&owner, file, AclType::Default, &rule),
        Err(Error::Access)
    ));
    // Inherited: a new file's access ACL is the default and'ed with its
    // mode, and the umask does not apply; a new directory keeps the default.
    let default = Rule {
        owner: 7,
        group: 5,
        mask: 7,
        other: 5,
        named_users: vec![AclEntry { id: 2000, perm: 7 }],
        named_groups: vec![],
    };
    m.set_facl(&root(), dir, AclType::Default, &default)
        .expect("default ACL");
    let (child, ca) = m
        .create(&owner, dir, b"child", 0o666, 0o077)
        .expect("create");
    m.close(child).expect("close");
    assert_eq!(
        ca.mode, 0o664,
        "mode and'ed with the default, umask ignored"
    );
    let got = m
        .get_facl(child, AclType::Access)
        .expect("get")
        .expect("inherited");
    assert_eq!((got.owner, got.mask, got.other), (6, 6, 4));
    assert_eq!(got.named_users, default.named_users);
    assert_eq!(ca.default_acl, 0);
    m.access(&friend, child, 6)
        .expect("the inherited entry grants");
    let (sub, sa) = m.mkdir(&owner, dir, b"sub", 0o755, 0o022).expect("mkdir");
    assert_eq!(
        m.get_facl(sub, AclType::Default).expect("get"),
        Some(default.clone())
    );
    assert_eq!(sa.mode, 0o755);
    let (_, la) = m.symlink(&owner, dir, b"ln", b"child").expect("symlink");
    assert_eq!((la.access_acl, la.default_acl), (0, 0));
    // Removed: new entries get the umask again.
    m.set_facl(&root(), dir, AclType::Default, &Rule::empty())
        .expect("remove");
    assert_eq!(m.get_facl(dir, AclType::Default).expect("get"), None);
    let (plain, pa) = m
        .create(&owner, dir, b"plain", 0o666, 0o022)
        .expect("create");
    m.close(plain).expect("close");
    assert_eq!((pa.mode, pa.access_acl), (0o644, 0));

    // An ACL change by an owner outside the group drops setgid.
    let (sg, _) = m.create(&owner, dir, b"sg", 0o640, 0).expect("create");
    m.close(sg).expect("close");
    m.setattr(
        &root(),
        sg,
        &SetAttr {
            mode: Some(0o2640),
            gid: Some(5000),
            ..SetAttr::default()
        },
    )
    .expect("setgid, group 5000");
    m.set_facl(&owner, sg, AclType::Access, &rule)
        .expect("setfacl");
    assert_eq!(m.getattr(sg).expect("getattr").mode, 0o660);

    // A request the kernel checked (a FUSE_POSIX_ACL session: it knew the
    // caller's supplementary groups) is not judged again by mode or ACL;
    // the ownership rules still hold.
    assert!(matches!(m.access(&stranger, sg, 4), Err(Error::Access)));
    let checked = Context {
        kernel_checked: true,
        ..user(3000)
    };
    m.access(&checked, sg, 4).expect("checked by the kernel");
    assert!(matches!(
        m.set_facl(&checked, sg, AclType::Access, &Rule::empty()),
        Err(Error::Perm)
    ));
}

/// A removed name of a hard-linked file goes to the trash and keeps its
/// link (JuiceFS's format); `trash_links` counts those names.
pub(crate) fn trash_links_are_counted(m: &dyn Meta) {
    formatted(m, 1);
    let c = root();
    let (f, _) = m.create(&c, ROOT_INO, b"a", 0o644, 0).expect("create");
    m.close(f).expect("close");
    m.link(&c, f, ROOT_INO, b"b").expect("link");
    assert_eq!(m.trash_links(f).expect("count"), 0);
    m.unlink(&c, ROOT_INO, b"a").expect("unlink");
    assert_eq!(m.getattr(f).expect("getattr").nlink, 2);
    assert_eq!(m.trash_links(f).expect("count"), 1);
    m.unlink(&c, ROOT_INO, b"b").expect("unlink");
    assert_eq!(m.trash_links(f).expect("count"), 2);
}

/// create, lookup, getattr.
pub(crate) fn create_lookup_getattr(m: &dyn Meta) {
    formatted(m, 0);
    let ctx = user(1000);
    m.setattr(
        &root(),
        ROOT_INO,
        &SetAttr {
            mode: Some(0o777),
            ..SetAttr::default()
        },
    )
    .expect("chmod root");
    let (ino, a) = m
        .create(&ctx, ROOT_INO, b"f", 0o666, 0o022)
        .expect("create");
    m.close(ino).expect("close");
    assert!(ino > ROOT_INO);
    assert_eq!(a.typ, FileType::File);
    assert_eq!(a.mode, 0o644);
    assert_eq!(
        (a.uid, a.gid, a.nlink, a.length, a.parent),
        (1000, 1000, 1, 0, ROOT_INO)
    );
    let (found, fa) = m.lookup(&ctx, ROOT_INO, b"f").expect("lookup");
    assert_eq!(found, ino);
    assert_eq!(fa, m.getattr(ino).expect("getattr"));
    assert_err(
        m.create(&ctx, ROOT_INO, b"f", 0o644, 0),
        |e| matches!(e, Error::Exists),
        "dup",
    );
    assert_err(
        m.lookup(&ctx, ROOT_INO, b"nope"),
        |e| matches!(e, Error::NotFound),
        "missing",
    );
    assert_err(
        m.lookup(&ctx, ino, b"x"),
        |e| matches!(e, Error::NotDir),
        "lookup in file",
    );
    assert_eq!(m.lookup(&ctx, ROOT_INO, b".").expect(".").0, ROOT_INO);
    assert_eq!(m.lookup(&ctx, ROOT_INO, b"..").expect("..").0, ROOT_INO);
    let (d, _) = m.mkdir(&ctx, ROOT_INO, b"d", 0o755, 0).expect("mkdir");
    assert_eq!(m.lookup(&ctx, d, b"..").expect("..").0, ROOT_INO);
    assert_err(
        m.getattr(9_999_999),
        |e| matches!(e, Error::NotFound),
        "getattr missing",
    );
    let root_attr = m.getattr(ROOT_INO).expect("root");
    assert!(
        root_attr.mtime >= a.ctime,
        "creating touches the parent's mtime"
    );
}

/// Bad names get clear errors.
pub(crate) fn names_are_checked(m: &dyn Meta) {
    formatted(m, 0);
    let c = root();
    assert_err(
        m.mkdir(&c, ROOT_INO, b"", 0o755, 0),
        |e| matches!(e, Error::Invalid(_)),
        "empty",
    );
    assert_err(
        m.mkdir(&c, ROOT_INO, b"a/b", 0o755, 0),
        |e| matches!(e, Error::Invalid(_)),
        "slash",
    );
    let long = vec![b'n'; 256];
    assert_err(
        m.mkdir(&c, ROOT_INO, &long, 0o755, 0),
        |e| matches!(e, Error::NameTooLong),
        "long",
    );
    assert_err(
        m.lookup(&c, ROOT_INO, &long),
        |e| matches!(e, Error::NameTooLong),
        "long lookup",
    );
    assert_err(
        m.mkdir(&c, ROOT_INO, b".", 0o755, 0),
        |e| matches!(e, Error::Exists),
        "dot",
    );
    assert_err(
        m.mkdir(&c, ROOT_INO, b"..", 0o755, 0),
        |e| matches!(e, Error::Exists),
        "dotdot",
    );
    assert_err(
        m.mkdir(&c, ROOT_INO, b".trash", 0o755, 0),
        |e| matches!(e, Error::Perm),
        "trash",
    );
    let ok = vec![b'n'; 255];
    m.mkdir(&c, ROOT_INO, &ok, 0o755, 0)
        .expect("255 bytes is fine");
    m.mkdir(&c, ROOT_INO, &[0xff, 0xfe], 0o755, 0)
        .expect("names need not be UTF-8");
    assert!(names(m, ROOT_INO).contains(&vec![0xff, 0xfe]));
}

/// Directory link counts follow subdirectories.
pub(crate) fn mkdir_rmdir_nlink(m: &dyn Meta) {
    formatted(m, 0);
    let c = root();
    let (d, da) = m.mkdir(&c, ROOT_INO, b"d", 0o755, 0o022).expect("mkdir");
    assert_eq!((da.nlink, da.length, da.mode), (2, 4096, 0o755));
    assert_eq!(m.getattr(ROOT_INO).expect("root").nlink, 3);
    let (sub, _) = m.mkdir(&c, d, b"sub", 0o700, 0).expect("mkdir sub");
    m.create(&c, d, b"f", 0o644, 0)
        .and_then(|(i, _)| m.close(i))
        .expect("create");
    assert_eq!(m.getattr(d).expect("d").nlink, 3);
    assert_err(
        m.rmdir(&c, ROOT_INO, b"d"),
        |e| matches!(e, Error::NotEmpty),
        "non-empty",
    );
    assert_err(
        m.rmdir(&c, d, b"f"),
        |e| matches!(e, Error::NotDir),
        "rmdir file",
    );
    assert_err(
        m.unlink(&c, d, b"sub"),
        |e| matches!(e, Error::IsDir),
        "unlink dir",
    );
    assert_err(
        m.rmdir(&c, d, b"."),
        |e| matches!(e, Error::Invalid(_)),
        "rmdir .",
    );
    m.rmdir(&c, d, b"sub").expect("rmdir sub");
    assert_err(m.getattr(sub), |e| matches!(e, Error::NotFound), "sub gone");
    m.unlink(&c, d, b"f").expect("unlink");
    m.rmdir(&c, ROOT_INO, b"d").expect("rmdir");
    assert_eq!(m.getattr(ROOT_INO).expect("root").nlink, 2);
    assert_err(
        m.rmdir(&c, ROOT_INO, b"d"),
        |e| matches!(e, Error::NotFound),
        "twice",
    );
}

/// readdir lists `.`, `..` and every entry, with attributes when asked.
pub(crate) fn readdir_lists_entries(m: &dyn Meta) {
    formatted(m, 1);
    let c = root();
    let (d, _) = m.mkdir(&c, ROOT_INO, b"d", 0o755, 0).expect("mkdir");
    let (f, _) = m.create(&c, d, b"f", 0o600, 0).expect("create");
    m.close(f).expect("close");
    m.symlink(&c, d, b"s", b"f").expect("symlink");
    let plain = m.readdir(&c, d, false).expect("readdir");
    let got: Vec<(&[u8], FileType)> = plain.iter().map(|e| (&e.name[..], e.attr.typ)).collect();
    assert_eq!(got[0], (&b"."[..], FileType::Directory));
    assert_eq!(got[1], (&b".."[..], FileType::Directory));
    assert_eq!(plain[0].inode, d);
    assert_eq!(plain[1].inode, ROOT_INO);
    let rest: HashSet<(Vec<u8>, FileType)> = plain[2..]
        .iter()
        .map(|e| (e.name.clone(), e.attr.typ))
        .collect();
    assert_eq!(
        rest,
        HashSet::from([
            (b"f".to_vec(), FileType::File),
            (b"s".to_vec(), FileType::Symlink)
        ])
    );
    let plus = m.readdir(&c, d, true).expect("readdir plus");
    let fe = plus.iter().find(|e| e.name == b"f").expect("f listed");
    assert_eq!(fe.attr, m.getattr(f).expect("getattr"));
    // The trash is reachable by name but not listed.
    assert!(!names(m, ROOT_INO).contains(&b".trash".to_vec()));
    assert_eq!(
        m.lookup(&c, ROOT_INO, b".trash").expect(".trash").0,
        TRASH_INO
    );
    assert_err(
        m.readdir(&c, f, false),
        |e| matches!(e, Error::NotDir),
        "readdir file",
    );
}

/// Pages through directory `d` with pages of about `max` entries, creating
/// and removing the names `changes` gives for each page between the pages.
/// Returns every entry listed (repeats dropped as the caller must, where
/// the engine says a page may repeat) and the most entries one page read.
fn page_through(
    m: &dyn Meta,
    d: Ino,
    plus: bool,
    max: usize,
    mut between: impl FnMut(usize),
) -> (Vec<Entry>, u64) {
    let c = root();
    let (mut out, mut seen, mut most) = (Vec::new(), HashSet::new(), 0u64);
    let mut cursor = Some(DirCursor::Start);
    let mut pages = 0;
    while let Some(at) = cursor {
        let before = m.work();
        let page = m.readdir_page(&c, d, plus, &at, max).expect("readdir page");
        most = most.max(m.work().since(&before).dir_entries_read);
        if at == DirCursor::Start {
            assert_eq!(page.entries[0].name, b".");
            assert_eq!(page.entries[0].inode, d);
            assert_eq!(page.entries[1].name, b"..");
        }
        for e in page.entries {
            if seen.insert(e.name.clone()) {
                out.push(e);
            } else {
                assert!(page.may_repeat, "{:?} listed twice", e.name);
            }
        }
        cursor = page.next;
        between(pages);
        pages += 1;
        assert!(pages < 100_000, "the listing never ends");
    }
    (out, most)
}

/// A directory listed a page at a time: every entry once, each page read
/// costs about its own entries, and entries that stay through the listing
/// are all in it while others come and go.
pub(crate) fn readdir_pages(m: &dyn Meta) {
    formatted(m, 0);
    let c = root();
    let (d, _) = m.mkdir(&c, ROOT_INO, b"d", 0o755, 0).expect("mkdir");
    const N: usize = 1000;
    for i in 0..N {
        let (f, _) = m
            .create(&c, d, format!("f{i:04}").as_bytes(), 0o644, 0)
            .expect("create");
        m.close(f).expect("close");
    }
    let whole: HashSet<Vec<u8>> = m
        .readdir(&c, d, false)
        .expect("readdir")
        .into_iter()
        .map(|e| e.name)
        .collect();
    for plus in [false, true] {
        let (listed, most) = page_through(m, d, plus, 100, |_| {});
        let names: HashSet<Vec<u8>> = listed.iter().map(|e| e.name.clone()).collect();
        assert_eq!(listed.len(), N + 2, "plus {plus}");
        assert_eq!(names, whole, "plus {plus}");
        // A page reads about what it returns (Redis's COUNT is a hint).
        assert!(most <= 300, "a page read {most} entries");
        if plus {
            let f7 = listed.iter().find(|e| e.name == b"f0007").expect("f0007");
            assert_eq!(
                f7.attr,
                m.getattr(f7.inode).expect("getattr"),
                "plus pages carry attributes"
            );
        }
    }
    // Names come and go between pages: the ones that stay are all listed,
    // once; the even ones removed meanwhile and the new ones may or may
    // not be.
    let (listed, _) = page_through(m, d, false, 64, |page| {
        for k in 0..10 {
            let i = (page * 10 + k) * 2;
            if i < N {
                m.unlink(&c, d, format!("f{i:04}").as_bytes())
                    .expect("unlink");
            }
            let (f, _) = m
                .create(&c, d, format!("g{page:03}-{k}").as_bytes(), 0o644, 0)
                .expect("create");
            m.close(f).expect("close");
        }
    });
    let names: HashSet<Vec<u8>> = listed.iter().map(|e| e.name.clone()).collect();
    assert_eq!(names.len(), listed.len());
    for i in (1..N).step_by(2) {
        assert!(
            names.contains(format!("f{i:04}").as_bytes()),
            "f{i:04} stayed and was not listed"
        );
    }
    // An empty directory: one page, `.` and `..`.
    let (e, _) = m.mkdir(&c, ROOT_INO, b"e", 0o755, 0).expect("mkdir");
    let page = m
        .readdir_page(&c, e, false, &DirCursor::Start, 100)
        .expect("empty");
    assert_eq!(page.entries.len(), 2);
    assert_eq!(page.next, None);
    // Access is checked on the first page, as for readdir.
    let (f, _) = m.create(&c, d, b"plain", 0o644, 0).expect("create");
    m.close(f).expect("close");
    assert_err(
        m.readdir_page(&c, f, false, &DirCursor::Start, 100),
        |e| matches!(e, Error::NotDir),
        "a file",
    );
}

/// rename within and across directories, replacing a file.
pub(crate) fn rename_moves_and_replaces(m: &dyn Meta) {
    formatted(m, 0);
    let released = track_releases(m);
    let c = root();
    let (a, _) = m.mkdir(&c, ROOT_INO, b"a", 0o755, 0).expect("mkdir a");
    let (b, _) = m.mkdir(&c, ROOT_INO, b"b", 0o755, 0).expect("mkdir b");
    let (f, _) = m.create(&c, a, b"f", 0o644, 0).expect("create");
    m.close(f).expect("close");
    let (moved, attr) = m
        .rename(&c, a, b"f", b, b"g", RenameFlags::default())
        .expect("rename across");
    assert_eq!(moved, f);
    assert_eq!(attr.parent, b);
    assert_eq!(m.lookup(&c, b, b"g").expect("moved").0, f);
    assert_err(
        m.lookup(&c, a, b"f"),
        |e| matches!(e, Error::NotFound),
        "old name gone",
    );
    // Over an existing file: the victim goes, its data is released.
    let (v, _) = m.create(&c, b, b"victim", 0o644, 0).expect("victim");
    let vs = write(m, v, 0, 100);
    m.close(v).expect("close");
    m.rename(&c, b, b"g", b, b"victim", RenameFlags::default())
        .expect("rename over file");
    assert_eq!(m.lookup(&c, b, b"victim").expect("replaced").0, f);
    assert_err(
        m.getattr(v),
        |e| matches!(e, Error::NotFound),
        "victim gone",
    );
    assert!(released.lock().contains(&ReleasedSlice {
        id: vs.id,
        size: vs.size
    }));
    assert_eq!(names(m, b).len(), 3);
    // Renaming onto itself changes nothing.
    m.rename(&c, b, b"victim", b, b"victim", RenameFlags::default())
        .expect("self rename");
    assert_err(
        m.rename(&c, b, b"nope", a, b"x", RenameFlags::default()),
        |e| matches!(e, Error::NotFound),
        "missing source",
    );
}

/// RENAME_NOREPLACE and RENAME_EXCHANGE.
pub(crate) fn rename_flags(m: &dyn Meta) {
    formatted(m, 0);
    let c = root();
    let (x, _) = m.create(&c, ROOT_INO, b"x", 0o644, 0).expect("x");
    let (d, _) = m.mkdir(&c, ROOT_INO, b"d", 0o755, 0).expect("d");
    let (y, _) = m.create(&c, d, b"y", 0o644, 0).expect("y");
    m.close(x).and_then(|_| m.close(y)).expect("close");
    let noreplace = RenameFlags {
        noreplace: true,
        exchange: false,
    };
    let exchange = RenameFlags {
        noreplace: false,
        exchange: true,
    };
    assert_err(
        m.rename(&c, ROOT_INO, b"x", d, b"y", noreplace),
        |e| matches!(e, Error::Exists),
        "noreplace",
    );
    m.rename(&c, ROOT_INO, b"x", d, b"y", exchange)
        .expect("exchange");
    assert_eq!(m.lookup(&c, ROOT_INO, b"x").expect("x").0, y);
    assert_eq!(m.lookup(&c, d, b"y").expect("y").0, x);
    assert_eq!(m.getattr(y).expect("y").parent, ROOT_INO);
    assert_eq!(m.getattr(x).expect("x").parent, d);
    assert_err(
        m.rename(&c, ROOT_INO, b"x", d, b"nothing", exchange),
        |e| matches!(e, Error::NotFound),
        "exchange with nothing",
    );
    // Exchanging a directory with a file moves the link counts along.
    m.rename(&c, ROOT_INO, b"d", ROOT_INO, b"x", exchange)
        .expect("exchange dir and file in one dir");
    assert_eq!(m.lookup(&c, ROOT_INO, b"x").expect("x").0, d);
    assert_eq!(m.getattr(ROOT_INO).expect("root").nlink, 3);
}

/// Directory renames: over empty directories, not over full ones, never into themselves.
pub(crate) fn rename_directories(m: &dyn Meta) {
    formatted(m, 0);
    let c = root();
    let (a, _) = m.mkdir(&c, ROOT_INO, b"a", 0o755, 0).expect("a");
    let (b, _) = m.mkdir(&c, ROOT_INO, b"b", 0o755, 0).expect("b");
    let (a1, _) = m.mkdir(&c, a, b"a1", 0o755, 0).expect("a1");
    let (f, _) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    m.close(f).expect("close");
    let plain = RenameFlags::default();
    assert_err(
        m.rename(&c, ROOT_INO, b"a", a1, b"in", plain),
        |e| matches!(e, Error::Invalid(_)),
        "into itself",
    );
    assert_err(
        m.rename(&c, ROOT_INO, b"a", a, b"in", plain),
        |e| matches!(e, Error::Invalid(_)),
        "into itself directly",
    );
    assert_err(
        m.rename(&c, ROOT_INO, b"f", ROOT_INO, b"a", plain),
        |e| matches!(e, Error::IsDir),
        "file over dir",
    );
    assert_err(
        m.rename(&c, ROOT_INO, b"a", ROOT_INO, b"f", plain),
        |e| matches!(e, Error::NotDir),
        "dir over file",
    );
    assert_err(
        m.rename(&c, ROOT_INO, b"b", ROOT_INO, b"a", plain),
        |e| matches!(e, Error::NotEmpty),
        "over full dir",
    );
    // Move a1 from a to b: link counts move with it.
    m.rename(&c, a, b"a1", b, b"b1", plain).expect("move dir");
    assert_eq!(m.getattr(a).expect("a").nlink, 2);
    assert_eq!(m.getattr(b).expect("b").nlink, 3);
    assert_eq!(m.getattr(a1).expect("a1").parent, b);
    assert_eq!(m.lookup(&c, a1, b"..").expect("..").0, b);
    // Over an empty directory.
    m.rename(&c, ROOT_INO, b"a", b, b"b1", plain)
        .expect("dir over empty dir");
    assert_err(
        m.getattr(a1),
        |e| matches!(e, Error::NotFound),
        "replaced dir gone",
    );
    assert_eq!(m.getattr(b).expect("b").nlink, 3);
    assert_eq!(m.getattr(ROOT_INO).expect("root").nlink, 3);
}

/// Hard links share one node.
pub(crate) fn hard_links(m: &dyn Meta) {
    formatted(m, 0);
    let released = track_releases(m);
    let c = root();
    let (d, _) = m.mkdir(&c, ROOT_INO, b"d", 0o755, 0).expect("d");
    let (f, _) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    let s = write(m, f, 0, 10);
    m.close(f).expect("close");
    let a = m.link(&c, f, d, b"h").expect("link");
    assert_eq!((a.nlink, a.parent), (2, 0));
    assert_eq!(m.lookup(&c, d, b"h").expect("h").0, f);
    assert_err(
        m.link(&c, f, d, b"h"),
        |e| matches!(e, Error::Exists),
        "dup link",
    );
    assert_err(
        m.link(&c, d, ROOT_INO, b"dl"),
        |e| matches!(e, Error::Perm),
        "link a dir",
    );
    m.unlink(&c, ROOT_INO, b"f").expect("unlink one");
    let a = m.getattr(f).expect("still there");
    assert_eq!((a.nlink, a.length), (1, 10));
    assert_eq!(m.read_chunk(f, 0).expect("read"), vec![s]);
    assert!(released.lock().is_empty());
    m.unlink(&c, d, b"h").expect("unlink last");
    assert_err(m.getattr(f), |e| matches!(e, Error::NotFound), "gone");
    assert_eq!(
        released.lock().as_slice(),
        &[ReleasedSlice {
            id: s.id,
            size: s.size
        }]
    );
}

/// Symlinks keep their target; their length is the target's.
pub(crate) fn symlinks(m: &dyn Meta) {
    formatted(m, 0);
    let c = root();
    let (s, a) = m
        .symlink(&c, ROOT_INO, b"s", b"some/where")
        .expect("symlink");
    assert_eq!(
        (a.typ, a.mode, a.length, a.nlink),
        (FileType::Symlink, 0o777, 10, 1)
    );
    assert_eq!(m.readlink(s).expect("readlink"), b"some/where");
    let (f, _) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    m.close(f).expect("close");
    assert_err(
        m.readlink(f),
        |e| matches!(e, Error::Invalid(_)),
        "readlink a file",
    );
    assert_err(
        m.symlink(&c, ROOT_INO, b"e", b""),
        |e| matches!(e, Error::Invalid(_)),
        "empty target",
    );
    m.unlink(&c, ROOT_INO, b"s").expect("unlink");
    assert_err(m.readlink(s), |e| matches!(e, Error::NotFound), "gone");
}

/// Fifos, sockets and devices.
pub(crate) fn mknod_special_files(m: &dyn Meta) {
    formatted(m, 0);
    let c = root();
    let (_, a) = m
        .mknod(&c, ROOT_INO, b"p", FileType::Fifo, 0o644, 0, 0)
        .expect("fifo");
    assert_eq!((a.typ, a.length, a.rdev), (FileType::Fifo, 0, 0));
    let (_, a) = m
        .mknod(&c, ROOT_INO, b"c", FileType::CharDev, 0o600, 0, 0x0103)
        .expect("chr");
    assert_eq!(a.rdev, 0x0103);
    assert_err(
        m.mknod(&c, ROOT_INO, b"d", FileType::Directory, 0o755, 0, 0),
        |e| matches!(e, Error::Invalid(_)),
        "mknod a directory",
    );
}

/// Extended attributes with create/replace semantics.
pub(crate) fn xattrs(m: &dyn Meta) {
    formatted(m, 0);
    let c = root();
    let (f, _) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    m.close(f).expect("close");
    assert_err(
        m.getxattr(f, b"user.a"),
        |e| matches!(e, Error::NoXattr),
        "missing",
    );
    m.setxattr(&c, f, b"user.a", b"1", XattrMode::Any)
        .expect("set");
    assert_eq!(m.getxattr(f, b"user.a").expect("get"), b"1");
    assert_err(
        m.setxattr(&c, f, b"user.a", b"2", XattrMode::Create),
        |e| matches!(e, Error::Exists),
        "create existing",
    );
    assert_err(
        m.setxattr(&c, f, b"user.b", b"2", XattrMode::Replace),
        |e| matches!(e, Error::NoXattr),
        "replace missing",
    );
    m.setxattr(&c, f, b"user.a", b"3", XattrMode::Replace)
        .expect("replace");
    m.setxattr(&c, f, b"user.b", b"", XattrMode::Create)
        .expect("empty value");
    assert_eq!(m.getxattr(f, b"user.a").expect("get"), b"3");
    let names: HashSet<Vec<u8>> = m.listxattr(f).expect("list").into_iter().collect();
    assert_eq!(
        names,
        HashSet::from([b"user.a".to_vec(), b"user.b".to_vec()])
    );
    // Setting and removing an attribute change ctime (xfstests
    // generic/728); the sleeps outlast the stored times' resolution.
    let ctime = |m: &dyn Meta| m.getattr(f).expect("getattr").ctime;
    let before = ctime(m);
    std::thread::sleep(std::time::Duration::from_millis(2));
    m.setxattr(&c, f, b"user.c", b"x", XattrMode::Any)
        .expect("set");
    let after_set = ctime(m);
    assert!(after_set > before, "setxattr leaves ctime {before:?}");
    std::thread::sleep(std::time::Duration::from_millis(2));
    m.removexattr(&c, f, b"user.c").expect("remove");
    assert!(ctime(m) > after_set, "removexattr leaves ctime");
    m.removexattr(&c, f, b"user.a").expect("remove");
    assert_err(
        m.removexattr(&c, f, b"user.a"),
        |e| matches!(e, Error::NoXattr),
        "remove twice",
    );
    assert_eq!(m.listxattr(f).expect("list"), vec![b"user.b".to_vec()]);
    assert_err(
        m.getxattr(9_999_999, b"user.a"),
        |e| matches!(e, Error::NotFound),
        "no inode",
    );
    assert_err(
        m.setxattr(&user(7), f, b"user.c", b"x", XattrMode::Any),
        |e| matches!(e, Error::Access),
        "no write access",
    );
}

/// `set_atime` moves the access time alone (a read's update is no change:
/// ctime and mtime stay).
pub(crate) fn set_atime_alone(m: &dyn Meta) {
    formatted(m, 0);
    let (f, before) = m.create(&root(), ROOT_INO, b"f", 0o600, 0).expect("f");
    m.close(f).expect("close");
    let at = Timestamp {
        secs: before.atime.secs + 1000,
        nsecs: 5000,
    };
    m.set_atime(f, at).expect("set_atime");
    let after = m.getattr(f).expect("getattr");
    assert_eq!(after.atime, at);
    assert_eq!((after.mtime, after.ctime), (before.mtime, before.ctime));
    assert_err(
        m.set_atime(9_999_999, at),
        |e| matches!(e, Error::NotFound),
        "no inode",
    );
}

/// chmod/chown/utimes rules.
pub(crate) fn setattr_rules(m: &dyn Meta) {
    formatted(m, 0);
    let owner = user(1000);
    m.setattr(
        &root(),
        ROOT_INO,
        &SetAttr {
            mode: Some(0o777),
            ..SetAttr::default()
        },
    )
    .expect("chmod root");
    let (f, _) = m.create(&owner, ROOT_INO, b"f", 0o644, 0).expect("f");
    m.close(f).expect("close");
    let a = m
        .setattr(
            &owner,
            f,
            &SetAttr {
                mode: Some(0o4755),
                ..SetAttr::default()
            },
        )
        .expect("owner chmod");
    assert_eq!(a.mode, 0o4755);
    assert_err(
        m.setattr(
            &user(2000),
            f,
            &SetAttr {
                mode: Some(0o777),
                ..SetAttr::default()
            },
        ),
        |e| matches!(e, Error::Perm),
        "other chmod",
    );
    assert_err(
        m.setattr(
            &owner,
            f,
            &SetAttr {
                uid: Some(0),
                ..SetAttr::default()
            },
        ),
        |e| matches!(e, Error::Perm),
        "user chown",
    );
    let a = m
        .setattr(
            &root(),
            f,
            &SetAttr {
                uid: Some(2000),
                ..SetAttr::default()
            },
        )
        .expect("root chown");
    assert_eq!(a.uid, 2000);
    assert_eq!(a.mode & 0o4000, 0, "chown clears setuid");
    let t = Timestamp {
        secs: 1_000_000_000,
        nsecs: 123_456_789,
    };
    let a = m
        .setattr(
            &root(),
            f,
            &SetAttr {
                atime: Some(TimeChange::At(t)),
                mtime: Some(TimeChange::At(t)),
                ..SetAttr::default()
            },
        )
        .expect("utimes");
    assert_eq!((a.atime, a.mtime), (t, t));
    assert_eq!(
        m.getattr(f).expect("getattr").mtime,
        t,
        "nanoseconds survive storage"
    );
    assert!(a.ctime > t);
}

fn chmod(m: &dyn Meta, ctx: &Context, ino: Ino, mode: u16) -> crate::Result<u16> {
    let set = SetAttr {
        mode: Some(mode),
        ..SetAttr::default()
    };
    m.setattr(ctx, ino, &set).map(|a| a.mode)
}

fn chown(
    m: &dyn Meta,
    ctx: &Context,
    ino: Ino,
    uid: Option<u32>,
    gid: Option<u32>,
) -> crate::Result<u16> {
    let set = SetAttr {
        uid,
        gid,
        ..SetAttr::default()
    };
    m.setattr(ctx, ino, &set).map(|a| a.mode)
}

fn kill_setid(m: &dyn Meta, ctx: &Context, ino: Ino) -> u16 {
    let set = SetAttr {
        kill_suidgid: true,
        ..SetAttr::default()
    };
    m.setattr(ctx, ino, &set).expect("kill setid").mode
}

/// Linux's `setattr_prepare` for owners and groups (xfstests
/// generic/193): a chown or chgrp that names the current owner or group
/// is still refused to anyone but the owner (or root); the owner may chgrp
/// only to its group or one it is in; chown clears setuid even by root and
/// setgid only from a group-executable file (or for a caller outside the
/// group); explicit times need ownership even when they do not change.
pub(crate) fn chown_chgrp_rules(m: &dyn Meta) {
    formatted(m, 0);
    let perm = |e: &Error| matches!(e, Error::Perm);
    chmod(m, &root(), ROOT_INO, 0o777).expect("chmod root");
    let owner = user(1000);
    let other = user(2000);
    let (r, _) = m.create(&root(), ROOT_INO, b"r", 0o644, 0).expect("r");
    m.close(r).expect("close");
    assert_err(
        chown(m, &other, r, Some(0), None),
        perm,
        "no-op chown by other",
    );
    assert_err(
        chown(m, &other, r, None, Some(0)),
        perm,
        "no-op chgrp by other",
    );
    assert_err(
        chown(m, &other, r, Some(2000), None),
        perm,
        "chown by other",
    );
    assert_err(
        chown(m, &other, r, None, Some(2000)),
        perm,
        "chgrp by other",
    );
    let (f, _) = m.create(&owner, ROOT_INO, b"f", 0o644, 0).expect("f");
    m.close(f).expect("close");
    chown(m, &owner, f, Some(1000), None).expect("owner chowns to itself");
    assert_err(chown(m, &owner, f, Some(0), None), perm, "owner gives away");
    chown(m, &owner, f, None, Some(1000)).expect("owner chgrp to its group");
    assert_err(
        chown(m, &owner, f, None, Some(0)),
        perm,
        "chgrp to a foreign group",
    );
    let member = Context {
        gids: vec![1000, 3000],
        ..user(1000)
    };
    chown(m, &member, f, None, Some(3000)).expect("chgrp to a supplementary group");
    chown(m, &owner, f, None, Some(3000)).expect("chgrp to the current group");

    // setid on chown, as Linux's chown_common.
    for (before, by, after) in [
        (0o6644, root(), 0o2644),
        (0o6744, root(), 0o2744),
        (0o6654, root(), 0o0654),
        (0o6754, root(), 0o0754),
        (0o6644, owner.clone(), 0o0644),
        (0o6644, member.clone(), 0o2644),
    ] {
        chmod(m, &root(), f, before).expect("chmod");
        let gid = if by.uid == 0 { 0 } else { 3000 };
        let mode = chown(m, &by, f, None, Some(gid)).expect("chgrp");
        assert_eq!(mode, after, "chgrp of {before:o} by uid {}", by.uid);
        chown(m, &root(), f, None, Some(3000)).expect("back to group 3000");
    }
    let (d, _) = m.mkdir(&root(), ROOT_INO, b"d", 0o2755, 0).expect("d");
    assert_eq!(
        chown(m, &root(), d, Some(1000), None).expect("chown dir"),
        0o2755,
        "a directory keeps setgid"
    );

    // utimes with explicit times: owner only, changed or not.
    let cur = m.getattr(f).expect("getattr");
    let same = SetAttr {
        atime: Some(TimeChange::At(cur.atime)),
        mtime: Some(TimeChange::At(cur.mtime)),
        ..SetAttr::default()
    };
    chmod(m, &root(), f, 0o666).expect("chmod 666");
    assert_err(m.setattr(&other, f, &same), perm, "utimes by other");
    m.setattr(&owner, f, &same).expect("utimes by owner");
    let now = SetAttr {
        mtime: Some(TimeChange::Now),
        ..SetAttr::default()
    };
    m.setattr(&other, f, &now).expect("touch by a writer");
}

/// What a change of a file's data drops (Linux's
/// `setattr_should_drop_suidgid`, xfstests generic/683–685): setuid always,
/// setgid when the file is group-executable or the caller is outside its
/// group, nothing for root; and a writer without HANDLE_KILLPRIV_V2 may
/// clear exactly those bits by SETATTR of the mode.
pub(crate) fn data_changes_drop_setid(m: &dyn Meta) {
    formatted(m, 0);
    let perm = |e: &Error| matches!(e, Error::Perm);
    let writer = user(2000);
    let (f, _) = m.create(&root(), ROOT_INO, b"s", 0o644, 0).expect("s");
    m.close(f).expect("close");
    for (before, gid, after) in [
        (0o6666, 0, 0o0666),
        (0o6676, 0, 0o0676),
        (0o2666, 0, 0o0666),
        (0o6666, 2000, 0o2666),
        (0o6676, 2000, 0o0676),
        (0o4777, 2000, 0o0777),
        (0o0666, 0, 0o0666),
    ] {
        chown(m, &root(), f, None, Some(gid)).expect("chgrp");
        chmod(m, &root(), f, before).expect("chmod");
        assert_eq!(
            kill_setid(m, &writer, f),
            after,
            "data change of {before:o} (group {gid}) by a non-root writer"
        );
        chmod(m, &root(), f, before).expect("chmod");
        assert_eq!(kill_setid(m, &root(), f), before, "root keeps {before:o}");
    }
    let (d, _) = m.mkdir(&root(), ROOT_INO, b"d", 0o2777, 0).expect("d");
    assert_eq!(kill_setid(m, &writer, d), 0o2777, "not for a directory");

    // The kernel's own clearing (SETATTR of the mode, sent as the writer).
    chown(m, &root(), f, None, Some(0)).expect("chgrp");
    chmod(m, &root(), f, 0o6666).expect("chmod");
    assert_eq!(chmod(m, &writer, f, 0o2666).expect("clear setuid"), 0o2666);
    assert_eq!(chmod(m, &writer, f, 0o0666).expect("clear setgid"), 0o0666);
    chmod(m, &root(), f, 0o6666).expect("chmod");
    assert_err(chmod(m, &writer, f, 0o6666), perm, "no change");
    assert_err(chmod(m, &writer, f, 0o2777), perm, "clears and adds");
    assert_err(chmod(m, &writer, f, 0o0644), perm, "clears and changes");
    chmod(m, &root(), f, 0o6644).expect("chmod");
    assert_err(
        chmod(m, &writer, f, 0o2644),
        perm,
        "a caller that cannot write",
    );
}

/// execve opens its file with `O_RDONLY|__FMODE_EXEC` and Linux checks
/// execute, not read, for it (`may_open` with MAY_EXEC): a `--x` file runs
/// for a user who may not read it, and a readable file without x does not.
/// xfstests generic/126.
pub(crate) fn exec_open_needs_execute(m: &dyn Meta) {
    const FMODE_EXEC: u32 = 0x20;
    formatted(m, 0);
    let other = user(2000);
    let exec = libc::O_RDONLY as u32 | FMODE_EXEC;
    let (f, _) = m.create(&root(), ROOT_INO, b"t", 0o711, 0).expect("t");
    m.close(f).expect("close");
    m.open(&other, f, exec)
        .and_then(|_| m.close(f))
        .expect("exec of a --x file");
    assert_err(
        m.open(&other, f, libc::O_RDONLY as u32),
        |e| matches!(e, Error::Access),
        "read open of a --x file",
    );
    let (g, _) = m.create(&root(), ROOT_INO, b"r", 0o644, 0).expect("r");
    m.close(g).expect("close");
    assert_err(
        m.open(&other, g, exec),
        |e| matches!(e, Error::Access),
        "exec of an r-- file",
    );
    assert_err(
        m.open(&root(), g, exec),
        |e| matches!(e, Error::Access),
        "root exec of a file with no x bit",
    );
    m.open(&other, g, libc::O_RDONLY as u32)
        .and_then(|_| m.close(g))
        .expect("read open of an r-- file");
}

/// Permission bits and sticky directories.
pub(crate) fn permissions(m: &dyn Meta) {
    formatted(m, 0);
    let alice = user(1000);
    let bob = user(2000);
    let (priv_dir, _) = m
        .mkdir(&root(), ROOT_INO, b"private", 0o755, 0)
        .expect("private");
    assert_err(
        m.create(&alice, priv_dir, b"f", 0o644, 0),
        |e| matches!(e, Error::Access),
        "no write on dir",
    );
    let (tmp, _) = m.mkdir(&root(), ROOT_INO, b"tmp", 0o1777, 0).expect("tmp");
    let (f, _) = m
        .create(&alice, tmp, b"alice", 0o600, 0)
        .expect("alice's file");
    m.close(f).expect("close");
    assert_err(
        m.unlink(&bob, tmp, b"alice"),
        |e| matches!(e, Error::Access),
        "sticky unlink",
    );
    assert_err(
        m.open(&bob, f, libc::O_RDONLY as u32),
        |e| matches!(e, Error::Access),
        "open 0600 as other",
    );
    m.open(&alice, f, libc::O_RDWR as u32)
        .and_then(|_| m.close(f))
        .expect("owner opens");
    assert_err(
        m.access(&bob, f, libc::R_OK as u32),
        |e| matches!(e, Error::Access),
        "access",
    );
    m.access(&alice, f, (libc::R_OK | libc::W_OK) as u32)
        .expect("owner access");
    let mut group = bob.clone();
    group.gids.push(1000);
    m.setattr(
        &alice,
        f,
        &SetAttr {
            mode: Some(0o640),
            ..SetAttr::default()
        },
    )
    .expect("chmod");
    m.access(&group, f, libc::R_OK as u32).expect("group read");
    assert_err(
        m.truncate(&group, f, 0, TruncateVia::Path),
        |e| matches!(e, Error::Access),
        "group write",
    );
    // Root may do anything but execute a file nobody may execute
    // (xfstests generic/088).
    m.access(&root(), f, (libc::R_OK | libc::W_OK) as u32)
        .expect("root reads and writes a 0640 file");
    assert_err(
        m.access(&root(), f, libc::X_OK as u32),
        |e| matches!(e, Error::Access),
        "root executes a file with no x bit",
    );
    m.setattr(
        &alice,
        f,
        &SetAttr {
            mode: Some(0o610),
            ..SetAttr::default()
        },
    )
    .expect("chmod g+x");
    m.access(&root(), f, libc::X_OK as u32)
        .expect("root executes a file someone may execute");
    m.access(&root(), priv_dir, libc::X_OK as u32)
        .expect("root searches any directory");
    m.unlink(&alice, tmp, b"alice")
        .expect("owner unlinks in sticky dir");
}

/// Slices: ids, appends, lengths, references and their release.
pub(crate) fn write_read_and_refs(m: &dyn Meta) {
    formatted(m, 0);
    let released = track_releases(m);
    let c = root();
    let (f, _) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    let a = m.new_slice_id().expect("id");
    let b = m.new_slice_id().expect("id");
    assert!(b > a && a > 0, "slice ids are fresh and non-zero");
    let s1 = write(m, f, 0, 5000);
    let s2 = write(m, f, 1000, 100);
    assert_eq!(m.getattr(f).expect("attr").length, 5000);
    assert_eq!(m.read_chunk(f, 0).expect("read"), vec![s1, s2]);
    assert!(m.read_chunk(f, 1).expect("empty chunk").is_empty());
    let id = m.new_slice_id().expect("id");
    let far = Slice {
        pos: 0,
        id,
        size: 10,
        off: 0,
        len: 10,
    };
    assert_eq!(
        m.write_chunk(f, 2, far, Timestamp::now()).expect("chunk 2"),
        1
    );
    assert_eq!(
        m.getattr(f).expect("attr").length,
        2 * crate::meta::CHUNK_SIZE + 10
    );
    assert!(m.slice_referenced(s1.id, s1.size).expect("ref"));
    let all = m.list_chunks().expect("list");
    assert_eq!(all.len(), 2);
    assert!(all.contains(&(f, 2, vec![far])));
    m.truncate(&c, f, 0, TruncateVia::Path).expect("truncate");
    let mut got = released.lock().clone();
    got.sort_by_key(|r| r.id);
    assert_eq!(
        got,
        vec![
            ReleasedSlice {
                id: s1.id,
                size: s1.size
            },
            ReleasedSlice {
                id: s2.id,
                size: s2.size
            },
            ReleasedSlice {
                id: far.id,
                size: far.size
            },
        ]
    );
    assert!(!m.slice_referenced(s1.id, s1.size).expect("ref"));
    m.close(f).expect("close");
    assert_err(
        m.write_chunk(
            f,
            0,
            Slice {
                pos: (64 << 20) - 1,
                id: 99,
                size: 2,
                off: 0,
                len: 2,
            },
            Timestamp::now(),
        ),
        |e| matches!(e, Error::Invalid(_)),
        "slice past the chunk",
    );
}

/// Writes 4 KiB at the start of chunk `indx`.
fn write_in(m: &dyn Meta, ino: Ino, indx: u32) {
    let id = m.new_slice_id().expect("slice id");
    let s = Slice {
        pos: 0,
        id,
        size: 4096,
        off: 0,
        len: 4096,
    };
    m.write_chunk(ino, indx, s, Timestamp::now())
        .expect("write");
}

/// Range work on a 2^58-byte sparse file (data in three of its 2^32 chunks)
/// visits the chunks that exist, never the chunk indexes of the range, and
/// changes at most [`CHUNKS_PER_TX`] chunks per transaction.
pub(crate) fn range_work_visits_existing_chunks(m: &dyn Meta) {
    formatted(m, 0);
    let c = root();
    let (f, _) = m.create(&c, ROOT_INO, b"sparse", 0o644, 0).expect("f");
    let last = (MAX_FILE_LENGTH / CHUNK_SIZE - 1) as u32;
    let data = [0, 1000, last];
    for indx in data {
        write_in(m, f, indx);
    }
    m.truncate(&c, f, MAX_FILE_LENGTH, TruncateVia::Path)
        .expect("grow to 2^58 bytes");
    let all = 0..=last;
    assert_eq!(m.chunk_indices(f, all.clone(), 10).expect("list"), data);
    assert_eq!(m.chunk_indices(f, 1..=last, 1).expect("list"), [1000]);
    assert!(
        m.chunk_indices(f, 1001..=last - 1, 10)
            .expect("list")
            .is_empty()
    );
    // The bound of each operation: the chunks that exist, plus, on Redis,
    // a bounded probe or one SCAN of a small database.
    let bounded = |w: crate::meta::WorkStats, visited: u64, what: &str| {
        assert!(w.chunks_visited <= visited, "{what}: {w:?}");
        assert!(w.chunk_probes <= u64::from(PROBE_SPAN), "{what}: {w:?}");
        assert!(w.scan_calls <= 4, "{what}: {w:?}");
    };

    let before = m.work();
    let a = m
        .fallocate(&c, f, 0x01 | 0x02, 0, MAX_FILE_LENGTH)
        .expect("punch the whole file");
    assert_eq!(a.length, MAX_FILE_LENGTH);
    let w = m.work().since(&before);
    bounded(w, 3, "punch");
    assert_eq!(w.range_transactions, 1, "punch: {w:?}");
    for indx in data {
        let slices = m.read_chunk(f, indx).expect("read");
        assert_eq!(
            slices.last(),
            Some(&crate::meta::chunks::hole(0, CHUNK_SIZE as u32)),
            "chunk {indx}"
        );
    }

    let before = m.work();
    let at = 1000 * CHUNK_SIZE + 100;
    m.fallocate(
        &c,
        f,
        0x10 | 0x01,
        at - 999 * CHUNK_SIZE,
        999 * CHUNK_SIZE + 50,
    )
    .expect("zero a range");
    bounded(m.work().since(&before), 2, "zero");
    assert_eq!(
        m.read_chunk(f, 1000).expect("read").last(),
        Some(&crate::meta::chunks::hole(0, 150))
    );

    let before = m.work();
    m.truncate(&c, f, 10, TruncateVia::Path).expect("shrink");
    m.fallocate(&c, f, 0, 0, MAX_FILE_LENGTH)
        .expect("preallocate 2^58 bytes");
    m.fallocate(&c, f, 0x10, 5, MAX_FILE_LENGTH - 5)
        .expect("zero 2^58 bytes, growing");
    bounded(m.work().since(&before), 5, "shrink, preallocate, zero");
    assert_eq!(m.getattr(f).expect("attr").length, MAX_FILE_LENGTH);
    assert_eq!(m.chunk_indices(f, all, 10).expect("list"), [0]);

    // More chunks than one transaction may change: several transactions,
    // each chunk once.
    let (g, _) = m.create(&c, ROOT_INO, b"many", 0o644, 0).expect("g");
    let n = 2 * CHUNKS_PER_TX + 5;
    for i in 0..n {
        write_in(m, g, i as u32 * 3);
    }
    let before = m.work();
    let length = m.getattr(g).expect("attr").length;
    m.fallocate(&c, g, 0x01 | 0x02, 0, length).expect("punch");
    let w = m.work().since(&before);
    assert_eq!(w.range_transactions, 3, "{w:?}");
    assert!(w.chunks_visited <= n as u64 * 2, "{w:?}");
    for i in 0..n {
        let slices = m.read_chunk(g, i as u32 * 3).expect("read");
        let len = if i + 1 == n { 4096 } else { CHUNK_SIZE as u32 };
        assert_eq!(
            slices.last(),
            Some(&crate::meta::chunks::hole(0, len)),
            "chunk {}",
            i * 3
        );
    }
}

/// A node's xattr names take at most `XATTR_LIST_MAX` bytes (NULs
/// included), so LISTXATTR's work is bounded: a new name past it is ENOSPC.
pub(crate) fn xattr_names_are_bounded(m: &dyn Meta) {
    formatted(m, 0);
    let c = root();
    let (f, _) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    let name = |i: usize| format!("user.{i:0>245}").into_bytes();
    let per = name(0).len() + 1;
    let fit = crate::meta::bounded::XATTR_LIST_MAX / per;
    for i in 0..fit {
        m.setxattr(&c, f, &name(i), b"v", XattrMode::Create)
            .expect("set");
    }
    assert_err(
        m.setxattr(&c, f, &name(fit), b"v", XattrMode::Any),
        |e| matches!(e, Error::NoSpace),
        "a name past the list limit",
    );
    m.setxattr(&c, f, &name(0), b"changed", XattrMode::Replace)
        .expect("a value of an existing name may change");
    m.removexattr(&c, f, &name(1)).expect("remove");
    m.setxattr(&c, f, &name(fit), b"v", XattrMode::Create)
        .expect("room again");
    let listed: usize = m
        .listxattr(f)
        .expect("list")
        .iter()
        .map(|n| n.len() + 1)
        .sum();
    assert!(listed <= crate::meta::bounded::XATTR_LIST_MAX);
}

/// Truncation and fallocate keep holes where data must read as zeros.
pub(crate) fn truncate_and_fallocate(m: &dyn Meta) {
    formatted(m, 0);
    let c = root();
    let (f, _) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    let s = write(m, f, 0, 8192);
    let a = m.truncate(&c, f, 100, TruncateVia::Path).expect("shrink");
    assert_eq!(a.length, 100);
    let hole = Slice {
        pos: 100,
        id: 0,
        size: 0,
        off: 0,
        len: 8092,
    };
    assert_eq!(m.read_chunk(f, 0).expect("read"), vec![s, hole]);
    let a = m.truncate(&c, f, 200, TruncateVia::Path).expect("grow");
    assert_eq!(a.length, 200);
    let grown = m.read_chunk(f, 0).expect("read");
    assert_eq!(
        grown.last(),
        Some(&Slice {
            pos: 100,
            id: 0,
            size: 0,
            off: 0,
            len: 100
        })
    );
    let a = m.fallocate(&c, f, 0, 0, 10_000).expect("preallocate");
    assert_eq!(a.length, 10_000);
    let a = m.fallocate(&c, f, 0x01 | 0x02, 50, 10).expect("punch");
    assert_eq!(a.length, 10_000);
    assert_eq!(
        m.read_chunk(f, 0).expect("read").last(),
        Some(&Slice {
            pos: 50,
            id: 0,
            size: 0,
            off: 0,
            len: 10
        })
    );
    assert_err(
        m.fallocate(&c, f, 0x02, 0, 10),
        |e| matches!(e, Error::Invalid(_)),
        "punch without keep size",
    );
    let (d, _) = m.mkdir(&c, ROOT_INO, b"d", 0o755, 0).expect("d");
    assert_err(
        m.truncate(&c, d, 0, TruncateVia::Path),
        |e| matches!(e, Error::Perm),
        "truncate a dir",
    );
    m.close(f).expect("close");
}

/// A file with holes shows the bytes its data covers (`Attr::space`, which
/// `st_blocks` shows), however its attributes are read; a file without
/// holes shows its length. Writes, truncates, fallocate, copies and
/// setattr keep the count true (or an upper bound of it).
pub(crate) fn sparse_files_show_what_they_store(m: &dyn Meta) {
    formatted(m, 0);
    let c = root();
    let (f, a) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    assert_eq!((a.length, a.space, a.blocks()), (0, None, 0));
    // xfstests' `_require_sparse_files`: 50 KiB at 1.6 MiB.
    write(m, f, 1_638_400, 51_200);
    let seen = |what: &str, want: Option<u64>| {
        let a = m.getattr(f).expect("getattr");
        assert_eq!(a.space, want, "{what}: getattr");
        let (_, l) = m.lookup(&c, ROOT_INO, b"f").expect("lookup");
        assert_eq!(l.space, want, "{what}: lookup");
        let listed = m.readdir(&c, ROOT_INO, true).expect("readdir plus");
        let e = listed.iter().find(|e| e.inode == f).expect("listed");
        assert_eq!(e.attr.space, want, "{what}: readdir plus");
        a
    };
    let a = seen("a sparse write", Some(51_200));
    assert_eq!((a.length, a.blocks()), (1_689_600, 100));
    let opened = m.open(&c, f, libc::O_RDONLY as u32).expect("open");
    assert_eq!(opened.space, Some(51_200), "open");
    m.close(f).expect("close");
    // Attribute changes keep the count (the record follows the node).
    let set = SetAttr {
        mode: Some(0o600),
        mtime: Some(TimeChange::At(Timestamp { secs: 1, nsecs: 2 })),
        ..SetAttr::default()
    };
    m.setattr(&c, f, &set).expect("chmod and utimes");
    seen("after setattr", Some(51_200));
    m.rename(&c, ROOT_INO, b"f", ROOT_INO, b"g", RenameFlags::default())
        .expect("rename");
    m.rename(&c, ROOT_INO, b"g", ROOT_INO, b"f", RenameFlags::default())
        .expect("rename back");
    seen("after renames", Some(51_200));
    write(m, f, 0, 4096);
    seen("a write into a hole", Some(55_296));
    // Writing every hole leaves a file without holes.
    write(m, f, 4096, 1_638_400 - 4096);
    seen("no hole left", None);
    // Growing adds a hole; shrinking cuts.
    let a = m
        .truncate(&c, f, 10 << 20, TruncateVia::Path)
        .expect("grow");
    assert_eq!(a.space, Some(1_689_600), "truncate's answer");
    seen("grown", Some(1_689_600));
    // A punched hole frees exactly what its data stored (a hole punched
    // twice frees it once).
    m.fallocate(&c, f, 0x01 | 0x02, 0, 1 << 20).expect("punch");
    seen("punched", Some(1_689_600 - (1 << 20)));
    m.fallocate(&c, f, 0x01 | 0x02, 0, 1 << 20)
        .expect("punch again");
    seen("punched again", Some(1_689_600 - (1 << 20)));
    // Preallocation counts what it allocates.
    let a = m
        .fallocate(&c, f, 0, 10 << 20, 1 << 20)
        .expect("preallocate");
    assert_eq!(a.length, 11 << 20);
    seen("preallocated", Some(1_689_600));
    // A copy adds the data it copies.
    let (g, _) = m.create(&c, ROOT_INO, b"g", 0o644, 0).expect("g");
    m.copy_file_range(&copy(f, 1_638_400, g, 1 << 20, 8192))
        .expect("copy");
    let a = m.getattr(g).expect("getattr");
    assert_eq!((a.length, a.space), ((1 << 20) + 8192, Some(8192)), "copy");
    m.close(g).expect("close");
    let a = m.truncate(&c, f, 100, TruncateVia::Path).expect("shrink");
    assert_eq!(a.space, None, "shrunk to data");
    seen("shrunk", None);
    // Compaction stores the holes between its data as zeros.
    let (k, _) = m.create(&c, ROOT_INO, b"k", 0o644, 0).expect("k");
    let s1 = write(m, k, 0, 4096);
    let s2 = write(m, k, 1 << 20, 4096);
    assert_eq!(m.getattr(k).expect("getattr").space, Some(8192));
    let merged = Slice {
        pos: 0,
        id: m.new_slice_id().expect("id"),
        size: (1 << 20) + 4096,
        off: 0,
        len: (1 << 20) + 4096,
    };
    assert!(
        m.compact_chunk(k, 0, &[s1, s2], &[merged])
            .expect("compact")
    );
    assert_eq!(m.getattr(k).expect("getattr").space, None, "compacted");
    m.close(k).expect("close");
    // A file written from its start has no holes, a directory no count.
    let (h, _) = m.create(&c, ROOT_INO, b"h", 0o644, 0).expect("h");
    write(m, h, 0, 8192);
    write(m, h, 8192, 100);
    assert_eq!(m.getattr(h).expect("getattr").space, None, "dense");
    assert_eq!(m.getattr(ROOT_INO).expect("getattr").space, None, "dir");
    m.close(h).expect("close");
    m.close(f).expect("close");
}

/// Compaction replaces a prefix of slices, or nothing if the chunk moved on.
pub(crate) fn compact_chunk(m: &dyn Meta) {
    formatted(m, 0);
    let released = track_releases(m);
    let c = root();
    let (f, _) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    let s1 = write(m, f, 0, 100);
    let s2 = write(m, f, 100, 100);
    let s3 = write(m, f, 200, 100);
    let id = m.new_slice_id().expect("id");
    let merged = Slice {
        pos: 0,
        id,
        size: 200,
        off: 0,
        len: 200,
    };
    assert!(
        m.compact_chunk(f, 0, &[s1, s2], &[merged])
            .expect("compact")
    );
    assert_eq!(m.read_chunk(f, 0).expect("read"), vec![merged, s3]);
    let mut got = released.lock().clone();
    got.sort_by_key(|r| r.id);
    assert_eq!(
        got,
        vec![
            ReleasedSlice {
                id: s1.id,
                size: 100
            },
            ReleasedSlice {
                id: s2.id,
                size: 100
            }
        ]
    );
    assert!(m.slice_referenced(merged.id, merged.size).expect("ref"));
    released.lock().clear();
    // Changed meanwhile: the stale plan is refused and its new slice released.
    let id = m.new_slice_id().expect("id");
    let stale = Slice {
        pos: 0,
        id,
        size: 300,
        off: 0,
        len: 300,
    };
    assert!(
        !m.compact_chunk(f, 0, &[s1, s2, s3], &[stale])
            .expect("stale compact")
    );
    assert_eq!(m.read_chunk(f, 0).expect("read"), vec![merged, s3]);
    assert_eq!(
        released.lock().as_slice(),
        &[ReleasedSlice {
            id: stale.id,
            size: 300
        }]
    );
    m.close(f).expect("close");
}

/// What a file shows over `start..start+len`, as runs of (length, slice id,
/// offset in the slice); id 0 reads as zeros. Neighbouring runs that
/// continue each other are merged, so two files showing the same bytes the
/// same way compare equal however their records are cut.
fn extents(m: &dyn Meta, ino: Ino, start: u64, len: u64) -> Vec<(u64, u64, u64)> {
    let mut out: Vec<(u64, u64, u64)> = Vec::new();
    let mut push = |n: u64, id: u64, off: u64| match out.last_mut() {
        Some(last) if last.1 == id && (id == 0 || last.2 + last.0 == off) => last.0 += n,
        _ => out.push((n, id, if id == 0 { 0 } else { off })),
    };
    let end = start + len;
    let mut at = start;
    while at < end {
        let indx = (at / CHUNK_SIZE) as u32;
        let base = u64::from(indx) * CHUNK_SIZE;
        let stop = end.min(base + CHUNK_SIZE);
        let slices = m.read_chunk(ino, indx).expect("read chunk");
        for p in crate::chunk::visible(&slices) {
            let (a, b) = (base + u64::from(p.pos), base + p.end());
            if b <= at || a >= stop {
                continue;
            }
            if a > at {
                push(a - at, 0, 0);
                at = a;
            }
            let n = b.min(stop) - at;
            push(n, p.id, u64::from(p.off) + (at - a));
            at += n;
        }
        if at < stop {
            push(stop - at, 0, 0);
            at = stop;
        }
    }
    out
}

fn copy(fin: Ino, off_in: u64, fout: Ino, off_out: u64, len: u64) -> CopyRange {
    CopyRange {
        fin,
        off_in,
        fout,
        off_out,
        len,
        flags: 0,
    }
}

fn used_space(m: &dyn Meta) -> u64 {
    let s = m.statfs(&root(), ROOT_INO).expect("statfs");
    s.total_space - s.avail_space
}

/// copy_file_range shares the source's slices: the destination shows the
/// same bytes (holes where the source has none, hiding what was there),
/// each slice gains a reference per record, and the slices live until
/// both files are gone — released exactly once.
pub(crate) fn copy_file_range_shares_slices(m: &dyn Meta) {
    formatted(m, 0);
    let released = track_releases(m);
    let c = root();
    let (src, _) = m.create(&c, ROOT_INO, b"src", 0o644, 0).expect("src");
    // `hidden` is overwritten before the copy: the copy never shows it.
    let hidden = write(m, src, 0, 800);
    let s1 = write(m, src, 0, 10_000);
    let s2 = write(m, src, 2000, 1000);
    let s3 = write(m, src, 20_000, 5000);
    let id = m.new_slice_id().expect("id");
    let s4 = Slice {
        pos: 0,
        id,
        size: 3000,
        off: 0,
        len: 3000,
    };
    m.write_chunk(src, 1, s4, Timestamp::now())
        .expect("chunk 1");
    let src_len = CHUNK_SIZE + 3000;
    assert_eq!(m.getattr(src).expect("src").length, src_len);
    let (dst, _) = m.create(&c, ROOT_INO, b"dst", 0o644, 0).expect("dst");
    let d1 = write(m, dst, 0, 30_000);
    let before = m.getattr(dst).expect("dst");

    // Inside the destination: the source's gap (10000..20000) must hide d1.
    let (n, a) = m
        .copy_file_range(&copy(src, 1000, dst, 5000, 20_000))
        .expect("copy into the destination");
    assert_eq!(n, 20_000);
    assert_eq!(a.length, 30_000, "a copy inside the file keeps its length");
    assert!(a.mtime >= before.mtime && a.ctime >= before.ctime);
    assert_eq!(extents(m, dst, 5000, 20_000), extents(m, src, 1000, 20_000));
    assert_eq!(
        extents(m, dst, 5000, 20_000),
        vec![
            (1000, s1.id, 1000),
            (1000, s2.id, 0),
            (7000, s1.id, 3000),
            (10_000, 0, 0),
            (1000, s3.id, 0),
        ]
    );
    assert_eq!(extents(m, dst, 0, 5000), vec![(5000, d1.id, 0)]);
    assert_eq!(extents(m, dst, 25_000, 5000), vec![(5000, d1.id, 25_000)]);

    // Past the end, across a destination chunk boundary, asking for more
    // than the source holds: bounded by the source's length.
    let used = used_space(m);
    let off_out = CHUNK_SIZE - 500;
    let (n, a) = m
        .copy_file_range(&copy(src, 1000, dst, off_out, u64::MAX))
        .expect("copy past the end");
    assert_eq!(n, src_len - 1000);
    assert_eq!(a.length, off_out + n);
    assert_eq!(m.getattr(dst).expect("dst"), a);
    assert_eq!(
        extents(m, dst, off_out, n),
        extents(m, src, 1000, n),
        "the copy shows what the source shows"
    );
    let grown = crate::meta::rules::align4k(a.length) - crate::meta::rules::align4k(30_000);
    assert_eq!(used_space(m), used + grown as u64);
    for s in [s1, s2, s3, s4, d1] {
        assert!(m.slice_referenced(s.id, s.size).expect("ref"), "{s:?}");
    }
    // The copy wrote records, never a slice: no slice id appeared.
    let ids: HashSet<u64> = m
        .list_chunks()
        .expect("list")
        .into_iter()
        .flat_map(|(_, _, slices)| slices.into_iter().map(|s| s.id))
        .filter(|id| *id != 0)
        .collect();
    assert_eq!(
        ids,
        HashSet::from([hidden.id, s1.id, s2.id, s3.id, s4.id, d1.id])
    );

    // The source goes: only the slice the copy never showed is released.
    m.close(src).expect("close src");
    m.unlink(&c, ROOT_INO, b"src").expect("unlink src");
    assert_eq!(
        released.lock().as_slice(),
        &[ReleasedSlice {
            id: hidden.id,
            size: hidden.size
        }]
    );
    assert_eq!(
        extents(m, dst, 5000, 20_000),
        vec![
            (1000, s1.id, 1000),
            (1000, s2.id, 0),
            (7000, s1.id, 3000),
            (10_000, 0, 0),
            (1000, s3.id, 0),
        ],
        "the destination still shows the shared slices"
    );
    // Then the destination: every other slice, once each.
    m.close(dst).expect("close dst");
    m.unlink(&c, ROOT_INO, b"dst").expect("unlink dst");
    let mut got = released.lock().clone();
    got.sort_by_key(|r| r.id);
    let mut want: Vec<ReleasedSlice> = [hidden, s1, s2, s3, s4, d1]
        .iter()
        .map(|s| ReleasedSlice {
            id: s.id,
            size: s.size,
        })
        .collect();
    want.sort_by_key(|r| r.id);
    assert_eq!(got, want);
    for s in [s1, s2, s3, s4, d1] {
        assert!(!m.slice_referenced(s.id, s.size).expect("ref"), "{s:?}");
    }
    assert!(m.list_chunks().expect("list").is_empty());
}

/// copy_file_range refuses what the kernel refuses, copies nothing from the
/// source's end on, copies within one file when the ranges do not overlap,
/// and copies at most `MAX_COPY_LEN` per call.
pub(crate) fn copy_file_range_rules(m: &dyn Meta) {
    formatted(m, 0);
    let c = root();
    let (src, _) = m.create(&c, ROOT_INO, b"src", 0o644, 0).expect("src");
    let s = write(m, src, 0, 5000);
    let (dst, _) = m.create(&c, ROOT_INO, b"dst", 0o644, 0).expect("dst");
    let (d, _) = m.mkdir(&c, ROOT_INO, b"d", 0o755, 0).expect("d");
    let (l, _) = m.symlink(&c, ROOT_INO, b"l", b"src").expect("l");
    assert_err(
        m.copy_file_range(&CopyRange {
            flags: 1,
            ..copy(src, 0, dst, 0, 10)
        }),
        |e| matches!(e, Error::Invalid(_)),
        "flags",
    );
    assert_err(
        m.copy_file_range(&copy(src, 0, src, 100, 1000)),
        |e| matches!(e, Error::Invalid(_)),
        "overlapping ranges in one file",
    );
    assert_err(
        m.copy_file_range(&copy(d, 0, dst, 0, 10)),
        |e| matches!(e, Error::IsDir),
        "from a directory",
    );
    assert_err(
        m.copy_file_range(&copy(src, 0, d, 0, 10)),
        |e| matches!(e, Error::IsDir),
        "into a directory",
    );
    assert_err(
        m.copy_file_range(&copy(src, 0, l, 0, 10)),
        |e| matches!(e, Error::Invalid(_)),
        "into a symlink",
    );
    assert_err(
        m.copy_file_range(&copy(9_999_999, 0, dst, 0, 10)),
        |e| matches!(e, Error::NotFound),
        "from nowhere",
    );
    let before = m.getattr(dst).expect("dst");
    let (n, a) = m
        .copy_file_range(&copy(src, 5000, dst, 100, 10))
        .expect("from the source's end");
    assert_eq!(
        (n, a),
        (0, before.clone()),
        "nothing copied, nothing changed"
    );
    assert!(m.read_chunk(dst, 0).expect("read").is_empty());

    // Within one file, the ranges apart.
    let (n, a) = m
        .copy_file_range(&copy(src, 1000, src, 6000, 2000))
        .expect("within one file");
    assert_eq!((n, a.length), (2000, 8000));
    assert_eq!(extents(m, src, 6000, 2000), vec![(2000, s.id, 1000)]);

    // A huge sparse source: one call copies MAX_COPY_LEN, as holes.
    let (big, _) = m.create(&c, ROOT_INO, b"big", 0o644, 0).expect("big");
    m.truncate(&c, big, 2 * MAX_COPY_LEN + 5, TruncateVia::Path)
        .expect("grow big");
    let (n, a) = m
        .copy_file_range(&copy(big, 7, dst, 0, u64::MAX))
        .expect("bounded copy");
    assert_eq!((n, a.length), (MAX_COPY_LEN, MAX_COPY_LEN));
    assert_eq!(extents(m, dst, 0, MAX_COPY_LEN), vec![(MAX_COPY_LEN, 0, 0)]);
    for f in [src, dst, big] {
        m.close(f).expect("close");
    }
}

/// ftruncate through a handle open for writing needs no write permission
/// by mode (a file created 0444 with O_RDWR, as on ext4) and works on a file
/// moved to the trash while open; truncate(2) by path still checks both.
pub(crate) fn truncate_through_a_handle(m: &dyn Meta) {
    formatted(m, 1);
    let alice = user(1000);
    let (tmp, _) = m.mkdir(&root(), ROOT_INO, b"tmp", 0o1777, 0).expect("tmp");
    let (f, _) = m.create(&alice, tmp, b"ro", 0o444, 0).expect("create 0444");
    assert_err(
        m.truncate(&alice, f, 10, TruncateVia::Path),
        |e| matches!(e, Error::Access),
        "truncate(2) of a 0444 file",
    );
    let a = m
        .truncate(&alice, f, 10, TruncateVia::Handle)
        .expect("ftruncate through the handle");
    assert_eq!(a.length, 10);
    assert_err(
        m.truncate(&user(2000), f, 0, TruncateVia::Path),
        |e| matches!(e, Error::Access),
        "truncate(2) by another user",
    );
    m.unlink(&alice, tmp, b"ro").expect("unlink into the trash");
    assert!(m.getattr(f).expect("in the trash").parent > TRASH_INO);
    assert_err(
        m.truncate(&root(), f, 0, TruncateVia::Path),
        |e| matches!(e, Error::Perm),
        "truncate(2) in the trash",
    );
    let a = m
        .truncate(&alice, f, 3, TruncateVia::Handle)
        .expect("ftruncate of a file moved to the trash while open");
    assert_eq!(a.length, 3);
    m.close(f).expect("close");
}

/// A file unlinked while open lives until its last close.
pub(crate) fn open_unlink_close(m: &dyn Meta) {
    formatted(m, 0);
    m.new_session("{}").expect("session");
    let released = track_releases(m);
    let c = root();
    let (f, _) = m
        .create(&c, ROOT_INO, b"f", 0o644, 0)
        .expect("create opens");
    let s = write(m, f, 0, 4096);
    m.open(&c, f, libc::O_RDONLY as u32).expect("second open");
    let before = m.statfs(&c, ROOT_INO).expect("statfs");
    m.unlink(&c, ROOT_INO, b"f").expect("unlink open file");
    assert_err(
        m.lookup(&c, ROOT_INO, b"f"),
        |e| matches!(e, Error::NotFound),
        "name gone",
    );
    let a = m.getattr(f).expect("node kept");
    assert_eq!((a.nlink, a.length), (0, 4096));
    assert_eq!(m.read_chunk(f, 0).expect("data kept"), vec![s]);
    assert_eq!(
        m.statfs(&c, ROOT_INO).expect("statfs").used_inodes,
        before.used_inodes
    );
    m.close(f).expect("close one");
    assert!(released.lock().is_empty(), "still open once");
    m.getattr(f).expect("still kept");
    m.close(f).expect("last close");
    assert_err(
        m.getattr(f),
        |e| matches!(e, Error::NotFound),
        "deleted at last close",
    );
    assert_eq!(
        released.lock().as_slice(),
        &[ReleasedSlice {
            id: s.id,
            size: 4096
        }]
    );
    assert_eq!(
        m.statfs(&c, ROOT_INO).expect("statfs").used_inodes,
        before.used_inodes - 1
    );
    assert_err(
        m.close(f),
        |e| matches!(e, Error::BadHandle),
        "close unopened",
    );
    // Unlinked while open, then the session ends: deleted too.
    let (g, _) = m.create(&c, ROOT_INO, b"g", 0o644, 0).expect("create");
    m.unlink(&c, ROOT_INO, b"g").expect("unlink");
    m.close_session().expect("close session");
    assert_err(
        m.getattr(g),
        |e| matches!(e, Error::NotFound),
        "deleted with the session",
    );
}

/// With TrashDays > 0 removed entries move into hourly trash directories.
pub(crate) fn trash_keeps_removed_files(m: &dyn Meta) {
    formatted(m, 1);
    let released = track_releases(m);
    let c = root();
    let (d, _) = m.mkdir(&c, ROOT_INO, b"d", 0o755, 0).expect("d");
    let (f, _) = m.create(&c, d, b"f", 0o644, 0).expect("f");
    write(m, f, 0, 100);
    m.close(f).expect("close");
    let used = m.statfs(&c, ROOT_INO).expect("statfs").used_inodes;
    m.unlink(&c, d, b"f").expect("unlink to trash");
    assert_err(
        m.lookup(&c, d, b"f"),
        |e| matches!(e, Error::NotFound),
        "gone from d",
    );
    let hours = m.readdir(&c, TRASH_INO, false).expect("trash");
    assert_eq!(hours.len(), 3, "one hourly directory");
    let hour = &hours[2];
    assert!(hour.inode > TRASH_INO);
    assert_eq!(hour.name.len(), "2006-01-02-15".len());
    let kept = names(m, hour.inode);
    assert!(
        kept.contains(&format!("{d}-{f}-f").into_bytes()),
        "{kept:?}"
    );
    let a = m.getattr(f).expect("kept");
    assert_eq!((a.parent, a.nlink, a.length), (hour.inode, 1, 100));
    assert!(released.lock().is_empty());
    assert_eq!(
        m.statfs(&c, ROOT_INO).expect("statfs").used_inodes,
        used + 1,
        "only the hour dir is new"
    );
    // Nothing changes in the trash but by root, and nothing new goes in.
    assert_err(
        m.unlink(&user(1000), hour.inode, &kept[2]),
        |e| matches!(e, Error::Perm),
        "user unlinks in trash",
    );
    assert_err(
        m.create(&c, hour.inode, b"new", 0o644, 0),
        |e| matches!(e, Error::Perm),
        "create in trash",
    );
    assert_err(
        m.truncate(&c, f, 0, TruncateVia::Path),
        |e| matches!(e, Error::Perm),
        "truncate in trash",
    );
    m.rmdir(&c, ROOT_INO, b"d").expect("rmdir to trash");
    assert_eq!(m.getattr(d).expect("dir kept").parent, hour.inode);
    m.cleanup().expect("cleanup keeps unexpired trash");
    m.getattr(f).expect("still in trash");
    // Root may delete from the trash for good.
    let name = format!("{d}-{f}-f").into_bytes();
    m.unlink(&c, hour.inode, &name).expect("purge");
    assert_err(m.getattr(f), |e| matches!(e, Error::NotFound), "purged");
    assert_eq!(released.lock().len(), 1);
}

/// With TrashDays = 0 removal is immediate.
pub(crate) fn no_trash_releases_at_once(m: &dyn Meta) {
    formatted(m, 0);
    let released = track_releases(m);
    let c = root();
    let (f, _) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    let s = write(m, f, 0, 100);
    m.close(f).expect("close");
    m.unlink(&c, ROOT_INO, b"f").expect("unlink");
    assert_eq!(
        released.lock().as_slice(),
        &[ReleasedSlice {
            id: s.id,
            size: 100
        }]
    );
    assert_err(
        m.lookup(&c, ROOT_INO, b".trash"),
        |e| matches!(e, Error::NotFound),
        "no trash",
    );
    assert_err(m.getattr(f), |e| matches!(e, Error::NotFound), "gone");
}

/// statfs follows usage as JuiceFS counts it (4 KiB granules per node).
pub(crate) fn statfs_counts_usage(m: &dyn Meta) {
    formatted(m, 0);
    let c = root();
    let used = |m: &dyn Meta| {
        let s = m.statfs(&c, ROOT_INO).expect("statfs");
        (s.total_space - s.avail_space, s.used_inodes)
    };
    assert_eq!(used(m), (0, 0));
    let (f, _) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    assert_eq!(used(m), (4096, 1));
    write(m, f, 0, 5000);
    assert_eq!(used(m), (8192, 1));
    m.mkdir(&c, ROOT_INO, b"d", 0o755, 0).expect("d");
    m.symlink(&c, ROOT_INO, b"s", b"target").expect("s");
    assert_eq!(used(m), (16384, 3));
    m.close(f).expect("close");
    m.unlink(&c, ROOT_INO, b"f").expect("unlink");
    m.unlink(&c, ROOT_INO, b"s").expect("unlink");
    m.rmdir(&c, ROOT_INO, b"d").expect("rmdir");
    assert_eq!(used(m), (0, 0));
    let s = m.statfs(&c, ROOT_INO).expect("statfs");
    assert_eq!(s.total_space, 1 << 50);
    assert_eq!(s.avail_inodes, 10 << 20);
}

/// Many threads creating at once get distinct inodes and all their entries.
pub(crate) fn concurrent_creates(m: &dyn Meta) {
    formatted(m, 0);
    let threads = 8;
    let per = 40;
    let inodes = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for t in 0..threads {
            let inodes = &inodes;
            s.spawn(move || {
                let c = root();
                for i in 0..per {
                    let name = format!("t{t}-{i}");
                    let (ino, _) = if i % 5 == 0 {
                        m.mkdir(&c, ROOT_INO, name.as_bytes(), 0o755, 0)
                            .expect("mkdir")
                    } else {
                        let r = m
                            .create(&c, ROOT_INO, name.as_bytes(), 0o644, 0)
                            .expect("create");
                        m.close(r.0).expect("close");
                        r
                    };
                    inodes.lock().push(ino);
                    m.getattr(ino).expect("visible at once");
                }
            });
        }
    });
    let inodes = inodes.into_inner();
    let unique: HashSet<Ino> = inodes.iter().copied().collect();
    assert_eq!(unique.len(), threads * per);
    assert_eq!(names(m, ROOT_INO).len(), threads * per + 2);
    let dirs = (threads * per / 5) as u32;
    assert_eq!(m.getattr(ROOT_INO).expect("root").nlink, 2 + dirs);
    let s = m.statfs(&root(), ROOT_INO).expect("statfs");
    assert_eq!(s.used_inodes, (threads * per) as u64);
}

/// Sessions register and end.
pub(crate) fn sessions(m: &dyn Meta) {
    formatted(m, 0);
    let sid = m
        .new_session("{\"MountPoint\":\"/mnt/x\"}")
        .expect("session");
    assert!(sid > 0);
    assert_err(
        m.new_session("{}"),
        |e| matches!(e, Error::Invalid(_)),
        "second session",
    );
    m.cleanup().expect("cleanup leaves a live session");
    m.close_session().expect("close");
    m.close_session().expect("closing twice is harmless");
}

/// Formats with a volume capacity and inode limit (JuiceFS `Capacity`,
/// `Inodes`): growth past either fails with `NoSpace` (ENOSPC), shrinking
/// never does, and statfs reports the limits as totals.
pub(crate) fn volume_limits_give_enospc(m: &dyn Meta) {
    let mut f = test_format(0);
    f.capacity = 10 * 4096;
    f.inodes = 4;
    m.init(&f).expect("format");
    m.load().expect("load");
    let c = root();
    let (a, _) = m.create(&c, ROOT_INO, b"a", 0o644, 0).expect("a");
    // 4 KiB for the node, then grow to 9 granules in all: fits exactly.
    write(m, a, 0, 9 * 4096);
    let s = m.statfs(&c, ROOT_INO).expect("statfs");
    assert_eq!((s.total_space, s.avail_space), (10 * 4096, 4096));
    assert_eq!((s.used_inodes, s.avail_inodes), (1, 3));
    let id = m.new_slice_id().expect("id");
    let past = Slice {
        pos: 9 * 4096,
        id,
        size: 4097,
        off: 0,
        len: 4097,
    };
    assert_err(
        m.write_chunk(a, 0, past, Timestamp::now()),
        |e| matches!(e, Error::NoSpace),
        "a write past the capacity",
    );
    assert_err(
        m.fallocate(&c, a, 0, 0, 11 * 4096),
        |e| matches!(e, Error::NoSpace),
        "a preallocation past the capacity",
    );
    assert_err(
        m.truncate(&c, a, 20 * 4096, TruncateVia::Path),
        |e| matches!(e, Error::NoSpace),
        "a truncate past the capacity",
    );
    assert_eq!(m.getattr(a).expect("a").length, 9 * 4096, "nothing changed");
    // The last 4 KiB go to a new node; then the space is full.
    let (d, _) = m.mkdir(&c, ROOT_INO, b"d", 0o755, 0).expect("d");
    assert_err(
        m.symlink(&c, d, b"s", b"t"),
        |e| matches!(e, Error::NoSpace),
        "a node past the capacity",
    );
    // Shrinking frees space: the inode limit is next.
    m.truncate(&c, a, 4096, TruncateVia::Path).expect("shrink");
    m.symlink(&c, d, b"s", b"t").expect("s");
    m.mknod(&c, d, b"p", FileType::Fifo, 0o644, 0, 0)
        .expect("p");
    assert_err(
        m.create(&c, d, b"x", 0o644, 0),
        |e| matches!(e, Error::NoSpace),
        "a node past the inode limit",
    );
    assert_eq!(Error::NoSpace.errno(), libc::ENOSPC);
    // A change of the limits (juicefs config) applies after a reload.
    f.inodes = 0;
    m.init(&f).expect("raise the limit");
    m.reload_quotas().expect("reload");
    m.create(&c, d, b"x", 0o644, 0).expect("x");
}

fn set_quota(m: &dyn Meta, dir: Ino, space: i64, inodes: i64) {
    assert!(
        m.set_dir_quota(
            dir,
            &crate::meta::QuotaChange {
                max_space: Some(space),
                max_inodes: Some(inodes),
                usage: None,
            },
        )
        .expect("set quota"),
        "a new quota"
    );
    let usage = crate::meta::quota::tree_usage(m, dir).expect("usage");
    m.set_dir_quota(
        dir,
        &crate::meta::QuotaChange {
            usage: Some(usage),
            ..Default::default()
        },
    )
    .expect("set usage");
    m.reload_quotas().expect("reload");
}

/// The stored usage of `dir`'s quota equals what a walk of the tree finds
/// (what `juicefs quota check` compares).
fn quota_agrees(m: &dyn Meta, dir: Ino) -> (i64, i64) {
    let q = m.get_dir_quota(dir).expect("get").expect("a quota");
    let tree = crate::meta::quota::tree_usage(m, dir).expect("walk");
    assert_eq!((q.used_space, q.used_inodes), tree, "stored usage of {dir}");
    tree
}

/// Directory quotas (JuiceFS `jfs_dir_quota` / `dirQuota`): nested limits
/// give `QuotaExceeded` (EDQUOT) for new nodes and for growth of files
/// (write, truncate, fallocate, copy_file_range, link), usage follows
/// every change in the same transaction, and a quota's usage always equals
/// the tree's.
pub(crate) fn dir_quotas_give_edquot(m: &dyn Meta) {
    formatted(m, 0);
    let c = root();
    let (top, _) = m.mkdir(&c, ROOT_INO, b"top", 0o755, 0).expect("top");
    let (sub, _) = m.mkdir(&c, top, b"sub", 0o755, 0).expect("sub");
    let (deep, _) = m.mkdir(&c, sub, b"deep", 0o755, 0).expect("deep");
    let (f, _) = m.create(&c, deep, b"f", 0o644, 0).expect("f");
    write(m, f, 0, 4096);
    // top: 6 inodes; sub: 8 granules of space.
    set_quota(m, top, 0, 6);
    set_quota(m, sub, 8 * 4096, 0);
    assert_eq!(quota_agrees(m, top), (3 * 4096, 3));
    assert_eq!(quota_agrees(m, sub), (2 * 4096, 2));
    assert!(m.get_dir_quota(deep).expect("get").is_none());

    // Space below sub: 6 granules left. The file grows by 5.
    write(m, f, 4096, 5 * 4096);
    assert_eq!(quota_agrees(m, sub), (7 * 4096, 2));
    let id = m.new_slice_id().expect("id");
    let past = Slice {
        pos: 6 * 4096,
        id,
        size: 8192,
        off: 0,
        len: 8192,
    };
    assert_err(
        m.write_chunk(f, 0, past, Timestamp::now()),
        |e| matches!(e, Error::QuotaExceeded),
        "a write past the nested space quota",
    );
    assert_err(
        m.truncate(&c, f, 8 * 4096, TruncateVia::Path),
        |e| matches!(e, Error::QuotaExceeded),
        "a truncate past the space quota",
    );
    assert_err(
        m.fallocate(&c, f, 0, 0, 8 * 4096),
        |e| matches!(e, Error::QuotaExceeded),
        "a fallocate past the space quota",
    );
    let (g, _) = m
        .create(&c, deep, b"g", 0o644, 0)
        .expect("g: the last granule");
    assert_err(
        m.copy_file_range(&CopyRange {
            fin: f,
            off_in: 0,
            fout: g,
            off_out: 0,
            len: 8192,
            flags: 0,
        }),
        |e| matches!(e, Error::QuotaExceeded),
        "a copy past the space quota",
    );
    assert_eq!(quota_agrees(m, sub), (8 * 4096, 3));
    // Inodes below top: 4 used of 6. A hard link counts one more.
    m.link(&c, g, top, b"g2").expect("link");
    assert_eq!(quota_agrees(m, top), (10 * 4096, 5));
    m.mknod(&c, top, b"p", FileType::Fifo, 0o644, 0, 0)
        .expect("p");
    assert_err(
        m.mkdir(&c, top, b"more", 0o755, 0),
        |e| matches!(e, Error::QuotaExceeded),
        "a node past the inode quota",
    );
    assert_err(
        m.link(&c, g, ROOT_INO, b"outside")
            .map(|_| ())
            .and_then(|()| m.link(&c, g, top, b"g3").map(|_| ())),
        |e| matches!(e, Error::QuotaExceeded),
        "a link past the inode quota",
    );
    assert_eq!(Error::QuotaExceeded.errno(), libc::EDQUOT);
    // Outside the quotas nothing is limited.
    m.mkdir(&c, ROOT_INO, b"free", 0o755, 0).expect("free");

    // Removing frees: unlink, rmdir, truncate.
    m.unlink(&c, top, b"p").expect("unlink p");
    m.unlink(&c, top, b"g2").expect("unlink g2");
    m.truncate(&c, f, 4096, TruncateVia::Path)
        .expect("shrink f");
    assert_eq!(quota_agrees(m, sub), (3 * 4096, 3));
    assert_eq!(quota_agrees(m, top), (4 * 4096, 4));
    m.mkdir(&c, top, b"more", 0o755, 0).expect("room again");
    m.rmdir(&c, top, b"more").expect("rmdir");
    assert_eq!(quota_agrees(m, top), (4 * 4096, 4));

    // A quota set by raising it applies after a reload (another client).
    m.set_dir_quota(
        top,
        &crate::meta::QuotaChange {
            max_inodes: Some(0),
            ..Default::default()
        },
    )
    .expect("lift");
    m.reload_quotas().expect("reload");
    for i in 0..4 {
        m.mkdir(&c, top, format!("n{i}").as_bytes(), 0o755, 0)
            .expect("no inode limit now");
    }
    assert_eq!(quota_agrees(m, top), (8 * 4096, 8));
    m.delete_dir_quota(top).expect("delete");
    assert!(m.get_dir_quota(top).expect("get").is_none());
    assert_eq!(m.dir_quotas().expect("list").len(), 1, "sub's stays");
}

/// Renames across quota directories move the whole usage (a directory with
/// everything below it), JuiceFS's rule, and must fit the destination;
/// within one quota nothing is checked or moved.
pub(crate) fn renames_move_quota_usage(m: &dyn Meta) {
    formatted(m, 0);
    let c = root();
    let (qa, _) = m.mkdir(&c, ROOT_INO, b"qa", 0o755, 0).expect("qa");
    let (qb, _) = m.mkdir(&c, ROOT_INO, b"qb", 0o755, 0).expect("qb");
    let (tree, _) = m.mkdir(&c, qa, b"tree", 0o755, 0).expect("tree");
    let (inner, _) = m.mkdir(&c, tree, b"inner", 0o755, 0).expect("inner");
    let (f, _) = m.create(&c, inner, b"f", 0o644, 0).expect("f");
    write(m, f, 0, 3 * 4096);
    m.create(&c, qa, b"loose", 0o644, 0).expect("loose");
    set_quota(m, qa, 0, 100);
    set_quota(m, qb, 0, 2);
    assert_eq!(quota_agrees(m, qa), (6 * 4096, 4));
    // tree is 3 nodes with itself: it does not fit qb's 2 inodes.
    assert_err(
        m.rename(&c, qa, b"tree", qb, b"tree", RenameFlags::default()),
        |e| matches!(e, Error::QuotaExceeded),
        "a tree that does not fit",
    );
    // Within qa, even when full, a rename moves nothing.
    m.set_dir_quota(
        qa,
        &crate::meta::QuotaChange {
            max_inodes: Some(4),
            ..Default::default()
        },
    )
    .expect("tighten");
    m.reload_quotas().expect("reload");
    m.rename(&c, qa, b"tree", inner, b"tree2", RenameFlags::default())
        .map(|_| ())
        .expect_err("into itself");
    m.rename(&c, qa, b"loose", inner, b"loose", RenameFlags::default())
        .expect("within one quota");
    assert_eq!(quota_agrees(m, qa), (6 * 4096, 4));
    // Raise qb: the tree moves with everything below it.
    m.set_dir_quota(
        qb,
        &crate::meta::QuotaChange {
            max_inodes: Some(10),
            ..Default::default()
        },
    )
    .expect("raise");
    m.reload_quotas().expect("reload");
    m.rename(&c, qa, b"tree", qb, b"moved", RenameFlags::default())
        .expect("across");
    assert_eq!(quota_agrees(m, qa), (0, 0));
    assert_eq!(quota_agrees(m, qb), (6 * 4096, 4));
    // New nodes below the moved tree count for qb now (the parent cache
    // followed the rename).
    m.create(&c, inner, b"new", 0o644, 0).expect("new");
    assert_eq!(quota_agrees(m, qb), (7 * 4096, 5));
    assert_eq!(quota_agrees(m, qa), (0, 0));
    // A file moves with its space.
    m.rename(&c, inner, b"f", qa, b"f", RenameFlags::default())
        .expect("file across");
    assert_eq!(quota_agrees(m, qa), (3 * 4096, 1));
    assert_eq!(quota_agrees(m, qb), (4 * 4096, 4));
}
