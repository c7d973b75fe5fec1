//! The engine's file-system facade served over FUSE: `impl Filesystem for
//! Vfs`, one delegation per method.

use sluice_engine::Result;
use sluice_engine::meta::{
    Attr, Context, CopyRange, Entry, Ino, RenameFlags, SetAttr, StatFs, XattrMode,
};
use sluice_engine::vfs::Vfs;

use crate::filesystem::{Fh, Filesystem, Fragment, Listed, OpenOut};

impl Filesystem for Vfs {
    fn init(&self) -> Result<()> {
        Vfs::init(self)
    }
    fn destroy(&self) {
        Vfs::destroy(self)
    }
    fn lookup(&self, ctx: &Context, parent: Ino, name: &[u8]) -> Result<Entry> {
        Vfs::lookup(self, ctx, parent, name)
    }
    fn forget(&self, ino: Ino, nlookup: u64) {
        Vfs::forget(self, ino, nlookup)
    }
    fn getattr(&self, ctx: &Context, ino: Ino) -> Result<Attr> {
        Vfs::getattr(self, ctx, ino)
    }
    fn setattr(
        &self,
        ctx: &Context,
        ino: Ino,
        fh: Option<Fh>,
        set: &SetAttr,
        size: Option<u64>,
    ) -> Result<Attr> {
        Vfs::setattr(self, ctx, ino, fh, set, size)
    }
    fn readlink(&self, ctx: &Context, ino: Ino) -> Result<Vec<u8>> {
        Vfs::readlink(self, ctx, ino)
    }
    fn mknod(
        &self,
        ctx: &Context,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<Entry> {
        Vfs::mknod(self, ctx, parent, name, mode, umask, rdev)
    }
    fn mkdir(
        &self,
        ctx: &Context,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<Entry> {
        Vfs::mkdir(self, ctx, parent, name, mode, umask)
    }
    fn unlink(&self, ctx: &Context, parent: Ino, name: &[u8]) -> Result<()> {
        Vfs::unlink(self, ctx, parent, name)
    }
    fn rmdir(&self, ctx: &Context, parent: Ino, name: &[u8]) -> Result<()> {
        Vfs::rmdir(self, ctx, parent, name)
    }
    fn symlink(&self, ctx: &Context, parent: Ino, name: &[u8], target: &[u8]) -> Result<Entry> {
        Vfs::symlink(self, ctx, parent, name, target)
    }
    fn rename(
        &self,
        ctx: &Context,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        Vfs::rename(self, ctx, parent, name, new_parent, new_name, flags)
    }
    fn link(&self, ctx: &Context, ino: Ino, new_parent: Ino, new_name: &[u8]) -> Result<Entry> {
        Vfs::link(self, ctx, ino, new_parent, new_name)
    }
    fn open(&self, ctx: &Context, ino: Ino, flags: u32) -> Result<OpenOut> {
        Vfs::open(self, ctx, ino, flags)
    }
    fn create(
        &self,
        ctx: &Context,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
        flags: u32,
    ) -> Result<(Entry, OpenOut)> {
        Vfs::create(self, ctx, parent, name, mode, umask, flags)
    }
    fn read(&self, ctx: &Context, ino: Ino, fh: Fh, offset: u64, buf: &mut [u8]) -> Result<usize> {
        Vfs::read(self, ctx, ino, fh, offset, buf)
    }

    fn read_fragments(
        &self,
        _ctx: &Context,
        ino: Ino,
        fh: Fh,
        offset: u64,
        size: usize,
        put: &mut dyn FnMut(Fragment<'_>) -> Result<()>,
    ) -> Result<usize> {
        Vfs::read_fragments(self, ino, fh, offset, size, put)
    }
    fn write(
        &self,
        ctx: &Context,
        ino: Ino,
        fh: Fh,
        offset: u64,
        data: &[u8],
        kill_suidgid: bool,
    ) -> Result<usize> {
        if kill_suidgid {
            Vfs::kill_suidgid(self, ctx, ino, fh)?;
        }
        Vfs::write(self, ctx, ino, fh, offset, data)
    }
    fn flush(&self, ctx: &Context, ino: Ino, fh: Fh) -> Result<()> {
        Vfs::flush(self, ctx, ino, fh)
    }
    fn release(&self, ctx: &Context, ino: Ino, fh: Fh) -> Result<()> {
        Vfs::release(self, ctx, ino, fh)
    }
    fn fsync(&self, ctx: &Context, ino: Ino, fh: Fh, datasync: bool) -> Result<()> {
        Vfs::fsync(self, ctx, ino, fh, datasync)
    }
    fn opendir(&self, ctx: &Context, ino: Ino) -> Result<Fh> {
        Vfs::opendir(self, ctx, ino)
    }
    fn readdir(
        &self,
        ctx: &Context,
        ino: Ino,
        fh: Fh,
        offset: u64,
        plus: bool,
        add: &mut dyn FnMut(&Entry, Listed) -> bool,
    ) -> Result<()> {
        Vfs::readdir_each(self, ctx, ino, fh, offset, plus, &mut |e| {
            add(e, Listed::Node)
        })
    }
    fn releasedir(&self, ctx: &Context, ino: Ino, fh: Fh) -> Result<()> {
        Vfs::releasedir(self, ctx, ino, fh)
    }
    fn fsyncdir(&self, ctx: &Context, ino: Ino, fh: Fh, datasync: bool) -> Result<()> {
        Vfs::fsyncdir(self, ctx, ino, fh, datasync)
    }
    fn statfs(&self, ctx: &Context, ino: Ino) -> Result<StatFs> {
        Vfs::statfs(self, ctx, ino)
    }
    fn setxattr(
        &self,
        ctx: &Context,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
    ) -> Result<()> {
        Vfs::setxattr(self, ctx, ino, name, value, mode)
    }
    fn getxattr(&self, ctx: &Context, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        Vfs::getxattr(self, ctx, ino, name)
    }
    fn listxattr(&self, ctx: &Context, ino: Ino) -> Result<Vec<Vec<u8>>> {
        Vfs::listxattr(self, ctx, ino)
    }
    fn removexattr(&self, ctx: &Context, ino: Ino, name: &[u8]) -> Result<()> {
        Vfs::removexattr(self, ctx, ino, name)
    }
    fn access(&self, ctx: &Context, ino: Ino, mask: u32) -> Result<()> {
        Vfs::access(self, ctx, ino, mask)
    }
    fn fallocate(
        &self,
        ctx: &Context,
        ino: Ino,
        fh: Fh,
        mode: u32,
        offset: u64,
        len: u64,
    ) -> Result<()> {
        Vfs::fallocate(self, ctx, ino, fh, mode, offset, len)
    }
    fn lseek(&self, ctx: &Context, ino: Ino, fh: Fh, offset: u64, whence: u32) -> Result<u64> {
        Vfs::lseek(self, ctx, ino, fh, offset, whence)
    }
    fn copy_file_range(
        &self,
        ctx: &Context,
        req: &CopyRange,
        fh_in: Fh,
        fh_out: Fh,
    ) -> Result<u64> {
        Vfs::copy_file_range(self, ctx, req, fh_in, fh_out)
    }
}
