//! Clients that would starve the supervisor: many idle connections, frames
//! that trickle in a byte at a time, a client that asks for much and reads
//! nothing.

use allox_integration::{require, BtrfsFs, Daemon};
use allox_protocol::*;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

const CONV: u64 = 5;

fn setup(name: &str, args: &[&str]) -> Option<(BtrfsFs, Daemon)> {
    if !require(name) {
        return None;
    }
    std::fs::create_dir_all("/var/tmp").ok();
    let fs = BtrfsFs::new(512).expect("make btrfs");
    let root = fs.path().join("store");
    std::fs::create_dir(&root).unwrap();
    let sock = fs.scratch().join("ctl.sock");
    let d = Daemon::start(&root, &sock, &[], args);
    Some((fs, d))
}

fn hello() -> Vec<u8> {
    encode(&ClientFrame::Hello(Hello::new(CONV))).unwrap()
}

fn req(id: u64, r: Request) -> Vec<u8> {
    encode(&ClientFrame::Request(RequestEnvelope {
        conversation: CONV,
        request_id: id,
        request: r,
    }))
    .unwrap()
}

/// Connects and says Hello; waits for the Welcome.
fn greeted(d: &Daemon) -> UnixStream {
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.write_all(&hello()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut r = FrameReader::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(f) = r.next_frame() {
            let f: ServerFrame = decode(&f.unwrap()).unwrap();
            assert!(matches!(f, ServerFrame::Welcome(_)), "{f:?}");
            return s;
        }
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed before Welcome");
        r.push(&buf[..n]);
    }
}

/// The daemon's resident memory, in KiB.
fn rss_kib(d: &Daemon) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{}/status", d.child.id())).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn ping_time(d: &Daemon) -> Duration {
    let t = Instant::now();
    let mut c = d.client();
    c.call(Request::Ping(Ping {})).unwrap().unwrap();
    t.elapsed()
}

#[test]
fn a_thousand_idle_clients_do_not_lock_out_a_new_one() {
    let Some((_fs, d)) = setup("clients::a_thousand_idle_clients", &[]) else {
        return;
    };
    let before = rss_kib(&d);
    let idle: Vec<UnixStream> = (0..1000).map(|_| greeted(&d)).collect();
    // While all of them stay connected, a new client connects, says Hello
    // and gets its ping answered at once.
    let mut times: Vec<Duration> = (0..20).map(|_| ping_time(&d)).collect();
    times.sort();
    let median = times[times.len() / 2];
    assert!(
        median < Duration::from_millis(100),
        "a new client waited {median:?} (median of 20) beside 1,000 idle ones: {times:?}"
    );
    // They are still connected: each still answers.
    for (i, mut s) in idle.into_iter().enumerate().step_by(97) {
        s.write_all(&req(i as u64 + 1, Request::Ping(Ping {})))
            .unwrap();
        let mut b = [0u8; 256];
        assert!(s.read(&mut b).unwrap() > 0, "idle client {i} was dropped");
    }
    let grown = rss_kib(&d).saturating_sub(before);
    eprintln!("1,000 idle connections: supervisor RSS grew by {grown} KiB");
    assert!(grown < 64 * 1024, "1,000 idle clients cost {grown} KiB");
}

#[test]
fn at_the_connection_limit_the_longest_idle_client_makes_room() {
    // The daemon serves at most a quarter of its descriptors as clients;
    // with a low descriptor limit that is 16 connections.
    let Some((fs, _d)) = setup("clients::at_the_connection_limit", &[]) else {
        return;
    };
    drop(_d);
    let root = fs.path().join("store");
    let sock = fs.scratch().join("ctl2.sock");
    let exe = allox_integration::workspace_bin("allox-init");
    // prlimit lowers the hard limit the daemon can raise to.
    let mut cmd = std::process::Command::new("prlimit");
    cmd.arg("--nofile=64:64")
        .arg(&exe)
        .args(["supervise", "--root"])
        .arg(&root)
        .arg("--listen")
        .arg(format!("unix:{}", sock.display()))
        .arg("--no-processes")
        .env("ALLOX_LOG", "warn")
        .stdin(std::process::Stdio::null());
    let mut child = cmd.spawn().unwrap();
    let t0 = Instant::now();
    while UnixStream::connect(&sock).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "daemon did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // One after the other, each served (its Welcome came) before the
    // next, a few milliseconds apart: the first is the longest idle,
    // however busy the machine, and the limit is reached before the 17th.
    let first: Vec<UnixStream> = (0..16)
        .map(|_| {
            let mut s = UnixStream::connect(&sock).unwrap();
            s.write_all(&hello()).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut byte = [0u8; 1];
            let mut seen = 0;
            loop {
                match s.read(&mut byte) {
                    Ok(1) if byte[0] == 0 && seen > 0 => break,
                    Ok(1) => seen += 1,
                    other => panic!("no Welcome: {other:?}"),
                }
            }
            std::thread::sleep(Duration::from_millis(5));
            s
        })
        .collect();
    // The 17th client is served; the oldest idle one was closed for it.
    let mut c = allox_ctl::Client::connect(&sock).unwrap();
    c.call(Request::Ping(Ping {})).unwrap().unwrap();
    let mut oldest = first.into_iter().next().unwrap();
    oldest
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut all = Vec::new();
    let mut b = [0u8; 4096];
    loop {
        match oldest.read(&mut b) {
            Ok(0) | Err(_) => break,
            Ok(n) => all.extend_from_slice(&b[..n]),
        }
    }
    let text = String::from_utf8_lossy(&all);
    assert!(
        text.contains("idle the longest"),
        "the oldest idle client was not told why it was closed: {text:?}"
    );
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    );
    let _ = child.wait();
}

