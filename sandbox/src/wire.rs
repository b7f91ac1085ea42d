//! The packets between the supervisor and a session's context: one
//! postcard message per `SOCK_SEQPACKET` packet, with descriptors as
//! `SCM_RIGHTS`.

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;

/// Largest packet: a spec's argv and environment are at most 256 KiB.
pub(crate) const MAX_PACKET: usize = 1 << 20;
/// Most descriptors in one packet (the kernel's `SCM_MAX_FD`).
pub(crate) const MAX_FDS: usize = 253;

/// A connected pair, both ends close-on-exec, the first able to send
/// [`MAX_PACKET`] bytes at once.
pub(crate) fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let (a, b) = rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )?;
    // A Unix socket's packet is bounded by its sender's buffer (beyond
    // `net.core.wmem_max` only with CAP_NET_ADMIN, which the supervisor has).
    if rustix::net::sockopt::set_socket_send_buffer_size_force(&a, 2 * MAX_PACKET).is_err() {
        rustix::net::sockopt::set_socket_send_buffer_size(&a, 2 * MAX_PACKET)?;
    }
    Ok((a, b))
}

pub(crate) fn send(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if bytes.len() > MAX_PACKET || fds.len() > MAX_FDS {
        return Err(io::Error::other(format!(
            "a message of {} bytes and {} descriptors is too large",
            bytes.len(),
            fds.len()
        )));
    }
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("no room for the descriptors"));
    }
    let n = rustix::net::sendmsg(
        sock,
        &[IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if n != bytes.len() {
        return Err(io::Error::other("short send"));
    }
    Ok(())
}

/// One packet into `buf` (resized to it) with its descriptors; `None` at
/// end of stream (the other end is closed).
///
/// The packet's size is peeked first, so that only that much of `buf` is
/// zeroed: zeroing [`MAX_PACKET`] bytes for every packet cost a context,
/// whose pages a run's PID 1 just forked from it still shares, a copy of
/// every page of the buffer for each run it starts.
pub(crate) fn recv(sock: BorrowedFd<'_>, buf: &mut Vec<u8>) -> io::Result<Option<Vec<OwnedFd>>> {
    // With MSG_TRUNC a Unix packet socket says the packet's whole length.
    let size = loop {
        match rustix::net::recv(sock, &mut [0u8; 0], RecvFlags::PEEK | RecvFlags::TRUNC) {
            Err(rustix::io::Errno::INTR) => continue,
            r => break r?.1,
        }
    };
    // One byte more than allowed: a larger packet is then said truncated.
    buf.resize(size.min(MAX_PACKET + 1), 0);
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = loop {
        match rustix::net::recvmsg(
            sock.as_fd(),
            &mut [IoSliceMut::new(buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Err(rustix::io::Errno::INTR) => continue,
            r => break r?,
        }
    };
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = m {
            fds.extend(rights);
        }
    }
    if msg
        .flags
        .intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC)
    {
        return Err(io::Error::other("a truncated message"));
    }
    if msg.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    buf.truncate(msg.bytes);
    Ok(Some(fds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_carry_bytes_and_descriptors_and_end_at_close() {
        let (a, b) = pair().unwrap();
        let (r, w) = rustix::pipe::pipe().unwrap();
        send(a.as_fd(), b"hello", &[r.as_fd(), w.as_fd()]).unwrap();
        let mut buf = Vec::new();
        let fds = recv(b.as_fd(), &mut buf).unwrap().unwrap();
        assert_eq!(buf, b"hello");
        assert_eq!(fds.len(), 2);
        rustix::io::write(&fds[1], b"x").unwrap();
        let mut one = [0u8; 1];
        assert_eq!(rustix::io::read(&r, &mut one).unwrap(), 1);
        // A large packet arrives whole.
        let big = vec![7u8; 100 << 10];
        send(a.as_fd(), &big, &[]).unwrap();
        assert!(recv(b.as_fd(), &mut buf).unwrap().unwrap().is_empty());
        assert_eq!(buf, big);
        // A small one after it: the buffer is its size, not the last one's.
        send(a.as_fd(), b"hi", &[]).unwrap();
        assert!(recv(b.as_fd(), &mut buf).unwrap().unwrap().is_empty());
        assert_eq!(buf, b"hi");
        // Descriptors without bytes arrive, and are not the end.
        send(a.as_fd(), b"", &[r.as_fd()]).unwrap();
        let fds = recv(b.as_fd(), &mut buf).unwrap().unwrap();
        assert_eq!((buf.len(), fds.len()), (0, 1));
        // A packet over the limit (sent around `send`'s check) is refused
        // as truncated, and the next one still arrives whole.
        let over = vec![1u8; MAX_PACKET + 10];
        rustix::net::send(&a, &over, SendFlags::empty()).unwrap();
        let e = recv(b.as_fd(), &mut buf).unwrap_err();
        assert!(e.to_string().contains("truncated"), "{e}");
        send(a.as_fd(), b"after", &[]).unwrap();
        recv(b.as_fd(), &mut buf).unwrap().unwrap();
        assert_eq!(buf, b"after");
        drop(a);
        assert!(recv(b.as_fd(), &mut buf).unwrap().is_none());
    }
}
