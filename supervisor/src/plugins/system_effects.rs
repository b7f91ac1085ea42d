//! System effects (`--plugin system-effects`): evidence of what each run
//! changed outside its workspace, from an independent observer, and a
//! fence on any fault (docs/system-effects.md).
//!
//! - start: checks the kernel (BTF, BPF LSM, fanotify), reads the scope
//!   file, reads the observer executable into a sealed memory file and
//!   checks its pinned sha256, loads the fences, and fences the sessions
//!   whose observation a stopped supervisor left in the middle;
//! - each run (the core freezes its cgroup first): an observer process of
//!   its own captures and seals A ([`Plugin::observe_begin`]); at the end,
//!   with the tree exited and the cgroup empty and frozen, B, the verdict
//!   and the closed chain ([`Plugin::observe_end`]);
//! - an observed run holds its session alone: another run of it is
//!   refused `conflict` while it lives;
//! - any fault fences the session ([`fences`]): changes are refused
//!   `unavailable` ([`Plugin::holds`]) until `effects.unfence` is given
//!   the run's evidence root;
//! - routes: `effects.get|list|history|status|unfence`.

pub mod fences;
pub mod observer;

pub use super::defaults::system_effects::{DEFAULT_RING_BYTES, NAME};
use crate::plugin_api::{
    Manifest, ObservedEnd, ObservedRun, Plugin, PluginError, RouteContext, RouteFuture, RunCore,
    RunRef, Settings, API_VERSION,
};
use allox_effects::observer::wire::{Begin, End, FromObserver, ToObserver};
use allox_effects::scope::Scope;
use allox_protocol::{
    DomainEffects, EffectsDomain, EffectsEntry, EffectsFence, EffectsListing, EffectsStatus,
    EffectsUnfenced, EffectsVerdict, ErrorBody, ErrorCode, Request, Response, RunEffects,
    EFFECTS_PROTOCOL,
};
use fences::{Fences, PENDING};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Where every observer of the machine (of any daemon) lists its own BPF
/// objects, so that none counts another's as a change.
pub const OBSERVERS: &str = "/run/allox-observers";

/// How long the observer may take to seal A, and to close the evidence.
const SEAL_WAIT: Duration = Duration::from_secs(60);
const CLOSE_WAIT: Duration = Duration::from_secs(600);

static MANIFEST: Manifest = Manifest {
    name: NAME,
    api_version: API_VERSION,
    conflicts: &["process-tree"],
    alias: None,
    summary: "evidence of what each run changed outside its workspace, from an independent observer; fences a session on any fault",
};

/// The plugin.
#[derive(Default)]
pub struct SystemEffects {
    started: OnceLock<Arc<Started>>,
}

struct Started {
    exe: observer::Executable,
    /// The independent verifier, run over every closed evidence set
    /// before the run is answered, and by `effects.verify`.
    verifier: observer::Executable,
    /// The recover tool: protocol v3's workspace restore.
    recover: observer::Executable,
    /// The store (protocol v3's baseline and restore).
    store: Option<Arc<allox_store::Store>>,
    /// sha256 (hex) of the supervisor's own executable, bound into every
    /// chain's `begin`.
    supervisor_sha256: String,
    scope: Scope,
    scope_file: Option<PathBuf>,
    ring_bytes: u32,
    /// Whether the history has its BPF LSM hooks.
    lsm: bool,
    /// `state/effects`.
    dir: PathBuf,
    fences: Fences,
    /// Observed runs going on, by session.
    live: Mutex<HashMap<(String, String), Live>>,
    /// Sessions whose observed run is being begun (its A not sealed yet):
    /// held with `live` from the check that refuses a second run on.
    beginning: Mutex<std::collections::HashSet<(String, String)>>,
    /// The observed runs' forks, execs and exits (`state/events.redb`, as
    /// the process-tree plugin keeps them): this plugin answers
    /// `process.events` and `process.tree` in its stead.
    events: crate::plugins::process_tree::tracker::EventStore,
    /// History records lost by the runs observed since the start.
    lost: Arc<std::sync::atomic::AtomicU64>,
    /// Process events the observers handed over since the start.
    received: Arc<std::sync::atomic::AtomicU64>,
    /// Observers waiting for a run, their history's programs loaded: a
    /// run takes one (or starts a new one), and gives it back once its
    /// evidence is closed. An observer that failed is never given back.
    idle: Mutex<Vec<observer::Observer>>,
}

/// Most observers kept waiting between runs (more are started when more
/// sessions run observed at once, and ended when they come back).
const IDLE_OBSERVERS: usize = 2;

/// An observed run between A and B.
struct Live {
    run: String,
    observer: Arc<Mutex<Option<observer::Observer>>>,
    /// Dropped with the run: its observer's watcher then stops watching.
    _watching: Option<rustix::fd::OwnedFd>,
    baseline: String,
    started_ms: u64,
    /// Set by the watcher when the observer dies before the end.
    lost: Arc<Mutex<Option<String>>>,
    /// Protocol v3: the recovery asked for.
    recovery: Option<allox_effects::observer::RecoveryPlan>,
    /// The session's context at A.
    context_pid: Option<i32>,
}

/// A session's place in `Started::beginning`, given up when dropped (the
/// run then is in `live`, or was refused).
struct Beginning<'a> {
    set: &'a Mutex<std::collections::HashSet<(String, String)>>,
    key: (String, String),
}

impl Drop for Beginning<'_> {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
    }
}

/// A v3 baseline made and pinned for a run that may yet be refused: a
/// refusal (the observation failing at start) runs nothing, so the
/// baseline is unpinned and deleted when this is dropped, unless `kept`
/// (the run is going).
struct MadeBaseline<'a> {
    store: Option<&'a Arc<allox_store::Store>>,
    agent: &'a str,
    session: &'a str,
    checkpoint: Option<String>,
}

impl MadeBaseline<'_> {
    fn keep(&mut self) {
        self.checkpoint = None;
    }
}

impl Drop for MadeBaseline<'_> {
    fn drop(&mut self) {
        let (Some(store), Some(c)) = (self.store, self.checkpoint.take()) else {
            return;
        };
        let gone = store
            .checkpoint_pin(self.agent, self.session, &c, false)
            .and_then(|_| store.checkpoint_delete(self.agent, self.session, &c));
        if let Err(e) = gone {
            tracing::warn!(
                agent = self.agent,
                session = self.session,
                checkpoint = c,
                error = %e.chain(),
                "cannot delete the v3 baseline of a refused run"
            );
        }
    }
}

/// What a run's `pending` marker holds: enough for a later supervisor to
/// leave nothing half-done.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Pending {
    cgroup: Option<PathBuf>,
    observer: Option<u32>,
    started_ms: u64,
}

/// Waits (bounded) for process `pid` to be gone.
fn wait_gone(pid: u32, bound: Duration) {
    let Some(p) = rustix::process::Pid::from_raw(pid as i32) else {
        return;
    };
    let Ok(fd) = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()) else {
        return;
    };
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    let ts = rustix::event::Timespec {
        tv_sec: bound.as_secs() as _,
        tv_nsec: 0,
    };
    let _ = rustix::event::poll(&mut fds, Some(&ts));
}

fn start_err(why: impl Into<String>) -> PluginError {
    PluginError::Start {
        plugin: NAME,
        alias: None,
        source: why.into().into(),
    }
}

fn answered(code: ErrorCode, why: impl Into<String>) -> PluginError {
    PluginError::Answered(ErrorBody::new(code, why.into()))
}

impl SystemEffects {
    pub fn new() -> SystemEffects {
        SystemEffects::default()
    }

    fn s(&self) -> Result<&Arc<Started>, PluginError> {
        self.started.get().ok_or_else(|| {
            answered(
                ErrorCode::Unavailable,
                "the system-effects plugin is not started",
            )
        })
    }
}

