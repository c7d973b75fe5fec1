//! The bridge to the `fuse` crate: requests taken off a virtqueue go to its
//! [`Dispatcher`], replies go straight into the guest's writable buffers.

use std::cell::RefCell;
use std::io::{self, Write};

use sluice_fuse::WriteSource;
use sluice_fuse::{
    Dispatcher, Filesystem, Fragment, Outcome, ReadDest, ReadReply, ReplyHead, ReplySink, Scratch,
};

use crate::RequestHandler;
use crate::descriptor::{Mark, Writer};
use crate::frame::{OUT_HEADER_LEN, error_reply, out_header};

/// Serves a [`Filesystem`] to the guest: decodes each request with the
/// `fuse` crate and dispatches it.
#[derive(Debug)]
pub struct FuseHandler<F> {
    dispatcher: Dispatcher<F>,
}

thread_local! {
    /// Reply buffers of the thread answering: a queue's worker, or a waiter
    /// answering a request that waited. Per thread, so a waiter holding a
    /// request for the length of an object-store GET never holds up the
    /// worker.
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::new());
}

impl<F: Filesystem> FuseHandler<F> {
    /// A handler serving `dispatcher`'s file system.
    pub fn new(dispatcher: Dispatcher<F>) -> Self {
        FuseHandler { dispatcher }
    }

    /// The dispatcher, e.g. to shut the session down when the device stops.
    pub fn dispatcher(&self) -> &Dispatcher<F> {
        &self.dispatcher
    }
}

impl<F: Filesystem + 'static> RequestHandler for FuseHandler<F> {
    /// Decodes `request` with a WRITE's data left in `data` (guest memory)
    /// and dispatches it: the file system takes the data from the guest's
    /// descriptors straight into its write buffer.
    fn handle(
        &self,
        _queue: u16,
        request: &[u8],
        data: &mut dyn WriteSource,
        reply: &mut Writer<'_>,
    ) -> io::Result<()> {
        let mut sink = GuestReply {
            w: reply,
            read: None,
        };
        let outcome = SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => self
                .dispatcher
                .handle_split(request, data, &mut scratch, &mut sink),
            // Never nested on one thread; were it, fresh buffers are right.
            Err(_) => self
                .dispatcher
                .handle_split(request, data, &mut Scratch::new(), &mut sink),
        })?;
        if outcome == Outcome::Destroyed {
            log::info!("the guest ended the FUSE session (DESTROY)");
        }
        Ok(())
    }

    /// Ends the FUSE session: the file system flushes and closes, whether or
    /// not the guest sent DESTROY before it went away.
    fn connection_closed(&self) {
        self.dispatcher.shutdown();
    }
}

/// A reply written into the request's writable descriptors.
struct GuestReply<'r, 'm> {
    w: &'r mut Writer<'m>,
    /// The READ being answered: its id and where its header goes.
    read: Option<(u64, Mark)>,
}

impl ReplySink for GuestReply<'_, '_> {
    /// Writes the reply into the guest's buffers. A reply larger than the room
    /// the guest gave is replaced by an `EIO` reply, never written in part.
    fn send(&mut self, head: &ReplyHead, payload: &[u8]) -> io::Result<()> {
        let head_bytes = head.as_bytes();
        let total = head_bytes.len().saturating_add(payload.len());
        let room = self.w.available_bytes();
        if total > room {
            let unique = head.header().unique;
            if room >= OUT_HEADER_LEN {
                self.w.write_all(&error_reply(libc::EIO, unique))?;
            }
            return Err(io::Error::other(format!(
                "a {total}-byte reply does not fit the {room} bytes the guest offered"
            )));
        }
        self.w.write_all(head_bytes)?;
        self.w.write_all(payload)
    }

    /// Places READ data straight into the guest's buffers: each cached
    /// block range is copied once, by the `simd` kernel, from the engine's
    /// cache into guest memory; a range of a local object file is read by
    /// the kernel straight into guest memory (pread into each guest
    /// buffer, or O_DIRECT / io_uring as `--guest-io` routes it); holes are
    /// zero-filled there. The header, whose length depends on how much was
    /// read, is written last, into the room kept for it. When the room
    /// cannot hold a full-size reply the dispatcher's buffered path answers
    /// instead (it knows the real length, and `send` answers EIO if even
    /// that does not fit).
    fn read_reply(&mut self, unique: u64, size: usize) -> io::Result<Option<&mut dyn ReadReply>> {
        if self.w.available_bytes() < OUT_HEADER_LEN.saturating_add(size) {
            return Ok(None);
        }
        let start = self.w.mark();
        self.w.write_zeros(OUT_HEADER_LEN)?;
        self.read = Some((unique, start));
        Ok(Some(self))
    }
}

impl ReadDest for GuestReply<'_, '_> {
    fn put(&mut self, frag: Fragment<'_>) -> sluice_api::Result<()> {
        let put = match frag {
            Fragment::Zeros(n) => self.w.write_zeros(n),
            Fragment::Data(d) => self.w.write_copy(d),
            Fragment::File {
                file,
                off,
                len,
                crcs: None,
            } => self.w.write_from_file(file, off, len),
            // A disk-cache file: checked where it landed, in guest memory.
            Fragment::File {
                file,
                off,
                len,
                crcs: Some(crcs),
            } => return self.w.write_from_file_checked(file, off, len, crcs),
        };
        put.map_err(|e| {
            if e.kind() == io::ErrorKind::WouldBlock {
                // A file range not in the page cache, on a worker that
                // must not wait for the disk (`sluice_api::wait`).
                return sluice_api::Error::WouldBlock;
            }
            sluice_api::Error::Io(io::Error::new(
                e.kind(),
                format!("writing READ data into guest memory: {e}"),
            ))
        })
    }
}

impl ReadReply for GuestReply<'_, '_> {
    fn finish(&mut self, read: sluice_api::Result<usize>) -> io::Result<sluice_api::Result<usize>> {
        let Some((unique, start)) = self.read.take() else {
            return Err(io::Error::other("a READ reply finished twice"));
        };
        match read {
            Ok(n) => {
                let len = u32::try_from(OUT_HEADER_LEN + n).map_err(io::Error::other)?;
                self.w.write_at(start, &out_header(len, 0, unique))?;
                Ok(Ok(n))
            }
            Err(e) => {
                self.w.rewind(start);
                Ok(Err(e))
            }
        }
    }
}
