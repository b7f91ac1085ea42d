//! Who the gateway serves: the checks every request passes before the
//! daemon hears of it, on the request's headers only.
//!
//! * `Host` must name the gateway itself: the address it is bound to
//!   (`ip:port`), `localhost:port`, or a name given with `--allow-host`;
//!   or an exposed port's own host, `{port}-{id}.{ports domain}`
//!   ([`Access::port_host`]), where everything is the app's. A page that
//!   rebinds its own DNS name to 127.0.0.1 sends its own name and is
//!   refused.
//! * An `Origin` header (every browser sends one on a cross-origin POST)
//!   must be one given with `--allow-origin`; none is by default.
//! * `Authorization: Bearer <token>` must carry the token, compared in
//!   constant time.
//! * A `POST` body must be declared `Content-Type: application/json`,
//!   which a browser cannot send cross-origin without a preflight.
//!
//! The files (`GET` and `PUT /v1/files/...`) pass the same checks but the
//! last ([`Access::check_files`]): a file's body is raw bytes of any type.
//! That opens no door the JSON check closes: a browser preflights every
//! cross-origin `PUT`, and neither method is served without the token,
//! which a page cannot send without a preflight either.

use crate::token::Token;
use allox_protocol::ErrorCode;
use std::net::SocketAddr;

/// Why a request is not served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No `Host` header.
    NoHost,
    /// A `Host` that is not this gateway.
    Host(String),
    /// An `Origin` that is not allowed.
    Origin(String),
    /// A preflight (`OPTIONS`) without an `Origin`.
    NotPreflight,
    /// No token, or not the right one.
    Token,
    /// A body that is not declared JSON.
    ContentType(Option<String>),
    /// `/metrics` on a gateway given no metrics token.
    MetricsOff,
    /// Not the metrics token.
    MetricsToken,
}

impl Refusal {
    /// The HTTP status answered.
    pub fn status(&self) -> u16 {
        match self {
            Refusal::NoHost | Refusal::Host(_) | Refusal::Origin(_) => 403,
            Refusal::NotPreflight => 405,
            Refusal::Token | Refusal::MetricsToken => 401,
            Refusal::ContentType(_) => 415,
            Refusal::MetricsOff => 404,
        }
    }

    /// The error code of the JSON answer.
    pub fn code(&self) -> ErrorCode {
        match self {
            Refusal::ContentType(_) | Refusal::NotPreflight => ErrorCode::InvalidRequest,
            Refusal::MetricsOff => ErrorCode::NotFound,
            _ => ErrorCode::Unauthorized,
        }
    }

    /// What the client is told.
    pub fn message(&self) -> String {
        match self {
            Refusal::NoHost => "the request has no Host header".into(),
            Refusal::Host(h) => format!(
                "Host {h:?} is not this gateway; call it by the address it listens on or localhost (or start it with --allow-host)"
            ),
            Refusal::Origin(o) => format!(
                "requests from origin {o:?} are not allowed; start the gateway with --allow-origin {o} to allow them"
            ),
            Refusal::NotPreflight => "OPTIONS is answered only to a browser's preflight (with an Origin header)".into(),
            Refusal::Token => "missing or wrong bearer token: send `Authorization: Bearer $(alloxctl token)`".into(),
            Refusal::ContentType(None) => "the body must be sent with Content-Type: application/json".into(),
            Refusal::ContentType(Some(t)) => {
                format!("Content-Type {t:?} is not accepted: send application/json")
            }
            Refusal::MetricsOff => "metrics are not served on this address: start the gateway with --metrics-token-file FILE (or --metrics-token-env NAME) and scrape with that token, or serve them on an address of their own with --metrics-listen ADDR".into(),
            Refusal::MetricsToken => "missing or wrong metrics token: send `Authorization: Bearer` with the token of --metrics-token-file (the gateway's own token is not it)".into(),
        }
    }
}

/// The headers a check looks at; the first of each name.
#[derive(Debug, Default, Clone, Copy)]
pub struct Headers<'a> {
    pub host: Option<&'a str>,
    pub origin: Option<&'a str>,
    pub authorization: Option<&'a str>,
    pub content_type: Option<&'a str>,
}

/// What a request must show to be served.
#[derive(Debug)]
pub struct Access {
    token: Token,
    /// `--metrics-token-file`'s: the only token `/metrics` takes.
    metrics_token: Option<Token>,
    /// Accepted `Host` values, lowercase.
    hosts: Vec<String>,
    /// Accepted `Origin` values, lowercase, without a trailing `/`.
    origins: Vec<String>,
    /// Below it, each exposed port's own host; lowercase.
    ports_domain: String,
}

