//! Which cgroup a local TCP socket belongs to, asked of the kernel through
//! `NETLINK_SOCK_DIAG` (`inet_diag`): how the broker tells which run of a
//! session opened a connection to the session's proxy (each run has a
//! cgroup of its own; a socket keeps the cgroup v2 of the process that made
//! it, `INET_DIAG_CGROUP_ID`, Linux 5.9 and later).
//!
//! A netlink socket answers about the network namespace it was made in:
//! make it inside the session's namespace, beside the proxy's listener.

use rustix::fd::OwnedFd;
use rustix::net::{netlink, AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};
use std::io;
use std::net::SocketAddrV4;
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 1;
const NLMSG_HDRLEN: usize = 16;
/// `struct inet_diag_msg`: family, state, timer, retrans, the socket id
/// (48 bytes), expires, rqueue, wqueue, uid, inode.
const INET_DIAG_MSG_LEN: usize = 72;
const INET_DIAG_CGROUP_ID: u16 = 21;
const AF_INET: u8 = 2;
const IPPROTO_TCP: u8 = 6;

/// How long a lookup waits for the kernel's answer; past it the
/// connection is recorded without its run (a late answer is recognised by
/// its sequence number and skipped).
pub const ANSWER_WITHIN: Duration = Duration::from_millis(200);

/// A `NETLINK_SOCK_DIAG` socket of the namespace it was made in. It asks
/// one question at a time, each with a sequence number of its own, and
/// takes as the answer only the message carrying that number; waiting for
/// it never blocks a thread (the socket is non-blocking, driven by the
/// runtime's readiness).
pub struct SockDiag {
    state: tokio::sync::Mutex<State>,
}

struct State {
    /// Made non-blocking in the namespace; registered with the runtime
    /// at the first question (making it needs no runtime).
    fd: Option<OwnedFd>,
    registered: Option<AsyncFd<OwnedFd>>,
    seq: u32,
}

impl SockDiag {
    /// In the calling thread's network namespace.
    pub fn new() -> io::Result<SockDiag> {
        let fd = rustix::net::socket_with(
            AddressFamily::NETLINK,
            SocketType::DGRAM,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            Some(netlink::SOCK_DIAG),
        )?;
        Ok(SockDiag {
            state: tokio::sync::Mutex::new(State {
                fd: Some(fd),
                registered: None,
                seq: 0,
            }),
        })
    }

    /// The cgroup id of the TCP socket whose local end is `local` and
    /// remote end `remote`; `None` when the kernel knows no such socket,
    /// does not say (an older kernel) or does not answer within
    /// [`ANSWER_WITHIN`].
    pub async fn cgroup_of(
        &self,
        local: SocketAddrV4,
        remote: SocketAddrV4,
    ) -> io::Result<Option<u64>> {
        // One question at a time: the next waits for this one's answer
        // (or its timeout, which drops the guard).
        let mut st = self.state.lock().await;
        if st.registered.is_none() {
            let fd = st.fd.take().ok_or_else(|| io::Error::other("no socket"))?;
            // Deprecated because a borrowed descriptor could be closed
            // while registered; this one is owned by the registration.
            #[allow(deprecated)]
            let registered = AsyncFd::with_interest(fd, Interest::READABLE)?;
            st.registered = Some(registered);
        }
        st.seq = st.seq.wrapping_add(1);
        let seq = st.seq;
        let Some(fd) = st.registered.as_ref() else {
            return Err(io::Error::other("no socket"));
        };
        let req = request(seq, local, remote);
        // A datagram to the kernel: it takes it whole or fails.
        rustix::net::send(fd.get_ref(), &req, SendFlags::DONTWAIT)?;
        let answer = async {
            let mut buf = vec![0u8; 8192];
            loop {
                let mut ready = fd.readable().await?;
                let n = match ready.try_io(|fd| {
                    rustix::net::recv(fd.get_ref(), &mut buf, RecvFlags::DONTWAIT)
                        .map(|(n, _)| n)
                        .map_err(io::Error::from)
                }) {
                    Ok(Ok(n)) => n,
                    Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Ok(Err(e)) => return Err(e),
                    Err(_would_block) => continue,
                };
                // An answer to an earlier question (one that timed out)
                // is not this one's.
                if u32_at(&buf[..n], 8) == Some(seq) {
                    return Ok(parse(&buf[..n]));
                }
            }
        };
        match tokio::time::timeout(ANSWER_WITHIN, answer).await {
            Ok(r) => r,
            Err(_) => Ok(None),
        }
    }
}

