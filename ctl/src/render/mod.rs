//! Human output for every response: tables for listings, a tree for
//! checkpoints, one line for simple results, a status line and captured
//! output for finished runs. Every string ends with a newline; times are
//! UTC.

mod diff;
mod events;
pub use events::process_event;
mod files;
pub mod monitor;
pub use files::fs_event;
mod effects;
pub mod network;
mod plugins;
mod process;
mod refusal;
mod share;
mod stats;
pub use stats::bytes;
mod table;
mod time;
mod tree;

pub use process::run_status;
pub use table::{clean, clean_path, Table};
pub use time::utc;
pub use tree::{checkpoint_tree, HEAD_MARK};

use allox_protocol::{
    AgentInfo, AgentListing, AuditListing, CheckpointInfo, Response, RollbackDone, SessionInfo,
    SessionListing,
};

fn store_check(r: &allox_protocol::StoreCheckReport) -> String {
    let mut out = String::new();
    if let Some(why) = &r.read_only {
        out.push_str(&format!("read-only: {}\n", clean(why)));
    }
    for (what, items) in [
        ("unfinished operation", &r.unfinished),
        ("in the index, not on disk", &r.missing_on_disk),
        ("on disk, not in the index", &r.missing_in_index),
        (
            "in progress (an export, an import, a removal tried again)",
            &r.in_progress,
        ),
    ] {
        for i in items {
            out.push_str(&format!("{what}: {}\n", clean(i)));
        }
    }
    if r.removing > 0 {
        out.push_str(&format!("old trees being removed: {}\n", r.removing));
    }
    if r.is_consistent() {
        out.push_str(
            "store consistent: the index matches the disk, the journal holds nothing unfinished\n",
        );
    }
    out
}

/// The response as people read it.
pub use refusal::refusal;

/// What `exec` says of a run's effects on stderr: a line when it is
/// consistent, the whole summary when not.
pub fn effects_note(e: &allox_protocol::RunEffects) -> String {
    if e.verdict == allox_protocol::EffectsVerdict::Consistent && !e.fenced {
        format!(
            "alloxctl: effects of run {}: CONSISTENT (evidence root {})\n",
            clean(&e.run_id),
            clean(&e.evidence_root)
        )
    } else {
        effects::effects(e)
            .lines()
            .map(|l| format!("alloxctl: {l}\n"))
            .collect()
    }
}

