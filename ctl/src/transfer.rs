//! `alloxctl session export|import|move`: a session's archive from one
//! daemon to a file, from a file to a daemon, or from one daemon straight
//! into another.

use allox_client::Client;
use allox_protocol::{
    Bytes, Event, Request, Response, SessionExport, SessionExported, SessionImport, SessionImported,
};
use std::io::{IsTerminal, Read, Write};

/// The bytes of one `session.import` piece.
pub const PIECE: usize = 512 * 1024;

/// Set by the signal thread of [`Importer::abort_on_interrupt`] before it
/// drops the import; the main thread, whose next piece is then refused
/// (`no import … is under way`), does not report that refusal but what
/// it must undo ([`interrupted`]), and leaves the exit (130) to it.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// The main thread's word that it has undone what it made.
static UNDONE: (std::sync::Mutex<bool>, std::sync::Condvar) =
    (std::sync::Mutex::new(false), std::sync::Condvar::new());

/// After a failure of an import: if it was interrupted, says that what
/// the main thread made is undone, and waits for the signal thread to end
/// alloxctl with 130 (a failure that is the interrupt's doing is not
/// reported as the command's).
fn interrupted() {
    if !INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) {
        return;
    }
    let (done, cv) = &UNDONE;
    *done.lock().unwrap_or_else(|e| e.into_inner()) = true;
    cv.notify_all();
    loop {
        std::thread::park();
    }
}

/// How much went so far, on standard error when it is a terminal: every
/// 16 MiB, then a new line at the end.
struct Progress {
    on: bool,
    shown: u64,
    what: &'static str,
}

impl Progress {
    fn new(what: &'static str) -> Progress {
        Progress {
            on: std::io::stderr().is_terminal(),
            shown: 0,
            what,
        }
    }

    fn at(&mut self, bytes: u64) {
        if self.on && bytes >= self.shown + (16 << 20) {
            self.shown = bytes;
            eprint!("\r{} {} MiB", self.what, bytes >> 20);
        }
    }

    fn done(&self) {
        if self.on && self.shown > 0 {
            eprintln!();
        }
    }
}

fn refusal(
    answer: Result<allox_client::Answer, allox_client::ClientError>,
) -> Result<Response, String> {
    match answer {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(body)) => Err(crate::render::refusal(&body)),
        Err(e) => Err(allox_client::error_chain(&e)),
    }
}

/// Exports to `each`, piece by piece; an error of `each` stops the copy
/// (the export's end is still waited for) and is returned.
pub fn export_with(
    c: &mut Client,
    q: SessionExport,
    each: &mut dyn FnMut(&[u8]) -> Result<(), String>,
) -> Result<SessionExported, String> {
    let mut failed: Option<String> = None;
    let mut got = 0u64;
    let mut progress = Progress::new("exported");
    let answer = c.call_with_events(Request::SessionExport(q), |e| {
        if let Event::Archive(chunk) = e {
            if failed.is_none() {
                got += chunk.data.0.len() as u64;
                progress.at(got);
                if let Err(e) = each(&chunk.data.0) {
                    failed = Some(e);
                }
            }
        }
    });
    progress.done();
    if let Some(e) = failed {
        return Err(e);
    }
    match refusal(answer)? {
        Response::SessionExported(x) if x.bytes == got => Ok(x),
        Response::SessionExported(x) => Err(format!(
            "the daemon says it exported {} bytes, {got} came",
            x.bytes
        )),
        other => Err(format!("unexpected answer: {}", other.to_json())),
    }
}

/// Exports to `out`.
pub fn export(
    c: &mut Client,
    q: SessionExport,
    out: &mut dyn Write,
) -> Result<SessionExported, String> {
    let done = export_with(c, q, &mut |b| {
        out.write_all(b)
            .map_err(|e| format!("write the archive: {e}"))
    })?;
    out.flush().map_err(|e| format!("write the archive: {e}"))?;
    Ok(done)
}

/// An import on `c` under `import_id`, piece by piece.
pub struct Importer<'c> {
    c: &'c mut Client,
    q: SessionImport,
    buf: Vec<u8>,
    progress: Progress,
}

