//! Byte streams and terminals through the real daemon: every byte value
//! through `alloxctl exec`, runs on a terminal of the sandbox's own devpts
//! (its size, resizes, re-attach, TIOCSTI, the master never inside), a
//! person at `alloxctl exec -t` played by tmux (a shell, Ctrl-C, python3
//! -i, vi, the local terminal restored), and 1,000 terminal runs that
//! leave no descriptor behind in the supervisor.

use allox_integration::{call, needs, process_start as start, require, which, ProcDaemon};
use allox_protocol::*;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn setup(name: &str) -> Option<ProcDaemon> {
    if !require(&format!("terminals::{name}")) {
        return None;
    }
    let d = ProcDaemon::start(name, &[]);
    allox_integration::make_sessions(&d, &[("a", "s")]);
    Some(d)
}

fn pty(rows: u16, cols: u16) -> Option<PtySize> {
    Some(PtySize {
        rows,
        cols,
        term: None,
    })
}

/// A terminal run of `sh -c script` to its end.
fn sh_pty(d: &ProcDaemon, script: &str) -> RunResult {
    let mut p = start("a", "s", &["/bin/sh", "-c", script]);
    p.pty = pty(30, 100);
    p.stdin = None;
    match call(d, Request::ProcessStart(p)) {
        Ok(Response::Exited(r)) => r,
        other => panic!("{script}: {other:?}"),
    }
}

/// Starts a terminal run without waiting; its id.
fn start_pty(d: &ProcDaemon, argv: &[&str]) -> String {
    let mut p = start("a", "s", argv);
    p.pty = pty(24, 80);
    p.stdin = None;
    p.wait = false;
    match call(d, Request::ProcessStart(p)) {
        Ok(Response::Started(s)) => s.run_id,
        other => panic!("{argv:?}: {other:?}"),
    }
}

fn stdin(d: &ProcDaemon, run: &str, data: &[u8], close: bool) -> Result<Response, ErrorBody> {
    call(
        d,
        Request::ProcessStdin(ProcessStdin {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: run.into(),
            data: data.into(),
            close,
        }),
    )
}

