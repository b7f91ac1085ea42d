//! `process.list` within its bounds: at most
//! [`ProcessListing::MAX_ENTRIES`] processes and
//! [`ProcessListing::MAX_BYTES`] of them encoded, lowest PIDs first, so
//! that a session with any number of processes, or any command lines,
//! gets an answer that fits one frame and costs the supervisor a bounded
//! amount of memory.

//!
//! Also what rollbacks ask of a session: how many programs it runs, and
//! whether any process (a sandbox init too) is left in it.

use super::{procfs, Runs};
use allox_protocol::{ProcessInfo, ProcessListing};
use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

impl Runs {
    /// The session's live processes (the sandbox inits left out), lowest
    /// PIDs first, within the bounds of one answer ([`bounded`]).
    pub fn list(&self, a: &str, s: &str) -> ProcessListing {
        let mut pids = self.cgroups.procs(&self.cgroups.session_dir(a, s));
        let set: HashSet<i32> = pids.iter().copied().collect();
        pids.sort_unstable();
        pids.dedup();
        // Details are read only for the processes that are listed.
        let infos = pids
            .into_iter()
            .filter(|&p| procfs::ppid(p).is_some_and(|pp| set.contains(&pp)))
            .filter_map(procfs::info);
        let mut l = bounded(
            infos,
            ProcessListing::MAX_ENTRIES,
            ProcessListing::MAX_BYTES,
        );
        // What the plugins said about each listed run (a few short pairs
        // a run: well inside the frame the bounds leave room for).
        let table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        for run in l.processes.iter().filter_map(|p| p.run_id.as_deref()) {
            match table.get(&super::key(a, s, run)) {
                Some(r) if !r.metadata.is_empty() => {
                    l.run_metadata
                        .entry(run.to_string())
                        .or_insert_with(|| r.metadata.iter().cloned().collect());
                }
                _ => {}
            }
        }
        l
    }

    /// How many of the session's processes are the agent's (the sandbox
    /// inits are not counted).
    pub fn live(&self, a: &str, s: &str) -> usize {
        self.programs_in(&self.cgroups.session_dir(a, s))
    }

    /// How many programs (processes but the sandboxes' PID 1s) are in
    /// `dir` and below, from the cgroup files alone: a populated run's
    /// cgroup holds its PID 1 and its programs (the PID 1 lives as long as
    /// any of them, and a context's cgroup holds no program), so no /proc
    /// file is read per process — this is on the way of every kill.
    pub(super) fn programs_in(&self, dir: &Path) -> usize {
        run_programs(dir).iter().map(|(_, n)| n).sum()
    }

    /// Waits (blocking) up to `limit` for the session to hold no process,
    /// sandbox inits included.
    pub fn wait_unoccupied(&self, a: &str, s: &str, limit: Duration) {
        let until = Instant::now() + limit;
        while self.occupied(a, s) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether the session has any process at all, sandbox inits included
    /// (a run still being set up counts).
    /// Live runs, and the programs in them (the sandboxes' PID 1s not
    /// counted), over every session: a run is live while its program has
    /// not ended, or while it holds a program still (one it left going:
    /// a `setsid` daemon; or a run an earlier supervisor started). One
    /// cgroup file per run.
    pub fn live_counts(&self) -> (usize, usize) {
        let mut live: HashSet<std::path::PathBuf> = self
            .table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|r| r.result.borrow().is_none())
            .map(|r| self.cgroups.run_dir(&r.agent, &r.session, &r.id))
            .collect();
        let found = run_programs(self.cgroups.base());
        let programs = found.iter().map(|(_, n)| n).sum();
        live.extend(found.into_iter().filter(|(_, n)| *n > 0).map(|(d, _)| d));
        (live.len(), programs)
    }

    pub fn occupied(&self, a: &str, s: &str) -> bool {
        !self
            .cgroups
            .procs(&self.cgroups.session_dir(a, s))
            .is_empty()
    }
}

/// Each run's cgroup in `dir` and below (`dir` itself if it is one), and
/// how many programs (processes but the sandbox's PID 1) it holds, from
/// the cgroup files alone: a populated run's cgroup holds its PID 1 and
/// its programs (the PID 1 lives as long as any of them, and a context's
/// cgroup holds no program), so no /proc file is read per process — this
/// is on the way of every kill.
pub(super) fn run_programs(dir: &Path) -> Vec<(std::path::PathBuf, usize)> {
    fn walk(dir: &Path, is_run: bool, out: &mut Vec<(std::path::PathBuf, usize)>) {
        if is_run {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            out.push((dir.to_path_buf(), procs.lines().count().saturating_sub(1)));
        }
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                let run = e.file_name().to_string_lossy().starts_with("run-");
                walk(&e.path(), run, out);
            }
        }
    }
    let is_run = dir
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("run-"));
    let mut out = Vec::new();
    walk(dir, is_run, &mut out);
    out
}

/// Bytes `info` takes on the wire.
fn wire_size(info: &ProcessInfo) -> usize {
    // Counting cannot fail: the flavor has no capacity to run out of.
    postcard::serialize_with_flavor(info, postcard::ser_flavors::Size::default()).unwrap_or(0)
}

/// Takes processes from `infos` (in the order they are to be listed) while
/// they fit the bounds; the rest are not even looked at.
pub fn bounded(
    infos: impl Iterator<Item = ProcessInfo>,
    max_entries: usize,
    max_bytes: usize,
) -> ProcessListing {
    let mut processes = Vec::new();
    let mut bytes = 0;
    for info in infos {
        let size = wire_size(&info);
        if processes.len() == max_entries || bytes + size > max_bytes {
            return ProcessListing {
                processes,
                truncated: true,
                run_metadata: Default::default(),
            };
        }
        bytes += size;
        processes.push(info);
    }
    ProcessListing {
        processes,
        truncated: false,
        run_metadata: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(pid: i32, arg_len: usize) -> ProcessInfo {
        ProcessInfo {
            pid,
            ppid: 1,
            argv: vec!["x".repeat(arg_len)],
            run_id: Some("18c2f3a4b5d0001".into()),
            started_ms: 1_700_000_000_000,
            argv_truncated: false,
        }
    }

    #[test]
    fn a_listing_stops_at_its_entry_limit() {
        let l = bounded((1..=100_000).map(|p| info(p, 8)), 4096, usize::MAX);
        assert!(l.truncated);
        assert_eq!(l.processes.len(), 4096);
        assert_eq!(l.processes.last().map(|p| p.pid), Some(4096));
        let l = bounded((1..=10).map(|p| info(p, 8)), 4096, usize::MAX);
        assert!(!l.truncated);
        assert_eq!(l.processes.len(), 10);
    }

    #[test]
    fn a_listing_of_long_command_lines_fits_one_frame() {
        let l = bounded(
            (1..=100_000).map(|p| info(p, ProcessInfo::ARGV_MAX - 1)),
            ProcessListing::MAX_ENTRIES,
            ProcessListing::MAX_BYTES,
        );
        assert!(l.truncated);
        assert!(l.processes.len() > 100, "{}", l.processes.len());
        let frame = allox_protocol::encode(&allox_protocol::ServerFrame::Response(
            allox_protocol::ResponseEnvelope {
                conversation: u64::MAX,
                request_id: u64::MAX,
                outcome: allox_protocol::Outcome::Ok(allox_protocol::Response::Processes(l)),
            },
        ))
        .expect("the answer fits one frame");
        assert!(frame.len() <= allox_protocol::MAX_FRAME);
    }
}
