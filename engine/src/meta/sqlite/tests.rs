//! The conformance suite on SQLite, plus checks of the rows themselves
//! against what JuiceFS 1.4 writes.

use rusqlite::Connection;

use super::SqliteMeta;
use crate::error::Error;
use crate::meta::conformance::{self, test_format};
use crate::meta::{Context, Meta, ROOT_INO, RenameFlags, Slice, Store, TRASH_INO, Timestamp};

fn fresh() -> (tempfile::TempDir, SqliteMeta) {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = SqliteMeta::open(dir.path().join("meta.db")).expect("open");
    (dir, m)
}

macro_rules! conformance_tests {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                let (_dir, m) = fresh();
                conformance::$name(&m);
            }
        )*
        #[test]
        fn every_conformance_check_runs_here() {
            let here = [$(stringify!($name)),*];
            for (name, _) in conformance::ALL {
                assert!(here.contains(name), "conformance check {name} is not run on SQLite");
            }
        }
    };
}

conformance_tests!(
    format_and_load,
    refuse_different_volume,
    refuse_encrypted,
    posix_acls,
    create_lookup_getattr,
    names_are_checked,
    mkdir_rmdir_nlink,
    readdir_lists_entries,
    readdir_pages,
    rename_moves_and_replaces,
    rename_flags,
    rename_directories,
    hard_links,
    symlinks,
    mknod_special_files,
    xattrs,
    set_atime_alone,
    setattr_rules,
    chown_chgrp_rules,
    data_changes_drop_setid,
    permissions,
    exec_open_needs_execute,
    write_read_and_refs,
    truncate_and_fallocate,
    sparse_files_show_what_they_store,
    range_work_visits_existing_chunks,
    xattr_names_are_bounded,
    compact_chunk,
    copy_file_range_shares_slices,
    copy_file_range_rules,
    truncate_through_a_handle,
    open_unlink_close,
    trash_keeps_removed_files,
    trash_links_are_counted,
    no_trash_releases_at_once,
    statfs_counts_usage,
    volume_limits_give_enospc,
    dir_quotas_give_edquot,
    renames_move_quota_usage,
    concurrent_creates,
    sessions,
);

fn sql(m: &SqliteMeta) -> Connection {
    Connection::open(m.path()).expect("open database")
}

fn query(c: &Connection, q: &str) -> Vec<Vec<String>> {
    let mut stmt = c.prepare(q).expect("prepare");
    let n = stmt.column_count();
    stmt.query_map([], |r| {
        (0..n)
            .map(|i| {
                Ok(match r.get_ref(i)? {
                    rusqlite::types::ValueRef::Null => "NULL".to_string(),
                    rusqlite::types::ValueRef::Integer(v) => v.to_string(),
                    rusqlite::types::ValueRef::Real(v) => v.to_string(),
                    rusqlite::types::ValueRef::Text(t) | rusqlite::types::ValueRef::Blob(t) => {
                        String::from_utf8_lossy(t).into_owned()
                    }
                })
            })
            .collect()
    })
    .expect("query")
    .collect::<rusqlite::Result<_>>()
    .expect("rows")
}

fn counter(c: &Connection, name: &str) -> i64 {
    c.query_row("SELECT value FROM jfs_counter WHERE name=?", [name], |r| {
        r.get(0)
    })
    .expect("counter")
}

