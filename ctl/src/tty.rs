//! `alloxctl exec -t` and `alloxctl attach`: a run's terminal driven from
//! this one.
//!
//! This terminal is put in raw mode, so every key (Ctrl-C, Ctrl-Z, Ctrl-D,
//! arrows) goes to the run's terminal as the bytes it types, and the run's
//! terminal — its line discipline, in the sandbox — does what a terminal
//! does with them (SIGINT to the foreground job, end of file, ...). Three
//! threads on one connection to the daemon (the VM's control port takes
//! one at a time): this one sends the request and writes the run's output
//! as it comes; one reads this terminal's keys and sends them
//! (`process.stdin`, one after the other); one waits for signals:
//! `SIGWINCH` becomes `process.resize`, `SIGINT` sent to alloxctl (not a
//! key: those are bytes in raw mode) becomes a Ctrl-C typed into the run,
//! `SIGTERM` and `SIGHUP` are delivered to every process of the run, and
//! `SIGQUIT` ends alloxctl (the run goes on). The detach keys, Ctrl-P
//! Ctrl-Q as in Docker, leave alloxctl with the run going on, naming the
//! `alloxctl attach` that follows it again.
//!
//! The terminal's mode is restored on every way out: the end of the run,
//! an error, one of those signals, and a panic.

use crate::foreground::{self, ForegroundCall, RunIdSlot};
use crate::process;
use crate::raw_mode::{restore, Raw};
use allox_client::client::Sender;
use allox_protocol::{ProcessKill, ProcessResize, ProcessStdin, PtySize, Request};
use nix::sys::signal::{SigSet, Signal};
use rustix::termios;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};

/// A terminal for a run like this one: its size (24 × 80 when alloxctl
/// is not on a terminal) and its `TERM`.
pub fn like_this_one() -> PtySize {
    let (rows, cols) = local_size().unwrap_or((24, 80));
    let term = std::env::var("TERM").ok().filter(|t| !t.is_empty());
    PtySize { rows, cols, term }
}

/// This terminal's size, if stdout or stdin is one.
fn local_size() -> Option<(u16, u16)> {
    let of = |w: termios::Winsize| (w.ws_row > 0 && w.ws_col > 0).then_some((w.ws_row, w.ws_col));
    termios::tcgetwinsize(std::io::stdout())
        .ok()
        .and_then(of)
        .or_else(|| termios::tcgetwinsize(std::io::stdin()).ok().and_then(of))
}

/// `alloxctl exec -t`: `request` on a terminal of this one's size.
pub fn exec(
    socket: PathBuf,
    mut request: allox_protocol::ProcessStart,
    json: bool,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8 {
    request.pty = Some(like_this_one());
    // Keys come through `process.stdin`.
    request.stdin = None;
    request.wait = true;
    request.stream = !json;
    drive(
        &socket,
        Request::ProcessStart(request),
        None,
        json,
        stdout,
        stderr,
    )
}

/// `alloxctl attach`: follows a terminal run again, at this terminal's
/// size.
pub fn attach(
    socket: PathBuf,
    request: allox_protocol::ProcessAttach,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8 {
    let id = request.run_id.clone();
    drive(
        &socket,
        Request::ProcessAttach(request),
        Some(id),
        false,
        stdout,
        stderr,
    )
}

fn drive(
    socket: &Path,
    request: Request,
    run_id: Option<String>,
    json: bool,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8 {
    let (agent, session) = match &request {
        Request::ProcessStart(p) => (p.agent_id.clone(), p.session_id.clone()),
        Request::ProcessAttach(p) => (p.agent_id.clone(), p.session_id.clone()),
        _ => return process::report(stderr, &bad("not a terminal request")),
    };
    // One connection carries it all (the VM's control port takes one at a
    // time): the request waits on it, the keys and size changes go out on
    // it from the other threads (a ping first makes sure it is welcomed).
    let (client, sender) = match foreground::connect(socket) {
        Ok(c) => c,
        Err(e) => return process::report(stderr, &e.to_body()),
    };
    // Blocked in every thread (each inherits this one's mask), taken by
    // the signal thread alone.
    let mut signals = SigSet::empty();
    for s in [
        Signal::SIGWINCH,
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        signals.add(s);
    }
    if let Err(e) = signals.thread_block() {
        return process::report(stderr, &bad(&format!("cannot block signals: {e}")));
    }
    // The run's id comes with its `Started` event, for an attach too (sent
    // once the daemon follows the terminal): keys and sizes go out only
    // from then on, so that input which ends the run at once (alloxctl's
    // stdin at its end) cannot end it before it is followed.
    let (tx, rx) = mpsc::channel();
    let known = Arc::new(RunIdSlot::new(Some(tx)));
    let target = (agent, session);
    {
        let (sender, target) = (sender.clone(), target.clone());
        std::thread::spawn(move || foreground::pass_input(&sender, &target, rx, true));
    }
    {
        let known = known.clone();
        std::thread::spawn(move || on_signals(&sender, &target, &known, signals));
    }
    let mut tap = ForegroundCall {
        client,
        known,
        // A run followed again takes this terminal's size: the signal
        // thread sends it, as for any change of size.
        resize_when_known: run_id.is_some(),
        until_answer: if json {
            None
        } else {
            Raw::enter().map(|r| Box::new(r) as Box<dyn std::any::Any>)
        },
    };
    process::follow(&mut tap, request, json, stdout, stderr)
}

fn bad(message: &str) -> allox_protocol::ErrorBody {
    allox_protocol::ErrorBody::new(allox_protocol::ErrorCode::InvalidRequest, message)
}

/// Waits for the blocked signals and does what each means.
fn on_signals(
    sender: &Sender,
    (agent, session): &(String, String),
    known: &RunIdSlot,
    set: SigSet,
) {
    loop {
        let Ok(sig) = set.wait() else { return };
        let request = match (sig, known.id.get()) {
            (Signal::SIGWINCH, Some(run_id)) => match local_size() {
                Some((rows, cols)) => Request::ProcessResize(ProcessResize {
                    agent_id: agent.clone(),
                    session_id: session.clone(),
                    run_id: run_id.clone(),
                    rows,
                    cols,
                }),
                None => continue,
            },
            // Ctrl-C, typed into the run's terminal.
            (Signal::SIGINT, Some(run_id)) => Request::ProcessStdin(ProcessStdin {
                agent_id: agent.clone(),
                session_id: session.clone(),
                run_id: run_id.clone(),
                data: vec![3u8].into(),
                close: false,
            }),
            // The run's terminal hangs up with this one, or the run is
            // asked to end: delivered to every process of the run.
            (sig @ (Signal::SIGTERM | Signal::SIGHUP), Some(run_id)) => {
                Request::ProcessKill(ProcessKill {
                    agent_id: agent.clone(),
                    session_id: session.clone(),
                    run_id: Some(run_id.clone()),
                    signal: Some(sig as i32),
                })
            }
            (Signal::SIGWINCH | Signal::SIGINT, None) => continue,
            (other, _) => {
                restore();
                let _ = std::io::stderr().write_all(
                    format!(
                        "\nalloxctl: {other}: leaving the run going (alloxctl attach follows it again)\n"
                    )
                    .as_bytes(),
                );
                std::process::exit(128 + other as i32);
            }
        };
        let _ = sender.call(request);
    }
}
