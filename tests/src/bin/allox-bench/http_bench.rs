//! The HTTP gateway against the binary protocol: `system.ping` and
//! `checkpoint.list` (10 checkpoints) over the daemon's Unix socket on one
//! connection, through the gateway on one keep-alive connection, and
//! through the gateway with a new connection per request; a run's 100 MB
//! of output streamed over the socket and as NDJSON through the gateway;
//! a file of 256 MiB put and got through `/v1/files` with curl, in frames
//! and spooled, against `cp --reflink=never` of it between the same
//! filesystems; and, where the Python client can be imported, the SDK's call against
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

    files(fs, &bd.socket, &token, quick)?;

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
/// /v1/files/...`), median of 3 each way, for three gateways side by
/// side: files in frames (`--files-framed`), spooled on the machine's disk
/// and passed to the daemon, spooled on the store's Btrfs (a reflink).
/// The baselines, in the same run: `cp --reflink=never` of the same file
/// between the same two filesystems (the disk and the store's Btrfs, each
/// way), and within the disk.
fn files(fs: &BtrfsFs, socket: &std::path::Path, token: &str, quick: bool) -> anyhow::Result<()> {
    let mib: u64 = if quick { 64 } else { 256 };
    let dir = tempfile::tempdir_in("/var/tmp")?;
    let src = dir.path().join("src.bin");
    crate::random_file(&src, mib)?;
    let on_store = fs.path().join("bench-files");
    std::fs::create_dir_all(&on_store)?;
    let spool_disk = dir.path().join("spool");
    std::fs::create_dir(&spool_disk)?;
    let spool_store = on_store.join("spool");
    std::fs::create_dir(&spool_store)?;
    let gateways = [
        ("frames", Gateway::start(socket, &["--files-framed"])),
        (
            "spooled on the disk",
            Gateway::start(socket, &["--spool-dir", spool_disk.to_str().unwrap_or("")]),
        ),
        (
            "spooled on the store's Btrfs",
            Gateway::start(socket, &["--spool-dir", spool_store.to_str().unwrap_or("")]),
        ),
    ];
    let auth = format!("Authorization: Bearer {token}");
    let timed = |cmd: &mut Command| -> anyhow::Result<(Duration, String)> {
        let t = Instant::now();
        let out = cmd.stderr(Stdio::inherit()).output()?;
        anyhow::ensure!(out.status.success(), "{cmd:?}: {}", out.status);
        Ok((
            t.elapsed(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        ))
    };
    let cp = |from: &std::path::Path, to: &std::path::Path| -> anyhow::Result<Duration> {
        let (t, _) = timed(Command::new("cp").arg("--reflink=never").arg(from).arg(to))?;
        std::fs::remove_file(to)?;
        Ok(t)
    };
    let in_store = on_store.join("big.bin");
    std::fs::copy(&src, &in_store)?;
    let bare = bare_http(&src)?;
    let (mut floor_up, mut floor_down) = (vec![], vec![]);
    let (mut within, mut cp_in, mut cp_out) = (vec![], vec![], vec![]);
    let mut up: Vec<Vec<Duration>> = vec![vec![]; gateways.len()];
    let mut down: Vec<Vec<Duration>> = vec![vec![]; gateways.len()];
    let mut ways: Vec<(String, String)> = vec![Default::default(); gateways.len()];
    let session = fs
        .path()
        .join("http-store/agents/bench/workspace/sessions/s/current");
    for i in 0..3 {
        within.push(cp(&src, &dir.path().join("cp.bin"))?);
        cp_in.push(cp(&src, &on_store.join("cp.bin"))?);
        cp_out.push(cp(&in_store, &dir.path().join("cp.bin"))?);
        let url = format!("http://{bare}/f");
        floor_up.push(
            timed(
                Command::new("curl")
                    .args(["-sS", "--fail", "-o", "/dev/null", "-T"])
                    .arg(&src)
                    .arg(&url),
            )?
            .0,
        );
        let got = dir.path().join("got.bin");
        floor_down.push(
            timed(
                Command::new("curl")
                    .args(["-sS", "--fail", "-o"])
                    .arg(&got)
                    .arg(&url),
            )?
            .0,
        );
        std::fs::remove_file(&got)?;
        for (g, (_, gw)) in gateways.iter().enumerate() {
            // A new file each time, as `cp` makes (an old one's extents
            // freed outside the timing, as `cp`'s copy is removed).
            let name = format!("big-{g}-{i}.bin");
            let url = format!("http://{}/v1/files/bench/s/{name}", gw.addr);
            let w = "%header{allox-copied-by}";
            let (t, by) = timed(
                Command::new("curl")
                    .args([
                        "-sS",
                        "--fail",
                        "-o",
                        "/dev/null",
                        "-w",
                        w,
                        "-H",
                        &auth,
                        "-T",
                    ])
                    .arg(&src)
                    .arg(&url),
            )?;
            up[g].push(t);
            ways[g].0 = by;
            let got = dir.path().join("got.bin");
            let (t, by) = timed(
                Command::new("curl")
                    .args(["-sS", "--fail", "-w", w, "-H", &auth, "-o"])
                    .arg(&got)
                    .arg(&url),
            )?;
            down[g].push(t);
            ways[g].1 = by;
            anyhow::ensure!(
                std::fs::metadata(&got)?.len() == mib << 20,
                "the file came back with another size"
            );
            std::fs::remove_file(&got)?;
            std::fs::remove_file(session.join(&name))?;
        }
    }
    let rate = |v: &[Duration]| mib as f64 * 1.048576 / pct(v, 0.5).as_secs_f64();
    println!("\n{mib} MiB of random bytes through the gateway's file routes with curl (`PUT` and `GET /v1/files/...`), median of 3, three gateways side by side. Baselines in the same run: `cp --reflink=never` of the same file between the same two filesystems (the machine's disk, where curl reads and writes, and the store's Btrfs), and within the disk:\n");
    println!("| what | moved by | MB/s | of `cp` between the same filesystems | of `cp` within the disk | of the bare server |");
    println!("|---|---|---:|---:|---:|---:|");
    let (w, i, o) = (rate(&within), rate(&cp_in), rate(&cp_out));
    let (fu, fd) = (rate(&floor_up), rate(&floor_down));
    println!("| `cp --reflink=never` within the disk (baseline) | the kernel | {w:.1} | — | 100.0% | — |");
    println!("| `cp --reflink=never` disk → store (baseline in) | the kernel | {i:.1} | 100.0% | {:.1}% | — |", 100.0 * i / w);
    println!("| `cp --reflink=never` store → disk (baseline out) | the kernel | {o:.1} | 100.0% | {:.1}% | — |", 100.0 * o / w);
    println!("| curl -T to a bare server that reads and drops the body (floor in) | — | {fu:.1} | — | {:.1}% | 100.0% |", 100.0 * fu / w);
    println!("| curl -o from a bare server that sends the file (`sendfile`; floor out) | — | {fd:.1} | — | {:.1}% | 100.0% |", 100.0 * fd / w);
    for (g, (name, _)) in gateways.iter().enumerate() {
        let r = rate(&up[g]);
        println!(
            "| `PUT` (curl -T), {name} | {} | {r:.1} | {:.1}% | {:.1}% | {:.1}% |",
            ways[g].0,
            100.0 * r / i,
            100.0 * r / w,
            100.0 * r / fu
        );
        let r = rate(&down[g]);
        println!(
            "| `GET` (curl -o), {name} | {} | {r:.1} | {:.1}% | {:.1}% | {:.1}% |",
            ways[g].1,
            100.0 * r / o,
            100.0 * r / w,
            100.0 * r / fd
        );
    }
    Ok(())
}

/// A bare HTTP/1.1 server on the loopback, the floor of an HTTP transfer
/// on this machine: a `PUT` has its body read and dropped, a `GET` is
/// answered with `file` sent by the kernel (`std::io::copy` of a file to
/// a socket is `sendfile`). One connection at a time, each closed after
/// its answer. Returns its address; it lives as long as the process.
fn bare_http(file: &std::path::Path) -> anyhow::Result<std::net::SocketAddr> {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let file = file.to_path_buf();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match s.read(&mut byte) {
                    Ok(1) => head.push(byte[0]),
                    _ => break,
                }
            }
            let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
            let _ = if head.starts_with("put") {
                let len: u64 = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if head.contains("expect: 100-continue") {
                    let _ = s.write_all(b"HTTP/1.1 100 Continue\r\n\r\n");
                }
                let _ = std::io::copy(&mut (&s).take(len), &mut std::io::sink());
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            } else {
                std::fs::File::open(&file).and_then(|mut f| {
                    let len = f.metadata()?.len();
                    write!(
                        s,
                        "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
                    )?;
                    std::io::copy(&mut f, &mut s).map(|_| ())
                })
            };
        }
    });
    Ok(addr)
}
