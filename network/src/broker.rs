//! The broker: serves one proxy client, outside every sandbox.
//!
//! It reads the request head ([`crate::http`]), judges the host and port
//! before resolving anything ([`Policy::check_target`]), resolves the name
//! itself ([`Resolve`]), judges each address ([`Policy::check_address`]),
//! connects to the first one allowed, and relays bytes both ways until
//! either side is done. Every attempt ends in one [`Attempt`], allowed or
//! not, for the audit.

use crate::http::{self, Ask};
use crate::intercept::SessionCa;
use crate::own::OwnAddresses;
use crate::policy::{special, Host, Policy, Verdict};
use crate::secrets::{Injected, Secret};
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Resolves names for the broker (and only for it: nothing inside a
/// sandbox resolves names).
pub trait Resolve: Send + Sync {
    fn resolve<'a>(
        &'a self,
        name: &'a str,
    ) -> Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send + 'a>>;
}

/// The system's resolver configuration (the name servers, search list and
/// options of `/etc/resolv.conf`, and `/etc/hosts`), asked asynchronously
/// by hickory's resolver: a lookup waits on a socket, never on a thread,
/// so one that never answers holds up nothing but its own connection.
pub struct SystemResolver {
    inner: hickory_resolver::TokioResolver,
}

/// Where the system's resolver configuration is read.
pub const RESOLV_CONF: &str = "/etc/resolv.conf";

impl SystemResolver {
    /// From [`RESOLV_CONF`] (and `/etc/hosts`); without one that reads
    /// (a VM with no network configured), `/etc/hosts` alone.
    pub fn new() -> SystemResolver {
        SystemResolver::from_resolv_conf(std::path::Path::new(RESOLV_CONF)).unwrap_or_else(|e| {
            tracing::warn!(path = RESOLV_CONF, error = %e, "no name server: names resolve by /etc/hosts alone");
            SystemResolver::from_parts(
                hickory_resolver::config::ResolverConfig::from_parts(None, vec![], vec![]),
                hickory_resolver::config::ResolverOpts::default(),
            )
        })
    }

    /// From the `resolv.conf` at `path` (and `/etc/hosts`).
    pub fn from_resolv_conf(path: &std::path::Path) -> io::Result<SystemResolver> {
        let text = std::fs::read(path)?;
        let (config, options) = hickory_resolver::system_conf::parse_resolv_conf(&text)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        Ok(SystemResolver::from_parts(config, options))
    }

    /// With `config`'s name servers and `options`, and `/etc/hosts`.
    fn from_parts(
        config: hickory_resolver::config::ResolverConfig,
        mut options: hickory_resolver::config::ResolverOpts,
    ) -> SystemResolver {
        use hickory_resolver::config::ResolveHosts;
        use hickory_resolver::name_server::TokioConnectionProvider;
        options.use_hosts_file = ResolveHosts::Always;
        let mut b = hickory_resolver::Resolver::builder_with_config(
            config,
            TokioConnectionProvider::default(),
        );
        *b.options_mut() = options;
        SystemResolver { inner: b.build() }
    }
}

impl Default for SystemResolver {
    fn default() -> Self {
        SystemResolver::new()
    }
}

impl Resolve for SystemResolver {
    fn resolve<'a>(
        &'a self,
        name: &'a str,
    ) -> Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send + 'a>> {
        Box::pin(async move {
            match self.inner.lookup_ip(name).await {
                Ok(l) => Ok(l.iter().collect()),
                Err(e) => Err(io::Error::new(io::ErrorKind::NotFound, e.to_string())),
            }
        })
    }
}

/// A resolver shared by every session, with a bound of lookups in flight
/// for one: a session that asks for names faster than they are answered
/// is refused the next one at once (with `refusal` as the reason), and
/// others' lookups are not held up.
pub struct LookupBudget {
    inner: Arc<dyn Resolve>,
    in_flight: Arc<tokio::sync::Semaphore>,
    refusal: String,
}

impl LookupBudget {
    /// At most `max` lookups of `inner` at once; `refusal` says why the
    /// next one is refused (naming the budget and how to change it).
    pub fn new(inner: Arc<dyn Resolve>, max: usize, refusal: String) -> LookupBudget {
        LookupBudget {
            inner,
            in_flight: Arc::new(tokio::sync::Semaphore::new(max)),
            refusal,
        }
    }
}

