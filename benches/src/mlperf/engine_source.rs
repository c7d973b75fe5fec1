//! A [`DataSource`] that reads and writes through the sluice engine in-process.
//!
//! [`EngineSource`] opens a formatted volume from its metadata URL and drives the same
//! [`Vfs`] a FUSE mount serves, with no kernel in the way: paths are resolved by looking
//! names up from the root, files are read with `open`/`read`/`release` and written with
//! `create`/`write`/`fsync`/`release`. Every call runs with the engine's internal context
//! (root, no permission checks), as the benchmark owns the volume.

use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use sluice_engine::Error as EngineError;
use sluice_engine::meta::{Context, Entry, FileType, Ino, ROOT_INO, SetAttr};
use sluice_engine::vfs::{Fh, Vfs, VfsConfig};
use sluice_engine::volume::open_volume_url;

use super::MlperfError;
use super::source::{DataSource, SinkFile, SourceFile};
use sluice_engine::vfs::Filesystem as _;

/// Turns an engine error into an I/O error that keeps both the errno's kind (so "not
/// found" stays recognisable) and the engine's message.
fn to_io(e: EngineError) -> io::Error {
    match e {
        EngineError::Io(io) => io,
        other => io::Error::new(io::Error::from_raw_os_error(other.errno()).kind(), other),
    }
}

/// A volume served in-process; closes the engine's session when dropped.
#[derive(Debug)]
struct Served {
    vfs: Vfs,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.vfs.destroy();
    }
}

/// A [`DataSource`] over a sluice volume, read through the engine in this process.
#[derive(Debug)]
pub struct EngineSource {
    url: String,
    served: Arc<Served>,
    ctx: Context,
}

impl EngineSource {
    /// Opens the volume whose metadata engine `meta_url` names (`sqlite3:///PATH/meta.db`).
    pub fn open(meta_url: &str) -> Result<EngineSource, MlperfError> {
        let shown = sluice_engine::redact::redact_url(meta_url);
        let fail = |source| MlperfError::Engine {
            url: shown.clone(),
            source,
        };
        let vol = open_volume_url(meta_url).map_err(fail)?;
        let vfs = Vfs::new(vol, VfsConfig::default()).map_err(fail)?;
        Ok(EngineSource {
            url: shown,
            served: Arc::new(Served { vfs }),
            ctx: Context::internal(),
        })
    }

    fn vfs(&self) -> &Vfs {
        &self.served.vfs
    }

    /// The names along `rel`; `.` is skipped and anything else that is not a plain name
    /// (`..`, a root) is refused.
    fn names<'a>(&self, rel: &'a Path) -> Result<Vec<&'a [u8]>, MlperfError> {
        use std::os::unix::ffi::OsStrExt;
        let mut out = Vec::new();
        for c in rel.components() {
            match c {
                Component::Normal(n) => out.push(n.as_bytes()),
                Component::CurDir => {}
                _ => {
                    return Err(MlperfError::InvalidParameter(format!(
                        "{} is not a path inside the volume",
                        rel.display()
                    )));
                }
            }
        }
        Ok(out)
    }

    /// Looks `rel` up from the root; `Ok(None)` when some name along it does not exist.
    fn resolve(&self, rel: &Path) -> Result<Option<(Ino, FileType, u64)>, MlperfError> {
        let mut at = (ROOT_INO, FileType::Directory, 0);
        for name in self.names(rel)? {
            match self.vfs().lookup(&self.ctx, at.0, name) {
                Ok(e) => at = (e.inode, e.attr.typ, e.attr.length),
                Err(EngineError::NotFound) => return Ok(None),
                Err(e) => return Err(self.err("look up", rel, e)),
            }
        }
        Ok(Some(at))
    }

    /// The parent directory of `rel` (which must exist) and `rel`'s last name.
    fn parent_of<'a>(&self, rel: &'a Path) -> Result<(Ino, &'a [u8]), MlperfError> {
        let names = self.names(rel)?;
        let Some((last, _)) = names.split_last() else {
            return Err(MlperfError::InvalidParameter(
                "the volume's root is not a file".into(),
            ));
        };
        let parent = rel.parent().unwrap_or(Path::new(""));
        match self.resolve(parent)? {
            Some((ino, FileType::Directory, _)) => Ok((ino, last)),
            Some(_) => Err(self.err("use as a directory", parent, EngineError::NotDir)),
            None => Err(self.err("open", parent, EngineError::NotFound)),
        }
    }

    fn err(&self, action: &'static str, rel: &Path, e: EngineError) -> MlperfError {
        MlperfError::io(action, self.display_path(rel), to_io(e))
    }

    /// Every entry of directory `ino` except `.` and `..`.
    fn entries(&self, ino: Ino) -> Result<Vec<Entry>, EngineError> {
        let vfs = self.vfs();
        let fh = vfs.opendir(&self.ctx, ino)?;
        let listed = vfs.readdir_all(&self.ctx, ino, fh, 0, false);
        let closed = vfs.releasedir(&self.ctx, ino, fh);
        let mut entries = listed?;
        closed?;
        entries.retain(|e| e.name != b"." && e.name != b"..");
        Ok(entries)
    }

    /// Removes everything inside directory `ino`.
    fn empty_dir(&self, ino: Ino) -> Result<(), EngineError> {
        for e in self.entries(ino)? {
            if e.attr.typ == FileType::Directory {
                self.empty_dir(e.inode)?;
                self.vfs().rmdir(&self.ctx, ino, &e.name)?;
            } else {
                self.vfs().unlink(&self.ctx, ino, &e.name)?;
            }
        }
        Ok(())
    }
}

