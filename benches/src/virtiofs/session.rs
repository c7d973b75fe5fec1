//! Synchronous FUSE requests over one virtqueue: one request in flight, the
//! request gathered from two buffers (header, arguments) and the reply
//! scattered over two (out header, payload), as the Linux driver lays them out.

use std::sync::Arc;
use std::time::Duration;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::device::Device;
use super::error::{HarnessError, Result};
use super::virtqueue::{RawDescriptor, SplitQueue};
use super::wire::{
    self, DirEntryPlus, EntryOut, IN_HEADER_LEN, InitOut, OUT_HEADER_LEN, Reply, opcode,
};

/// How long a single request may take before the harness gives up.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A FUSE client on one virtqueue.
#[derive(Debug)]
pub struct FuseQueue {
    queue: SplitQueue,
    mem: Arc<GuestMemoryMmap>,
    request: GuestAddress,
    request_cap: u32,
    reply: GuestAddress,
    reply_cap: u32,
    next_unique: u64,
}

impl FuseQueue {
    /// Takes queue `index` from `device` with buffers for requests and replies
    /// of up to `max_io` payload bytes.
    pub fn new(device: &mut Device, index: usize, max_io: u32) -> Result<Self> {
        let request_cap = max_io + 4096;
        let reply_cap = max_io + 4096;
        let request = device.alloc(u64::from(request_cap))?;
        let reply = device.alloc(u64::from(reply_cap))?;
        let mem = device.memory().memory().clone();
        let queue = device.take_queue(index).ok_or(HarnessError::QueueFull(0))?;
        Ok(FuseQueue {
            queue,
            mem,
            request,
            request_cap,
            reply,
            reply_cap,
            next_unique: (index as u64) << 48 | 1,
        })
    }

    /// Gives the queue back, for driving it directly.
    pub fn into_queue(self) -> SplitQueue {
        self.queue
    }

    /// Guest address and size of the request buffer, for hand-made chains.
    pub fn request_buffer(&self) -> (GuestAddress, u32) {
        (self.request, self.request_cap)
    }

    /// Guest address and size of the reply buffer, for hand-made chains.
    pub fn reply_buffer(&self) -> (GuestAddress, u32) {
        (self.reply, self.reply_cap)
    }

    /// The shared memory.
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    /// The next unique id.
    pub fn unique(&mut self) -> u64 {
        let unique = self.next_unique;
        self.next_unique += 1;
        unique
    }

    /// Sends `opcode` on `nodeid` with `args` and waits for the reply.
    pub fn call(&mut self, opcode: u32, nodeid: u64, args: &[u8]) -> Result<Reply> {
        self.call_with_room(opcode, nodeid, args, self.reply_cap)
    }

    /// Like [`call`](Self::call), offering exactly `reply_room` bytes for the
    /// reply, as the Linux driver sizes READ replies to the bytes asked for.
    pub fn call_with_room(
        &mut self,
        opcode: u32,
        nodeid: u64,
        args: &[u8],
        reply_room: u32,
    ) -> Result<Reply> {
        let unique = self.unique();
        let request = wire::request(opcode, unique, nodeid, args);
        let reply = self.call_raw(opcode, &request, reply_room)?;
        if reply.unique != unique {
            return Err(HarnessError::BadReply {
                opcode,
                why: format!("unique {} instead of {unique}", reply.unique),
            });
        }
        Ok(reply)
    }

    /// Sends the bytes of `request` as they are and waits for a reply of up
    /// to `reply_room` bytes.
    pub fn call_raw(&mut self, opcode: u32, request: &[u8], reply_room: u32) -> Result<Reply> {
        let written = self.send_raw(request, reply_room)?;
        let bytes = self.read_reply(written)?;
        Reply::parse(opcode, &bytes)
    }

    /// Sends the bytes of `request` and returns how many reply bytes the
    /// device wrote (zero for requests without a reply).
    pub fn send_raw(&mut self, request: &[u8], reply_room: u32) -> Result<u32> {
        if request.len() > self.request_cap as usize || reply_room > self.reply_cap {
            return Err(HarnessError::OutOfGuestMemory(request.len() as u64));
        }
        self.mem.write_slice(request, self.request)?;
        let split = request.len().min(IN_HEADER_LEN);
        let mut readable = vec![(self.request, split as u32)];
        if request.len() > split {
            readable.push((
                GuestAddress(self.request.0 + split as u64),
                (request.len() - split) as u32,
            ));
        }
        let mut writable = Vec::new();
        if reply_room > 0 {
            let head = reply_room.min(OUT_HEADER_LEN as u32);
            writable.push((self.reply, head));
            if reply_room > head {
                writable.push((
                    GuestAddress(self.reply.0 + u64::from(head)),
                    reply_room - head,
                ));
            }
        }
        self.queue.add(&readable, &writable)?;
        self.queue.publish()?;
        let (_, written) = self.queue.wait_used(REQUEST_TIMEOUT)?;
        Ok(written)
    }

    /// Sends a hand-made chain and returns how many bytes the device says it
    /// wrote.
    pub fn send_chain(&mut self, descs: &[RawDescriptor]) -> Result<u32> {
        self.queue.add_raw(descs)?;
        self.queue.publish()?;
        let (_, written) = self.queue.wait_used(REQUEST_TIMEOUT)?;
        Ok(written)
    }

    /// Reads `len` reply bytes from the reply buffer.
    pub fn read_reply(&self, len: u32) -> Result<Vec<u8>> {
        let len = len.min(self.reply_cap);
        let mut bytes = vec![0u8; len as usize];
        self.mem.read_slice(&mut bytes, self.reply)?;
        Ok(bytes)
    }

