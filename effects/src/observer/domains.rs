//! Each domain's capture, the differences beyond captures (processes left
//! behind), and who made each difference.
//!
//! Where a domain looks:
//! * `sysctl`, `network`: the machine's namespace (the observer's), and the
//!   session's network namespace (its context's) when it has its own, its
//!   keys prefixed `session `;
//! * `mount`: the observer's mount namespace (`machine`) and the session
//!   context's (`session`);
//! * `bpf`, `modules`: the kernel's, one for all;
//! * `filesystem`: a hashing walk of each scope path, keys prefixed with
//!   the path;
//! * `processes`: at B, the processes of the run's history (by their
//!   forks) still alive; survivors are added as left behind.

use super::wire::Begin;
use crate::collect::fanotify::{Observed, Owner, Watch};
use crate::collect::snapshots::{self, Who};
use crate::collect::{self, Capture, Difference};
use allox_protocol::{Attribution, EffectChangeKind, EffectsDomain, HistoryRecord, Survivor};
use std::collections::HashSet;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

/// The filesystem watch (fanotify) from before A to B: the filesystems of
/// the agent's workspace (for `shared/`) and of the scope's paths.
pub struct FsWatch {
    watch: Watch,
}

/// What the watch saw.
pub struct FsSeen {
    pub observed: Observed,
}

impl FsWatch {
    pub fn start(begin: &Begin) -> Result<Option<FsWatch>, String> {
        let mut paths: Vec<PathBuf> = vec![begin.agent_workspace.clone()];
        if begin.scope.observes(EffectsDomain::Filesystem) {
            paths.extend(begin.scope.paths.iter().cloned());
        }
        Watch::start(&paths)
            .map(|watch| Some(FsWatch { watch }))
            .map_err(|e| format!("watch the filesystems: {e}"))
    }

    pub fn stop(self) -> FsSeen {
        FsSeen {
            observed: self.watch.stop(),
        }
    }
}

/// The session's network namespace, when it is not the observer's.
fn session_netns(begin: &Begin) -> Option<std::fs::File> {
    let pid = begin.context_pid?;
    let theirs = std::fs::File::open(format!("/proc/{pid}/ns/net")).ok()?;
    let ours = std::fs::metadata("/proc/self/ns/net").ok()?;
    use std::os::unix::fs::MetadataExt;
    let t = theirs.metadata().ok()?;
    (t.ino() != ours.ino() || t.dev() != ours.dev()).then_some(theirs)
}

/// Merges `other` into `c`, its keys prefixed.
fn merge_prefixed(c: &mut Capture, other: Capture, prefix: &str) {
    for (k, v) in other.items {
        c.items.insert(format!("{prefix}{k}"), v);
    }
    c.gaps
        .extend(other.gaps.into_iter().map(|g| format!("{prefix}{g}")));
}

/// `d`'s capture now, for the domains captured as items (`None` for
/// `workspace` and `shared`, compared by their snapshots). `at_b`: the
/// run's tree has exited.
pub fn capture(d: EffectsDomain, begin: &Begin, history: &[HistoryRecord]) -> Option<Capture> {
    let volatile: Vec<&str> = collect::sysctl::VOLATILE
        .iter()
        .copied()
        .chain(begin.scope.volatile_sysctls.iter().map(String::as_str))
        .collect();
    Some(match d {
        EffectsDomain::Workspace | EffectsDomain::Shared => return None,
        EffectsDomain::Sysctl => {
            let mut c = collect::sysctl::capture(None, &volatile);
            if let Some(ns) = session_netns(begin) {
                merge_prefixed(
                    &mut c,
                    collect::sysctl::capture(Some(ns.as_fd()), &volatile),
                    "session ",
                );
            }
            c
        }
        EffectsDomain::Network => {
            let mut c = collect::network::capture(None);
            if let Some(ns) = session_netns(begin) {
                merge_prefixed(
                    &mut c,
                    collect::network::capture(Some(ns.as_fd())),
                    "session ",
                );
            }
            c
        }
        EffectsDomain::Mount => {
            let me = std::process::id() as i32;
            let mut pids = vec![("machine", me)];
            if let Some(p) = begin.context_pid {
                pids.push(("session", p));
            }
            collect::mounts::capture(&pids)
        }
        EffectsDomain::Bpf => collect::bpf::capture(),
        EffectsDomain::Modules => collect::modules::capture(),
        EffectsDomain::Filesystem => {
            let mut c = Capture::new();
            let limits = collect::tree::TreeLimits::default();
            for p in &begin.scope.paths {
                merge_prefixed(
                    &mut c,
                    collect::tree::capture(p, &limits),
                    &format!("{}/", p.display()),
                );
            }
            c
        }
        EffectsDomain::Processes => processes(history),
    })
}

/// The processes the run's history saw forked or exec'd and did not see
/// exit, that are still alive (the same pid, started after the run).
fn processes(history: &[HistoryRecord]) -> Capture {
    let mut c = Capture::new();
    let mut pids: Vec<u32> = Vec::new();
    let mut exited: HashSet<u32> = HashSet::new();
    for r in history {
        match r.kind.as_str() {
            "fork" | "exec" => pids.push(r.pid),
            "exit" => {
                exited.insert(r.pid);
            }
            _ => {}
        }
    }
    pids.sort_unstable();
    pids.dedup();
    for pid in pids {
        if exited.contains(&pid) {
            continue;
        }
        if let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) {
            c.insert(format!("pid {pid}"), comm.trim().to_string());
        }
    }
    c
}

