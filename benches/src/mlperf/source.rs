//! Where the emulation's bytes come from and go to.
//!
//! [`DataSource`] is the small surface the loader, the data generator and the checkpoint
//! test need: list a directory, open a file and read it at offsets, create a file, write it
//! and fsync it. [`DirSource`] implements it over any directory (a local disk, a sluice or
//! JuiceFS FUSE mount, a virtio-fs mount inside a guest);
//! [`super::engine_source::EngineSource`] reads through the sluice engine in-process, with
//! no kernel in the way.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::MlperfError;

/// A file opened for reading.
pub trait SourceFile: Send {
    /// The file's length in bytes.
    fn len(&self) -> u64;
    /// Whether the file is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read (0 at end of file).
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_exact_at(&mut self, buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            match self.read_at(&mut buf[done..], offset) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    done += n;
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// A file opened for writing from its start.
pub trait SinkFile: Send {
    /// Appends all of `buf`.
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()>;
    /// Makes everything written durable (fsync); a save only counts once this returns.
    fn sync(&mut self) -> io::Result<()>;
}

/// A place holding a data set, addressed by paths relative to its root.
pub trait DataSource: Send + Sync + fmt::Debug {
    /// A short description for reports ("directory /mnt/data").
    fn describe(&self) -> String;
    /// The full path of `rel`, for messages.
    fn display_path(&self, rel: &Path) -> PathBuf;
    /// Names of the entries of directory `rel`, sorted; an empty list if it does not exist.
    fn list(&self, rel: &Path) -> Result<Vec<String>, MlperfError>;
    /// The length of file `rel`, or `None` if it does not exist.
    fn file_len(&self, rel: &Path) -> Result<Option<u64>, MlperfError>;
    /// Opens file `rel` for reading.
    fn open(&self, rel: &Path) -> Result<Box<dyn SourceFile>, MlperfError>;
    /// Creates (or truncates) file `rel` for writing.
    fn create(&self, rel: &Path) -> Result<Box<dyn SinkFile>, MlperfError>;
    /// Creates directory `rel` and its parents.
    fn create_dir_all(&self, rel: &Path) -> Result<(), MlperfError>;
    /// Removes directory `rel` and everything in it; nothing if it does not exist.
    fn remove_dir_all(&self, rel: &Path) -> Result<(), MlperfError>;
}

/// A [`DataSource`] over a directory of the host's file system.
#[derive(Debug, Clone)]
pub struct DirSource {
    root: PathBuf,
}

impl DirSource {
    /// A source rooted at `root`, which must be an existing directory.
    pub fn new(root: impl Into<PathBuf>) -> Result<DirSource, MlperfError> {
        let root = root.into();
        let meta = fs::metadata(&root).map_err(|e| MlperfError::io("open", &root, e))?;
        if !meta.is_dir() {
            return Err(MlperfError::io(
                "use as a data directory",
                &root,
                io::Error::new(io::ErrorKind::NotADirectory, "not a directory"),
            ));
        }
        Ok(DirSource { root })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

struct DirFile {
    file: File,
    len: u64,
}

impl SourceFile for DirFile {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.file.read_at(buf, offset)
    }
}

struct DirSink {
    file: File,
}

impl SinkFile for DirSink {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        Write::write_all(&mut self.file, buf)
    }

    fn sync(&mut self) -> io::Result<()> {
        self.file.sync_all()
    }
}

impl DataSource for DirSource {
    fn describe(&self) -> String {
        format!("directory {}", self.root.display())
    }

    fn display_path(&self, rel: &Path) -> PathBuf {
        if rel.as_os_str().is_empty() {
            self.root.clone()
        } else {
            self.root.join(rel)
        }
    }

    fn list(&self, rel: &Path) -> Result<Vec<String>, MlperfError> {
        let path = self.root.join(rel);
        let entries = match fs::read_dir(&path) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(MlperfError::io("list", path, e)),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| MlperfError::io("list", &path, e))?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }

    fn file_len(&self, rel: &Path) -> Result<Option<u64>, MlperfError> {
        let path = self.root.join(rel);
        match fs::metadata(&path) {
            Ok(meta) => Ok(Some(meta.len())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(MlperfError::io("stat", path, e)),
        }
    }

    fn open(&self, rel: &Path) -> Result<Box<dyn SourceFile>, MlperfError> {
        let path = self.root.join(rel);
        let file = File::open(&path).map_err(|e| MlperfError::io("open", &path, e))?;
        let len = file
            .metadata()
            .map_err(|e| MlperfError::io("stat", &path, e))?
            .len();
        Ok(Box::new(DirFile { file, len }))
    }

    fn create(&self, rel: &Path) -> Result<Box<dyn SinkFile>, MlperfError> {
        let path = self.root.join(rel);
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| MlperfError::io("create", &path, e))?;
        Ok(Box::new(DirSink { file }))
    }

    fn create_dir_all(&self, rel: &Path) -> Result<(), MlperfError> {
        let path = self.root.join(rel);
        fs::create_dir_all(&path).map_err(|e| MlperfError::io("create directory", path, e))
    }

    fn remove_dir_all(&self, rel: &Path) -> Result<(), MlperfError> {
        let path = self.root.join(rel);
        match fs::remove_dir_all(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(MlperfError::io("remove", path, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let source = DirSource::new(dir.path()).unwrap();
        source.create_dir_all(Path::new("a/b")).unwrap();
        let mut sink = source.create(Path::new("a/b/f")).unwrap();
        sink.write_all(b"hello world").unwrap();
        sink.sync().unwrap();
        drop(sink);
        assert_eq!(source.list(Path::new("a/b")).unwrap(), vec!["f"]);
        assert_eq!(source.file_len(Path::new("a/b/f")).unwrap(), Some(11));
        assert_eq!(source.file_len(Path::new("a/nope")).unwrap(), None);
        let mut file = source.open(Path::new("a/b/f")).unwrap();
        let mut buf = [0u8; 5];
        file.read_exact_at(&mut buf, 6).unwrap();
        assert_eq!(&buf, b"world");
        assert!(file.read_exact_at(&mut buf, 8).is_err());
        source.remove_dir_all(Path::new("a")).unwrap();
        assert!(source.list(Path::new("a")).unwrap().is_empty());
    }

    #[test]
    fn a_file_is_not_a_data_directory() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("x");
        fs::write(&file, b"x").unwrap();
        let err = DirSource::new(&file).unwrap_err();
        assert!(err.to_string().contains("cannot use as a data directory"));
    }
}
