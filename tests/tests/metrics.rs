//! Metrics as an operator gets them: a real Prometheus (Debian's package),
//! started by the test on 127.0.0.1 with a generated configuration,
//! scrapes the gateway every second — its metrics address with no token,
//! and its own address with the metrics token — while a workload runs
//! through `alloxctl`, `curl` and a proxy session's sandbox. The test then
//! asks Prometheus's HTTP API for every family and finds the values the
//! workload implies. Every name is under `.test`; nothing leaves this
//! machine.

use allox_integration::{alloxctl, require, which, Gateway, ProcDaemon};
use allox_network::stub::DnsStub;
use serde_json::Value;
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ctl_ok(d: &ProcDaemon, args: &[&str]) -> String {
    let (code, out, err) = alloxctl(&d.daemon.socket, args);
    let out = String::from_utf8_lossy(&out).into_owned();
    assert_eq!(code, 0, "alloxctl {args:?}: {out}{err}");
    out
}

fn curl(args: &[&str]) -> (String, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "30", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').expect("a status line");
    (code.to_string(), body.to_string())
}

/// Prometheus on a free loopback port, scraping `targets` (job name,
/// address, metrics token file if any) every second; ready when this
/// returns.
fn prometheus(dir: &Path, targets: &[(&str, String, Option<&Path>)]) -> (Server, String) {
    let mut cfg =
        String::from("global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\nscrape_configs:\n");
    for (job, addr, token) in targets {
        cfg.push_str(&format!(
            "  - job_name: {job}\n    static_configs:\n      - targets: ['{addr}']\n"
        ));
        if let Some(t) = token {
            cfg.push_str(&format!(
                "    authorization:\n      credentials_file: {}\n",
                t.display()
            ));
        }
    }
    let config = dir.join("prometheus.yml");
    std::fs::write(&config, cfg).unwrap();
    let web = format!("127.0.0.1:{}", allox_integration::container::free_port());
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address={web}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start prometheus");
    let server = Server(child);
    let t0 = Instant::now();
    loop {
        if curl(&[&format!("http://{web}/-/ready")]).0 == "200" {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "prometheus did not become ready: {}",
            std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    (server, web)
}

/// Each series of an instant query: its labels and value.
fn query(web: &str, q: &str) -> Vec<(HashMap<String, String>, f64)> {
    let (code, body) = curl(&[
        "-G",
        &format!("http://{web}/api/v1/query"),
        "--data-urlencode",
        &format!("query={q}"),
    ]);
    assert_eq!(code, "200", "{q}: {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["data"]["result"]
        .as_array()
        .unwrap_or_else(|| panic!("{q}: {body}"))
        .iter()
        .map(|r| {
            let labels = r["metric"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect();
            let value = r["value"][1].as_str().unwrap().parse().unwrap();
            (labels, value)
        })
        .collect()
}

/// What a query must come to once Prometheus has scraped the end of the
/// workload.
enum Want {
    Eq(f64),
    AtLeast(f64),
}

#[test]
fn a_real_prometheus_scrapes_every_family_with_the_values_the_workload_implies() {
    let name = "metrics::a_real_prometheus_scrapes_every_family";
    if !require(name) {
        return;
    }
    let missing: Vec<&str> = ["prometheus", "curl"]
        .into_iter()
        .filter(|p| which(p).is_none())
        .collect();
    if !allox_integration::needs(name, (!missing.is_empty()).then(|| missing.join(", "))) {
        return;
    }
    let (server, _) = allox_integration::hello_server();
    let dns = DnsStub::start(HashMap::from([(
        "files.test".to_string(),
        Ipv4Addr::LOCALHOST,
    )]))
    .unwrap();
    let resolver = dns.addr().to_string();
    let allowed = format!("files.test:{}", server.port());
    // The name, and the loopback address it resolves to.
    let local = format!("127.0.0.1:{}", server.port());
    let d = ProcDaemon::start(
        "metrics_prometheus",
        &[
            "--plugin",
            "network",
            "--plugin",
            "process-tree",
            "--network-resolver",
            &resolver,
            "--network-allow",
            &allowed,
            "--network-allow",
            &local,
            "--network-deny",
            "blocked.test",
        ],
    );
    let scratch = d.fs.scratch().to_path_buf();
    let metrics_token = scratch.join("metrics.token");
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&metrics_token)
            .unwrap();
        std::io::Write::write_all(&mut f, b"metrics-token-0123456789abcdef0123456789\n").unwrap();
    }
    let gw = Gateway::start(
        &d.daemon.socket,
        &[
            "--metrics-listen",
            "127.0.0.1:0",
            "--metrics-token-file",
            metrics_token.to_str().unwrap(),
        ],
    );
    let metrics_addr = gw.metrics_addr.expect("a metrics address");
    let token = allox_integration::gateway_token(&d.daemon.socket);

    // Who may scrape: the metrics token on the gateway's address (not the
    // gateway's own token, not none); anyone on the metrics address, which
    // serves nothing else.
    let on_gateway = format!("http://{}/metrics", gw.addr);
    assert_eq!(curl(&[&on_gateway]).0, "401");
    assert_eq!(
        curl(&["-H", &format!("Authorization: Bearer {token}"), &on_gateway]).0,
        "401"
    );
    let (code, body) = curl(&[
        "-H",
        "Authorization: Bearer metrics-token-0123456789abcdef0123456789",
        &on_gateway,
    ]);
    assert_eq!(code, "200", "{body}");
    assert!(body.ends_with("# EOF\n"), "{body}");
    assert_eq!(
        curl(&[&format!("http://{metrics_addr}/v1/openapi.json")]).0,
        "404"
    );

    let tsdb = scratch.join("prometheus");
    std::fs::create_dir(&tsdb).unwrap();
    let (_prom, web) = prometheus(
        &tsdb,
        &[
            ("allox", metrics_addr.to_string(), None),
            ("allox_token", gw.addr.to_string(), Some(&metrics_token)),
        ],
    );

    // The workload.
    for a in ["a", "b"] {
        ctl_ok(&d, &["agent", "create", a]);
    }
    ctl_ok(&d, &["session", "create", "a", "s"]);
    ctl_ok(&d, &["session", "create", "a", "net", "--network", "proxy"]);
    ctl_ok(&d, &["session", "create", "b", "idle"]);
    for i in 0..3 {
        ctl_ok(
            &d,
            &[
                "exec",
                "a",
                "s",
                "--",
                "/bin/sh",
                "-c",
                &format!("echo {i} > f{i}"),
            ],
        );
        ctl_ok(&d, &["checkpoint", "create", "a", "s", &format!("c{i}")]);
    }
    ctl_ok(&d, &["rollback", "a", "s", "c0"]);
    ctl_ok(&d, &["rollback", "a", "s", "c1"]);
    ctl_ok(&d, &["diff", "a", "s", "c0", "c2"]);
    ctl_ok(&d, &["session", "fork", "a", "s", "forked", "--from", "c2"]);
    // A run past its timeout.
    let (code, _, _) = alloxctl(
        &d.daemon.socket,
        &["exec", "--timeout-ms", "300", "a", "s", "--", "sleep", "30"],
    );
    assert_ne!(code, 0);
    // Through the proxy: one allowed (a lookup, bytes both ways), one
    // denied by a rule.
    let through = ctl_ok(
        &d,
        &[
            "exec",
            "a",
            "net",
            "--",
            "/bin/sh",
            "-c",
            &format!(
                "curl -sS http://{allowed}/x; curl -sS -o /dev/null -w '%{{http_code}}' http://blocked.test/"
            ),
        ],
    );
    assert_eq!(through, "hello /x\n403", "{through}");
    // A file up and down through the gateway.
    let data = "x".repeat(5000);
    let file_url = format!("http://{}/v1/files/a/s/up.txt", gw.addr);
    let auth = format!("Authorization: Bearer {token}");
    let (code, body) = curl(&["-X", "PUT", "-H", &auth, "--data-binary", &data, &file_url]);
    assert!(code.starts_with('2'), "{code}: {body}");
    let (code, body) = curl(&["-H", &auth, &file_url]);
    assert_eq!((code.as_str(), body.len()), ("200", 5000));
    ctl_ok(&d, &["session", "pause", "b", "idle", "--hold"]);
    // A refusal: the session exists.
    let (code, _, _) = alloxctl(&d.daemon.socket, &["session", "create", "a", "s"]);
    assert_ne!(code, 0);
    // Runs: 3 + the timed-out one + the proxy one.
    let runs = 5.0;

    let wants: Vec<(&str, Want)> = vec![
        ("up{job=\"allox\"}", Want::Eq(1.0)),
        ("up{job=\"allox_token\"}", Want::Eq(1.0)),
        ("allox_agents", Want::Eq(2.0)),
        ("allox_sessions{state=\"active\"}", Want::Eq(3.0)),
        ("allox_sessions{state=\"paused\"}", Want::Eq(1.0)),
        ("allox_sessions{state=\"fenced\"}", Want::Eq(0.0)),
        ("allox_runs_started_total", Want::Eq(runs)),
        (
            "allox_runs_ended_total{how=\"exited\"}",
            Want::Eq(runs - 1.0),
        ),
        ("allox_runs_ended_total{how=\"timed_out\"}", Want::Eq(1.0)),
        ("allox_runs_live", Want::Eq(0.0)),
        ("allox_processes", Want::Eq(0.0)),
        (
            "allox_requests_total{action=\"session.rollback\",outcome=\"ok\"}",
            Want::Eq(2.0),
        ),
        (
            "allox_requests_total{action=\"checkpoint.create\",outcome=\"ok\"}",
            Want::Eq(3.0),
        ),
        (
            "allox_requests_total{action=\"session.create\",outcome=\"conflict\"}",
            Want::Eq(1.0),
        ),
        (
            "allox_request_duration_seconds_count{action=\"process.start\"}",
            Want::Eq(runs),
        ),
        (
            "allox_store_operation_duration_seconds_count{operation=\"checkpoint\"}",
            Want::Eq(3.0),
        ),
        (
            "allox_store_operation_duration_seconds_count{operation=\"rollback\"}",
            Want::Eq(2.0),
        ),
        (
            "allox_store_operation_duration_seconds_count{operation=\"diff\"}",
            Want::Eq(1.0),
        ),
        (
            "allox_store_operation_duration_seconds_count{operation=\"fork\"}",
            Want::Eq(1.0),
        ),
        ("allox_store_journal_replays", Want::Eq(0.0)),
        ("allox_store_read_only", Want::Eq(0.0)),
        (
            "allox_store_filesystem_bytes{kind=\"free\"}",
            Want::AtLeast(1.0),
        ),
        (
            "allox_store_filesystem_bytes{kind=\"used\"}",
            Want::AtLeast(1.0),
        ),
        ("allox_file_bytes_total{direction=\"in\"}", Want::Eq(5000.0)),
        (
            "allox_file_bytes_total{direction=\"out\"}",
            Want::Eq(5000.0),
        ),
        (
            "allox_network_connections_total{verdict=\"allowed\"}",
            Want::Eq(1.0),
        ),
        (
            "allox_network_connections_total{verdict=\"denied\"}",
            Want::Eq(1.0),
        ),
        (
            "allox_network_bytes_total{direction=\"received\"}",
            Want::AtLeast(1.0),
        ),
        (
            "allox_network_bytes_total{direction=\"sent\"}",
            Want::AtLeast(1.0),
        ),
        (
            "allox_network_dns_lookups_total{outcome=\"ok\"}",
            Want::Eq(1.0),
        ),
        ("allox_tracker_events_total", Want::AtLeast(runs)),
        ("allox_tracker_events_lost_total", Want::Eq(0.0)),
        ("allox_gateway_connections_total", Want::AtLeast(2.0)),
        (
            "sum by (job) (allox_gateway_requests_total{route=\"files\"})",
            Want::Eq(2.0),
        ),
        (
            "allox_gateway_requests_total{route=\"metrics\",status=\"401\"}",
            Want::Eq(2.0),
        ),
        ("allox_gateway_daemon_up", Want::Eq(1.0)),
    ];
    // Prometheus scrapes every second: wait for a scrape taken after the
    // workload, one that shows it all (the deadline is a failure, not a
    // pause).
    let t0 = Instant::now();
    loop {
        let mut wrong = Vec::new();
        for (q, want) in &wants {
            // Both jobs scrape the same numbers; the metrics address's.
            let series = query(&web, q);
            let got = series
                .iter()
                .find(|(l, _)| q.contains("job=") || l.get("job").is_none_or(|j| j == "allox"))
                .map(|(_, v)| *v);
            let ok = match (want, got) {
                (Want::Eq(w), Some(g)) => (g - w).abs() < 1e-9,
                (Want::AtLeast(w), Some(g)) => g >= *w,
                (_, None) => false,
            };
            if !ok {
                wrong.push(format!("{q} = {got:?}"));
            }
        }
        if wrong.is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "after 60 s Prometheus still has:\n{}\n\nthe daemon says:\n{}",
            wrong.join("\n"),
            ctl_ok(&d, &["metrics"])
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // The token job scraped the same daemon.
    let via_token = query(&web, "allox_agents{job=\"allox_token\"}");
    assert_eq!(via_token.first().map(|s| s.1), Some(2.0), "{via_token:?}");

    // The dashboard (deploy/grafana): every query answers with data from
    // this Prometheus — but the observer's, whose plugin this daemon does
    // not load (it stands in for the tracker); those name families the
    // operations doc lists.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/allox.json"),
        )
        .unwrap(),
    )
    .expect("the dashboard is JSON");
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md"),
    )
    .unwrap();
    let exprs = dashboard_queries(&dashboard);
    assert!(exprs.len() >= 20, "{exprs:?}");
    let mut asked = Vec::new();
    for e in &exprs {
        let names = metric_names(e);
        assert!(!names.is_empty(), "{e} names no allox metric");
        for n in &names {
            let family = n
                .strip_suffix("_bucket")
                .or_else(|| n.strip_suffix("_total"))
                .unwrap_or(n);
            assert!(
                doc.contains(&format!("`{family}")),
                "docs/operations.md does not list {n} (in {e})"
            );
        }
        if names.iter().all(|n| n.starts_with("allox_observer_")) {
            continue;
        }
        asked.push(e.replace("$__rate_interval", "1m"));
    }
    // A rate needs two samples of a series: one made by the last scrapes
    // has data a scrape or two later (the deadline is a failure).
    let t0 = Instant::now();
    let mut empty: Vec<&String> = asked.iter().collect();
    while !empty.is_empty() && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(500));
        empty.retain(|q| query(&web, q).is_empty());
    }
    assert!(
        empty.is_empty(),
        "dashboard queries with no data after 30 s: {empty:#?}"
    );
}

