//! `sluice dump` and `sluice load`: a volume's metadata as JuiceFS 1.x's
//! JSON dump (what `juicefs dump` writes and `juicefs load` reads), so a
//! volume moves between metadata engines — SQLite and Redis, ours or
//! JuiceFS's — with its inode numbers, slice ids and counters unchanged,
//! and the blocks in the object store still match.
//!
//! The document, in JuiceFS's order: `Setting` (the volume settings, with
//! the secret key, session token and encryption key replaced by
//! `"removed"` unless kept), `Counters`, `Sustained`, `DelFiles`, `Quotas`
//! (directory quotas, when there are any), `FSTree` (the root and, nested
//! under `entries`, every node: `attr`, `symlink`, `xattrs`, `chunks`) and
//! `Trash`. Names, symlink targets and xattr values are JuiceFS-escaped
//! (`json.rs`): bytes that are not UTF-8, control characters, `%`, `"` and
//! `\` become `%XX`. A hard-linked file appears, complete, under each of
//! its names.
//!
//! Both directions stream: the dump walks one directory page at a time and
//! writes as it goes (`write.rs`); the load parses the document
//! incrementally and hands each node to the engine's [`Restore`] as soon as
//! its object closes (`read.rs`), keeping only the open directories, the
//! slice reference counts and the hard links in memory.
//!
//! [`Restore`]: crate::meta::Restore

mod json;
mod read;
mod write;

pub use read::{LoadSummary, load};
pub use write::{DumpOptions, DumpSummary, dump};

#[cfg(test)]
mod tests {
    use crate::meta::conformance::test_format;
    use crate::meta::rules::align4k;
    use crate::meta::{
        Context, Meta, QuotaChange, ROOT_INO, Slice, SqliteMeta, Store, Timestamp, XattrMode,
    };

    #[test]
    fn a_sqlite_volume_dumps_loads_and_dumps_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let a = SqliteMeta::open(dir.path().join("a.db")).unwrap();
        a.init(&test_format(1)).unwrap();
        a.load().unwrap();
        let ctx = Context::internal();
        let (d, _) = a.mkdir(&ctx, ROOT_INO, b"d", 0o755, 0).unwrap();
        let (f, _) = a.create(&ctx, d, b"bad\xffname", 0o644, 0).unwrap();
        let id = a.new_slice_id().unwrap();
        let s = Slice {
            pos: 0,
            id,
            size: 4096,
            off: 0,
            len: 4096,
        };
        a.write_chunk(f, 2, s, Timestamp::now()).unwrap();
        a.link(&ctx, f, ROOT_INO, b"hard").unwrap();
        a.symlink(&ctx, ROOT_INO, b"sl", b"d/%target").unwrap();
        a.setxattr(&ctx, f, b"user.k", b"v\0\"%", XattrMode::Any)
            .unwrap();
        let mut first = Vec::new();
        super::dump(&a, &mut first, &Default::default(), &mut |_| {}).unwrap();

        let b = SqliteMeta::open(dir.path().join("b.db")).unwrap();
        super::load(&b, &mut &first[..], &mut |_| {}).unwrap();
        let mut second = Vec::new();
        super::dump(&b, &mut second, &Default::default(), &mut |_| {}).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&first),
            String::from_utf8_lossy(&second)
        );
        assert_eq!(
            b.counters().unwrap().next_slice,
            a.counters().unwrap().next_slice
        );
        assert_eq!(b.getattr(f).unwrap().nlink, 2);
        assert_eq!(b.read_chunk(f, 2).unwrap(), vec![s]);
        // A second load into a volume is refused.
        assert!(super::load(&b, &mut &first[..], &mut |_| {}).is_err());
    }

    #[test]
    fn directory_quotas_carry_their_limits_and_the_load_recounts_their_usage() {
        let dir = tempfile::tempdir().unwrap();
        let a = SqliteMeta::open(dir.path().join("a.db")).unwrap();
        a.init(&test_format(0)).unwrap();
        a.load().unwrap();
        let ctx = Context::internal();
        let (d, _) = a.mkdir(&ctx, ROOT_INO, b"q", 0o755, 0).unwrap();
        let (sub, _) = a.mkdir(&ctx, d, b"sub", 0o755, 0).unwrap();
        let (f, _) = a.create(&ctx, sub, b"f", 0o644, 0).unwrap();
        let id = a.new_slice_id().unwrap();
        let s = Slice {
            pos: 0,
            id,
            size: 10_000,
            off: 0,
            len: 10_000,
        };
        a.write_chunk(f, 0, s, Timestamp::now()).unwrap();
        let change = QuotaChange {
            max_space: Some(1 << 30),
            max_inodes: Some(100),
            usage: Some((align4k(10_000) + 4096, 2)),
        };
        a.set_dir_quota(d, &change).unwrap();
        let before = a.get_dir_quota(d).unwrap().expect("a quota");
        let mut dumped = Vec::new();
        super::dump(&a, &mut dumped, &Default::default(), &mut |_| {}).unwrap();
        assert!(String::from_utf8_lossy(&dumped).contains("\"Quotas\""));

        let b = SqliteMeta::open(dir.path().join("b.db")).unwrap();
        super::load(&b, &mut &dumped[..], &mut |_| {}).unwrap();
        b.load().unwrap();
        assert_eq!(b.get_dir_quota(d).unwrap(), Some(before));
        // The usage is the load's own count of the tree, not a copy: a
        // wrong stored usage does not travel.
        a.set_dir_quota(
            d,
            &QuotaChange {
                usage: Some((1, 1)),
                ..Default::default()
            },
        )
        .unwrap();
        let mut dumped = Vec::new();
        super::dump(&a, &mut dumped, &Default::default(), &mut |_| {}).unwrap();
        let c = SqliteMeta::open(dir.path().join("c.db")).unwrap();
        super::load(&c, &mut &dumped[..], &mut |_| {}).unwrap();
        assert_eq!(c.get_dir_quota(d).unwrap(), Some(before));
    }
}
