//! Egress policy: which hosts and ports a session may reach through the
//! broker.
//!
//! A rule is one of
//!
//! | rule | matches |
//! |---|---|
//! | `*` | everything |
//! | `example.com` | that name exactly (any port) |
//! | `*.example.com` | every name below `example.com`, not the name itself |
//! | `203.0.113.7`, `2001:db8::1` | that address (given as the target, or resolved) |
//! | `10.0.0.0/8`, `fd00::/8` | any address in the network |
//!
//! each optionally followed by `:PORT` (`example.com:443`,
//! `[2001:db8::1]:22`, `[10.0.0.0/8]:5432`). Names are compared in lower
//! case without a trailing dot; they must already be ASCII (IDNA applied).
//!
//! A policy is layers (daemon, agent, session), each with a deny list and,
//! optionally, an allow list. A connection is refused when any layer's deny
//! list matches it, or when any layer that has an allow list does not allow
//! it: each layer can only narrow what the others allow, so a later allow
//! never overrides an earlier explicit deny.
//!
//! Decided twice. [`Policy::check_target`] before any name is resolved
//! (the host as the client gave it, and the port); then
//! [`Policy::check_address`] for each address the name resolved to (or the
//! literal address): an address matched by a deny rule is refused, and an
//! address of a [`special`] range (loopback, private, link-local, the cloud
//! metadata address, …) is refused unless an allow rule names that address
//! or a network holding it — allowing a name is not enough, so a name that
//! resolves to 10.x is refused.

use crate::own::OwnAddresses;
use std::net::IpAddr;
use thiserror::Error;

/// Why a rule could not be read.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RuleError {
    #[error("empty rule")]
    Empty,
    #[error("rule {rule:?}: port {port:?} is not a number from 1 to 65535")]
    Port { rule: String, port: String },
    #[error("rule {rule:?}: {why}")]
    Host { rule: String, why: &'static str },
    #[error("rule {rule:?}: network prefix {prefix:?} is not a number from 0 to {max}")]
    Prefix {
        rule: String,
        prefix: String,
        max: u8,
    },
}

/// What a rule names, before its port.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Any,
    Name(String),
    /// A name strictly below this domain.
    Below(String),
    Net {
        addr: IpAddr,
        prefix: u8,
    },
}

/// One allow or deny rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    target: Target,
    port: Option<u16>,
    /// As written (for audit records and errors).
    text: String,
}

/// The host a client asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    Name(String),
    Addr(IpAddr),
}

impl Host {
    /// A host as a client sent it: an address literal (IPv6 in brackets or
    /// not) or a name, normalised to lower case without a trailing dot.
    pub fn parse(s: &str) -> Result<Host, RuleError> {
        let bare = s.strip_prefix('[').and_then(|v| v.strip_suffix(']'));
        if let Ok(a) = bare.unwrap_or(s).parse::<IpAddr>() {
            return Ok(Host::Addr(a));
        }
        name(s).map(Host::Name)
    }
}

impl std::fmt::Display for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Addr(a) => write!(f, "{a}"),
        }
    }
}

/// A name as rules and targets hold it; `s` is what the error names.
fn name(s: &str) -> Result<String, RuleError> {
    let bad = |why| RuleError::Host {
        rule: s.to_string(),
        why,
    };
    let n = s.strip_suffix('.').unwrap_or(s).to_ascii_lowercase();
    if n.is_empty() {
        return Err(bad("no host"));
    }
    if n.len() > 253 {
        return Err(bad("a name is at most 253 characters"));
    }
    for label in n.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(bad("each dot-separated label is 1 to 63 characters"));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            || label.starts_with('-')
            || label.ends_with('-')
        {
            return Err(bad(
                "a name is ASCII letters, digits, '-' and '_' (IDNA applied), no label starting or ending with '-'",
            ));
        }
    }
    Ok(n)
}

