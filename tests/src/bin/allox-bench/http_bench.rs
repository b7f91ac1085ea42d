//! The HTTP gateway against the binary protocol: `system.ping` and
//! `checkpoint.list` (10 checkpoints) over the daemon's Unix socket on one
//! connection, through the gateway on one keep-alive connection, and
//! through the gateway with a new connection per request; a run's 100 MB
//! of output streamed over the socket and as NDJSON through the gateway;
//! a file of 256 MiB put and got through `/v1/files` with curl against
//! `cp --reflink=never` of it on the same disk; and, where the Python client can be imported, the SDK's call against
//! the same request made with raw httpx (`clients/python/bench_sdk.py`).

use allox_integration::http::KeepAlive;
use allox_integration::{gateway_token, BtrfsFs, Gateway};
use allox_protocol::{
    AgentCreate, CheckpointCreate, Event, Ping, Request, SessionCreate, SessionRef,
};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{pct, us_or_ms};

fn times(n: usize, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<Vec<Duration>> {
    for _ in 0..50 {
        f()?;
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        f()?;
        out.push(t.elapsed());
    }
    Ok(out)
}

pub fn run(fs: &BtrfsFs, quick: bool) -> anyhow::Result<()> {
    let bd = crate::BenchDaemon::start(fs, "http", &[])?;
    let mut c = bd.daemon.client();
    c.call(Request::AgentCreate(AgentCreate::new("bench")))?
        .map_err(anyhow::Error::msg)?;
    c.call(Request::SessionCreate(SessionCreate::new("bench", "s")))?
        .map_err(anyhow::Error::msg)?;
    for i in 0..10 {
        c.call(Request::CheckpointCreate(CheckpointCreate {
            agent_id: "bench".into(),
            session_id: "s".into(),
            checkpoint_id: format!("c{i}"),
            pinned: false,
            label: None,
        }))?
        .map_err(anyhow::Error::msg)?;
    }
    let gw = Gateway::start(&bd.socket, &[]);
    let token = gateway_token(&bd.socket);
    let n = if quick { 500 } else { 5000 };
    println!("## The HTTP gateway\n");
    println!("Each request to its answer, {n} of each after 50 to warm; the baseline is the binary protocol over the daemon's Unix socket on one connection.\n");
    println!("| request | path | p50 | p99 | p50 / socket |");
    println!("|---|---|---:|---:|---:|");
    // The floor: an HTTP round trip the gateway answers itself (a 404),
    // no daemon call.
    let mut one = KeepAlive::connect(gw.addr, &token);
    let floor = times(n, || {
        let (code, v) = one.post("/v1/nothing", "{}");
        anyhow::ensure!(code == 404, "{code} {v}");
        Ok(())
    })?;
    let list = Request::CheckpointList(SessionRef {
        agent_id: "bench".into(),
        session_id: "s".into(),
    });
    for (name, request, params) in [
        ("system.ping", Request::Ping(Ping {}), "{}"),
        (
            "checkpoint.list",
            list,
            r#"{"agent_id":"bench","session_id":"s"}"#,
        ),
    ] {
        let socket = times(n, || {
            c.call(request.clone())?.map_err(anyhow::Error::msg)?;
            Ok(())
        })?;
        let mut one = KeepAlive::connect(gw.addr, &token);
        let path = format!("/v1/rpc/{name}");
        let kept = times(n, || {
            let (code, v) = one.post(&path, params);
            anyhow::ensure!(code == 200, "{name}: {code} {v}");
            Ok(())
        })?;
        let fresh = times(n / 5, || {
            let (code, v) = KeepAlive::connect(gw.addr, &token).post(&path, params);
            anyhow::ensure!(code == 200, "{name}: {code} {v}");
            Ok(())
        })?;
        let base = pct(&socket, 0.5).as_secs_f64();
        for (label, t) in [
            ("Unix socket, binary (baseline)", &socket),
            (
                "gateway, its own 404 (no daemon call; one connection)",
                &floor,
            ),
            ("gateway, one keep-alive connection", &kept),
            ("gateway, a new connection each", &fresh),
        ] {
            println!(
                "| `{name}` | {label} | {} | {} | {:.2}× |",
                us_or_ms(pct(t, 0.5)),
                us_or_ms(pct(t, 0.99)),
                pct(t, 0.5).as_secs_f64() / base
            );
        }
    }

    // 100 MB of a run's output: over the socket, then through the gateway.
    let mb = if quick { 20 } else { 100 };
    let script = format!("head -c {}000000 /dev/zero", mb);
    let mut p = allox_integration::process_start("bench", "s", &["/bin/sh", "-c", &script]);
    p.stream = true;
    let t = Instant::now();
    let mut got = 0usize;
    c.call_with_events(Request::ProcessStart(p), |e| {
        if let Event::Output(o) = e {
            got += o.data.len();
        }
    })?
    .map_err(anyhow::Error::msg)?;
    let socket_time = t.elapsed();
    anyhow::ensure!(got == mb * 1_000_000, "{got} bytes over the socket");
    let body = serde_json::json!({"agent_id": "bench", "session_id": "s",
        "argv": ["/bin/sh", "-c", script], "wait": true, "stream": true});
    let t = Instant::now();
    let mut curl = Command::new("curl")
        .args(["-sS", "-N", "-H", &format!("Authorization: Bearer {token}")])
        .args([
            "-H",
            "Content-Type: application/json",
            "-H",
            "Accept: application/x-ndjson",
        ])
        .args(["--data-binary", &body.to_string()])
        .arg(format!("http://{}/v1/rpc/process.start", gw.addr))
        .stdout(Stdio::piped())
        .spawn()?;
    let mut lines = 0usize;
    let mut last = String::new();
    for line in BufReader::new(curl.stdout.take().expect("piped")).lines() {
        last = line?;
        lines += 1;
    }
    curl.wait()?;
    let http_time = t.elapsed();
    anyhow::ensure!(
        last.contains("\"exit_code\":0"),
        "the stream ended with {last}"
    );
    let rate = |d: Duration| mb as f64 / d.as_secs_f64();
    println!("\nA run's {mb} MB of output streamed to the client (the gateway's lines are JSON with base64 data, read by curl):\n");
    println!("| path | time | MB/s | ratio |");
    println!("|---|---:|---:|---:|");
    println!(
        "| Unix socket, binary events (baseline) | {} | {:.0} | 1.00× |",
        us_or_ms(socket_time),
        rate(socket_time)
    );
    println!(
        "| gateway, NDJSON ({lines} lines) | {} | {:.0} | {:.2}× |",
        us_or_ms(http_time),
        rate(http_time),
        http_time.as_secs_f64() / socket_time.as_secs_f64()
    );

    files(&gw, &token, quick)?;

    // The Python client against raw httpx, on the same gateway.
    let sdk = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/python");
    // Debian's interpreter, whose httpx the client uses (another python3
    // may come first on PATH).
    let python = ["/usr/bin/python3", "python3"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or("python3");
    let out = Command::new(python)
        .arg(sdk.join("bench_sdk.py"))
        .args(["--url", &format!("http://{}", gw.addr), "--token", &token])
        .args(["--n", if quick { "500" } else { "3000" }])
        .env("PYTHONPATH", &sdk)
        .output();
    match out {
        Ok(o) if o.status.success() => {
            println!("\n{}", String::from_utf8_lossy(&o.stdout).trim_end());
        }
        Ok(o) => println!(
            "\nSKIPPED the Python client's benchmark: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => println!("\nSKIPPED the Python client's benchmark: python3: {e}"),
    }
    println!();
    Ok(())
}

/// A file through the gateway's file routes with curl (`PUT` and `GET
/// /v1/files/...`), median of 3 each way, against `cp --reflink=never` of
/// the same file between two places on the machine's disk, in the same
/// run.
fn files(gw: &Gateway, token: &str, quick: bool) -> anyhow::Result<()> {
    let mib: u64 = if quick { 64 } else { 256 };
    let dir = tempfile::tempdir_in("/var/tmp")?;
    let src = dir.path().join("src.bin");
    crate::random_file(&src, mib)?;
    let url = format!("http://{}/v1/files/bench/s/big.bin", gw.addr);
    let auth = format!("Authorization: Bearer {token}");
    let timed = |cmd: &mut Command| -> anyhow::Result<Duration> {
        let t = Instant::now();
        let st = cmd.status()?;
        anyhow::ensure!(st.success(), "{cmd:?}: {st}");
        Ok(t.elapsed())
    };
    let (mut base, mut up, mut down) = (vec![], vec![], vec![]);
    for i in 0..3 {
        let copy = dir.path().join(format!("cp{i}.bin"));
        base.push(timed(
            Command::new("cp")
                .arg("--reflink=never")
                .arg(&src)
                .arg(&copy),
        )?);
        std::fs::remove_file(&copy)?;
        up.push(timed(
            Command::new("curl")
                .args(["-sS", "--fail", "-H", &auth, "-T"])
                .arg(&src)
                .arg(&url)
                .stdout(Stdio::null()),
        )?);
        let got = dir.path().join(format!("got{i}.bin"));
        down.push(timed(
            Command::new("curl")
                .args(["-sS", "--fail", "-H", &auth, "-o"])
                .arg(&got)
                .arg(&url),
        )?);
        anyhow::ensure!(
            std::fs::metadata(&got)?.len() == mib << 20,
            "the file came back with another size"
        );
        std::fs::remove_file(&got)?;
    }
    let rate = |v: &[Duration]| mib as f64 * 1.048576 / pct(v, 0.5).as_secs_f64();
    println!("\n{mib} MiB of random bytes through the gateway's file routes with curl (`PUT` and `GET /v1/files/...`), median of 3; baseline `cp --reflink=never` of the same file on the same disk:\n");
    println!("| what | MB/s | of `cp` |");
    println!("|---|---:|---:|");
    let b = rate(&base);
    for (what, v) in [
        ("`cp --reflink=never` (baseline)", &base),
        ("`PUT` into a session (curl -T)", &up),
        ("`GET` from a session (curl -o)", &down),
    ] {
        let r = rate(v);
        println!("| {what} | {r:.1} | {:.1}% |", 100.0 * r / b);
    }
    Ok(())
}
