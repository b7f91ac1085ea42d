//! Process details from /proc, for `process.list`.

use allox_protocol::ProcessInfo;

/// Boot time, read once: it does not change.
fn boot_ms() -> u64 {
    static BOOT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *BOOT.get_or_init(|| {
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
    })
}

/// The fields of `/proc/<pid>/stat` after the command name (which is in
/// parentheses and may contain anything).
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    Some(rest.split_whitespace().map(String::from).collect())
}

/// The parent of `pid`, or `None` if it is gone.
pub fn ppid(pid: i32) -> Option<i32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// Details of `pid`, or `None` if it is gone.
pub fn info(pid: i32) -> Option<ProcessInfo> {
    let fields = stat_fields(pid)?;
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
