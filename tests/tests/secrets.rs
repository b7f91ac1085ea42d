//! Secrets through the real daemon, real sandboxes and real clients: a
//! `proxy` session's runs see only placeholders; curl, Python's
//! `requests` and `urllib`, and git reach HTTPS servers on 127.0.0.1
//! (names under `.test`, resolved by a DNS stub) through the session's
//! proxy, and the servers receive the real value, only the hosts each
//! secret names; the value is nowhere else: not in the sandbox (its
//! environment, its files, a core dump of its process), the audit,
//! the daemon's log, `alloxctl --json`'s output or the store's disk.

use allox_integration::{call, process_start as start, require, ProcDaemon};
use allox_network::stub::DnsStub;
use allox_protocol::*;
use std::collections::HashMap;
use std::io::BufRead;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The secrets' values: long enough that a match is no accident.
const API_VALUE: &str = "sk-live-0c1d2e3f4a5b6c7d8e9f-API-VALUE-never-in-a-sandbox";
const GIT_VALUE: &str = "ghp-9a8b7c6d5e4f-GIT-VALUE-never-in-a-sandbox";

/// An HTTP(S) server for the tests, on 127.0.0.1: it records each
/// request's path and credentials in a file on the host (outside every
/// sandbox and the store) and answers with what it saw in their place:
/// `auth=ok` for the expected value, `auth=placeholder` for a
/// placeholder, `auth=none` otherwise — never the value itself, which so
/// never reaches a run's output. Below `/repo.git/` it serves a bare git
/// repository (git's "dumb" HTTP protocol) to requests with the expected
/// bearer token only (401 otherwise).
const SERVER: &str = r#"
import http.server, json, os, ssl, sys
port, cert, key, log, repo, api, git = sys.argv[1:8]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def answer(self, code, body, kind="text/plain"):
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        auth = self.headers.get("Authorization", "")
        with open(log, "a") as f:
            f.write(json.dumps({"host": self.headers.get("Host", ""), "path": self.path,
                                "auth": auth}) + "\n")
        if self.path.startswith("/repo.git/"):
            if auth != "Bearer " + git:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Bearer realm="test"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            p = os.path.join(repo, self.path[len("/repo.git/"):].split("?")[0])
            if not os.path.isfile(p):
                return self.answer(404, b"no such file\n")
            with open(p, "rb") as f:
                return self.answer(200, f.read(), "application/octet-stream")
        if api in auth or api in self.path:
            seen = "ok"
        elif "allox-secret-placeholder-" in auth:
            seen = "placeholder"
        else:
            seen = "none"
        self.answer(200, ("auth=%s path=%s\n" % (seen, self.path.split("?")[0])).encode())
s = http.server.ThreadingHTTPServer(("127.0.0.1", int(port)), H)
if cert != "-":
    c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    c.load_cert_chain(cert, key)
    s.socket = c.wrap_socket(s.socket, server_side=True)
print(s.server_address[1], flush=True)
s.serve_forever()
"#;

/// A child process killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A certificate authority of the test's own and certificates it issued.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    /// An authority named `cn` in `dir`/`cn`.pem, and a certificate for
    /// `names` signed by it (`cn`-server.pem, `cn`-server.key).
    fn new(dir: &Path, cn: &str, names: &[&str]) -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};
        let ca_key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = p.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name
            .push(DnType::CommonName, format!("{cn} server"));
        p.subject_alt_names = names
            .iter()
            .map(|n| match n.parse() {
                Ok(a) => SanType::IpAddress(a),
                Err(_) => SanType::DnsName(n.to_string().try_into().unwrap()),
            })
            .collect();
        let cert = p.signed_by(&key, &ca, &ca_key).unwrap();
        std::fs::write(dir.join(format!("{cn}.pem")), ca.pem()).unwrap();
        std::fs::write(dir.join(format!("{cn}-server.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{cn}-server.key")), key.serialize_pem()).unwrap();
        Pki {
            dir: dir.to_path_buf(),
        }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// [`SERVER`] on 127.0.0.1 (TLS with `tls`'s server certificate when