impl Rule {
    pub fn parse(text: &str) -> Result<Rule, RuleError> {
        let t = text.trim();
        if t.is_empty() {
            return Err(RuleError::Empty);
        }
        let port_of = |p: &str| -> Result<u16, RuleError> {
            match p.parse::<u16>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(RuleError::Port {
                    rule: t.to_string(),
                    port: p.to_string(),
                }),
            }
        };
        // `[...]` holds an IPv6 address or any network; a port may follow.
        let (host, port) = if let Some(rest) = t.strip_prefix('[') {
            let Some((inside, after)) = rest.split_once(']') else {
                return Err(RuleError::Host {
                    rule: t.to_string(),
                    why: "'[' without ']'",
                });
            };
            let port = match after {
                "" => None,
                p => match p.strip_prefix(':') {
                    Some(p) => Some(port_of(p)?),
                    None => {
                        return Err(RuleError::Host {
                            rule: t.to_string(),
                            why: "only ':PORT' may follow ']'",
                        })
                    }
                },
            };
            (inside, port)
        } else if t.matches(':').count() == 1 {
            let (h, p) = t.split_once(':').unwrap_or((t, ""));
            (h, Some(port_of(p)?))
        } else {
            // No colon, or several: an IPv6 address or network without port.
            (t, None)
        };
        let target = target(t, host)?;
        Ok(Rule {
            target,
            port,
            text: t.to_string(),
        })
    }

    /// The rule as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    fn port_matches(&self, port: u16) -> bool {
        self.port.is_none_or(|p| p == port)
    }

    /// Whether it matches `host` as a client asked for it, on `port`
    /// (names and literal addresses; names are not resolved).
    pub fn matches(&self, host: &Host, port: u16) -> bool {
        self.matches_target(host, port)
    }

    /// Whether it is `*` (every host).
    pub fn is_any(&self) -> bool {
        matches!(self.target, Target::Any)
    }

    /// Whether it matches the host as asked (names and literal addresses).
    fn matches_target(&self, host: &Host, port: u16) -> bool {
        self.port_matches(port)
            && match (&self.target, host) {
                (Target::Any, _) => true,
                (Target::Name(n), Host::Name(h)) => n == h,
                (Target::Below(d), Host::Name(h)) => {
                    h.len() > d.len() + 1 && h.ends_with(d.as_str()) && {
                        let cut = h.len() - d.len() - 1;
                        h.as_bytes()[cut] == b'.'
                    }
                }
                (Target::Net { .. }, Host::Addr(a)) => self.covers(*a),
                _ => false,
            }
    }

    /// Whether it names `host` itself: that name, or an address or network
    /// holding that address (not `*`, not `*.domain`).
    fn names(&self, host: &Host) -> bool {
        match (&self.target, host) {
            (Target::Name(n), Host::Name(h)) => n == h,
            (Target::Net { .. }, Host::Addr(a)) => self.covers(*a),
            _ => false,
        }
    }

    /// Whether it names `addr` itself (an address or a network).
    fn covers(&self, addr: IpAddr) -> bool {
        let Target::Net { addr: net, prefix } = self.target else {
            return false;
        };
        match (net, addr) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

fn target(rule: &str, host: &str) -> Result<Target, RuleError> {
    if host == "*" {
        return Ok(Target::Any);
    }
    if let Some((a, p)) = host.split_once('/') {
        let addr: IpAddr = a.parse().map_err(|_| RuleError::Host {
            rule: rule.to_string(),
            why: "a network is an address, '/' and a prefix length",
        })?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p.parse::<u8>() {
            Ok(n) if n <= max => n,
            _ => {
                return Err(RuleError::Prefix {
                    rule: rule.to_string(),
                    prefix: p.to_string(),
                    max,
                })
            }
        };
        return Ok(Target::Net { addr, prefix });
    }
    if let Ok(addr) = host.parse::<IpAddr>() {
        let prefix = if addr.is_ipv4() { 32 } else { 128 };
        return Ok(Target::Net { addr, prefix });
    }
    if let Some(d) = host.strip_prefix("*.") {
        return name(d).map(Target::Below).map_err(|e| match e {
            RuleError::Host { why, .. } => RuleError::Host {
                rule: rule.to_string(),
                why,
            },
            other => other,
        });
    }
    if host.contains('*') {
        return Err(RuleError::Host {
            rule: rule.to_string(),
            why: "'*' only alone or as '*.' before a domain",
        });
    }
    name(host).map(Target::Name).map_err(|e| match e {
        RuleError::Host { why, .. } => RuleError::Host {
            rule: rule.to_string(),
            why,
        },
        other => other,
    })
}

/// The class of an address of one of the machine's own interfaces that
/// is in no other special range.
pub const OWN_ADDRESS: &str = "an address of this machine's own interfaces";

/// An address range that is never reached by name alone: the class it
/// belongs to, if any.
pub fn special(addr: IpAddr) -> Option<&'static str> {
    match addr {
        IpAddr::V4(a) => {
            let o = a.octets();
            if a.is_loopback() {
                Some("loopback")
            } else if a.is_private() {
                Some("private")
            } else if o == [169, 254, 169, 254] {
                Some("cloud metadata")
            } else if a.is_link_local() {
                Some("link-local")
            } else if o[0] == 0 || a.is_broadcast() {
                Some("this network or broadcast")
            } else if o[0] == 100 && (o[1] & 0xc0) == 64 {
                Some("shared address space (carrier-grade NAT)")
            } else if a.is_multicast() || o[0] >= 240 {
                Some("multicast or reserved")
            } else {
                None
            }
        }
        IpAddr::V6(a) => {
            if let Some(v4) = a.to_ipv4_mapped() {
                return special(IpAddr::V4(v4));
            }
            let s = a.segments();
            // The well-known NAT64 prefix (RFC 6052): a gateway there
            // reaches the IPv4 address in its last 32 bits, which is
            // judged as itself (DNS64 gives every IPv4-only name such an
            // address: 10.0.0.5's would reach 10.0.0.5).
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let o = a.octets();
                return special(IpAddr::V4(std::net::Ipv4Addr::new(
                    o[12], o[13], o[14], o[15],
                )));
            }
            if a.is_loopback() || a.is_unspecified() {
                Some("loopback")
            } else if s[..6] == [0, 0, 0, 0, 0, 0] {
                Some("reserved (IPv4-compatible, ::/96)")
            } else if s[0] == 0x64 && s[1] == 0xff9b {
                Some("reserved (local-use NAT64, 64:ff9b:1::/48)")
            } else if s[0] == 0x2002 {
                Some("reserved (6to4, 2002::/16)")
            } else if s[0] == 0x2001 && s[1] == 0 {
                Some("reserved (Teredo, 2001::/32)")
            } else if s[0] == 0x2001 && s[1] == 0xdb8 {
                Some("reserved (documentation, 2001:db8::/32)")
            } else if s[..4] == [0x100, 0, 0, 0] {
                Some("reserved (discard-only, 100::/64)")
            } else if (s[0] & 0xffc0) == 0xfec0 {
                Some("reserved (site-local, fec0::/10)")
            } else if (s[0] & 0xfe00) == 0xfc00 {
                Some("private (unique local)")
            } else if (s[0] & 0xffc0) == 0xfe80 {
                Some("link-local")
            } else if a.is_multicast() {
                Some("multicast or reserved")
            } else if s == [0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254] {
                Some("cloud metadata")
            } else {
                None
            }
        }
    }
}