/// Attaches to a run and collects its output until `until` is in it (at
/// most 30 s); returns it. The attachment stays until the run ends.
fn attach_until(d: &ProcDaemon, run: &str, replay: bool, until: &str) -> String {
    let rx = attach(d, run, replay);
    let mut out = Vec::new();
    let t0 = Instant::now();
    while !String::from_utf8_lossy(&out).contains(until) {
        let left = Duration::from_secs(30).saturating_sub(t0.elapsed());
        match rx.recv_timeout(left) {
            Ok(data) => out.extend(data),
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Attaches to a run from a thread of its own; its output as it comes.
fn attach(d: &ProcDaemon, run: &str, replay: bool) -> std::sync::mpsc::Receiver<Vec<u8>> {
    let mut c = d.daemon.client();
    let req = Request::ProcessAttach(ProcessAttach {
        agent_id: "a".into(),
        session_id: "s".into(),
        run_id: run.into(),
        replay: Some(replay),
    });
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        let _ = c.call_with_events(req, |e| {
            if let Event::Output(o) = e {
                let _ = tx.send(o.data.0);
            }
        });
    });
    rx
}

#[test]
fn every_byte_value_passes_through_alloxctl_exec_unchanged() {
    let Some(d) = setup("bytes") else { return };
    let all: Vec<u8> = (0..=255u8).cycle().take(256 * 64).collect();
    // stdin to stdout, through cat.
    let exec = |argv: &[&str], input: &[u8]| {
        let mut child = Command::new(allox_integration::workspace_bin("alloxctl"))
            .arg("--socket")
            .arg(&d.daemon.socket)
            .args(["exec", "--stdin-file", "-", "a", "s", "--"])
            .args(argv)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
        out
    };
    let out = exec(&["cat"], &all);
    assert_eq!(out.stdout.len(), all.len());
    assert!(out.stdout == all, "stdout differs from stdin");
    // stdin to stderr.
    let out = exec(&["/bin/sh", "-c", "cat >&2"], &all);
    assert!(out.stderr == all, "stderr differs from stdin");
    // `process.stdin` of a started run takes any bytes too.
    let mut p = start(
        "a",
        "s",
        &["/bin/sh", "-c", "cat > /allox/session/bytes.bin"],
    );
    p.stdin = None;
    p.wait = false;
    let Ok(Response::Started(s)) = call(&d, Request::ProcessStart(p)) else {
        panic!()
    };
    let bytes: Vec<u8> = (0..=255u8).rev().collect();
    stdin(&d, &s.run_id, &bytes[..100], false).unwrap();
    stdin(&d, &s.run_id, &bytes[100..], true).unwrap();
    let r = call(
        &d,
        Request::ProcessWait(ProcessWait {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: s.run_id.clone(),
            timeout_ms: Some(10_000),
        }),
    );
    assert!(matches!(r, Ok(Response::Exited(_))), "{r:?}");
    let file = d
        .daemon
        .root
        .join("agents/a/workspace/sessions/s/current/bytes.bin");
    assert_eq!(std::fs::read(file).unwrap(), bytes);
}

#[test]
fn a_terminal_run_has_a_terminal_of_its_own_devpts_of_its_size() {
    let Some(d) = setup("pty_basics") else { return };
    let r = sh_pty(
        &d,
        "t=$(tty); echo \"tty=$t\"; test -e \"$t\" && echo exists; stty size; \
         echo \"term=$TERM\"; ls /dev/pts | tr '\\n' ' '; echo; \
         for p in /proc/[0-9]*/fd/*; do readlink \"$p\"; done | grep -c ptmx; \
         echo err >&2",
    );
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let out = r.stdout.replace('\r', "");
    assert!(out.contains("tty=/dev/pts/0\n"), "{out}");
    assert!(out.contains("exists\n"), "{out}");
    assert!(out.contains("30 100\n"), "{out}");
    assert!(out.contains("term=xterm-256color\n"), "{out}");
    // Its own instance: one terminal, and no process inside holds a
    // master side.
    assert!(out.contains("0 ptmx \n"), "{out}");
    assert!(out.contains("\n0\n"), "{out}");
    // stderr is the terminal too.
    assert!(out.ends_with("err\n"), "{out}");
    // TIOCSTI still fails on it.
    let r = sh_pty(
        &d,
        "python3 -c 'import fcntl, termios; fcntl.ioctl(0, termios.TIOCSTI, b\"x\")' \
         && echo typed || echo refused",
    );
    assert!(r.stdout.contains("refused"), "{r:?}");
    // Bad sizes and types are refused naming what is wrong.
    for (rows, cols, term) in [(0, 80, None), (24, 0, None), (24, 80, Some("x y"))] {
        let mut p = start("a", "s", &["true"]);
        p.pty = Some(PtySize {
            rows,
            cols,
            term: term.map(str::to_string),
        });
        let e = call(&d, Request::ProcessStart(p)).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidRequest, "{e:?}");
        assert!(e.message.contains("terminal"), "{e:?}");
    }
    // Resizing and attaching to a run without a terminal is refused.
    let mut p = start("a", "s", &["sleep", "5"]);
    p.wait = false;
    let Ok(Response::Started(s)) = call(&d, Request::ProcessStart(p)) else {
        panic!()
    };
    let e = call(
        &d,
        Request::ProcessResize(ProcessResize {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: s.run_id.clone(),
            rows: 10,
            cols: 10,
        }),
    )
    .unwrap_err();
    assert!(e.message.contains("no terminal"), "{e:?}");
}

#[test]
fn resize_reaches_the_program_and_attach_replays_recent_output() {
    let Some(d) = setup("pty_resize_attach") else {
        return;
    };
    let run = start_pty(
        &d,
        &[
            "/bin/bash",
            "-c",
            "trap 'echo size=$(stty size)' WINCH; echo marker-before; \
             while read -r line; do echo \"got=$line\"; done; echo eof-seen",
        ],
    );
    // What it printed before anyone attached is replayed.
    let seen = attach_until(&d, &run, true, "marker-before");
    assert!(seen.contains("marker-before"), "{seen}");
    let r = call(
        &d,
        Request::ProcessResize(ProcessResize {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: run.clone(),
            rows: 40,
            cols: 120,
        }),
    );
    assert!(matches!(r, Ok(Response::Resized(_))), "{r:?}");
    // bash runs the trap once `read` returns: a line lets it.
    stdin(&d, &run, b"one\n", false).unwrap();
    let all = attach_until(&d, &run, true, "got=one");
    assert!(all.contains("got=one"), "{all}");
    assert!(all.contains("size=40 120"), "{all}");
    // Without replay only what comes after the attach: lines are typed
    // until one shows (the attach takes effect at some point after it is
    // sent), and what came before does not.
    let rx = attach(&d, &run, false);
    let mut seen = Vec::new();
    let t0 = Instant::now();
    while !String::from_utf8_lossy(&seen).contains("got=tick") {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no output after attach"
        );
        stdin(&d, &run, b"tick\n", false).unwrap();
        while let Ok(data) = rx.recv_timeout(Duration::from_millis(200)) {
            seen.extend(data);
        }
    }
    let seen = String::from_utf8_lossy(&seen);
    assert!(!seen.contains("marker-before"), "{seen}");
    assert!(!seen.contains("got=one"), "{seen}");
    // Closing stdin types end-of-file: `read` ends, the run ends.
    stdin(&d, &run, b"", true).unwrap();
    let r = call(
        &d,
        Request::ProcessWait(ProcessWait {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: run.clone(),
            timeout_ms: Some(10_000),
        }),
    );
    let Ok(Response::Exited(r)) = r else {
        panic!("{r:?}")
    };
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert!(r.stdout.contains("eof-seen"), "{r:?}");
}

