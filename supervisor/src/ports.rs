//! A session's ports served to the host (`port.expose|unexpose|list`,
//! `port.connect`). A port is one of the session's own loopback (a
//! session of mode `isolated` or `proxy` has a network namespace of its
//! own, held by its context process); what is exposed, with each port's
//! token, is kept in the store's `state/ports.json` (outside every
//! workspace; gone with the session or agent).
//!
//! `port.connect` comes with one end of a Unix stream socket pair from a
//! client on the daemon's socket (the gateway, `alloxctl port forward`): a
//! thread enters the session's network namespace, connects to
//! `127.0.0.1:PORT` there (bounded), and leaves; the daemon then relays
//! between that connection and the client's socket on its async workers
//! until either side is done. Connections relayed at once are bounded per
//! session and in all; one past a bound is refused at once, naming it.
//! Each connection is recorded in the audit log with the run whose socket
//! listens (asked of the kernel, as the network plugin does), at most
//! as often as the audit's per-session rate allows.

use crate::runs::Runs;
use allox_protocol::{
    ErrorBody, ErrorCode, PortConnect, PortConnected, PortExpose, PortInfo, PortList, PortListing,
    PortUnexpose,
};
use allox_store::Store;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The file in the store's `state/`.
pub const FILE: &str = "ports.json";

/// Connections relayed at once for one session, and for all.
pub const MAX_PER_SESSION: usize = 256;
pub const MAX_ALL: usize = 4096;

/// How long a connection to a session's port may take.
pub const CONNECT_WITHIN: Duration = Duration::from_secs(5);

/// Most ports exposed per session.
pub const MAX_EXPOSED: usize = 64;

#[derive(Serialize, Deserialize, Clone)]
struct Exposed {
    agent: String,
    session: String,
    port: u16,
    public: bool,
    token: String,
    exposed_ms: u64,
    /// The port's own host (`PortInfo::host`); made when missing (a file
    /// of a build before).
    #[serde(default)]
    host: String,
}

type Key = (String, String, u16);

pub struct Ports {
    file: PathBuf,
    exposed: Mutex<BTreeMap<Key, Exposed>>,
    /// Relays open, per session.
    open: Mutex<BTreeMap<(String, String), usize>>,
    all: Arc<tokio::sync::Semaphore>,
    /// A thread in each session's network namespace that makes sockets
    /// there, by session, for the context it entered.
    connectors: Mutex<BTreeMap<(String, String), Arc<Connector>>>,
    /// Per exposed port, what its relays wait on to end: its sender is
    /// dropped (and so every relay of the port ends) when the port is
    /// unexposed or its session deleted.
    closing: Mutex<BTreeMap<Key, tokio::sync::watch::Sender<()>>>,
}

/// A thread that entered a session's network namespace (that of its
/// context process `pid`) and makes sockets there on request: a socket
/// belongs to the namespace it was made in, wherever it is used after,
/// so the connection itself is made by the caller, and the thread never
/// waits on one. It ends when its [`Connector`] is dropped (the session
/// deleted, or its context replaced).
struct Connector {
    pid: i32,
    tx: Mutex<std::sync::mpsc::Sender<std::sync::mpsc::SyncSender<std::io::Result<OwnedFd>>>>,
    /// The namespace's socket-diagnosis socket, if the kernel has one.
    diag: Option<Arc<allox_network::diag::SockDiag>>,
}

impl Connector {
    fn start(pid: i32, pidfd: OwnedFd) -> std::io::Result<Connector> {
        type Reply = std::sync::mpsc::SyncSender<std::io::Result<OwnedFd>>;
        let (tx, rx) = std::sync::mpsc::channel::<Reply>();
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("allox-ports".into())
            .spawn(move || {
                let entered = rustix::thread::move_into_thread_name_spaces(
                    rustix::fd::AsFd::as_fd(&pidfd),
                    rustix::thread::ThreadNameSpaceType::NETWORK,
                );
                drop(pidfd);
                if let Err(e) = entered {
                    let _ = ready_tx.send(Err(std::io::Error::from(e)));
                    return;
                }
                let diag = allox_network::diag::SockDiag::new().ok().map(Arc::new);
                let _ = ready_tx.send(Ok(diag));
                for reply in rx {
                    let made = rustix::net::socket_with(
                        rustix::net::AddressFamily::INET,
                        rustix::net::SocketType::STREAM,
                        rustix::net::SocketFlags::CLOEXEC | rustix::net::SocketFlags::NONBLOCK,
                        None,
                    )
                    .map_err(std::io::Error::from);
                    let _ = reply.send(made);
                }
            })?;
        let diag = ready_rx
            .recv()
            .map_err(|_| std::io::Error::other("the thread ended"))??;
        Ok(Connector {
            pid,
            tx: Mutex::new(tx),
            diag,
        })
    }