/// The `SOCK_DIAG_BY_FAMILY` question about one TCP socket, numbered
/// `seq`.
fn request(seq: u32, local: SocketAddrV4, remote: SocketAddrV4) -> Vec<u8> {
    let mut req = Vec::with_capacity(NLMSG_HDRLEN + 56);
    let len = (NLMSG_HDRLEN + 56) as u32;
    req.extend_from_slice(&len.to_ne_bytes());
    req.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    req.extend_from_slice(&seq.to_ne_bytes());
    // pid: the kernel.
    req.extend_from_slice(&0u32.to_ne_bytes());
    // struct inet_diag_req_v2, every state.
    req.extend_from_slice(&[AF_INET, IPPROTO_TCP, 0, 0]);
    req.extend_from_slice(&u32::MAX.to_ne_bytes());
    // struct inet_diag_sockid: ports and addresses in network order.
    req.extend_from_slice(&local.port().to_be_bytes());
    req.extend_from_slice(&remote.port().to_be_bytes());
    for a in [local.ip(), remote.ip()] {
        req.extend_from_slice(&a.octets());
        req.extend_from_slice(&[0u8; 12]);
    }
    req.extend_from_slice(&0u32.to_ne_bytes()); // interface
    req.extend_from_slice(&[0xff; 8]); // INET_DIAG_NOCOOKIE
    req
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The cgroup id in an answer to one lookup (`None` for an error answer,
/// or an answer without it).
fn parse(b: &[u8]) -> Option<u64> {
    let len = u32_at(b, 0)? as usize;
    if u16_at(b, 4)? != SOCK_DIAG_BY_FAMILY || len > b.len() {
        // An error answer: no such socket (or no inet_diag at all).
        return None;
    }
    let mut at = NLMSG_HDRLEN + INET_DIAG_MSG_LEN;
    while at + 4 <= len {
        let alen = u16_at(b, at)? as usize;
        let kind = u16_at(b, at + 2)? & 0x3fff;
        if alen < 4 {
            return None;
        }
        if kind == INET_DIAG_CGROUP_ID && alen >= 12 {
            return Some(u64::from_ne_bytes(b.get(at + 4..at + 12)?.try_into().ok()?));
        }
        at += (alen + 3) & !3;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, TcpListener, TcpStream};

    /// The cgroup v2 id (its directory's inode) of this process.
    fn my_cgroup() -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        let line = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let path = line.lines().find_map(|l| l.strip_prefix("0::"))?;
        ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
            .iter()
            .filter(|m| std::path::Path::new(m).join("cgroup.procs").exists())
            .find_map(|m| std::fs::metadata(format!("{m}{path}")).ok())
            .map(|md| md.ino())
    }

    #[tokio::test]
    async fn a_connected_socket_s_cgroup_is_its_maker_s() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let _s = l.accept().unwrap();
        let v4 = |a: std::net::SocketAddr| match a {
            std::net::SocketAddr::V4(a) => a,
            _ => unreachable!(),
        };
        let d = SockDiag::new().unwrap();
        let got = d
            .cgroup_of(v4(c.local_addr().unwrap()), v4(c.peer_addr().unwrap()))
            .await
            .unwrap();
        match my_cgroup() {
            Some(id) => assert_eq!(got, Some(id)),
            None => assert!(got.is_some(), "no cgroup id for a live socket"),
        }
        // No such socket: no answer.
        let none = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 1);
        assert_eq!(d.cgroup_of(none, none).await.unwrap(), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn questions_asked_at_once_each_get_their_own_answer() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let server = l.local_addr().unwrap();
        let v4 = |a: std::net::SocketAddr| match a {
            std::net::SocketAddr::V4(a) => a,
            _ => unreachable!(),
        };
        let mut live = Vec::new();
        for _ in 0..64 {
            let c = TcpStream::connect(server).unwrap();
            let _ = l.accept().unwrap();
            live.push(c);
        }
        let d = std::sync::Arc::new(SockDiag::new().unwrap());
        let mut asked = Vec::new();
        for (i, c) in live.iter().enumerate() {
            // Every other question is about a socket that is not there.
            let local = if i % 2 == 0 {
                v4(c.local_addr().unwrap())
            } else {
                SocketAddrV4::new(Ipv4Addr::LOCALHOST, 1)
            };
            let (d, remote) = (d.clone(), v4(server));
            asked.push(tokio::spawn(async move {
                (i, d.cgroup_of(local, remote).await.unwrap())
            }));
        }
        for a in asked {
            let (i, got) = a.await.unwrap();
            assert_eq!(got.is_some(), i % 2 == 0, "question {i} got {got:?}");
        }
    }
}
