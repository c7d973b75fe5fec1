#!/usr/bin/env python3
"""Patches a *built copy* of xfstests (never the tarball) for FUSE_SUBTYP
.sluice / .juicefs. Idempotent. Usage: patch-xfstests.py XFSTESTS_DIR

- common/rc _fs_type: `df -T` reports fuse.sluice (fuse.juicefs) while FSTYP
  is fuse; map them as _fs_type already maps fuse.glusterfs and
  fuse.ceph-fuse.
- common/rc _scratch_mkfs: for FSTYP=fuse xfstests can only empty the
  scratch mount (rm -rf SCRATCH_MNT/*), which leaves the root directory's
  mode, owner, times and xattrs, and the volume's counters, as the last
  test left them. With FUSE_MKFS_PROG set it runs `$FUSE_MKFS_PROG
  $SCRATCH_DEV` instead, which reformats the volume, as mkfs does on a disk.
"""
import sys

path = sys.argv[1] + "/common/rc"
s = open(path).read()

if "fuse\\.sluice" not in s:
    old = "-e 's/fuse.ceph-fuse/ceph-fuse/'"
    assert s.count(old) == 1, "cannot find _fs_type's sed in " + path
    s = s.replace(
        old,
        old + " \\\n            -e 's/^fuse\\.sluice$/fuse/' -e 's/^fuse\\.juicefs$/fuse/'",
    )

if "FUSE_MKFS_PROG" not in s:
    old = """\tnfs*|afs|cifs|ceph|overlay|glusterfs|pvfs2|9p|fuse|virtiofs)
\t\t# unable to re-create this fstyp, just remove all files in"""
    new = """\tfuse)
\t\t# sluice's xfstests harness: reformat the volume
\t\tif [ -n "$FUSE_MKFS_PROG" ]; then
\t\t\t$FUSE_MKFS_PROG $SCRATCH_DEV
\t\t\treturn $?
\t\tfi
\t\t_scratch_cleanup_files
\t\treturn $?
\t\t;;
\tnfs*|afs|cifs|ceph|overlay|glusterfs|pvfs2|9p|virtiofs)
\t\t# unable to re-create this fstyp, just remove all files in"""
    assert s.count(old) == 1, "cannot find _scratch_mkfs's fuse case in " + path
    s = s.replace(old, new)

open(path, "w").write(s)