/// A layer, its rules read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    /// Named in verdicts: `daemon`, `agent`, `session`.
    pub level: &'static str,
    allow: Option<Vec<Rule>>,
    deny: Vec<Rule>,
}

/// A rule of an egress request that does not read, and the list it is in.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("egress {list} list: {source}")]
pub struct EgressError {
    pub list: &'static str,
    #[source]
    pub source: RuleError,
}

/// Reads every rule of an egress request's `allow` and `deny` lists before
/// anything is made; the first that does not read is the error.
pub fn check_egress<S: AsRef<str>>(allow: Option<&[S]>, deny: &[S]) -> Result<(), EgressError> {
    let none: &[S] = &[];
    Layer::new("check", allow, none).map_err(|source| EgressError {
        list: "allow",
        source,
    })?;
    Layer::new("check", None, deny).map_err(|source| EgressError {
        list: "deny",
        source,
    })?;
    Ok(())
}

impl Layer {
    /// The rules as written: `allow` `None` does not narrow.
    pub fn new<S: AsRef<str>>(
        level: &'static str,
        allow: Option<&[S]>,
        deny: &[S],
    ) -> Result<Layer, RuleError> {
        let read = |v: &[S]| {
            v.iter()
                .map(|r| Rule::parse(r.as_ref()))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Layer {
            level,
            allow: allow.map(read).transpose()?,
            deny: read(deny)?,
        })
    }
}

/// The verdict on a connection, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// A deny rule of this layer matched.
    Denied {
        level: &'static str,
        rule: String,
    },
    /// This layer has an allow list, and nothing on it matched.
    NotAllowed {
        level: &'static str,
    },
    /// No layer has an allow list: nothing is open (default deny).
    Unlisted,
    /// A resolved address of a special range, not named by an allow rule.
    Special {
        addr: IpAddr,
        class: &'static str,
    },
}

