//! Secrets the broker puts into requests a sandbox sends, so that the
//! sandbox never holds them: a run sees only a placeholder
//! (`allox-secret-placeholder-…`) in its environment, and the broker
//! replaces it with the value in the head of a request to a host the
//! secret's rules name, and only there ([`inject`]). A secret may also
//! name a header (`Authorization: Bearer {}`) or a query parameter the
//! broker sets on those requests, placeholder or not.
//!
//! What leaves this module never carries a value: [`Secret`]'s `Debug`
//! shows its name and hosts, and [`Injected`] names the secrets used.

use crate::policy::{Host, Rule, RuleError};
use zeroize::Zeroizing;

/// What every placeholder starts with.
pub const PLACEHOLDER_PREFIX: &str = "allox-secret-placeholder-";

/// Longest secret value, and most host rules of one secret.
pub const MAX_VALUE: usize = 8 * 1024;
pub const MAX_HOSTS: usize = 64;

/// Names a secret may not take: the environment the proxy and its
/// certificate bundle already set, and the system's own variables.
const RESERVED: &[&str] = &[
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "CURL_CA_BUNDLE",
    "PATH",
    "HOME",
    "USER",
    "SHELL",
    "TERM",
    "PWD",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
];

/// Why a secret is refused; each names what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("secret name {0:?}: a name is 1 to 64 ASCII letters, digits and '_', not starting with a digit (it is the run's environment variable)")]
    Name(String),
    #[error("secret name {0:?} is reserved (the proxy, its certificates or the system set it)")]
    Reserved(String),
    #[error("secret {name}: the value is empty")]
    Empty { name: String },
    #[error("secret {name}: the value is over {MAX_VALUE} bytes")]
    TooLong { name: String },
    #[error("secret {name}: the value holds a control character (a request head cannot carry it)")]
    Control { name: String },
    #[error("secret {name}: no host: a secret names the hosts it may go to")]
    NoHost { name: String },
    #[error("secret {name}: more than {MAX_HOSTS} host rules")]
    TooManyHosts { name: String },
    #[error("secret {name}: host rule {rule:?}: {why}")]
    Host {
        name: String,
        rule: String,
        why: String,
    },
    #[error("secret {name}: header {template:?}: {why}")]
    Header {
        name: String,
        template: String,
        why: &'static str,
    },
    #[error("secret {name}: query parameter {param:?}: a parameter name is 1 to 64 ASCII letters, digits, '-', '_' and '.'")]
    Query { name: String, param: String },
}

/// A header the broker sets on requests to the secret's hosts: its name,
/// and its value with `{}` where the secret goes.
#[derive(Clone, PartialEq, Eq)]
pub struct HeaderTemplate {
    pub name: String,
    pub value: String,
}

impl HeaderTemplate {
    /// `Name: text with {}`.
    pub fn parse(secret: &str, template: &str) -> Result<HeaderTemplate, SecretError> {
        let bad = |why| SecretError::Header {
            name: secret.to_string(),
            template: template.to_string(),
            why,
        };
        let (name, value) = template
            .split_once(':')
            .ok_or_else(|| bad("a header is written `Name: value with {}`"))?;
        let name = name.trim();
        let value = value.trim();
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        {
            return Err(bad("the header's name is not a token"));
        }
        if value.matches("{}").count() != 1 {
            return Err(bad("the value holds `{}` once, where the secret goes"));
        }
        if value.bytes().any(|b| b.is_ascii_control()) {
            return Err(bad("the value holds a control character"));
        }
        let lower = name.to_ascii_lowercase();
        if ["host", "content-length", "transfer-encoding", "connection"].contains(&lower.as_str()) {
            return Err(bad("the broker does not set that header"));
        }
        Ok(HeaderTemplate {
            name: name.to_string(),
            value: value.to_string(),
        })
    }

    /// As written.
    pub fn text(&self) -> String {
        format!("{}: {}", self.name, self.value)
    }
}

/// One secret, as the broker uses it.
#[derive(Clone)]
pub struct Secret {
    /// The run's environment variable.
    pub name: String,
    /// What the run sees instead of the value.
    pub placeholder: String,
    pub value: Zeroizing<String>,
    /// Where the value may go (rules as the egress policy writes them,
    /// matched against the host as the client asked for it).
    pub hosts: Vec<Rule>,
    pub header: Option<HeaderTemplate>,
    pub query: Option<String>,
    /// Whether HTTPS to its hosts is intercepted (the broker terminates
    /// the client's TLS with the session's certificate authority).
    pub intercept: bool,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field(
                "hosts",
                &self.hosts.iter().map(Rule::text).collect::<Vec<_>>(),
            )
            .field("intercept", &self.intercept)
            .finish_non_exhaustive()
    }
}

/// Checks a secret's name.
pub fn check_name(name: &str) -> Result<(), SecretError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.as_bytes()[0].is_ascii_digit()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !ok {
        return Err(SecretError::Name(name.to_string()));
    }
    let upper = name.to_ascii_uppercase();
    if RESERVED.contains(&upper.as_str()) || upper.starts_with("ALLOX_") {
        return Err(SecretError::Reserved(name.to_string()));
    }
    Ok(())
}