pub fn render(response: &Response) -> String {
    match response {
        Response::Stopping(s) => {
            if s.power_off {
                "supervisor stopping; the VM powers off\n".to_string()
            } else {
                "supervisor stopping\n".to_string()
            }
        }
        Response::System(i) => plugins::info(i),
        Response::Resumed(r) => format!(
            "resumed: clock moved {} ms{}, instance {}\n",
            r.clock_step_ms,
            if r.reseeded {
                ", random pool reseeded"
            } else {
                ""
            },
            r.instance
        ),
        Response::Plugins(l) => plugins::plugins(l),
        Response::NetworkPolicy(p) => network::policy(p),
        Response::FsEntry(e) => files::entry(e),
        Response::FsListing(l) => files::listing(l),
        Response::FsData(d) => files::data(d),
        Response::FsWritten(w) => files::written(w),
        Response::FsCopied(c) => files::copied(c),
        Response::NetworkAudit(l) => network::audit(l),
        Response::Secret(x) => network::secret(x),
        Response::Port(p) => network::port(p),
        Response::Ports(l) if l.ports.is_empty() => "no ports exposed\n".to_string(),
        Response::Ports(l) => l.ports.iter().map(network::port).collect(),
        Response::PortConnected(c) => format!(
            "connected to port {} of {}/{}\n",
            c.port,
            clean(&c.agent_id),
            clean(&c.session_id)
        ),
        Response::Secrets(l) if l.secrets.is_empty() => "no secrets\n".to_string(),
        Response::Secrets(l) => l.secrets.iter().map(network::secret).collect(),
        Response::Shares(l) => share::listing(l),
        Response::Effects(e) => effects::effects(e),
        Response::EffectsListing(l) => effects::listing(l),
        Response::EffectsHistory(h) => effects::history(h),
        Response::EffectsStatus(s) => effects::status(s),
        Response::EffectsUnfenced(u) => effects::unfenced(u),
        Response::EffectsVerified(v) => effects::verified(v),
        Response::EffectsExportChunk(x) => format!(
            "{} bytes of the export's {} from offset {}{}\n",
            x.data.0.len(),
            x.size,
            x.offset,
            if x.eof { " (its end)" } else { "" }
        ),
        Response::Metrics(m) => m.text.clone(),
        Response::SessionExported(e) => format!(
            "exported {}/{}: {} checkpoint{}, {} bytes\n",
            e.agent_id,
            e.session_id,
            e.checkpoints,
            if e.checkpoints == 1 { "" } else { "s" },
            e.bytes
        ),
        Response::SessionImported(i) => match &i.session {
            Some(s) => format!(
                "imported {}/{}: {} checkpoint{}, {} bytes{}\n",
                s.agent_id,
                s.session_id,
                i.checkpoints,
                if i.checkpoints == 1 { "" } else { "s" },
                i.received,
                match i.privileges_dropped {
                    0 => String::new(),
                    n => format!(
                        "; {n} privilege{} dropped (setuid or setgid bits, privileged attributes: a session's files keep none)",
                        if n == 1 { "" } else { "s" }
                    ),
                }
            ),
            None => format!("import {}: {} bytes received\n", i.import_id, i.received),
        },
        Response::ShareAgent(a) => share::agent(a),
        Response::Share(i) => share::info(i),
        Response::SessionStats(st) => stats::session(st),
        Response::MonitorIngested(i) => monitor::ingested(i),
        Response::MonitorRecords(l) => monitor::listing(l),
        Response::MonitorSummary(m) => monitor::summary(m),
        Response::MonitorTimeline(t) => format!(
            "{}/{}: {} turns, {} checkpoints\n",
            clean(&t.agent_id),
            clean(&t.session_id),
            t.turns.len(),
            t.checkpoints.len()
        ),
        Response::StoreCheck(r) => store_check(r),
        Response::ProcessEvents(l) => {
            let mut out = String::new();
            for e in &l.events {
                out.push_str(&process_event(e));
            }
            out.push_str(&format!(
                "-- {} events; next cursor {}; lost in the kernel {}; evicted from the store {}\n",
                l.events.len(),
                l.next_cursor,
                l.lost,
                l.evicted
            ));
            out
        }
        Response::ProcessTree(t) if t.roots.is_empty() => "no processes recorded\n".to_string(),
        Response::ProcessTree(t) => {
            let mut out = String::new();
            for r in &t.roots {
                events::process_node(r, "", true, true, &mut out);
            }
            out
        }
        Response::Pong(p) => format!(
            "daemon is up: protocol {}, {}\n",
            p.version,
            clean(&p.build)
        ),
        Response::Agent(a) => agent(a),
        Response::Agents(l) => agents(l),
        Response::Session(s) => session(s),
        Response::Sessions(l) => sessions(l),
        Response::Checkpoint(c) => checkpoint(c),
        Response::Checkpoints(l) if l.checkpoints.is_empty() => format!(
            "session {}/{} has no checkpoints\n",
            clean(&l.agent_id),
            clean(&l.session_id)
        ),
        Response::Checkpoints(l) => checkpoint_tree(l),
        Response::RolledBack(r) => rolled_back(r),
        Response::Deleted(d) => format!("deleted {}\n", clean(&d.deleted)),
        Response::Audit(l) => audit(l),
        Response::Turn(t) => turn(t),
        Response::Diff(d) => diff::listing(d),
        Response::Policy(p) => format!(
            "{}{}: auto_checkpoint {}{}\n",
            clean(&p.agent_id),
            p.session_id
                .as_deref()
                .map(|s| format!("/{}", clean(s)))
                .unwrap_or_default(),
            if p.auto_checkpoint { "on" } else { "off" },
            p.keep_last
                .map(|n| format!(", keep last {n}"))
                .unwrap_or_default()
        ),
        Response::Started(s) => process::started(s),
        Response::Exited(r) => process::exited(r),
        Response::Logs(l) => process::logs(l),
        Response::Killed(k) => process::killed(k),
        Response::Processes(l) => process::processes(l),
        Response::StdinWritten(w) => process::stdin_written(w),
        Response::Resized(r) => format!(
            "run {}: terminal of {} rows, {} columns\n",
            clean(&r.run_id),
            r.rows,
            r.cols
        ),
    }
}

