//! Terminals: the echo round trip of a key typed into a terminal run
//! (`process.stdin`) until the program's echo of it comes back through
//! `process.attach`, against the same round trip through a run on pipes
//! (`process.stdin` to its output streamed by `process.start`).

use allox_ctl::client::Client;
use allox_integration::BtrfsFs;
use allox_protocol::{
    AgentCreate, Event, ProcessAttach, ProcessStdin, PtySize, Request, Response, SessionCreate,
};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::{pct, us_or_ms};

/// Output of a run as it comes, from a thread of its own.
fn follow(socket: &Path, request: Request) -> mpsc::Receiver<Event> {
    let (tx, rx) = mpsc::channel();
    let socket = socket.to_path_buf();
    std::thread::spawn(move || {
        let Ok(mut c) = Client::connect(&socket) else {
            return;
        };
        let _ = c.call_with_events(request, |e| {
            let _ = tx.send(e);
        });
    });
    rx
}

/// Waits until the output shows `what`.
fn until(rx: &mpsc::Receiver<Event>, what: &[u8]) -> anyhow::Result<()> {
    let mut seen = Vec::new();
    while !seen.windows(what.len()).any(|w| w == what) {
        if let Event::Output(o) = rx.recv_timeout(Duration::from_secs(10))? {
            seen.extend_from_slice(&o.data);
        }
    }
    Ok(())
}

/// `n` keys typed one at a time, each timed until its echo is back.
fn round_trips(
    c: &mut Client,
    rx: &mpsc::Receiver<Event>,
    run_id: &str,
    n: usize,
) -> anyhow::Result<Vec<Duration>> {
    let mut out = Vec::new();
    for i in 0..n + 10 {
        let key = b'a' + (i % 26) as u8;
        let t = Instant::now();
        c.call(Request::ProcessStdin(ProcessStdin {
            agent_id: "bench".into(),
            session_id: "s".into(),
            run_id: run_id.into(),
            data: vec![key].into(),
            close: false,
        }))?
        .map_err(anyhow::Error::msg)?;
        until(rx, &[key])?;
        if i >= 10 {
            out.push(t.elapsed());
        }
    }
    Ok(out)
}

pub fn run(fs: &BtrfsFs, quick: bool) -> anyhow::Result<()> {
    let bd = crate::BenchDaemon::start(fs, "tty", &[])?;
    let (d, socket) = (&bd.daemon, bd.socket.clone());
    let mut c = d.client();
    c.call(Request::AgentCreate(AgentCreate::new("bench")))?
        .map_err(anyhow::Error::msg)?;
    c.call(Request::SessionCreate(SessionCreate::new("bench", "s")))?
        .map_err(anyhow::Error::msg)?;
    let n = if quick { 200 } else { 1000 };

    // A terminal run: raw, no echo by the terminal, cat echoes.
    let mut p = allox_integration::process_start(
        "bench",
        "s",
        &["/bin/sh", "-c", "stty raw -echo; echo ready; exec cat"],
    );
    p.pty = Some(PtySize {
        rows: 24,
        cols: 80,
        term: None,
    });
    p.stdin = None;
    p.wait = false;
    let Response::Started(tty_run) = c
        .call(Request::ProcessStart(p))?
        .map_err(anyhow::Error::msg)?
    else {
        anyhow::bail!("process.start did not start");
    };
    let rx = follow(
        &socket,
        Request::ProcessAttach(ProcessAttach {
            agent_id: "bench".into(),
            session_id: "s".into(),
            run_id: tty_run.run_id.clone(),
            replay: Some(true),
        }),
    );
    until(&rx, b"ready")?;
    let tty = round_trips(&mut c, &rx, &tty_run.run_id, n)?;

    // The same through pipes.
    let mut p = allox_integration::process_start("bench", "s", &["/bin/cat"]);
    p.stdin = None;
    p.stream = true;
    let rx = follow(&socket, Request::ProcessStart(p));
    let pipe_run = loop {
        if let Event::Started(s) = rx.recv_timeout(Duration::from_secs(10))? {
            break s.run_id;
        }
    };
    let pipes = round_trips(&mut c, &rx, &pipe_run, n)?;

    println!("## Terminals\n");
    println!(
        "A key typed (`process.stdin`, one byte) until `cat`'s echo of it comes back as output, {n} keys, over the Unix socket.\n"
    );
    println!("| what | p50 | p99 | ratio (p50) |");
    println!("|---|---:|---:|---:|");
    let base = pct(&pipes, 0.5).as_secs_f64();
    for (name, v) in [
        (
            "run on pipes, output streamed by `process.start` (baseline)",
            &pipes,
        ),
        ("terminal run, output followed by `process.attach`", &tty),
    ] {
        println!(
            "| {name} | {} | {} | {:.2}× |",
            us_or_ms(pct(v, 0.5)),
            us_or_ms(pct(v, 0.99)),
            pct(v, 0.5).as_secs_f64() / base
        );
    }
    println!();
    Ok(())
}
