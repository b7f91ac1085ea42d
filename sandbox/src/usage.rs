//! What a cgroup used, from its own files: `cpu.stat` (always there in
//! cgroup v2), `memory.peak`, `memory.current` and `memory.events` (with
//! the memory controller), `io.stat` (with the io controller). A file that
//! is not there gives `None`; nothing is estimated.

use std::path::Path;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupUsage {
    pub cpu_user_us: Option<u64>,
    pub cpu_system_us: Option<u64>,
    pub memory_peak_bytes: Option<u64>,
    pub memory_current_bytes: Option<u64>,
    pub io_read_bytes: Option<u64>,
    pub io_write_bytes: Option<u64>,
    pub oom_kills: Option<u64>,
}

/// `key value` lines: the value of `key`.
fn field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// `io.stat`: the sums of `rbytes=` and `wbytes=` over its devices.
fn io_bytes(text: &str) -> (u64, u64) {
    let (mut r, mut w) = (0, 0);
    for word in text.split_whitespace() {
        if let Some(v) = word.strip_prefix("rbytes=") {
            r += v.parse::<u64>().unwrap_or(0);
        } else if let Some(v) = word.strip_prefix("wbytes=") {
            w += v.parse::<u64>().unwrap_or(0);
        }
    }
    (r, w)
}

fn read(dir: &Path, name: &str) -> Option<String> {
    std::fs::read_to_string(dir.join(name)).ok()
}

/// Reads what `dir` (a cgroup) used.
pub fn usage(dir: &Path) -> CgroupUsage {
    let cpu = read(dir, "cpu.stat");
    let io = read(dir, "io.stat").map(|t| io_bytes(&t));
    let events = read(dir, "memory.events");
    let number = |name| read(dir, name).and_then(|t| t.trim().parse().ok());
    CgroupUsage {
        cpu_user_us: cpu.as_deref().and_then(|t| field(t, "user_usec")),
        cpu_system_us: cpu.as_deref().and_then(|t| field(t, "system_usec")),
        memory_peak_bytes: number("memory.peak"),
        memory_current_bytes: number("memory.current"),
        io_read_bytes: io.map(|(r, _)| r),
        io_write_bytes: io.map(|(_, w)| w),
        oom_kills: events.as_deref().and_then(|t| field(t, "oom_kill")),
    }
}

/// The sum of several cgroups' figures (a figure is `None` if it is for
/// all of them).
pub fn sum<'a>(all: impl IntoIterator<Item = &'a CgroupUsage>) -> CgroupUsage {
    fn add(a: Option<u64>, b: Option<u64>) -> Option<u64> {
        match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        }
    }
    all.into_iter()
        .fold(CgroupUsage::default(), |t, u| CgroupUsage {
            cpu_user_us: add(t.cpu_user_us, u.cpu_user_us),
            cpu_system_us: add(t.cpu_system_us, u.cpu_system_us),
            memory_peak_bytes: add(t.memory_peak_bytes, u.memory_peak_bytes),
            memory_current_bytes: add(t.memory_current_bytes, u.memory_current_bytes),
            io_read_bytes: add(t.io_read_bytes, u.io_read_bytes),
            io_write_bytes: add(t.io_write_bytes, u.io_write_bytes),
            oom_kills: add(t.oom_kills, u.oom_kills),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_come_from_the_files_and_missing_ones_are_none() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("cpu.stat"),
            "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 0\n",
        )
        .unwrap();
        let u = usage(d.path());
        assert_eq!((u.cpu_user_us, u.cpu_system_us), (Some(1000), Some(500)));
        assert_eq!(u.memory_peak_bytes, None);
        assert_eq!(u.oom_kills, None);
        assert_eq!(u.io_read_bytes, None);
        std::fs::write(d.path().join("memory.peak"), "4096\n").unwrap();
        std::fs::write(
            d.path().join("memory.events"),
            "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n",
        )
        .unwrap();
        std::fs::write(
            d.path().join("io.stat"),
            "254:0 rbytes=100 wbytes=20 rios=1 wios=1 dbytes=0 dios=0\n7:0 rbytes=5 wbytes=0\n",
        )
        .unwrap();
        let u = usage(d.path());
        assert_eq!(u.memory_peak_bytes, Some(4096));
        assert_eq!(u.oom_kills, Some(1));
        assert_eq!((u.io_read_bytes, u.io_write_bytes), (Some(105), Some(20)));
        let s = sum([&u, &CgroupUsage::default(), &u]);
        assert_eq!(s.cpu_user_us, Some(2000));
        assert_eq!(s.memory_current_bytes, None);
    }
}