#[test]
fn format_writes_juicefs_rows() {
    let (_dir, m) = fresh();
    m.init(&test_format(1)).expect("init");
    let c = sql(&m);
    let mode: String = c
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .expect("journal mode");
    assert_eq!(mode, "wal");
    for (name, value) in [
        ("nextInode", 2),
        ("nextChunk", 1),
        ("nextSession", 0),
        ("usedSpace", 0),
        ("totalInodes", 0),
        ("nextCleanupSlices", 0),
    ] {
        assert_eq!(counter(&c, name), value, "{name}");
    }
    let nodes = query(
        &c,
        "SELECT inode, type, flags, mode, uid, gid, nlink, length, rdev, parent, \
         access_acl_id, default_acl_id, tier_id FROM jfs_node ORDER BY inode",
    );
    let want_root = [
        "1", "2", "0", "511", "0", "0", "2", "4096", "0", "1", "0", "0", "0",
    ];
    let want_trash = [
        "9223372032828243968",
        "2",
        "0",
        "365",
        "0",
        "0",
        "2",
        "4096",
        "0",
        "1",
        "0",
        "0",
        "0",
    ];
    assert_eq!(
        nodes,
        vec![
            want_root.map(String::from).to_vec(),
            want_trash.map(String::from).to_vec()
        ]
    );
    let json: String = c
        .query_row(
            "SELECT value FROM jfs_setting WHERE name='format'",
            [],
            |r| r.get(0),
        )
        .expect("format row");
    assert!(
        json.starts_with("{\n\"Name\": \"conformance\",\n"),
        "{json}"
    );
    let tables = query(
        &c,
        "SELECT name FROM sqlite_master WHERE type='table' ORDER BY name",
    );
    // JuiceFS's 21 tables, SQLite's own, and sluice's space records.
    assert_eq!(tables.len(), 23, "{tables:?}");
    assert!(
        tables.contains(&vec!["sluice_space".to_string()]),
        "{tables:?}"
    );
}

/// A file whose data another client changed without keeping a space
/// record (JuiceFS: its mtime moved) shows its length; a record is kept
/// only for a file with holes, and goes with its node.
#[test]
fn a_space_record_holds_only_for_the_node_it_was_counted_for() {
    let (_dir, m) = fresh();
    conformance::format_and_load(&m);
    let c = Context::internal();
    let (f, _) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    let id = m.new_slice_id().expect("id");
    let s = Slice {
        pos: 1 << 20,
        id,
        size: 4096,
        off: 0,
        len: 4096,
    };
    m.write_chunk(f, 0, s, Timestamp::now()).expect("write");
    assert_eq!(m.getattr(f).expect("getattr").space, Some(4096));
    let db = sql(&m);
    let rows = query(&db, "SELECT inode, space FROM sluice_space");
    assert_eq!(rows, vec![vec![f.to_string(), "4096".to_string()]]);
    // Another client writes the file and keeps no record.
    db.execute(
        "UPDATE jfs_node SET mtime=mtime+1 WHERE inode=?",
        [f as i64],
    )
    .expect("update");
    assert_eq!(m.getattr(f).expect("getattr").space, None);
    m.close(f).expect("close");
    m.unlink(&c, ROOT_INO, b"f").expect("unlink");
    m.cleanup().expect("cleanup");
    // The stale record went with the node's next write (or the node).
    let left = query(&db, "SELECT count(*) FROM sluice_space");
    assert_eq!(left, vec![vec!["0".to_string()]]);
    // A client that keeps no records removes a file with holes: fsck
    // finds its record and removes it with --repair.
    let (g, _) = m.create(&c, ROOT_INO, b"g", 0o644, 0).expect("g");
    let s = Slice {
        id: m.new_slice_id().expect("id"),
        ..s
    };
    m.write_chunk(g, 0, s, Timestamp::now()).expect("write");
    m.close(g).expect("close");
    db.execute("DELETE FROM jfs_node WHERE inode=?", [g as i64])
        .expect("delete");
    assert_eq!(m.orphan_space_records(false).expect("count"), 1);
    assert_eq!(m.orphan_space_records(true).expect("remove"), 1);
    assert_eq!(m.orphan_space_records(false).expect("count"), 0);
}

