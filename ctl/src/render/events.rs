//! Process events and lineage trees from the process tracker.

use super::table::clean;
use super::time::utc;

/// One process event on one line.
pub fn process_event(e: &allox_protocol::ProcessEvent) -> String {
    use allox_protocol::ProcessEventKind as K;
    let when = utc(e.time_ms);
    match e.kind {
        K::Evicted => format!(
            "{:>8} {when} evicted  {} oldest events dropped at the store's cap\n",
            e.seq,
            e.evicted.unwrap_or(0)
        ),
        _ => {
            let what = match e.kind {
                K::Fork => format!("fork     ppid {}", e.ppid),
                K::Exec => format!("exec     {}", clean(e.filename.as_deref().unwrap_or("?"))),
                _ => match (e.exit_code, e.signal) {
                    (Some(c), _) => format!("exit     code {c}"),
                    (_, Some(s)) => format!("exit     signal {s}"),
                    _ => "exit".to_string(),
                },
            };
            format!(
                "{:>8} {when} {}/{}/{} pid {} (host {}) {} {what}\n",
                e.seq,
                clean(&e.agent_id),
                clean(&e.session_id),
                clean(&e.run_id),
                e.pid,
                e.host_pid,
                clean(&e.comm),
            )
        }
    }
}

pub(super) fn process_node(
    n: &allox_protocol::ProcessNode,
    prefix: &str,
    last: bool,
    root: bool,
    out: &mut String,
) {
    let branch = if root {
        ""
    } else if last {
        "└─ "
    } else {
        "├─ "
    };
    let prog = n
        .execs
        .last()
        .map(|p| clean(p))
        .unwrap_or_else(|| clean(&n.comm));
    let end = match (n.ended_ms, n.exit_code, n.signal) {
        (None, _, _) => "running".to_string(),
        (Some(_), Some(c), _) => format!("exit {c}"),
        (Some(_), _, Some(s)) => format!("killed by signal {s}"),
        _ => "ended".to_string(),
    };
    out.push_str(&format!(
        "{prefix}{branch}{} {prog} [{}] {end}\n",
        n.pid,
        clean(&n.run_id)
    ));
    let child_prefix = if root {
        prefix.to_string()
    } else if last {
        format!("{prefix}   ")
    } else {
        format!("{prefix}│  ")
    };
    for (i, c) in n.children.iter().enumerate() {
        process_node(c, &child_prefix, i + 1 == n.children.len(), false, out);
    }
}