/// What the kernel lacks for the observer, named.
fn kernel_lacks() -> Option<String> {
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Some("BTF (/sys/kernel/btf/vmlinux is missing: CONFIG_DEBUG_INFO_BTF)".into());
    }
    if !Path::new("/proc/sys/fs/fanotify").exists() {
        return Some("fanotify (/proc/sys/fs/fanotify is missing: CONFIG_FANOTIFY)".into());
    }
    let lsm_file = Path::new("/sys/kernel/security/lsm");
    if !lsm_file.exists() {
        // securityfs is not always mounted on a host.
        let _ = rustix::mount::mount(
            "securityfs",
            "/sys/kernel/security",
            "securityfs",
            rustix::mount::MountFlags::NOSUID
                | rustix::mount::MountFlags::NODEV
                | rustix::mount::MountFlags::NOEXEC,
            None,
        );
    }
    match std::fs::read_to_string(lsm_file) {
        Ok(l) if l.trim().split(',').any(|m| m == "bpf") => None,
        Ok(l) => Some(format!(
            "the BPF LSM (active LSMs: {}; boot with lsm=...,bpf and CONFIG_BPF_LSM)",
            l.trim()
        )),
        Err(e) => Some(format!(
            "the BPF LSM (cannot read {}: {e})",
            lsm_file.display()
        )),
    }
}

impl Started {
    fn evidence(&self, a: &str, s: &str, r: &str) -> PathBuf {
        self.dir.join(a).join(s).join(r)
    }

    /// Fences `a/s` because of run `r`, and says so in the log and the
    /// plugin's audit file.
    fn fence(&self, a: &str, s: &str, r: &str, reason: &str, root: &str) {
        tracing::error!(
            agent = a,
            session = s,
            run = r,
            reason,
            root,
            "session fenced"
        );
        self.hold(a, s, r, reason, root);
    }

    /// Fences `a/s` as [`Started::fence`] does, without calling it an
    /// error: protocol v3's fence from B to C, part of every such run.
    fn hold(&self, a: &str, s: &str, r: &str, reason: &str, root: &str) {
        let f = EffectsFence {
            agent_id: a.into(),
            session_id: s.into(),
            run_id: r.into(),
            reason: reason.into(),
            evidence_root: root.into(),
            fenced_ms: allox_store::clock::now_ms(),
        };
        if let Err(e) = self.fences.fence(f) {
            tracing::error!(error = %e, "the fence could not be written durably; it holds until the supervisor stops");
        }
        self.audit(a, s, r, "fenced", root, Some(reason));
        // A run ended by its session's deletion ends after it: a session
        // gone by now takes no fence (one deleted after this look lifts it
        // itself, `deleted`), else a session made again under the name
        // would be refused.
        let gone = self.store.as_ref().is_some_and(|st| {
            matches!(
                st.session_created(a, s),
                Err(allox_store::StoreError::NotFound(_))
            )
        });
        if gone {
            match self.fences.lift(a, s) {
                Ok(_) => self.audit(a, s, r, "lifted", root, Some("the session was deleted")),
                Err(e) => tracing::error!(error = %e, "cannot lift the fence of a deleted session"),
            }
        }
    }

    /// One line of `state/effects/audit.jsonl`.
    fn audit(&self, a: &str, s: &str, r: &str, event: &str, root: &str, why: Option<&str>) {
        use std::io::Write;
        let line = serde_json::json!({
            "time_ms": allox_store::clock::now_ms(),
            "agent_id": a, "session_id": s, "run_id": r,
            "event": event, "evidence_root": root, "why": why,
        });
        let p = self.dir.join(AUDIT);
        let w = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&p)
            .and_then(|mut f| {
                f.write_all(format!("{line}\n").as_bytes())?;
                f.sync_data()
            });
        if let Err(e) = w {
            tracing::error!(file = %p.display(), error = %e, "cannot write the system-effects audit");
        }
    }

    /// Fences the sessions whose observation an earlier supervisor left
    /// in the middle (a `pending` marker without a closed chain).
    fn recover(&self) {
        let dirs = |p: &Path| -> Vec<(String, PathBuf)> {
            std::fs::read_dir(p)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
                .collect()
        };
        // Read once, when a marker is found.
        let mut closed = None;
        for (a, ap) in dirs(&self.dir) {
            if a == "fences" || a.starts_with('.') {
                continue;
            }
            for (s, sp) in dirs(&ap) {
                for (r, rp) in dirs(&sp) {
                    let Ok(text) = std::fs::read(rp.join(PENDING)) else {
                        continue;
                    };
                    let closed = closed.get_or_insert_with(|| closed_runs(&self.dir.join(AUDIT)));
                    if closed.contains(&(a.clone(), s.clone(), r.clone())) {
                        // Its observation ended and was answered; only the
                        // marker's removal did not reach the disk.
                        let _ = std::fs::remove_file(rp.join(PENDING));
                        continue;
                    }
                    let pending: Pending = serde_json::from_slice(&text).unwrap_or_default();
                    // What the stopped supervisor left: its observer ends its
                    // chain with a fault once its conversation is gone (a
                    // few seconds at most), the run's cgroup is killed and
                    // thawed, never left frozen or running unobserved.
                    if let Some(pid) = pending.observer {
                        wait_gone(pid, Duration::from_secs(10));
                    }
                    // The snapshots that observer did not get to delete.
                    for e in allox_effects::observer::files::remove_left(&rp) {
                        tracing::warn!(error = %e, "cannot delete a snapshot of a stopped observation");
                    }
                    if let Some(cg) = &pending.cgroup {
                        if cg.exists() {
                            let _ = std::fs::write(cg.join("cgroup.kill"), "1");
                            let _ = std::fs::write(cg.join("cgroup.freeze"), "0");
                        }
                    }
                    let root = allox_effects::chain::verify(&rp, None)
                        .map(|v| v.root)
                        .unwrap_or_default();
                    let why = "the supervisor stopped in the middle of the run's observation";
                    self.fence(&a, &s, &r, why, &root);
                    let e = self.incomplete(&a, &s, &r, why, &root, pending.started_ms);
                    let _ = fences::write_durably(
                        &rp.join(allox_effects::observer::EFFECTS_FILE),
                        &serde_json::to_vec(&e).unwrap_or_default(),
                    );
                    let _ = std::fs::remove_file(rp.join(PENDING));
                }
            }
        }
    }

    /// The effects of a run whose evidence did not close: INCOMPLETE in
    /// every observed domain, fenced.
    fn incomplete(
        &self,
        agent: &str,
        session: &str,
        run: &str,
        why: &str,
        root: &str,
        started_ms: u64,
    ) -> RunEffects {
        RunEffects {
            protocol: EFFECTS_PROTOCOL,
            agent_id: agent.into(),
            session_id: session.into(),
            run_id: run.into(),
            evidence_root: root.into(),
            verdict: EffectsVerdict::Incomplete,
            domains: EffectsDomain::ALL
                .into_iter()
                .map(|d| {
                    let observed = self.scope.observes(d);
                    DomainEffects {
                        domain: d,
                        verdict: if observed {
                            EffectsVerdict::Incomplete
                        } else {
                            EffectsVerdict::NotObserved
                        },
                        changes: Vec::new(),
                        truncated: false,
                        note: Some(if observed {
                            why.to_string()
                        } else {
                            "not in the scope".into()
                        }),
                        items: [0, 0],
                    }
                })
                .collect(),
            fenced: true,
            fence_reason: Some(why.into()),
            survivors: Vec::new(),
            history: Default::default(),
            started_ms,
            closed_ms: allox_store::clock::now_ms(),
            recovery: None,
        }
    }
}

impl Started {
    fn store(&self) -> Result<&Arc<allox_store::Store>, PluginError> {
        self.store.as_ref().ok_or_else(|| {
            answered(
                ErrorCode::Unavailable,
                "recovery needs the store, which this plugin was not given",
            )
        })
    }

