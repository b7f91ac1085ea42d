//! A run in alloxctl's foreground (`exec`, `exec -t`, `attach`): one
//! connection to the daemon carries the request that follows the run and,
//! from other threads, what alloxctl sends it meanwhile (keys, sizes,
//! signals); the run's id is learnt from its first event.
//!
//! `alloxctl exec` without a terminal behaves as a foreground command
//! does: `SIGINT` (Ctrl-C), `SIGTERM` and `SIGHUP` sent to alloxctl are
//! delivered to every process of the run (`process.kill`), a second
//! `SIGINT` kills it, and alloxctl exits as the run did; should alloxctl
//! die without a word (`SIGKILL`, a dead terminal), the daemon kills the
//! run when the connection closes (`on_disconnect: kill`). With
//! `--detach-on-exit` the same signals make alloxctl leave instead,
//! naming the run to follow again (`alloxctl logs -f`), and the run goes
//! on. The thread that does this is made only for a run still going after
//! [`SIGNAL_GRACE`]; a signal before then is acted on when it is up.

use crate::process;
use allox_client::client::{Answer, Caller, Client, ClientError, Sender};
use allox_protocol::{
    ErrorBody, ErrorCode, Event, OnDisconnect, ProcessKill, ProcessStart, ProcessStdin, Request,
};
use nix::sys::signal::{SigSet, Signal};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex, OnceLock};

/// Where the run's id goes once it is known.
pub(crate) struct RunIdSlot {
    pub(crate) id: OnceLock<String>,
    /// Told the id once (the thread that passes keys on waits for it).
    pub(crate) input: Mutex<Option<mpsc::Sender<String>>>,
}

impl RunIdSlot {
    pub(crate) fn new(input: Option<mpsc::Sender<String>>) -> RunIdSlot {
        RunIdSlot {
            id: OnceLock::new(),
            input: Mutex::new(input),
        }
    }

    pub(crate) fn set(&self, id: &str) {
        if self.id.set(id.to_string()).is_ok() {
            if let Some(tx) = self.input.lock().unwrap_or_else(|e| e.into_inner()).take() {
                let _ = tx.send(id.to_string());
            }
        }
    }
}

/// The request's connection: learns the run's id from its first event,
/// and drops `until_answer` (a terminal's raw mode) as soon as the answer
/// is in, before alloxctl says how the run ended.
pub(crate) struct ForegroundCall {
    pub(crate) client: Client,
    pub(crate) known: Arc<RunIdSlot>,
    pub(crate) until_answer: Option<Box<dyn std::any::Any>>,
    /// Once the run is known, give it this terminal's size (a `SIGWINCH`
    /// to alloxctl, which its signal thread turns into `process.resize`):
    /// a run followed again by `attach`.
    pub(crate) resize_when_known: bool,
}

impl Caller for ForegroundCall {
    fn call(&mut self, request: Request) -> Result<Answer, ClientError> {
        self.call_with_events(request, &mut |_| {})
    }

    fn call_with_events(
        &mut self,
        request: Request,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<Answer, ClientError> {
        let known = self.known.clone();
        let resize = self.resize_when_known;
        let answer = self.client.call_with_events(request, &mut |e| {
            if let Event::Started(s) = &e {
                let first = known.id.get().is_none();
                known.set(&s.run_id);
                if first && resize {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), Signal::SIGWINCH);
                }
            }
            on_event(e)
        });
        self.until_answer.take();
        answer
    }
}

/// A welcomed connection, and a sender on it for the other threads (a
/// ping first makes sure the daemon took it: the VM's control port takes
/// one host at a time). For `exec -t` and `attach`, whose other threads
/// send on it (keys, sizes and signals, once the run's `Started` came);
/// `exec` without a terminal needs no ping.
/// The Hello goes out with the ping, in one write: one round trip, where
/// waiting for the Welcome first took two.
pub(crate) fn connect(socket: &Path) -> Result<(Client, Sender), ClientError> {
    let mut c = Client::connect_pipelined(socket, None)?;
    c.call(Request::Ping(allox_protocol::Ping {}))?
        .map_err(ClientError::Refused)?;
    let sender = c.sender()?;
    Ok((c, sender))
}