impl Resolve for LookupBudget {
    fn resolve<'a>(
        &'a self,
        name: &'a str,
    ) -> Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send + 'a>> {
        Box::pin(async move {
            let Ok(_held) = self.in_flight.try_acquire() else {
                return Err(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    self.refusal.clone(),
                ));
            };
            self.inner.resolve(name).await
        })
    }
}

/// A DNS server of one's choosing, asked directly over UDP (and TCP when
/// an answer is truncated): how the daemon is pointed at a resolver other
/// than the system's (`--network-resolver`), and how tests count queries.
pub struct DnsResolver {
    inner: hickory_resolver::TokioResolver,
}

impl DnsResolver {
    pub fn new(server: SocketAddr) -> DnsResolver {
        use hickory_resolver::config::{NameServerConfigGroup, ResolverConfig};
        use hickory_resolver::name_server::TokioConnectionProvider;
        let group = NameServerConfigGroup::from_ips_clear(&[server.ip()], server.port(), true);
        let config = ResolverConfig::from_parts(None, vec![], group);
        let mut b = hickory_resolver::Resolver::builder_with_config(
            config,
            TokioConnectionProvider::default(),
        );
        // Names are asked as given: no search list, no extra dots.
        b.options_mut().ndots = 0;
        b.options_mut().attempts = 2;
        b.options_mut().timeout = Duration::from_secs(2);
        DnsResolver { inner: b.build() }
    }
}

impl Resolve for DnsResolver {
    fn resolve<'a>(
        &'a self,
        name: &'a str,
    ) -> Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send + 'a>> {
        Box::pin(async move {
            let fqdn = format!("{}.", name.trim_end_matches('.'));
            match self.inner.lookup_ip(fqdn).await {
                Ok(l) => Ok(l.iter().collect()),
                Err(e) => Err(io::Error::new(io::ErrorKind::NotFound, e.to_string())),
            }
        })
    }
}

/// One connection attempt, as the audit records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// `CONNECT`, or the forwarded request's method line's first word.
    pub kind: &'static str,
    /// As the client asked (empty when no request could be read).
    pub host: String,
    pub port: u16,
    /// The address connected to, if any.
    pub addr: Option<SocketAddr>,
    pub allowed: bool,
    /// `allowed`, or why not.
    pub verdict: String,
    /// Bytes from the client to the server, and back.
    pub sent: u64,
    pub received: u64,
    /// The secrets put in, and those whose placeholders went out as they
    /// were (by name).
    pub secrets: Injected,
    /// Whether the broker terminated the client's TLS.
    pub intercepted: bool,
}

/// A session's secrets, as the broker uses them.
#[derive(Default, Clone)]
pub struct SessionSecrets {
    pub list: Vec<Secret>,
    /// The session's certificate authority, when a secret intercepts.
    pub ca: Option<Arc<SessionCa>>,
}

impl SessionSecrets {
    /// Whether a tunnel to `host:port` is intercepted.
    pub fn intercepts(&self, host: &Host, port: u16) -> bool {
        self.ca.is_some()
            && self
                .list
                .iter()
                .any(|s| s.intercept && s.goes_to(host, port))
    }
}

/// How long the broker waits for each step.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub head: Duration,
    pub resolve: Duration,
    pub connect: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            head: Duration::from_secs(30),
            resolve: Duration::from_secs(10),
            connect: Duration::from_secs(10),
        }
    }
}

/// What an intercepted connection is served with: the session's
/// secrets, and whom to tell once it is open.
#[derive(Clone, Copy)]
struct With<'a> {
    secrets: &'a SessionSecrets,
    opened: &'a (dyn Fn(&Attempt) -> bool + Send + Sync),
}