    /// The checkpoint a v3 run's workspace is restored to: the request's,
    /// which must be a full checkpoint id of the session, complete (a whole
    /// read-only snapshot) and equal to `current/` now; or a baseline made
    /// and pinned now.
    fn plan_recovery(
        &self,
        r: &RunRef<'_>,
        rec: &allox_protocol::ProcessRecovery,
    ) -> Result<allox_effects::observer::RecoveryPlan, PluginError> {
        let store = self.store()?;
        let (a, s) = (r.agent, r.session);
        let store_err = |e: allox_store::StoreError| answered(e.code(), e.chain());
        let plan =
            |checkpoint_id: String, baseline_made: bool| allox_effects::observer::RecoveryPlan {
                checkpoint_id,
                baseline_made,
                scrub_runtime: rec.scrub_runtime,
                require_consistent: rec.require_consistent,
            };
        let Some(c) = &rec.checkpoint_id else {
            let id = format!("v3-baseline-{}", r.run);
            let made = store
                .checkpoint_create(&allox_protocol::CheckpointCreate {
                    agent_id: a.into(),
                    session_id: s.into(),
                    checkpoint_id: id.clone(),
                    pinned: true,
                    label: Some(format!("system-effects v3 baseline of run {}", r.run)),
                })
                .map_err(|e| {
                    answered(
                        e.code(),
                        format!(
                            "run {} refused: its recovery baseline: {}",
                            r.run,
                            e.chain()
                        ),
                    )
                })?;
            return Ok(plan(made.checkpoint_id, true));
        };
        let bad = |why: String| {
            answered(
                ErrorCode::InvalidRequest,
                format!("run {} refused: recovery.checkpoint_id {c:?} {why}", r.run),
            )
        };
        allox_protocol::validate_id("checkpoint_id", c)
            .map_err(|e| bad(format!("is not an id: {e}")))?;
        let list = store.checkpoint_list(a, s).map_err(store_err)?;
        if !list.checkpoints.iter().any(|x| &x.checkpoint_id == c) {
            let like: Vec<&str> = list
                .checkpoints
                .iter()
                .map(|x| x.checkpoint_id.as_str())
                .filter(|x| x.starts_with(c.as_str()))
                .collect();
            return Err(bad(if like.is_empty() {
                format!("is not a checkpoint of session {a}/{s}")
            } else {
                format!(
                    "is not a checkpoint of session {a}/{s}: a full id is needed (it begins {})",
                    like.join(", ")
                )
            }));
        }
        let tree = store.layout().checkpoint(a, s, c);
        let whole = allox_store::btrfs::probe_subvolume(&tree).unwrap_or(false)
            && std::fs::File::open(&tree)
                .ok()
                .and_then(|d| allox_store::btrfs::is_read_only(&d, &tree).ok())
                .unwrap_or(false);
        if !whole {
            return Err(bad(format!(
                "is incomplete: its tree {} is not a whole read-only snapshot",
                tree.display()
            )));
        }
        let d = store
            .checkpoint_diff(&allox_protocol::CheckpointDiff {
                agent_id: a.into(),
                session_id: s.into(),
                from: c.clone(),
                to: "current".into(),
                patch: false,
            })
            .map_err(store_err)?;
        let n = d.added + d.modified + d.deleted + d.type_changed;
        if n > 0 || !d.changes.is_empty() {
            return Err(answered(
                ErrorCode::Conflict,
                format!(
                    "run {} refused: recovery.checkpoint_id {c:?} differs from session {a}/{s}'s current/ ({n} changes, the first {}): the run would not be restored to what it started from",
                    r.run,
                    d.changes.first().map(|x| x.path.as_str()).unwrap_or("?")
                ),
            ));
        }
        Ok(plan(c.clone(), false))
    }

    /// Protocol v3 between B and C: the session fenced durably (B is),
    /// the workspace restored by the pinned recover tool under the store's
    /// journal, and what was done, for the observer to record.
    fn recover_workspace(
        &self,
        run: &RunRef<'_>,
        plan: &allox_effects::observer::RecoveryPlan,
        head: &str,
        context_pid: Option<i32>,
        core: &dyn RunCore,
    ) -> allox_effects::observer::Recovered {
        tracing::info!(
            agent = run.agent,
            session = run.session,
            run = run.run,
            root = head,
            "protocol v3: B is durable; the session is fenced while the workspace is restored and C captured"
        );
        self.hold(
            run.agent,
            run.session,
            run.run,
            "protocol v3: the workspace is being restored and C captured",
            head,
        );
        let failed = |why: String, scrubbed: Vec<String>| allox_effects::observer::Recovered {
            restore: Err(why),
            scrubbed,
            context_pid,
        };
        let store = match self.store() {
            Ok(s) => s.clone(),
            Err(e) => return failed(e.to_string(), Vec::new()),
        };
        store.failpoint("effects_v3.after_fence");
        // Nothing living in the session's namespaces may write into the
        // workspace once it is restored.
        let scrubbed = match (plan.scrub_runtime, context_pid) {
            (true, Some(ctx)) => scrub(ctx),
            _ => Vec::new(),
        };
        let mut done = None;
        let restore = |checkpoint: &Path, fresh: &Path, current: &Path| {
            let args: Vec<String> = [
                ("--checkpoint", checkpoint),
                ("--fresh", fresh),
                ("--current", current),
            ]
            .into_iter()
            .flat_map(|(k, v)| [k.to_string(), v.display().to_string()])
            .collect();
            let (code, out) = self.recover.run(&args, RESTORE_WAIT)?;
            let text = String::from_utf8_lossy(&out).trim().to_string();
            if code != 0 {
                return Err(format!("the recover tool exited {code}: {text}"));
            }
            let mut d: allox_protocol::RestoreDone = serde_json::from_str(&text)
                .map_err(|e| format!("the recover tool's account {text:?}: {e}"))?;
            d.tool_sha256 = self.recover.sha256.clone();
            done = Some(d);
            Ok(())
        };
        let rolled = store.rollback_with(
            &allox_protocol::SessionRollback {
                agent_id: run.agent.into(),
                session_id: run.session.into(),
                checkpoint_id: plan.checkpoint_id.clone(),
                kill_processes: Some(false),
            },
            Box::new(restore),
        );
        if let Err(e) = rolled {
            return failed(e.chain(), scrubbed);
        }
        store.failpoint("effects_v3.after_restore");
        let mut scrubbed = scrubbed;
        let mut context_pid = context_pid;
        if plan.scrub_runtime {
            // The namespaces themselves, as a first run finds them.
            match core.renew_context() {
                Ok(pid) => {
                    scrubbed.push(format!(
                        "the session's context (pid {}) and its namespaces, replaced by new ones (pid {pid})",
                        context_pid.map(|p| p.to_string()).unwrap_or_else(|| "none".into())
                    ));
                    context_pid = Some(pid);
                }
                Err(why) => return failed(format!("renew the session's context: {why}"), scrubbed),
            }
        }
        allox_effects::observer::Recovered {
            restore: done.ok_or_else(|| "the recover tool gave no account".to_string()),
            scrubbed,
            context_pid,
        }
    }

    /// Lifts the fence run `run` holds on its session (a v3 run whose
    /// recovery verified).
    fn lift(&self, run: &RunRef<'_>, root: &str, why: &str) {
        if self
            .fences
            .get(run.agent, run.session)
            .is_some_and(|f| f.run_id == run.run)
        {
            if let Err(e) = self.fences.lift(run.agent, run.session) {
                tracing::error!(error = %e, "cannot lift the recovery's fence durably");
                return;
            }
            self.audit(run.agent, run.session, run.run, "lifted", root, Some(why));
        }
    }
}

/// `scrub_runtime`: kills every process living in the session's context
/// (its mount namespace, or its network namespace when that is not the
/// supervisor's) but the context itself, and waits for each to be gone;
/// what it killed, as `pid N COMM`.
fn scrub(context: i32) -> Vec<String> {
    let ns = |pid: &str, kind: &str| {
        std::fs::metadata(format!("/proc/{pid}/ns/{kind}"))
            .ok()
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
    };
    let ctx = context.to_string();
    let (mnt, net) = (ns(&ctx, "mnt"), ns(&ctx, "net"));
    let own_net = ns("self", "net");
    let me = std::process::id().to_string();
    let mut killed = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return killed;
    };
    for e in dir.flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) || pid == ctx || pid == me {
            continue;
        }
        let inside = (mnt.is_some() && ns(&pid, "mnt") == mnt)
            || (net.is_some() && net != own_net && ns(&pid, "net") == net);
        if !inside {
            continue;
        }
        let Some(p) = pid.parse().ok().and_then(rustix::process::Pid::from_raw) else {
            continue;
        };
        let Ok(fd) = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()) else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if rustix::process::pidfd_send_signal(&fd, rustix::process::Signal::KILL).is_ok() {
            let mut fds = [rustix::event::PollFd::new(
                &fd,
                rustix::event::PollFlags::IN,
            )];
            let ts = rustix::event::Timespec {
                tv_sec: 5,
                tv_nsec: 0,
            };
            let _ = rustix::event::poll(&mut fds, Some(&ts));
            killed.push(format!("pid {pid} {}", comm.trim()));
        }
    }
    killed
}

/// How long the recover tool may take.
const RESTORE_WAIT: Duration = Duration::from_secs(60);

