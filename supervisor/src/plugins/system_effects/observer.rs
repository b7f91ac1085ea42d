//! The plugin's pinned executables, the observer and the verifier, as the
//! plugin holds them: each read once into a sealed memory file and its
//! sha256 checked against the pinned one; every process is run from that
//! file. An observer has its conversation on its standard input and its
//! pidfd held here (the plugin keeps observers waiting between runs:
//! `take_observer`, `give_back`); the verifier is run to its end
//! ([`Executable::run`]).

use allox_effects::observer::wire::{self, FromObserver, ToObserver};
use rustix::fd::{AsFd, AsRawFd, OwnedFd};
use sha2::{Digest, Sha256};
use std::io::{Read, Seek};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The observer's sha256 fixed at build (`ALLOX_OBSERVE_SHA256`), if any.
pub const PINNED_AT_BUILD: Option<&str> = option_env!("ALLOX_OBSERVE_SHA256");
/// The verifier's sha256 fixed at build (`ALLOX_VERIFY_SHA256`), if any.
pub const VERIFIER_PINNED_AT_BUILD: Option<&str> = option_env!("ALLOX_VERIFY_SHA256");
/// The recover tool's sha256 fixed at build (`ALLOX_RECOVER_SHA256`), if
/// any.
pub const RECOVER_PINNED_AT_BUILD: Option<&str> = option_env!("ALLOX_RECOVER_SHA256");

/// What a pinned executable is: its role in messages, its name, and how
/// its hash is pinned.
#[derive(Debug, Clone, Copy)]
pub struct Role {
    /// `observer`, `verifier`, `recover tool`.
    pub what: &'static str,
    /// `allox-observe`, `allox-system-effects-verify`, …
    pub name: &'static str,
    /// The variable that pins it at build, and what it pinned.
    pub build_env: &'static str,
    pub pinned_at_build: Option<&'static str>,
    /// The flag that pins it at start (`--system-effects-FLAG-sha256`).
    pub flag: &'static str,
}

pub const OBSERVER: Role = Role {
    what: "observer",
    name: "allox-observe",
    build_env: "ALLOX_OBSERVE_SHA256",
    pinned_at_build: PINNED_AT_BUILD,
    flag: "observer",
};
pub const VERIFIER: Role = Role {
    what: "verifier",
    name: "allox-system-effects-verify",
    build_env: "ALLOX_VERIFY_SHA256",
    pinned_at_build: VERIFIER_PINNED_AT_BUILD,
    flag: "verifier",
};
pub const RECOVER: Role = Role {
    what: "recover tool",
    name: "allox-system-effects-recover",
    build_env: "ALLOX_RECOVER_SHA256",
    pinned_at_build: RECOVER_PINNED_AT_BUILD,
    flag: "recover",
};

/// A pinned executable, sealed.
pub struct Executable {
    memfd: OwnedFd,
    pub sha256: String,
    pub path: PathBuf,
    role: Role,
}

use allox_effects::chain::hex;

fn refuse(why: String) -> String {
    why
}

impl Executable {
    /// The `role`'s executable: `path`, or its name beside this
    /// executable; checked against `sha256`, or the hash pinned at build.
    pub fn pinned(
        role: Role,
        path: Option<&Path>,
        sha256: Option<&str>,
    ) -> Result<Executable, String> {
        let path = match path {
            Some(p) => p.to_path_buf(),
            None => std::env::current_exe()
                .map_err(|e| format!("find this executable: {e}"))?
                .with_file_name(role.name),
        };
        let pinned = sha256.or(role.pinned_at_build).ok_or_else(|| {
            format!(
                "no {} hash is pinned: this binary was built without {}; pass --system-effects-{}-sha256",
                role.what, role.build_env, role.flag
            )
        })?;
        Executable::load(&path, pinned, role)
    }