    /// FUSE_INIT.
    pub fn init(&mut self) -> Result<InitOut> {
        let payload = self
            .call(opcode::INIT, 0, &wire::init_in(1 << 20))?
            .ok(opcode::INIT)?;
        InitOut::parse(&payload)
    }

    /// FUSE_LOOKUP of `name` in `parent`.
    pub fn lookup(&mut self, parent: u64, name: &[u8]) -> Result<EntryOut> {
        let args = wire::Encoder::new().name(name).finish();
        let payload = self
            .call(opcode::LOOKUP, parent, &args)?
            .ok(opcode::LOOKUP)?;
        EntryOut::decode(&mut wire::Decoder::new(opcode::LOOKUP, &payload))
    }

    /// FUSE_MKDIR of `name` in `parent`.
    pub fn mkdir(&mut self, parent: u64, name: &[u8], mode: u32) -> Result<EntryOut> {
        let args = wire::Encoder::new().u32(mode).u32(0).name(name).finish();
        let payload = self.call(opcode::MKDIR, parent, &args)?.ok(opcode::MKDIR)?;
        EntryOut::decode(&mut wire::Decoder::new(opcode::MKDIR, &payload))
    }

    /// FUSE_RMDIR of `name` in `parent`.
    pub fn rmdir(&mut self, parent: u64, name: &[u8]) -> Result<()> {
        let args = wire::Encoder::new().name(name).finish();
        self.call(opcode::RMDIR, parent, &args)?
            .ok(opcode::RMDIR)
            .map(drop)
    }

    /// FUSE_GETATTR.
    pub fn getattr(&mut self, nodeid: u64) -> Result<wire::Attr> {
        let payload = self
            .call(opcode::GETATTR, nodeid, &wire::getattr_in())?
            .ok(opcode::GETATTR)?;
        wire::parse_attr_out(&payload)
    }

    /// FUSE_OPEN; returns the file handle.
    pub fn open(&mut self, nodeid: u64, flags: u32) -> Result<u64> {
        let payload = self
            .call(opcode::OPEN, nodeid, &wire::open_in(flags))?
            .ok(opcode::OPEN)?;
        wire::parse_open_out(opcode::OPEN, &payload)
    }

    /// FUSE_CREATE; returns the new entry and its file handle.
    pub fn create(
        &mut self,
        parent: u64,
        name: &[u8],
        flags: u32,
        mode: u32,
    ) -> Result<(EntryOut, u64)> {
        let payload = self
            .call(opcode::CREATE, parent, &wire::create_in(name, flags, mode))?
            .ok(opcode::CREATE)?;
        let mut d = wire::Decoder::new(opcode::CREATE, &payload);
        let entry = EntryOut::decode(&mut d)?;
        let fh = d.u64()?;
        Ok((entry, fh))
    }

    /// FUSE_READ of `size` bytes at `offset`.
    pub fn read(&mut self, nodeid: u64, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let room = size
            .checked_add(OUT_HEADER_LEN as u32)
            .filter(|&room| room <= self.reply_cap)
            .ok_or(HarnessError::OutOfGuestMemory(u64::from(size)))?;
        self.call_with_room(opcode::READ, nodeid, &wire::read_in(fh, offset, size), room)?
            .ok(opcode::READ)
    }

    /// FUSE_WRITE of `data` at `offset`; returns the bytes written.
    pub fn write(&mut self, nodeid: u64, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        let payload = self
            .call(opcode::WRITE, nodeid, &wire::write_in(fh, offset, data))?
            .ok(opcode::WRITE)?;
        wire::parse_write_out(&payload)
    }

    /// FUSE_FLUSH.
    pub fn flush(&mut self, nodeid: u64, fh: u64) -> Result<()> {
        self.call(opcode::FLUSH, nodeid, &wire::flush_in(fh))?
            .ok(opcode::FLUSH)
            .map(drop)
    }

    /// FUSE_RELEASE.
    pub fn release(&mut self, nodeid: u64, fh: u64) -> Result<()> {
        self.call(opcode::RELEASE, nodeid, &wire::release_in(fh, 0))?
            .ok(opcode::RELEASE)
            .map(drop)
    }

    /// FUSE_OPENDIR; returns the directory handle.
    pub fn opendir(&mut self, nodeid: u64) -> Result<u64> {
        let payload = self
            .call(opcode::OPENDIR, nodeid, &wire::open_in(0))?
            .ok(opcode::OPENDIR)?;
        wire::parse_open_out(opcode::OPENDIR, &payload)
    }

    /// FUSE_READDIRPLUS from `offset`, up to `size` bytes of entries.
    pub fn readdirplus(
        &mut self,
        nodeid: u64,
        fh: u64,
        offset: u64,
        size: u32,
    ) -> Result<Vec<DirEntryPlus>> {
        let payload = self
            .call(
                opcode::READDIRPLUS,
                nodeid,
                &wire::read_in(fh, offset, size),
            )?
            .ok(opcode::READDIRPLUS)?;
        wire::parse_readdirplus(&payload)
    }

    /// FUSE_RELEASEDIR.
    pub fn releasedir(&mut self, nodeid: u64, fh: u64) -> Result<()> {
        self.call(opcode::RELEASEDIR, nodeid, &wire::release_in(fh, 0))?
            .ok(opcode::RELEASEDIR)
            .map(drop)
    }

    /// FUSE_FORGET (no reply; the device hands the chain back empty).
    pub fn forget(&mut self, nodeid: u64, nlookup: u64) -> Result<u32> {
        let unique = self.unique();
        let request = wire::request(opcode::FORGET, unique, nodeid, &wire::forget_in(nlookup));
        self.send_raw(&request, 0)
    }
}