/// given); its port.
fn server(dir: &Path, tls: Option<(&Pki, &str)>, log: &Path, repo: &Path) -> (Server, u16) {
    let script = dir.join("server.py");
    std::fs::write(&script, SERVER).unwrap();
    let (cert, key) = match tls {
        Some((pki, cn)) => (
            pki.file(&format!("{cn}-server.pem")),
            pki.file(&format!("{cn}-server.key")),
        ),
        None => ("-".into(), "-".into()),
    };
    let mut child = Command::new("/usr/bin/python3")
        .arg(&script)
        .args(["0".as_ref(), cert.as_os_str(), key.as_os_str()])
        .args([log, repo])
        .args([API_VALUE, GIT_VALUE])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line.trim().parse().expect("the server's port");
    (Server(child), port)
}

/// `alloxctl --socket … ARGS` with `env` added: exit status, stdout,
/// stderr.
fn ctl_env(d: &ProcDaemon, env: &[(&str, &str)], args: &[&str]) -> (i32, String, String) {
    let out = Command::new(allox_integration::workspace_bin("alloxctl"))
        .arg("--socket")
        .arg(&d.daemon.socket)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn sh(d: &ProcDaemon, s: &str, script: &str) -> RunResult {
    match call(
        d,
        Request::ProcessStart(start("a", s, &["/bin/sh", "-c", script])),
    ) {
        Ok(Response::Exited(r)) => r,
        other => panic!("{script}: {other:?}"),
    }
}

fn out(r: &RunResult) -> String {
    format!("{}{}", r.stdout, r.stderr)
}

/// Whether `needle` is anywhere in the file at `path` (read in pieces:
/// a store image is large).
fn file_holds(path: &Path, needle: &[u8]) -> bool {
    use std::io::Read;
    let mut f = std::fs::File::open(path).unwrap();
    let mut buf = vec![0u8; 8 << 20];
    let mut carry: Vec<u8> = Vec::new();
    let finder = memchr::memmem::Finder::new(needle);
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            return false;
        }
        carry.extend_from_slice(&buf[..n]);
        if finder.find(&carry).is_some() {
            return true;
        }
        let keep = carry.len().saturating_sub(needle.len());
        carry.drain(..keep);
    }
}

/// Every file below `dir` whose bytes hold `needle`.
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() && file_holds(&e.path(), needle) {
                found.push(e.path());
            }
        }
    }
    found
}