/// copy_file_range counts its records in `jfs_chunk_ref` as JuiceFS does
/// (one reference per record) and appends 24-byte records to the
/// destination's `jfs_chunk` row.
#[test]
fn copy_file_range_counts_references_in_jfs_chunk_ref() {
    let (_dir, m) = fresh();
    m.init(&test_format(0)).expect("init");
    let c = Context::default();
    let (src, _) = m.create(&c, ROOT_INO, b"src", 0o644, 0).expect("src");
    let (dst, _) = m.create(&c, ROOT_INO, b"dst", 0o644, 0).expect("dst");
    let s = Slice {
        pos: 0,
        id: m.new_slice_id().expect("id"),
        size: 10,
        off: 0,
        len: 10,
    };
    m.write_chunk(src, 0, s, Timestamp::now()).expect("write");
    let req = crate::meta::CopyRange {
        fin: src,
        off_in: 0,
        fout: dst,
        off_out: 0,
        len: 10,
        flags: 0,
    };
    assert_eq!(m.copy_file_range(&req).expect("copy").0, 10);
    let req = crate::meta::CopyRange {
        off_in: 2,
        off_out: 100,
        len: 3,
        ..req
    };
    assert_eq!(m.copy_file_range(&req).expect("copy").0, 3);
    let db = sql(&m);
    assert_eq!(
        query(&db, "SELECT chunkid, size, refs FROM jfs_chunk_ref"),
        vec![vec![s.id.to_string(), "10".into(), "3".into()]]
    );
    let blob: Vec<u8> = db
        .query_row(
            &format!("SELECT slices FROM jfs_chunk WHERE inode={dst} AND indx=0"),
            [],
            |r| r.get(0),
        )
        .expect("the destination's chunk");
    assert_eq!(
        Slice::decode_all(&blob).expect("records"),
        vec![
            s,
            Slice {
                pos: 100,
                off: 2,
                len: 3,
                ..s
            }
        ]
    );
    assert_eq!(counter(&db, "usedSpace"), 2 * 4096);
    let length: i64 = db
        .query_row(
            &format!("SELECT length FROM jfs_node WHERE inode={dst}"),
            [],
            |r| r.get(0),
        )
        .expect("length");
    assert_eq!(length, 103);
    for f in [src, dst] {
        m.close(f).expect("close");
    }
}

#[test]
fn times_are_microseconds_plus_nanoseconds() {
    let (_dir, m) = fresh();
    m.init(&test_format(0)).expect("init");
    let c = Context::default();
    let (f, _) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("create");
    let t = Timestamp {
        secs: 1_796_224_914,
        nsecs: 279_815_197,
    };
    m.write_chunk(
        f,
        0,
        Slice {
            pos: 0,
            id: m.new_slice_id().expect("id"),
            size: 6,
            off: 0,
            len: 6,
        },
        t,
    )
    .expect("write");
    let row = query(
        &sql(&m),
        &format!("SELECT mtime, mtimensec, length FROM jfs_node WHERE inode={f}"),
    );
    assert_eq!(
        row,
        vec![vec![
            "1796224914279815".to_string(),
            "197".into(),
            "6".into()
        ]]
    );
    assert_eq!(m.getattr(f).expect("attr").mtime, t);
}

