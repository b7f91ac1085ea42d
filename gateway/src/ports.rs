//! A session's exposed port (`port.expose`), served to the host, at two
//! places:
//!
//! * **its own host**, `{port}-{id}.{ports domain}` (`PortInfo::host`;
//!   `…​.localhost` by default, which browsers and curl take for the
//!   loopback): every path there is the app's, and the host is an origin
//!   no other port shares, so one session's pages can neither read
//!   another's nor see its cookies. This is where a browser is sent.
//! * `/v1/ports/{agent}/{session}/{port}/{path}` on the gateway's own
//!   address, for a client with the gateway's token (the path below the
//!   port's goes to the app). Without it, the answer is a redirect (`307`)
//!   to the port's own host: the gateway's origin, which every port's
//!   path shares, never holds a port's credential.
//!
//! Any method, and WebSocket upgrades, go to `127.0.0.1:{port}` on the
//! session's own loopback: the gateway asks the daemon for a connection
//! there (`port.connect`, with one end of a socket pair it relays) and
//! speaks HTTP/1.1 to the app over it.
//!
//! Who may: the gateway's bearer token; or, at the port's own host, the
//! port's own token, given once as `?token=` (answered with a redirect to
//! the same path without it, and a cookie of that host alone: what a
//! browser is handed) and then as that cookie; or nobody's, for a public
//! port. An `Origin`, when sent, must be allowed (`--allow-origin`) or the
//! host's own: at a port's host, never another port's. None of the
//! gateway's credentials reach the app: its `Authorization`, the port's
//! cookie and the `token` parameter are taken out of what is forwarded.
//!
//! A connection to an app that keeps it open (HTTP/1.1 keep-alive) is
//! kept idle for the port's next request ([`Pool`](crate::port_pool::Pool): a few per port),
//! reused only for a request with the gateway's token or the same port
//! token that opened it; one the app or the daemon closed (the port
//! unexposed, the session deleted) is never reused.
//!
//! The answers: the app's; 401 without a credential that does; 404 for a
//! port not exposed (whatever the session: one session's port is never
//! reachable under another's path or host); 502 when nothing answers on
//! the port.

use crate::access::Refusal;
use crate::body::{headers_of, respond, HttpRequest, HttpResponse};
use crate::shared::Shared;
use crate::{error, Reply};
use allox_protocol::{ErrorCode, PortConnect, PortList, Request, Response};
use http_body_util::BodyExt;
use hyper::header::{HeaderName, HeaderValue};
use hyper_util::rt::TokioIo;
use std::os::fd::AsFd;
use std::sync::Arc;

/// Below it, a session's ports.
pub const PREFIX: &str = "/v1/ports/";

/// The cookie that carries a port's token.
pub const COOKIE: &str = "allox_port_token";

/// One request for a session's port.
#[derive(Debug, PartialEq, Eq)]
pub struct PortRequest {
    /// At `/v1/ports/…`: the port's agent, session and number (empty and
    /// 0 at its own host).
    pub agent: String,
    pub session: String,
    pub port: u16,
    /// At the port's own host: that host's label (`PortInfo::host`).
    pub host: Option<String>,
    /// What the app is asked for: the path below the port's (at its own
    /// host, the whole path) and the query.
    pub rest: String,
}

impl PortRequest {
    /// A request that came to the port's own host `label`, for `url`.
    pub fn at_host(label: String, url: &str) -> PortRequest {
        PortRequest {
            agent: String::new(),
            session: String::new(),
            port: 0,
            host: Some(label),
            rest: if url.starts_with('/') {
                url.to_owned()
            } else {
                format!("/{url}")
            },
        }
    }

    /// Where the gateway serves the port on its own address.
    pub fn base(&self) -> String {
        allox_protocol::port_path(&self.agent, &self.session, self.port)
    }

    /// What the port is called in a message.
    fn name(&self) -> String {
        match &self.host {
            Some(h) => format!("the port at host {h}"),
            None => format!(
                "port {} of session {}/{}",
                self.port, self.agent, self.session
            ),
        }
    }