    /// A new TCP socket of the namespace, not connected.
    fn socket(&self) -> std::io::Result<OwnedFd> {
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        self.tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(reply)
            .map_err(|_| std::io::Error::other("the session's port thread ended"))?;
        answer
            .recv()
            .map_err(|_| std::io::Error::other("the session's port thread ended"))?
    }
}

fn err(code: ErrorCode, why: impl Into<String>) -> ErrorBody {
    ErrorBody::new(code, why.into())
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn token() -> String {
    let mut b = [0u8; 24];
    getrandom::fill(&mut b).expect("the kernel's random numbers");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A new port's own host: its number and 16 random hex digits.
fn host(port: u16) -> String {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("the kernel's random numbers");
    let id: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{port}-{id}")
}

fn info(e: &Exposed) -> PortInfo {
    PortInfo {
        agent_id: e.agent.clone(),
        session_id: e.session.clone(),
        port: e.port,
        public: e.public,
        token: e.token.clone(),
        path: allox_protocol::port_path(&e.agent, &e.session, e.port),
        host: e.host.clone(),
        exposed_ms: e.exposed_ms,
    }
}

/// Tokens compared in time that does not depend on where they differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

impl Ports {
    /// What `state_dir` holds (nothing when the file is missing or
    /// unreadable: a port is exposed again by asking).
    pub fn load(state_dir: &Path) -> Ports {
        let file = state_dir.join(FILE);
        let mut list: Vec<Exposed> = std::fs::read(&file)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let mut made = false;
        for e in list.iter_mut().filter(|e| e.host.is_empty()) {
            e.host = host(e.port);
            made = true;
        }
        let ports = Ports {
            file,
            exposed: Mutex::new(
                list.into_iter()
                    .map(|e| ((e.agent.clone(), e.session.clone(), e.port), e))
                    .collect(),
            ),
            open: Mutex::new(BTreeMap::new()),
            all: Arc::new(tokio::sync::Semaphore::new(MAX_ALL)),
            connectors: Mutex::new(BTreeMap::new()),
            closing: Mutex::new(BTreeMap::new()),
        };
        if made {
            // Kept, so a port's host stays what it was first answered.
            let map = ports.exposed.lock().unwrap_or_else(|e| e.into_inner());
            if let Err(e) = ports.save(&map) {
                tracing::error!(error = %e.message, "cannot record the exposed ports' hosts");
            }
        }
        ports
    }

    fn save(&self, map: &BTreeMap<Key, Exposed>) -> Result<(), ErrorBody> {
        let list: Vec<&Exposed> = map.values().collect();
        let bytes = serde_json::to_vec_pretty(&list)
            .map_err(|e| err(ErrorCode::Internal, e.to_string()))?;
        let tmp = self.file.with_extension("json.new");
        let write = || -> std::io::Result<()> {
            use std::os::unix::fs::OpenOptionsExt;
            let _ = std::fs::remove_file(&tmp);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &self.file)?;
            if let Some(d) = self.file.parent() {
                std::fs::File::open(d)?.sync_all()?;
            }
            Ok(())
        };
        write().map_err(|e| {
            err(
                ErrorCode::Internal,
                format!("write {}: {e}", self.file.display()),
            )
        })
    }

    /// `port.expose`, once the session is known to have a network of its
    /// own.
    pub fn expose(&self, r: &PortExpose) -> Result<PortInfo, ErrorBody> {
        if r.port == 0 {
            return Err(err(
                ErrorCode::InvalidRequest,
                "port 0: a port is 1 to 65535",
            ));
        }
        let mut map = self.exposed.lock().unwrap_or_else(|e| e.into_inner());
        let key = (r.agent_id.clone(), r.session_id.clone(), r.port);
        let of_session = map
            .keys()
            .filter(|(a, s, _)| *a == r.agent_id && *s == r.session_id)
            .count();
        if !map.contains_key(&key) && of_session >= MAX_EXPOSED {
            return Err(err(
                ErrorCode::InvalidRequest,
                format!(
                    "session {}/{} has {MAX_EXPOSED} ports exposed, the most it may have",
                    r.agent_id, r.session_id
                ),
            ));
        }
        let before = map.get(&key).cloned();
        let e = Exposed {
            agent: r.agent_id.clone(),
            session: r.session_id.clone(),
            port: r.port,
            public: r.public,
            token: before
                .as_ref()
                .map(|b| b.token.clone())
                .unwrap_or_else(token),
            exposed_ms: before.as_ref().map(|b| b.exposed_ms).unwrap_or_else(now_ms),
            host: before
                .as_ref()
                .map(|b| b.host.clone())
                .unwrap_or_else(|| host(r.port)),
        };
        map.insert(key.clone(), e.clone());
        if let Err(x) = self.save(&map) {
            match before {
                Some(b) => map.insert(key, b),
                None => map.remove(&key),
            };
            return Err(x);
        }
        Ok(info(&e))
    }

    /// `port.unexpose`.
    pub fn unexpose(&self, r: &PortUnexpose) -> Result<String, ErrorBody> {
        let mut map = self.exposed.lock().unwrap_or_else(|e| e.into_inner());
        let key = (r.agent_id.clone(), r.session_id.clone(), r.port);
        let what = format!("{}/{}/port-{}", r.agent_id, r.session_id, r.port);
        let Some(before) = map.remove(&key) else {
            return Err(err(
                ErrorCode::NotFound,
                format!(
                    "port {} of session {}/{} is not exposed",
                    r.port, r.agent_id, r.session_id
                ),
            ));
        };
        if let Err(x) = self.save(&map) {
            map.insert(key, before);
            return Err(x);
        }
        // Its connections end.
        self.closing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
        Ok(what)
    }

    /// `port.list`.
    pub fn list(&self, r: &PortList) -> PortListing {
        let map = self.exposed.lock().unwrap_or_else(|e| e.into_inner());
        PortListing {
            ports: map
                .values()
                .filter(|e| {
                    e.agent == r.agent_id && r.session_id.as_ref().is_none_or(|s| *s == e.session)
                })
                .map(info)
                .collect(),
        }
    }

    /// Session `a/s` (every session of `a` when `None`) was deleted.
    pub fn deleted(&self, a: &str, s: Option<&str>) {
        self.connectors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(ca, cs), _| ca != a || s.is_some_and(|s| s != cs));
        let gone = |(ea, es, _): &Key| ea == a && s.is_none_or(|s| s == es);
        let mut map = self.exposed.lock().unwrap_or_else(|e| e.into_inner());
        let n = map.len();
        map.retain(|k, _| !gone(k));
        // Their connections end (the locks in the order connect takes them).
        self.closing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| !gone(k));
        if map.len() != n {
            if let Err(e) = self.save(&map) {
                tracing::error!(error = %e.message, "cannot record the deleted session's ports");
            }
        }
    }

    /// The exposed port `r` names: by its own host, or by its agent,
    /// session and number.
    fn to_connect(&self, r: &PortConnect) -> Result<Exposed, ErrorBody> {
        let (a, s, port) = (r.agent_id.as_str(), r.session_id.as_str(), r.port);
        let map = self.exposed.lock().unwrap_or_else(|e| e.into_inner());
        let Some(h) = &r.host else {
            return map
                .get(&(a.to_string(), s.to_string(), port))
                .cloned()
                .ok_or_else(|| {
                    err(
                        ErrorCode::NotFound,
                        format!("port {port} of session {a}/{s} is not exposed"),
                    )
                });
        };
        let found = map.values().find(|e| same(&e.host, h));
        let named = !(a.is_empty() && s.is_empty() && port == 0);
        match found {
            Some(e) if !named || (e.agent == a && e.session == s && e.port == port) => {
                Ok(e.clone())
            }
            _ => Err(err(
                ErrorCode::NotFound,
                if named {
                    format!("port {port} of session {a}/{s} is not exposed at host {h}")
                } else {
                    format!("no port is exposed at host {h}")
                },
            )),
        }
    }

    /// `port.connect`: checks, connects inside the session, and relays to
    /// `client` (the caller's socket) on the runtime `rt`.
    pub fn connect(
        self: &Arc<Self>,
        runs: &Arc<Runs>,
        store: &Arc<Store>,
        r: &PortConnect,
        client: Option<OwnedFd>,
    ) -> Result<PortConnected, ErrorBody> {
        let client = client.ok_or_else(|| {
            err(
                ErrorCode::Unsupported,
                "port.connect comes with the descriptor of a Unix stream socket (SCM_RIGHTS), which passes only over the daemon's Unix socket",
            )
        })?;
        let exposed = self.to_connect(r)?;
        let (a, s, port) = (
            exposed.agent.as_str(),
            exposed.session.as_str(),
            exposed.port,
        );
        let token_ok = r.token.as_deref().is_some_and(|t| same(t, &exposed.token));
        if !(exposed.public || r.authorized || token_ok) {
            return Err(err(
                ErrorCode::Unauthorized,
                format!("port {port} of session {a}/{s}: its token or the gateway's is needed"),
            ));
        }
        let client = std::os::unix::net::UnixStream::from(client);
        let rt = tokio::runtime::Handle::try_current()
            .map_err(|_| err(ErrorCode::Internal, "no async runtime to relay on"))?;
        // The budgets before any connection is made.
        let all = self.all.clone().try_acquire_owned().map_err(|_| {
            err(
                ErrorCode::Unavailable,
                format!("refused: {MAX_ALL} port connections of all sessions are open, the daemon's budget"),
            )
        })?;
        let session_key = (a.to_string(), s.to_string());
        {
            let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
            let n = open.entry(session_key.clone()).or_insert(0);
            if *n >= MAX_PER_SESSION {
                return Err(err(
                    ErrorCode::Unavailable,
                    format!("refused: {MAX_PER_SESSION} port connections of session {a}/{s} are open, its budget"),
                ));
            }
            *n += 1;
        }
        let held = Held {
            ports: self.clone(),
            key: session_key,
            _all: all,
        };
        let nothing = |why: String| {
            err(
                ErrorCode::Unavailable,
                format!("nothing answers on port {port} of session {a}/{s}: {why}"),
            )
        };
        let connector = self
            .connector(runs, a, s)
            .map_err(|e| nothing(e.to_string()))?;
        let sock = connector.socket().map_err(|e| nothing(e.to_string()))?;
        let _enter = rt.enter();
        let addr = std::net::SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let conn = tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(sock));
        let conn = rt
            .block_on(async { tokio::time::timeout(CONNECT_WITHIN, conn.connect(addr)).await })
            .map_err(|_| nothing(format!("no answer within {CONNECT_WITHIN:?}")))?
            .map_err(|e| nothing(e.to_string()))?;
        let _ = conn.set_nodelay(true);
        let client = client
            .set_nonblocking(true)
            .and_then(|()| tokio::net::UnixStream::from_std(client))
            .map_err(|e| err(ErrorCode::Internal, format!("relay: {e}")))?;
        // Ended when the port is unexposed or its session deleted.
        let key = (a.to_string(), s.to_string(), port);
        let mut closed = {
            // In the order unexpose takes them: a port unexposed since the
            // check above gets no relay.
            let exposed = self.exposed.lock().unwrap_or_else(|e| e.into_inner());
            if !exposed.contains_key(&key) {
                return Err(err(
                    ErrorCode::NotFound,
                    format!("port {port} of session {a}/{s} is not exposed"),
                ));
            }
            self.closing
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(key)
                .or_insert_with(|| tokio::sync::watch::channel(()).0)
                .subscribe()
        };
        // Which run listens, and the audit record, once the relay runs:
        // not on the caller's path.
        let (diag, store) = (connector.diag.clone(), store.clone());
        let runs_for = runs.clone();
        let (ka, ks) = (a.to_string(), s.to_string());
        rt.spawn(async move {
            let _held = held;
            let run_id = match diag {
                Some(d) => {
                    let local = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
                    let any = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0);
                    match d.cgroup_of(local, any).await {
                        Ok(Some(id)) => run_of(&runs_for, &ka, &ks, id),
                        _ => None,
                    }
                }
                None => None,
            };
            let _ = store.audit().append_for(
                &format!("{ka}/{ks}"),
                allox_store::audit::Entry {
                    request_id: 0,
                    peer: "port".into(),
                    action: "port.connect".into(),
                    target: format!("{ka}/{ks}/port-{port}"),
                    outcome: "ok".into(),
                    message: Some(match &run_id {
                        Some(r) => format!("connected to port {port}, where run {r} listens"),
                        None => format!("connected to port {port}"),
                    }),
                },
            );
            let (mut c, mut t) = (client, allox_network::relay::QuickAck(conn));
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut c, &mut t) => {}
                // The sender dropped: unexposed, or the session deleted.
                _ = closed.changed() => {}
            }
        });
        Ok(PortConnected {
            host: exposed.host.clone(),
            agent_id: a.to_string(),
            session_id: s.to_string(),
            port,
        })
    }

    /// The port thread of session `a/s`'s live context: its own, or a new
    /// one when the context is new.
    fn connector(&self, runs: &Runs, a: &str, s: &str) -> std::io::Result<Arc<Connector>> {
        let (pid, pidfd) = runs.context_pidfd(a, s).ok_or_else(|| {
            std::io::Error::other("no run of it has started, so its network does not exist yet")
        })?;
        let key = (a.to_string(), s.to_string());
        let mut all = self.connectors.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = all.get(&key).filter(|c| c.pid == pid) {
            return Ok(c.clone());
        }
        let c = Arc::new(Connector::start(pid, pidfd)?);
        all.insert(key, c.clone());
        Ok(c)
    }
}

