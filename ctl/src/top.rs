//! `alloxctl top`: every session of every agent with its live runs — CPU
//! use over the last interval, memory now, OOM kills — refreshed until
//! interrupted (or once, with `--once`).

use crate::render::{clean, Table};
use allox_client::client::Client;
use allox_protocol::{AgentList, Request, Response, SessionStats, SessionStatsRequest};
use std::collections::HashMap;
use std::time::Instant;

/// CPU µs seen per session and per run, and when.
#[derive(Default)]
pub struct Seen {
    cpu: HashMap<String, u64>,
    at: Option<Instant>,
}

fn cpu(u: &allox_protocol::Usage) -> Option<u64> {
    Some(u.cpu_user_us? + u.cpu_system_us?)
}

/// The stats of every session, now.
pub fn sample(c: &mut Client) -> Result<Vec<SessionStats>, String> {
    let mut out = Vec::new();
    let agents = match c.call(Request::AgentList(AgentList {})) {
        Ok(Ok(Response::Agents(l))) => l.agents,
        other => return Err(format!("agent.list: {other:?}")),
    };
    for a in agents {
        let sessions = match c.call(Request::SessionList(allox_protocol::AgentRef {
            agent_id: a.agent_id.clone(),
        })) {
            Ok(Ok(Response::Sessions(l))) => l.sessions,
            // Deleted meanwhile.
            _ => continue,
        };
        for s in sessions {
            if let Ok(Ok(Response::SessionStats(st))) =
                c.call(Request::SessionStats(SessionStatsRequest {
                    agent_id: a.agent_id.clone(),
                    session_id: s.session_id,
                }))
            {
                out.push(*st);
            }
        }
    }
    Ok(out)
}

/// One screen: a row per session, a row per live run below it; CPU as a
/// share of one CPU over the time since `seen` (then updated).
pub fn frame(stats: &[SessionStats], seen: &mut Seen) -> String {
    let now = Instant::now();
    let secs = seen.at.map(|t| now.duration_since(t).as_secs_f64());
    let mut next = HashMap::new();
    let mut pct = |key: String, used: Option<u64>| -> String {
        let (Some(used), Some(secs)) = (used, secs) else {
            if let Some(u) = used {
                next.insert(key, u);
            }
            return "-".into();
        };
        let before = seen.cpu.get(&key).copied();
        next.insert(key, used);
        match before {
            Some(b) if secs > 0.0 => format!("{:.1}%", used.saturating_sub(b) as f64 / 1e4 / secs),
            _ => "-".into(),
        }
    };
    let mut t = Table::with_header(&["SESSION / RUN", "RUNS", "PROCS", "CPU", "MEM", "OOM KILLS"]);
    let mem = |b: Option<u64>| b.map(super::render::bytes).unwrap_or_else(|| "-".into());
    for s in stats {
        let name = format!("{}/{}", clean(&s.agent_id), clean(&s.session_id));
        t.row(vec![
            name.clone(),
            s.live_runs.to_string(),
            s.processes.to_string(),
            pct(name.clone(), cpu(&s.total)),
            mem(s.memory_current_bytes),
            s.total
                .oom_kills
                .map(|n| n.to_string())
                .unwrap_or_else(|| "-".into()),
        ]);
        for r in &s.runs {
            t.row(vec![
                format!("  {}", clean(&r.run_id)),
                String::new(),
                String::new(),
                pct(format!("{name}/{}", r.run_id), cpu(&r.usage)),
                mem(r.memory_current_bytes),
                r.usage
                    .oom_kills
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| "-".into()),
            ]);
        }
    }
    seen.cpu = next;
    seen.at = Some(now);
    if stats.is_empty() {
        return "no sessions\n".into();
    }
    t.render()
}
