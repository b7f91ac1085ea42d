//! What a session uses, as people read it.

use super::clean;
use allox_protocol::{SessionStats, Usage};

fn opt(v: Option<u64>, f: impl Fn(u64) -> String) -> String {
    v.map(f).unwrap_or_else(|| "-".into())
}

fn secs(us: u64) -> String {
    format!("{:.2} s", us as f64 / 1e6)
}

pub fn bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

fn usage_lines(what: &str, u: &Usage) -> String {
    format!(
        "{what:<7} cpu user {}, system {}; memory peak {}; io read {}, written {}; oom kills {}\n",
        opt(u.cpu_user_us, secs),
        opt(u.cpu_system_us, secs),
        opt(u.memory_peak_bytes, bytes),
        opt(u.io_read_bytes, bytes),
        opt(u.io_write_bytes, bytes),
        opt(u.oom_kills, |n| n.to_string()),
    )
}

pub fn session(s: &SessionStats) -> String {
    let l = &s.limits;
    let mut out = format!(
        "session {}/{}: {} live runs, {} processes, memory now {}\n",
        clean(&s.agent_id),
        clean(&s.session_id),
        s.live_runs,
        s.processes,
        opt(s.memory_current_bytes, bytes)
    );
    out.push_str(&usage_lines("now", &s.now));
    out.push_str(&usage_lines("total", &s.total));
    out.push_str(&format!(
        "limits  pids {}, memory {}, cpu {}\n",
        opt(l.pids_max, |n| n.to_string()),
        opt(l.memory_max, bytes),
        l.cpu_max
            .as_deref()
            .map(clean)
            .unwrap_or_else(|| "-".into())
    ));
    out
}