    /// Its idle connections' key.
    fn key(&self) -> String {
        match &self.host {
            Some(h) => h.clone(),
            None => format!("{}/{}/{}", self.agent, self.session, self.port),
        }
    }
}

pub fn is_ports_path(path: &str) -> bool {
    path.starts_with(PREFIX) || path == PREFIX.trim_end_matches('/')
}

/// The request in `url` (path and query), or the answer to give at once.
pub fn parse(url: &str) -> Result<PortRequest, Reply> {
    let not_found = |why: String| Reply::json(error(404, ErrorCode::NotFound, why));
    let rest = url.strip_prefix(PREFIX).unwrap_or("");
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    let mut parts = path.splitn(4, '/');
    let (Some(agent), Some(session), Some(port)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(not_found(format!(
            "{url}: a port is served at {PREFIX}{{agent}}/{{session}}/{{port}}/"
        )));
    };
    for (kind, id) in [("agent_id", agent), ("session_id", session)] {
        allox_protocol::validate_id(kind, id).map_err(|e| not_found(format!("{url}: {e}")))?;
    }
    let port: u16 = match port.parse() {
        Ok(p) if p > 0 => p,
        _ => return Err(not_found(format!("{url}: {port:?} is not a port"))),
    };
    let req = PortRequest {
        agent: agent.into(),
        session: session.into(),
        port,
        host: None,
        rest: String::new(),
    };
    let Some(below) = parts.next() else {
        // `/v1/ports/a/s/8000`: the app's relative links need the slash.
        let mut to = req.base();
        if let Some(q) = query {
            to.push('?');
            to.push_str(q);
        }
        return Err(Reply {
            status: 308,
            body: None,
            headers: vec![("Location", to)],
        });
    };
    let mut rest = format!("/{below}");
    if let Some(q) = query {
        rest.push('?');
        rest.push_str(q);
    }
    Ok(PortRequest { rest, ..req })
}

/// `rest` without the `token` query parameter, and that parameter's value.
fn take_token(rest: &str) -> (String, Option<String>) {
    let Some((path, query)) = rest.split_once('?') else {
        return (rest.to_string(), None);
    };
    let mut token = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|kv| match kv.strip_prefix("token=") {
            Some(v) => {
                token = Some(v.to_string());
                false
            }
            None => true,
        })
        .collect();
    if kept.is_empty() {
        (path.to_string(), token)
    } else {
        (format!("{path}?{}", kept.join("&")), token)
    }
}

/// The `Cookie` header without the port's cookie, and that cookie's
/// value.
fn take_cookie(cookie: &str) -> (String, Option<String>) {
    let mut token = None;
    let kept: Vec<&str> = cookie
        .split(';')
        .map(str::trim)
        .filter(
            |c| match c.strip_prefix(COOKIE).and_then(|r| r.strip_prefix('=')) {
                Some(v) => {
                    token = Some(v.to_string());
                    false
                }
                None => !c.is_empty(),
            },
        )
        .collect();
    (kept.join("; "), token)
}

/// Hop-by-hop headers, not forwarded (but for an upgrade's own).
const HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn status_reply(status: u16, code: ErrorCode, why: String) -> HttpResponse {
    let mut r = Reply::json(error(status, code, why));
    if status == 401 {
        r.headers.push((
            "WWW-Authenticate",
            r#"Bearer realm="alloxctl gateway""#.into(),
        ));
    }
    respond(r)
}

/// The daemon's answer, or the HTTP answer its error is.
fn answered(
    answer: Result<Result<allox_client::Answer, allox_client::ClientError>, Reply>,
) -> Result<Response, Box<HttpResponse>> {
    match answer {
        Ok(Ok(Ok(r))) => Ok(r),
        Ok(Ok(Err(e))) => {
            let status = match e.code {
                ErrorCode::Unauthorized => 401,
                ErrorCode::NotFound => 404,
                ErrorCode::Unavailable => 502,
                c => c.http_status(),
            };
            Err(Box::new(status_reply(status, e.code, e.message)))
        }
        Ok(Err(e)) => Err(Box::new(status_reply(
            503,
            ErrorCode::Unavailable,
            format!("the daemon cannot be reached: {e}"),
        ))),
        Err(reply) => Err(Box::new(respond(reply))),
    }
}