/// A relay's places in the budgets, given back when it ends.
struct Held {
    ports: Arc<Ports>,
    key: (String, String),
    _all: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut open = self.ports.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.key);
            }
        }
    }
}

/// The run of session `a/s` whose cgroup has id `id`.
fn run_of(runs: &Runs, a: &str, s: &str, id: u64) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    runs.list(a, s)
        .processes
        .into_iter()
        .filter_map(|p| p.run_id)
        .find(|run| {
            std::fs::metadata(runs.cgroups().run_dir(a, s, run)).is_ok_and(|m| m.ino() == id)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposed_ports_are_kept_listed_and_gone_with_their_session() {
        let dir = tempfile::tempdir().unwrap();
        let p = Ports::load(dir.path());
        let ex = |s: &str, port| PortExpose {
            agent_id: "a".into(),
            session_id: s.into(),
            port,
            public: false,
        };
        let first = p.expose(&ex("s", 8000)).unwrap();
        assert_eq!(first.path, "/v1/ports/a/s/8000/");
        assert_eq!(first.token.len(), 48);
        assert!(
            first.host.starts_with("8000-") && allox_protocol::is_port_host(&first.host),
            "{}",
            first.host
        );
        // Exposed again: the same token and host.
        let again = p.expose(&ex("s", 8000)).unwrap();
        assert_eq!((&again.token, &again.host), (&first.token, &first.host));
        let t = p.expose(&ex("t", 9000)).unwrap();
        assert_ne!(t.host, first.host);
        let again = Ports::load(dir.path());
        let all = again.list(&PortList {
            agent_id: "a".into(),
            session_id: None,
        });
        assert_eq!(all.ports.len(), 2);
        assert_eq!(all.ports[0].token, first.token);
        assert_eq!(all.ports[0].host, first.host);
        // Found by its host; named too, it must be the host's port.
        let by = |host: &str, s: &str, port| PortConnect {
            agent_id: if s.is_empty() { "" } else { "a" }.into(),
            session_id: s.into(),
            port,
            token: None,
            authorized: false,
            host: Some(host.into()),
        };
        let found = again.to_connect(&by(&first.host, "", 0)).unwrap();
        assert_eq!((found.session.as_str(), found.port), ("s", 8000));
        assert!(again.to_connect(&by(&first.host, "s", 8000)).is_ok());
        for (h, s, port) in [
            (first.host.as_str(), "t", 9000),
            (t.host.as_str(), "s", 8000),
            ("8000-0000000000000000", "", 0),
        ] {
            let e = again
                .to_connect(&by(h, s, port))
                .err()
                .expect("not that host's port");
            assert_eq!(e.code, ErrorCode::NotFound, "{h} {s} {port}");
        }
        again.deleted("a", Some("s"));
        let left = Ports::load(dir.path()).list(&PortList {
            agent_id: "a".into(),
            session_id: None,
        });
        assert_eq!(
            left.ports.iter().map(|x| x.port).collect::<Vec<_>>(),
            [9000]
        );
        let e = again
            .unexpose(&PortUnexpose {
                agent_id: "a".into(),
                session_id: "s".into(),
                port: 8000,
            })
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        assert!(p.expose(&ex("s", 0)).is_err());
        assert!(same("abc", "abc") && !same("abc", "abd") && !same("abc", "ab"));
    }

    #[test]
    fn a_port_recorded_without_a_host_gets_one_that_stays() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(FILE),
            r#"[{"agent": "a", "session": "s", "port": 8000, "public": false, "token": "t", "exposed_ms": 1}]"#,
        )
        .unwrap();
        let list = |p: &Ports| {
            p.list(&PortList {
                agent_id: "a".into(),
                session_id: None,
            })
            .ports
        };
        let first = list(&Ports::load(dir.path()));
        assert!(allox_protocol::is_port_host(&first[0].host), "{first:?}");
        assert_eq!(list(&Ports::load(dir.path()))[0].host, first[0].host);
    }
}