impl Access {
    /// `bound` is the address listened on; `hosts` and `origins` are the
    /// `--allow-host` and `--allow-origin` values.
    pub fn new(token: Token, bound: SocketAddr, hosts: &[String], origins: &[String]) -> Access {
        let port = bound.port();
        let mut accepted = vec![bound.to_string(), format!("localhost:{port}")];
        if port == 80 {
            // A client leaves the default port out.
            accepted.push(match bound {
                SocketAddr::V4(a) => a.ip().to_string(),
                SocketAddr::V6(a) => format!("[{}]", a.ip()),
            });
            accepted.push("localhost".into());
        }
        accepted.extend(hosts.iter().cloned());
        Access {
            token,
            metrics_token: None,
            hosts: accepted.iter().map(|h| h.to_ascii_lowercase()).collect(),
            origins: origins.iter().map(|o| normalize_origin(o)).collect(),
            ports_domain: "localhost".into(),
        }
    }

    /// Each exposed port has a host of its own below `domain`.
    pub fn with_ports_domain(mut self, domain: &str) -> Result<Access, &'static str> {
        let bad = Err;
        let d = domain.trim_end_matches('.').to_ascii_lowercase();
        if d.is_empty() {
            return bad("a domain is needed");
        }
        if d.parse::<std::net::IpAddr>().is_ok() {
            return bad("an address has no names below it: give a domain (localhost, or one whose names all reach the gateway)");
        }
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        };
        if d.len() > 200 || !d.split('.').all(label_ok) {
            return bad("not a domain name (labels of at most 63 letters, digits and inner hyphens, separated by dots)");
        }
        self.ports_domain = d;
        Ok(self)
    }

    /// The port host `Host` names (`{port}-{id}.{ports domain}`, any
    /// port after it), if it names one.
    pub fn port_host(&self, host: Option<&str>) -> Option<String> {
        let host = host?.trim().to_ascii_lowercase();
        let name = match host.rsplit_once(':') {
            Some((n, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => n,
            Some(_) => return None,
            None => host.as_str(),
        };
        let label = name
            .trim_end_matches('.')
            .strip_suffix(self.ports_domain.as_str())?
            .strip_suffix('.')?;
        allox_protocol::is_port_host(label).then(|| label.to_owned())
    }

    /// Where a port's own host is: `{label}.{ports domain}`, with the
    /// port of `host` (the `Host` the client called the gateway by).
    pub fn port_host_name(&self, label: &str, host: Option<&str>) -> String {
        let port = host
            .and_then(|h| h.trim().rsplit_once(':'))
            .map(|(_, p)| p)
            .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        match port {
            Some(p) => format!("{label}.{}:{p}", self.ports_domain),
            None => format!("{label}.{}", self.ports_domain),
        }
    }

    /// Checks a request that came to a port's own host: an `Origin`,
    /// when sent, must be that host's own (the app's pages) or allowed
    /// (`--allow-origin`): never another port's. Whether the gateway's
    /// token came with it (the port's own is checked by the daemon).
    pub fn check_port_host(&self, h: &Headers<'_>) -> Result<bool, Refusal> {
        self.check_own_origin(h)?;
        Ok(self.token_given(h))
    }

    fn check_own_origin(&self, h: &Headers<'_>) -> Result<(), Refusal> {
        if let (Some(o), Some(host)) = (h.origin, h.host) {
            let own = ["http://", "https://"]
                .iter()
                .any(|s| normalize_origin(o) == format!("{s}{}", host.trim().to_ascii_lowercase()));
            if !own && !self.allows_origin(o) {
                return Err(Refusal::Origin(o.to_owned()));
            }
        }
        Ok(())
    }

    fn token_given(&self, h: &Headers<'_>) -> bool {
        let given = h
            .authorization
            .and_then(bearer)
            .map(str::as_bytes)
            .unwrap_or_default();
        self.token.matches(given)
    }

    /// `/metrics` takes `token`, not the gateway's.
    pub fn with_metrics_token(mut self, token: Option<Token>) -> Access {
        self.metrics_token = token;
        self
    }

    /// Checks a scrape of `/metrics` on the gateway's address: the
    /// metrics token, whatever the Host (Prometheus names the target as it
    /// reaches it); the gateway's own token does not do.
    pub fn check_metrics(&self, h: &Headers<'_>) -> Result<(), Refusal> {
        let want = self.metrics_token.as_ref().ok_or(Refusal::MetricsOff)?;
        let given = h
            .authorization
            .and_then(bearer)
            .map(str::as_bytes)
            .unwrap_or_default();
        if want.matches(given) {
            Ok(())
        } else {
            Err(Refusal::MetricsToken)
        }
    }

    /// Checks a `POST`: Host, Origin, token, then Content-Type.
    pub fn check_post(&self, h: &Headers<'_>) -> Result<(), Refusal> {
        self.check_files(h)?;
        let media = h
            .content_type
            .map(|t| t.split(';').next().unwrap_or_default().trim());
        match media {
            Some(m) if m.eq_ignore_ascii_case("application/json") => Ok(()),
            _ => Err(Refusal::ContentType(h.content_type.map(str::to_owned))),
        }
    }

    /// Checks a `GET` or `PUT` of a file: Host, Origin, then the token;
    /// any Content-Type (a file's bytes are what they are).
    pub fn check_files(&self, h: &Headers<'_>) -> Result<(), Refusal> {
        self.check_host(h)?;
        self.check_origin(h)?;
        let given = h
            .authorization
            .and_then(bearer)
            .map(str::as_bytes)
            .unwrap_or_default();
        if self.token.matches(given) {
            Ok(())
        } else {
            Err(Refusal::Token)
        }
    }

    /// Checks a browser's preflight (`OPTIONS`): Host, and an allowed
    /// Origin, which it must have. Browsers send no credentials with it.
    pub fn check_preflight(&self, h: &Headers<'_>) -> Result<(), Refusal> {
        self.check_host(h)?;
        if h.origin.is_none() {
            return Err(Refusal::NotPreflight);
        }
        self.check_origin(h)
    }

    /// Checks a `GET` of the API's description: Host and Origin; no
    /// token (the document says nothing of the daemon's state).
    pub fn check_document(&self, h: &Headers<'_>) -> Result<(), Refusal> {
        self.check_host(h)?;
        self.check_origin(h)
    }

    /// Checks a request for a session's port: Host, and an Origin that is
    /// allowed or the gateway's own (the app's pages, served from here,
    /// call it); whether the gateway's token came with it (other
    /// credentials are the port's, checked by the daemon).
    pub fn check_port(&self, h: &Headers<'_>) -> Result<bool, Refusal> {
        self.check_host(h)?;
        self.check_own_origin(h)?;
        Ok(self.token_given(h))
    }

    fn check_host(&self, h: &Headers<'_>) -> Result<(), Refusal> {
        let host = h.host.ok_or(Refusal::NoHost)?;
        let want = host.trim().to_ascii_lowercase();
        if self.hosts.contains(&want) {
            Ok(())
        } else {
            Err(Refusal::Host(host.to_owned()))
        }
    }

    /// Whether `origin` was allowed with `--allow-origin`.
    pub fn allows_origin(&self, origin: &str) -> bool {
        self.origins.contains(&normalize_origin(origin))
    }

    fn check_origin(&self, h: &Headers<'_>) -> Result<(), Refusal> {
        match h.origin {
            Some(o) if !self.allows_origin(o) => Err(Refusal::Origin(o.to_owned())),
            _ => Ok(()),
        }
    }
}

fn normalize_origin(o: &str) -> String {
    o.trim().trim_end_matches('/').to_ascii_lowercase()
}

/// The token of `Bearer <token>` (the scheme in any case).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";

    fn access(origins: &[&str]) -> Access {
        let origins: Vec<String> = origins.iter().map(|s| s.to_string()).collect();
        Access::new(
            crate::token::tests_token(TOKEN),
            "127.0.0.1:8092".parse().unwrap(),
            &["gw.internal:8092".to_string()],
            &origins,
        )
    }

    #[test]
    fn metrics_take_the_metrics_token_only_and_only_when_given_one() {
        let h = |auth: Option<&'static str>| Headers {
            host: Some("10.0.0.9:8092"),
            authorization: auth,
            ..Headers::default()
        };
        let off = access(&[]);
        assert_eq!(off.check_metrics(&h(None)), Err(Refusal::MetricsOff));
        assert_eq!(off.check_metrics(&good()), Err(Refusal::MetricsOff));
        let on = access(&[]).with_metrics_token(Some(crate::token::tests_token(
            "metrics-metrics-metrics-metrics-1",
        )));
        assert_eq!(on.check_metrics(&h(None)), Err(Refusal::MetricsToken));
        // The gateway's own token is not the metrics token.
        assert_eq!(on.check_metrics(&good()), Err(Refusal::MetricsToken));
        // Any Host: Prometheus names the target as it reaches it.
        assert_eq!(
            on.check_metrics(&h(Some("Bearer metrics-metrics-metrics-metrics-1"))),
            Ok(())
        );
        assert_eq!(Refusal::MetricsOff.status(), 404);
        assert_eq!(Refusal::MetricsToken.status(), 401);
    }

    fn good() -> Headers<'static> {
        Headers {
            host: Some("127.0.0.1:8092"),
            origin: None,
            authorization: Some("Bearer 0123456789abcdef0123456789abcdef"),
            content_type: Some("application/json"),
        }
    }

    #[test]
    fn a_request_with_the_token_from_here_is_served() {
        let a = access(&[]);
        assert_eq!(a.check_post(&good()), Ok(()));
        for host in ["localhost:8092", "LOCALHOST:8092", "gw.internal:8092"] {
            let h = Headers {
                host: Some(host),
                ..good()
            };
            assert_eq!(a.check_post(&h), Ok(()), "{host}");
        }
        let h = Headers {
            authorization: Some("bearer   0123456789abcdef0123456789abcdef"),
            content_type: Some("Application/JSON; charset=utf-8"),
            ..good()
        };
        assert_eq!(a.check_post(&h), Ok(()));
    }

    #[test]
    fn a_port_s_own_host_is_known_and_takes_only_its_own_origin() {
        let a = access(&["https://app.example"]);
        let label = "8000-0123456789abcdef";
        for host in [
            "8000-0123456789abcdef.localhost:8092",
            "8000-0123456789ABCDEF.LOCALHOST",
            "8000-0123456789abcdef.localhost.:80",
        ] {
            assert_eq!(a.port_host(Some(host)).as_deref(), Some(label), "{host}");
        }
        for host in [
            "localhost:8092",
            "127.0.0.1:8092",
            "8000-0123456789abcdef.evil.example",
            "8000-0123456789abcdef.localhost:x",
            "x.8000-0123456789abcdef.localhost",
            "8000-0123456789abcdefx.localhost",
            "0-0123456789abcdef.localhost",
            "8000-0123456789abcdeg.localhost",
            "8000-0123456789abcdeflocalhost",
        ] {
            assert_eq!(a.port_host(Some(host)), None, "{host}");
        }
        assert_eq!(
            a.port_host_name(label, Some("127.0.0.1:8092")),
            "8000-0123456789abcdef.localhost:8092"
        );
        let mine = "8000-0123456789abcdef.localhost:8092";
        let h = |origin| Headers {
            host: Some(mine),
            origin,
            authorization: None,
            content_type: None,
        };
        assert_eq!(a.check_port_host(&h(None)), Ok(false));
        assert_eq!(
            a.check_port_host(&h(Some("http://8000-0123456789abcdef.localhost:8092"))),
            Ok(false)
        );
        assert_eq!(
            a.check_port_host(&h(Some("https://app.example"))),
            Ok(false)
        );
        // Another port's pages, and the gateway's own origin, are not its.
        for other in [
            "http://8001-0123456789abcdef.localhost:8092",
            "http://127.0.0.1:8092",
            "null",
        ] {
            assert_eq!(
                a.check_port_host(&h(Some(other))),
                Err(Refusal::Origin(other.into())),
                "{other}"
            );
        }
        assert_eq!(
            a.check_port_host(&Headers {
                authorization: Some("Bearer 0123456789abcdef0123456789abcdef"),
                ..h(None)
            }),
            Ok(true)
        );
        let other = access(&[]).with_ports_domain("Ports.Example.").unwrap();
        assert_eq!(
            other
                .port_host(Some("8000-0123456789abcdef.ports.example"))
                .as_deref(),
            Some(label)
        );
        assert_eq!(
            other.port_host(Some("8000-0123456789abcdef.localhost:8092")),
            None
        );
        for bad in ["", "127.0.0.1", "::1", "a..b", "-a.b", "a_b.example", "a b"] {
            assert!(access(&[]).with_ports_domain(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn token_missing_or_wrong_is_401() {
        let a = access(&[]);
        for auth in [
            None,
            Some(""),
            Some("Bearer"),
            Some("Bearer "),
            Some("Basic 0123456789abcdef0123456789abcdef"),
            Some("Bearer 0123456789abcdef0123456789abcdeF"),
            Some("Bearer 0123456789abcdef0123456789abcdef0"),
            Some("0123456789abcdef0123456789abcdef"),
        ] {
            let h = Headers {
                authorization: auth,
                ..good()
            };
            let r = a.check_post(&h).unwrap_err();
            assert_eq!(
                (r.status(), r.code()),
                (401, ErrorCode::Unauthorized),
                "{auth:?}"
            );
        }
    }

    #[test]
    fn foreign_hosts_are_refused() {
        let a = access(&[]);
        for host in [
            None,
            Some("evil.example"),
            Some("evil.example:8092"),
            Some("127.0.0.1"),
            Some("127.0.0.1:8093"),
            Some("localhost"),
            Some("localhost.evil.example:8092"),
        ] {
            let h = Headers { host, ..good() };
            let r = a.check_post(&h).unwrap_err();
            assert_eq!(
                (r.status(), r.code()),
                (403, ErrorCode::Unauthorized),
                "{host:?}"
            );
        }
    }

    #[test]
    fn origins_must_be_allowed() {
        let a = access(&[]);
        let h = Headers {
            origin: Some("http://127.0.0.1:8092"),
            ..good()
        };
        assert_eq!(a.check_post(&h).unwrap_err().status(), 403);
        let a = access(&["https://App.example/"]);
        let h = Headers {
            origin: Some("https://app.example"),
            ..good()
        };
        assert_eq!(a.check_post(&h), Ok(()));
        let h = Headers {
            origin: Some("https://app.example.evil"),
            ..good()
        };
        assert_eq!(
            a.check_post(&h),
            Err(Refusal::Origin("https://app.example.evil".into()))
        );
        // A preflight needs the Origin, not the token.
        let pre = Headers {
            origin: Some("https://app.example"),
            authorization: None,
            content_type: None,
            ..good()
        };
        assert_eq!(a.check_preflight(&pre), Ok(()));
        let pre = Headers {
            origin: None,
            ..pre
        };
        assert_eq!(a.check_preflight(&pre), Err(Refusal::NotPreflight));
    }

    #[test]
    fn only_json_bodies_are_accepted() {
        let a = access(&[]);
        for t in [
            None,
            Some("text/plain"),
            Some("application/x-www-form-urlencoded"),
            Some("application/jsonx"),
        ] {
            let h = Headers {
                content_type: t,
                ..good()
            };
            let r = a.check_post(&h).unwrap_err();
            assert_eq!(r.status(), 415, "{t:?}");
        }
    }

    #[test]
    fn files_need_the_token_but_take_any_content_type() {
        let a = access(&[]);
        // A PUT of raw bytes, or with no type at all; a GET (no body).
        for t in [
            Some("application/octet-stream"),
            Some("text/plain"),
            Some("application/json"),
            None,
        ] {
            let h = Headers {
                content_type: t,
                ..good()
            };
            assert_eq!(a.check_files(&h), Ok(()), "{t:?}");
        }
        // Without the token (PUT or GET alike), refused as a POST is.
        for t in [Some("application/octet-stream"), None] {
            let h = Headers {
                authorization: None,
                content_type: t,
                ..good()
            };
            assert_eq!(a.check_files(&h), Err(Refusal::Token), "{t:?}");
            let h = Headers {
                authorization: Some("Bearer 0123456789abcdef0123456789abcdeF"),
                ..h
            };
            assert_eq!(a.check_files(&h), Err(Refusal::Token), "{t:?}");
        }
        // Host and Origin as for a POST.
        let h = Headers {
            host: Some("evil.example:8092"),
            ..good()
        };
        assert_eq!(a.check_files(&h).unwrap_err().status(), 403);
        let h = Headers {
            origin: Some("http://evil.example"),
            content_type: Some("application/octet-stream"),
            ..good()
        };
        assert_eq!(
            a.check_files(&h),
            Err(Refusal::Origin("http://evil.example".into()))
        );
        // And a POST still wants JSON.
        let h = Headers {
            content_type: Some("application/octet-stream"),
            ..good()
        };
        assert_eq!(a.check_post(&h).unwrap_err().status(), 415);
    }

    #[test]
    fn port_80_may_be_left_out() {
        let a = Access::new(
            crate::token::tests_token(TOKEN),
            "[::1]:80".parse().unwrap(),
            &[],
            &[],
        );
        for host in ["[::1]", "[::1]:80", "localhost", "localhost:80"] {
            let h = Headers {
                host: Some(host),
                ..good()
            };
            assert_eq!(a.check_post(&h), Ok(()), "{host}");
        }
    }
}