/// Serves proxy clients.
#[derive(Clone)]
pub struct Broker {
    pub resolver: Arc<dyn Resolve>,
    pub timeouts: Timeouts,
    /// The machine's own addresses: refused like the loopback unless a
    /// rule names them.
    pub own: Arc<OwnAddresses>,
    /// What an intercepted connection's server is verified against
    /// (`None`: interception refused, naming why).
    pub upstream_tls: Result<Arc<rustls::ClientConfig>, String>,
    /// Becomes true when the session ends (or its sender is dropped):
    /// every relay of the broker's then ends, both sides shut down, so
    /// nothing of a deleted session's connections stays open (`None`: they
    /// end only by themselves).
    pub ended: Option<tokio::sync::watch::Receiver<bool>>,
    /// Told of the bytes each allowed connection moves as they move (sent
    /// to the server, received from it), so that a long connection's
    /// bytes are counted while it lasts, not only at its end (`None`:
    /// nobody is told).
    pub tally: Option<Tally>,
}

/// Why an allowed connection that could not be recorded is refused.
const UNRECORDED: &str = "the connection cannot be recorded in the network audit (is the disk full?); no connection goes unrecorded, so it is refused";

/// A broker's [`Broker::tally`]: bytes sent, bytes received.
pub type Tally = Arc<dyn Fn(u64, u64) + Send + Sync>;

impl Broker {
    /// Tells the broker's tally of bytes moved.
    fn tally(&self, sent: u64, received: u64) {
        if let Some(t) = &self.tally {
            t(sent, received);
        }
    }

    /// Resolves when the session has ended.
    fn session_ended(&self) -> impl std::future::Future<Output = ()> + use<> {
        let ended = self.ended.clone();
        async move {
            match ended {
                // An error: the sender is gone, with its session.
                Some(mut e) => {
                    let _ = e.wait_for(|e| *e).await;
                }
                None => std::future::pending().await,
            }
        }
    }

    /// Serves one client under `policy`, with the session's `secrets`;
    /// returns what happened. `opened` is told of an allowed connection
    /// before a byte of it goes on (the attempt as it is then: no bytes
    /// counted yet), so that a connection is known while it lasts; when it
    /// answers `false` (the connection could not be recorded) the client
    /// is refused `503` and nothing goes on: no connection goes
    /// unrecorded.
    pub async fn serve(
        &self,
        mut client: TcpStream,
        policy: &Policy,
        secrets: &SessionSecrets,
        opened: &(dyn Fn(&Attempt) -> bool + Send + Sync),
    ) -> Attempt {
        let mut attempt = Attempt {
            kind: "",
            host: String::new(),
            port: 0,
            addr: None,
            allowed: false,
            verdict: String::new(),
            sent: 0,
            received: 0,
            secrets: Injected::default(),
            intercepted: false,
        };
        let mut buf = Vec::with_capacity(4096);
        let req = match tokio::time::timeout(self.timeouts.head, read_head(&mut client, &mut buf))
            .await
        {
            Ok(Ok(Some(r))) => r,
            Ok(Ok(None)) => {
                attempt.verdict = "the client closed before a request".into();
                return attempt;
            }
            Ok(Err(Refusal {
                status,
                reason,
                why,
            })) => {
                let _ = client.write_all(&http::answer(status, reason, &why)).await;
                attempt.verdict = why;
                return attempt;
            }
            Err(_) => {
                let why = format!("no request head within {:?}", self.timeouts.head);
                let _ = client
                    .write_all(&http::answer(408, "Request Timeout", &why))
                    .await;
                attempt.verdict = why;
                return attempt;
            }
        };
        attempt.kind = match &req.ask {
            Ask::Connect => "CONNECT",
            Ask::Forward { .. } => "HTTP",
        };
        attempt.host = req.host.to_string();
        attempt.port = req.port;
        match self.open(&req.host, req.port, policy).await {
            Err(Refusal {
                status,
                reason,
                why,
            }) => {
                let _ = client.write_all(&http::answer(status, reason, &why)).await;
                attempt.verdict = why;
                attempt
            }
            Ok((mut server, addr)) => {
                attempt.addr = Some(addr);
                attempt.allowed = true;
                attempt.verdict = Verdict::Allow.to_string();
                if matches!(req.ask, Ask::Connect) && secrets.intercepts(&req.host, req.port) {
                    attempt.intercepted = true;
                    let early = &buf[req.head_len..];
                    let with = With { secrets, opened };
                    return self
                        .intercept(client, server, &req, early, &with, attempt)
                        .await;
                }
                let head = match &req.ask {
                    Ask::Forward { head } => {
                        let (head, done) =
                            crate::secrets::inject(head, &req.host, req.port, &secrets.list);
                        attempt.secrets = done;
                        head
                    }
                    Ask::Connect => Vec::new(),
                };
                if !opened(&attempt) {
                    let _ = client
                        .write_all(&http::answer(503, "Service Unavailable", UNRECORDED))
                        .await;
                    attempt.verdict = format!("refused: {UNRECORDED}");
                    return attempt;
                }
                let first = match &req.ask {
                    Ask::Connect => client.write_all(http::CONNECTED).await,
                    Ask::Forward { .. } => server.write_all(&head).await,
                };
                // What the client sent after its head goes on.
                let rest = &buf[req.head_len..];
                let first = match first {
                    Ok(()) if !rest.is_empty() => server.write_all(rest).await,
                    r => r,
                };
                if first.is_err() {
                    return attempt;
                }
                // Counted as the server got them (a forwarded head as
                // rewritten).
                attempt.sent = rest.len() as u64 + head.len() as u64;
                self.tally(attempt.sent, 0);
                let tally = |sent, received| self.tally(sent, received);
                let (up, down) =
                    crate::relay::relay(client, server, self.session_ended(), &tally).await;
                attempt.sent += up;
                attempt.received = down;
                attempt
            }
        }
    }

