//! Descriptors a client passes with its requests (`SCM_RIGHTS` over the
//! daemon's Unix socket), for `fs.upload_local` and `fs.download_local`.
//!
//! The connection's reader takes them with the bytes they came with and
//! keeps at most [`MAX_WAITING`] for the requests that use them; more are
//! closed at once, so a client that floods descriptors holds no more than
//! that many open in the daemon. A request that uses one takes the oldest.
//! The request's handler, on its blocking thread, finds it with [`take`]
//! inside [`with`].

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
use tokio::io::{AsyncRead, Interest, ReadBuf};
use tokio::net::unix::OwnedReadHalf;

/// Descriptors kept for requests not read yet, per connection.
pub const MAX_WAITING: usize = 4;

/// The descriptors a connection's client passed, oldest first.
#[derive(Clone, Default)]
pub struct Passed(Arc<Mutex<VecDeque<OwnedFd>>>);

impl Passed {
    fn keep(&self, fd: OwnedFd) {
        let mut q = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() < MAX_WAITING {
            q.push_back(fd);
        }
    }

    /// The oldest descriptor not taken yet.
    pub fn oldest(&self) -> Option<OwnedFd> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).pop_front()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// A Unix socket's read half that keeps the descriptors passed with its
/// bytes.
pub struct Reader {
    half: OwnedReadHalf,
    passed: Passed,
}

impl Reader {
    pub fn new(half: OwnedReadHalf) -> (Reader, Passed) {
        let passed = Passed::default();
        (
            Reader {
                half,
                passed: passed.clone(),
            },
            passed,
        )
    }
}

impl AsyncRead for Reader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        loop {
            ready!(this.half.as_ref().poll_read_ready(cx))?;
            let stream = this.half.as_ref();
            let got = stream.try_io(Interest::READABLE, || {
                let mut space =
                    [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_WAITING))];
                let mut control = RecvAncillaryBuffer::new(&mut space);
                // Already initialised where the caller's buffer is (the
                // server reads into a zeroed one): no cost.
                let bytes = buf.initialize_unfilled();
                let r = rustix::net::recvmsg(
                    stream.as_fd(),
                    &mut [IoSliceMut::new(bytes)],
                    &mut control,
                    RecvFlags::CMSG_CLOEXEC,
                )
                .map_err(std::io::Error::from)?;
                for m in control.drain() {
                    if let RecvAncillaryMessage::ScmRights(fds) = m {
                        for fd in fds {
                            this.passed.keep(fd);
                        }
                    }
                }
                Ok(r.bytes)
            });
            match got {
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// Set once the connection's client has gone (its socket read to the
/// end).
pub type Gone = Arc<std::sync::atomic::AtomicBool>;

thread_local! {
    static PASSED: RefCell<(Option<OwnedFd>, Option<Gone>)> = const { RefCell::new((None, None)) };
}

/// Runs `f` with `fd` as the descriptor of the request it answers (on
/// this thread), and `gone` to tell whether its client is still there;
/// a descriptor `f` did not take is closed after.
pub fn with<T>(fd: Option<OwnedFd>, gone: Gone, f: impl FnOnce() -> T) -> T {
    PASSED.with(|p| *p.borrow_mut() = (fd, Some(gone)));
    let out = f();
    PASSED.with(|p| *p.borrow_mut() = (None, None));
    out
}

/// The flag that tells whether the client of the request being answered
/// has gone, to keep past the request (`None` outside one).
pub fn current_gone() -> Option<Gone> {
    PASSED.with(|p| p.borrow().1.clone())
}

/// Whether the client of the request being answered has gone: a copy
/// from its descriptor is then dropped rather than put in place, as a
/// framed upload whose client is killed is never committed.
pub fn client_gone() -> bool {
    PASSED.with(|p| {
        p.borrow()
            .1
            .as_ref()
            .is_some_and(|g| g.load(std::sync::atomic::Ordering::SeqCst))
    })
}

/// The descriptor that came with the request being answered, if any.
pub fn take() -> Option<OwnedFd> {
    PASSED.with(|p| p.borrow_mut().0.take())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    use std::io::IoSlice;
    use std::os::fd::BorrowedFd;
    use tokio::io::AsyncReadExt;

    fn send(s: &std::os::unix::net::UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(8))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
        rustix::net::sendmsg(s, &[IoSlice::new(bytes)], &mut control, SendFlags::empty()).unwrap();
    }

    #[tokio::test]
    async fn passed_descriptors_are_kept_with_their_bytes_up_to_the_budget() {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        theirs.set_nonblocking(true).unwrap();
        let (r, _w) = tokio::net::UnixStream::from_std(theirs)
            .unwrap()
            .into_split();
        let (mut reader, passed) = Reader::new(r);
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        send(&ours, b"one", &[f.as_fd()]);
        let mut buf = [0u8; 16];
        let n = reader.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"one");
        assert_eq!(passed.len(), 1);
        // Eight at once and more: no more than the budget stay open.
        for _ in 0..3 {
            send(&ours, b"x", &[f.as_fd(); 8]);
            let _ = reader.read(&mut buf).await.unwrap();
        }
        assert_eq!(passed.len(), MAX_WAITING);
        let fd = passed.oldest().unwrap();
        let st = rustix::fs::fstat(&fd).unwrap();
        assert_eq!(st.st_ino, rustix::fs::fstat(&f).unwrap().st_ino);
        assert_eq!(passed.len(), MAX_WAITING - 1);
        // Plain bytes still read.
        rustix::io::write(&ours, b"plain").unwrap();
        let n = reader.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"plain");
    }

    #[test]
    fn a_handler_takes_the_descriptor_once_and_one_left_is_closed() {
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        let gone = Gone::default();
        let got = with(Some(f.into()), gone.clone(), || {
            (take().is_some(), take().is_none(), client_gone())
        });
        assert_eq!(got, (true, true, false));
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        gone.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(with(Some(f.into()), gone, client_gone));
        assert!(take().is_none() && !client_gone());
    }
}