#[test]
fn a_frame_trickling_in_is_cut_off_at_its_deadline() {
    let Some((_fs, d)) = setup(
        "clients::a_frame_trickling_in",
        &["--stall-timeout-ms", "2000", "--frame-timeout-ms", "3000"],
    ) else {
        return;
    };
    let mut s = greeted(&d);
    // One byte every 500 ms: every read comes well within the stall limit,
    // but the frame never ends.
    let frame = req(1, Request::AgentCreate(AgentCreate::new("a".repeat(60))));
    let t0 = Instant::now();
    let mut closed_after = None;
    s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    for b in frame.iter().take(frame.len() - 1).cycle().take(40) {
        if s.write_all(&[*b]).is_err() {
            closed_after = Some(t0.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let closed_after = closed_after.unwrap_or_else(|| {
        // The writes may all land in the socket buffer: then the read end
        // tells.
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let mut b = [0u8; 64];
        match s.read(&mut b) {
            Ok(0) | Err(_) => t0.elapsed(),
            Ok(_) => panic!("the trickling frame was answered"),
        }
    });
    assert!(
        closed_after < Duration::from_secs(8),
        "a frame trickling in held the connection {closed_after:?} (frame limit 3 s)"
    );
    // Others are served.
    assert!(ping_time(&d) < Duration::from_secs(1));
}

#[test]
fn a_client_that_reads_nothing_holds_a_bounded_amount_of_memory() {
    let Some((_fs, d)) = setup(
        "clients::a_client_that_reads_nothing",
        &["--write-timeout-ms", "30000"],
    ) else {
        return;
    };
    // A long audit log: each audit.list answer is most of a frame.
    let mut c = d.client();
    for i in 0..6000 {
        let r = c
            .call(Request::AgentCreate(AgentCreate::new(format!(
                "bad name with spaces {i:05} {}",
                "x".repeat(40)
            ))))
            .unwrap();
        assert!(r.is_err());
    }
    let before = rss_kib(&d);
    let list = req(
        9,
        Request::AuditList(AuditList {
            after_seq: None,
            limit: Some(10_000),
            before_seq: None,
        }),
    );
    let one = {
        let mut s = greeted(&d);
        s.write_all(&list).unwrap();
        let mut r = FrameReader::new();
        let mut b = vec![0u8; 1 << 16];
        loop {
            let n = s.read(&mut b).unwrap();
            r.push(&b[..n]);
            if let Some(f) = r.next_frame() {
                break f.unwrap().len();
            }
        }
    };
    // 400 of them, never reading an answer.
    let mut flood = greeted(&d);
    flood
        .set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let flooder = std::thread::spawn(move || {
        let mut sent = 0;
        while sent < 400 && flood.write_all(&list).is_ok() {
            sent += 1;
        }
        (sent, flood)
    });
    std::thread::sleep(Duration::from_secs(5));
    let grown = rss_kib(&d).saturating_sub(before);
    let (sent, _flood) = flooder.join().unwrap();
    eprintln!(
        "answers of {one} bytes, {sent} requested, none read: supervisor RSS grew by {grown} KiB"
    );
    // The write queue holds 4 MiB, and at most 4 answers are being made at
    // once (each several times its size while it is read and encoded);
    // the allocator keeps some of what was freed. Without these bounds
    // the same flood grew the supervisor by about 150 MiB.
    let bound = 64 * 1024;
    assert!(
        grown < bound,
        "a client that reads nothing made the supervisor grow by {grown} KiB (bound {bound} KiB)"
    );
    assert!(ping_time(&d) < Duration::from_secs(1));
}
