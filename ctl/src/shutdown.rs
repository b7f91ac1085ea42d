//! `alloxctl shutdown`: asks the daemon to stop in order and waits until
//! the process that serves the socket has exited (the daemon; in the VM,
//! QEMU, which exits when the guest powers off), at most `wait`.
//!
//! The process is the socket's peer as the kernel names it
//! (`SO_PEERCRED`), held by a pidfd taken before the request is sent, so
//! no other process that later reuses its pid is waited for. Where the
//! peer is not visible from here (another PID namespace) alloxctl says it
//! returns once the request is answered.

use allox_client::client::Caller;
use allox_client::ReconnectingClient;
use allox_protocol::{Request, Response, Shutdown};
use rustix::fd::OwnedFd;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// The process serving `socket`, held by a pidfd.
fn server_of(socket: &Path) -> Option<OwnedFd> {
    let s = UnixStream::connect(socket).ok()?;
    let cred = rustix::net::sockopt::socket_peercred(&s).ok()?;
    rustix::process::pidfd_open(cred.pid, rustix::process::PidfdFlags::empty()).ok()
}

/// Whether the process behind `pidfd` exited within `wait`.
fn exited(pidfd: &OwnedFd, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut fds = [rustix::event::PollFd::new(
            pidfd,
            rustix::event::PollFlags::IN,
        )];
        let ts = rustix::event::Timespec {
            tv_sec: left.as_secs() as _,
            tv_nsec: left.subsec_nanos() as _,
        };
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(n) if n > 0 => return true,
            Ok(_) => return false,
            Err(rustix::io::Errno::INTR) if !left.is_zero() => continue,
            Err(_) => return false,
        }
    }
}

/// Sends `system.shutdown`, shows the answer, and waits (see the module).
pub fn shutdown(
    socket: &Path,
    json: bool,
    wait: Duration,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8 {
    let server = server_of(socket);
    let mut client = ReconnectingClient::new(socket.to_path_buf());
    let answer = client
        .call(Request::Shutdown(Shutdown {}))
        .unwrap_or_else(|e| Err(e.to_body()));
    drop(client);
    let response = match answer {
        Ok(r @ Response::Stopping(_)) => r,
        Ok(_) => {
            let _ = writeln!(
                stderr,
                "error: the daemon answered system.shutdown unexpectedly"
            );
            return 1;
        }
        Err(body) => {
            let _ = writeln!(stderr, "error: {}", crate::render::refusal(&body));
            return 1;
        }
    };
    let text = if json {
        format!("{:#}\n", response.to_json())
    } else {
        crate::render::render(&response)
    };
    let _ = stdout.write_all(text.as_bytes());
    let Some(pidfd) = server else {
        let _ = writeln!(
            stderr,
            "alloxctl: the daemon's process is not visible from here: returning without waiting for it to stop"
        );
        return 0;
    };
    if exited(&pidfd, wait) {
        if !json {
            let _ = writeln!(stdout, "stopped");
        }
        0
    } else {
        let _ = writeln!(
            stderr,
            "alloxctl: the daemon is still stopping after {} s",
            wait.as_secs()
        );
        1
    }
}