    /// An intercepted tunnel: the server's TLS first (verified; a failure
    /// is the client's refusal, naming it), then the client's with the
    /// session's certificate for the host, the request's head rewritten
    /// with the secrets, and the rest relayed.
    async fn intercept(
        &self,
        mut client: TcpStream,
        server: TcpStream,
        req: &http::Request,
        early: &[u8],
        with: &With<'_>,
        mut attempt: Attempt,
    ) -> Attempt {
        let target = format!("{}:{}", req.host, req.port);
        let refusal = match self.upstream(server, &req.host, &target).await {
            Err(why) => Refusal::bad_gateway(why),
            Ok(_) if !early.is_empty() => Refusal {
                status: 400,
                reason: "Bad Request",
                why: format!("{target}: bytes sent before the tunnel was opened"),
            },
            Ok(upstream) => {
                return self
                    .intercepted(client, upstream, req, &target, with, attempt)
                    .await
            }
        };
        let _ = client
            .write_all(&http::answer(refusal.status, refusal.reason, &refusal.why))
            .await;
        attempt.allowed = false;
        attempt.verdict = refusal.why;
        attempt
    }

    /// The broker's own TLS connection to the server, verified.
    async fn upstream(
        &self,
        server: TcpStream,
        host: &Host,
        target: &str,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
        let config = self
            .upstream_tls
            .as_ref()
            .map_err(|e| format!("{target}: cannot intercept: {e}"))?;
        let name = crate::intercept::server_name(&host.to_string())
            .map_err(|e| format!("{target}: {e}"))?;
        let connector = tokio_rustls::TlsConnector::from(config.clone());
        match tokio::time::timeout(self.timeouts.connect, connector.connect(name, server)).await {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => Err(format!(
                "{target}: the server's TLS failed, nothing was sent: {e}"
            )),
            Err(_) => Err(format!(
                "{target}: no TLS handshake from the server within {:?}",
                self.timeouts.connect
            )),
        }
    }