    /// Reads `path` into a sealed memory file and checks it against
    /// `pinned` (hex sha256).
    pub fn load(path: &Path, pinned: &str, role: Role) -> Result<Executable, String> {
        let what = role.what;
        let bytes = std::fs::read(path)
            .map_err(|e| refuse(format!("read the {what} {}: {e}", path.display())))?;
        let found = hex(&Sha256::digest(&bytes));
        if !found.eq_ignore_ascii_case(pinned) {
            return Err(refuse(format!(
                "the {what} {} has sha256 {found}, not the pinned {pinned}",
                path.display()
            )));
        }
        let memfd = rustix::fs::memfd_create(
            role.name,
            rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
        )
        .map_err(|e| refuse(format!("create the {what}'s memory file: {e}")))?;
        let mut f = std::fs::File::from(memfd);
        std::io::Write::write_all(&mut f, &bytes)
            .map_err(|e| refuse(format!("fill the {what}'s memory file: {e}")))?;
        let seals = rustix::fs::SealFlags::SEAL
            | rustix::fs::SealFlags::SHRINK
            | rustix::fs::SealFlags::GROW
            | rustix::fs::SealFlags::WRITE;
        // The kernel refuses the write seal (EBUSY) while a page just
        // written is still held elsewhere (a per-CPU batch of a busy
        // machine, for a moment): tried again, a while, before giving up.
        let mut tries = 0;
        loop {
            match rustix::fs::fcntl_add_seals(&f, seals) {
                Ok(()) => break,
                Err(rustix::io::Errno::BUSY) if tries < 50 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(10 * tries.min(10)));
                }
                Err(e) => return Err(refuse(format!("seal the {what}'s memory file: {e}"))),
            }
        }
        // What will be executed is what is checked: the sealed copy.
        f.rewind()
            .map_err(|e| refuse(format!("read the {what}'s memory file: {e}")))?;
        let mut again = Vec::with_capacity(bytes.len());
        f.read_to_end(&mut again)
            .map_err(|e| refuse(format!("read the {what}'s memory file: {e}")))?;
        let sealed = hex(&Sha256::digest(&again));
        if sealed != found {
            return Err(refuse(format!(
                "the {what}'s sealed copy has sha256 {sealed}, not {found}"
            )));
        }
        Ok(Executable {
            memfd: f.into(),
            sha256: found,
            path: path.to_path_buf(),
            role,
        })
    }

    /// The path the kernel executes it by: the sealed file itself
    /// (`/proc/self/fd/N` is resolved by the exec before descriptors
    /// marked close-on-exec are closed).
    fn exe(&self) -> String {
        format!("/proc/self/fd/{}", self.memfd.as_raw_fd())
    }

    /// Runs it with `args` to its end, at most `wait` (then it is
    /// killed): its exit code and what it wrote on its standard output.
    pub fn run(&self, args: &[String], wait: Duration) -> Result<(i32, Vec<u8>), String> {
        let what = self.role.what;
        let mut child = std::process::Command::new(self.exe())
            .arg0(self.role.name)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .env_clear()
            .spawn()
            .map_err(|e| format!("start the {what}: {e}"))?;
        let mut out = child.stdout.take().expect("piped");
        let reader = std::thread::spawn(move || {
            let mut b = Vec::new();
            let _ = out.read_to_end(&mut b);
            b
        });
        let pid = rustix::process::Pid::from_raw(child.id() as i32)
            .ok_or_else(|| format!("the {what} has no pid"))?;
        let ended = match rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) {
            Ok(fd) => {
                let mut fds = [rustix::event::PollFd::new(
                    &fd,
                    rustix::event::PollFlags::IN,
                )];
                let ts = rustix::event::Timespec {
                    tv_sec: wait.as_secs() as _,
                    tv_nsec: wait.subsec_nanos() as _,
                };
                matches!(rustix::event::poll(&mut fds, Some(&ts)), Ok(n) if n > 0)
            }
            Err(_) => false,
        };
        if !ended {
            let _ = child.kill();
            let _ = child.wait();
            let _ = reader.join();
            return Err(format!("the {what} did not end within {wait:?}"));
        }
        let status = child
            .wait()
            .map_err(|e| format!("wait for the {what}: {e}"))?;
        let out = reader.join().unwrap_or_default();
        match status.code() {
            Some(c) => Ok((c, out)),
            None => Err(format!("the {what} ended by {status}")),
        }
    }

    /// Starts an observer with `args`: its standard input is one end of a
    /// new socket pair, the other returned with the process and its pidfd.
    pub fn spawn(&self, args: &[String]) -> Result<Observer, String> {
        let (ours, theirs) =
            UnixStream::pair().map_err(|e| format!("make the observer's socket: {e}"))?;
        // Executed by the kernel from the sealed file.
        let child = std::process::Command::new(self.exe())
            .arg0(self.role.name)
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
        self.tell(m)?;
        self.answer(wait)
    }

    /// Sends `m`; the answer is read by [`Observer::answer`].
    pub fn tell(&mut self, m: &ToObserver) -> Result<(), String> {
        wire::send(&mut self.sock, m).map_err(|e| format!("write to the observer: {e}"))
    }

    /// Waits at most `wait` for the observer's next message.
    pub fn answer(&mut self, wait: Duration) -> Result<FromObserver, String> {
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
