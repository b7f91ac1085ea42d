//! `alloxctl exec`, `start` and `wait`: running a program in a session,
//! passing its output through, and turning how it ended into alloxctl's
//! own exit status.
//!
//! Each command writes to two writers (alloxctl's stdout and stderr in the
//! binary, buffers in tests) and returns the exit status to end with.

use crate::render::{clean, render, run_status};
use allox_client::client::{Answer, Caller};
use allox_protocol::{
    ErrorBody, ErrorCode, Event, ProcessLogs, ProcessStart, ProcessWait, Request, Response,
    RunResult, StreamKind,
};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Exit status of a run killed by its timeout, as timeout(1) has it.
pub const TIMED_OUT: u8 = 124;

/// Exit status when alloxctl or the daemon failed, or the end of a run is
/// unknown.
pub const FAILED: u8 = 1;

/// alloxctl's exit status for how a run ended: the program's exit code,
/// 128 + N when signal N killed it, [`TIMED_OUT`] when its timeout did.
pub fn exit_code(r: &RunResult) -> u8 {
    if r.timed_out {
        return TIMED_OUT;
    }
    match (r.exit_code, r.signal) {
        (_, Some(sig)) => u8::try_from(128_i32.saturating_add(sig)).unwrap_or(u8::MAX),
        (Some(code), None) => u8::try_from(code).unwrap_or(FAILED),
        (None, None) => FAILED,
    }
}

/// Writes a streamed run's output to two writers as it comes.
pub struct OutputSink<'a> {
    stdout: &'a mut dyn Write,
    stderr: &'a mut dyn Write,
    /// The program's standard error ends mid-line: what alloxctl writes
    /// after it begins a line of its own.
    stderr_open: bool,
}

impl<'a> OutputSink<'a> {
    pub fn new(stdout: &'a mut dyn Write, stderr: &'a mut dyn Write) -> Self {
        OutputSink {
            stdout,
            stderr,
            stderr_open: false,
        }
    }

    /// Writes an output chunk to its stream and flushes it at once; other
    /// events are not output. A reader that went away (`| head`) is not an
    /// error: the run goes on and its status still counts.
    pub fn event(&mut self, event: Event) {
        if let Event::Output(chunk) = event {
            let w = match chunk.stream {
                StreamKind::Stdout => &mut *self.stdout,
                StreamKind::Stderr => {
                    if let Some(&last) = chunk.data.last() {
                        self.stderr_open = last != b'\n';
                    }
                    &mut *self.stderr
                }
            };
            let _ = w.write_all(&chunk.data).and_then(|()| w.flush());
        }
    }

    /// Ends the program's unfinished last line of standard error, if it
    /// left one, before alloxctl says something there.
    pub fn end_stderr_line(&mut self) {
        if std::mem::take(&mut self.stderr_open) {
            let _ = self.stderr.write_all(b"\n");
        }
    }
}