#[test]
fn a_secret_reaches_only_its_hosts_and_never_the_sandbox_the_logs_or_the_store() {
    if !require("secrets") {
        return;
    }
    for p in ["/usr/bin/python3", "/usr/bin/curl"] {
        assert!(Path::new(p).exists(), "secrets needs {p}");
    }
    assert!(
        allox_integration::which("git").is_some(),
        "secrets needs git"
    );
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    // The servers' authority (which --network-ca-file names) and another
    // one nothing trusts.
    let pki = Pki::new(
        w,
        "allox-test-ca",
        &["api.test", "echo.test", "git.test", "127.0.0.1"],
    );
    let untrusted = Pki::new(w, "untrusted-ca", &["bad.test"]);
    let repo = allox_integration::bare_git_repo(w, "cloned through the broker\n");
    let seen = w.join("seen.jsonl");
    let (_plain, plain_port) = server(w, None, &seen, &repo);
    let (_tls, tls_port) = server(w, Some((&pki, "allox-test-ca")), &seen, &repo);
    let (_bad, bad_port) = server(w, Some((&untrusted, "untrusted-ca")), &seen, &repo);
    let dns = DnsStub::start(HashMap::from(
        ["api.test", "echo.test", "git.test", "bad.test"]
            .map(|n| (n.to_string(), Ipv4Addr::LOCALHOST)),
    ))
    .unwrap();

    let log = w.join("daemon.log");
    let key_file = w.join("keys/secrets.key");
    let resolver = dns.addr().to_string();
    let ca_file = pki.file("allox-test-ca.pem");
    let args = [
        "--plugin",
        "network",
        "--network-resolver",
        &resolver,
        "--network-allow",
        "*.test",
        "--network-allow",
        "127.0.0.1",
        "--network-ca-file",
        ca_file.to_str().unwrap(),
        "--secrets-key-file",
        key_file.to_str().unwrap(),
    ];
    let mut d = ProcDaemon::start_logged("secrets", &[("ALLOX_LOG", "debug")], &args, &log);
    // Every `--json` answer, to be searched for the values at the end.
    let answers = std::cell::RefCell::new(String::new());
    let json = |d: &ProcDaemon, env: &[(&str, &str)], a: &[&str]| {
        let mut all = vec!["--json"];
        all.extend_from_slice(a);
        let (code, o, e) = ctl_env(d, env, &all);
        answers.borrow_mut().push_str(&o);
        answers.borrow_mut().push_str(&e);
        assert_eq!(code, 0, "alloxctl {a:?}: {o}{e}");
        serde_json::from_str::<serde_json::Value>(&o).unwrap_or(serde_json::Value::Null)
    };
    json(&d, &[], &["agent", "create", "a", "--network", "proxy"]);
    json(&d, &[], &["session", "create", "a", "s"]);
    json(
        &d,
        &[],
        &["session", "create", "a", "other", "--network", "isolated"],
    );

    // The agent's key for api.test (the client puts its placeholder in);
    // git.test's token set by the broker as a header; bad.test's
    // interception must fail on its untrusted certificate.
    let set = json(
        &d,
        &[("API", API_VALUE)],
        &[
            "secret",
            "set",
            "a",
            "API_KEY",
            "--host",
            "api.test",
            "--host",
            "bad.test",
            "--intercept",
            "--value-env",
            "API",
        ],
    );
    let placeholder = set["placeholder"].as_str().unwrap().to_string();
    assert!(
        placeholder.starts_with("allox-secret-placeholder-"),
        "{set}"
    );
    std::fs::write(w.join("git-token"), format!("{GIT_VALUE}\n")).unwrap();
    json(
        &d,
        &[],
        &[
            "secret",
            "set",
            "a",
            "GIT_TOKEN",
            "--session",
            "s",
            "--host",
            "git.test",
            "--header",
            "Authorization: Bearer {}",
            "--intercept",
            "--value-file",
            w.join("git-token").to_str().unwrap(),
        ],
    );
    // Refusals name what is wrong, and nothing is made.
    for (args, why) in [
        (
            vec![
                "secret",
                "set",
                "a",
                "HTTP_PROXY",
                "--host",
                "api.test",
                "--value-env",
                "API",
            ],
            "reserved",
        ),
        (
            vec![
                "secret",
                "set",
                "a",
                "K",
                "--host",
                "*",
                "--value-env",
                "API",
            ],
            "anywhere",
        ),
        (
            vec![
                "secret",
                "set",
                "a",
                "K",
                "--session",
                "other",
                "--host",
                "api.test",
                "--value-env",
                "API",
            ],
            "network mode isolated",
        ),
        (
            vec![
                "secret",
                "set",
                "a",
                "K",
                "--session",
                "nope",
                "--host",
                "api.test",
                "--value-env",
                "API",
            ],
            "a/nope",
        ),
    ] {
        let (code, o, e) = ctl_env(&d, &[("API", API_VALUE)], &args);
        assert_ne!(code, 0, "{args:?}: {o}");
        assert!(e.contains(why), "{args:?}: {e}");
        answers.borrow_mut().push_str(&o);
        answers.borrow_mut().push_str(&e);
    }
    let listed = json(&d, &[], &["secret", "list", "a", "s"]);
    let names: Vec<&str> = listed["secrets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["API_KEY", "GIT_TOKEN"], "{listed}");

    // The run sees placeholders only: environment, /proc, and the roots
    // it trusts (its session's authority's certificate, no key).
    let r = sh(
        &d,
        "s",
        "env; tr '\\0' '\\n' < /proc/self/environ; grep -c 'PRIVATE KEY' /run/allox/ca-bundle.pem; \
         grep -c 'BEGIN CERTIFICATE' /run/allox/ca-bundle.pem",
    );
    let o = out(&r);
    assert!(o.contains(&format!("API_KEY={placeholder}")), "{o}");
    assert!(o.contains("GIT_TOKEN=allox-secret-placeholder-"), "{o}");
    assert!(o.contains("SSL_CERT_FILE=/run/allox/ca-bundle.pem"), "{o}");
    // Debian's own bundle is the session's too (for clients that read no
    // variable): curl told to use only that path trusts the authority.
    let r = sh(
        &d,
        "s",
        &format!(
            "cmp /etc/ssl/certs/ca-certificates.crt /run/allox/ca-bundle.pem && \
             env -u CURL_CA_BUNDLE -u SSL_CERT_FILE curl -sS --cacert /etc/ssl/certs/ca-certificates.crt \
             https://api.test:{tls_port}/debian -H \"Authorization: Bearer $API_KEY\""
        ),
    );
    assert_eq!(out(&r), "auth=ok path=/debian\n", "{r:?}");
    // The host's own file is not touched.
    let session_ca = std::fs::read_to_string(
        d.daemon
            .root
            .join("state/network-secrets/a/session/s/ca/cert.pem"),
    )
    .unwrap();
    assert!(
        !std::fs::read_to_string("/etc/ssl/certs/ca-certificates.crt")
            .unwrap_or_default()
            .contains(session_ca.trim()),
        "the host's bundle was changed"
    );
    assert!(o.contains("\n0\n"), "the bundle holds no key: {o}");
    assert!(!o.contains(API_VALUE) && !o.contains(GIT_VALUE), "{o}");

    // A core dump of a run's process (gdb's gcore, into the workspace):
    // its memory holds the placeholder, never the value.
    let r = sh(
        &d,
        "s",
        "sleep 60 & p=$!; gcore -o /allox/session/core $p >/dev/null 2>&1; kill $p; \
         ls /allox/session | grep '^core\\.'",
    );
    let core_name = out(&r).trim().to_string();
    assert!(core_name.starts_with("core."), "no core dump: {r:?}");
    let core = allox_integration::session_current(&d, "a", "s").join(&core_name);
    assert!(
        file_holds(&core, placeholder.as_bytes()),
        "the dump is not of the run's memory"
    );
    assert!(!file_holds(&core, API_VALUE.as_bytes()));

    // Plain HTTP through the proxy: the broker puts the value in.
    let r = sh(
        &d,
        "s",
        &format!(
            "curl -sS http://api.test:{plain_port}/plain -H \"Authorization: Bearer $API_KEY\" && \
             curl -sS http://echo.test:{plain_port}/other -H \"Authorization: Bearer $API_KEY\""
        ),
    );
    assert_eq!(
        out(&r),
        "auth=ok path=/plain\nauth=placeholder path=/other\n",
        "api.test gets the value, echo.test the placeholder"
    );
    // A request for api.test naming another virtual host (a CDN's, a
    // shared front's) in its own `Host`, plainly and inside an
    // intercepted connection: the server is told api.test, which the
    // value was put in for, never the client's host.
    let r = sh(
        &d,
        "s",
        &format!(
            "curl -sS http://api.test:{plain_port}/fronted -H 'Host: echo.test' -H \"Authorization: Bearer $API_KEY\" && \
             curl -sS https://api.test:{tls_port}/fronted-tls -H 'Host: echo.test' -H \"Authorization: Bearer $API_KEY\""
        ),
    );
    assert_eq!(
        out(&r),
        "auth=ok path=/fronted\nauth=ok path=/fronted-tls\n"
    );
    let hosts: Vec<String> = std::fs::read_to_string(&seen)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| {
            v["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/fronted"))
        })
        .map(|v| v["host"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        hosts,
        [
            format!("api.test:{plain_port}"),
            format!("api.test:{tls_port}")
        ],
        "the servers were told another host than the one judged"
    );

    // HTTPS, intercepted: curl, Python's requests and urllib, and git.
    let r = sh(
        &d,
        "s",
        &format!(
            "curl -sS https://api.test:{tls_port}/curl -H \"Authorization: Bearer $API_KEY\" && \
             python3 -c 'import os, requests; print(requests.get(\"https://api.test:{tls_port}/requests\", \
               headers={{\"Authorization\": \"Bearer \" + os.environ[\"API_KEY\"]}}).text, end=\"\")' && \
             python3 -c 'import os, urllib.request as u; r = u.Request(\"https://api.test:{tls_port}/urllib\", \
               headers={{\"Authorization\": \"Bearer \" + os.environ[\"API_KEY\"]}}); \
               print(u.urlopen(r).read().decode(), end=\"\")' && \
             git clone -q https://git.test:{tls_port}/repo.git /tmp/clone && cat /tmp/clone/README"
        ),
    );
    assert_eq!(
        out(&r),
        "auth=ok path=/curl\nauth=ok path=/requests\nauth=ok path=/urllib\ncloned through the broker\n",
        "{r:?}"
    );
    // A host with no intercepting rule keeps its own TLS end to end: the
    // certificate the client sees is the server's, not the session's.
    let peer_issuer = |host: &str| {
        let r = sh(
            &d,
            "s",
            &format!(
                "python3 -c 'import socket, ssl\n\
s = socket.create_connection((\"127.0.0.1\", 3128))\n\
s.sendall(b\"CONNECT {host}:{tls_port} HTTP/1.1\\r\\nHost: {host}\\r\\n\\r\\n\")\n\
assert s.recv(4096).startswith(b\"HTTP/1.1 200\")\n\
t = ssl.create_default_context().wrap_socket(s, server_hostname=\"{host}\")\n\
print(dict(x[0] for x in t.getpeercert()[\"issuer\"])[\"commonName\"])'"
            ),
        );
        out(&r)
    };
    assert_eq!(peer_issuer("echo.test"), "allox-test-ca\n");
    assert_eq!(peer_issuer("api.test"), "Allox session CA a/s\n");
    // A server whose certificate the broker cannot verify is refused,
    // naming why; nothing is sent to it.
    let r = sh(
        &d,
        "s",
        &format!("curl -sS https://bad.test:{bad_port}/x -H \"Authorization: Bearer $API_KEY\"; echo \" exit $?\""),
    );
    let o = out(&r);
    assert!(o.contains("exit 56") && o.contains("502"), "{o}");
    // The server saw the requests the tests made: the values where they
    // belong, the placeholder elsewhere, nothing of bad.test.
    let seen_text = std::fs::read_to_string(&seen).unwrap();
    assert!(
        !seen_text.contains("/x\""),
        "bad.test got a request: {seen_text}"
    );
    assert!(
        seen_text.contains(&format!("\"auth\": \"Bearer {placeholder}\"")),
        "{seen_text}"
    );
    assert!(
        seen_text.contains(&format!("Bearer {GIT_VALUE}")),
        "{seen_text}"
    );

    // The audit names the secrets used and withheld, never a value.
    let audit = json(&d, &[], &["net", "audit", "a", "s"]);
    let recs = audit["records"].as_array().unwrap();
    let find = |host: &str, kind: &str| {
        recs.iter()
            .find(|r| r["host"] == host && r["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} {host} in {audit}"))
            .clone()
    };
    let api_plain = find("api.test", "HTTP");
    assert_eq!(
        api_plain["secrets_injected"],
        serde_json::json!(["API_KEY"])
    );
    let echo_plain = find("echo.test", "HTTP");
    assert_eq!(
        echo_plain["secrets_withheld"],
        serde_json::json!(["API_KEY"])
    );
    assert_eq!(echo_plain["secrets_injected"], serde_json::json!([]));
    let api_tls = find("api.test", "CONNECT");
    assert_eq!(api_tls["intercepted"], true);
    assert_eq!(api_tls["secrets_injected"], serde_json::json!(["API_KEY"]));
    let bad = find("bad.test", "CONNECT");
    assert_eq!(bad["allowed"], false);
    let verdict = bad["verdict"].as_str().unwrap();
    assert!(
        verdict.contains("the server's TLS failed") && verdict.contains("UnknownIssuer"),
        "{verdict}"
    );

    // Kept across a rollback (outside every workspace)...
    json(&d, &[], &["checkpoint", "create", "a", "s", "before"]);
    json(&d, &[], &["rollback", "a", "s", "before"]);
    let r = sh(
        &d,
        "s",
        &format!(
            "curl -sS http://api.test:{plain_port}/rolled -H \"Authorization: Bearer $API_KEY\""
        ),
    );
    assert_eq!(out(&r), "auth=ok path=/rolled\n");
    // ... and a restart (sealed in the store, the key outside it).
    d.restart(&args);
    let r = sh(
        &d,
        "s",
        &format!(
            "curl -sS https://api.test:{tls_port}/again -H \"Authorization: Bearer $API_KEY\""
        ),
    );
    assert_eq!(out(&r), "auth=ok path=/again\n");

    // Deleted: the next run has no variable, and its placeholder goes out
    // as it is.
    json(
        &d,
        &[],
        &["secret", "delete", "a", "GIT_TOKEN", "--session", "s"],
    );
    let r = sh(&d, "s", "echo \"[${GIT_TOKEN:-unset}]\"");
    assert_eq!(out(&r), "[unset]\n");
    let (code, _, e) = ctl_env(
        &d,
        &[],
        &["secret", "delete", "a", "GIT_TOKEN", "--session", "s"],
    );
    assert!(code != 0 && e.contains("no such secret"), "{e}");

    // Nowhere else: the session's files, the audit and the daemon's log,
    // every answer, and (the daemon stopped) every byte of the store's
    // disk; the key file is outside it.
    let current = allox_integration::session_current(&d, "a", "s");
    for v in [API_VALUE, GIT_VALUE] {
        assert!(
            files_holding(&current, v.as_bytes()).is_empty(),
            "{v} in the workspace"
        );
        assert!(!answers.borrow().contains(v), "{v} in alloxctl's output");
        assert!(!file_holds(&log, v.as_bytes()), "{v} in the daemon's log");
        let state = d.daemon.root.join("state");
        assert!(
            files_holding(&state, v.as_bytes()).is_empty(),
            "{v} in state/"
        );
    }
    let state_secrets = d.daemon.root.join("state/network-secrets/a/session/s");
    assert!(state_secrets.join("ca/key.sealed").exists());
    // Deleting the session takes its secrets and authority with it.
    json(&d, &[], &["session", "delete", "a", "s"]);
    assert!(!state_secrets.exists(), "the session's secrets stayed");
    d.daemon.terminate();
    rustix::fs::sync();
    let image = d.fs.image();
    for v in [API_VALUE, GIT_VALUE] {
        assert!(!file_holds(&image, v.as_bytes()), "{v} on the store's disk");
    }
    assert!(
        file_holds(&image, b"allox-secret-placeholder-"),
        "the search reads the store's disk (the placeholders are on it)"
    );
    assert!(std::fs::metadata(&key_file).is_ok());
}