fn turn(t: &allox_protocol::TurnInfo) -> String {
    let status = match t.status {
        None => "open".to_owned(),
        Some(s) => format!("{s:?}").to_lowercase(),
    };
    let mut out = fields(&[
        (
            "turn",
            format!(
                "{}/{}/{}",
                clean(&t.agent_id),
                clean(&t.session_id),
                clean(&t.turn_id)
            ),
        ),
        ("number", t.number.to_string()),
        ("began", utc(t.began_ms)),
        ("status", status),
        ("checkpoint", or_none(t.checkpoint_id.as_deref())),
    ]);
    if let Some(e) = &t.checkpoint_error {
        out.push_str(&format!("automatic checkpoint failed: {}\n", clean(e)));
    }
    out
}

fn or_none(value: Option<&str>) -> String {
    value.map(clean).unwrap_or_else(|| "-".to_owned())
}

fn fields(rows: &[(&str, String)]) -> String {
    let mut t = Table::new();
    for (key, value) in rows {
        t.row(vec![format!("{key}:"), value.clone()]);
    }
    t.render()
}

fn agent(a: &AgentInfo) -> String {
    fields(&[
        ("agent", clean(&a.agent_id)),
        ("created", utc(a.created_ms)),
        ("sessions", a.sessions.to_string()),
        ("workspace", clean(&a.workspace)),
    ])
}

fn agents(l: &AgentListing) -> String {
    if l.agents.is_empty() {
        return "no agents\n".to_owned();
    }
    let mut t = Table::with_header(&["AGENT", "CREATED", "SESSIONS", "WORKSPACE"]);
    for a in &l.agents {
        t.row(vec![
            clean(&a.agent_id),
            utc(a.created_ms),
            a.sessions.to_string(),
            clean(&a.workspace),
        ]);
    }
    t.render()
}

fn session(s: &SessionInfo) -> String {
    fields(&[
        (
            "session",
            format!("{}/{}", clean(&s.agent_id), clean(&s.session_id)),
        ),
        ("created", utc(s.created_ms)),
        ("head", or_none(s.head.as_deref())),
        ("checkpoints", s.checkpoints.to_string()),
        ("current", clean(&s.current)),
        ("paused", paused(s.paused.as_ref())),
        (
            "idle timeout",
            s.idle_timeout_ms
                .map(|v| format!("{v} ms"))
                .unwrap_or_else(|| "-".into()),
        ),
        (
            "expires",
            match (s.expired_ms, s.expires_ms) {
                (Some(at), _) => format!("expired at {}", utc(at)),
                (None, Some(at)) => utc(at),
                (None, None) => "-".into(),
            },
        ),
    ])
}

/// `-` or since when and why a session is paused.
fn paused(p: Option<&allox_protocol::PauseInfo>) -> String {
    match p {
        None => "-".into(),
        Some(p) => {
            let since = if p.since_ms == 0 {
                "since an earlier supervisor".to_string()
            } else {
                format!("since {}", utc(p.since_ms))
            };
            format!(
                "{since} ({}{})",
                clean(&p.reason),
                if p.hold { ", held" } else { "" }
            )
        }
    }
}