/// `alloxctl exec`: starts the run, waits for its end and exits as it did.
///
/// Without `json` the output is streamed to `stdout` and `stderr` as the
/// program writes it, and a run that did not exit normally is named on
/// `stderr`. With `json` the output is captured instead (up to
/// [`CAPTURE_LIMIT`] a stream, as the daemon captures it) and the run's
/// result is printed as JSON at the end. The run is streamed either way,
/// so that the connection follows it (its id known at once, the run
/// killed if alloxctl dies: `on_disconnect: kill` needs a stream).
pub fn exec(
    caller: &mut impl Caller,
    mut request: ProcessStart,
    json: bool,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8 {
    request.wait = true;
    request.stream = true;
    follow(caller, Request::ProcessStart(request), json, stdout, stderr)
}

/// The most of each stream `exec --json` keeps (the daemon's default
/// capture limit).
pub const CAPTURE_LIMIT: usize = 256 << 10;

/// A streamed run's output kept for its JSON result.
#[derive(Default)]
struct Captured {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    truncated: bool,
}

impl Captured {
    fn event(&mut self, event: Event) {
        if let Event::Output(chunk) = event {
            let to = match chunk.stream {
                StreamKind::Stdout => &mut self.stdout,
                StreamKind::Stderr => &mut self.stderr,
            };
            let room = CAPTURE_LIMIT - to.len();
            if chunk.data.len() > room {
                self.truncated = true;
            }
            to.extend_from_slice(&chunk.data[..chunk.data.len().min(room)]);
        }
    }
}

/// Sends `request` (a `process.start` that waits, or a `process.attach`),
/// passes the output it streams through, and exits as the run did (see
/// [`exec`]).
pub fn follow(
    caller: &mut impl Caller,
    request: Request,
    json: bool,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8 {
    let action = request.action();
    let mut captured = Captured::default();
    let answer = if json {
        call(caller, request, &mut |e| captured.event(e))
    } else {
        let mut sink = OutputSink::new(&mut *stdout, &mut *stderr);
        let answer = call(caller, request, &mut |e| sink.event(e));
        if matches!(&answer, Ok(Response::Exited(r)) if !r.stderr.is_empty()) {
            sink.end_stderr_line();
        }
        answer
    };
    let mut result = match answer {
        Ok(Response::Exited(r)) => r,
        Ok(_) => return unexpected(stderr, action),
        Err(body) => {
            report(stderr, &body);
            return refused_status(&body);
        }
    };
    if json {
        // What was streamed, where the daemon captured nothing: the
        // output, then what the daemon said at the run's end (its stderr
        // then holds only that, a note of the init's such as a /tmp not
        // kept whole; the streamed output was dropped for it before).
        let streamed = !captured.stdout.is_empty() || !captured.stderr.is_empty();
        if result.stdout.is_empty() && (streamed || result.stderr.is_empty()) {
            result.stdout = String::from_utf8_lossy(&captured.stdout).into_owned();
            let open =
                !result.stderr.is_empty() && captured.stderr.last().is_some_and(|&b| b != b'\n');
            result.stderr = format!(
                "{}{}{}",
                String::from_utf8_lossy(&captured.stderr),
                if open { "\n" } else { "" },
                result.stderr
            );
            result.truncated |= captured.truncated;
        }
        print(stdout, &json_text(&Response::Exited(result.clone())));
    } else {
        // Empty for a streamed run; a daemon that could not stream sends
        // the captured output here instead.
        print(stdout, &result.stdout);
        print(stderr, &result.stderr);
        let mut notes = String::new();
        if result.signal.is_some() || result.timed_out || result.exit_code.is_none() {
            notes.push_str(&format!(
                "alloxctl: run {} {}\n",
                clean(&result.run_id),
                run_status(&result)
            ));
        }
        if result.truncated {
            notes.push_str("alloxctl: output was truncated at the capture limit\n");
        }
        if result.output_dropped {
            notes.push_str(
                "alloxctl: output was dropped: the supervisor keeps only the newest finished runs' output\n",
            );
        }
        if let Some(e) = &result.effects {
            notes.push_str(&crate::render::effects_note(e));
        }
        print(stderr, &notes);
    }
    exit_code(&result)
}

/// `alloxctl start`: starts the run without waiting and prints its id
/// (alone on its line, for scripts), or the JSON result.
pub fn start(
    caller: &mut impl Caller,
    mut request: ProcessStart,
    json: bool,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8 {
    request.wait = false;
    request.stream = false;
    match call(caller, Request::ProcessStart(request), &mut |_| {}) {
        Ok(response @ Response::Started(_)) if json => {
            print(stdout, &json_text(&response));
            0
        }
        Ok(Response::Started(s)) => {
            print(stdout, &format!("{}\n", clean(&s.run_id)));
            0
        }
        Ok(_) => unexpected(stderr, "process.start"),
        Err(body) => report(stderr, &body),
    }
}

/// `alloxctl logs`: the run's kept output, then (`follow`) what it writes
/// as it comes; with `follow`, exits as the run did. With `json`, each
/// piece of output is a JSON line (`{"event": …}`) and the answer the last.
pub fn logs(
    caller: &mut impl Caller,
    request: ProcessLogs,
    json: bool,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8 {
    let follow = request.follow;
    let answer = if json {
        call(caller, Request::ProcessLogs(request), &mut |e| {
            let line = serde_json::json!({ "event": e });
            let _ = writeln!(stdout, "{line}");
        })
    } else {
        let mut sink = OutputSink::new(&mut *stdout, &mut *stderr);
        call(caller, Request::ProcessLogs(request), &mut |e| {
            sink.event(e)
        })
    };
    let l = match answer {
        Ok(Response::Logs(l)) => l,
        Ok(_) => return unexpected(stderr, "process.logs"),
        Err(body) => return report(stderr, &body),
    };
    if json {
        print(stdout, &json_text(&Response::Logs(l.clone())));
    } else {
        let _ = stdout.write_all(&l.stdout.0).and_then(|()| stdout.flush());
        let _ = stderr.write_all(&l.stderr.0);
        if l.truncated {
            print(stderr, "alloxctl: some of the run's output was not kept\n");
        }
    }
    match (&l.result, follow) {
        (Some(r), true) => exit_code(r),
        _ => 0,
    }
}

/// `alloxctl wait`: shows how the run ended and its captured output, and
/// exits as the run did (see [`exit_code`]).
pub fn wait(
    caller: &mut impl Caller,
    request: ProcessWait,
    json: bool,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> u8 {
    match call(caller, Request::ProcessWait(request), &mut |_| {}) {
        Ok(Response::Exited(r)) => {
            let code = exit_code(&r);
            let response = Response::Exited(r);
            let text = if json {
                json_text(&response)
            } else {
                render(&response)
            };
            print(stdout, &text);
            code
        }
        Ok(_) => unexpected(stderr, "process.wait"),
        Err(body) => report(stderr, &body),
    }
}

/// How `exec` exits when its run was refused: 127 for a program that is
/// not there (or cannot be run), as a shell exits for a command it cannot
/// find; [`FAILED`] for any other refusal.
pub fn refused_status(body: &ErrorBody) -> u8 {
    // The daemon's words for it (the runs' argument check).
    let missing = body.message.starts_with("program ")
        && (body.message.contains(" not found in the run's PATH")
            // (A daemon before this said so.)
            || body.message.contains(" not found in the sandbox's PATH")
            || body
                .message
                .contains(" does not exist in the sandbox or is not executable"));
    if body.code == ErrorCode::InvalidRequest && missing {
        NOT_FOUND
    } else {
        FAILED
    }
}

/// A shell's status for a command it cannot find.
pub const NOT_FOUND: u8 = 127;

/// One call; a transport failure becomes the protocol error it counts as.
fn call(caller: &mut impl Caller, request: Request, on_event: &mut dyn FnMut(Event)) -> Answer {
    caller
        .call_with_events(request, on_event)
        .unwrap_or_else(|err| Err(err.to_body()))
}

/// Prints `error: <code>: <message>` and returns [`FAILED`].
pub fn report(stderr: &mut dyn Write, body: &ErrorBody) -> u8 {
    print(
        stderr,
        &format!("error: {}\n", clean(&crate::render::refusal(body))),
    );
    FAILED
}

fn unexpected(stderr: &mut dyn Write, action: &str) -> u8 {
    let message = format!("the daemon answered {action} with an unexpected response");
    report(stderr, &ErrorBody::new(ErrorCode::Internal, message))
}

fn json_text(response: &Response) -> String {
    format!("{:#}\n", response.to_json())
}

/// Writes and flushes; a reader that went away is not an error.
fn print(w: &mut dyn Write, text: &str) {
    if !text.is_empty() {
        let _ = w.write_all(text.as_bytes()).and_then(|()| w.flush());
    }
}

#[derive(Debug, Error)]
pub enum StdinFileError {
    #[error("cannot read the stdin file {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the stdin file {} holds more than {STDIN_FILE_MAX} bytes, the most that go with the request: give it with -i instead (alloxctl exec -i AGENT SESSION -- PROGRAM < FILE), which streams it", path.display())]
    TooLarge { path: PathBuf },
}

/// The most bytes `--stdin-file` gives with the request (which must fit
/// one frame with the rest of it); more goes by `-i`.
pub const STDIN_FILE_MAX: usize = allox_protocol::MAX_FRAME - (64 << 10);

/// The bytes to give a program on its stdin: a file's content, or
/// alloxctl's own stdin for `-`, any bytes at all.
pub fn read_stdin_file(path: &Path) -> Result<Vec<u8>, StdinFileError> {
    // Read one byte past the most, to tell a file that is too large.
    let limit = STDIN_FILE_MAX as u64 + 1;
    let mut bytes = Vec::new();
    let read = if path == Path::new("-") {
        io::stdin().lock().take(limit).read_to_end(&mut bytes)
    } else {
        std::fs::File::open(path).and_then(|f| f.take(limit).read_to_end(&mut bytes))
    };
    read.map_err(|source| StdinFileError::Read {
        path: path.to_owned(),
        source,
    })?;
    if bytes.len() > STDIN_FILE_MAX {
        return Err(StdinFileError::TooLarge {
            path: path.to_owned(),
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use allox_client::client::ClientError;
    use allox_client::fake::Fake;
    use allox_protocol::{OutputChunk, RunStarted};
    use std::cell::RefCell;
    use std::collections::BTreeMap;
    use std::rc::Rc;

    fn result(exit_code: Option<i32>, signal: Option<i32>, timed_out: bool) -> RunResult {
        RunResult {
            run_id: "r1".into(),
            exit_code,
            signal,
            stdout: String::new(),
            stderr: String::new(),
            truncated: false,
            timed_out,
            output_dropped: false,
            output_lossy: false,
            usage: None,
            oom_killed: None,
            effects: None,
        }
    }

    fn chunk(stream: StreamKind, data: &[u8]) -> Event {
        Event::Output(OutputChunk {
            run_id: "r1".into(),
            stream,
            data: data.into(),
        })
    }

    fn request() -> ProcessStart {
        ProcessStart {
            agent_id: "a".into(),
            session_id: "s".into(),
            argv: vec!["make".into()],
            env: BTreeMap::new(),
            cwd: None,
            stdin: Some(Default::default()),
            timeout_ms: None,
            wait: true,
            stream: true,
            pty: None,
            trace: None,
            on_disconnect: Default::default(),
            recovery: None,
        }
    }

    /// Passes its events, then gives its answer; keeps the request.
    struct Streams {
        events: Vec<Event>,
        answer: Answer,
        seen: Vec<Request>,
    }

    impl Streams {
        fn new(events: Vec<Event>, answer: Answer) -> Self {
            Streams {
                events,
                answer,
                seen: Vec::new(),
            }
        }
    }

    impl Caller for Streams {
        fn call(&mut self, request: Request) -> Result<Answer, ClientError> {
            self.call_with_events(request, &mut |_| {})
        }

        fn call_with_events(
            &mut self,
            request: Request,
            on_event: &mut dyn FnMut(Event),
        ) -> Result<Answer, ClientError> {
            self.seen.push(request);
            self.events.drain(..).for_each(&mut *on_event);
            Ok(self.answer.clone())
        }
    }

    /// Runs one command against `caller`; returns its status, stdout and
    /// stderr.
    fn run(command: impl FnOnce(&mut dyn Write, &mut dyn Write) -> u8) -> (u8, String, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = command(&mut out, &mut err);
        (
            code,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    #[test]
    fn exit_codes_follow_the_shell() {
        assert_eq!(exit_code(&result(Some(0), None, false)), 0);
        assert_eq!(exit_code(&result(Some(3), None, false)), 3);
        assert_eq!(exit_code(&result(Some(255), None, false)), 255);
        assert_eq!(exit_code(&result(Some(256), None, false)), FAILED);
        assert_eq!(exit_code(&result(Some(-1), None, false)), FAILED);
        assert_eq!(exit_code(&result(None, Some(9), false)), 137);
        assert_eq!(exit_code(&result(None, Some(15), false)), 143);
        assert_eq!(exit_code(&result(None, Some(64), false)), 192);
        assert_eq!(exit_code(&result(None, Some(i32::MAX), false)), 255);
        assert_eq!(exit_code(&result(None, Some(9), true)), TIMED_OUT);
        assert_eq!(exit_code(&result(None, None, true)), TIMED_OUT);
        assert_eq!(exit_code(&result(None, None, false)), FAILED);
        let refused = |code, m: &str| refused_status(&ErrorBody::new(code, m));
        assert_eq!(
            refused(
                ErrorCode::InvalidRequest,
                "program \"nope\" not found in the run's PATH (/bin)"
            ),
            NOT_FOUND
        );
        assert_eq!(
            refused(
                ErrorCode::InvalidRequest,
                "program \"/x\" does not exist in the sandbox or is not executable"
            ),
            NOT_FOUND
        );
        assert_eq!(refused(ErrorCode::InvalidRequest, "argv is empty"), FAILED);
        assert_eq!(
            refused(
                ErrorCode::Conflict,
                "program \"x\" not found in the sandbox's PATH"
            ),
            FAILED
        );
    }

    /// A writer that logs each write and flush, in order, to a shared log.
    struct Logged {
        name: &'static str,
        log: Rc<RefCell<Vec<String>>>,
    }

    impl Write for Logged {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let text = String::from_utf8_lossy(buf);
            self.log.borrow_mut().push(format!("{} {text}", self.name));
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            self.log.borrow_mut().push(format!("{} flush", self.name));
            Ok(())
        }
    }

    #[test]
    fn chunks_go_to_their_stream_and_are_flushed_one_by_one() {
        let log = Rc::new(RefCell::new(Vec::new()));
        let mut out = Logged {
            name: "out",
            log: log.clone(),
        };
        let mut err = Logged {
            name: "err",
            log: log.clone(),
        };
        let mut sink = OutputSink::new(&mut out, &mut err);
        sink.event(Event::Started(RunStarted {
            run_id: "r1".into(),
            pid: 5,
        }));
        sink.event(chunk(StreamKind::Stdout, b"one\n"));
        sink.event(Event::Progress {
            message: "ignored".into(),
        });
        sink.event(chunk(StreamKind::Stderr, b"two"));
        sink.event(chunk(StreamKind::Stdout, b"three"));
        assert_eq!(
            *log.borrow(),
            [
                "out one\n",
                "out flush",
                "err two",
                "err flush",
                "out three",
                "out flush"
            ]
        );
    }

    #[test]
    fn a_closed_reader_does_not_stop_the_run() {
        struct Gone;
        impl Write for Gone {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut caller = Streams::new(
            vec![
                chunk(StreamKind::Stdout, b"lost"),
                chunk(StreamKind::Stderr, b"kept"),
            ],
            Ok(Response::Exited(result(Some(4), None, false))),
        );
        let mut err = Vec::new();
        let code = exec(&mut caller, request(), false, &mut Gone, &mut err);
        assert_eq!(code, 4);
        assert_eq!(err, b"kept");
    }

    #[test]
    fn exec_streams_output_and_exits_as_the_run_did() {
        let mut caller = Streams::new(
            vec![
                Event::Started(RunStarted {
                    run_id: "r1".into(),
                    pid: 5,
                }),
                chunk(StreamKind::Stdout, b"building\n"),
                chunk(StreamKind::Stderr, b"warning: x\n"),
                chunk(StreamKind::Stdout, &[0xff, b'\n']),
            ],
            Ok(Response::Exited(result(Some(2), None, false))),
        );
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = exec(&mut caller, request(), false, &mut out, &mut err);
        assert_eq!(code, 2);
        // Bytes pass through as they are.
        assert_eq!(out, b"building\n\xff\n");
        assert_eq!(err, b"warning: x\n");
        let [Request::ProcessStart(sent)] = &caller.seen[..] else {
            panic!("{:?}", caller.seen)
        };
        assert!(sent.wait && sent.stream);
    }

    #[test]
    fn exec_names_a_signal_or_timeout_on_stderr() {
        for (r, code, note) in [
            (
                result(None, Some(9), false),
                137,
                "alloxctl: run r1 killed by signal 9 (SIGKILL)\n",
            ),
            (
                result(None, Some(9), true),
                124,
                "alloxctl: run r1 timed out\n",
            ),
        ] {
            let mut caller = Streams::new(vec![], Ok(Response::Exited(r)));
            let got = run(|out, err| exec(&mut caller, request(), false, out, err));
            assert_eq!(got, (code, String::new(), note.to_owned()));
        }
    }

    #[test]
    fn exec_prints_output_the_daemon_captured_instead() {
        let r = RunResult {
            stdout: "out\n".into(),
            stderr: "err\n".into(),
            truncated: true,
            ..result(Some(0), None, false)
        };
        let mut caller = Streams::new(vec![], Ok(Response::Exited(r)));
        let got = run(|out, err| exec(&mut caller, request(), false, out, err));
        assert_eq!(
            got,
            (
                0,
                "out\n".to_owned(),
                "err\nalloxctl: output was truncated at the capture limit\n".to_owned()
            )
        );
    }

    #[test]
    fn exec_json_captures_and_prints_the_result() {
        // The run streamed (so that its connection follows it), its output
        // kept for the result, not printed as it came.
        let big = vec![b'x'; CAPTURE_LIMIT];
        let mut caller = Streams::new(
            vec![
                chunk(StreamKind::Stdout, b"hi\n"),
                chunk(StreamKind::Stderr, b"oops\n"),
                chunk(StreamKind::Stdout, &big),
            ],
            Ok(Response::Exited(result(None, Some(15), false))),
        );
        let (code, out, err) = run(|out, err| exec(&mut caller, request(), true, out, err));
        assert_eq!((code, err.as_str()), (143, ""));
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["run_id"], "r1");
        assert_eq!(v["signal"], 15);
        let stdout = v["stdout"].as_str().unwrap();
        assert!(
            stdout.starts_with("hi\nxxx") && stdout.len() == CAPTURE_LIMIT,
            "{}",
            stdout.len()
        );
        assert_eq!(v["stderr"], "oops\n");
        assert_eq!(v["truncated"], true);
        let [Request::ProcessStart(sent)] = &caller.seen[..] else {
            panic!("{:?}", caller.seen)
        };
        assert!(sent.wait && sent.stream);
        // A daemon that captured the output itself: its result as it is.
        let r = RunResult {
            stdout: "hi\n".into(),
            ..result(Some(0), None, false)
        };
        let mut caller = Streams::new(vec![], Ok(Response::Exited(r)));
        let (code, out, _) = run(|out, err| exec(&mut caller, request(), true, out, err));
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!((code, v["stdout"].as_str()), (0, Some("hi\n")));
    }

    #[test]
    fn errors_print_code_and_message_and_exit_1() {
        let mut refused = Fake {
            calls: 0,
            answer: |_| Ok(Err(ErrorBody::new(ErrorCode::NotFound, "no session a/s"))),
        };
        let got = run(|out, err| exec(&mut refused, request(), false, out, err));
        assert_eq!(
            got,
            (
                1,
                String::new(),
                "error: not_found: no session a/s\n".into()
            )
        );

        let mut gone = Fake {
            calls: 0,
            answer: |_| Err(ClientError::Closed),
        };
        let (code, out, err) = run(|out, err| start(&mut gone, request(), false, out, err));
        assert_eq!((code, out.as_str()), (1, ""));
        assert!(err.starts_with("error: unavailable: "), "{err}");

        let mut odd = Fake {
            calls: 0,
            answer: |_| Ok(Ok(Response::Killed(allox_protocol::Killed { killed: 1 }))),
        };
        let (code, _, err) = run(|out, err| exec(&mut odd, request(), false, out, err));
        assert_eq!(code, 1);
        assert!(err.starts_with("error: internal: "), "{err}");
    }

    #[test]
    fn start_prints_the_run_id_alone() {
        let started = Ok(Response::Started(RunStarted {
            run_id: "r7".into(),
            pid: 99,
        }));
        let mut caller = Streams::new(vec![], started.clone());
        let got = run(|out, err| start(&mut caller, request(), false, out, err));
        assert_eq!(got, (0, "r7\n".to_owned(), String::new()));
        let [Request::ProcessStart(sent)] = &caller.seen[..] else {
            panic!("{:?}", caller.seen)
        };
        assert!(!sent.wait && !sent.stream);

        let mut caller = Streams::new(vec![], started);
        let (code, out, _) = run(|out, err| start(&mut caller, request(), true, out, err));
        assert_eq!(code, 0);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!((&v["run_id"], &v["pid"]), (&"r7".into(), &99.into()));
    }

    #[test]
    fn wait_renders_the_end_and_exits_as_the_run_did() {
        let r = RunResult {
            stdout: "done\n".into(),
            ..result(Some(5), None, false)
        };
        let mut caller = Streams::new(vec![], Ok(Response::Exited(r)));
        let request = ProcessWait {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: "r1".into(),
            timeout_ms: Some(100),
        };
        let got = run(|out, err| wait(&mut caller, request.clone(), false, out, err));
        assert_eq!(
            got,
            (
                5,
                "run r1 exited with code 5\n--- stdout ---\ndone\n".to_owned(),
                String::new()
            )
        );
        assert_eq!(caller.seen, [Request::ProcessWait(request)]);
    }

    #[test]
    fn stdin_files_are_read_as_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("in.txt");
        std::fs::write(&text, "héllo\n").unwrap();
        assert_eq!(read_stdin_file(&text).unwrap(), "héllo\n".as_bytes());

        let binary = dir.path().join("in.bin");
        let all: Vec<u8> = (0..=255).collect();
        std::fs::write(&binary, &all).unwrap();
        assert_eq!(read_stdin_file(&binary).unwrap(), all);
        // More than goes with a request: refused, naming -i.
        let big = dir.path().join("big");
        std::fs::write(&big, vec![7u8; STDIN_FILE_MAX + 1]).unwrap();
        let e = read_stdin_file(&big).unwrap_err().to_string();
        assert!(e.contains("give it with -i"), "{e}");
        let most = dir.path().join("most");
        std::fs::write(&most, vec![7u8; STDIN_FILE_MAX]).unwrap();
        assert_eq!(read_stdin_file(&most).unwrap().len(), STDIN_FILE_MAX);

        let missing = dir.path().join("missing");
        let err = read_stdin_file(&missing).unwrap_err();
        let text = crate::error_chain(&err);
        assert!(text.contains(&missing.display().to_string()), "{text}");
    }
}