impl<'c> Importer<'c> {
    pub fn new(c: &'c mut Client, agent: &str, session: Option<&str>) -> Importer<'c> {
        let id = format!(
            "alloxctl-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        );
        Importer {
            c,
            q: SessionImport {
                agent_id: agent.into(),
                session_id: session.map(str::to_string),
                import_id: id,
                offset: 0,
                data: Bytes::default(),
                commit: false,
                abort: false,
            },
            buf: Vec::with_capacity(PIECE),
            progress: Progress::new("imported"),
        }
    }

    fn send(&mut self, commit: bool) -> Result<SessionImported, String> {
        let mut q = self.q.clone();
        q.data = Bytes(std::mem::take(&mut self.buf));
        q.commit = commit;
        let n = q.data.0.len() as u64;
        match refusal(self.c.call(Request::SessionImport(q)))? {
            Response::SessionImported(i) => {
                self.q.offset += n;
                self.progress.at(self.q.offset);
                Ok(i)
            }
            other => Err(format!("unexpected answer: {}", other.to_json())),
        }
    }

    /// The next bytes of the archive.
    pub fn write(&mut self, mut b: &[u8]) -> Result<(), String> {
        while !b.is_empty() {
            let n = (PIECE - self.buf.len()).min(b.len());
            self.buf.extend_from_slice(&b[..n]);
            b = &b[n..];
            if self.buf.len() == PIECE {
                self.send(false)?;
            }
        }
        Ok(())
    }

    /// The last piece, which makes the session appear.
    pub fn commit(mut self) -> Result<SessionImported, String> {
        let done = self.send(true);
        self.progress.done();
        done
    }

    /// From now on, a SIGINT (Ctrl-C), SIGTERM or SIGHUP to alloxctl drops
    /// this import on the daemon at `socket` (over a connection of its
    /// own: the one in use may be waiting on a piece) and ends alloxctl
    /// with 130, instead of leaving the import to hold one of the daemon's
    /// few slots until it has been idle five minutes.
    pub fn abort_on_interrupt(&self, socket: &std::path::Path) {
        use nix::sys::signal::{SigSet, Signal};
        let mut set = SigSet::empty();
        for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
            set.add(s);
        }
        if set.thread_block().is_err() {
            return;
        }
        let mut q = self.q.clone();
        q.abort = true;
        q.data = Bytes::default();
        let socket = socket.to_path_buf();
        std::thread::spawn(move || {
            if set.wait().is_err() {
                return;
            }
            INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
            let dropped = Client::connect(&socket)
                .ok()
                .and_then(|mut c| c.call(Request::SessionImport(q)).ok());
            let said = match dropped {
                Some(Ok(_)) => "the import was dropped on the daemon",
                _ => {
                    "the import could not be dropped on the daemon: it goes once idle five minutes"
                }
            };
            // What the main thread made (an agent a move made on the
            // target) is undone once its piece is refused; it is not
            // waited for past two seconds (it may be reading its input).
            let (done, cv) = &UNDONE;
            let g = done.lock().unwrap_or_else(|e| e.into_inner());
            let _ = cv.wait_timeout_while(g, std::time::Duration::from_secs(2), |d| !*d);
            eprintln!("\nalloxctl: interrupted: {said}");
            std::process::exit(130);
        });
    }

    /// Drops the import on the daemon (after a failure of the source).
    pub fn abort(self) {
        let mut q = self.q.clone();
        q.abort = true;
        q.data = Bytes::default();
        let _ = self.c.call(Request::SessionImport(q));
    }
}

/// Imports what `input` holds.
/// With `interrupt`, the daemon's socket: a SIGINT, SIGTERM or SIGHUP
/// drops the import there ([`Importer::abort_on_interrupt`]).
pub fn import(
    c: &mut Client,
    agent: &str,
    session: Option<&str>,
    input: &mut dyn Read,
    interrupt: Option<&std::path::Path>,
) -> Result<SessionImported, String> {
    let mut i = Importer::new(c, agent, session);
    if let Some(socket) = interrupt {
        i.abort_on_interrupt(socket);
    }
    let mut buf = vec![0u8; PIECE];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                i.abort();
                return Err(format!("read the archive: {e}"));
            }
        };
        // On a refusal the daemon has dropped the import already.
        if let Err(e) = i.write(&buf[..n]) {
            interrupted();
            return Err(e);
        }
    }
    let done = i.commit();
    if done.is_err() {
        interrupted();
    }
    done
}

/// Moves session `agent/session` from `from` to `to` (as `new_session`
/// there, if given), making the agent there if it does not exist; with
/// `since`, only what came after that checkpoint, added to the session
/// there. The source session stays.
/// With `interrupt`, the target's socket: a SIGINT, SIGTERM or SIGHUP
/// drops the import there.
pub fn move_session(
    from: &mut Client,
    to: &mut Client,
    agent: &str,
    session: &str,
    new_session: Option<&str>,
    since: Option<&str>,
    interrupt: Option<&std::path::Path>,
) -> Result<SessionImported, String> {
    // A move talks to two daemons: what fails names the one it failed on
    // (it said only "the daemon closed the connection").
    let side = |which: &str, c: &Client| match c.socket_path() {
        Some(p) => format!("the {which} daemon ({})", p.display()),
        None => format!("the {which} daemon"),
    };
    let (src, dst) = (side("source", from), side("target", to));
    let mut made_agent = false;
    if since.is_none() {
        let made = to.call(Request::AgentCreate(allox_protocol::AgentCreate::new(
            agent,
        )));
        match refusal(made) {
            Ok(_) => made_agent = true,
            Err(e) if e.contains("already exists") => {}
            Err(e) => return Err(format!("{dst}: {e}")),
        }
    }
    let done = {
        let mut i = Importer::new(to, agent, new_session);
        if let Some(socket) = interrupt {
            i.abort_on_interrupt(socket);
        }
        let q = SessionExport {
            agent_id: agent.into(),
            session_id: session.into(),
            since: since.map(str::to_string),
        };
        match export_with(from, q, &mut |b| {
            i.write(b).map_err(|e| format!("{dst}: {e}"))
        }) {
            Ok(_) => i.commit().map_err(|e| format!("{dst}: {e}")),
            Err(e) => {
                i.abort();
                Err(if e.starts_with(&dst) {
                    e
                } else {
                    format!("{src}: {e}")
                })
            }
        }
    };
    // A move that did not happen leaves nothing on the target: the agent
    // it made there goes again (empty: not forced).
    if done.is_err() && made_agent {
        let _ = to.call(Request::AgentDelete(allox_protocol::AgentDelete {
            agent_id: agent.into(),
            force: false,
        }));
    }
    if done.is_err() {
        interrupted();
    }
    done
}
