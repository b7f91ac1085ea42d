//! The supervisor as PID 1's child: this same binary, `supervise`, with
//! the guest's paths, the kernel command line's options and limits, and
//! restarted with backoff when it dies.

use super::{Settings, GUEST_SOCKET, STORE_ROOT};
use std::process::Command;
use std::time::Duration;

/// A supervisor that stayed up this long starts the restart count again.
pub const STABLE_AFTER: Duration = Duration::from_secs(60);

/// The command that starts the supervisor on a guest of `mem_total` bytes
/// and `pid_max` process ids, with `failpoints` armed if given; it opens
/// the store once the inherited descriptor `store_mounted` reads
/// end-of-file.
pub fn command(
    s: &Settings,
    mem_total: u64,
    pid_max: u64,
    failpoints: Option<&str>,
    store_mounted: i32,
) -> Command {
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg("supervise")
        .args(["--root", STORE_ROOT])
        .args(["--store-mounted-fd", &store_mounted.to_string()])
        .args(["--listen", &format!("unix:{GUEST_SOCKET}")])
        .args(["--listen", &format!("virtio:{}", s.ctl)])
        .args(["--cgroup-root", "/sys/fs/cgroup"])
        .arg("--under-init")
        .args(&s.args)
        .args(s.limits.args(mem_total, pid_max, &s.args))
        .env("ALLOX_LOG", &s.log)
        .env("ALLOX_LOG_FORMAT", if s.log_json { "json" } else { "text" })
        .env("NO_COLOR", "1")
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    if let Some(f) = failpoints {
        cmd.env("ALLOX_FAILPOINTS", f);
    }
    cmd
}

/// How long to wait before the next start after `restarts` restarts in a
/// row: 100 ms, doubling to 5 s.
pub fn restart_delay(restarts: u32) -> Duration {
    Duration::from_millis(100 * (1u64 << restarts.min(6))).min(Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn the_supervisor_gets_the_guests_paths_then_the_command_lines_options() {
        let s = Settings::parse("allox.ctl=org.x allox.log=debug allox.args=--default-pids-max=64");
        let cmd = command(&s, 1 << 30, 32_768, Some("commit.after_rename=crash"), 5);
        let args: Vec<_> = cmd.get_args().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(
            args,
            [
                "supervise",
                "--root",
                "/mnt/store/allox",
                "--store-mounted-fd",
                "5",
                "--listen",
                "unix:/run/allox/ctl.sock",
                "--listen",
                "virtio:org.x",
                "--cgroup-root",
                "/sys/fs/cgroup",
                "--under-init",
                "--default-pids-max=64",
                // Not the default pids limit: the command line gave it.
                "--default-memory-max=536870912",
                "--sessions-pids-max=32512",
                "--sessions-memory-max=939524096",
            ]
        );
        let env: Vec<_> = cmd.get_envs().collect();
        assert!(env.contains(&(OsStr::new("ALLOX_LOG"), Some(OsStr::new("debug")))));
        assert!(env.contains(&(
            OsStr::new("ALLOX_FAILPOINTS"),
            Some(OsStr::new("commit.after_rename=crash"))
        )));
        let restarted = command(&s, 1 << 30, 32_768, None, 5);
        assert!(!restarted
            .get_envs()
            .any(|(k, _)| k == OsStr::new("ALLOX_FAILPOINTS")));
    }

    #[test]
    fn restarts_back_off_from_100_ms_to_5_s() {
        let ms: Vec<_> = (0..9).map(|n| restart_delay(n).as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
    }
}
