//! The files this client holds open, as both metadata engines track them: a
//! count of handles per inode, and whether the inode lost its last link while
//! open (then it is kept for this session, and deleted at the last close).

use std::collections::HashMap;

use super::Ino;
use crate::error::{Error, Result};

#[derive(Debug, Default, Clone, Copy)]
struct OpenFile {
    /// Open handles.
    count: u32,
    /// Unlinked while open: kept until the last close.
    removed: bool,
}

/// Open handles per inode of this client.
#[derive(Debug, Default)]
pub(crate) struct OpenFiles {
    files: HashMap<Ino, OpenFile>,
}

impl OpenFiles {
    /// Counts an open of `ino`; true when it is the first.
    pub(crate) fn open(&mut self, ino: Ino) -> bool {
        let f = self.files.entry(ino).or_default();
        f.count += 1;
        f.count == 1
    }

    /// Counts a close of `ino`: `None` while other handles stay open,
    /// `Some(removed)` at the last close (whether the inode lost its last
    /// link meanwhile), `BadHandle` when it was not open.
    pub(crate) fn close(&mut self, ino: Ino) -> Result<Option<bool>> {
        let Some(f) = self.files.get_mut(&ino) else {
            return Err(Error::BadHandle);
        };
        f.count = f.count.saturating_sub(1);
        if f.count > 0 {
            return Ok(None);
        }
        let removed = f.removed;
        self.files.remove(&ino);
        Ok(Some(removed))
    }

    /// Whether `ino` has open handles.
    pub(crate) fn is_open(&self, ino: Ino) -> bool {
        self.files.get(&ino).is_some_and(|f| f.count > 0)
    }

    /// Marks `ino` to go at its last close, if it is open; whether it is.
    pub(crate) fn mark_removed(&mut self, ino: Ino) -> bool {
        match self.files.get_mut(&ino) {
            Some(f) if f.count > 0 => {
                f.removed = true;
                true
            }
            _ => false,
        }
    }

    /// Forgets every open file (the session ends): the inodes that lost
    /// their last link while open, and all of them.
    pub(crate) fn take_all(&mut self) -> (Vec<Ino>, Vec<Ino>) {
        let removed = self
            .files
            .iter()
            .filter(|(_, f)| f.removed)
            .map(|(i, _)| *i)
            .collect();
        let all = self.files.keys().copied().collect();
        self.files.clear();
        (removed, all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_opens_and_reports_the_last_close() {
        let mut o = OpenFiles::default();
        assert!(o.open(5));
        assert!(!o.open(5));
        assert!(o.mark_removed(5));
        assert!(!o.mark_removed(6), "not open");
        assert_eq!(o.close(5).unwrap(), None);
        assert_eq!(o.close(5).unwrap(), Some(true));
        assert!(matches!(o.close(5), Err(Error::BadHandle)));
        o.open(7);
        o.open(8);
        o.mark_removed(8);
        let (removed, mut all) = o.take_all();
        all.sort_unstable();
        assert_eq!((removed, all), (vec![8], vec![7, 8]));
        assert!(matches!(o.close(7), Err(Error::BadHandle)));
    }
}
