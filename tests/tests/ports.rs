//! A session's ports served to the host, through the real daemon, real
//! sandboxes and the real gateway, with curl and a WebSocket client on
//! 127.0.0.1: `python3 -m http.server` and a WebSocket echo inside
//! sessions answer at each port's own host and through `/v1/ports/…` with
//! a token and 401 without, and an app's page renders in headless
//! Chromium handed the port's token, at the port's own host; another
//! session's port is never reached, nor read by another session's page in
//! the same browser; a port not exposed is 404,
//! one nothing listens on 502; 100 connections at once; the gateway's
//! credentials never reach the app; `alloxctl port forward`; nothing left
//! after `port.unexpose` or the session's deletion.

use allox_integration::{call, process_start as start, require, Gateway, ProcDaemon};
use allox_protocol::*;
use std::io::{BufRead, Read, Write};
use std::process::{Command, Stdio};

/// An HTTP/1.1 app (it keeps connections open) that answers with what it
/// was asked and which headers came (names only) and the cookies: the
/// gateway's credentials must not be among them.
const ECHO: &str = r#"
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        body = ("%s %s %s cookie=%s\n" % (sys.argv[2], self.path,
                json.dumps(sorted(k.lower() for k in self.headers.keys())),
                self.headers.get("Cookie", ""))).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"#;

/// A WebSocket echo (text frames under 126 bytes), the standard library
/// only.
const WS: &str = r#"
import base64, hashlib, socket, sys, threading
G = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
def serve(c):
    data = b""
    while b"\r\n\r\n" not in data:
        d = c.recv(4096)
        if not d:
            return
        data += d
    key = [l.split(b":", 1)[1].strip() for l in data.split(b"\r\n")
           if l.lower().startswith(b"sec-websocket-key:")][0]
    acc = base64.b64encode(hashlib.sha1(key + G).digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
              b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + acc + b"\r\n\r\n")
    while True:
        h = c.recv(2)
        if len(h) < 2:
            return
        n = h[1] & 127
        mask = c.recv(4)
        p = b""
        while len(p) < n:
            p += c.recv(n - len(p))
        p = bytes(b ^ mask[i % 4] for i, b in enumerate(p))
        c.sendall(bytes([0x81, len(p)]) + p)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(64)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// Waits (bounded) until something listens on the session's port.
const LISTENING: &str = r#"
import socket, sys, time
for i in range(1000):
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1]))).close()
        sys.exit(0)
    except OSError:
        time.sleep(0.01)
sys.exit(1)
"#;

fn run(d: &ProcDaemon, s: &str, argv: &[&str]) -> RunResult {
    match call(d, Request::ProcessStart(start("a", s, argv))) {
        Ok(Response::Exited(r)) => r,
        other => panic!("{argv:?}: {other:?}"),
    }
}

/// Starts `argv` in session `s` without waiting; its run id.
fn background(d: &ProcDaemon, s: &str, argv: &[&str]) -> String {
    let mut p = start("a", s, argv);
    p.wait = false;
    match call(d, Request::ProcessStart(p)) {
        Ok(Response::Started(r)) => r.run_id,
        other => panic!("{argv:?}: {other:?}"),
    }
}

fn serve_in(d: &ProcDaemon, s: &str, argv: &[&str], port: u16) -> String {
    let id = background(d, s, argv);
    let p = port.to_string();
    let r = run(d, s, &["python3", "-c", LISTENING, &p]);
    assert_eq!(
        r.exit_code,
        Some(0),
        "nothing listens on {port} in {s}: {r:?}"
    );
    id
}

fn ctl_json(d: &ProcDaemon, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let (code, out, err) = allox_integration::alloxctl(&d.daemon.socket, &all);
    let out = String::from_utf8_lossy(&out);
    assert_eq!(code, 0, "alloxctl {args:?}: {out}{err}");
    serde_json::from_str(&out).unwrap()
}

/// The page at `url` as headless Chromium (profile `profile`) leaves it
/// after its scripts ran, and what the browser said.
fn dom_of(url: &str, profile: &std::path::Path) -> (String, String) {
    let dom = allox_integration::headless(
        "ports",
        &["--virtual-time-budget=10000", "--dump-dom", url],
        profile,
    );
    (
        String::from_utf8_lossy(&dom.stdout).into_owned(),
        String::from_utf8_lossy(&dom.stderr).into_owned(),
    )
}