/// Watches an observer's pidfd while its run lives: if it exits before
/// the run's end, the run's cgroup is frozen at once and the loss noted.
/// Returns what keeps the watch: dropping it (the run is over) ends it.
fn watch(
    obs: Arc<Mutex<Option<observer::Observer>>>,
    lost: Arc<Mutex<Option<String>>>,
    cgroup: PathBuf,
) -> Option<rustix::fd::OwnedFd> {
    let pidfd = {
        let g = obs.lock().unwrap_or_else(|e| e.into_inner());
        match g.as_ref() {
            Some(o) => rustix::io::fcntl_dupfd_cloexec(&o.pidfd, 0).ok(),
            None => None,
        }
    }?;
    let (over, keep) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).ok()?;
    let _ = std::thread::Builder::new()
        .name("observer-watch".into())
        .spawn(move || {
            let mut fds = [
                rustix::event::PollFd::new(&pidfd, rustix::event::PollFlags::IN),
                rustix::event::PollFd::new(&over, rustix::event::PollFlags::IN),
            ];
            loop {
                match rustix::event::poll(&mut fds, None) {
                    Ok(_) => break,
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(_) => return,
                }
            }
            // The run is over, or its end took the observer: nothing lost.
            if !fds[1].revents().is_empty()
                || obs.lock().unwrap_or_else(|e| e.into_inner()).is_none()
            {
                return;
            }
            let _ = std::fs::write(cgroup.join("cgroup.freeze"), "1");
            let _ = std::fs::write(cgroup.join("cgroup.kill"), "1");
            *lost.lock().unwrap_or_else(|e| e.into_inner()) =
                Some("the observer exited before the run's end".into());
            tracing::error!(cgroup = %cgroup.display(), "the observer exited during its run: the run is frozen and killed");
        });
    Some(keep)
}

/// The audit log, in the plugin's directory: a line per event.
const AUDIT: &str = "audit.jsonl";
/// The audit event of a run whose observation ended and was answered.
const CLOSED: &str = "closed";

/// One line of the audit log, as far as it is read back.
#[derive(serde::Deserialize)]
struct AuditLine {
    agent_id: String,
    session_id: String,
    run_id: String,
    event: String,
    #[serde(default)]
    evidence_root: String,
}

/// The audit log's lines at `path` (none if it cannot be read).
fn audit_lines(path: &Path) -> Vec<AuditLine> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<AuditLine>(l).ok())
        .collect()
}

/// The runs the audit log at `path` says were closed, as (agent, session,
/// run); none if it cannot be read.
fn closed_runs(path: &Path) -> std::collections::HashSet<(String, String, String)> {
    audit_lines(path)
        .into_iter()
        .filter(|l| l.event == CLOSED)
        .map(|l| (l.agent_id, l.session_id, l.run_id))
        .collect()
}

/// The root the audit log at `path` kept for run `a/s/r` when its
/// observation ended (its last `closed` or `fenced` line); none if it has
/// none or cannot be read.
fn audited_root(path: &Path, a: &str, s: &str, r: &str) -> Option<String> {
    audit_lines(path)
        .into_iter()
        .rev()
        .find(|l| {
            (l.event == CLOSED || l.event == "fenced")
                && (
                    l.agent_id.as_str(),
                    l.session_id.as_str(),
                    l.run_id.as_str(),
                ) == (a, s, r)
        })
        .map(|l| l.evidence_root)
}

/// How long the verifier may take over one set.
const VERIFY_WAIT: Duration = Duration::from_secs(30);

impl Started {
    /// The verifier's report on the set in `dir`, checked against `root`
    /// when given: the report's bytes, parsed; or why the verifier gave
    /// none (it failed, or was not asked right).
    fn verify(
        &self,
        dir: &Path,
        root: Option<&str>,
    ) -> Result<(allox_effects::verify::Report, String), String> {
        let mut args = Vec::new();
        if let Some(r) = root {
            args.extend(["--root".to_string(), r.to_string()]);
        }
        args.push(dir.display().to_string());
        let (code, out) = self.verifier.run(&args, VERIFY_WAIT)?;
        let text = String::from_utf8(out)
            .map_err(|_| format!("the verifier (exit {code}) wrote a report that is not UTF-8"))?;
        match code {
            0 | 1 => {
                let r: allox_effects::verify::Report = serde_json::from_str(text.trim_end())
                    .map_err(|e| format!("the verifier (exit {code}) wrote no report: {e}"))?;
                if r.ok != (code == 0) {
                    return Err(format!(
                        "the verifier exited {code} with a report that says ok={}",
                        r.ok
                    ));
                }
                Ok((r, text.trim_end().to_string()))
            }
            c => Err(format!("the verifier failed (exit {c})")),
        }
    }

    /// What every observer is started with: its history loaded before the
    /// first run asks for it.
    fn observer_args(&self) -> Vec<String> {
        let mut a = vec!["--ring-bytes".to_string(), self.ring_bytes.to_string()];
        if !self.lsm {
            a.push("--without-lsm".into());
        }
        a.extend(["--registry".to_string(), OBSERVERS.to_string()]);
        a
    }

    /// An observer for a run: one waiting (`true`), or a new one.
    fn take_observer(&self) -> Result<(observer::Observer, bool), String> {
        loop {
            let o = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
            match o {
                Some(o) if !o.exited() => return Ok((o, true)),
                Some(o) => o.finish(Duration::from_secs(1)),
                None => return self.exe.spawn(&self.observer_args()).map(|o| (o, false)),
            }
        }
    }

    /// Adds a closed run's process events (`processes.json`, the
    /// observer's) to the event store.
    fn keep_processes(&self, evidence: &Path, lost: u64) {
        self.lost
            .fetch_add(lost, std::sync::atomic::Ordering::Relaxed);
        let p = evidence.join(allox_effects::observer::PROCESSES_FILE);
        let evs: Vec<allox_protocol::ProcessEvent> = match std::fs::read(&p)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(path = %p.display(), error = %e, "cannot read the run's process events");
                return;
            }
        };
        self.received
            .fetch_add(evs.len() as u64, std::sync::atomic::Ordering::Relaxed);
        if let Err(e) = self.events.append(evs) {
            tracing::warn!(error = %allox_protocol::error_chain(&e), "cannot store the run's process events");
        }
    }

    /// Ends the observers waiting (one of them died: they may all have).
    fn discard_idle(&self) {
        let idle = std::mem::take(&mut *self.idle.lock().unwrap_or_else(|e| e.into_inner()));
        for o in idle {
            o.finish(Duration::from_secs(1));
        }
    }

    /// An observer whose run closed cleanly waits for the next run (while
    /// fewer than [`IDLE_OBSERVERS`] wait); else it ends.
    fn give_back(&self, o: observer::Observer) {
        if !o.exited() {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            if idle.len() < IDLE_OBSERVERS {
                idle.push(o);
                return;
            }
        }
        o.finish(Duration::from_secs(5));
    }
}

impl Plugin for SystemEffects {
    fn manifest(&self) -> &Manifest {
        &MANIFEST
    }

