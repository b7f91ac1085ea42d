//! A terminal run's terminal, as the supervisor holds it: the master side
//! (which never appears inside the sandbox), the output it wrote most
//! recently for those who attach, and the followers of its output.
//!
//! The run's output reader is the only reader of the master; it records
//! each piece here ([`Terminal::record`]) before passing it on, and an
//! attach takes the recent output and starts following under the same
//! lock, so a follower sees every byte once, in order.

use allox_protocol::{Bytes, ProcessAttach};
use rustix::fd::OwnedFd;
use std::collections::VecDeque;
use std::io;
use std::sync::Mutex;
use tokio::io::unix::AsyncFd;
use tokio::sync::broadcast;

/// Pieces of output a follower may fall behind by before it misses some.
const FOLLOW_BACKLOG: usize = 1024;

pub(crate) struct Terminal {
    master: AsyncFd<OwnedFd>,
    recent: Mutex<Recent>,
    /// The last byte typed into it (a newline before anything is).
    last_typed: std::sync::atomic::AtomicU8,
}

struct Recent {
    bytes: VecDeque<u8>,
    followers: broadcast::Sender<Bytes>,
}

impl Terminal {
    /// Takes the master side of a run's terminal (made non-blocking).
    pub fn new(master: OwnedFd) -> io::Result<Terminal> {
        rustix::io::ioctl_fionbio(&master, true)?;
        let (followers, _) = broadcast::channel(FOLLOW_BACKLOG);
        // The descriptor is an OwnedFd moved in, so the I/O-safety concern
        // behind the deprecation does not apply.
        #[allow(deprecated)]
        let master = AsyncFd::new(master)?;
        Ok(Terminal {
            master,
            recent: Mutex::new(Recent {
                bytes: VecDeque::new(),
                followers,
            }),
            last_typed: std::sync::atomic::AtomicU8::new(b'\n'),
        })
    }

    /// Reads what the program wrote; 0 once no process holds the
    /// terminal any more (the master then reads `EIO`).
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut ready = self.master.readable().await?;
            match ready
                .try_io(|m| rustix::io::read(m.get_ref(), &mut *buf).map_err(io::Error::from))
            {
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
                Ok(r) => return r,
                Err(_would_block) => continue,
            }
        }
    }

    /// What can be read now, without waiting (0 when nothing).
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match rustix::io::read(self.master.get_ref(), buf) {
            Ok(n) => Ok(n),
            Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::IO) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    /// Types `data` into the terminal, as a person at its keyboard would.
    pub async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        if let Some(&b) = data.last() {
            self.last_typed
                .store(b, std::sync::atomic::Ordering::Relaxed);
        }
        while !data.is_empty() {
            let mut ready = self.master.writable().await?;
            match ready.try_io(|m| rustix::io::write(m.get_ref(), data).map_err(io::Error::from)) {
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    /// What closing a terminal run's stdin types: the terminal's
    /// end-of-file character (`^D` unless the program changed it), twice
    /// when a line has been begun and the terminal reads lines (the first
    /// only hands the program the line as it stands, as a person presses
    /// `^D` twice at a shell), once otherwise.
    pub fn end_of_input(&self) -> Vec<u8> {
        use rustix::termios::{LocalModes, SpecialCodeIndex};
        let Ok(t) = rustix::termios::tcgetattr(self.master.get_ref()) else {
            return vec![4];
        };
        let eof = t.special_codes[SpecialCodeIndex::VEOF];
        let last = self.last_typed.load(std::sync::atomic::Ordering::Relaxed);
        let ends_line = [
            b'\n',
            b'\r',
            eof,
            t.special_codes[SpecialCodeIndex::VEOL],
            t.special_codes[SpecialCodeIndex::VEOL2],
        ]
        .contains(&last);
        if t.local_modes.contains(LocalModes::ICANON) && !ends_line {
            vec![eof, eof]
        } else {
            vec![eof]
        }
    }

    /// A new size; the kernel sends `SIGWINCH` to the terminal's
    /// foreground processes.
    pub fn resize(&self, rows: u16, cols: u16) -> io::Result<()> {
        rustix::termios::tcsetwinsize(
            self.master.get_ref(),
            rustix::termios::Winsize {
                ws_row: rows,
                ws_col: cols,
                ws_xpixel: 0,
                ws_ypixel: 0,
            },
        )
        .map_err(io::Error::from)
    }

    /// Keeps `data` among the recent output and passes it to followers.
    pub fn record(&self, data: &[u8]) {
        let mut r = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        r.bytes.extend(data);
        let over = r.bytes.len().saturating_sub(ProcessAttach::REPLAY_MAX);
        r.bytes.drain(..over);
        if r.followers.receiver_count() > 0 {
            let _ = r.followers.send(Bytes(data.to_vec()));
        }
    }

    /// The recent output, and a follower of what comes after it.
    pub fn follow(&self) -> (Vec<u8>, broadcast::Receiver<Bytes>) {
        let r = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        (r.bytes.iter().copied().collect(), r.followers.subscribe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn recent_output_is_bounded_and_followers_see_what_comes_after() {
        let master = rustix::pty::openpt(rustix::pty::OpenptFlags::RDWR).unwrap();
        let t = Terminal::new(master).unwrap();
        t.record(&vec![b'a'; ProcessAttach::REPLAY_MAX]);
        t.record(b"tail");
        let (recent, mut rx) = t.follow();
        assert_eq!(recent.len(), ProcessAttach::REPLAY_MAX);
        assert!(recent.ends_with(b"tail"));
        assert_eq!(recent[0], b'a');
        t.record(b"next");
        assert_eq!(rx.recv().await.unwrap().0, b"next");
        assert!(rx.try_recv().is_err());
    }
}