#[test]
fn a_thousand_terminal_runs_leave_no_descriptor_in_the_supervisor() {
    let Some(d) = setup("pty_leak") else { return };
    // Descriptors of the last run may still be closing when it has been
    // answered (its guest listener, its terminal's reader): the fewest seen
    // within a second, or once the count is within bounds.
    let fds_now = || {
        std::fs::read_dir(format!("/proc/{}/fd", d.daemon.child.id()))
            .unwrap()
            .count()
    };
    let settled = |bound: usize| {
        let mut least = fds_now();
        for _ in 0..20 {
            if least <= bound {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
            least = least.min(fds_now());
        }
        least
    };
    // Warm: the session's context, the runtime's threads.
    for _ in 0..5 {
        assert_eq!(sh_pty(&d, "true").exit_code, Some(0));
    }
    let before = settled(0);
    let t0 = Instant::now();
    for i in 0..1000 {
        let r = sh_pty(&d, "echo x");
        assert_eq!(r.exit_code, Some(0), "run {i}: {r:?}");
    }
    let after = settled(before + 2);
    eprintln!(
        "1000 terminal runs in {:.1} s; supervisor descriptors {before} -> {after}",
        t0.elapsed().as_secs_f64()
    );
    assert!(after <= before + 2, "descriptors {before} -> {after}");
}

/// A tmux server of the test's own (its own socket), one window of
/// `cols` x `rows` running a shell, driven with send-keys and read with
/// capture-pane.
struct Tmux {
    socket: std::path::PathBuf,
}

impl Tmux {
    fn start(dir: &std::path::Path, cols: u16, rows: u16) -> Tmux {
        let t = Tmux {
            socket: dir.join("tmux.sock"),
        };
        let ok = t
            .cmd(&[
                "-f",
                "/dev/null",
                "new-session",
                "-d",
                "-x",
                &cols.to_string(),
                "-y",
                &rows.to_string(),
                "/bin/bash --norc --noprofile",
            ])
            .status()
            .unwrap()
            .success();
        assert!(ok, "tmux new-session");
        t
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("tmux");
        c.arg("-S").arg(&self.socket).args(args);
        c.env("TERM", "xterm-256color");
        c
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "0"];
        args.extend(keys);
        assert!(self.cmd(&args).status().unwrap().success());
    }

    /// Types `text` and Enter.
    fn line(&self, text: &str) {
        self.keys(&["-l", text]);
        self.keys(&["Enter"]);
    }

    fn screen(&self) -> String {
        let out = self
            .cmd(&["capture-pane", "-p", "-t", "0", "-S", "-200"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until the screen shows `what` (at most 20 s).
    fn wait_for(&self, what: &str) -> String {
        let t0 = Instant::now();
        loop {
            let s = self.screen();
            if s.contains(what) {
                return s;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the screen never showed {what:?}:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the screen shows `what` at least `n` times (at most
    /// 20 s): a message a step before already showed once is not this
    /// step's.
    fn wait_for_nth(&self, what: &str, n: usize) -> String {
        let t0 = Instant::now();
        loop {
            let s = self.screen();
            if s.matches(what).count() >= n {
                return s;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the screen never showed {what:?} {n} times:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the shell in the sandbox shows its prompt again, alone
    /// on the screen's last line (at most 20 s): a program that is giving
    /// the terminal back (vi, python) may take or drop what is typed
    /// before it has.
    fn wait_for_prompt(&self, prompt: &str) {
        let t0 = Instant::now();
        loop {
            let s = self.screen();
            if s.lines().rev().map(str::trim_end).find(|l| !l.is_empty()) == Some(prompt) {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the prompt {prompt:?} never came back:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]).status();
    }
}

#[test]
fn a_person_at_alloxctl_exec_t_in_tmux() {
    let name = "terminals::a_person_at_alloxctl_exec_t_in_tmux";
    if !needs(name, which("tmux").is_none().then(|| "tmux".to_string())) {
        return;
    }
    if !needs(
        name,
        which("vi").is_none().then(|| "vi (vim-tiny)".to_string()),
    ) {
        return;
    }
    let Some(d) = setup("pty_tmux") else { return };
    let dir = tempfile::tempdir().unwrap();
    let tmux = Tmux::start(dir.path(), 100, 30);
    // The host shell's terminal settings, to compare after alloxctl ends.
    tmux.line(&format!("stty -g > {}/before", dir.path().display()));
    let ctl = allox_integration::workspace_bin("alloxctl");
    tmux.line(&format!(
        "{} --socket {} exec -t a s -- /bin/bash --norc --noprofile -i",
        ctl.display(),
        d.daemon.socket.display()
    ));
    // A terminal of the sandbox's own, of the window's size.
    tmux.line("PS1='sandbox$ '; echo \"tty=$(tty)\"; stty size; echo size\"\"-shown");
    let s = tmux.wait_for("size-shown");
    assert!(s.contains("tty=/dev/pts/0"), "{s}");
    assert!(s.contains("30 100") || s.contains("29 100"), "{s}");
    // A resize of the window reaches the run.
    assert!(tmux
        .cmd(&["resize-window", "-t", "0", "-x", "120", "-y", "40"])
        .status()
        .unwrap()
        .success());
    std::thread::sleep(Duration::from_millis(300));
    tmux.line("echo size\"\"=$(stty size)");
    let s = tmux.wait_for("size=");
    assert!(
        s.contains("size=40 120") || s.contains("size=39 120"),
        "{s}"
    );
    // Ctrl-C stops the foreground job only: the shell goes on.
    tmux.line("sleep 100; echo after-sleep");
    std::thread::sleep(Duration::from_millis(500));
    tmux.keys(&["C-c"]);
    tmux.line("echo status\"\"=$?; echo shell\"\"-alive");
    let s = tmux.wait_for("shell-alive\n");
    assert!(s.contains("status=130"), "{s}");
    assert!(!s.contains("\nafter-sleep"), "{s}");
    // Job control: a job to the background and back.
    tmux.line("sleep 100");
    std::thread::sleep(Duration::from_millis(500));
    tmux.keys(&["C-z"]);
    tmux.line("jobs; kill -9 %1; echo jobs\"\"-done");
    let s = tmux.wait_for("jobs-done\n");
    assert!(s.contains("Stopped"), "{s}");
    // python3 -i.
    tmux.line("python3 -i -q");
    tmux.wait_for(">>>");
    tmux.line("print(6 * 7, 'from-python')");
    tmux.wait_for("42 from-python");
    tmux.keys(&["C-d"]);
    tmux.wait_for_prompt("sandbox$");
    // vi: a file written as a person would.
    // Each key goes once vi shows it is ready for it: its status line
    // for a new file, then the typed text back in its window.
    tmux.line("vi /allox/session/note.txt");
    tmux.wait_for("[New");
    tmux.keys(&["i"]);
    tmux.keys(&["-l", "typed in vi"]);
    tmux.wait_for("typed in vi");
    tmux.keys(&["Escape"]);
    tmux.keys(&["-l", ":wq"]);
    tmux.wait_for(":wq");
    tmux.keys(&["Enter"]);
    // Keys typed while vi is still ending may go to vi, not the shell (a
    // run of the whole suite once lost the next line so).
    tmux.wait_for_prompt("sandbox$");
    tmux.line("cat /allox/session/note.txt; echo vi\"\"-done");
    let s = tmux.wait_for("vi-done\n");
    assert!(s.contains("typed in vi"), "{s}");
    let note = d
        .daemon
        .root
        .join("agents/a/workspace/sessions/s/current/note.txt");
    assert_eq!(std::fs::read_to_string(note).unwrap(), "typed in vi\n");
    // The run ends; alloxctl exits with its status and gives the local
    // terminal back as it was.
    tmux.line("exit 7");
    // (Keys typed before alloxctl is gone are the run's, as in any
    // terminal program: wait for it to end.)
    let t0 = Instant::now();
    while Command::new("pgrep")
        .args(["-f", "exec -t a s --"])
        .stdout(Stdio::null())
        .status()
        .unwrap()
        .success()
    {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "alloxctl did not end"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    tmux.line("echo alloxctl\"\"=$?");
    tmux.wait_for("alloxctl=7");
    tmux.line(&format!(
        "stty -g > {0}/after; cmp {0}/before {0}/after && echo same\"\"-terminal",
        dir.path().display()
    ));
    tmux.wait_for("same-terminal\n");
    // The detach keys (Ctrl-P Ctrl-Q) leave alloxctl and give the terminal
    // back; the run goes on, and alloxctl names how to follow it again.
    tmux.line(&format!(
        "{} --socket {} exec -t a s -- /bin/sh -c 'echo started\"\"-here; sleep 1000'",
        ctl.display(),
        d.daemon.socket.display()
    ));
    tmux.wait_for("started-here");
    tmux.keys(&["C-p", "C-q"]);
    let s = tmux.wait_for("follows it again");
    assert!(s.contains("alloxctl attach a s "), "{s}");
    tmux.line(&format!(
        "echo left\"\"=$?; stty -g > {0}/after2; cmp {0}/before {0}/after2 && echo same\"\"-again",
        dir.path().display()
    ));
    let s = tmux.wait_for("same-again\n");
    assert!(s.contains("left=0"), "{s}");
    let sleeping = || {
        let runs = call(
            &d,
            Request::ProcessList(SessionRef {
                agent_id: "a".into(),
                session_id: "s".into(),
            }),
        );
        format!("{runs:?}").contains("sleep")
    };
    assert!(sleeping(), "the detached run goes on");
    // SIGTERM to alloxctl is delivered to the run, which ends with it;
    // alloxctl exits as the run did and restores the terminal.
    Command::new("pkill")
        .args(["-f", "sleep 1000"])
        .status()
        .unwrap();
    tmux.line(&format!(
        "{} --socket {} exec -t a s -- /bin/sh -c 'echo second\"\"-run; sleep 1001'; echo alloxctl\"\"=$?",
        ctl.display(),
        d.daemon.socket.display()
    ));
    tmux.wait_for("second-run");
    let pid = Command::new("pgrep")
        .args(["-n", "-f", "exec -t a s -- /bin/sh"])
        .output()
        .unwrap();
    let pid = String::from_utf8_lossy(&pid.stdout).trim().to_string();
    assert!(!pid.is_empty());
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let s = tmux.wait_for("alloxctl=143");
    assert!(!s.contains("leaving the run going"), "{s}");
    let t0 = Instant::now();
    while sleeping() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the run outlived SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A person at `alloxctl exec` (no terminal in the sandbox), played by
/// tmux: Ctrl-C stops the run as it would a local command, a second one
/// kills a run that ignores the first, `--detach-on-exit` leaves the run
/// going and names it, and an alloxctl killed outright takes its run with
/// it.
#[test]
fn ctrl_c_at_alloxctl_exec_stops_what_it_started() {
    let name = "terminals::ctrl_c_at_alloxctl_exec_stops_what_it_started";
    if !needs(name, which("tmux").is_none().then(|| "tmux".to_string())) {
        return;
    }
    let Some(d) = setup("ctrl_c_exec") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let tmux = Tmux::start(dir.path(), 120, 30);
    let ctl = allox_integration::workspace_bin("alloxctl");
    let exec = |flags: &str, n: u32, script: &str| {
        tmux.line(&format!(
            "{} --socket {} exec {flags} a s -- /bin/sh -c '{script}'; echo status{n}\"\"=$?",
            ctl.display(),
            d.daemon.socket.display()
        ));
    };
    let running = |what: &str| {
        let l = call(
            &d,
            Request::ProcessList(SessionRef {
                agent_id: "a".into(),
                session_id: "s".into(),
            }),
        );
        // A process's argv (`sleep 60N`, or the shell about to exec it),
        // not the number alone: the list's ids, pids and times hold digits
        // that may spell it too.
        let l = format!("{l:?}");
        l.contains(&format!("[\"sleep\", \"{what}\"]")) || l.contains(&format!("exec sleep {what}"))
    };
    let gone_within = |what: &str, limit: Duration| {
        let t0 = Instant::now();
        while running(what) {
            assert!(t0.elapsed() < limit, "{what} still runs after {limit:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let gone = |what: &str| gone_within(what, Duration::from_secs(20));
    // Ctrl-C: the run gets SIGINT, alloxctl exits 130 as the run did.
    exec("", 1, "echo ready\"\"1; exec sleep 601");
    tmux.wait_for("ready1");
    tmux.keys(&["C-c"]);
    tmux.wait_for("status1=130");
    gone("601");
    // A run that ignores SIGINT: the first Ctrl-C is said, the second kills.
    exec("", 2, "trap \"\" INT; echo ready\"\"2; exec sleep 602");
    tmux.wait_for("ready2");
    tmux.keys(&["C-c"]);
    // This run's own message (the first run's said it too): only then is
    // the second Ctrl-C a second signal, not one merged with the first
    // while both were pending.
    tmux.wait_for_nth("again to kill it", 2);
    assert!(
        running("602"),
        "the first Ctrl-C is an interrupt, not a kill"
    );
    tmux.keys(&["C-c"]);
    tmux.wait_for("status2=137");
    gone("602");
    // --detach-on-exit: alloxctl leaves, the run goes on.
    exec("--detach-on-exit", 3, "echo ready\"\"3; exec sleep 603");
    tmux.wait_for("ready3");
    tmux.keys(&["C-c"]);
    let s = tmux.wait_for("status3=0");
    assert!(s.contains("alloxctl logs -f a s "), "{s}");
    assert!(running("603"), "the detached run goes on");
    // alloxctl killed outright: the daemon ends the run it was following.
    exec("", 4, "echo ready\"\"4; exec sleep 604");
    tmux.wait_for("ready4");
    let pid = Command::new("pgrep")
        .args(["-n", "-f", "alloxctl.* exec .*sleep 604"])
        .output()
        .unwrap();
    let pid = String::from_utf8_lossy(&pid.stdout).trim().to_string();
    assert!(!pid.is_empty(), "alloxctl's pid");
    Command::new("kill").args(["-KILL", &pid]).status().unwrap();
    tmux.wait_for("status4=137");
    // Killed when its connection closes: not once the connection's last
    // answers have had their time to go out (10 s), which a quiet run
    // spent going on.
    gone_within("604", Duration::from_secs(5));
    assert!(running("603"), "only the run whose client went is killed");
}

/// `alloxctl logs` shows any run's output — started without a terminal —
/// what is kept, and with -f what comes until it ends, each line once;
/// `alloxctl attach` shows a terminal run's output once too (not again
/// when it ends).
#[test]
fn logs_and_attach_show_each_line_once() {
    let Some(d) = setup("logs_once") else { return };
    let sock = d.daemon.socket.clone();
    let ctl = |args: &[&str]| allox_integration::alloxctl(&sock, args);
    // A run without a terminal, its stdin left open (`start`).
    let (code, out, e) = ctl(&[
        "start",
        "a",
        "s",
        "--",
        "/bin/sh",
        "-c",
        "echo hello-start; echo warn-start >&2; read x; echo hello-end",
    ]);
    assert_eq!(code, 0, "{e}");
    let run = String::from_utf8_lossy(&out).trim().to_string();
    let kept = || {
        let t0 = Instant::now();
        loop {
            let (code, out, err) = ctl(&["logs", "a", "s", &run]);
            assert_eq!(code, 0, "{err}");
            let out = String::from_utf8_lossy(&out).into_owned();
            if out.contains("hello-start") || t0.elapsed() > Duration::from_secs(20) {
                return (out, err);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let (out, err) = kept();
    assert_eq!(out, "hello-start\n");
    assert!(err.contains("warn-start"), "{err}");
    // Follow: what is kept, then the rest as it comes, once.
    let (mut child, mut lines) =
        allox_integration::alloxctl_following(&sock, &["logs", "-f", "a", "s", &run]);
    assert_eq!(lines.next().unwrap().unwrap(), "hello-start");
    stdin(&d, &run, b"go\n", true).unwrap();
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    assert_eq!(rest, ["hello-end"]);
    assert!(child.wait().unwrap().success());
    // Ended: all of it, once.
    let (out, _) = kept();
    assert_eq!(out, "hello-start\nhello-end\n");
    // JSON carries how it ended.
    let (_, out, _) = ctl(&["--json", "logs", "a", "s", &run]);
    let v: serde_json::Value = serde_json::from_str(&String::from_utf8_lossy(&out)).unwrap();
    assert_eq!(v["result"]["exit_code"], 0, "{v}");
    // A terminal run followed with attach: each line once.
    let t = start_pty(
        &d,
        &["/bin/sh", "-c", "echo tty-start; read x; echo tty-end"],
    );
    let seen = attach_until(&d, &t, true, "tty-start");
    assert!(seen.contains("tty-start"), "{seen}");
    // alloxctl's input ends at once (not a terminal): the run's terminal
    // reads end of file, and the run ends while alloxctl follows it.
    let (code, out, e) = ctl(&["attach", "a", "s", &t]);
    assert_eq!(code, 0, "{e}");
    let out = String::from_utf8_lossy(&out);
    assert_eq!(out.matches("tty-start").count(), 1, "{out}");
    assert_eq!(out.matches("tty-end").count(), 1, "{out}");
}

/// `process.attach` says it follows (a `Started` event with the run's id
/// and pid) before any output, and `alloxctl attach` types into the
/// terminal only after it: with its stdin at its end, which ends the run
/// at once, each of 20 runs is still followed to its end (its last line
/// shown, its exit code given), never refused as gone.
#[test]
fn an_attach_follows_before_its_input_can_end_the_run() {
    let Some(d) = setup("attach_first") else {
        return;
    };
    let t = start_pty(
        &d,
        &["/bin/sh", "-c", "echo ready; read x; echo bye; exit 7"],
    );
    let mut c = d.daemon.client();
    let mut events = Vec::new();
    let mut typed = false;
    let answer = c.call_with_events(
        Request::ProcessAttach(ProcessAttach {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: t.clone(),
            replay: Some(true),
        }),
        |e| {
            if !typed && matches!(e, Event::Started(_)) {
                typed = true;
                stdin(&d, &t, b"", true).unwrap();
            }
            events.push(e);
        },
    );
    match &events[..] {
        [Event::Started(s), ..] => {
            assert_eq!(s.run_id, t);
            assert!(s.pid > 0, "{s:?}");
        }
        other => panic!("the attach's first event is not Started: {other:?}"),
    }
    assert!(
        !events[1..].iter().any(|e| matches!(e, Event::Started(_))),
        "{events:?}"
    );
    match answer {
        Ok(Ok(Response::Exited(r))) => assert_eq!(r.exit_code, Some(7), "{r:?}"),
        other => panic!("{other:?}"),
    }
    let out: Vec<u8> = events
        .iter()
        .filter_map(|e| match e {
            Event::Output(o) => Some(o.data.0.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    let out = String::from_utf8_lossy(&out);
    assert!(out.contains("bye"), "{out}");
    for i in 0..20 {
        let t = start_pty(&d, &["/bin/sh", "-c", "read x; echo after-eof; exit 3"]);
        let (code, out, e) =
            allox_integration::alloxctl(&d.daemon.socket, &["attach", "a", "s", &t]);
        let out = String::from_utf8_lossy(&out);
        assert_eq!(code, 3, "round {i}: {e} {out}");
        assert_eq!(out.matches("after-eof").count(), 1, "round {i}: {out}");
    }
}

/// `alloxctl logs -f` of a run streamed to its own `exec`: the follower
/// gets what the run writes from then on, while `exec` gets it all.
#[test]
fn logs_follow_a_run_streamed_to_its_exec() {
    use std::io::{BufRead, Write};
    let Some(d) = setup("logs_streamed") else {
        return;
    };
    let sock = d.daemon.socket.clone();
    let mut exec = Command::new(allox_integration::workspace_bin("alloxctl"))
        .arg("--socket")
        .arg(&sock)
        .args([
            "exec",
            "-i",
            "a",
            "s",
            "--",
            "/bin/sh",
            "-c",
            "echo one; read x; echo two",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(exec.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert_eq!(first, "one\n");
    let run = match call(
        &d,
        Request::ProcessList(SessionRef {
            agent_id: "a".into(),
            session_id: "s".into(),
        }),
    ) {
        Ok(Response::Processes(l)) => l.processes[0].run_id.clone().unwrap(),
        other => panic!("{other:?}"),
    };
    // As JSON lines: the daemon says when the follower follows.
    let (mut follower, mut lines) =
        allox_integration::alloxctl_following(&sock, &["--json", "logs", "-f", "a", "s", &run]);
    let said = lines.next().unwrap().unwrap();
    assert!(
        said.contains("progress") && said.contains("following"),
        "{said}"
    );
    let mut input = exec.stdin.take().unwrap();
    input.write_all(b"go\n").unwrap();
    drop(input);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert_eq!(rest, "two\n");
    assert!(exec.wait().unwrap().success());
    let got: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let output: Vec<&String> = got.iter().filter(|l| l.contains("\"output\"")).collect();
    assert_eq!(output.len(), 1, "{got:?}");
    // "two\n", base64.
    assert!(output[0].contains("dHdvCg=="), "{got:?}");
    assert!(got.join("\n").contains("\"exit_code\": 0"), "{got:?}");
    assert!(follower.wait().unwrap().success());
}

/// `alloxctl exec -t` fed from a pipe: the end of its input ends the
/// program's input, whether or not the input ends with a newline (a
/// line begun is handed over by a first end-of-file character, as at a
/// shell where `^D` is pressed twice; one alone left `wc -c` waiting, and
/// alloxctl with it, for ever).
#[test]
fn exec_t_fed_from_a_pipe_ends_with_its_input() {
    use std::io::{Read, Write};
    let Some(d) = setup("exec_t_pipe") else {
        return;
    };
    for (input, argv, want) in [
        (&b"hello"[..], &["wc", "-c"][..], "5"),
        (&b"hello\n"[..], &["wc", "-c"][..], "6"),
        (&b"abc"[..], &["cat"][..], "abc"),
    ] {
        let mut exec = Command::new(allox_integration::workspace_bin("alloxctl"))
            .arg("--socket")
            .arg(&d.daemon.socket)
            .args(["exec", "-t", "a", "s", "--"])
            .args(argv)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        exec.stdin.take().unwrap().write_all(input).unwrap();
        let status = allox_integration::wait_for_exit(&mut exec, Duration::from_secs(20));
        if status.is_none() {
            let _ = exec.kill();
            let _ = exec.wait();
        }
        let mut out = String::new();
        let _ = exec.stdout.take().unwrap().read_to_string(&mut out);
        let Some(status) = status else {
            panic!("{argv:?} fed {input:?} did not end: {out:?}");
        };
        assert!(status.success(), "{argv:?}: {status:?} {out:?}");
        assert!(out.contains(want), "{argv:?} fed {input:?}: {out:?}");
    }
}

/// A key typed at `alloxctl exec -t` while the session is held (the
/// operator's `session pause --hold`) is refused: alloxctl says so, and
/// goes on reading the keyboard — once the session is resumed, what is
/// typed reaches the run, and the detach keys still leave. (Before, the
/// refusal silently ended the keyboard's reading: the detach keys, Ctrl-C
/// and every later key did nothing.)
#[test]
fn a_refused_key_at_exec_t_is_said_and_the_keyboard_still_works() {
    let name = "terminals::a_refused_key_at_exec_t_is_said_and_the_keyboard_still_works";
    if !needs(name, which("tmux").is_none().then(|| "tmux".to_string())) {
        return;
    }
    let Some(d) = setup("refused_key") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let tmux = Tmux::start(dir.path(), 120, 30);
    let ctl = allox_integration::workspace_bin("alloxctl");
    let sock = d.daemon.socket.clone();
    tmux.line(&format!(
        "{} --socket {} exec -t a s -- /bin/sh -c 'echo ready\"\"-here; while read l; do echo got:$l; done'",
        ctl.display(),
        sock.display()
    ));
    tmux.wait_for("ready-here");
    let (code, _, err) =
        allox_integration::alloxctl(&sock, &["session", "pause", "a", "s", "--hold"]);
    assert_eq!(code, 0, "{err}");
    tmux.keys(&["-l", "x"]);
    let s = tmux.wait_for("input not passed to the run");
    assert!(s.contains("session.resume") || s.contains("resume"), "{s}");
    let (code, _, err) = allox_integration::alloxctl(&sock, &["session", "resume", "a", "s"]);
    assert_eq!(code, 0, "{err}");
    tmux.line("after-resume");
    tmux.wait_for("got:after-resume");
    tmux.keys(&["C-p", "C-q"]);
    tmux.wait_for("follows it again");
}