    fn start(&self, settings: &Settings) -> Result<(), PluginError> {
        if let Some(why) = kernel_lacks() {
            return Err(start_err(format!("the kernel lacks {why}")));
        }
        let es = &settings.effects;
        let scope = match &es.scope {
            Some(p) => Scope::load(p).map_err(|e| start_err(e.to_string()))?,
            None => Scope::default(),
        };
        let exe = observer::Executable::pinned(
            observer::OBSERVER,
            es.observer.as_deref(),
            es.observer_sha256.as_deref(),
        )
        .map_err(start_err)?;
        let verifier = observer::Executable::pinned(
            observer::VERIFIER,
            es.verifier.as_deref(),
            es.verifier_sha256.as_deref(),
        )
        .map_err(start_err)?;
        let recover = observer::Executable::pinned(
            observer::RECOVER,
            es.recover.as_deref(),
            es.recover_sha256.as_deref(),
        )
        .map_err(start_err)?;
        let ring = es.ring_bytes;
        if ring < 4096 || !ring.is_power_of_two() {
            return Err(start_err(format!(
                "--system-effects-ring-bytes {ring} is not a power of two of at least 4096"
            )));
        }
        // What the observer will load, loaded once here: a kernel that
        // refuses it stops the daemon now, naming what it lacks.
        let registry = PathBuf::from(OBSERVERS);
        // Loaded and listed under the observers' registry lock, as an
        // observer loads: no observer's capture lists them meanwhile.
        let made = allox_effects::observer::history::lock_registry(&registry, true);
        // (What aya's probes make and drop on the way is gone before the
        // lock is let go.)
        let probe = allox_effects::observer::history::load_settled(
            || {
                if es.without_lsm {
                    allox_ebpf_probes::History::load_without_lsm(4096)
                } else {
                    allox_ebpf_probes::History::load(4096)
                }
            },
            allox_ebpf_probes::History::objects,
        );
        if let Ok(h) = &probe {
            // Its objects outlive the drop by a moment: listed, so that
            // no observer counts them.
            let o = h.objects();
            let _ = allox_effects::observer::history::register(
                &registry,
                &format!("supervisor-{}", std::process::id()),
                &o.progs,
                &o.maps,
                &o.links,
            );
        }
        drop(made);
        if let Err(e) = probe {
            let hint = if es.without_lsm {
                ""
            } else {
                " (on a kernel that refuses BPF LSM programs, --system-effects-without-lsm observes without them)"
            };
            return Err(start_err(format!(
                "the observer's history cannot be loaded: {}{hint}",
                allox_protocol::error_chain(&e)
            )));
        }
        let events = crate::plugins::process_tree::tracker::EventStore::open(
            &settings.state_dir.join("events.redb"),
            settings.process_events_max,
        )
        .map_err(|e| {
            start_err(format!(
                "open the process event store: {}",
                allox_protocol::error_chain(&e)
            ))
        })?;
        let dir = settings.state_dir.join("effects");
        let fences = Fences::load(&dir.join("fences"))
            .map_err(|e| start_err(format!("read the fences in {}: {e}", dir.display())))?;
        let supervisor_sha256 = std::fs::read("/proc/self/exe")
            .map(|b| allox_effects::chain::sha256_hex(&b))
            .map_err(|e| start_err(format!("read this executable to hash it: {e}")))?;
        let st = Arc::new(Started {
            supervisor_sha256,
            exe,
            verifier,
            recover,
            store: settings.store.clone(),
            scope,
            scope_file: es.scope.clone(),
            ring_bytes: ring,
            lsm: !es.without_lsm,
            dir,
            fences,
            live: Mutex::new(HashMap::new()),
            beginning: Mutex::new(std::collections::HashSet::new()),
            events,
            lost: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            received: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            idle: Mutex::new(Vec::new()),
        });
        for (name, help, n) in [
            (
                "observer_events",
                "Process events (forks, execs, exits) the observers recorded for observed runs",
                st.received.clone(),
            ),
            (
                "observer_events_lost",
                "History records the observers lost (an observed run's evidence is then INCOMPLETE)",
                st.lost.clone(),
            ),
        ] {
            settings
                .metrics
                .register_collector(Box::new(crate::plugin_api::metrics::ReadCounter {
                    name,
                    help,
                    read: Box::new(move || n.load(std::sync::atomic::Ordering::Relaxed)),
                }));
        }
        st.recover();
        // One observer ready before the first run.
        match st.exe.spawn(&st.observer_args()) {
            Ok(o) => st.give_back(o),
            Err(why) => return Err(start_err(why)),
        }
        self.started
            .set(st)
            .map_err(|_| start_err("started twice"))?;
        Ok(())
    }

    fn stop(&self) {
        if let Some(st) = self.started.get() {
            st.discard_idle();
            if let Err(e) = st.events.flush() {
                tracing::warn!(error = %allox_protocol::error_chain(&e), "cannot flush the process event store");
            }
        }
    }

    fn observes_runs(&self) -> bool {
        true
    }

    fn observe_begin(&self, run: &ObservedRun<'_>) -> Result<(), PluginError> {
        let st = self.s()?;
        let r = &run.run;
        let key = (r.agent.to_string(), r.session.to_string());
        // The session is held from here: by `beginning` until the run is
        // in `live` (or refused), so that a second start meanwhile (two at
        // once, a start right after an interrupted one) is refused too.
        let _held = {
            let live = st.live.lock().unwrap_or_else(|e| e.into_inner());
            let mut beginning = st.beginning.lock().unwrap_or_else(|e| e.into_inner());
            let going = live.get(&key).map(|l| l.run.clone()).or_else(|| {
                beginning
                    .contains(&key)
                    .then(|| "its observation is being begun".to_string())
            });
            if let Some(going) = going {
                return Err(answered(
                    ErrorCode::Conflict,
                    format!(
                        "session {}/{} has an observed run going on ({going}): an observed run holds its session alone",
                        r.agent, r.session
                    ),
                ));
            }
            beginning.insert(key.clone());
            Beginning {
                set: &st.beginning,
                key: key.clone(),
            }
        };
        let evidence = st.evidence(r.agent, r.session, r.run);
        // Protocol v3: the checkpoint to restore to, checked (or made and
        // pinned) before anything of the run exists beyond its frozen,
        // empty cgroup: a refusal runs nothing.
        let recovery = match run.recovery {
            Some(rec) => Some(st.plan_recovery(r, rec)?),
            None => None,
        };
        let mut made = MadeBaseline {
            store: st.store.as_ref(),
            agent: r.agent,
            session: r.session,
            checkpoint: recovery
                .as_ref()
                .filter(|p| p.baseline_made)
                .map(|p| p.checkpoint_id.clone()),
        };
        // What a later supervisor needs, written once the observer is known.
        let mut pending = Pending {
            cgroup: Some(run.cgroup.to_path_buf()),
            observer: None,
            started_ms: allox_store::clock::now_ms(),
        };
        let write_pending = |p: &Pending| {
            fences::write_for_the_next_commit(
                &evidence.join(PENDING),
                &serde_json::to_vec(p).unwrap_or_default(),
            )
        };
        let started_ms = pending.started_ms;
        let fault = |why: String, root: &str| {
            st.fence(r.agent, r.session, r.run, &why, root);
            // What `effects.get` and `effects.list` show of the refused
            // run (the fence names it): INCOMPLETE, fenced.
            let e = st.incomplete(r.agent, r.session, r.run, &why, root, started_ms);
            let _ = fences::write_durably(
                &evidence.join(allox_effects::observer::EFFECTS_FILE),
                &serde_json::to_vec(&e).unwrap_or_default(),
            );
            let _ = std::fs::remove_file(evidence.join(PENDING));
            answered(
                ErrorCode::Unavailable,
                format!(
                    "run {} refused: its observation failed at start ({why}); session {}/{} is fenced",
                    r.run, r.agent, r.session
                ),
            )
        };
        let begin = Begin {
            agent: r.agent.into(),
            session: r.session.into(),
            run: r.run.into(),
            argv: run.argv.to_vec(),
            scope: st.scope.clone(),
            cgroup: run.cgroup.to_path_buf(),
            cgroup_id: run.cgroup_id,
            cgroup_root: run.cgroup_root.to_path_buf(),
            evidence: evidence.clone(),
            workspace: run.workspace.to_path_buf(),
            agent_workspace: run.agent_workspace.to_path_buf(),
            context_pid: run.context_pid,
            ring_bytes: st.ring_bytes,
            lsm: st.lsm,
            registry: PathBuf::from(OBSERVERS),
            supervisor_pid: std::process::id(),
            executables: vec![
                ("allox-observe".into(), st.exe.sha256.clone()),
                ("allox-init".into(), st.supervisor_sha256.clone()),
                (observer::RECOVER.name.into(), st.recover.sha256.clone()),
            ],
            recovery: recovery.clone(),
        };
        let begin = ToObserver::Begin(Box::new(begin));
        let mut fresh = false;
        let (obs, answer) = loop {
            let (mut obs, reused) = st.take_observer().map_err(|why| fault(why, ""))?;
            // The marker first, then the observer is asked: the commit
            // that makes A's snapshot (in the same directory) makes the
            // marker durable too, before A is sealed and so before the run
            // can exist (it is made once A is): a supervisor that stops
            // from then on leaves the session to be fenced at its next
            // start, and that observer to be awaited. One that stops
            // before, with no run made, leaves an observer that closes its
            // chain with a fault.
            pending.observer = Some(obs.child.id());
            if let Err(e) = write_pending(&pending) {
                let _ = std::fs::remove_file(evidence.join(PENDING));
                obs.finish(Duration::from_secs(5));
                return Err(answered(
                    ErrorCode::Internal,
                    format!("mark run {} observed in {}: {e}", r.run, evidence.display()),
                ));
            }
            let answer = obs.tell(&begin).and_then(|()| obs.answer(SEAL_WAIT));
            // A waiting observer that died before it read `Begin` (it
            // wrote nothing): the run is asked of a new one, once.
            if answer.is_err()
                && reused
                && !fresh
                && !evidence.join(allox_effects::chain::RECORDS).exists()
            {
                obs.finish(Duration::from_secs(5));
                st.discard_idle();
                fresh = true;
                continue;
            }
            break (obs, answer);
        };
        let baseline = match answer {
            Ok(FromObserver::Sealed { baseline }) => baseline,
            Ok(FromObserver::Failed { why, head }) => {
                obs.finish(Duration::from_secs(5));
                return Err(fault(why, &head));
            }
            Ok(other) => {
                obs.finish(Duration::from_secs(5));
                return Err(fault(
                    format!("the observer answered {other:?} to Begin"),
                    "",
                ));
            }
            Err(why) => {
                obs.finish(Duration::from_secs(5));
                return Err(fault(why, ""));
            }
        };
        made.keep();
        let observer = Arc::new(Mutex::new(Some(obs)));
        let lost = Arc::new(Mutex::new(None));
        let watching = watch(observer.clone(), lost.clone(), run.cgroup.to_path_buf());
        st.live.lock().unwrap_or_else(|e| e.into_inner()).insert(
            key,
            Live {
                run: r.run.into(),
                observer,
                _watching: watching,
                baseline,
                started_ms: allox_store::clock::now_ms(),
                lost,
                recovery,
                context_pid: run.context_pid,
            },
        );
        Ok(())
    }