/// A request at `/v1/ports/…` without the gateway's token: sent to the
/// port's own host (`307`, method and body kept; the query too, so a
/// `?token=` is traded for a cookie there), or told the port is not
/// exposed.
async fn to_own_host(
    p: &PortRequest,
    host: Option<String>,
    https: bool,
    shared: &Arc<Shared>,
) -> HttpResponse {
    let ask = Request::PortList(PortList {
        agent_id: p.agent.clone(),
        session_id: Some(p.session.clone()),
    });
    let listed = match answered(
        shared
            .with_daemon(move |d| allox_client::Caller::call(d, ask))
            .await,
    ) {
        Ok(Response::Ports(l)) => l,
        Ok(other) => {
            return status_reply(
                500,
                ErrorCode::Internal,
                format!("port.list answered {}", other.kind()),
            )
        }
        Err(r) => return *r,
    };
    let Some(info) = listed.ports.iter().find(|i| i.port == p.port) else {
        return status_reply(
            404,
            ErrorCode::NotFound,
            format!("{} is not exposed", p.name()),
        );
    };
    let to = format!(
        "{}://{}{}",
        if https { "https" } else { "http" },
        shared.access.port_host_name(&info.host, host.as_deref()),
        p.rest
    );
    respond(Reply {
        status: 307,
        body: Some(serde_json::json!({
            "error": {
                "code": "unauthorized",
                "message": format!("{} is served to a browser at its own host, {to} (or here with the gateway's token)", p.name()),
            }
        })),
        headers: vec![("Location", to)],
    })
}

/// A new connection to the port through the daemon (`port.connect`),
/// or the answer saying why not.
async fn connect(
    p: &PortRequest,
    shared: &Arc<Shared>,
    token: Option<String>,
    authorized: bool,
) -> Result<tokio::net::UnixStream, HttpResponse> {
    // One end for the daemon to relay to, one for here.
    let (mine, theirs) = std::os::unix::net::UnixStream::pair()
        .map_err(|e| status_reply(502, ErrorCode::Unavailable, format!("socket pair: {e}")))?;
    let ask = Request::PortConnect(PortConnect {
        agent_id: p.agent.clone(),
        session_id: p.session.clone(),
        port: p.port,
        token,
        authorized,
        host: p.host.clone(),
    });
    let answer = shared
        .with_daemon(move |d| d.call_with_fd(ask, theirs.as_fd()))
        .await;
    match answered(answer).map_err(|r| *r)? {
        Response::PortConnected(_) => {}
        other => {
            return Err(status_reply(
                500,
                ErrorCode::Internal,
                format!("port.connect answered {}", other.kind()),
            ))
        }
    }
    mine.set_nonblocking(true)
        .and_then(|()| tokio::net::UnixStream::from_std(mine))
        .map_err(|e| status_reply(502, ErrorCode::Unavailable, format!("relay socket: {e}")))
}

/// What a browser says of where a request comes from and what it is
/// for (`Sec-Fetch-Site`, `-Mode`, `-Dest`; none from other clients).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FetchMetadata {
    pub site: Option<String>,
    pub mode: Option<String>,
    pub dest: Option<String>,
}

impl FetchMetadata {
    fn of(req: &HttpRequest) -> FetchMetadata {
        let h = |n: &str| {
            req.headers()
                .get(n)
                .and_then(|v| v.to_str().ok())
                .map(|v| v.trim().to_ascii_lowercase())
        };
        FetchMetadata {
            site: h("sec-fetch-site"),
            mode: h("sec-fetch-mode"),
            dest: h("sec-fetch-dest"),
        }
    }