/// What a signal to alloxctl does to its run.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub(crate) enum Reaction {
    /// Deliver this signal to every process of the run.
    Deliver(Signal),
    /// Leave: the run goes on.
    Detach,
}

/// What the `nth` (from 1) signal `sig` to alloxctl means for its run.
pub(crate) fn reaction(sig: Signal, nth: u32, detach: bool) -> Reaction {
    match (detach, sig) {
        (true, _) => Reaction::Detach,
        // Ctrl-C twice: the run did not stop when asked.
        (false, Signal::SIGINT) if nth > 1 => Reaction::Deliver(Signal::SIGKILL),
        (false, s) => Reaction::Deliver(s),
    }
}

/// How `alloxctl exec` holds its run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Foreground {
    /// `--detach-on-exit`: signals to alloxctl leave the run going.
    pub detach: bool,
    /// `-i`: alloxctl's stdin is passed on as it comes.
    pub interactive: bool,
}

/// How long a run goes before alloxctl starts the thread that acts on
/// its signals: a signal in that time is acted on when it is up (and not
/// at all if the run is over by then). `ALLOX_EXEC_SIGNAL_GRACE_MS` sets
/// another (the tests make it long, to signal alloxctl within it).
pub const SIGNAL_GRACE: std::time::Duration = std::time::Duration::from_millis(10);

