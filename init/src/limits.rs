//! The guest's default resource limits: what one session may take, and
//! what all sessions together may take, so that a fork bomb or a memory
//! hog in one session cannot take the VM's process ids or memory from the
//! supervisor or from the other sessions.
//!
//! | setting (kernel command line) | default |
//! |---|---|
//! | `allox.session_pids_max=N\|max` | 1,024 processes per session |
//! | `allox.session_memory_max=BYTES\|max` | half of the guest's memory |
//! | `allox.reserve_pids=N` | 256 process ids kept out of every session's reach |
//! | `allox.reserve_memory=BYTES` | an eighth of the memory, at least 128 MiB, kept likewise |
//!
//! They become `supervise` options (`--default-pids-max`,
//! `--default-memory-max`, `--sessions-pids-max`, `--sessions-memory-max`)
//! unless `allox.args=` already gives that option.

/// A limit as set on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Limit {
    /// Not given: the default.
    #[default]
    Default,
    /// `max`: no limit.
    Max,
    Value(u64),
}

impl Limit {
    /// Parses `N`, `NK`, `NM`, `NG` or `max`.
    pub fn parse(v: &str) -> Option<Limit> {
        if v == "max" {
            return Some(Limit::Max);
        }
        let (num, mult) = match v.as_bytes().last()? {
            b'K' | b'k' => (&v[..v.len() - 1], 1u64 << 10),
            b'M' | b'm' => (&v[..v.len() - 1], 1 << 20),
            b'G' | b'g' => (&v[..v.len() - 1], 1 << 30),
            _ => (v, 1),
        };
        num.parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(mult))
            .map(Limit::Value)
    }

    fn or(self, default: u64) -> Option<u64> {
        match self {
            Limit::Default => Some(default),
            Limit::Max => None,
            Limit::Value(n) => Some(n),
        }
    }
}

/// The limits settings of the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LimitSettings {
    pub session_pids_max: Limit,
    pub session_memory_max: Limit,
    pub reserve_pids: Option<u64>,
    pub reserve_memory: Option<u64>,
}

impl LimitSettings {
    /// Takes `key=value` if it is one of the limits settings.
    pub fn take(&mut self, key: &str, value: &str) -> bool {
        let limit = Limit::parse(value);
        match (key, limit) {
            ("session_pids_max", Some(l)) => self.session_pids_max = l,
            ("session_memory_max", Some(l)) => self.session_memory_max = l,
            ("reserve_pids", Some(Limit::Value(n))) => self.reserve_pids = Some(n),
            ("reserve_memory", Some(Limit::Value(n))) => self.reserve_memory = Some(n),
            _ => return false,
        }
        true
    }

    /// The `supervise` options for a guest of `mem_total` bytes and
    /// `pid_max` process ids, leaving out those `given` already has.
    pub fn args(&self, mem_total: u64, pid_max: u64, given: &[String]) -> Vec<String> {
        let reserve_mem = self
            .reserve_memory
            .unwrap_or((mem_total / 8).max(128 << 20));
        let reserve_pids = self.reserve_pids.unwrap_or(256);
        let candidates = [
            ("--default-pids-max", self.session_pids_max.or(1024)),
            (
                "--default-memory-max",
                self.session_memory_max.or(mem_total / 2),
            ),
            (
                "--sessions-pids-max",
                Some(pid_max.saturating_sub(reserve_pids).max(16)),
            ),
            (
                "--sessions-memory-max",
                Some(mem_total.saturating_sub(reserve_mem).max(64 << 20)),
            ),
        ];
        let mut out = Vec::new();
        for (flag, value) in candidates {
            let given = given
                .iter()
                .any(|a| a == flag || a.starts_with(&format!("{flag}=")));
            if let (Some(v), false) = (value, given) {
                out.push(format!("{flag}={v}"));
            }
        }
        out
    }
}

/// `MemTotal` of /proc/meminfo in bytes, and `kernel.pid_max`.
pub fn machine() -> (u64, u64) {
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kib| kib << 10)
        .unwrap_or(512 << 20);
    let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(32_768);
    (mem, pid_max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_leave_the_supervisor_its_share() {
        let s = LimitSettings::default();
        let args = s.args(1 << 30, 32_768, &[]);
        assert_eq!(
            args,
            [
                "--default-pids-max=1024",
                "--default-memory-max=536870912",
                "--sessions-pids-max=32512",
                "--sessions-memory-max=939524096",
            ]
        );
    }

    #[test]
    fn settings_and_given_options_win() {
        let mut s = LimitSettings::default();
        assert!(s.take("session_pids_max", "max"));
        assert!(s.take("session_memory_max", "256M"));
        assert!(s.take("reserve_memory", "1G"));
        assert!(!s.take("reserve_pids", "max"));
        assert!(!s.take("session_memory_max", "lots"));
        let given = vec!["--sessions-pids-max=99".to_string()];
        assert_eq!(
            s.args(4 << 30, 32_768, &given),
            [
                "--default-memory-max=268435456",
                "--sessions-memory-max=3221225472"
            ]
        );
    }
}