fn sessions(l: &SessionListing) -> String {
    if l.sessions.is_empty() {
        return format!("agent {} has no sessions\n", clean(&l.agent_id));
    }
    let mut t = Table::with_header(&[
        "SESSION",
        "CREATED",
        "HEAD",
        "CHECKPOINTS",
        "CURRENT",
        "PAUSED",
        "EXPIRES",
    ]);
    for s in &l.sessions {
        // An expired session looked just like an active one.
        let expires = match (s.expired_ms, s.expires_ms) {
            (Some(at), _) => format!("expired at {}", utc(at)),
            (None, Some(at)) => utc(at),
            (None, None) => "-".into(),
        };
        t.row(vec![
            clean(&s.session_id),
            utc(s.created_ms),
            or_none(s.head.as_deref()),
            s.checkpoints.to_string(),
            clean(&s.current),
            paused(s.paused.as_ref()),
            expires,
        ]);
    }
    t.render()
}

fn checkpoint(c: &CheckpointInfo) -> String {
    fields(&[
        (
            "checkpoint",
            format!(
                "{}/{}/{}",
                clean(&c.agent_id),
                clean(&c.session_id),
                clean(&c.checkpoint_id)
            ),
        ),
        ("parent", or_none(c.parent.as_deref())),
        ("created", utc(c.created_ms)),
        ("origin", c.origin.as_str().to_owned()),
        ("pinned", if c.pinned { "yes" } else { "no" }.to_owned()),
        ("label", or_none(c.label.as_deref())),
    ])
}

fn rolled_back(r: &RollbackDone) -> String {
    let mut out = format!(
        "rolled back {}/{} to {} (head was {})",
        clean(&r.agent_id),
        clean(&r.session_id),
        clean(&r.checkpoint_id),
        r.previous_head
            .as_deref()
            .map(clean)
            .unwrap_or_else(|| "none".to_owned())
    );
    match r.killed_processes {
        0 => {}
        1 => out.push_str("; killed 1 process"),
        n => out.push_str(&format!("; killed {n} processes")),
    }
    out.push('\n');
    out
}