fn signal_grace() -> std::time::Duration {
    std::env::var("ALLOX_EXEC_SIGNAL_GRACE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(SIGNAL_GRACE, std::time::Duration::from_millis)
}

/// `alloxctl exec` without a terminal (see the module's description).
pub fn exec(
    socket: &Path,
    mut request: ProcessStart,
    json: bool,
    how: Foreground,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8 {
    let Foreground {
        detach,
        interactive,
    } = how;
    request.on_disconnect = if detach {
        OnDisconnect::Keep
    } else {
        OnDisconnect::Kill
    };
    // The Hello goes out with the request, in one write: the request's
    // answer says whether the daemon took the connection. The sender is
    // made now but used only once the run has started (its signals and
    // input need the run's id), after the Hello and the request went out.
    let mut client = match Client::connect_pipelined(socket, None) {
        Ok(c) => c,
        Err(e) => return process::report(stderr, &e.to_body()),
    };
    let sender = match client.sender() {
        Ok(s) => s,
        Err(e) => return process::report(stderr, &e.to_body()),
    };
    // Blocked in every thread (each inherits this one's mask), taken by
    // the signal thread alone.
    let mut signals = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        signals.add(s);
    }
    if let Err(e) = signals.thread_block() {
        let why = format!("cannot block signals: {e}");
        return process::report(stderr, &ErrorBody::new(ErrorCode::Internal, why));
    }
    let target = (request.agent_id.clone(), request.session_id.clone());
    let (tx, rx) = mpsc::channel();
    let known = Arc::new(RunIdSlot::new(interactive.then_some(tx)));
    if interactive {
        let (sender, target) = (sender.clone(), target.clone());
        std::thread::spawn(move || pass_input(&sender, &target, rx, false));
    }
    // Made only for a run still going after SIGNAL_GRACE (most commands
    // an agent runs are over sooner): until then a signal waits, blocked,
    // and the thread takes it as it starts.
    let grace = {
        let known = known.clone();
        Arc::new(Grace::new(signal_grace(), move || {
            std::thread::spawn(move || on_signals(&sender, &target, &known, signals, detach));
        }))
    };
    {
        let grace = grace.clone();
        client.when_waiting(signal_grace(), move || grace.start());
    }
    let mut tap = ForegroundCall {
        client,
        known,
        until_answer: None,
        resize_when_known: false,
    };
    // Output that cannot be written at once starts the thread too: a
    // reader that does not drain alloxctl's output held it in `write`
    // before it ever waited on the daemon, its signals blocked for good.
    let (out_fd, err_fd) = (rustix::stdio::stdout(), rustix::stdio::stderr());
    let mut stdout = GraceWriter {
        inner: stdout,
        fd: out_fd,
        grace: &grace,
    };
    let mut stderr = GraceWriter {
        inner: stderr,
        fd: err_fd,
        grace: &grace,
    };
    process::exec(&mut tap, request, json, &mut stdout, &mut stderr)
}

/// The start of the signal thread, due at the end of the grace: run once,
/// by whichever comes first of a call that waits past it and output that
/// cannot be written within it.
struct Grace {
    at: std::time::Instant,
    start: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Grace {
    fn new(after: std::time::Duration, start: impl FnOnce() + Send + 'static) -> Grace {
        Grace {
            at: std::time::Instant::now() + after,
            start: Mutex::new(Some(Box::new(start))),
        }
    }

    fn pending(&self) -> bool {
        self.start
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    fn start(&self) {
        let start = self.start.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(start) = start {
            start();
        }
    }
}

/// alloxctl's standard output or error (`fd`, written through `inner`)
/// while the grace lasts: a write waits for room only until the grace's
/// end, then starts the signal thread before it blocks.
struct GraceWriter<'a> {
    inner: &'a mut dyn Write,
    fd: rustix::fd::BorrowedFd<'static>,
    grace: &'a Grace,
}

/// What a pipe with room for a write takes without blocking.
const PIPE_BUF: usize = 4096;

impl Write for GraceWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.is_empty() || !self.grace.pending() {
            return self.inner.write(buf);
        }
        let left = self
            .grace
            .at
            .saturating_duration_since(std::time::Instant::now());
        let mut fds = [rustix::event::PollFd::new(
            &self.fd,
            rustix::event::PollFlags::OUT,
        )];
        let timeout = rustix::event::Timespec::try_from(left).ok();
        let room = !left.is_zero()
            && matches!(rustix::event::poll(&mut fds, timeout.as_ref()), Ok(n) if n > 0)
            && !fds[0]
                .revents()
                .intersects(rustix::event::PollFlags::ERR | rustix::event::PollFlags::HUP);
        if !room {
            self.grace.start();
            return self.inner.write(buf);
        }
        // Written past `inner`, which holds nothing yet (it was not
        // written to before the grace ends), at most what fits at once.
        self.inner.flush()?;
        Ok(rustix::io::write(self.fd, &buf[..buf.len().min(PIPE_BUF)])?)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Waits for the blocked signals and does to the run what each means.
fn on_signals(
    sender: &Sender,
    (agent, session): &(String, String),
    known: &RunIdSlot,
    set: SigSet,
    detach: bool,
) {
    let mut interrupts = 0;
    loop {
        let Ok(sig) = set.wait() else { return };
        if sig == Signal::SIGINT {
            interrupts += 1;
        }
        let say = |text: String| {
            let _ = std::io::stderr().write_all(text.as_bytes());
        };
        let Some(run) = known.id.get() else {
            // Not started yet: leaving closes the connection, and the
            // daemon kills the run unless it was to be left going.
            say(format!("alloxctl: {sig} before the run started\n"));
            std::process::exit(128 + sig as i32);
        };
        match reaction(sig, interrupts, detach) {
            Reaction::Detach => {
                say(format!(
                    "alloxctl: left run {run}, which goes on: `alloxctl logs -f {agent} {session} {run}` follows it\n"
                ));
                std::process::exit(0);
            }
            Reaction::Deliver(to_run) => {
                if sig == Signal::SIGINT {
                    say(match to_run {
                        Signal::SIGKILL => format!("alloxctl: killing run {run}\n"),
                        _ => format!("alloxctl: interrupt sent to run {run} (again to kill it)\n"),
                    });
                }
                let kill = Request::ProcessKill(ProcessKill {
                    agent_id: agent.clone(),
                    session_id: session.clone(),
                    run_id: Some(run.clone()),
                    signal: Some(to_run as i32),
                });
                // Its answer is not waited for here: it comes on the
                // connection the main thread reads, behind the run's
                // output, which a reader that does not drain alloxctl's
                // output holds up; the next signal (a second Ctrl-C) was
                // never taken.
                let (sender, run) = (sender.clone(), run.clone());
                std::thread::spawn(move || {
                    if let Ok(Err(e)) | Err(e) = sender.call(kill).map_err(|e| e.to_body()) {
                        let _ = std::io::stderr().write_all(
                            format!("alloxctl: cannot signal run {run}: {}\n", e.message)
                                .as_bytes(),
                        );
                    }
                });
            }
        }
    }
}

/// Sends alloxctl's input to the run, once its id is known, as it comes;
/// at its end, closes the run's (on a terminal: types its end-of-file
/// character). With `detach_keys` (a terminal run), Ctrl-P Ctrl-Q leave
/// alloxctl with the run going on.
pub(crate) fn pass_input(
    sender: &Sender,
    (agent, session): &(String, String),
    run: mpsc::Receiver<String>,
    detach_keys: bool,
) {
    let Ok(run_id) = run.recv() else { return };
    let mut stdin = std::io::stdin().lock();
    let mut buf = vec![0u8; 16 << 10];
    let mut held = false;
    // The last refusal said (each said once while it lasts).
    let mut said: Option<String> = None;
    loop {
        let n = match stdin.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => 0,
        };
        let (data, detach) = if detach_keys {
            crate::raw_mode::typed(&mut held, &buf[..n])
        } else {
            (buf[..n].to_vec(), false)
        };
        if detach {
            crate::raw_mode::restore();
            let _ = std::io::stderr().write_all(
                format!(
                    "\r\nalloxctl: left run {run_id}, which goes on: `alloxctl attach {agent} {session} {run_id}` follows it again\r\n"
                )
                .as_bytes(),
            );
            std::process::exit(0);
        }
        if n > 0 && data.is_empty() {
            continue;
        }
        let request = Request::ProcessStdin(ProcessStdin {
            agent_id: agent.clone(),
            session_id: session.clone(),
            run_id: run_id.clone(),
            data: data.into(),
            close: n == 0,
        });
        // In order, each after the last was taken. A refusal (the session
        // held, being rolled back) is said and the input goes on being
        // read, so that the detach keys and Ctrl-C keep working; the run's
        // end ends this process.
        match sender.call(request) {
            Ok(Ok(_)) if n > 0 => said = None,
            Ok(Err(e)) if n > 0 => {
                if said.as_deref() != Some(e.message.as_str()) {
                    let _ = std::io::stderr().write_all(
                        format!(
                            "\r\nalloxctl: input not passed to the run: {}\r\n",
                            e.message
                        )
                        .as_bytes(),
                    );
                    said = Some(e.message);
                }
            }
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctrl_c_interrupts_then_kills_and_detach_leaves() {
        use Reaction::*;
        assert_eq!(reaction(Signal::SIGINT, 1, false), Deliver(Signal::SIGINT));
        assert_eq!(reaction(Signal::SIGINT, 2, false), Deliver(Signal::SIGKILL));
        assert_eq!(
            reaction(Signal::SIGTERM, 1, false),
            Deliver(Signal::SIGTERM)
        );
        assert_eq!(reaction(Signal::SIGHUP, 3, false), Deliver(Signal::SIGHUP));
        for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
            assert_eq!(reaction(s, 1, true), Detach);
        }
    }
}