/// An open engine file handle; released when dropped.
struct EngineFile {
    served: Arc<Served>,
    ctx: Context,
    ino: Ino,
    fh: Fh,
    len: u64,
    /// Where the next write goes (sinks only).
    at: u64,
}

impl Drop for EngineFile {
    fn drop(&mut self) {
        if let Err(e) = self.served.vfs.release(&self.ctx, self.ino, self.fh) {
            log::warn!("releasing inode {} failed: {e}", self.ino);
        }
    }
}

impl SourceFile for EngineFile {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.served
            .vfs
            .read_buf(&self.ctx, self.ino, self.fh, offset, buf)
            .map_err(to_io)
    }
}

impl SinkFile for EngineFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        let n = self
            .served
            .vfs
            .write_buf(&self.ctx, self.ino, self.fh, self.at, buf, false)
            .map_err(to_io)?;
        if n != buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("the engine took {n} of {} bytes", buf.len()),
            ));
        }
        self.at += n as u64;
        self.len = self.len.max(self.at);
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        self.served
            .vfs
            .fsync(&self.ctx, self.ino, self.fh, false)
            .map_err(to_io)
    }
}

impl DataSource for EngineSource {
    fn describe(&self) -> String {
        format!("the sluice engine in-process ({})", self.url)
    }

    fn display_path(&self, rel: &Path) -> PathBuf {
        let mut p = PathBuf::from(format!("{}:/", self.url));
        p.push(rel);
        p
    }

    fn list(&self, rel: &Path) -> Result<Vec<String>, MlperfError> {
        let ino = match self.resolve(rel)? {
            Some((ino, FileType::Directory, _)) => ino,
            Some(_) => return Err(self.err("list", rel, EngineError::NotDir)),
            None => return Ok(Vec::new()),
        };
        let mut names: Vec<String> = self
            .entries(ino)
            .map_err(|e| self.err("list", rel, e))?
            .into_iter()
            .map(|e| String::from_utf8_lossy(&e.name).into_owned())
            .collect();
        names.sort();
        Ok(names)
    }

    fn file_len(&self, rel: &Path) -> Result<Option<u64>, MlperfError> {
        Ok(self.resolve(rel)?.map(|(_, _, len)| len))
    }

    fn open(&self, rel: &Path) -> Result<Box<dyn SourceFile>, MlperfError> {
        let ino = match self.resolve(rel)? {
            Some((ino, FileType::File, _)) => ino,
            Some((_, FileType::Directory, _)) => {
                return Err(self.err("open", rel, EngineError::IsDir));
            }
            Some(_) => {
                return Err(MlperfError::io(
                    "open",
                    self.display_path(rel),
                    io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"),
                ));
            }
            None => return Err(self.err("open", rel, EngineError::NotFound)),
        };
        let out = self
            .vfs()
            .open(&self.ctx, ino, libc::O_RDONLY as u32)
            .map_err(|e| self.err("open", rel, e))?;
        Ok(Box::new(EngineFile {
            served: self.served.clone(),
            ctx: self.ctx.clone(),
            ino,
            fh: out.fh,
            len: out.attr.length,
            at: 0,
        }))
    }

    fn create(&self, rel: &Path) -> Result<Box<dyn SinkFile>, MlperfError> {
        let (parent, name) = self.parent_of(rel)?;
        let vfs = self.vfs();
        let flags = libc::O_WRONLY as u32;
        let (ino, fh) = match vfs.lookup(&self.ctx, parent, name) {
            Ok(e) => {
                let out = vfs
                    .open(&self.ctx, e.inode, flags)
                    .map_err(|e| self.err("open", rel, e))?;
                let file = EngineFile {
                    served: self.served.clone(),
                    ctx: self.ctx.clone(),
                    ino: e.inode,
                    fh: out.fh,
                    len: 0,
                    at: 0,
                };
                vfs.setattr(
                    &self.ctx,
                    e.inode,
                    Some(out.fh),
                    &SetAttr::default(),
                    Some(0),
                )
                .map_err(|e| self.err("truncate", rel, e))?;
                return Ok(Box::new(file));
            }
            Err(EngineError::NotFound) => {
                let (entry, out) = vfs
                    .create(&self.ctx, parent, name, 0o644, 0o022, flags)
                    .map_err(|e| self.err("create", rel, e))?;
                (entry.inode, out.fh)
            }
            Err(e) => return Err(self.err("look up", rel, e)),
        };
        Ok(Box::new(EngineFile {
            served: self.served.clone(),
            ctx: self.ctx.clone(),
            ino,
            fh,
            len: 0,
            at: 0,
        }))
    }

