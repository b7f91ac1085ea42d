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
use crate::collect::fanotify::{Observed, Owner, Watch, WatchOptions};
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
        let mut opts = WatchOptions::default();
        if begin.scope.observes(EffectsDomain::Filesystem) {
            paths.extend(begin.scope.paths.iter().cloned());
        } else {
            // Only `shared/` is asked about: the events of the agent's
            // workspace subvolume are all that is kept (a session's
            // `current/` and the store's state are subvolumes of their
            // own, found by the snapshots).
            opts.subvolumes = own_subvolume(&begin.agent_workspace).map(|v| HashSet::from([v]));
        }
        Watch::start_with(&paths, opts)
            .map(|watch| Some(FsWatch { watch }))
            .map_err(|e| format!("watch the filesystems: {e}"))
    }

    pub fn stop(self) -> FsSeen {
        FsSeen {
            observed: self.watch.stop(),
        }
    }
}

/// The Btrfs subvolume `dir` is in; `None` off Btrfs or when it cannot be
/// told (every event is then kept).
fn own_subvolume(dir: &Path) -> Option<u64> {
    allox_store::btrfs::check_btrfs(dir).ok()?;
    allox_store::btrfs::subvolume_id(dir).ok()
}

/// The session's network namespace, when it is not the observer's.
fn session_netns(context_pid: Option<i32>) -> Option<std::fs::File> {
    let pid = context_pid?;
    let theirs = std::fs::File::open(format!("/proc/{pid}/ns/net")).ok()?;
    let ours = std::fs::metadata("/proc/self/ns/net").ok()?;
    use std::os::unix::fs::MetadataExt;
    let t = theirs.metadata().ok()?;
    (t.ino() != ours.ino() || t.dev() != ours.dev()).then_some(theirs)
}

/// Runs `job` on the observer's sysctl thread, which has a descriptor
/// table of its own (`unshare(CLONE_FILES)`, every descriptor it was
/// copied with closed but standard output and error), and waits for its
/// capture.
///
/// The sysctl collector keeps a thousand `/proc/sys` descriptors per
/// namespace between captures (its `KEPT`); in the
/// process's own table they would be listed each time any observer's
/// descriptors are ([`held_by_observers`] lists every observer's, twice a
/// run: a thousand directory entries per observer, each looked up). Kept
/// in that thread's table, `/proc/PID/fd` does not show them. Where the
/// table cannot be made the job runs in the process's table (as the
/// collector does outside the observer).
#[allow(unsafe_code)]
fn in_own_table(job: impl FnOnce() -> Capture + Send + 'static) -> Capture {
    type Job = Box<dyn FnOnce() -> Capture + Send>;
    type Asked = (Job, std::sync::mpsc::SyncSender<Capture>);
    static THREAD: std::sync::OnceLock<Option<std::sync::Mutex<std::sync::mpsc::Sender<Asked>>>> =
        std::sync::OnceLock::new();
    let sender = THREAD.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Asked>();
        std::thread::Builder::new()
            .name("sysctl".into())
            .spawn(move || {
                // SAFETY: unshare(2) with CLONE_FILES only gives this
                // thread a copy of the descriptor table.
                if unsafe { libc::unshare(libc::CLONE_FILES) } == 0 {
                    // The copies of the process's descriptors (its
                    // conversation, its BPF objects) must not be held
                    // here: closing one elsewhere would not close it.
                    // SAFETY: this thread owns no descriptor yet; the
                    // table closed is its own.
                    unsafe {
                        libc::syscall(libc::SYS_close_range, 0u32, 0u32, 0u32);
                        libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
                    }
                }
                for (job, answer) in rx {
                    let _ = answer.send(job());
                }
            })
            .ok()
            .map(|_| std::sync::Mutex::new(tx))
    });
    let job: Job = Box::new(job);
    let Some(sender) = sender else {
        return job();
    };
    let (atx, arx) = std::sync::mpsc::sync_channel(1);
    let sent = sender
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((job, atx));
    match sent {
        Ok(()) => arx.recv().unwrap_or_else(|_| {
            let mut c = Capture::new();
            c.gap("sysctl: the capture's thread ended".to_string());
            c
        }),
        Err(std::sync::mpsc::SendError((job, _))) => job(),
    }
}