impl Secret {
    /// A secret from what `secret.set` gives, each part checked.
    pub fn new(
        name: &str,
        placeholder: String,
        value: Zeroizing<String>,
        hosts: &[String],
        header: Option<&str>,
        query: Option<&str>,
        intercept: bool,
    ) -> Result<Secret, SecretError> {
        check_name(name)?;
        let n = || name.to_string();
        if value.is_empty() {
            return Err(SecretError::Empty { name: n() });
        }
        if value.len() > MAX_VALUE {
            return Err(SecretError::TooLong { name: n() });
        }
        if value.bytes().any(|b| b.is_ascii_control()) {
            return Err(SecretError::Control { name: n() });
        }
        if hosts.is_empty() {
            return Err(SecretError::NoHost { name: n() });
        }
        if hosts.len() > MAX_HOSTS {
            return Err(SecretError::TooManyHosts { name: n() });
        }
        let mut rules = Vec::with_capacity(hosts.len());
        for h in hosts {
            let r = Rule::parse(h).map_err(|e: RuleError| SecretError::Host {
                name: n(),
                rule: h.clone(),
                why: e.to_string(),
            })?;
            if r.is_any() {
                return Err(SecretError::Host {
                    name: n(),
                    rule: h.clone(),
                    why: "`*` would send the secret anywhere; name its hosts".into(),
                });
            }
            rules.push(r);
        }
        let header = header.map(|t| HeaderTemplate::parse(name, t)).transpose()?;
        if let Some(q) = query {
            let ok = !q.is_empty()
                && q.len() <= 64
                && q.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
            if !ok {
                return Err(SecretError::Query {
                    name: n(),
                    param: q.to_string(),
                });
            }
        }
        Ok(Secret {
            name: name.to_string(),
            placeholder,
            value,
            hosts: rules,
            header,
            query: query.map(str::to_string),
            intercept,
        })
    }

    /// Whether it may go to `host:port`.
    pub fn goes_to(&self, host: &Host, port: u16) -> bool {
        self.hosts.iter().any(|r| r.matches(host, port))
    }
}

/// A new placeholder: the prefix and 128 random bits in hex.
pub fn placeholder() -> String {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).expect("the kernel's random numbers");
    let mut s = String::from(PLACEHOLDER_PREFIX);
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// What [`inject`] did with a request, by secret name (never a value).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Injected {
    /// Put in: placeholder replaced, header or parameter set.
    pub injected: Vec<String>,
    /// Placeholders that went out unchanged: the request was to a host
    /// the secret does not name.
    pub withheld: Vec<String>,
}

impl Injected {
    pub fn add(&mut self, other: Injected) {
        for n in other.injected {
            if !self.injected.contains(&n) {
                self.injected.push(n);
            }
        }
        for n in other.withheld {
            if !self.withheld.contains(&n) {
                self.withheld.push(n);
            }
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

fn replace_all(hay: &str, from: &str, to: &str) -> String {
    hay.replace(from, to)
}

/// Percent-encodes a query value (RFC 3986 unreserved characters kept).
fn query_escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Rewrites a request head in origin form (`METHOD /path HTTP/1.1`,
/// headers, the empty line), sent to `host:port`, for `secrets`: for each
/// secret that may go there, its placeholder is replaced by its value in
/// the request line and the header values, and its header or query
/// parameter set; the placeholders of the others are left as they are
/// and named in [`Injected::withheld`]. A head that does not parse, or
/// with no secret to act on, comes back as it was.
pub fn inject(head: &[u8], host: &Host, port: u16, secrets: &[Secret]) -> (Vec<u8>, Injected) {
    let mut done = Injected::default();
    if secrets.is_empty() {
        return (head.to_vec(), done);
    }
    let (going, staying): (Vec<&Secret>, Vec<&Secret>) =
        secrets.iter().partition(|s| s.goes_to(host, port));
    for s in &staying {
        if contains(head, s.placeholder.as_bytes()) {
            done.withheld.push(s.name.clone());
        }
    }
    let acts = going.iter().any(|s| {
        s.header.is_some() || s.query.is_some() || contains(head, s.placeholder.as_bytes())
    });
    if !acts {
        return (head.to_vec(), done);
    }
    let mut headers = [httparse::EMPTY_HEADER; 96];
    let mut req = httparse::Request::new(&mut headers);
    let (Ok(httparse::Status::Complete(_)), Some(method), Some(path)) =
        (req.parse(head), req.method, req.path)
    else {
        return (head.to_vec(), done);
    };
    let mut path = path.to_string();
    let mut used = vec![false; going.len()];
    for (i, s) in going.iter().enumerate() {
        if path.contains(&s.placeholder) {
            path = replace_all(&path, &s.placeholder, &s.value);
            used[i] = true;
        }
        if let Some(q) = &s.query {
            let sep = if path.contains('?') { '&' } else { '?' };
            path = format!("{path}{sep}{q}={}", query_escape(&s.value));
            used[i] = true;
        }
    }
    let mut out = format!("{method} {path} HTTP/1.1\r\n").into_bytes();
    for h in req.headers.iter() {
        if going.iter().any(|s| {
            s.header
                .as_ref()
                .is_some_and(|t| t.name.eq_ignore_ascii_case(h.name))
        }) {
            continue;
        }
        let mut value = String::from_utf8_lossy(h.value).into_owned();
        for (i, s) in going.iter().enumerate() {
            if value.contains(&s.placeholder) {
                value = replace_all(&value, &s.placeholder, &s.value);
                used[i] = true;
            }
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        if value.as_bytes() == h.value || std::str::from_utf8(h.value).is_ok() {
            out.extend_from_slice(value.as_bytes());
        } else {
            // Not UTF-8 and no placeholder: the bytes as they came.
            out.extend_from_slice(h.value);
        }
        out.extend_from_slice(b"\r\n");
    }
    for (i, s) in going.iter().enumerate() {
        if let Some(t) = &s.header {
            out.extend_from_slice(t.name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(t.value.replacen("{}", &s.value, 1).as_bytes());
            out.extend_from_slice(b"\r\n");
            used[i] = true;
        }
    }
    out.extend_from_slice(b"\r\n");
    for (i, s) in going.iter().enumerate() {
        if used[i] {
            done.injected.push(s.name.clone());
        }
    }
    (out, done)
}

#[cfg(test)]
mod tests;
