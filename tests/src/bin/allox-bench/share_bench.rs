//! Sharing: what a session pays to reach another's files through the share
//! plugin — a `plugin.call` over its guest socket, decided, resolved
//! beneath the target's scope and audited — against the host reading the
//! same file with `fs.read` over the control socket.

use allox_integration::BtrfsFs;
use allox_protocol::sandbox_api::{
    PluginCall, SandboxClientFrame, SandboxHello, SandboxRequest, SandboxRequestEnvelope,
    SandboxResponse, SandboxServerFrame,
};
use allox_protocol::{
    decode, encode, AgentCreate, FrameReader, FsRead, FsScope, ProcessStart, Request, Response,
    SessionCreate,
};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::{pct, us_or_ms};

/// A kept connection to a run's guest socket: the run is the caller.
struct Guest {
    s: UnixStream,
    reader: FrameReader,
    next: u64,
}

impl Guest {
    fn connect(path: &std::path::Path) -> anyhow::Result<Guest> {
        let mut s = UnixStream::connect(path)?;
        s.write_all(&encode(&SandboxClientFrame::Hello(SandboxHello::new()))?)?;
        let mut g = Guest {
            s,
            reader: FrameReader::new(),
            next: 1,
        };
        match g.frame()? {
            SandboxServerFrame::Welcome(_) => Ok(g),
            other => anyhow::bail!("not welcomed: {other:?}"),
        }
    }

    fn frame(&mut self) -> anyhow::Result<SandboxServerFrame> {
        let mut buf = vec![0u8; 1 << 20];
        loop {
            if let Some(f) = self.reader.next_frame() {
                return Ok(decode(&f?)?);
            }
            let n = self.s.read(&mut buf)?;
            anyhow::ensure!(n > 0, "the guest socket closed");
            self.reader.push(&buf[..n]);
        }
    }

    fn call(&mut self, route: &str, params: serde_json::Value) -> anyhow::Result<String> {
        self.next += 1;
        let req = SandboxClientFrame::Request(SandboxRequestEnvelope {
            request_id: self.next,
            request: SandboxRequest::PluginCall(PluginCall {
                route: route.into(),
                params: params.to_string(),
            }),
        });
        self.s.write_all(&encode(&req)?)?;
        match self.frame()? {
            SandboxServerFrame::Response(r) => match Result::from(r.outcome) {
                Ok(SandboxResponse::Plugin(p)) => Ok(p.result),
                other => anyhow::bail!("{route}: {other:?}"),
            },
            other => anyhow::bail!("{route}: {other:?}"),
        }
    }
}

/// The guest socket serves the run's own processes only: the benchmark
/// joins the run's cgroup for as long as it takes to connect and be
/// welcomed (the listener checks the peer at `accept`), then goes back to
/// its own.
fn connect_as_run(sock: &std::path::Path, run_cgroup: &std::path::Path) -> anyhow::Result<Guest> {
    let mount =
        allox_integration::cgroup2_mount().ok_or_else(|| anyhow::anyhow!("no cgroup2 mount"))?;
    let own = std::fs::read_to_string("/proc/self/cgroup")?;
    let own = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or_else(|| anyhow::anyhow!("no cgroup2 line in /proc/self/cgroup"))?;
    let home = mount.join(own.trim_start_matches('/'));
    let me = std::process::id().to_string();
    std::fs::write(run_cgroup.join("cgroup.procs"), &me)?;
    let g = Guest::connect(sock);
    std::fs::write(home.join("cgroup.procs"), &me)?;
    g
}

fn times(n: usize, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<Vec<Duration>> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n + 20 {
        let t = Instant::now();
        f()?;
        if i >= 20 {
            out.push(t.elapsed());
        }
    }
    Ok(out)
}