/// Merges `other` into `c`, its keys prefixed.
fn merge_prefixed(c: &mut Capture, other: Capture, prefix: &str) {
    // Built at once (one prefix keeps the keys in order) and merged in
    // one pass.
    let mut theirs: std::collections::BTreeMap<String, String> = other
        .items
        .into_iter()
        .map(|(k, v)| (format!("{prefix}{k}"), v))
        .collect();
    c.items.append(&mut theirs);
    c.gaps
        .extend(other.gaps.into_iter().map(|g| format!("{prefix}{g}")));
}

/// `d`'s capture now, for the domains captured as items (`None` for
/// `workspace` and `shared`, compared by their snapshots); `own`: this
/// observer's BPF objects, left out of `bpf`.
pub fn capture(
    d: EffectsDomain,
    begin: &Begin,
    history: &[HistoryRecord],
    own: &HashSet<String>,
) -> Option<Capture> {
    let volatile: Vec<&str> = collect::sysctl::VOLATILE
        .iter()
        .copied()
        .chain(begin.scope.volatile_sysctls.iter().map(String::as_str))
        .collect();
    Some(match d {
        EffectsDomain::Workspace | EffectsDomain::Shared => return None,
        EffectsDomain::Sysctl => {
            let volatile: Vec<String> = volatile.iter().map(|v| v.to_string()).collect();
            let context_pid = begin.context_pid;
            in_own_table(move || {
                let volatile: Vec<&str> = volatile.iter().map(String::as_str).collect();
                let mut c = collect::sysctl::capture(None, &volatile);
                if let Some(ns) = session_netns(context_pid) {
                    merge_prefixed(
                        &mut c,
                        collect::sysctl::capture(Some(ns.as_fd()), &volatile),
                        "session ",
                    );
                }
                c
            })
        }
        EffectsDomain::Network => {
            let mut c = collect::network::capture(None);
            if let Some(ns) = session_netns(begin.context_pid) {
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
        EffectsDomain::Bpf => {
            // The observers' own objects (this one's and any other's) are
            // not the machine's state. Listed under the registry's lock,
            // which an observer holds while it makes or drops objects of
            // its own until they are listed or held; and told after the
            // listing, so that every object listed that an observer holds
            // is known as its own.
            let listing = super::history::lock_registry(&begin.registry, false);
            let mut c = collect::bpf::capture();
            if !listing.held {
                c.gap(format!(
                    "bpf: the observers' registry {} stayed locked for {:?}: an object another observer was making or dropping may be listed",
                    begin.registry.display(),
                    super::history::LOCK_WAIT
                ));
            }
            let mut mine = super::history::registered(&begin.registry);
            mine.extend(own.iter().cloned());
            let held = held_by_observers(begin.supervisor_pid, &begin.registry, &mine);
            mine.extend(held);
            c.items
                .retain(|k, v| !mine.contains(k) && !observers_link(k, v, &mine));
            c
        }
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
        // A zombie has ended: only its parent's wait is left.
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|st| st[st.rfind(')')? + 1..].trim_start().chars().next());
        if matches!(state, Some('Z' | 'X') | None) {
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

/// How the `processes` domain lists a survivor (frozen, listed, killed
/// before B): the verifier recomputes it from the `verdict` record.
pub fn survivor_difference(s: &Survivor) -> Difference {
    Difference {
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
    }
}

pub fn extra(d: EffectsDomain, fs: Option<&FsSeen>, survivors: &[Survivor]) -> Extra {
    let mut e = Extra::default();
    match d {
        EffectsDomain::Processes => {
            e.differences
                .extend(survivors.iter().map(survivor_difference));
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

/// nfnetlink's batch begin (subsystem 0, message 16).
const NFNL_MSG_BATCH_BEGIN: u64 = 16;
/// nf_tables messages that make or delete: NEW and DEL of tables, chains,
/// rules, sets, set elements, objects and flowtables.
const NFT_CHANGES: [u64; 14] = [0, 2, 3, 5, 6, 8, 9, 11, 12, 14, 18, 20, 22, 24];

/// Whether history record `r` is the run making (or attempting, for the
/// LSM hooks, which see a request before the kernel decides) a change of
/// domain `d`: a system call that succeeded, or a hook's record.
fn changes(d: EffectsDomain, r: &HistoryRecord) -> bool {
    let detail = r.detail.as_deref().unwrap_or("");
    if r.kind == "syscall" {
        if r.refused {
            return false;
        }
        let name = &detail[..detail.find('(').unwrap_or(detail.len())];
        // A bpf command that makes an object, not one that reads.
        if name == "bpf" {
            return d == EffectsDomain::Bpf
                && [
                    "BPF_MAP_CREATE",
                    "BPF_PROG_LOAD",
                    "BPF_OBJ_PIN",
                    "BPF_LINK_CREATE",
                    "BPF_PROG_ATTACH",
                    "BPF_RAW_TRACEPOINT_OPEN",
                    "BPF_BTF_LOAD",
                ]
                .iter()
                .any(|c| detail.contains(c));
        }
        // A netlink socket: what `ip` and its kind talk to the kernel's
        // network configuration through.
        if name == "socket" {
            return d == EffectsDomain::Network && detail.contains("AF_NETLINK");
        }
        let calls: &[&str] = match d {
            EffectsDomain::Mount => &[
                "mount",
                "umount2",
                "move_mount",
                "fsmount",
                "pivot_root",
                "mount_setattr",
            ],
            EffectsDomain::Modules => &["init_module", "finit_module", "delete_module"],
            _ => &[],
        };
        return calls.contains(&name);
    }
    match (d, r.kind.as_str()) {
        (EffectsDomain::Mount, "mount") => true,
        (EffectsDomain::Modules, "kernel_read_file" | "kernel_load_data") => {
            detail.contains("module")
        }
        (EffectsDomain::Sysctl, "sysctl") => detail.starts_with("write "),
        // rtnetlink (protocol 0): a message that makes, deletes or sets
        // (types from 16 in fours: new, del, get, set). nfnetlink
        // (protocol 12): a batch (how `nft` sends every change), or an
        // nf_tables message that makes or deletes.
        (EffectsDomain::Network, "netlink_send") => {
            let nums: Vec<u64> = detail
                .split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect();
            match nums.as_slice() {
                [0, t, ..] => *t >= 16 && (*t - 16) % 4 != 2,
                [12, t, ..] => {
                    *t == NFNL_MSG_BATCH_BEGIN
                        || (*t >> 8 == 10 && NFT_CHANGES.contains(&(*t & 0xff)))
                }
                _ => false,
            }
        }
        _ => false,
    }
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
            // The run's own write opens (the BPF LSM's `file_open`) name
            // the file as the sandbox sees it.
            if d == EffectsDomain::Shared && wrote_shared(history, &diff.key) {
                return Attribution::run(&begin.run);
            }
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
                key: key.clone(),
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
                // A writer gone before its cgroup could be read: another
                // observed run's history may name it.
                _ => last_writer(&root, &key, &fs.observed.events)
                    .and_then(|pid| other_run_with(begin, pid))
                    .unwrap_or_else(Attribution::unknown),
            }
        }
        EffectsDomain::Sysctl => {
            if sysctl_by_run(diff, history) {
                Attribution::run(&begin.run)
            } else {
                Attribution::unknown()
            }
        }
        _ => {
            if history.iter().any(|r| changes(d, r)) {
                Attribution::run(&begin.run)
            } else {
                Attribution::unknown()
            }
        }
    }
}

/// Whether a sysctl difference is the run's: a value it wrote itself (the
/// `cgroup/sysctl` record names it; in whichever network namespace), a
/// `net.*` value after it changed the network configuration (a device's
/// values follow it), any value after it loaded or removed a module; an
/// entry added or removed (a device's or a module's tables) after it
/// did any of these. Another value changed meanwhile is not the run's
/// (the machine's, or a process's outside every sandbox: `unknown`).
fn sysctl_by_run(diff: &Difference, history: &[HistoryRecord]) -> bool {
    let key = diff.key.strip_prefix("session ").unwrap_or(&diff.key);
    let network = history.iter().any(|r| changes(EffectsDomain::Network, r));
    let modules = history.iter().any(|r| changes(EffectsDomain::Modules, r));
    let wrote = |k: &str| {
        history
            .iter()
            .filter(|r| changes(EffectsDomain::Sysctl, r))
            .filter_map(|r| sysctl_written(r.detail.as_deref()?))
            .any(|w| w == k)
    };
    match diff.kind {
        EffectChangeKind::Modified => wrote(key) || modules || (network && key.starts_with("net.")),
        _ => modules || network || history.iter().any(|r| changes(EffectsDomain::Sysctl, r)),
    }
}

/// The key (as the sysctl domain names it: `net.ipv4.conf.eth0/100.forwarding`)
/// of a sysctl record's write (`write net/ipv4/conf/eth0.100/forwarding = "1"`).
fn sysctl_written(detail: &str) -> Option<String> {
    let rest = detail.strip_prefix("write ")?;
    let name = &rest[..rest.find(" = ").unwrap_or(rest.len())];
    Some(
        name.split('/')
            .filter(|c| !c.is_empty())
            .map(|c| c.replace('.', "/"))
            .collect::<Vec<_>>()
            .join("."),
    )
}

fn cgroup_root(begin: &Begin) -> &Path {
    &begin.cgroup_root
}

/// The BPF objects (`prog N`, `map N`, `link N`) that the supervisor
/// holds descriptors of now, and the links of the other observers' own
/// programs (`registered`: a run's sysctl link, held from when it is made
/// under the registry's lock) that they hold: not the machine's state.
/// Another observer's other descriptors are not its own objects (its bpf
/// capture opens each pinned object a moment). Objects an observer makes
/// while it loads are made and listed under the registry's lock, which a
/// capture waits for. (This observer's own are known without reading its
/// descriptors: [`super::history::History::objects`].)
fn held_by_observers(
    supervisor: u32,
    registry: &Path,
    registered: &HashSet<String>,
) -> HashSet<String> {
    let mut out = HashSet::new();
    let pids = super::history::listed_observers(registry);
    for pid in std::iter::once(supervisor).chain(pids) {
        let observer = pid != supervisor;
        // Only BPF descriptors are read: an observer keeps a thousand
        // `/proc/sys` files open, at `KEPT_FD_BASE` and above, whose
        // `fdinfo` would cost a read each. A BPF descriptor up there (only
        // with thousands of others below it) would be missed and its
        // object counted as the machine's: a change too many, never one
        // hidden.
        for f in std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let n = f.file_name().to_str().and_then(|s| s.parse::<i32>().ok());
            if n.is_none_or(|n| n >= crate::collect::sysctl::KEPT_FD_BASE) {
                continue;
            }
            let bpf = std::fs::read_link(f.path())
                .map(|t| {
                    t.as_os_str()
                        .as_encoded_bytes()
                        .starts_with(b"anon_inode:bpf")
                })
                .unwrap_or(false);
            if !bpf {
                continue;
            }
            let info = std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                f.file_name().to_string_lossy()
            ))
            .unwrap_or_default();
            let ids: Vec<String> = info
                .lines()
                .flat_map(|l| {
                    [
                        ("prog_id:", "prog"),
                        ("map_id:", "map"),
                        ("link_id:", "link"),
                    ]
                    .into_iter()
                    .filter_map(move |(field, kind)| {
                        l.strip_prefix(field)
                            .map(|id| format!("{kind} {}", id.trim()))
                    })
                })
                .collect();
            let link = ids.iter().find(|k| k.starts_with("link "));
            if !observer {
                out.extend(ids.iter().cloned());
            } else if let Some(link) = link {
                // A link of one of its own programs.
                if ids
                    .iter()
                    .any(|k| k.starts_with("prog ") && registered.contains(k))
                {
                    out.insert(link.clone());
                }
            }
        }
    }
    out
}

/// Whether the bpf capture's item `key` = `value` is a link of one of the
/// observers' own programs (`registered`): one an observer killed a
/// moment ago held (a run's sysctl link), which the kernel releases after
/// its holder is gone, outside the registry's lock.
fn observers_link(key: &str, value: &str, registered: &HashSet<String>) -> bool {
    key.starts_with("link ")
        && value
            .rsplit_once(" prog=")
            .is_some_and(|(_, p)| registered.contains(&format!("prog {p}")))
}

/// The pid of the event that decides who made `root/key`
/// ([`snapshots::Deciders`]).
fn last_writer(
    root: &Path,
    key: &str,
    events: &[crate::collect::fanotify::FsEvent],
) -> Option<u32> {
    snapshots::Deciders::new(root, events)
        .of(key)
        .map(|e| e.pid)
}

/// The run of another session of the same agent whose history (closed
/// while this run was observed) holds process `pid`: pids are not reused
/// within such a window but after some four million others.
fn other_run_with(begin: &Begin, pid: u32) -> Option<Attribution> {
    // `state/effects/<agent>/<session>/<run>`.
    let agent_dir = begin.evidence.parent()?.parent()?;
    for s in std::fs::read_dir(agent_dir).ok()?.flatten() {
        let session = s.file_name().to_string_lossy().into_owned();
        if session == begin.session {
            continue;
        }
        for r in std::fs::read_dir(s.path()).into_iter().flatten().flatten() {
            let Ok(effects) = std::fs::read(r.path().join(super::EFFECTS_FILE)) else {
                continue;
            };
            let Ok(e) = serde_json::from_slice::<allox_protocol::RunEffects>(&effects) else {
                continue;
            };
            // Only runs that ended after this one began.
            if e.closed_ms < begin_ms(begin) {
                continue;
            }
            let Ok(h) = super::read_history(&r.path()) else {
                continue;
            };
            if h.iter()
                .any(|x| x.pid == pid && matches!(x.kind.as_str(), "fork" | "exec"))
            {
                return Some(Attribution::session(
                    &begin.agent,
                    &session,
                    Some(&e.run_id),
                ));
            }
        }
    }
    None
}

/// When this run's observation began (ms since the epoch), from its
/// pending marker's time.
fn begin_ms(begin: &Begin) -> u64 {
    std::fs::metadata(begin.evidence.join("pending"))
        .or_else(|_| std::fs::metadata(&begin.evidence))
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Whether the run's history has a write open of `shared/KEY` (the
/// agent's `shared/` is `/allox/shared` in its sandbox).
fn wrote_shared(history: &[HistoryRecord], key: &str) -> bool {
    let want = format!("open for write /allox/shared/{key} ");
    history.iter().any(|r| {
        r.kind == "open_write" && r.detail.as_deref().is_some_and(|d| d.starts_with(&want))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(detail: &str) -> HistoryRecord {
        HistoryRecord {
            seq: 0,
            time_ns: 0,
            kind: "netlink_send".into(),
            pid: 1,
            ppid: None,
            comm: "x".into(),
            detail: Some(detail.into()),
            refused: false,
        }
    }

    #[test]
    fn netlink_messages_that_make_or_delete_are_network_changes_and_reads_are_not() {
        let change = |d: &str| changes(EffectsDomain::Network, &sent(d));
        // rtnetlink: RTM_NEWROUTE 24, RTM_DELLINK 17; RTM_GETROUTE 26 reads.
        assert!(change("netlink protocol 0 message type 24 flags 0x601"));
        assert!(change("netlink protocol 0 message type 17 flags 0x5"));
        assert!(!change("netlink protocol 0 message type 26 flags 0x301"));
        // nfnetlink: a batch, NFT_MSG_NEWTABLE (10 << 8 | 0), NEWRULE
        // (| 6); NFT_MSG_GETTABLE (| 1) and GETRULE (| 7) read.
        assert!(change("netlink protocol 12 message type 16 flags 0x1"));
        assert!(change("netlink protocol 12 message type 2560 flags 0x405"));
        assert!(change("netlink protocol 12 message type 2566 flags 0x405"));
        assert!(!change("netlink protocol 12 message type 2561 flags 0x301"));
        assert!(!change("netlink protocol 12 message type 2567 flags 0x301"));
        // Another protocol (NETLINK_AUDIT 9), another domain.
        assert!(!change("netlink protocol 9 message type 1000 flags 0x1"));
        assert!(!changes(
            EffectsDomain::Sysctl,
            &sent("netlink protocol 0 message type 24 flags 0x601")
        ));
    }

    fn wrote(name: &str, value: &str) -> HistoryRecord {
        HistoryRecord {
            kind: "sysctl".into(),
            ..sent(&format!("write {name} = {value:?}"))
        }
    }

    fn modified(key: &str) -> Difference {
        Difference {
            key: key.into(),
            kind: EffectChangeKind::Modified,
            before: Some("1".into()),
            after: Some("2".into()),
        }
    }

    /// A sysctl value is the run's if it wrote that one (in any network
    /// namespace); another value changed meanwhile (by the machine, or a
    /// process outside every sandbox) is not, though the run wrote some
    /// other. (Before, any write made every difference the run's.)
    #[test]
    fn a_sysctl_value_is_the_run_s_only_if_it_wrote_it_or_changed_what_it_follows() {
        let h = [wrote("vm/swappiness", "61")];
        assert!(sysctl_by_run(&modified("vm.swappiness"), &h));
        assert!(!sysctl_by_run(&modified("vm.dirty_background_ratio"), &h));
        // The session's namespace, and a dot inside a component.
        let h = [wrote("net/ipv4/conf/eth0.100/forwarding", "1")];
        assert!(sysctl_by_run(
            &modified("session net.ipv4.conf.eth0/100.forwarding"),
            &h
        ));
        assert!(sysctl_by_run(
            &modified("net.ipv4.conf.eth0/100.forwarding"),
            &h
        ));
        assert!(!sysctl_by_run(
            &modified("net.ipv4.conf.eth0.forwarding"),
            &h
        ));
        // A network change: `net.*` values follow it, others do not.
        let h = [sent("netlink protocol 0 message type 16 flags 0x601")];
        assert!(sysctl_by_run(&modified("net.ipv6.conf.d0.mtu"), &h));
        assert!(!sysctl_by_run(&modified("vm.swappiness"), &h));
        // Entries added: a device's tables, after a network change.
        let added = Difference {
            kind: EffectChangeKind::Added,
            ..modified("net.ipv4.conf.d0.forwarding")
        };
        assert!(sysctl_by_run(&added, &h));
        assert!(!sysctl_by_run(&added, &[]));
        // A refused write is nothing.
        let refused = HistoryRecord {
            refused: true,
            ..sent("socket(AF_NETLINK, 3, 0) = -1 (EPERM)")
        };
        assert!(!sysctl_by_run(&modified("vm.swappiness"), &[refused]));
        assert_eq!(
            sysctl_written("write net/ipv4/ip_forward = \"1\"").as_deref(),
            Some("net.ipv4.ip_forward")
        );
    }

    /// A link of one of the observers' own programs is theirs, held or
    /// not (one whose observer was killed is released by the kernel a
    /// moment later); a link of any other program is the machine's.
    #[test]
    fn links_of_the_observers_programs_are_theirs() {
        let registered: HashSet<String> = ["prog 42".to_string(), "map 7".to_string()].into();
        assert!(observers_link(
            "link 9",
            "CgroupSysctl prog=42",
            &registered
        ));
        assert!(!observers_link(
            "link 9",
            "CgroupSysctl prog=43",
            &registered
        ));
        assert!(!observers_link(
            "link 9",
            "CgroupSysctl prog=4",
            &registered
        ));
        assert!(!observers_link("prog 42", "x prog=42", &registered));
        assert!(!observers_link("link 9", "CgroupSysctl", &registered));
    }
}
