//! `network.policy.*` and `network.audit` answers as people read them.

use super::{clean, utc};
use allox_protocol::{
    NetworkAuditListing, NetworkAuditRecord, NetworkPolicyInfo, PortInfo, SecretInfo,
};

pub fn policy(p: &NetworkPolicyInfo) -> String {
    let who = match &p.session_id {
        Some(s) => format!("session {}/{}", clean(&p.agent_id), clean(s)),
        None => format!("agent {}", clean(&p.agent_id)),
    };
    let mut out = format!("{who}: network {}\n", p.mode);
    for l in &p.levels {
        let allow = match &l.egress.allow {
            None => "(does not narrow)".to_string(),
            Some(v) if v.is_empty() => "(nothing)".to_string(),
            Some(v) => v.iter().map(|r| clean(r)).collect::<Vec<_>>().join(" "),
        };
        let deny = if l.egress.deny.is_empty() {
            "-".to_string()
        } else {
            l.egress
                .deny
                .iter()
                .map(|r| clean(r))
                .collect::<Vec<_>>()
                .join(" ")
        };
        out.push_str(&format!(
            "  {:<8} allow {allow}\n  {:<8} deny  {deny}\n",
            clean(&l.level),
            ""
        ));
    }
    out
}

pub fn audit_record(r: &NetworkAuditRecord) -> String {
    let head = format!(
        "{:>8} {} {}/{}{} {} {}:{} {}",
        r.seq,
        utc(r.time_ms),
        clean(&r.agent_id),
        clean(&r.session_id),
        r.run_id
            .as_deref()
            .map(|x| format!("/{}", clean(x)))
            .unwrap_or_default(),
        clean(&r.kind),
        clean(&r.host),
        r.port,
        r.address
            .as_deref()
            .map(|a| format!("-> {}", clean(a)))
            .unwrap_or_else(|| "-".into()),
    );
    // A connection as it opened: its bytes come with its end.
    if r.open {
        return format!("{head} open\n");
    }
    let verdict = if r.allowed {
        let mut s = "allowed".to_string();
        if r.intercepted {
            s.push_str(" intercepted");
        }
        if !r.secrets_injected.is_empty() {
            s.push_str(&format!(
                " secrets {}",
                clean(&r.secrets_injected.join(","))
            ));
        }
        if !r.secrets_withheld.is_empty() {
            s.push_str(&format!(
                " withheld {}",
                clean(&r.secrets_withheld.join(","))
            ));
        }
        s
    } else {
        format!("refused ({})", clean(&r.verdict))
    };
    format!(
        "{head} {verdict} sent {} received {}\n",
        r.bytes_sent, r.bytes_received
    )
}

pub fn audit(l: &NetworkAuditListing) -> String {
    let mut out: String = l.records.iter().map(audit_record).collect();
    out.push_str(&format!(
        "-- {} records; next cursor {}\n",
        l.records.len(),
        l.next_cursor
    ));
    out
}

/// A secret as `secret set|list` show it (never its value).
pub fn secret(x: &SecretInfo) -> String {
    let level = match &x.session_id {
        Some(s) => format!("{}/{}", clean(&x.agent_id), clean(s)),
        None => format!("{} (every session)", clean(&x.agent_id)),
    };
    let mut out = format!(
        "{} of {level}: hosts {}",
        clean(&x.name),
        clean(&x.hosts.join(" "))
    );
    if let Some(h) = &x.header {
        out.push_str(&format!("; header {}", clean(h)));
    }
    if let Some(q) = &x.query {
        out.push_str(&format!("; query {}", clean(q)));
    }
    if x.intercept {
        out.push_str("; HTTPS intercepted");
    }
    out.push_str(&format!("; runs see {}\n", clean(&x.placeholder)));
    out
}

/// An exposed port as `port expose|list` show it.
pub fn port(p: &PortInfo) -> String {
    format!(
        "port {} of {}/{}: host {} path {}{} token {}\n",
        p.port,
        clean(&p.agent_id),
        clean(&p.session_id),
        clean(&p.host),
        clean(&p.path),
        if p.public { " (public)" } else { "" },
        clean(&p.token)
    )
}