    fn create_dir_all(&self, rel: &Path) -> Result<(), MlperfError> {
        let mut at = ROOT_INO;
        for name in self.names(rel)? {
            let found = match self.vfs().lookup(&self.ctx, at, name) {
                Err(EngineError::NotFound) => {
                    match self.vfs().mkdir(&self.ctx, at, name, 0o755, 0o022) {
                        // Another thread made it first.
                        Err(EngineError::Exists) => self.vfs().lookup(&self.ctx, at, name),
                        r => r,
                    }
                }
                r => r,
            };
            let entry = found.map_err(|e| self.err("create directory", rel, e))?;
            if entry.attr.typ != FileType::Directory {
                return Err(self.err("create directory", rel, EngineError::NotDir));
            }
            at = entry.inode;
        }
        Ok(())
    }

    fn remove_dir_all(&self, rel: &Path) -> Result<(), MlperfError> {
        let ino = match self.resolve(rel)? {
            Some((ino, FileType::Directory, _)) => ino,
            Some(_) => return Err(self.err("remove", rel, EngineError::NotDir)),
            None => return Ok(()),
        };
        self.empty_dir(ino)
            .map_err(|e| self.err("remove", rel, e))?;
        if ino == ROOT_INO {
            return Ok(());
        }
        let (parent, name) = self.parent_of(rel)?;
        self.vfs()
            .rmdir(&self.ctx, parent, name)
            .map_err(|e| self.err("remove", rel, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_engine::format::Compression;
    use sluice_engine::volume::format_volume_url;

    /// A freshly formatted volume in a temporary directory and its metadata URL.
    fn volume() -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite3://{}", dir.path().join("meta.db").display());
        format_volume_url(
            &url,
            "mlperf",
            &dir.path().join("bucket"),
            4096,
            Compression::None,
            0,
        )
        .unwrap();
        (dir, url)
    }

    #[test]
    fn engine_round_trip() {
        let (_dir, url) = volume();
        let source = EngineSource::open(&url).unwrap();
        source.create_dir_all(Path::new("a/b")).unwrap();
        source.create_dir_all(Path::new("a/b")).unwrap();
        let mut sink = source.create(Path::new("a/b/f")).unwrap();
        sink.write_all(b"hello ").unwrap();
        sink.write_all(b"world").unwrap();
        sink.sync().unwrap();
        drop(sink);
        assert_eq!(source.list(Path::new("a/b")).unwrap(), vec!["f"]);
        assert_eq!(source.list(Path::new("a")).unwrap(), vec!["b"]);
        assert_eq!(source.file_len(Path::new("a/b/f")).unwrap(), Some(11));
        assert_eq!(source.file_len(Path::new("a/nope")).unwrap(), None);
        let mut file = source.open(Path::new("a/b/f")).unwrap();
        assert_eq!(file.len(), 11);
        let mut buf = [0u8; 5];
        file.read_exact_at(&mut buf, 6).unwrap();
        assert_eq!(&buf, b"world");
        assert!(file.read_exact_at(&mut buf, 8).is_err());
        drop(file);
        // Creating an existing file truncates it.
        let mut sink = source.create(Path::new("a/b/f")).unwrap();
        sink.write_all(b"bye").unwrap();
        drop(sink);
        assert_eq!(source.file_len(Path::new("a/b/f")).unwrap(), Some(3));
        match source.open(Path::new("a/missing")) {
            Err(err) => assert!(err.to_string().contains("a/missing"), "{err}"),
            Ok(_) => panic!("opened a missing file"),
        }
        assert!(source.open(Path::new("../x")).is_err());
        source.remove_dir_all(Path::new("a")).unwrap();
        assert!(source.list(Path::new("a")).unwrap().is_empty());
        assert!(source.list(Path::new("")).unwrap().is_empty());
        source.remove_dir_all(Path::new("a")).unwrap();
    }

    #[test]
    fn data_written_through_the_engine_persists_across_opens() {
        let (_dir, url) = volume();
        let data: Vec<u8> = (0..(9u32 << 20) / 4)
            .flat_map(|i| i.to_le_bytes())
            .collect();
        {
            let source = EngineSource::open(&url).unwrap();
            let mut sink = source.create(Path::new("big")).unwrap();
            for piece in data.chunks(1 << 20) {
                sink.write_all(piece).unwrap();
            }
            sink.sync().unwrap();
        }
        let source = EngineSource::open(&url).unwrap();
        let mut file = source.open(Path::new("big")).unwrap();
        assert_eq!(file.len(), data.len() as u64);
        let mut back = vec![0u8; data.len()];
        for (i, piece) in back.chunks_mut(300_000).enumerate() {
            file.read_exact_at(piece, i as u64 * 300_000).unwrap();
        }
        assert!(back == data, "the data read back differs");
    }

    #[test]
    fn a_missing_volume_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite3://{}", dir.path().join("meta.db").display());
        let err = EngineSource::open(&url).unwrap_err();
        assert!(err.to_string().contains(&url), "{err}");
    }
}
