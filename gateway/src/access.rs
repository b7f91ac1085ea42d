//! Who the gateway serves: the checks every request passes before the
//! daemon hears of it, on the request's headers only.
//!
//! * `Host` must name the gateway itself: the address it is bound to
//!   (`ip:port`), `localhost:port`, or a name given with `--allow-host`. A
//!   page that rebinds its own DNS name to 127.0.0.1 sends its own name and
//!   is refused.
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
        }
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
        if let (Some(o), Some(host)) = (h.origin, h.host) {
            let own = ["http://", "https://"]
                .iter()
                .any(|s| normalize_origin(o) == format!("{s}{}", host.trim().to_ascii_lowercase()));
            if !own && !self.allows_origin(o) {
                return Err(Refusal::Origin(o.to_owned()));
            }
        }
        let given = h
            .authorization
            .and_then(bearer)
            .map(str::as_bytes)
            .unwrap_or_default();
        Ok(self.token.matches(given))
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
