//! `network.policy.*` and `network.audit` answers as people read them.

use super::{clean, utc};
use allox_protocol::{NetworkAuditListing, NetworkAuditRecord, NetworkPolicyInfo};

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
    format!(
        "{:>8} {} {}/{}{} {} {}:{} {} {} sent {} received {}\n",
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
        if r.allowed {
            "allowed".to_string()
        } else {
            format!("refused ({})", clean(&r.verdict))
        },
        r.bytes_sent,
        r.bytes_received
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