/// `allox_gateway_daemon_up` says whether the daemon answered the scrape:
/// 1 for a daemon run with `--no-metrics` (it answers, refusing its
/// metrics: the page then holds the gateway's alone), 0 once it is
/// stopped. (Before, it was 0 under `--no-metrics`, as if the daemon
/// were down.)
#[test]
fn the_gateway_says_a_daemon_without_metrics_is_up_and_a_stopped_one_down() {
    let name = "metrics::the_gateway_says_a_daemon_without_metrics_is_up";
    if !require(name) {
        return;
    }
    if !allox_integration::needs(name, which("curl").is_none().then(|| "curl".to_string())) {
        return;
    }
    let mut d = ProcDaemon::start("metrics_off_up", &["--no-metrics"]);
    let gw = Gateway::start(&d.daemon.socket, &["--metrics-listen", "127.0.0.1:0"]);
    let url = format!(
        "http://{}/metrics",
        gw.metrics_addr.expect("a metrics address")
    );
    let up = |body: &str| -> Option<String> {
        body.lines()
            .find_map(|l| l.strip_prefix("allox_gateway_daemon_up "))
            .map(str::to_string)
    };
    let (code, body) = curl(&[&url]);
    assert_eq!(code, "200", "{body}");
    assert_eq!(up(&body).as_deref(), Some("1"), "{body}");
    // The daemon's own families are not there: it gave none.
    assert!(!body.contains("allox_sessions"), "{body}");
    d.daemon.terminate();
    let (code, body) = curl(&[&url]);
    assert_eq!(code, "200", "{body}");
    assert_eq!(up(&body).as_deref(), Some("0"), "{body}");
}

