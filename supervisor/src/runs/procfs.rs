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

/// Details of `pid`, or `None` if it is gone. Of its command line at most
/// [`ProcessInfo::ARGV_MAX`] bytes are read.
pub fn info(pid: i32) -> Option<ProcessInfo> {
    use std::io::Read;
    let fields = stat_fields(pid)?;
    let ppid: i32 = fields.get(1)?.parse().ok()?;
    let start_ticks: u64 = fields.get(19)?.parse().ok()?;
    let hz = rustix::param::clock_ticks_per_second().max(1);
    // One byte past the limit tells a cut command line from a full one.
    let mut cmdline = Vec::new();
    if let Ok(f) = std::fs::File::open(format!("/proc/{pid}/cmdline")) {
        let _ = f
            .take(ProcessInfo::ARGV_MAX as u64 + 1)
            .read_to_end(&mut cmdline);
    }
    let (argv, argv_truncated) = argv_within(&cmdline, ProcessInfo::ARGV_MAX);
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
        argv_truncated,
    })
}

/// The arguments of a NUL-separated command line, at most `max` bytes of
/// them counting one terminator each (as the kernel counts), after invalid
/// UTF-8 is replaced; and whether any were cut.
fn argv_within(cmdline: &[u8], max: usize) -> (Vec<String>, bool) {
    let mut cut = cmdline.len() > max;
    let mut budget = max;
    let mut argv = Vec::new();
    for arg in cmdline[..cmdline.len().min(max)]
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
    {
        let mut arg = String::from_utf8_lossy(arg).into_owned();
        if arg.len() + 1 > budget {
            let mut end = budget.saturating_sub(1);
            while !arg.is_char_boundary(end) {
                end -= 1;
            }
            arg.truncate(end);
            cut = true;
        }
        if arg.is_empty() {
            break;
        }
        budget -= arg.len() + 1;
        argv.push(arg);
        if cut && budget == 0 {
            break;
        }
    }
    (argv, cut)
}

#[cfg(test)]
mod tests {
    use super::argv_within;

    #[test]
    fn a_long_command_line_is_cut_and_marked() {
        let (argv, cut) = argv_within(b"sh\0-c\0echo hi\0", 64);
        assert_eq!(
            (argv, cut),
            (vec!["sh".into(), "-c".into(), "echo hi".into()], false)
        );
        let mut long = b"prog\0".to_vec();
        long.extend(std::iter::repeat_n(b'x', 10_000));
        let (argv, cut) = argv_within(&long[..4097], 4096);
        assert!(cut);
        assert_eq!(argv[0], "prog");
        assert_eq!(argv.iter().map(|a| a.len() + 1).sum::<usize>(), 4096);
    }

    #[test]
    fn replaced_bytes_do_not_grow_past_the_limit() {
        // Each invalid byte becomes a three-byte replacement character.
        let raw = vec![0xffu8; 100];
        let (argv, cut) = argv_within(&raw, 100);
        assert!(cut);
        assert!(argv[0].len() < 100, "{}", argv[0].len());
        assert!(argv[0].chars().all(|c| c == char::REPLACEMENT_CHARACTER));
    }
}
