//! The observer executable, as the plugin holds it: read once into a
//! sealed memory file and its sha256 checked against the pinned one; every
//! observer process is run from that file, with its conversation on its
//! standard input and its pidfd held here (the plugin keeps observers
//! waiting between runs: `take_observer`, `give_back`).

use allox_effects::observer::wire::{self, FromObserver, ToObserver};
use rustix::fd::{AsFd, AsRawFd, OwnedFd};
use sha2::{Digest, Sha256};
use std::io::{Read, Seek};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The sha256 fixed at build (`ALLOX_OBSERVE_SHA256`), if any.
pub const PINNED_AT_BUILD: Option<&str> = option_env!("ALLOX_OBSERVE_SHA256");

/// The observer's executable, sealed.
pub struct Executable {
    memfd: OwnedFd,
    pub sha256: String,
    pub path: PathBuf,
}

use allox_effects::chain::hex;

fn refuse(why: String) -> String {
    why
}

impl Executable {
    /// Reads `path` into a sealed memory file and checks it against
    /// `pinned` (hex sha256).
    pub fn load(path: &Path, pinned: &str) -> Result<Executable, String> {
        let bytes = std::fs::read(path)
            .map_err(|e| refuse(format!("read the observer {}: {e}", path.display())))?;
        let found = hex(&Sha256::digest(&bytes));
        if !found.eq_ignore_ascii_case(pinned) {
            return Err(refuse(format!(
                "the observer {} has sha256 {found}, not the pinned {pinned}",
                path.display()
            )));
        }
        let memfd = rustix::fs::memfd_create(
            "allox-observe",
            rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
        )
        .map_err(|e| refuse(format!("create the observer's memory file: {e}")))?;
        let mut f = std::fs::File::from(memfd);
        std::io::Write::write_all(&mut f, &bytes)
            .map_err(|e| refuse(format!("fill the observer's memory file: {e}")))?;
        rustix::fs::fcntl_add_seals(
            &f,
            rustix::fs::SealFlags::SEAL
                | rustix::fs::SealFlags::SHRINK
                | rustix::fs::SealFlags::GROW
                | rustix::fs::SealFlags::WRITE,
        )
        .map_err(|e| refuse(format!("seal the observer's memory file: {e}")))?;
        // What will be executed is what is checked: the sealed copy.
        f.rewind()
            .map_err(|e| refuse(format!("read the observer's memory file: {e}")))?;
        let mut again = Vec::with_capacity(bytes.len());
        f.read_to_end(&mut again)
            .map_err(|e| refuse(format!("read the observer's memory file: {e}")))?;
        let sealed = hex(&Sha256::digest(&again));
        if sealed != found {
            return Err(refuse(format!(
                "the observer's sealed copy has sha256 {sealed}, not {found}"
            )));
        }
        Ok(Executable {
            memfd: f.into(),
            sha256: found,
            path: path.to_path_buf(),
        })
    }

    /// Starts an observer with `args`: its standard input is one end of a
    /// new socket pair, the other returned with the process and its pidfd.
    pub fn spawn(&self, args: &[String]) -> Result<Observer, String> {
        let (ours, theirs) =
            UnixStream::pair().map_err(|e| format!("make the observer's socket: {e}"))?;
        // Executed by the kernel from the sealed file: `/proc/self/fd/N`
        // is resolved by the exec before descriptors marked close-on-exec
        // are closed.
        let exe = format!("/proc/self/fd/{}", self.memfd.as_raw_fd());
        let child = std::process::Command::new(&exe)
            .arg0("allox-observe")
            .args(args)
            .stdin(std::process::Stdio::from(OwnedFd::from(theirs)))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .env_clear()
            .spawn()
            .map_err(|e| format!("start the observer: {e}"))?;
        let pid = rustix::process::Pid::from_raw(child.id() as i32)
            .ok_or_else(|| "the observer has no pid".to_string())?;
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
            .map_err(|e| format!("open the observer's pidfd: {e}"))?;
        Ok(Observer {
            child,
            pidfd,
            sock: ours,
        })
    }
}

use std::os::unix::process::CommandExt;

/// One observer process.
pub struct Observer {
    pub child: std::process::Child,
    pub pidfd: OwnedFd,
    pub sock: UnixStream,
}

impl Observer {
    /// Sends `m` and waits at most `wait` for the answer.
    pub fn ask(&mut self, m: &ToObserver, wait: Duration) -> Result<FromObserver, String> {
        wire::send(&mut self.sock, m).map_err(|e| format!("write to the observer: {e}"))?;
        self.sock
            .set_read_timeout(Some(wait))
            .map_err(|e| format!("set the observer's timeout: {e}"))?;
        match wire::recv::<FromObserver>(&mut self.sock) {
            Ok(Some(a)) => Ok(a),
            Ok(None) => Err(format!("the observer exited{}", self.exit_note())),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Err(format!("the observer did not answer within {wait:?}"))
            }
            Err(e) => Err(format!("read from the observer: {e}")),
        }
    }

    fn exit_note(&mut self) -> String {
        match self.child.try_wait() {
            Ok(Some(st)) => format!(" ({st})"),
            _ => String::new(),
        }
    }

    /// Whether the observer process has exited.
    pub fn exited(&self) -> bool {
        let mut fds = [rustix::event::PollFd::new(
            &self.pidfd,
            rustix::event::PollFlags::IN,
        )];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
    }

    /// Ends the conversation and reaps the process (killed if it does not
    /// exit within `wait`).
    pub fn finish(mut self, wait: Duration) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        let mut fds = [rustix::event::PollFd::new(
            &self.pidfd,
            rustix::event::PollFlags::IN,
        )];
        let ts = rustix::event::Timespec {
            tv_sec: wait.as_secs() as _,
            tv_nsec: wait.subsec_nanos() as _,
        };
        if !matches!(rustix::event::poll(&mut fds, Some(&ts)), Ok(n) if n > 0) {
            let _ = rustix::process::pidfd_send_signal(
                self.pidfd.as_fd(),
                rustix::process::Signal::KILL,
            );
        }
        let _ = self.child.wait();
    }
}