    /// The client's side of an intercepted tunnel, once the server's is up.
    async fn intercepted(
        &self,
        mut client: TcpStream,
        mut upstream: tokio_rustls::client::TlsStream<TcpStream>,
        req: &http::Request,
        target: &str,
        with: &With<'_>,
        mut attempt: Attempt,
    ) -> Attempt {
        let With { secrets, opened } = *with;
        let host = req.host.to_string();
        let Some(ca) = &secrets.ca else {
            return attempt;
        };
        let config = match ca.server_config(&host) {
            Ok(c) => c,
            Err(e) => {
                let why = format!("{target}: {e}");
                let _ = client
                    .write_all(&http::answer(502, "Bad Gateway", &why))
                    .await;
                attempt.allowed = false;
                attempt.verdict = why;
                return attempt;
            }
        };
        if client.write_all(http::CONNECTED).await.is_err() {
            return attempt;
        }
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let mut tls = match tokio::time::timeout(self.timeouts.head, acceptor.accept(client)).await
        {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => {
                attempt.verdict = format!("allowed; the client's TLS failed: {e}");
                return attempt;
            }
            Err(_) => {
                attempt.verdict = format!(
                    "allowed; no TLS handshake from the client within {:?}",
                    self.timeouts.head
                );
                return attempt;
            }
        };
        let mut buf = Vec::with_capacity(4096);
        let authority = if req.port == 443 {
            host.clone()
        } else {
            target.to_string()
        };
        let read = tokio::time::timeout(self.timeouts.head, async {
            let mut chunk = [0u8; 4096];
            loop {
                match http::parse_origin(&buf, &authority) {
                    Ok(Some(h)) => return Ok(Some(h)),
                    Ok(None) => {}
                    Err(e) => return Err(e),
                }
                let n = tls.read(&mut chunk).await.unwrap_or(0);
                if n == 0 {
                    return Ok(None);
                }
                buf.extend_from_slice(&chunk[..n]);
            }
        })
        .await;
        let (head, used) = match read {
            Ok(Ok(Some(h))) => h,
            Ok(Ok(None)) => return attempt,
            Ok(Err(e)) => {
                let (status, reason) = e.status();
                let why = e.to_string();
                let _ = tls.write_all(&http::answer(status, reason, &why)).await;
                let _ = tls.shutdown().await;
                attempt.verdict = format!("allowed; {why}");
                return attempt;
            }
            Err(_) => {
                attempt.verdict = format!(
                    "allowed; no request inside the tunnel within {:?}",
                    self.timeouts.head
                );
                return attempt;
            }
        };
        let (head, done) = crate::secrets::inject(&head, &req.host, req.port, &secrets.list);
        attempt.secrets = done;
        let rest = &buf[used..];
        if !opened(&attempt) {
            let _ = tls
                .write_all(&http::answer(503, "Service Unavailable", UNRECORDED))
                .await;
            let _ = tls.shutdown().await;
            attempt.verdict = format!("refused: {UNRECORDED}");
            return attempt;
        }
        let first = async {
            upstream.write_all(&head).await?;
            upstream.write_all(rest).await?;
            upstream.flush().await
        };
        if first.await.is_err() {
            return attempt;
        }
        attempt.sent = (head.len() + rest.len()) as u64;
        self.tally(attempt.sent, 0);
        let tally = |sent, received| self.tally(sent, received);
        let (up, down) = copy_both(tls, upstream, self.session_ended(), &tally).await;
        attempt.sent += up;
        attempt.received = down;
        attempt
    }

    /// Judges, resolves, judges each address and connects.
    async fn open(
        &self,
        host: &Host,
        port: u16,
        policy: &Policy,
    ) -> Result<(TcpStream, SocketAddr), Refusal> {
        let target = format!("{host}:{port}");
        let v = policy.check_target(host, port);
        if !v.allowed() {
            let note = loopback_note(host, &v);
            return Err(Refusal::forbidden(format!("{target}: {v}{note}")));
        }
        let addrs = match host {
            Host::Addr(a) => vec![*a],
            Host::Name(n) => {
                match tokio::time::timeout(self.timeouts.resolve, self.resolver.resolve(n)).await {
                    Ok(Ok(a)) if !a.is_empty() => a,
                    Ok(Ok(_)) => return Err(Refusal::bad_gateway(format!("{n}: no address"))),
                    Ok(Err(e)) => {
                        return Err(Refusal::bad_gateway(format!("cannot resolve {n}: {e}")))
                    }
                    Err(_) => {
                        return Err(Refusal::bad_gateway(format!(
                            "cannot resolve {n} within {:?}",
                            self.timeouts.resolve
                        )))
                    }
                }
            }
        };
        let mut refused = None;
        let mut failed = None;
        for a in addrs {
            let v = policy.check_address_on(a, port, &self.own);
            if !v.allowed() {
                refused.get_or_insert(v);
                continue;
            }
            let sa = SocketAddr::new(a, port);
            match tokio::time::timeout(self.timeouts.connect, TcpStream::connect(sa)).await {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    return Ok((s, sa));
                }
                Ok(Err(e)) => failed = Some(format!("connect to {sa}: {e}")),
                Err(_) => {
                    failed = Some(format!(
                        "connect to {sa}: no answer within {:?}",
                        self.timeouts.connect
                    ))
                }
            }
        }
        Err(match (failed, refused) {
            (Some(f), _) => Refusal::bad_gateway(format!("{target}: {f}")),
            (None, Some(v)) => {
                let note = loopback_note(host, &v);
                Refusal::forbidden(format!("{target}: {v}{note}"))
            }
            (None, None) => Refusal::bad_gateway(format!("{target}: no address")),
        })
    }
}

