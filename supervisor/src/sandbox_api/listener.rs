//! One run's listener: a Unix socket in the in-sandbox interface's private
//! directory, served until the run's sandbox is gone. Whoever it serves
//! is that run: the socket file is bound into that run's sandbox only, the
//! directory holding it is closed to everyone else on the host, and a
//! connection is served only when the process that made it is in the
//! run's cgroup ([`super::peer`]; the sandbox's uid on the host reaches
//! the file through `/proc/<pid>/root`).

use super::answer::{answer, SandboxApiContext};
use super::conversation::{response_frame, Conversation, Step};
use super::peer::{Refusal, RunCgroup};
use crate::ratelimit::RateLimit;
use allox_protocol::sandbox_api::SandboxCaller;
use allox_protocol::sandbox_api::SandboxServerFrame;
use allox_protocol::FrameReader;
use allox_protocol::{encode, ErrorBody, ErrorCode};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinSet;

/// Connections served at once per run; more wait in the backlog.
pub const MAX_CONNECTIONS: usize = 16;
/// A guest that does not read its answer for this long is dropped.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Refused peers logged at once per listener, then one per [`LOG_EVERY`].
pub const LOG_BURST: u32 = 5;
pub const LOG_EVERY: Duration = Duration::from_secs(1);

/// The listener of one run. Dropping it stops serving (the listener and
/// its connections are closed) and removes the socket file.
#[derive(Debug)]
pub struct RunListener {
    path: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl RunListener {
    /// Binds `path` (0666 inside a directory only root enters) and serves
    /// it as `who` to the processes of `cgroup`. Must be called within the
    /// async runtime.
    pub fn open(
        path: &Path,
        who: SandboxCaller,
        cgroup: RunCgroup,
        ctx: Arc<SandboxApiContext>,
    ) -> std::io::Result<RunListener> {
        use std::os::unix::fs::PermissionsExt;
        // A file left by a crashed start of the same name cannot be: run
        // ids are unique per daemon, and the directory is emptied at start.
        let std_listener = std::os::unix::net::UnixListener::bind(path)?;
        let opened = (|| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
            std_listener.set_nonblocking(true)?;
            UnixListener::from_std(std_listener)
        })();
        let listener = match opened {
            Ok(l) => l,
            Err(e) => {
                let _ = std::fs::remove_file(path);
                return Err(e);
            }
        };
        let task = tokio::spawn(serve(listener, Arc::new(who), cgroup, ctx));
        Ok(RunListener {
            path: path.to_path_buf(),
            task,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for RunListener {
    fn drop(&mut self) {
        // The task owns the listener and its connections: aborting it
        // closes them all.
        self.task.abort();
        if let Err(e) = std::fs::remove_file(&self.path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot remove a guest socket");
            }
        }
    }
}

async fn serve(
    listener: UnixListener,
    who: Arc<SandboxCaller>,
    cgroup: RunCgroup,
    ctx: Arc<SandboxApiContext>,
) {
    let mut conns = JoinSet::new();
    let mut log = RateLimit::new(LOG_BURST, LOG_EVERY, Instant::now());
    loop {
        tokio::select! {
            accepted = listener.accept(), if conns.len() < MAX_CONNECTIONS => match accepted {
                // Checked before it takes a place among the connections:
                // a refused peer never holds one.
                Ok((stream, _)) => match cgroup.check(&stream) {
                    Ok(()) => {
                        conns.spawn(connection(stream, who.clone(), ctx.clone()));
                    }
                    Err(why) => refuse(stream, &why, &who, &mut log),
                },
                Err(e) => {
                    // Out of descriptors, most likely: wait, do not spin.
                    tracing::debug!(error = %e, "guest accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// Tells the peer why it is refused (without waiting: the frame fits in
/// the socket's buffer, or is lost), closes the connection and logs it,
/// rate-limited since anyone who reaches the file may knock.
fn refuse(stream: UnixStream, why: &Refusal, who: &SandboxCaller, log: &mut RateLimit) {
    let message = why.message(&who.run_id);
    let frame = SandboxServerFrame::Refused(ErrorBody::new(ErrorCode::Unauthorized, message));
    if let Ok(bytes) = encode(&frame) {
        let _ = stream.try_write(&bytes);
    }
    drop(stream);
    if let Some(held_back) = log.allow(Instant::now()) {
        tracing::warn!(
            pid = ?why.pid(),
            uid = ?why.uid(),
            run = %who.run_id,
            agent = %who.agent_id,
            session = %who.session_id,
            held_back,
            "guest connection refused: the peer is not a process of the run"
        );
    }
}

/// Serves one connection: frames in, one answer per frame out, in order.
async fn connection(mut stream: UnixStream, who: Arc<SandboxCaller>, ctx: Arc<SandboxApiContext>) {
    let mut reader = FrameReader::new();
    let mut conv = Conversation::default();
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let n = match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        reader.push(&buf[..n]);
        while let Some(frame) = reader.next_frame() {
            let (bytes, close) = match conv.on_frame(frame) {
                Step::Reply(b) => (b, false),
                Step::ReplyAndClose(b) => (b, true),
                Step::Request { id, request } => {
                    let out = answer(&ctx, &who, id, request).await;
                    (response_frame(id, out.into()), false)
                }
            };
            let sent = tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(&bytes)).await;
            if close || !matches!(sent, Ok(Ok(()))) {
                return;
            }
        }
    }
}
