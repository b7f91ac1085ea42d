//! The file API: a 4 KiB `fs.read` and `fs.write` against `process.start`
//! of `cat` (what a host had to do before), and a 256 MiB upload and
//! download against `cp` of the same file on the same disk: in frames (the
//! gateway's and the VM port's path), and with the open file passed to
//! the daemon (a local client's), from another filesystem and from the
//! store's own (a reflink).

use allox_ctl::files::{download_via, upload_via, Remote, Via};
use allox_integration::BtrfsFs;
use allox_protocol::{AgentCreate, FsRead, FsScope, FsWrite, Request, Response, SessionCreate};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::{pct, us_or_ms};

pub fn run(fs: &BtrfsFs, quick: bool) -> anyhow::Result<()> {
    let bd = crate::BenchDaemon::start(fs, "files", &[])?;
    let d = &bd.daemon;
    let mut c = d.client();
    c.call(Request::AgentCreate(AgentCreate::new("bench")))?
        .map_err(anyhow::Error::msg)?;
    c.call(Request::SessionCreate(SessionCreate::new("bench", "s")))?
        .map_err(anyhow::Error::msg)?;
    let page: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    c.call(Request::FsWrite(FsWrite::whole(
        "bench",
        "s",
        "page",
        page.clone(),
    )))?
    .map_err(anyhow::Error::msg)?;

    let n = if quick { 200 } else { 1000 };
    let (mut reads, mut writes, mut cats) = (Vec::new(), Vec::new(), Vec::new());
    let read = Request::FsRead(FsRead {
        agent_id: "bench".into(),
        session_id: "s".into(),
        scope: FsScope::Session,
        checkpoint_id: None,
        path: "page".into(),
        offset: None,
        length: None,
    });
    let cat = Request::ProcessStart(allox_integration::process_start(
        "bench",
        "s",
        &["/bin/cat", "page"],
    ));
    for i in 0..n + 10 {
        let t = Instant::now();
        let r = c.call(read.clone())?.map_err(anyhow::Error::msg)?;
        let el = t.elapsed();
        anyhow::ensure!(
            matches!(&r, Response::FsData(x) if x.data.len() == 4096),
            "{r:?}"
        );
        if i >= 10 {
            reads.push(el);
        }
        let t = Instant::now();
        c.call(Request::FsWrite(FsWrite::whole(
            "bench",
            "s",
            "page",
            page.clone(),
        )))?
        .map_err(anyhow::Error::msg)?;
        if i >= 10 {
            writes.push(t.elapsed());
        }
        let t = Instant::now();
        let r = c.call(cat.clone())?.map_err(anyhow::Error::msg)?;
        let el = t.elapsed();
        anyhow::ensure!(
            matches!(&r, Response::Exited(x) if x.exit_code == Some(0)),
            "{r:?}"
        );
        if i >= 10 {
            cats.push(el);
        }
    }
    println!("## Files\n");
    println!("A 4 KiB file over the Unix socket, {n} each, alternating.\n");
    println!("| what | p50 | p99 | ratio (p50) |");
    println!("|---|---:|---:|---:|");
    let base = pct(&cats, 0.5).as_secs_f64();
    for (name, v) in [
        ("`process.start` of `cat` with wait (baseline)", &cats),
        ("`fs.read`", &reads),
        ("`fs.write` (whole file, renamed into place)", &writes),
    ] {
        println!(
            "| {name} | {} | {} | {:.3}× |",
            us_or_ms(pct(v, 0.5)),
            us_or_ms(pct(v, 0.99)),
            pct(v, 0.5).as_secs_f64() / base
        );
    }

    // Watch: from a write's request to the watch's report of it.
    let (tx, rx) = std::sync::mpsc::channel::<(String, Instant)>();
    let socket = bd.socket.clone();
    std::thread::spawn(move || {
        let Ok(mut w) = allox_ctl::client::Client::connect(&socket) else {
            return;
        };
        let _ = w.call_with_events(
            Request::FsWatch(allox_protocol::FsWatch {
                agent_id: "bench".into(),
                session_id: "s".into(),
                scope: FsScope::Session,
                path: String::new(),
                recursive: false,
            }),
            |e| {
                if let allox_protocol::Event::Fs(e) = e {
                    let p = e.to.unwrap_or(e.path);
                    let _ = tx.send((p, Instant::now()));
                }
            },
        );
    });
    // The first event is the watch being ready.
    rx.recv_timeout(Duration::from_secs(10))?;
    let mut watched = Vec::new();
    for i in 0..n / 2 {
        let name = format!("w{i}");
        let t = Instant::now();
        c.call(Request::FsWrite(FsWrite::whole("bench", "s", &name, "x")))?
            .map_err(anyhow::Error::msg)?;
        loop {
            let (p, at) = rx.recv_timeout(Duration::from_secs(10))?;
            if p == name {
                watched.push(at - t);
                break;
            }
        }
    }
    println!(
        "\n`fs.watch`: a whole-file `fs.write` reported (its rename into place) {} after the request was sent at p50, {} at p99 ({} writes).",
        us_or_ms(pct(&watched, 0.5)),
        us_or_ms(pct(&watched, 0.99)),
        watched.len()
    );

    // Bulk: a file on the same Btrfs, copied in and out, against cp.
    let mib: u64 = if quick { 64 } else { 256 };
    let src = fs.scratch().join("bulk-src");
    crate::random_file(&src, mib)?;
    let remote = Remote {
        agent: "bench".into(),
        session: "s".into(),
        path: "bulk".into(),
        scope: FsScope::Session,
        checkpoint: None,
    };
    // The same bytes on the store's filesystem, for the reflink rows.
    let same = fs.path().join("bulk-same");
    std::fs::copy(&src, &same)?;
    let rate = |d: Duration| (mib << 20) as f64 / d.as_secs_f64() / 1e6;
    // cp, then each way of alloxctl's in and out, round by round.
    let mut rows: Vec<(&str, Vec<f64>)> = vec![
        ("`cp --reflink=never` (baseline)", vec![]),
        ("in, frames (512 KiB chunks)", vec![]),
        ("out, frames", vec![]),
        ("in, descriptor passed (other filesystem)", vec![]),
        ("out, descriptor passed (other filesystem)", vec![]),
        ("in, descriptor passed (same Btrfs: reflink)", vec![]),
        ("out, descriptor passed (same Btrfs: reflink)", vec![]),
    ];
    for i in 0..5 {
        let dst = fs.path().join(format!("cp-{i}"));
        let t = Instant::now();
        let st = Command::new("cp")
            .arg("--reflink=never")
            .arg(&src)
            .arg(&dst)
            .status()?;
        anyhow::ensure!(st.success(), "cp failed");
        rows[0].1.push(rate(t.elapsed()));
        std::fs::remove_file(&dst)?;
        let back = fs.scratch().join(format!("bulk-back-{i}"));
        let back_same = fs.path().join(format!("bulk-back-{i}"));
        let ways = [
            (Via::Frames, &src, &back),
            (Via::Auto, &src, &back),
            (Via::Auto, &same, &back_same),
        ];
        for (k, (via, from, to)) in ways.into_iter().enumerate() {
            let t = Instant::now();
            let up = upload_via(&mut c, from, &remote, via)?;
            rows[1 + 2 * k].1.push(rate(t.elapsed()));
            let t = Instant::now();
            let down = download_via(&mut c, &remote, to, via)?;
            rows[2 + 2 * k].1.push(rate(t.elapsed()));
            anyhow::ensure!(
                (up.framed == 1) == (via == Via::Frames)
                    && (down.framed == 1) == (via == Via::Frames),
                "{via:?}: the copy went another way ({up:?}, {down:?})"
            );
            if k == 2 {
                anyhow::ensure!(
                    up.reflink == 1 && down.reflink == 1,
                    "no reflink: {up:?} {down:?}"
                );
            }
            std::fs::remove_file(to)?;
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let cp = med(&mut rows[0].1);
    println!(
        "\n{mib} MiB, `alloxctl cp`'s library (`files::upload_via`/`download_via` on one connection), median of 5; the file's other end in a directory beside the loop-backed Btrfs (another filesystem) or on it:\n"
    );
    println!("| way | MB/s (p50) | ÷ `cp --reflink=never` |");
    println!("|---|---:|---:|");
    for (what, v) in rows.iter_mut() {
        let m = med(v);
        println!("| {what} | {m:.0} | {:.2}× |", m / cp);
    }
    println!();
    Ok(())
}