pub fn run(fs: &BtrfsFs, quick: bool) -> anyhow::Result<()> {
    let bd = crate::BenchDaemon::start(fs, "share", &["--share-tools"])?;
    let mut c = bd.daemon.client();
    let mut ok =
        |r: Request| -> anyhow::Result<Response> { c.call(r)?.map_err(anyhow::Error::msg) };
    for (a, s) in [("a", "s"), ("b", "s")] {
        let _ = ok(Request::AgentCreate(AgentCreate::new(a)));
        ok(Request::SessionCreate(SessionCreate::new(a, s)))?;
    }
    let start = |a: &str, script: &str, wait: bool| ProcessStart {
        wait,
        ..allox_integration::process_start(a, "s", &["/bin/sh", "-c", script])
    };
    ok(Request::ProcessStart(start(
        "b",
        "head -c 4096 /dev/urandom > small && head -c 1048576 /dev/urandom > big && allox share enable",
        true,
    )))?;
    ok(Request::ProcessStart(start(
        "a",
        "allox share enable",
        true,
    )))?;
    // A run of a that stays, whose guest socket the benchmark speaks on.
    let Response::Started(r) = ok(Request::ProcessStart(start("a", "exec sleep 600", false)))?
    else {
        anyhow::bail!("the caller's run did not start");
    };
    let sock = allox_supervisor::sandbox_api::dir_for(&bd.socket)
        .join(&r.run_id)
        .join("sock");
    let run_cgroup = bd.cgroup.join(format!("allox/a/s/run-{}", r.run_id));
    let mut g = connect_as_run(&sock, &run_cgroup)?;
    let n = if quick { 200 } else { 2000 };
    let big_n = if quick { 20 } else { 100 };

    let mut host = bd.daemon.client();
    let fs_read = |path: &str, offset: u64| {
        Request::FsRead(FsRead {
            agent_id: "b".into(),
            session_id: "s".into(),
            scope: FsScope::Session,
            checkpoint_id: None,
            path: path.into(),
            offset: Some(offset),
            length: None,
        })
    };
    let host_small = times(n, || {
        host.call(fs_read("small", 0))?
            .map_err(anyhow::Error::msg)?;
        Ok(())
    })?;
    let share_small = times(n, || {
        g.call(
            "share.read",
            serde_json::json!({"target": "b/s", "path": "small"}),
        )?;
        Ok(())
    })?;
    let share_stat = times(n, || {
        g.call(
            "share.stat",
            serde_json::json!({"target": "b/s", "path": "small"}),
        )?;
        Ok(())
    })?;
    // 1 MiB whole: the host in 512 KiB answers, the share in 256 KiB ones
    // (each base64 in JSON), all from one tree.
    let host_big = times(big_n, || {
        let mut off = 0;
        while off < 1 << 20 {
            match host
                .call(fs_read("big", off))?
                .map_err(anyhow::Error::msg)?
            {
                Response::FsData(d) => off += d.data.len() as u64,
                other => anyhow::bail!("{other:?}"),
            }
        }
        Ok(())
    })?;
    let share_big = times(big_n, || {
        let (mut off, mut tree) = (0u64, None);
        while off < 1 << 20 {
            let text = g.call(
                "share.read",
                serde_json::json!({"target": "b/s", "path": "big", "offset": off, "tree": tree}),
            )?;
            let d: allox_protocol::ShareData = serde_json::from_str(&text)?;
            tree = Some(d.tree);
            off += d.file.data.len() as u64;
        }
        Ok(())
    })?;

    println!("## Sharing between sessions\n");
    println!(
        "A session's run reads another session's file through its guest socket \
         (`share.read`: decided, resolved beneath the target's scope, audited), one kept \
         connection, {n} times (1 MiB: {big_n} times); baseline: the host's `fs.read` of \
         the same file over the control socket.\n"
    );
    println!("| what | p50 | p99 | ratio (p50) |");
    println!("|---|---:|---:|---:|");
    let row = |what: &str, v: &[Duration], base: &[Duration]| {
        println!(
            "| {what} | {} | {} | {:.2}× |",
            us_or_ms(pct(v, 0.5)),
            us_or_ms(pct(v, 0.99)),
            pct(v, 0.5).as_secs_f64() / pct(base, 0.5).as_secs_f64()
        );
    };
    row("host `fs.read` 4 KiB (baseline)", &host_small, &host_small);
    row("`share.read` 4 KiB", &share_small, &host_small);
    row("`share.stat`", &share_stat, &host_small);
    row("host `fs.read` 1 MiB (baseline)", &host_big, &host_big);
    row("`share.read` 1 MiB, one tree", &share_big, &host_big);
    println!();
    let _ = ok(Request::ProcessKill(allox_protocol::ProcessKill {
        agent_id: "a".into(),
        session_id: "s".into(),
        run_id: Some(r.run_id),
        signal: None,
    }));
    Ok(())
}