    /// Whether the request may be credited with the port's cookie: not a
    /// browser's (no `Sec-Fetch-Site`), the port's own pages', the user's
    /// (typed, a bookmark), or a top-level navigation — never an image,
    /// script, frame or fetch another site's page makes.
    pub fn may_use_cookie(&self) -> bool {
        match self.site.as_deref() {
            None | Some("same-origin") | Some("none") => true,
            Some(_) => {
                self.mode.as_deref() == Some("navigate") && self.dest.as_deref() == Some("document")
            }
        }
    }

    /// A request another site (another port's host included) started.
    pub fn from_another_site(&self) -> bool {
        matches!(self.site.as_deref(), Some("same-site") | Some("cross-site"))
    }
}

/// The token traded for its cookie by a page of the port's host that goes
/// on to `to` at once: the browser's next request is then this host's
/// own, and carries the cookie.
fn bounce(to: &str, cookie: String) -> HttpResponse {
    let esc: String = to
        .chars()
        .map(|c| match c {
            '&' => "&amp;".to_string(),
            '<' => "&lt;".to_string(),
            '>' => "&gt;".to_string(),
            '"' => "&quot;".to_string(),
            '\'' => "&#39;".to_string(),
            c => c.to_string(),
        })
        .collect();
    let page = format!(
        "<!doctype html><meta charset=utf-8><meta http-equiv=refresh content=\"0;url={esc}\"><title>Opening</title><a href=\"{esc}\">Open</a>\n"
    );
    hyper::Response::builder()
        .status(200)
        .header("Content-Type", "text/html; charset=utf-8")
        .header("Cache-Control", "no-store")
        .header("Referrer-Policy", "no-referrer")
        .header("Set-Cookie", cookie)
        .body(crate::body::full(bytes::Bytes::from(page)))
        .unwrap_or_else(|e| status_reply(500, ErrorCode::Internal, e.to_string()))
}

