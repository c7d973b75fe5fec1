//! The control socket: `SOCK_SEQPACKET` (one message per packet, so no
//! framing to get wrong) with at most one descriptor per packet
//! (`SCM_RIGHTS`).

use std::io;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

use crate::wire::MAX_MESSAGE;

fn seqpacket() -> io::Result<OwnedFd> {
    Ok(rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

/// A listening socket at `path`: mode 0600, or 0660 owned by `group`
/// (created with that mode, replacing what was at `path`:
/// `sluice_vhost::socket::bind_private`).
pub fn listen(path: &Path, group: Option<u32>) -> io::Result<OwnedFd> {
    sluice_vhost::socket::bind_private_with(path, group, |tmp| {
        let fd = seqpacket()?;
        rustix::net::bind(&fd, &SocketAddrUnix::new(tmp)?)?;
        rustix::net::listen(&fd, 64)?;
        Ok(fd)
    })
}

/// The next client of `listener`.
pub fn accept(listener: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    Ok(rustix::net::accept_with(listener, SocketFlags::CLOEXEC)?)
}

/// A connection to the host daemon at `path`.
pub fn connect(path: &Path) -> io::Result<OwnedFd> {
    let fd = seqpacket()?;
    rustix::net::connect(&fd, &SocketAddrUnix::new(path)?)?;
    Ok(fd)
}

/// The pid and uid of the process at the other end.
pub fn peer(fd: BorrowedFd<'_>) -> io::Result<(i32, u32)> {
    let cred = rustix::net::sockopt::socket_peercred(fd)?;
    Ok((cred.pid.as_raw_nonzero().get(), cred.uid.as_raw()))
}

/// Sends one packet, with `fd` attached when given. Blocks while the
/// peer's queue is full.
pub fn send(sock: BorrowedFd<'_>, bytes: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds;
    if let Some(fd) = fd {
        fds = [fd];
        if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(io::Error::other("no room for a descriptor"));
        }
    }
    let sent = rustix::net::sendmsg(
        sock,
        &[IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if sent != bytes.len() {
        return Err(io::Error::other("a packet went out short"));
    }
    Ok(())
}

/// One received packet.
#[derive(Debug)]
pub struct Packet {
    /// Its bytes.
    pub len: usize,
    /// The descriptor that came with it.
    pub fd: Option<OwnedFd>,
}

/// Receives one packet into `buf`. `Ok(None)`: the peer closed the
/// connection (or sent an empty packet, which the protocol has no use
/// for). A packet longer than [`MAX_MESSAGE`], or with more than one
/// descriptor, is an error (the kernel closes descriptors that did not
/// fit).
pub fn recv(sock: BorrowedFd<'_>, buf: &mut [u8; MAX_MESSAGE]) -> io::Result<Option<Packet>> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = loop {
        match rustix::net::recvmsg(
            sock,
            &mut [IoSliceMut::new(buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Err(rustix::io::Errno::INTR) => continue,
            other => break other?,
        }
    };
    let mut fd = None;
    let mut extra = false;
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = msg {
            for f in fds {
                if fd.is_none() {
                    fd = Some(f);
                } else {
                    extra = true;
                }
            }
        }
    }
    if got
        .flags
        .intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC)
        || extra
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a packet too long, or with too many descriptors",
        ));
    }
    if got.bytes == 0 {
        return Ok(None);
    }
    Ok(Some(Packet { len: got.bytes, fd }))
}

/// Ends both directions of `sock` (a thread blocked receiving on it
/// returns).
pub fn shutdown(sock: impl AsFd) {
    let _ = rustix::net::shutdown(sock, rustix::net::Shutdown::Both);
}