impl Verdict {
    pub fn allowed(&self) -> bool {
        *self == Verdict::Allow
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Allow => f.write_str("allowed"),
            Verdict::Denied { level, rule } => write!(f, "denied by the {level} rule {rule:?}"),
            Verdict::NotAllowed { level } => write!(f, "not on the {level} allow list"),
            Verdict::Unlisted => {
                f.write_str("no allow list at any level (daemon, agent, session) opens anything")
            }
            Verdict::Special { addr, class } => write!(
                f,
                "resolves to {addr} ({class}), which only an allow rule naming that address or its network opens"
            ),
        }
    }
}

/// Layers, all of which a connection must pass. Without an allow list in
/// any layer, nothing is allowed (default deny).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    layers: Vec<Layer>,
}

impl Policy {
    pub fn new(layers: Vec<Layer>) -> Policy {
        Policy { layers }
    }

    /// Before any name is resolved: the host as asked, and the port.
    pub fn check_target(&self, host: &Host, port: u16) -> Verdict {
        for l in &self.layers {
            if let Some(r) = l.deny.iter().find(|r| r.matches_target(host, port)) {
                return Verdict::Denied {
                    level: l.level,
                    rule: r.text.clone(),
                };
            }
        }
        let mut listed = false;
        for l in &self.layers {
            if let Some(allow) = &l.allow {
                listed = true;
                if !allow.iter().any(|r| r.matches_target(host, port)) {
                    return Verdict::NotAllowed { level: l.level };
                }
            }
        }
        if !listed {
            return Verdict::Unlisted;
        }
        if let Host::Addr(a) = host {
            return self.check_address(*a, port);
        }
        Verdict::Allow
    }

    /// Whether a connection to `host` passes on some port by rules that
    /// name it: at every level with an allow list, a rule naming that name
    /// itself, or that address or a network holding it (`*` and
    /// `*.domain` do not name anything). A loopback address named so is
    /// the one outside the session, which the broker reaches: the proxy's
    /// environment leaves it out of `NO_PROXY`.
    pub fn names(&self, host: &Host) -> bool {
        // Rules tell ports apart only by the ports they name: each of
        // those and one they do not name stand for every port.
        let mut ports: Vec<u16> = self
            .layers
            .iter()
            .flat_map(|l| l.allow.iter().flatten().chain(&l.deny))
            .filter_map(|r| r.port)
            .collect();
        ports.sort_unstable();
        ports.dedup();
        if let Some(other) = (1..=u16::MAX).find(|p| ports.binary_search(p).is_err()) {
            ports.push(other);
        }
        ports.into_iter().any(|port| {
            self.check_target(host, port).allowed()
                && self
                    .layers
                    .iter()
                    .filter_map(|l| l.allow.as_ref())
                    .all(|list| list.iter().any(|r| r.port_matches(port) && r.names(host)))
        })
    }

    /// Each address a target resolved to (after [`Policy::check_target`]
    /// allowed it).
    pub fn check_address(&self, addr: IpAddr, port: u16) -> Verdict {
        self.check_classed(addr, port, special(addr))
    }

    /// [`Policy::check_address`], where an address of the machine's own
    /// interfaces ([`OwnAddresses`]) is also a special range: through the
    /// proxy it reaches the host's own services, as the loopback does.
    pub fn check_address_on(&self, addr: IpAddr, port: u16, own: &OwnAddresses) -> Verdict {
        let class = special(addr).or_else(|| own.holds(addr).then_some(OWN_ADDRESS));
        self.check_classed(addr, port, class)
    }

    fn check_classed(&self, addr: IpAddr, port: u16, class: Option<&'static str>) -> Verdict {
        let host = Host::Addr(addr);
        for l in &self.layers {
            if let Some(r) = l.deny.iter().find(|r| r.matches_target(&host, port)) {
                return Verdict::Denied {
                    level: l.level,
                    rule: r.text.clone(),
                };
            }
        }
        if let Some(class) = class {
            // Opened only by an allow rule naming the address or its
            // network, in every layer that has an allow list, and at least
            // one.
            let lists: Vec<&Vec<Rule>> = self
                .layers
                .iter()
                .filter_map(|l| l.allow.as_ref())
                .collect();
            let named =
                |list: &Vec<Rule>| list.iter().any(|r| r.port_matches(port) && r.covers(addr));
            if lists.is_empty() || !lists.iter().all(|l| named(l)) {
                return Verdict::Special { addr, class };
            }
        }
        Verdict::Allow
    }
}

#[cfg(test)]
mod tests;