/// Serves one request for a port.
pub async fn serve(mut req: HttpRequest, p: PortRequest, shared: &Arc<Shared>) -> HttpResponse {
    let h = headers_of(&req);
    let checked = match p.host {
        Some(_) => shared.access.check_port_host(&h),
        None => shared.access.check_port(&h),
    };
    let authorized = match checked {
        Ok(a) => a,
        Err(r @ (Refusal::NoHost | Refusal::Host(_) | Refusal::Origin(_))) => {
            return respond(Reply::refused(&r))
        }
        Err(_) => false,
    };
    let host = h.host.map(str::to_owned);
    let https = req
        .headers()
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"));
    if p.host.is_none() && !authorized {
        return to_own_host(&p, host, https, shared).await;
    }
    let (rest, query_token) = take_token(&p.rest);
    let cookie = req
        .headers()
        .get_all(hyper::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join("; ");
    let (other_cookies, cookie_token) = take_cookie(&cookie);
    let fetch = FetchMetadata::of(&req);
    // The port's own token counts only at its own host: the gateway's
    // address is an origin every port's path shares. Its cookie counts
    // only for what the port's own pages, the user or a top-level
    // navigation ask, never for what another site's page loads or frames
    // (below one real domain, the ports' hosts are one site, and the
    // browser sends the cookie with another port's image or frame).
    let token = match p.host {
        Some(_) => query_token
            .clone()
            .or(cookie_token.filter(|_| fetch.may_use_cookie())),
        None => None,
    };
    // A token in the URL is traded for a cookie of the port's host at
    // once, so it does not stay in the browser's address bar, history or
    // the app's logs (the daemon checks it by connecting).
    if let (Some(t), false, Some(_)) = (&query_token, authorized, &p.host) {
        if let Err(r) = connect(&p, shared, token.clone(), false).await {
            return r;
        }
        // Absolute, at this very host: a path that begins `//` or `/\`
        // would be another site's address to a browser.
        let to = format!(
            "{}://{}{rest}",
            if https { "https" } else { "http" },
            host.as_deref().unwrap_or_default().trim()
        );
        let cookie = format!("{COOKIE}={t}; Path=/; HttpOnly; SameSite=Strict");
        if fetch.from_another_site() {
            // A link followed from another site: a redirect would be part
            // of that site's navigation, which carries no strict cookie.
            // A page of this host that goes on makes the next request
            // this host's own.
            return bounce(&to, cookie);
        }
        return respond(Reply {
            status: 303,
            body: None,
            headers: vec![("Location", to), ("Set-Cookie", cookie)],
        });
    }
    let key = p.key();
    let opened_with = if authorized { None } else { token.clone() };
    let upgrade = req
        .headers()
        .get(hyper::header::UPGRADE)
        .map(|v| v.to_owned());
    let client_upgrade = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut req));
    let (parts, body) = req.into_parts();
    let mut b = hyper::Request::builder()
        .method(parts.method.clone())
        .uri(rest.as_str())
        .version(hyper::Version::HTTP_11);
    let Some(h) = b.headers_mut() else {
        return status_reply(400, ErrorCode::InvalidRequest, "bad request".into());
    };
    for (name, value) in parts.headers.iter() {
        let n = name.as_str();
        if HOP.contains(&n) || n == "cookie" || (authorized && n == "authorization") {
            continue;
        }
        h.append(name.clone(), value.clone());
    }
    if !other_cookies.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&other_cookies) {
            h.insert(hyper::header::COOKIE, v);
        }
    }
    if !h.contains_key(hyper::header::HOST) {
        if let Some(a) = parts.uri.authority() {
            if let Ok(v) = HeaderValue::from_str(a.as_str()) {
                h.insert(hyper::header::HOST, v);
            }
        }
    }
    if let Some(u) = &upgrade {
        h.insert(hyper::header::UPGRADE, u.clone());
        h.insert(
            hyper::header::CONNECTION,
            HeaderValue::from_static("upgrade"),
        );
    }
    if p.host.is_none() {
        if let Ok(v) = HeaderValue::from_str(p.base().trim_end_matches('/')) {
            h.insert(HeaderName::from_static("x-forwarded-prefix"), v);
        }
    }
    let upstream = match b.body(body) {
        Ok(r) => r,
        Err(e) => return status_reply(400, ErrorCode::InvalidRequest, e.to_string()),
    };
    let wants_upgrade = upgrade.is_some();
    // An idle connection first; a request it could not send (the app or
    // the daemon closed it meanwhile) goes on a new one.
    let mut upstream = Some(upstream);
    let mut got = None;
    if !wants_upgrade {
        if let Some(mut sender) = shared.ports.take(&key, authorized, token.as_deref()) {
            let req = upstream.take().expect("not sent yet");
            match sender.try_send_request(req).await {
                Ok(r) => got = Some((r, sender)),
                Err(mut e) => match e.take_message() {
                    Some(back) => upstream = Some(back),
                    None => {
                        return status_reply(502, ErrorCode::Unavailable, e.error().to_string())
                    }
                },
            }
        }
    }
    let (mut resp, sender) = match (got, upstream) {
        (Some(x), _) => x,
        (None, Some(req)) => {
            let stream = match connect(&p, shared, token.clone(), authorized).await {
                Ok(s) => s,
                Err(r) => return r,
            };
            let (mut sender, conn) =
                match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
                    Ok(x) => x,
                    Err(e) => return status_reply(502, ErrorCode::Unavailable, e.to_string()),
                };
            tokio::spawn(async move {
                let _ = conn.with_upgrades().await;
            });
            match sender.send_request(req).await {
                Ok(r) => (r, sender),
                Err(e) => {
                    return status_reply(502, ErrorCode::Unavailable, format!("{}: {e}", p.name()))
                }
            }
        }
        (None, None) => return status_reply(500, ErrorCode::Internal, "no request".into()),
    };
    if resp.status() != hyper::StatusCode::SWITCHING_PROTOCOLS && !wants_upgrade {
        // Ready again once this answer has been read, if the app keeps
        // the connection.
        shared.ports.keep(key, opened_with, sender);
    }
    if resp.status() == hyper::StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_upgrade) = client_upgrade {
            let app_upgrade = hyper::upgrade::on(&mut resp);
            tokio::spawn(async move {
                if let (Ok(c), Ok(a)) = (client_upgrade.await, app_upgrade.await) {
                    let (mut c, mut a) = (TokioIo::new(c), TokioIo::new(a));
                    let _ = tokio::io::copy_bidirectional(&mut c, &mut a).await;
                }
            });
        }
        let (parts, _) = resp.into_parts();
        return hyper::Response::from_parts(parts, crate::body::full(bytes::Bytes::new()));
    }
    let (mut parts, body) = resp.into_parts();
    for n in HOP {
        parts.headers.remove(*n);
    }
    hyper::Response::from_parts(parts, body.map_err(std::io::Error::other).boxed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_path_names_agent_session_port_and_what_the_app_is_asked() {
        let r = parse("/v1/ports/a/s1/8000/static/app.js?v=2").unwrap();
        assert_eq!(
            r,
            PortRequest {
                agent: "a".into(),
                session: "s1".into(),
                port: 8000,
                host: None,
                rest: "/static/app.js?v=2".into()
            }
        );
        let own = PortRequest::at_host("8000-0123456789abcdef".into(), "/v1/ports/x?y=1");
        assert_eq!(
            (own.rest.as_str(), own.key()),
            ("/v1/ports/x?y=1", "8000-0123456789abcdef".into())
        );
        assert_eq!(parse("/v1/ports/a/s1/8000/").unwrap().rest, "/");
        let slash = parse("/v1/ports/a/s1/8000?token=x").unwrap_err();
        assert_eq!(slash.status, 308);
        assert_eq!(slash.headers[0].1, "/v1/ports/a/s1/8000/?token=x");
        for bad in [
            "/v1/ports/a/s1/0/",
            "/v1/ports/a/s1/http/",
            "/v1/ports/a/",
            "/v1/ports/../s/1/",
        ] {
            assert_eq!(parse(bad).unwrap_err().status, 404, "{bad}");
        }
    }

    #[test]
    fn the_port_s_cookie_counts_for_its_own_pages_the_user_and_navigations_only() {
        let f = |site: Option<&str>, mode: &str, dest: &str| FetchMetadata {
            site: site.map(str::to_owned),
            mode: Some(mode.into()),
            dest: Some(dest.into()),
        };
        for ok in [
            FetchMetadata::default(),
            f(Some("same-origin"), "cors", "empty"),
            f(Some("same-origin"), "no-cors", "image"),
            f(Some("none"), "navigate", "document"),
            f(Some("cross-site"), "navigate", "document"),
            f(Some("same-site"), "navigate", "document"),
        ] {
            assert!(ok.may_use_cookie(), "{ok:?}");
        }
        for refused in [
            f(Some("same-site"), "no-cors", "image"),
            f(Some("same-site"), "no-cors", "script"),
            f(Some("same-site"), "navigate", "iframe"),
            f(Some("same-site"), "cors", "empty"),
            f(Some("cross-site"), "no-cors", "style"),
            f(Some("cross-site"), "navigate", "frame"),
        ] {
            assert!(!refused.may_use_cookie(), "{refused:?}");
        }
        assert!(f(Some("cross-site"), "navigate", "document").from_another_site());
        assert!(!f(Some("none"), "navigate", "document").from_another_site());
        assert!(!FetchMetadata::default().from_another_site());
    }

    #[test]
    fn the_gateway_s_credentials_are_taken_out() {
        assert_eq!(
            take_token("/x?a=1&token=abc&b=2"),
            ("/x?a=1&b=2".to_string(), Some("abc".to_string()))
        );
        assert_eq!(
            take_token("/x?token=abc"),
            ("/x".to_string(), Some("abc".to_string()))
        );
        assert_eq!(take_token("/x?tokens=1"), ("/x?tokens=1".to_string(), None));
        assert_eq!(
            take_cookie("a=1; allox_port_token=t0k; b=2"),
            ("a=1; b=2".to_string(), Some("t0k".to_string()))
        );
        assert_eq!(take_cookie("a=1"), ("a=1".to_string(), None));
    }
}
