//! Process details from /proc, for `process.list`.

use allox_protocol::ProcessInfo;

fn boot_ms() -> u64 {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("btime ")
                    .and_then(|v| v.trim().parse::<u64>().ok())
            })
        })
        .unwrap_or(0)
        * 1000
}

/// Details of `pid`, or `None` if it is gone.
pub fn info(pid: i32) -> Option<ProcessInfo> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain anything.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ppid: i32 = fields.get(1)?.parse().ok()?;
    let start_ticks: u64 = fields.get(19)?.parse().ok()?;
    let hz = rustix::param::clock_ticks_per_second().max(1);
    let argv: Vec<String> = std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let run_id = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .ok()
        .and_then(|c| {
            c.lines().find_map(|l| {
                let path = l.strip_prefix("0::")?;
                let last = path.rsplit('/').next()?;
                last.strip_prefix("run-").map(String::from)
            })
        });
    Some(ProcessInfo {
        pid,
        ppid,
        argv,
        run_id,
        started_ms: boot_ms() + start_ticks * 1000 / hz,
    })
}
