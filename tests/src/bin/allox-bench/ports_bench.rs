//! A session's port through the gateway (`/v1/ports/…`) against the same
//! server asked from inside the session, for `allox-bench`
//! (`ALLOX_BENCH_ONLY=ports`, and with `http`): Python's `http.server` (HTTP/1.1, keeping
//! connections) in an `isolated` session answering a small file; curl inside the session
//! to `127.0.0.1:8000` is the baseline, curl on the host through the
//! gateway with its token the other side. Each request's time is curl's
//! own (`%{time_total}`: connect to the whole answer), so neither side
//! counts a process's start.

use allox_integration::{gateway_token, BtrfsFs, Gateway};
use allox_protocol::{AgentCreate, NetworkMode, PortExpose, Request, Response, SessionCreate};
use std::process::Command;
use std::time::Duration;

use crate::{pct, us_or_ms};

/// Times in seconds, one per line, as curl's `%{time_total}` prints them.
/// curl's own time of 50 requests on the host, each `curl -s ARGS`.
fn curl_times(args: &[&str]) -> anyhow::Result<Vec<Duration>> {
    let mut times = Vec::new();
    for _ in 0..50 {
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{time_total}\n"])
            .args(args)
            .output()?;
        times.extend(parse_times(&String::from_utf8_lossy(&out.stdout)));
    }
    Ok(times)
}

fn parse_times(text: &str) -> Vec<Duration> {
    text.lines()
        .filter_map(|l| l.trim().parse::<f64>().ok())
        .map(Duration::from_secs_f64)
        .collect()
}

pub fn run(fs: &BtrfsFs, quick: bool) -> anyhow::Result<()> {
    let n = if quick { 100 } else { 1000 };
    let bd = crate::BenchDaemon::start(fs, "ports", &[])?;
    let mut c = bd.daemon.client();
    c.call(Request::AgentCreate(AgentCreate::new("bench")))?
        .map_err(anyhow::Error::msg)?;
    let mut sc = SessionCreate::new("bench", "s");
    sc.network = Some(NetworkMode::Isolated);
    c.call(Request::SessionCreate(sc))?
        .map_err(anyhow::Error::msg)?;
    let start = |args: &[&str], wait: bool| {
        let mut p = allox_integration::process_start("bench", "s", args);
        p.wait = wait;
        p.timeout_ms = Some(600_000);
        Request::ProcessStart(p)
    };
    c.call(start(
        &["/bin/sh", "-c", "mkdir -p /allox/session/site && head -c 1024 /dev/zero > /allox/session/site/index.html"],
        true,
    ))?
    .map_err(anyhow::Error::msg)?;
    c.call(start(
        &[
            "python3",
            "-m",
            "http.server",
            "8000",
            "--bind",
            "127.0.0.1",
            "--protocol",
            "HTTP/1.1",
            "--directory",
            "/allox/session/site",
        ],
        false,
    ))?
    .map_err(anyhow::Error::msg)?;
    // Until it listens (bounded).
    let wait = "for i in $(seq 1000); do curl -s -o /dev/null http://127.0.0.1:8000/ && exit 0; sleep 0.01; done; exit 1";
    let r = c.call(start(&["/bin/sh", "-c", wait], true))?;
    anyhow::ensure!(
        matches!(&r, Ok(Response::Exited(x)) if x.exit_code == Some(0)),
        "the session's server did not listen: {r:?}"
    );
    let exposed = c
        .call(Request::PortExpose(PortExpose {
            agent_id: "bench".into(),
            session_id: "s".into(),
            port: 8000,
            public: false,
        }))?
        .map_err(anyhow::Error::msg)?;
    let Response::Port(exposed) = exposed else {
        anyhow::bail!("port.expose answered {}", exposed.kind());
    };
    let gw = Gateway::start(&bd.socket, &[]);
    let token = gateway_token(&bd.socket);
    let mut inside = Vec::new();
    let mut through = Vec::new();
    let mut own_host = Vec::new();
    // Alternating rounds of 50, after a warm-up of each.
    let rounds = n / 50;
    let url = format!("http://{}/v1/ports/bench/s/8000/", gw.addr);
    let auth = format!("Authorization: Bearer {token}");
    let at_host = format!("http://{}.localhost:{}/", exposed.host, gw.addr.port());
    let cookie = format!("allox_port_token={}", exposed.token);
    for round in 0..=rounds {
        let loop_in = "for i in $(seq 50); do curl -s -o /dev/null -w '%{time_total}\\n' http://127.0.0.1:8000/; done";
        let r = c.call(start(&["/bin/sh", "-c", loop_in], true))?;
        let Ok(Response::Exited(x)) = r else {
            anyhow::bail!("the session's curl loop: {r:?}");
        };
        let host = curl_times(&["-H", &auth, &url])?;
        let at = curl_times(&["-b", &cookie, &at_host])?;
        if round > 0 {
            inside.extend(parse_times(&x.stdout));
            through.extend(host);
            own_host.extend(at);
        }
    }
    drop(gw);
    println!("## A session's port through the gateway\n");
    println!(
        "Python's `http.server` (HTTP/1.1) in an `isolated` session answering 1 KiB; curl's own time per request (connect to the whole answer; a new connection each), {} of each, alternating in rounds of 50. The gateway keeps its connection to the app between requests.\n",
        inside.len()
    );
    println!("| from | p50 | p99 |");
    println!("|---|---:|---:|");
    for (name, v) in [
        (
            "curl inside the session to 127.0.0.1:8000 (baseline)",
            &inside,
        ),
        ("curl on the host through /v1/ports/…", &through),
        (
            "curl on the host at the port's own host, with its cookie",
            &own_host,
        ),
    ] {
        println!(
            "| {name} | {} | {} |",
            us_or_ms(pct(v, 0.5)),
            us_or_ms(pct(v, 0.99))
        );
    }
    let extra = pct(&through, 0.5).saturating_sub(pct(&inside, 0.5));
    let extra_host = pct(&own_host, 0.5).saturating_sub(pct(&inside, 0.5));
    let met = |d: Duration| {
        if d <= Duration::from_millis(1) {
            "met"
        } else {
            "not met"
        }
    };
    println!(
        "\nThe gateway adds {} at p50 through the path, {} at the port's own host (budget ≤ +1 ms: {}, {}).\n",
        us_or_ms(extra),
        us_or_ms(extra_host),
        met(extra),
        met(extra_host)
    );
    Ok(())
}
