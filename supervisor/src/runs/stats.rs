//! What runs and sessions use (`RunResult.usage`, `session.stats`), read
//! from their cgroups, and changing a live session's limits
//! (`session.update`).

use super::{RunError, Runs};
use allox_protocol::{RunUsage, SessionLimits, SessionStats, Usage};
use allox_sandbox::cgroup::Limits;
use allox_sandbox::usage::{sum, usage, CgroupUsage};
use std::path::Path;

/// The protocol's form of a cgroup's figures.
pub(crate) fn usage_of(u: &CgroupUsage) -> Usage {
    Usage {
        cpu_user_us: u.cpu_user_us,
        cpu_system_us: u.cpu_system_us,
        memory_peak_bytes: u.memory_peak_bytes,
        io_read_bytes: u.io_read_bytes,
        io_write_bytes: u.io_write_bytes,
        oom_kills: u.oom_kills,
    }
}

/// A limit file: a number, or `None` for `max` or no file.
fn limit(dir: &Path, name: &str) -> Option<u64> {
    std::fs::read_to_string(dir.join(name))
        .ok()
        .and_then(|t| t.trim().parse().ok())
}

fn limits_of(dir: &Path) -> SessionLimits {
    SessionLimits {
        pids_max: limit(dir, "pids.max"),
        memory_max: limit(dir, "memory.max"),
        cpu_max: std::fs::read_to_string(dir.join("cpu.max"))
            .ok()
            .map(|t| t.trim().to_string())
            .filter(|t| !t.starts_with("max")),
    }
}

impl Runs {
    /// `session.stats` of `a/s` (which the caller checked exists).
    pub fn session_stats(&self, a: &str, s: &str) -> SessionStats {
        let dir = self.cgroups.session_dir(a, s);
        // Live runs: those whose program has not ended (their cgroups
        // outlive their results a moment), and those that hold a program
        // still (one a run left going, a `setsid` daemon; or a run an
        // earlier supervisor started): what they use is the session's now.
        let mut ids: std::collections::BTreeSet<String> = self
            .table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|r| r.agent == a && r.session == s && r.result.borrow().is_none())
            .map(|r| r.id.clone())
            .collect();
        let found = super::listing::run_programs(&dir);
        let processes: usize = found.iter().map(|(_, n)| n).sum();
        ids.extend(found.iter().filter(|(_, n)| *n > 0).filter_map(|(d, _)| {
            d.file_name()?
                .to_str()?
                .strip_prefix("run-")
                .map(str::to_string)
        }));
        let live: Vec<CgroupUsage> = ids
            .iter()
            .map(|r| usage(&self.cgroups.run_dir(a, s, r)))
            .collect();
        let total = usage(&dir);
        SessionStats {
            agent_id: a.into(),
            session_id: s.into(),
            live_runs: live.len() as u32,
            processes: processes as u32,
            memory_current_bytes: total.memory_current_bytes,
            now: usage_of(&sum(&live)),
            runs: ids
                .iter()
                .zip(&live)
                .map(|(id, u)| RunUsage {
                    run_id: id.clone(),
                    usage: usage_of(u),
                    memory_current_bytes: u.memory_current_bytes,
                })
                .collect(),
            total: usage_of(&total),
            limits: limits_of(&dir),
        }
    }

    /// The limits of session `a/s` that differ from this daemon's default
    /// for a session: what it was given itself, which an export carries.
    pub fn own_limits(&self, a: &str, s: &str) -> Limits {
        let now = self.cgroups.limits(a, s);
        let d = &self.cfg.limits;
        Limits {
            pids_max: now.pids_max.filter(|v| Some(*v) != d.pids_max),
            // The kernel keeps memory.max in whole pages.
            memory_max: now
                .memory_max
                .filter(|v| Some(*v) != d.memory_max.map(|d| d - d % page_size())),
            cpu_max: now.cpu_max.filter(|v| Some(*v) != d.cpu_max),
        }
    }

    /// Keeps session `a/s`'s own limits, as its cgroup now holds them,
    /// with the session in the store ([`Runs::restore_limits`] gives them
    /// back to a cgroup made again). A failure is logged: the limits hold
    /// until the cgroup goes.
    pub fn keep_limits(&self, store: &allox_store::Store, a: &str, s: &str) {
        let l = self.own_limits(a, s);
        let r = allox_store::rows::LimitsRecord {
            pids_max: l.pids_max,
            memory_max: l.memory_max,
            cpu_max: l.cpu_max,
        };
        if let Err(e) = store.keep_limits(a, s, &r) {
            tracing::warn!(agent = a, session = s, error = %e.chain(),
                "cannot keep the session's limits: a cgroup made again (after a boot) gets the daemon's");
        }
    }

    /// Gives every session whose limits the store keeps its cgroup with
    /// them: after a boot (the guest's cgroups live in memory) or a
    /// host's reboot the cgroups are made again, and got the daemon's
    /// defaults before. A session whose limits cannot be set is logged.
    pub fn restore_limits(&self, store: &allox_store::Store) {
        let kept = match store.kept_limits() {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!(error = %e.chain(), "cannot read the sessions' kept limits");
                return;
            }
        };
        for (a, s, r) in kept {
            let l = Limits {
                pids_max: r.pids_max,
                memory_max: r.memory_max,
                cpu_max: r.cpu_max,
            };
            let set = self
                .cgroups
                .ensure_session(&a, &s, &self.cfg.limits)
                .and_then(|()| self.cgroups.set_limits(&a, &s, &l));
            if let Err(e) = set {
                tracing::warn!(agent = %a, session = %s, error = %e,
                    "cannot give the session its kept limits; it runs under the daemon's");
            }
        }
    }

    /// `session.update`: writes the limits given on the session's cgroup
    /// (refused with `unsupported`, naming the controller, where it is
    /// missing); a limit below what the session uses now stops what comes
    /// next (a fork past `pids.max` fails, memory is reclaimed or the OOM
    /// killer acts), it kills nothing itself.
    pub fn session_update(&self, a: &str, s: &str, limits: &Limits) -> Result<(), RunError> {
        self.cgroups
            .ensure_session(a, s, &self.cfg.limits)
            .and_then(|()| self.cgroups.set_limits(a, s, limits))
            .map_err(RunError::Cgroup)
    }
}

/// The size of a memory page.
fn page_size() -> u64 {
    rustix::param::page_size() as u64
}