/// The status and the redirect's target curl gets for `url`, asked as it
/// is (`--path-as-is`): `"307 http://…"`.
fn redirect_of(url: &str) -> String {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--path-as-is",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{redirect_url}",
        ])
        .arg(url)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `curl` of `path` at a port's own host `label` (below `localhost`,
/// which curl takes for the loopback) with `args`: status and body.
fn curl_at(g: &Gateway, label: &str, path: &str, args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "-w", "\n%{http_code}"])
        .args(args)
        .arg(format!("http://{label}.localhost:{}{path}", g.addr.port()))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// `curl` of the gateway's `path` with `args`: status and body.
fn curl(g: &Gateway, path: &str, args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "-w", "\n%{http_code}"])
        .args(args)
        .arg(format!("http://{}{path}", g.addr))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

#[test]
fn a_session_s_ports_are_served_through_the_gateway_to_whoever_holds_a_token() {
    if !require("ports") {
        return;
    }
    for p in ["/usr/bin/python3", "/usr/bin/curl"] {
        assert!(std::path::Path::new(p).exists(), "ports needs {p}");
    }
    let d = ProcDaemon::start("ports", &["--plugin", "network"]);
    ctl_json(&d, &["agent", "create", "a"]);
    ctl_json(
        &d,
        &["session", "create", "a", "s1", "--network", "isolated"],
    );
    ctl_json(&d, &["session", "create", "a", "s2", "--network", "proxy"]);
    ctl_json(
        &d,
        &["session", "create", "a", "host", "--network", "disabled"],
    );
    let g = Gateway::start(&d.daemon.socket, &[]);
    let token = allox_integration::gateway_token(&d.daemon.socket);
    let bearer = format!("Authorization: Bearer {token}");

    // s1: a page served by `python3 -m http.server`, and a WebSocket
    // echo; s2: the header echo, on the same port number as s1's page.
    let r = run(
        &d,
        "s1",
        &[
            "/bin/sh",
            "-c",
            "mkdir -p /allox/session/site && echo s1-page > /allox/session/site/index.html",
        ],
    );
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let s1_server = serve_in(
        &d,
        "s1",
        &[
            "python3",
            "-m",
            "http.server",
            "8000",
            "--bind",
            "127.0.0.1",
            "--directory",
            "/allox/session/site",
        ],
        8000,
    );
    serve_in(&d, "s1", &["python3", "-c", WS, "8765"], 8765);
    serve_in(&d, "s2", &["python3", "-c", ECHO, "8000", "s2"], 8000);

    // Not exposed: 404, whoever asks; a disabled session has no ports.
    let (code, body) = curl(&g, "/v1/ports/a/s1/8000/", &["-H", &bearer]);
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("not exposed"), "{body}");
    let (code, _, err) =
        allox_integration::alloxctl(&d.daemon.socket, &["port", "expose", "a", "host", "8000"]);
    assert!(code != 0 && err.contains("network mode disabled"), "{err}");

    let exposed = ctl_json(&d, &["port", "expose", "a", "s1", "8000"]);
    let port_token = exposed["token"].as_str().unwrap().to_string();
    let s1_host = exposed["host"].as_str().unwrap().to_string();
    assert_eq!(exposed["path"], "/v1/ports/a/s1/8000/");
    assert!(s1_host.starts_with("8000-"), "{exposed}");
    // With the gateway's token, at the gateway's path or the port's own
    // host; without any, 401 at its host.
    let (code, body) = curl(&g, "/v1/ports/a/s1/8000/", &["-H", &bearer]);
    assert_eq!((code, body.as_str()), (200, "s1-page\n"));
    let (code, body) = curl_at(&g, &s1_host, "/", &["-H", &bearer]);
    assert_eq!((code, body.as_str()), (200, "s1-page\n"));
    let (code, _) = curl_at(&g, &s1_host, "/", &[]);
    assert_eq!(code, 401);
    let (code, _) = curl_at(&g, &s1_host, "/?token=nope", &[]);
    assert_eq!(code, 401);
    // Without the gateway's token, the gateway's path sends the client to
    // the port's own host (the gateway's origin, which every port's path
    // shares, never takes a port's credential).
    let own = format!("http://{s1_host}.localhost:{}/", g.addr.port());
    assert_eq!(
        redirect_of(&format!("http://{}/v1/ports/a/s1/8000/", g.addr)),
        format!("307 {own}")
    );
    let (code, body) = curl(&g, "/v1/ports/a/s1/8000/?token=nope", &["-L"]);
    assert_eq!(code, 401, "{body}");
    // The port's token once in the URL, then as a cookie of the port's
    // host alone.
    let jar = tempfile::NamedTempFile::new().unwrap();
    let jar = jar.path().to_str().unwrap();
    let (code, body) = curl(
        &g,
        &format!("/v1/ports/a/s1/8000/?token={port_token}"),
        &["-L", "-c", jar, "-b", jar],
    );
    assert_eq!((code, body.as_str()), (200, "s1-page\n"));
    let cookies = std::fs::read_to_string(jar).unwrap();
    let line = cookies
        .lines()
        .find(|l| l.contains("allox_port_token"))
        .unwrap_or_else(|| panic!("{cookies}"));
    let fields: Vec<&str> = line.split('\t').collect();
    assert!(
        fields[0].ends_with(&format!("{s1_host}.localhost"))
            && fields[1] == "FALSE"
            && fields[2] == "/",
        "the cookie is the port's host's alone: {line}"
    );
    let (code, body) = curl_at(&g, &s1_host, "/", &["-b", jar]);
    assert_eq!((code, body.as_str()), (200, "s1-page\n"));
    // The trade's redirect stays at the port's host, whatever the path
    // (`//site/…` and `/\site/…` are other sites' addresses to a
    // browser).
    for path in ["//elsewhere.test/x", "/\\elsewhere.test/x"] {
        let said = redirect_of(&format!(
            "http://{s1_host}.localhost:{}{path}?token={port_token}",
            g.addr.port()
        ));
        assert!(
            said.starts_with(&format!(
                "303 http://{s1_host}.localhost:{}/",
                g.addr.port()
            )),
            "{path}: {said}"
        );
    }
    // The port's token is no credential at the gateway's path.
    let (code, _) = curl(
        &g,
        "/v1/ports/a/s1/8000/",
        &["-b", &format!("allox_port_token={port_token}")],
    );
    assert_eq!(code, 307);
    // A browser: headless Chromium handed the port's path with its token
    // once ends at the port's own host; the page it renders fetches more
    // of the app with the cookie it was given.
    let app = r#"<!doctype html><title>agent app</title><h1>Built by the agent</h1><p id=out>loading</p><p id=at></p>