    fn observe_end(
        &self,
        run: &RunRef<'_>,
        end: ObservedEnd,
        core: &dyn RunCore,
    ) -> Option<RunEffects> {
        let st = self.s().ok()?;
        let key = (run.agent.to_string(), run.session.to_string());
        let live = {
            let mut g = st.live.lock().unwrap_or_else(|e| e.into_inner());
            match g.get(&key) {
                Some(l) if l.run == run.run => g.remove(&key),
                _ => None,
            }
        }?;
        let evidence = st.evidence(run.agent, run.session, run.run);
        let obs = live
            .observer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let lost = live.lost.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let fault = lost.clone().or(end.fault.clone());
        let mut obs = obs;
        let answer = match obs.as_mut() {
            Some(o) => {
                let mut a = o.ask(
                    &ToObserver::End(End {
                        status: end.status.clone(),
                        survivors: end.survivors.clone(),
                        init_pid: end.init_pid,
                        fault: fault.clone(),
                    }),
                    CLOSE_WAIT,
                );
                if let (Ok(FromObserver::CapturedB { head }), Some(plan)) = (&a, &live.recovery) {
                    let rec = st.recover_workspace(run, plan, head, live.context_pid, core);
                    a = o.ask(&ToObserver::Recovered(Box::new(rec)), CLOSE_WAIT);
                }
                a
            }
            None => Err("the observer is gone".into()),
        };
        // Whether the observer may observe the next run.
        let mut reusable = false;
        let effects = match answer {
            Ok(FromObserver::Closed(e)) => {
                let mut e = *e;
                st.keep_processes(&evidence, e.history.lost);
                if let Some(why) = &lost {
                    // The observer closed, yet it had gone: not to be trusted.
                    e.fenced = true;
                    e.fence_reason = Some(why.clone());
                    e.verdict = EffectsVerdict::Incomplete;
                } else {
                    // The independent check: the set as written, read back
                    // by the pinned verifier, must be sound and its verdict
                    // follow from its captures. The observer makes the set
                    // durable meanwhile, and says so once it is.
                    let why = match st.verify(&evidence, Some(&e.evidence_root)) {
                        Ok((r, _)) if r.ok => None,
                        Ok((r, _)) => Some(format!(
                            "the verifier disagrees: {}",
                            r.first_bad_line().unwrap_or_default()
                        )),
                        Err(why) => Some(why),
                    };
                    let durable = match obs.as_mut().map(|o| o.answer(CLOSE_WAIT)) {
                        Some(Ok(FromObserver::Durable { root })) if root == e.evidence_root => None,
                        Some(Ok(FromObserver::Durable { root })) => Some(format!(
                            "the observer made a chain with root {root} durable, not the {} it answered",
                            e.evidence_root
                        )),
                        Some(Ok(FromObserver::Failed { why, .. })) => Some(why),
                        Some(Ok(other)) => {
                            Some(format!("the observer answered {other:?} after Closed"))
                        }
                        Some(Err(why)) => Some(why),
                        None => Some("the observer is gone".into()),
                    };
                    if let Some(why) = why.or(durable) {
                        e.fenced = true;
                        e.fence_reason = Some(why);
                        e.verdict = EffectsVerdict::Incomplete;
                    }
                }
                reusable = !e.fenced && lost.is_none();
                if e.fenced {
                    let why = e
                        .fence_reason
                        .clone()
                        .unwrap_or_else(|| "the evidence is INCOMPLETE".into());
                    st.fence(run.agent, run.session, run.run, &why, &e.evidence_root);
                } else if live.recovery.is_some() {
                    // The fence held from B to C: the recovery is verified.
                    st.lift(run, &e.evidence_root, "recovered: A→C verified");
                }
                e
            }
            Ok(FromObserver::Failed { why, head }) => {
                st.fence(run.agent, run.session, run.run, &why, &head);
                st.incomplete(
                    run.agent,
                    run.session,
                    run.run,
                    &why,
                    &head,
                    live.started_ms,
                )
            }
            Ok(other) => {
                let why = format!("the observer answered {other:?} to End");
                st.fence(run.agent, run.session, run.run, &why, &live.baseline);
                st.incomplete(
                    run.agent,
                    run.session,
                    run.run,
                    &why,
                    &live.baseline,
                    live.started_ms,
                )
            }
            Err(why) => {
                let why = lost.unwrap_or(why);
                // What the observer wrote before it went, if anything.
                let root = allox_effects::chain::verify(&evidence, None)
                    .map(|v| v.root)
                    .unwrap_or_else(|_| live.baseline.clone());
                st.fence(run.agent, run.session, run.run, &why, &root);
                st.incomplete(
                    run.agent,
                    run.session,
                    run.run,
                    &why,
                    &root,
                    live.started_ms,
                )
            }
        };
        if let Some(o) = obs {
            if reusable {
                st.give_back(o);
            } else {
                o.finish(Duration::from_secs(5));
            }
        }
        if !reusable {
            // An observer that did not end the run (killed, failed, or
            // one that answered out of turn), gone now: the snapshots it
            // did not get to delete, deleted here.
            for e in allox_effects::observer::files::remove_left(&evidence) {
                tracing::warn!(error = %e, "cannot delete a snapshot the observer left");
            }
        }
        let kept = std::fs::metadata(evidence.join(allox_effects::observer::EFFECTS_FILE))
            .is_ok_and(|m| m.len() > 0);
        if !kept || effects.fenced {
            // The answer is what is kept, whoever made it.
            let _ = fences::write_durably(
                &evidence.join(allox_effects::observer::EFFECTS_FILE),
                &serde_json::to_vec(&effects).unwrap_or_default(),
            );
        }
        // Durable, and last: a supervisor that finds the pending marker
        // after a stop (its removal below is not synced) and this line
        // knows the run's observation ended, its answer kept.
        st.audit(
            run.agent,
            run.session,
            run.run,
            CLOSED,
            &effects.evidence_root,
            None,
        );
        let _ = std::fs::remove_file(evidence.join(PENDING));
        // The run's snapshots, deleted by the observer before it said the
        // set was durable, dropped soon rather than at Btrfs's next
        // periodic commit: left in place, they slow every later snapshot
        // of the same trees (docs/benchmarks.md). Started here, after the
        // audit's sync above (a commit beside it made that sync wait), on
        // a thread of its own: asking for a commit returns only once Btrfs
        // has begun it (0.3-0.7 ms here), which the answer need not wait
        // for.
        let dir = evidence.clone();
        let started = std::thread::Builder::new()
            .name("allox-commit".into())
            .spawn(move || {
                if let Err(e) = allox_store::btrfs::start_commit(&dir) {
                    tracing::warn!(error = %e, "cannot start a commit to drop the run's snapshots");
                }
            });
        if let Err(e) = started {
            tracing::warn!(error = %e, "cannot start a commit to drop the run's snapshots");
        }
        Some(effects)
    }