fn audit(l: &AuditListing) -> String {
    let mut out = if l.records.is_empty() {
        "no audit records\n".to_owned()
    } else {
        let mut t = Table::with_header(&[
            "SEQ", "TIME", "PEER", "ACTION", "TARGET", "OUTCOME", "MESSAGE",
        ]);
        for r in &l.records {
            t.row(vec![
                r.seq.to_string(),
                utc(r.time_ms),
                clean(&r.peer),
                clean(&r.action),
                if r.target.is_empty() {
                    "-".to_owned()
                } else {
                    clean(&r.target)
                },
                clean(&r.outcome),
                r.message.as_deref().map(clean).unwrap_or_default(),
            ]);
        }
        t.render()
    };
    if let Some(seq) = l.earlier {
        out.push_str(&format!("(older records: alloxctl audit --before {seq})\n"));
    }
    if let Some(seq) = l.later {
        out.push_str(&format!("(newer records: alloxctl audit --after {seq})\n"));
    }
    if l.corrupt > 0 {
        out.push_str(&format!(
            "warning: {} corrupt audit records were skipped\n",
            l.corrupt
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use allox_protocol::{AuditRecord, Deleted, Pong};

    const T0: u64 = 1_704_067_200_000; // 2024-01-01 00:00:00

    #[test]
    fn agents_table() {
        let l = AgentListing {
            agents: vec![
                AgentInfo {
                    agent_id: "agent-a".into(),
                    created_ms: T0,
                    sessions: 2,
                    workspace: "/var/lib/allox/agents/agent-a/workspace".into(),
                },
                AgentInfo {
                    agent_id: "b".into(),
                    created_ms: T0 + 61_000,
                    sessions: 10,
                    workspace: "/w/b".into(),
                },
            ],
        };
        assert_eq!(
            render(&Response::Agents(l)),
            "\
AGENT    CREATED              SESSIONS  WORKSPACE
agent-a  2024-01-01 00:00:00  2         /var/lib/allox/agents/agent-a/workspace
b        2024-01-01 00:01:01  10        /w/b
"
        );
        let empty = AgentListing { agents: vec![] };
        assert_eq!(render(&Response::Agents(empty)), "no agents\n");
    }

    #[test]
    fn sessions_table() {
        let l = SessionListing {
            agent_id: "a".into(),
            sessions: vec![
                SessionInfo {
                    agent_id: "a".into(),
                    session_id: "s1".into(),
                    created_ms: T0,
                    head: None,
                    checkpoints: 0,
                    current: "/c".into(),
                    paused: None,
                    idle_timeout_ms: None,
                    expires_ms: None,
                    expired_ms: None,
                },
                SessionInfo {
                    agent_id: "a".into(),
                    session_id: "s2".into(),
                    created_ms: T0,
                    head: None,
                    checkpoints: 0,
                    current: "/d".into(),
                    paused: Some(allox_protocol::PauseInfo {
                        since_ms: T0,
                        reason: "request".into(),
                        hold: true,
                    }),
                    idle_timeout_ms: None,
                    expires_ms: Some(T0),
                    expired_ms: Some(T0),
                },
            ],
        };
        assert_eq!(
            render(&Response::Sessions(l)),
            "\
SESSION  CREATED              HEAD  CHECKPOINTS  CURRENT  PAUSED                                     EXPIRES
s1       2024-01-01 00:00:00  -     0            /c       -                                          -
s2       2024-01-01 00:00:00  -     0            /d       since 2024-01-01 00:00:00 (request, held)  expired at 2024-01-01 00:00:00
"
        );
    }

    #[test]
    fn audit_table_escapes_and_warns() {
        let l = AuditListing {
            records: vec![
                AuditRecord {
                    seq: 1,
                    time_ms: T0,
                    request_id: 3,
                    peer: "uid=0 pid=42".into(),
                    action: "agent.create".into(),
                    target: "a".into(),
                    outcome: "ok".into(),
                    message: None,
                },
                AuditRecord {
                    seq: 2,
                    time_ms: T0 + 1000,
                    request_id: 4,
                    peer: "startup".into(),
                    action: "agent.list".into(),
                    target: String::new(),
                    outcome: "conflict".into(),
                    message: Some("two\nlines".into()),
                },
            ],
            corrupt: 1,
            earlier: Some(1),
            later: None,
        };
        assert_eq!(
            render(&Response::Audit(l)),
            "\
SEQ  TIME                 PEER          ACTION        TARGET  OUTCOME   MESSAGE
1    2024-01-01 00:00:00  uid=0 pid=42  agent.create  a       ok
2    2024-01-01 00:00:01  startup       agent.list    -       conflict  two\\nlines
(older records: alloxctl audit --before 1)
warning: 1 corrupt audit records were skipped
"
        );
    }

    #[test]
    fn one_line_results() {
        let r = RollbackDone {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: "c1".into(),
            previous_head: Some("c3".into()),
            killed_processes: 2,
        };
        assert_eq!(
            render(&Response::RolledBack(r)),
            "rolled back a/s to c1 (head was c3); killed 2 processes\n"
        );
        let d = Deleted {
            deleted: "a/s".into(),
        };
        assert_eq!(render(&Response::Deleted(d)), "deleted a/s\n");
        let p = Pong {
            version: 1,
            build: "allox 0.1.0".into(),
        };
        assert_eq!(
            render(&Response::Pong(p)),
            "daemon is up: protocol 1, allox 0.1.0\n"
        );
    }

    #[test]
    fn single_records_are_fields() {
        let a = AgentInfo {
            agent_id: "a".into(),
            created_ms: T0,
            sessions: 0,
            workspace: "/w/a".into(),
        };
        assert_eq!(
            render(&Response::Agent(a)),
            "\
agent:      a
created:    2024-01-01 00:00:00
sessions:   0
workspace:  /w/a
"
        );
    }
}