<script>document.getElementById("at").textContent = "at " + location.host;
fetch("data.json").then(r => r.text()).then(t => { document.getElementById("out").textContent = "data: " + t; });</script>"#;
    let r = run(
        &d,
        "s1",
        &[
            "/bin/sh",
            "-c",
            &format!(
                "mkdir -p /allox/session/site/app && cat > /allox/session/site/app/index.html <<'EOF'\n{app}\nEOF\n\
                 printf '{{\"answer\": 42}}' > /allox/session/site/app/data.json"
            ),
        ],
    );
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let profile = tempfile::tempdir().unwrap();
    let page = format!(
        "http://{}/v1/ports/a/s1/8000/app/?token={port_token}",
        g.addr
    );
    let (dom_text, said) = dom_of(&page, profile.path());
    assert!(
        dom_text.contains("Built by the agent")
            && dom_text.contains(r#"data: {"answer": 42}"#)
            && dom_text.contains(&format!("at {s1_host}.localhost:{}", g.addr.port())),
        "{dom_text}{said}"
    );
    let png = allox_integration::artifacts_dir().join("ports-app.png");
    let _ = std::fs::remove_file(&png);
    let shot = allox_integration::headless(
        "ports",
        &[
            "--virtual-time-budget=10000",
            "--hide-scrollbars",
            "--window-size=900,400",
            &format!("--screenshot={}", png.display()),
            &page,
        ],
        profile.path(),
    );
    assert!(
        shot.status.success() && png.exists(),
        "{}",
        String::from_utf8_lossy(&shot.stderr)
    );

    // The port's cookie does not open another port.
    let (code, _) = curl(
        &g,
        "/v1/ports/a/s1/8765/",
        &["-b", &format!("allox_port_token={port_token}")],
    );
    assert_eq!(code, 404, "8765 is not exposed yet");

    // Another session's port is never reached under this one's path, nor
    // this one's under another's: s2's 8000 is not exposed.
    let (code, _) = curl(&g, "/v1/ports/a/s2/8000/", &["-H", &bearer]);
    assert_eq!(code, 404);
    let s2 = ctl_json(&d, &["port", "expose", "a", "s2", "8000"]);
    let s2_host = s2["host"].as_str().unwrap().to_string();
    let s2_token = s2["token"].as_str().unwrap().to_string();
    assert_ne!(s2_host, s1_host);
    let (code, body) = curl(
        &g,
        "/v1/ports/a/s2/8000/x?y=1",
        &["-H", &bearer, "-b", "a=1; allox_port_token=zzz"],
    );
    assert_eq!(code, 200, "{body}");
    assert!(body.starts_with("s2 /x?y=1 "), "{body}");
    // The gateway's credentials are not the app's.
    assert!(!body.contains("authorization"), "{body}");
    assert!(body.trim_end().ends_with("cookie=a=1"), "{body}");
    // At its own host, the app is asked the whole path, with no prefix;
    // s1's token and host do not open it.
    let (code, body) = curl_at(
        &g,
        &s2_host,
        "/v1/ports/x?y=1",
        &["-b", &format!("a=1; allox_port_token={s2_token}")],
    );
    assert!(
        code == 200
            && body.starts_with("s2 /v1/ports/x?y=1 ")
            && body.trim_end().ends_with("cookie=a=1"),
        "{code} {body}"
    );
    assert!(!body.contains("x-forwarded-prefix"), "{body}");
    let (code, _) = curl_at(
        &g,
        &s2_host,
        "/",
        &["-b", &format!("allox_port_token={port_token}")],
    );
    assert_eq!(code, 401, "s1's token at s2's host");
    // Another port's page may not call it (its Origin), even with its
    // token.
    let (code, body) = curl_at(
        &g,
        &s2_host,
        "/",
        &[
            "-b",
            &format!("allox_port_token={s2_token}"),
            "-H",
            &format!("Origin: http://{s1_host}.localhost:{}", g.addr.port()),
        ],
    );
    assert_eq!(code, 403, "{body}");
    let (code, body) = curl(&g, "/v1/ports/a/s1/8000/", &["-H", &bearer]);
    assert_eq!((code, body.as_str()), (200, "s1-page\n"), "s1's own 8000");
    // The gateway keeps s2's connection for the next request with its
    // token, never for one without.
    let (code, _) = curl_at(&g, &s2_host, "/again", &[]);
    assert_eq!(code, 401);
    let (code, body) = curl(&g, "/v1/ports/a/s2/8000/again", &["-H", &bearer]);
    assert!(
        code == 200 && body.starts_with("s2 /again "),
        "{code} {body}"
    );

    // A page of s2, opened in the browser that holds s1's cookie, reads
    // nothing of s1: neither at s1's host nor through the gateway's path.
    let thief = format!(
        r#"<!doctype html><title>s2 page</title><p id=a>a?</p><p id=b>b?</p>
<script>
function steal(id, url) {{
  fetch(url, {{credentials: "include"}}).then(r => r.text())
    .then(t => {{ document.getElementById(id).textContent = id + " read: " + t; }})
    .catch(e => {{ document.getElementById(id).textContent = id + " blocked: " + e; }});
}}
steal("a", "http://{s1_host}.localhost:{port}/");
steal("b", "http://127.0.0.1:{port}/v1/ports/a/s1/8000/");
</script>"#,
        port = g.addr.port()
    );
    let r = run(
        &d,
        "s2",
        &[
            "/bin/sh",
            "-c",
            &format!("mkdir -p /allox/session/thief && cat > /allox/session/thief/index.html <<'EOF'\n{thief}\nEOF"),
        ],
    );
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    serve_in(
        &d,
        "s2",
        &[
            "python3",
            "-m",
            "http.server",
            "8100",
            "--bind",
            "127.0.0.1",
            "--directory",
            "/allox/session/thief",
        ],
        8100,
    );
    let t = ctl_json(&d, &["port", "expose", "a", "s2", "8100"]);
    let page = format!(
        "http://{}/v1/ports/a/s2/8100/?token={}",
        g.addr,
        t["token"].as_str().unwrap()
    );
    let (dom_text, said) = dom_of(&page, profile.path());
    assert!(
        dom_text.contains("a blocked:")
            && dom_text.contains("b blocked:")
            && !dom_text.contains("s1-page"),
        "{dom_text}{said}"
    );
    // A link to s1's port with its token, followed from that other site
    // (a fresh browser): the app, not a 401 (after a redirect that is
    // part of another site's navigation, a strict cookie is not sent).
    let hop = format!(
        r#"<!doctype html><script>location.href = "http://{s1_host}.localhost:{}/app/?token={port_token}";</script>"#,
        g.addr.port()
    );
    let r = run(
        &d,
        "s2",
        &[
            "/bin/sh",
            "-c",
            &format!("cat > /allox/session/thief/hop.html <<'EOF'\n{hop}\nEOF"),
        ],
    );
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let fresh = tempfile::tempdir().unwrap();
    let (dom_text, said) = dom_of(
        &format!(
            "http://{}.localhost:{}/hop.html?token={}",
            t["host"].as_str().unwrap(),
            g.addr.port(),
            t["token"].as_str().unwrap()
        ),
        fresh.path(),
    );
    assert!(
        dom_text.contains("Built by the agent") && dom_text.contains(r#"data: {"answer": 42}"#),
        "{dom_text}{said}"
    );
    ctl_json(&d, &["port", "unexpose", "a", "s2", "8100"]);
    // What another site's page loads or frames is not credited with the
    // port's cookie (below one real domain the ports' hosts are one site,
    // and the browser would send it): only the port's own pages, the user
    // and a top-level navigation are.
    let s2_cookie = format!("allox_port_token={s2_token}");
    for (site, mode, dest, want) in [
        ("same-site", "no-cors", "image", 401),
        ("same-site", "no-cors", "script", 401),
        ("same-site", "navigate", "iframe", 401),
        ("cross-site", "no-cors", "image", 401),
        ("same-site", "navigate", "document", 200),
        ("same-origin", "no-cors", "image", 200),
        ("none", "navigate", "document", 200),
    ] {
        let (code, _) = curl_at(
            &g,
            &s2_host,
            "/meta",
            &[
                "-b",
                &s2_cookie,
                "-H",
                &format!("Sec-Fetch-Site: {site}"),
                "-H",
                &format!("Sec-Fetch-Mode: {mode}"),
                "-H",
                &format!("Sec-Fetch-Dest: {dest}"),
            ],
        );
        assert_eq!(code, want, "{site} {mode} {dest}");
    }
    // Two Host headers: refused (the app would see a second, naming
    // another port's host).
    let mut two = std::net::TcpStream::connect(g.addr).unwrap();
    write!(
        two,
        "GET /two HTTP/1.1\r\nHost: {s2_host}.localhost:{p}\r\nHost: {s1_host}.localhost:{p}\r\nCookie: {s2_cookie}\r\nConnection: close\r\n\r\n",
        p = g.addr.port()
    )
    .unwrap();
    let mut answer = String::new();
    two.read_to_string(&mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 400") && answer.contains("more than one Host"),
        "{answer}"
    );
    // Over HTTP/2 (h2c) the port's host is the URL's authority.
    let (code, body) = curl_at(
        &g,
        &s2_host,
        "/h2",
        &["--http2-prior-knowledge", "-b", &s2_cookie],
    );
    assert!(code == 200 && body.starts_with("s2 /h2 "), "{code} {body}");

    // Exposed, nothing listening: 502.
    ctl_json(&d, &["port", "expose", "a", "s1", "8001"]);
    let (code, body) = curl(&g, "/v1/ports/a/s1/8001/", &["-H", &bearer]);
    assert_eq!(code, 502, "{body}");
    assert!(body.contains("8001"), "{body}");

    // A WebSocket through the gateway.
    ctl_json(&d, &["port", "expose", "a", "s1", "8765"]);
    let mut ws = std::net::TcpStream::connect(g.addr).unwrap();
    write!(
        ws,
        "GET /v1/ports/a/s1/8765/ HTTP/1.1\r\nHost: {}\r\n{bearer}\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        g.addr
    )
    .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        ws.read_exact(&mut b).unwrap();
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(head.contains("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), "{head}");
    for msg in ["hello", "through the gateway"] {
        let mask = [1u8, 2, 3, 4];
        let mut frame = vec![0x81, 0x80 | msg.len() as u8];
        frame.extend_from_slice(&mask);
        frame.extend(msg.bytes().enumerate().map(|(i, c)| c ^ mask[i % 4]));
        ws.write_all(&frame).unwrap();
        let mut got = vec![0u8; 2 + msg.len()];
        ws.read_exact(&mut got).unwrap();
        assert_eq!(&got[2..], msg.as_bytes());
    }
    // Unexposed, its open connections end too.
    ctl_json(&d, &["port", "unexpose", "a", "s1", "8765"]);
    ws.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut one = [0u8; 1];
    assert!(
        matches!(ws.read(&mut one), Ok(0)),
        "the WebSocket outlived its port"
    );

    // 100 connections at once.
    let url = format!("http://{}/v1/ports/a/s2/8000/n", g.addr);
    let mut args = vec![
        "-sS".to_string(),
        "--parallel".into(),
        "--parallel-max".into(),
        "100".into(),
        "-H".into(),
        bearer.clone(),
        "-w".into(),
        "%{http_code}\n".into(),
    ];
    for _ in 0..100 {
        args.extend(["-o".to_string(), "/dev/null".into(), url.clone()]);
    }
    let out = Command::new("curl").args(&args).output().unwrap();
    let codes = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        codes.lines().filter(|l| *l == "200").count(),
        100,
        "{codes}{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // `alloxctl port forward`: a plain TCP forward on the host.
    let mut fwd = Command::new(allox_integration::workspace_bin("alloxctl"))
        .arg("--socket")
        .arg(&d.daemon.socket)
        .args([
            "port",
            "forward",
            "a",
            "s2",
            "8000",
            "--listen",
            "127.0.0.1:0",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(fwd.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let at = line
        .split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("{line}"))
        .to_string();
    let out = Command::new("curl")
        .args(["-sS", &format!("http://{at}/fwd")])
        .output()
        .unwrap();
    let _ = fwd.kill();
    let _ = fwd.wait();
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(body.starts_with("s2 /fwd "), "{body}{out:?}");

    // Exposed again as public: no token needed (the same token kept).
    let public = ctl_json(&d, &["port", "expose", "a", "s2", "8000", "--public"]);
    assert_eq!(public["public"], true);
    let (code, body) = curl_at(&g, &s2_host, "/open", &[]);
    assert!(
        code == 200 && body.starts_with("s2 /open "),
        "{code} {body}"
    );

    // Each connection is in the audit, with the run that listens.
    let audit = ctl_json(&d, &["audit", "--limit", "10000"]);
    let recs = audit["records"].as_array().unwrap();
    assert!(
        recs.iter().any(|r| r["action"] == "port.connect"
            && r["target"] == "a/s1/port-8000"
            && r["message"]
                .as_str()
                .is_some_and(|m| m.contains(&s1_server))),
        "no port.connect naming run {s1_server}: {audit}"
    );

    // The server gone: 502.
    call(
        &d,
        Request::ProcessKill(ProcessKill {
            agent_id: "a".into(),
            session_id: "s1".into(),
            run_id: Some(s1_server.clone()),
            signal: None,
        }),
    )
    .unwrap();
    let mut last = 0;
    for _ in 0..200 {
        last = curl(&g, "/v1/ports/a/s1/8000/", &["-H", &bearer]).0;
        if last == 502 {
            break;
        }
    }
    assert_eq!(last, 502);

    // Unexposed: 404, and not listed; the session deleted: nothing left.
    ctl_json(&d, &["port", "unexpose", "a", "s2", "8000"]);
    let (code, _) = curl(&g, "/v1/ports/a/s2/8000/", &["-H", &bearer]);
    assert_eq!(code, 404);
    let listed = ctl_json(&d, &["port", "list", "a"]);
    let ports: Vec<(String, u64)> = listed["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["session_id"].as_str().unwrap().to_string(),
                p["port"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(ports, [("s1".to_string(), 8000), ("s1".into(), 8001)]);
    ctl_json(&d, &["session", "delete", "a", "s1", "--force"]);
    assert_eq!(
        ctl_json(&d, &["port", "list", "a"])["ports"],
        serde_json::json!([])
    );
    let kept = std::fs::read_to_string(d.daemon.root.join("state/ports.json")).unwrap();
    assert!(!kept.contains("s1"), "{kept}");
}