    fn after_run(&self, run: &RunRef<'_>) {
        let Ok(st) = self.s() else { return };
        let key = (run.agent.to_string(), run.session.to_string());
        let live = {
            let mut g = st.live.lock().unwrap_or_else(|e| e.into_inner());
            match g.get(&key) {
                Some(l) if l.run == run.run => g.remove(&key),
                _ => None,
            }
        };
        // The run's sandbox is gone and its end was never observed: its
        // start failed after A was sealed.
        if let Some(l) = live {
            let obs = l.observer.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(o) = obs {
                o.finish(Duration::from_secs(5));
            }
            let evidence = st.evidence(run.agent, run.session, run.run);
            let root = allox_effects::chain::verify(&evidence, None)
                .map(|v| v.root)
                .unwrap_or(l.baseline);
            st.fence(
                run.agent,
                run.session,
                run.run,
                "the run's start failed after its baseline was sealed",
                &root,
            );
            let _ = std::fs::remove_file(evidence.join(PENDING));
        }
    }

    fn deleted(&self, agent: &str, session: Option<&str>) {
        let Some(st) = self.started.get() else { return };
        for f in st.fences.list(Some(agent)) {
            if session.is_some_and(|s| s != f.session_id) {
                continue;
            }
            if let Err(e) = st.fences.lift(&f.agent_id, &f.session_id) {
                tracing::error!(error = %e, "cannot lift the fence of a deleted session");
                continue;
            }
            st.audit(
                &f.agent_id,
                &f.session_id,
                &f.run_id,
                "lifted",
                &f.evidence_root,
                Some("the session was deleted"),
            );
        }
    }

    fn holds(&self, agent: &str, session: &str) -> Option<String> {
        let st = self.started.get()?;
        let f = st.fences.get(agent, session)?;
        Some(format!(
            "session {agent}/{session} is fenced by system effects: run {} ({}); evidence root {}; lift it with effects.unfence",
            if f.run_id.is_empty() { "unknown" } else { &f.run_id },
            f.reason,
            if f.evidence_root.is_empty() { "none" } else { &f.evidence_root },
        ))
    }

    fn stands_in_for(&self) -> &'static [&'static str] {
        &[crate::plugins::process_tree::NAME]
    }

    fn serve<'a>(&'a self, req: &'a Request, ctx: RouteContext<'a>) -> RouteFuture<'a> {
        Box::pin(async move {
            let st = self.s()?.clone();
            match req {
                Request::ProcessEvents(q) => {
                    let lost = st.lost.clone();
                    let lost = move || lost.load(std::sync::atomic::Ordering::Relaxed);
                    return crate::plugins::process_tree::events_of(&st.events, &lost, q, ctx)
                        .await;
                }
                Request::ProcessTree(q) => {
                    ctx.store.session_info_of(&q.agent_id, &q.session_id)?;
                    return Ok(Response::ProcessTree(st.events.tree(
                        &q.agent_id,
                        &q.session_id,
                        q.run_id.as_deref(),
                    )?));
                }
                _ => {}
            }
            let req = req.clone();
            tokio::task::spawn_blocking(move || serve(&st, &req))
                .await
                .map_err(|e| answered(ErrorCode::Internal, format!("effects request: {e}")))?
        })
    }
}

fn read_effects(dir: &Path) -> Result<RunEffects, PluginError> {
    let p = dir.join(allox_effects::observer::EFFECTS_FILE);
    // Named as a run, not by the store's path on the host.
    let named = || {
        let parts: Vec<String> = dir
            .iter()
            .rev()
            .take(3)
            .map(|c| c.to_string_lossy().into_owned())
            .collect();
        match parts.as_slice() {
            [run, session, agent] => format!("run {agent}/{session}/{run}"),
            _ => "this run".into(),
        }
    };
    let none = || {
        answered(
            ErrorCode::NotFound,
            format!(
                "no effects of {} (not an observed run, or still going)",
                named()
            ),
        )
    };
    // Made empty with the chain: written once the run is answered.
    let bytes = std::fs::read(&p).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => none(),
        _ => answered(ErrorCode::Internal, format!("read {}: {e}", p.display())),
    })?;
    if bytes.is_empty() {
        return Err(none());
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| answered(ErrorCode::Internal, format!("read {}: {e}", p.display())))
}

/// Refuses effects kept for run `a/s/r` that name another run (another
/// run's set put in its place).
fn same_run(e: &RunEffects, a: &str, s: &str, r: &str) -> Result<(), PluginError> {
    if (
        e.agent_id.as_str(),
        e.session_id.as_str(),
        e.run_id.as_str(),
    ) == (a, s, r)
    {
        return Ok(());
    }
    Err(answered(
        ErrorCode::Conflict,
        format!(
            "the evidence kept for run {r} of {a}/{s} is run {} of {}/{}'s: another run's set is in its place (`effects verify` says what holds)",
            e.run_id, e.agent_id, e.session_id
        ),
    ))
}

/// Refuses effects of a run of an earlier session of the name (deleted,
/// and the name taken again): a session made again is another, and its
/// answers were the deleted one's (its evidence is kept, under the state
/// directory, for whoever audits it).
fn of_this_session(st: &Started, e: &RunEffects) -> Result<(), PluginError> {
    let Some(store) = &st.store else {
        return Ok(());
    };
    let made = store
        .session_created(&e.agent_id, &e.session_id)
        .map_err(|x| answered(x.code(), x.to_string()))?;
    if e.started_ms < made {
        return Err(answered(
            ErrorCode::NotFound,
            format!(
                "run {} was of a session {}/{} deleted before this one was made under its name",
                e.run_id, e.agent_id, e.session_id
            ),
        ));
    }
    Ok(())
}