/// Differences and gaps a domain has beyond its captures.
#[derive(Default)]
pub struct Extra {
    pub differences: Vec<Difference>,
    pub gaps: Vec<String>,
}

pub fn extra(
    d: EffectsDomain,
    _begin: &Begin,
    _history: &[HistoryRecord],
    fs: Option<&FsSeen>,
    survivors: &[Survivor],
) -> Extra {
    let mut e = Extra::default();
    match d {
        EffectsDomain::Processes => {
            for s in survivors {
                e.differences.push(Difference {
                    key: format!("pid {} {}", s.pid, s.comm),
                    kind: EffectChangeKind::Removed,
                    before: Some(format!(
                        "alive after the run's program ended (lineage {})",
                        s.lineage
                            .iter()
                            .map(|p| p.to_string())
                            .collect::<Vec<_>>()
                            .join(" < ")
                    )),
                    after: Some("killed before B".into()),
                });
            }
        }
        EffectsDomain::Filesystem => match fs {
            Some(f) if !f.observed.is_complete() => e.gaps.push(format!(
                "the filesystem watch missed events (overflowed: {}, dropped: {})",
                f.observed.overflowed, f.observed.dropped
            )),
            None => e.gaps.push("the filesystem watch did not run".into()),
            _ => {}
        },
        _ => {}
    }
    e
}

/// The system calls (and hooks) whose success makes a change of domain
/// `d` the run's.
fn calls_of(d: EffectsDomain) -> &'static [&'static str] {
    match d {
        EffectsDomain::Bpf => &["bpf"],
        EffectsDomain::Mount => &[
            "mount",
            "umount2",
            "move_mount",
            "fsmount",
            "fsconfig",
            "open_tree",
            "pivot_root",
            "sb_mount",
        ],
        EffectsDomain::Modules => &[
            "init_module",
            "finit_module",
            "delete_module",
            "kernel_read_file",
            "kernel_load_data",
        ],
        EffectsDomain::Network => &["netlink_send", "socket"],
        EffectsDomain::Sysctl => &["sysctl"],
        _ => &[],
    }
}

/// The name of the call or hook a record is about: its detail's first
/// word before `(` or ` `.
fn call_name(r: &HistoryRecord) -> &str {
    let d = r.detail.as_deref().unwrap_or("");
    let end = d
        .find(|c: char| c == '(' || c == ' ' || c == '=')
        .unwrap_or(d.len());
    &d[..end]
}

/// Who made `diff`: for `workspace`, the run (it holds its session
/// alone); for `shared` and `filesystem`, the writer the watch saw; for
/// the other domains, the run when its history holds a successful call
/// that makes such a change, else nobody known.
pub fn attribute(
    d: EffectsDomain,
    begin: &Begin,
    diff: &Difference,
    history: &[HistoryRecord],
    fs: Option<&FsSeen>,
) -> Attribution {
    match d {
        EffectsDomain::Workspace | EffectsDomain::Processes => Attribution::run(&begin.run),
        EffectsDomain::Shared | EffectsDomain::Filesystem => {
            let Some(fs) = fs else {
                return Attribution::unknown();
            };
            let (root, key) = match d {
                EffectsDomain::Shared => (begin.agent_workspace.join("shared"), diff.key.clone()),
                _ => match begin.scope.paths.iter().find_map(|p| {
                    diff.key
                        .strip_prefix(&format!("{}/", p.display()))
                        .map(|k| (p.clone(), k.to_string()))
                }) {
                    Some(x) => x,
                    None => return Attribution::unknown(),
                },
            };
            let run_pids: HashSet<u32> = history.iter().map(|r| r.pid).collect();
            let owner = Owner {
                agent: Some(begin.agent.clone()),
                session: Some(begin.session.clone()),
                run: Some(begin.run.clone()),
            };
            let one = Difference {
                key,
                kind: diff.kind,
                before: None,
                after: None,
            };
            let got = snapshots::attribute(
                &[one],
                &root,
                &fs.observed.events,
                &run_pids,
                &owner,
                cgroup_root(begin),
            );
            match got.first().map(|(_, w)| w) {
                Some(Who::Run) => Attribution::run(&begin.run),
                Some(Who::Session(o)) => Attribution::session(
                    o.agent.as_deref().unwrap_or("?"),
                    o.session.as_deref().unwrap_or("?"),
                    o.run.as_deref(),
                ),
                _ => Attribution::unknown(),
            }
        }
        _ => {
            let calls = calls_of(d);
            if history
                .iter()
                .any(|r| !r.refused && calls.contains(&call_name(r)))
            {
                Attribution::run(&begin.run)
            } else {
                Attribution::unknown()
            }
        }
    }
}

fn cgroup_root(begin: &Begin) -> &Path {
    &begin.cgroup_root
}