#[test]
fn usage_and_dir_stats_match_juicefs() {
    // The same steps as a JuiceFS 1.4.2 mount: mkdir d1, write d1/f1 (6 B),
    // write f2 (5000 B), symlink sl, hard link hl -> d1/f1. JuiceFS left
    // usedSpace 20480, totalInodes 4 and these dir stats.
    let (_dir, m) = fresh();
    m.init(&test_format(1)).expect("init");
    m.load().expect("load");
    let c = Context::default();
    let (d1, _) = m.mkdir(&c, ROOT_INO, b"d1", 0o755, 0).expect("mkdir");
    let (f1, _) = m.create(&c, d1, b"f1", 0o644, 0).expect("f1");
    let (f2, _) = m.create(&c, ROOT_INO, b"f2", 0o644, 0).expect("f2");
    for (ino, len) in [(f1, 6), (f2, 5000)] {
        let id = m.new_slice_id().expect("id");
        m.write_chunk(
            ino,
            0,
            Slice {
                pos: 0,
                id,
                size: len,
                off: 0,
                len,
            },
            Timestamp::now(),
        )
        .expect("write");
        m.close(ino).expect("close");
    }
    m.symlink(&c, ROOT_INO, b"sl", b"d1/f1").expect("symlink");
    m.link(&c, f1, ROOT_INO, b"hl").expect("link");
    let db = sql(&m);
    assert_eq!(counter(&db, "usedSpace"), 20480);
    assert_eq!(counter(&db, "totalInodes"), 4);
    assert_eq!(counter(&db, "nextInode"), 1026);
    assert_eq!(counter(&db, "nextChunk"), 4097);
    let stats = query(&db, "SELECT * FROM jfs_dir_stats ORDER BY inode");
    assert_eq!(
        stats,
        vec![
            vec!["1".to_string(), "5006".into(), "20480".into(), "4".into()],
            vec![d1.to_string(), "6".into(), "4096".into(), "1".into()],
        ]
    );
    let refs = query(
        &db,
        "SELECT chunkid, size, refs FROM jfs_chunk_ref ORDER BY chunkid",
    );
    assert_eq!(
        refs,
        vec![
            vec!["1".to_string(), "6".into(), "1".into()],
            vec!["2".to_string(), "5000".into(), "1".into()]
        ]
    );
    let blob: Vec<u8> = db
        .query_row(
            &format!("SELECT slices FROM jfs_chunk WHERE inode={f1}"),
            [],
            |r| r.get(0),
        )
        .expect("chunk");
    assert_eq!(
        hex(&blob),
        "000000000000000000000001000000060000000000000006"
    );
    // Removing into the trash: JuiceFS moved usage to the hourly directory.
    m.unlink(&c, ROOT_INO, b"f2").expect("unlink");
    m.unlink(&c, d1, b"f1").expect("unlink");
    let hour = TRASH_INO + 1;
    let edges = query(
        &db,
        &format!("SELECT name, inode FROM jfs_edge WHERE parent={hour} ORDER BY name"),
    );
    assert_eq!(
        edges,
        vec![
            vec![format!("1-{f2}-f2"), f2.to_string()],
            vec![format!("{d1}-{f1}-f1"), f1.to_string()]
        ]
    );
    assert_eq!(counter(&db, "usedSpace"), 20480 + 4096);
    assert_eq!(counter(&db, "totalInodes"), 5);
    assert_eq!(counter(&db, "nextTrash"), 1);
    let stats = query(
        &db,
        &format!("SELECT * FROM jfs_dir_stats WHERE inode IN (1, {d1}, {hour}) ORDER BY inode"),
    );
    assert_eq!(
        stats[0],
        vec!["1".to_string(), "6".into(), "12288".into(), "3".into()]
    );
    assert_eq!(
        stats[1],
        vec![d1.to_string(), "0".into(), "0".into(), "0".into()]
    );
    assert_eq!(
        stats[2],
        vec![hour.to_string(), "5006".into(), "12288".into(), "2".into()]
    );
    // The hard-linked node keeps parent 0 in the trash, the other moves.
    let parents = query(
        &db,
        &format!("SELECT parent FROM jfs_node WHERE inode IN ({f1}, {f2}) ORDER BY inode"),
    );
    assert_eq!(parents, vec![vec!["0".to_string()], vec![hour.to_string()]]);
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn unlink_without_trash_leaves_no_rows() {
    let (_dir, m) = fresh();
    m.init(&test_format(0)).expect("init");
    m.load().expect("load");
    m.set_slice_releaser(std::sync::Arc::new(|_| true));
    let c = Context::default();
    let (f, _) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    let id = m.new_slice_id().expect("id");
    m.write_chunk(
        f,
        0,
        Slice {
            pos: 0,
            id,
            size: 10,
            off: 0,
            len: 10,
        },
        Timestamp::now(),
    )
    .expect("write");
    m.setxattr(&c, f, b"user.x", b"y", crate::meta::XattrMode::Any)
        .expect("xattr");
    m.close(f).expect("close");
    m.unlink(&c, ROOT_INO, b"f").expect("unlink");
    let db = sql(&m);
    for table in [
        "jfs_chunk",
        "jfs_chunk_ref",
        "jfs_delfile",
        "jfs_xattr",
        "jfs_sustained",
    ] {
        let n: i64 = db
            .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
            .expect("count");
        assert_eq!(n, 0, "{table} keeps rows");
    }
}

#[test]
fn failed_object_deletion_is_retried_by_cleanup() {
    let (_dir, m) = fresh();
    m.init(&test_format(0)).expect("init");
    m.load().expect("load");
    let fail = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (f2, c2) = (fail.clone(), calls.clone());
    m.set_slice_releaser(std::sync::Arc::new(move |_| {
        c2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        !f2.load(std::sync::atomic::Ordering::SeqCst)
    }));
    let c = Context::default();
    let (f, _) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    let id = m.new_slice_id().expect("id");
    m.write_chunk(
        f,
        0,
        Slice {
            pos: 0,
            id,
            size: 10,
            off: 0,
            len: 10,
        },
        Timestamp::now(),
    )
    .expect("write");
    m.close(f).expect("close");
    m.unlink(&c, ROOT_INO, b"f").expect("unlink");
    let db = sql(&m);
    let rows = query(&db, "SELECT chunkid, refs FROM jfs_chunk_ref");
    assert_eq!(
        rows,
        vec![vec![id.to_string(), "0".into()]],
        "kept for a retry"
    );
    fail.store(false, std::sync::atomic::Ordering::SeqCst);
    m.cleanup().expect("cleanup");
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert!(query(&db, "SELECT chunkid FROM jfs_chunk_ref").is_empty());
}

#[test]
fn load_refuses_an_encrypted_juicefs_volume() {
    let (_dir, m) = fresh();
    m.init(&test_format(0)).expect("init");
    let db = sql(&m);
    let json: String = db
        .query_row(
            "SELECT value FROM jfs_setting WHERE name='format'",
            [],
            |r| r.get(0),
        )
        .expect("format");
    let mut v: serde_json::Value = serde_json::from_str(&json).expect("json");
    v["EncryptKey"] = "-----BEGIN ENCRYPTED PRIVATE KEY-----\nabc".into();
    db.execute(
        "UPDATE jfs_setting SET value=? WHERE name='format'",
        [v.to_string()],
    )
    .expect("update");
    let m2 = SqliteMeta::open(m.path()).expect("reopen");
    match m2.load() {
        Err(Error::NotSupported(msg)) => assert!(msg.contains("encrypted"), "{msg}"),
        other => panic!("encrypted volume loaded: {other:?}"),
    }
}

#[test]
fn stale_sessions_release_their_sustained_files() {
    let (dir, m) = fresh();
    m.init(&test_format(0)).expect("init");
    m.load().expect("load");
    let c = Context::default();
    let (f, _) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    let sid = m.new_session("{}").expect("session");
    m.unlink(&c, ROOT_INO, b"f").expect("unlink while open");
    let db = sql(&m);
    assert_eq!(
        query(&db, "SELECT sid, inode FROM jfs_sustained"),
        vec![vec![sid.to_string(), f.to_string()]]
    );
    // The client dies: its session expires; another client cleans up.
    db.execute("UPDATE jfs_session2 SET expire=1", [])
        .expect("expire");
    std::mem::forget(m);
    let other = SqliteMeta::open(dir.path().join("meta.db")).expect("reopen");
    other.load().expect("load");
    other.cleanup().expect("cleanup");
    assert!(query(&db, "SELECT * FROM jfs_sustained").is_empty());
    assert!(query(&db, "SELECT * FROM jfs_session2").is_empty());
    assert!(matches!(other.getattr(f), Err(Error::NotFound)));
}

#[test]
fn expired_trash_is_emptied() {
    let (_dir, m) = fresh();
    m.init(&test_format(1)).expect("init");
    m.load().expect("load");
    let released = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let r2 = released.clone();
    m.set_slice_releaser(std::sync::Arc::new(move |s| {
        r2.lock().push(s);
        true
    }));
    let c = Context::default();
    let (f, _) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    let id = m.new_slice_id().expect("id");
    m.write_chunk(
        f,
        0,
        Slice {
            pos: 0,
            id,
            size: 10,
            off: 0,
            len: 10,
        },
        Timestamp::now(),
    )
    .expect("write");
    m.close(f).expect("close");
    m.unlink(&c, ROOT_INO, b"f").expect("to trash");
    let (d, _) = m.mkdir(&c, ROOT_INO, b"d", 0o755, 0).expect("d");
    m.rmdir(&c, ROOT_INO, b"d").expect("dir to trash");
    // Make the hour old: rename its trash directory to 2001.
    let db = sql(&m);
    db.execute(
        "UPDATE jfs_edge SET name=CAST('2001-01-01-00' AS BLOB) WHERE parent=?",
        [TRASH_INO as i64],
    )
    .expect("age");
    m.cleanup().expect("cleanup");
    assert!(matches!(m.getattr(f), Err(Error::NotFound)));
    assert!(matches!(m.getattr(d), Err(Error::NotFound)));
    assert_eq!(m.readdir(&c, TRASH_INO, false).expect("trash").len(), 2);
    assert_eq!(released.lock().len(), 1);
    assert_eq!(counter(&db, "usedSpace"), 0);
    assert_eq!(counter(&db, "totalInodes"), 0);
}

#[test]
fn compaction_with_trash_delays_the_old_slices() {
    let (_dir, m) = fresh();
    m.init(&test_format(1)).expect("init");
    m.load().expect("load");
    let c = Context::default();
    let (f, _) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    let mut old = Vec::new();
    for pos in [0, 10] {
        let id = m.new_slice_id().expect("id");
        let s = Slice {
            pos,
            id,
            size: 10,
            off: 0,
            len: 10,
        };
        m.write_chunk(f, 0, s, Timestamp::now()).expect("write");
        old.push(s);
    }
    let id = m.new_slice_id().expect("id");
    assert!(
        m.compact_chunk(
            f,
            0,
            &old,
            &[Slice {
                pos: 0,
                id,
                size: 20,
                off: 0,
                len: 20
            }]
        )
        .expect("compact")
    );
    let db = sql(&m);
    let rows = query(&db, "SELECT chunkid, length(slices) FROM jfs_delslices");
    assert_eq!(rows, vec![vec![id.to_string(), "24".into()]]);
    assert!(
        m.slice_referenced(old[0].id, 10)
            .expect("kept for the trash")
    );
    db.execute("UPDATE jfs_delslices SET deleted=1", [])
        .expect("age");
    m.cleanup().expect("cleanup");
    assert!(!m.slice_referenced(old[0].id, 10).expect("released"));
    m.close(f).expect("close");
}

#[test]
fn rename_over_a_file_into_trash() {
    let (_dir, m) = fresh();
    m.init(&test_format(1)).expect("init");
    m.load().expect("load");
    let c = Context::default();
    let (a, _) = m.create(&c, ROOT_INO, b"a", 0o644, 0).expect("a");
    let (b, _) = m.create(&c, ROOT_INO, b"b", 0o644, 0).expect("b");
    m.close(a).and_then(|_| m.close(b)).expect("close");
    m.rename(&c, ROOT_INO, b"a", ROOT_INO, b"b", RenameFlags::default())
        .expect("rename");
    let hour = TRASH_INO + 1;
    assert_eq!(m.getattr(b).expect("kept").parent, hour);
    let name = format!("1-{b}-b").into_bytes();
    assert_eq!(m.lookup(&c, hour, &name).expect("in trash").0, b);
}

#[test]
fn sync_covers_every_commit_and_skips_when_nothing_is_new() {
    use std::sync::atomic::Ordering;
    let (dir, m) = fresh();
    m.init(&test_format(0)).expect("init");
    m.load().expect("load");
    assert!(m.inner.lazy_commits, "WAL with synchronous=NORMAL");
    let c = Context::default();
    m.mkdir(&c, ROOT_INO, b"d", 0o755, 0).expect("mkdir");
    let commits = m.inner.commits.load(Ordering::SeqCst);
    assert!(commits > *m.inner.synced.lock());
    m.sync().expect("sync");
    assert_eq!(*m.inner.synced.lock(), commits);
    // Nothing new: no sync (the count stays); a new commit needs one.
    m.sync().expect("sync again");
    m.mkdir(&c, ROOT_INO, b"e", 0o755, 0).expect("mkdir");
    assert!(m.inner.commits.load(Ordering::SeqCst) > *m.inner.synced.lock());
    m.sync().expect("sync");
    assert_eq!(
        *m.inner.synced.lock(),
        m.inner.commits.load(Ordering::SeqCst)
    );
    drop(m);
    // Every commit synced anyway: nothing for sync to do.
    let full = SqliteMeta::open_with(
        dir.path().join("meta.db"),
        super::SqliteOptions {
            synchronous: super::Synchronous::Full,
            ..Default::default()
        },
    )
    .expect("open");
    assert!(!full.inner.lazy_commits);
    full.sync().expect("sync");
}

#[test]
fn released_objects_are_deleted_only_once_the_release_is_durable() {
    use std::sync::atomic::Ordering;
    let (_dir, m) = fresh();
    m.init(&test_format(0)).expect("init");
    m.load().expect("load");
    // The releaser looks at the engine when it is called: every commit so
    // far (the one that released the slice included) must be synced.
    let inner = std::sync::Arc::downgrade(&m.inner);
    let seen = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let log = seen.clone();
    m.set_slice_releaser(std::sync::Arc::new(move |s| {
        let inner = inner.upgrade().expect("engine alive");
        log.lock().push((
            s.id,
            inner.commits.load(Ordering::SeqCst),
            *inner.synced.lock(),
        ));
        true
    }));
    let c = Context::default();
    let (f, _) = m.create(&c, ROOT_INO, b"f", 0o644, 0).expect("f");
    let slice = |id| Slice {
        pos: 0,
        id,
        size: 10,
        off: 0,
        len: 10,
    };
    let old = m.new_slice_id().expect("id");
    m.write_chunk(f, 0, slice(old), Timestamp::now())
        .expect("write");
    let new = m.new_slice_id().expect("id");
    m.write_chunk(f, 0, slice(new), Timestamp::now())
        .expect("overwrite");
    // Unlinked without trash: both slices are released.
    m.close(f).expect("close");
    m.unlink(&c, ROOT_INO, b"f").expect("unlink");
    let seen = seen.lock().clone();
    let mut ids: Vec<u64> = seen.iter().map(|s| s.0).collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![old, new], "{seen:?}");
    for (id, commits, synced) in seen {
        assert_eq!(
            synced, commits,
            "slice {id} released before its release was synced"
        );
    }
}

#[test]
fn a_new_database_is_private_to_its_owner() {
    use std::os::unix::fs::PermissionsExt;
    let (dir, m) = fresh();
    conformance::format_and_load(&m);
    for name in ["meta.db", "meta.db-wal", "meta.db-shm"] {
        let md = std::fs::metadata(dir.path().join(name)).expect(name);
        assert_eq!(md.permissions().mode() & 0o777, 0o600, "{name}");
    }
    drop(m);
    // An existing database keeps the mode its owner gave it.
    let path = dir.path().join("meta.db");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    let _m = SqliteMeta::open(&path).expect("reopen");
    let md = std::fs::metadata(&path).expect("stat");
    assert_eq!(md.permissions().mode() & 0o777, 0o640);
}