/// Every query of a Grafana dashboard, after checking what Grafana needs
/// of each panel: a unique id, a place on the 24-column grid, the
/// dashboard's data source, and (but rows) targets with a query.
fn dashboard_queries(d: &Value) -> Vec<String> {
    assert!(
        d["schemaVersion"].as_u64().is_some_and(|v| v >= 36),
        "schemaVersion"
    );
    assert!(d["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(d["uid"].as_str().is_some_and(|t| !t.is_empty()));
    let vars = d["templating"]["list"].as_array().expect("templating");
    assert!(vars.iter().any(|v| v["name"] == "datasource"
        && v["type"] == "datasource"
        && v["query"] == "prometheus"));
    let mut ids = std::collections::HashSet::new();
    let mut out = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        assert!(
            ids.insert(p["id"].as_u64().expect("an id")),
            "duplicate id: {p}"
        );
        let g = &p["gridPos"];
        let (x, w) = (g["x"].as_u64().unwrap(), g["w"].as_u64().unwrap());
        assert!(x + w <= 24 && g["h"].as_u64().unwrap() > 0, "gridPos: {p}");
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{p}");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{p}");
        for t in targets {
            out.push(t["expr"].as_str().expect("expr").to_string());
        }
    }
    out
}

/// The `allox_…` names a query reads.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("allox_") {
        let start = i + at;
        let mut end = start;
        while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_') {
            end += 1;
        }
        out.push(expr[start..end].to_string());
        i = end;
    }
    out
}