fn check_ids(ids: &[(&'static str, &str)]) -> Result<(), PluginError> {
    for (what, v) in ids {
        allox_protocol::validate_id(what, v)
            .map_err(|e| answered(ErrorCode::InvalidRequest, e.to_string()))?;
    }
    Ok(())
}

fn serve(st: &Started, req: &Request) -> Result<Response, PluginError> {
    match req {
        Request::EffectsGet(g) => {
            check_ids(&[
                ("agent_id", &g.agent_id),
                ("session_id", &g.session_id),
                ("run_id", &g.run_id),
            ])?;
            let mut e = read_effects(&st.evidence(&g.agent_id, &g.session_id, &g.run_id))?;
            same_run(&e, &g.agent_id, &g.session_id, &g.run_id)?;
            of_this_session(st, &e)?;
            // Whether the fence is still up is now, not then.
            e.fenced = st
                .fences
                .get(&g.agent_id, &g.session_id)
                .is_some_and(|f| f.run_id == g.run_id);
            Ok(Response::Effects(Box::new(e)))
        }
        Request::EffectsList(l) => {
            check_ids(&[("agent_id", &l.agent_id), ("session_id", &l.session_id)])?;
            // The session's own runs: none of a session that is not there,
            // and not those of a deleted one whose name it took again (a
            // session made again is another; their evidence is kept).
            let made = match &st.store {
                Some(store) => match store.session_created(&l.agent_id, &l.session_id) {
                    Ok(ms) => ms,
                    Err(e) => return Err(answered(e.code(), e.to_string())),
                },
                None => 0,
            };
            let dir = st.dir.join(&l.agent_id).join(&l.session_id);
            let fence = st.fences.get(&l.agent_id, &l.session_id);
            let mut runs: Vec<EffectsEntry> = std::fs::read_dir(&dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| {
                    let run = e.file_name();
                    read_effects(&e.path()).ok().filter(|x| {
                        same_run(x, &l.agent_id, &l.session_id, &run.to_string_lossy()).is_ok()
                    })
                })
                .filter(|e| e.started_ms >= made)
                .map(|e| EffectsEntry {
                    fenced: fence.as_ref().is_some_and(|f| f.run_id == e.run_id),
                    not_consistent: e
                        .domains
                        .iter()
                        .filter(|d| {
                            !matches!(
                                d.verdict,
                                EffectsVerdict::Consistent | EffectsVerdict::NotObserved
                            )
                        })
                        .map(|d| (d.domain, d.verdict))
                        .collect(),
                    run_id: e.run_id,
                    verdict: e.verdict,
                    evidence_root: e.evidence_root,
                    started_ms: e.started_ms,
                })
                .collect();
            runs.sort_by(|a, b| (a.started_ms, &a.run_id).cmp(&(b.started_ms, &b.run_id)));
            Ok(Response::EffectsListing(EffectsListing { runs }))
        }
        Request::EffectsHistory(h) => {
            check_ids(&[
                ("agent_id", &h.agent_id),
                ("session_id", &h.session_id),
                ("run_id", &h.run_id),
            ])?;
            let dir = st.evidence(&h.agent_id, &h.session_id, &h.run_id);
            let e = read_effects(&dir)?;
            of_this_session(st, &e)?;
            // Made empty with the chain and written at the run's end: an
            // observation that ended in a fault before it left it empty.
            let written = std::fs::metadata(dir.join(allox_effects::observer::HISTORY_FILE))
                .is_ok_and(|m| m.len() > 0);
            if !written {
                return Err(answered(
                    ErrorCode::NotFound,
                    format!(
                        "run {} has no history: its observation ended before the history was written ({})",
                        h.run_id,
                        e.fence_reason.as_deref().unwrap_or("its evidence is incomplete")
                    ),
                ));
            }
            let records = allox_effects::observer::read_history(&dir).map_err(|e| {
                answered(
                    ErrorCode::NotFound,
                    format!("no history in {}: {e}", dir.display()),
                )
            })?;
            let limit = h.limit.unwrap_or(1000).clamp(1, 10_000) as usize;
            let from = h.cursor.map(|c| c + 1).unwrap_or(0);
            let page: Vec<_> = records
                .into_iter()
                .filter(|r| r.seq >= from)
                .take(limit + 1)
                .collect();
            let more = page.len() > limit;
            let page: Vec<_> = page.into_iter().take(limit).collect();
            Ok(Response::EffectsHistory(
                allox_protocol::EffectsHistoryListing {
                    next: if more {
                        page.last().map(|r| r.seq)
                    } else {
                        None
                    },
                    records: page,
                    counters: e.history,
                },
            ))
        }
        Request::EffectsStatus(s) => Ok(Response::EffectsStatus(EffectsStatus {
            protocol: EFFECTS_PROTOCOL,
            observer_sha256: st.exe.sha256.clone(),
            verifier_sha256: st.verifier.sha256.clone(),
            domains: st.scope.domains.clone(),
            scope_file: st.scope_file.as_ref().map(|p| p.display().to_string()),
            fences: st.fences.list(s.agent_id.as_deref()),
            observing: st.live.lock().unwrap_or_else(|e| e.into_inner()).len() as u32,
            lsm_hooks: st.lsm,
            recover_sha256: st.recover.sha256.clone(),
        })),
        Request::EffectsUnfence(u) => {
            check_ids(&[
                ("agent_id", &u.agent_id),
                ("session_id", &u.session_id),
                ("run_id", &u.run_id),
            ])?;
            let Some(f) = st.fences.get(&u.agent_id, &u.session_id) else {
                return Err(answered(
                    ErrorCode::NotFound,
                    format!("session {}/{} is not fenced", u.agent_id, u.session_id),
                ));
            };
            if f.run_id != u.run_id || f.evidence_root != u.evidence_root {
                st.audit(
                    &u.agent_id,
                    &u.session_id,
                    &u.run_id,
                    "unfence refused",
                    &u.evidence_root,
                    Some("not the fencing run's root"),
                );
                return Err(answered(
                    ErrorCode::Conflict,
                    format!(
                        "session {}/{} is fenced by run {} with evidence root {}: give that run and that root",
                        u.agent_id,
                        u.session_id,
                        if f.run_id.is_empty() { "unknown" } else { &f.run_id },
                        if f.evidence_root.is_empty() { "none" } else { &f.evidence_root }
                    ),
                ));
            }
            st.fences.lift(&u.agent_id, &u.session_id).map_err(|e| {
                answered(ErrorCode::Internal, format!("lift the fence durably: {e}"))
            })?;
            st.audit(
                &u.agent_id,
                &u.session_id,
                &u.run_id,
                "unfenced",
                &u.evidence_root,
                None,
            );
            Ok(Response::EffectsUnfenced(EffectsUnfenced {
                agent_id: u.agent_id.clone(),
                session_id: u.session_id.clone(),
                run_id: u.run_id.clone(),
            }))
        }
        Request::EffectsVerify(v) => {
            let dir = closed_set(st, &v.agent_id, &v.session_id, &v.run_id)?;
            if let Some(r) = &v.evidence_root {
                if r.len() != 64 || !r.bytes().all(|c| c.is_ascii_hexdigit()) {
                    return Err(answered(
                        ErrorCode::InvalidRequest,
                        format!("evidence_root {r:?} is not a sha256 in hex"),
                    ));
                }
            }
            // Without a root of the client's, the one the audit kept when
            // the run was answered: a set made again, or another run's set
            // put in its place, does not end there.
            let kept = v.evidence_root.clone().or_else(|| {
                audited_root(&st.dir.join(AUDIT), &v.agent_id, &v.session_id, &v.run_id)
            });
            let (mut r, mut text) = st
                .verify(&dir, kept.as_deref())
                .map_err(|why| answered(ErrorCode::Internal, why))?;
            // And the set must be the run's asked about.
            let ids = (
                r.agent_id.as_deref(),
                r.session_id.as_deref(),
                r.run_id.as_deref(),
            );
            if r.ok
                && ids
                    != (
                        Some(v.agent_id.as_str()),
                        Some(v.session_id.as_str()),
                        Some(v.run_id.as_str()),
                    )
            {
                allox_effects::verify::not_the_run(
                    &mut r,
                    &format!(
                        "asked about run {} of {}/{}",
                        v.run_id, v.agent_id, v.session_id
                    ),
                );
                text = String::from_utf8_lossy(&allox_effects::verify::report_bytes(&r))
                    .trim_end()
                    .to_string();
            }
            Ok(Response::EffectsVerified(allox_protocol::EffectsVerified {
                ok: r.ok,
                first_bad: r.first_bad_line(),
                report: text,
            }))
        }
        Request::EffectsExport(x) => {
            let dir = closed_set(st, &x.agent_id, &x.session_id, &x.run_id)?;
            // Not another run's set under this run's name.
            if let Ok(e) = read_effects(&dir) {
                same_run(&e, &x.agent_id, &x.session_id, &x.run_id)?;
                of_this_session(st, &e)?;
            }
            let top = format!("effects-{}-{}-{}", x.agent_id, x.session_id, x.run_id);
            let tar = allox_effects::export::tar_set(&dir, &top).map_err(|e| {
                answered(
                    ErrorCode::Internal,
                    format!("read the evidence set {}: {e}", dir.display()),
                )
            })?;
            let size = tar.len() as u64;
            let offset = x.offset.unwrap_or(0);
            if offset > size {
                return Err(answered(
                    ErrorCode::InvalidRequest,
                    format!("offset {offset} is past the export's end ({size} bytes)"),
                ));
            }
            let end = size.min(offset + allox_protocol::FS_CHUNK);
            Ok(Response::EffectsExportChunk(
                allox_protocol::EffectsExportChunk {
                    offset,
                    data: tar[offset as usize..end as usize].to_vec().into(),
                    size,
                    eof: end == size,
                    sha256: allox_effects::chain::sha256_hex(&tar),
                },
            ))
        }
        other => Err(PluginError::NoHandler {
            plugin: NAME,
            action: other.action(),
        }),
    }
}

/// The evidence set of run `a/s/r`, which must exist and be closed (no
/// observation of it going on).
fn closed_set(st: &Started, a: &str, s: &str, r: &str) -> Result<PathBuf, PluginError> {
    check_ids(&[("agent_id", a), ("session_id", s), ("run_id", r)])?;
    let dir = st.evidence(a, s, r);
    if !dir.join(allox_effects::chain::RECORDS).exists() {
        return Err(answered(
            ErrorCode::NotFound,
            format!("no evidence of run {a}/{s}/{r}: not an observed run"),
        ));
    }
    if dir.join(PENDING).exists() {
        return Err(answered(
            ErrorCode::Conflict,
            format!("run {a}/{s}/{r} is still observed: its evidence is not closed"),
        ));
    }
    Ok(dir)
}