/// Copies both ways between two streams until both are done; a stream
/// that ends without TLS's closing message (as many servers do) counts as
/// ended. Returns the bytes from `a` to `b`, and back.
async fn copy_both<A, B>(
    a: A,
    b: B,
    ended: impl std::future::Future,
    tally: &(dyn Fn(u64, u64) + Sync),
) -> (u64, u64)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut ar, mut aw) = tokio::io::split(a);
    let (mut br, mut bw) = tokio::io::split(b);
    let (mut up, mut down) = (0u64, 0u64);
    {
        let (to_b, to_a) = (|n| tally(n, 0), |n| tally(0, n));
        let both = async {
            tokio::join!(
                one_way(&mut ar, &mut bw, &mut up, &to_b),
                one_way(&mut br, &mut aw, &mut down, &to_a)
            )
        };
        // The session's end drops both streams (closing them) once this
        // returns.
        tokio::select! {
            _ = both => {}
            _ = ended => {}
        }
    }
    (up, down)
}

async fn one_way<R, W>(r: &mut R, w: &mut W, moved: &mut u64, tally: &(dyn Fn(u64) + Sync))
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if w.write_all(&buf[..n]).await.is_err() || w.flush().await.is_err() {
            break;
        }
        *moved += n as u64;
        tally(n as u64);
    }
    let _ = w.shutdown().await;
}

/// What a refusal of the loopback adds: which loopback the proxy reaches.
/// A session has one of its own, which its runs reach without the proxy
/// (`NO_PROXY` lists it unless an allow rule names it); through the
/// proxy, `127.0.0.1` is the loopback outside every session.
fn loopback_note(host: &Host, v: &Verdict) -> &'static str {
    let loopback = |a: &IpAddr| special(*a) == Some("loopback");
    let asked = match (host, v) {
        (_, Verdict::Special { addr, .. }) => loopback(addr),
        (Host::Addr(a), _) => loopback(a),
        (Host::Name(n), _) => n == "localhost",
    };
    if asked {
        "; through the proxy the loopback is that of the machine the supervisor runs on, \
         not the session's own (which its runs reach directly)"
    } else {
        ""
    }
}

/// A refusal, as the client is told it.
struct Refusal {
    status: u16,
    reason: &'static str,
    why: String,
}

impl Refusal {
    fn forbidden(why: String) -> Refusal {
        Refusal {
            status: 403,
            reason: "Forbidden",
            why,
        }
    }
    fn bad_gateway(why: String) -> Refusal {
        Refusal {
            status: 502,
            reason: "Bad Gateway",
            why,
        }
    }
}

/// Reads until a whole request head is in `buf`; `Ok(None)` if the client
/// closed first.
async fn read_head<S: AsyncRead + Unpin>(
    client: &mut S,
    buf: &mut Vec<u8>,
) -> Result<Option<http::Request>, Refusal> {
    let mut chunk = [0u8; 4096];
    loop {
        match http::parse(buf) {
            Ok(Some(r)) => return Ok(Some(r)),
            Ok(None) => {}
            Err(e) => {
                let (status, reason) = e.status();
                return Err(Refusal {
                    status,
                    reason,
                    why: e.to_string(),
                });
            }
        }
        let n = client.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[cfg(test)]
mod tests;
