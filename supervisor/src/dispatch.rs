//! From a decoded request to a response: calls the store and writes the
//! audit record of every mutating request.

use crate::runs::{EventSink, Runs, SessionPaths};
use allox_protocol::{
    AgentListing, ErrorBody, ErrorCode, Killed, Pong, ProcessEvents, Request, Response,
    SessionListing, SessionRollback, PROTOCOL_VERSION,
};
use allox_store::audit::Entry;
use allox_store::{Store, StoreError};
use std::sync::Arc;

/// Daemon-wide request policy.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// `--kill-session-processes-on-rollback`: the default of a rollback's
    /// `kill_processes`.
    pub kill_processes_on_rollback: bool,
    /// The supervisor is the child of the guest's PID 1, which powers the
    /// machine off after `system.shutdown`.
    pub power_off_on_shutdown: bool,
}

/// Set by `system.shutdown` (or a signal): the daemon stops, and until it
/// has, every request that would change state is refused.
#[derive(Debug, Default)]
pub struct Stop {
    stopping: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

impl Stop {
    pub fn request(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.notify.notify_one();
    }

    pub fn is_requested(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Resolves once a stop has been requested.
    pub async fn requested(&self) {
        while !self.is_requested() {
            self.notify.notified().await;
        }
    }
}

pub struct Supervisor {
    pub store: Store,
    pub policy: Policy,
    /// Process support; `None` when the daemon runs without it.
    pub runs: Option<Arc<Runs>>,
    pub stop: Stop,
}

impl Supervisor {
    pub fn new(store: Store, policy: Policy, runs: Option<Arc<Runs>>) -> Self {
        Supervisor {
            store,
            policy,
            runs,
            stop: Stop::default(),
        }
    }

    fn runs(&self) -> Result<&Arc<Runs>, ErrorBody> {
        self.runs.as_ref().ok_or_else(|| {
            ErrorBody::new(
                ErrorCode::Unsupported,
                "this supervisor runs without process support (--no-processes)",
            )
        })
    }

    /// Whether a request is answered by [`Supervisor::handle_process`].
    pub fn is_process_request(req: &Request) -> bool {
        matches!(
            req,
            Request::ProcessStart(_)
                | Request::ProcessWait(_)
                | Request::ProcessKill(_)
                | Request::ProcessList(_)
                | Request::ProcessStdin(_)
                | Request::ProcessEvents(_)
                | Request::ProcessTree(_)
        )
    }

    /// Answers a process request (asynchronously: runs can be long), and
    /// audits it if it changes state.
    pub async fn handle_process(
        &self,
        peer: &str,
        request_id: u64,
        req: &Request,
        events: Option<EventSink>,
    ) -> Result<Response, ErrorBody> {
        let out = match self.admit(peer, request_id, req) {
            Err(e) => Err(e),
            Ok(()) => self.answer_process(req, events).await,
        };
        self.audit(peer, request_id, req, &out);
        out
    }

    async fn answer_process(
        &self,
        req: &Request,
        events: Option<EventSink>,
    ) -> Result<Response, ErrorBody> {
        let runs = self.runs()?;
        let session = |a: &str, s: &str| self.store.session_info_of(a, s).map_err(|e| e.to_body());
        match req {
            Request::ProcessStart(p) => {
                session(&p.agent_id, &p.session_id)?;
                let l = self.store.layout();
                let paths = SessionPaths {
                    current: l.current(&p.agent_id, &p.session_id),
                    shared: l.shared(&p.agent_id),
                };
                // Streaming belongs to a request that waits for the end.
                runs.start(p, paths, events.filter(|_| p.stream && p.wait))
                    .await
            }
            Request::ProcessWait(p) => {
                session(&p.agent_id, &p.session_id)?;
                let t = p.timeout_ms.map(std::time::Duration::from_millis);
                Ok(Response::Exited(
                    runs.wait(&p.agent_id, &p.session_id, &p.run_id, t).await?,
                ))
            }
            Request::ProcessKill(p) => {
                session(&p.agent_id, &p.session_id)?;
                Ok(Response::Killed(Killed {
                    killed: runs.kill(p).await?,
                }))
            }
            Request::ProcessList(p) => {
                session(&p.agent_id, &p.session_id)?;
                Ok(Response::Processes(runs.list(&p.agent_id, &p.session_id)))
            }
            Request::ProcessStdin(p) => {
                session(&p.agent_id, &p.session_id)?;
                Ok(Response::StdinWritten(
                    runs.stdin(
                        &p.agent_id,
                        &p.session_id,
                        &p.run_id,
                        p.data.as_bytes(),
                        p.close,
                    )
                    .await?,
                ))
            }
            Request::ProcessEvents(q) => {
                let t = tracker(runs)?;
                let internal = |e: String| ErrorBody::new(ErrorCode::Internal, e);
                if !q.follow {
                    return Ok(Response::ProcessEvents(
                        t.store.query(q, t.lost()).map_err(internal)?,
                    ));
                }
                let Some(sink) = events else {
                    return Err(ErrorBody::invalid(
                        "follow streams events, which only the binary protocol carries; page with cursor instead",
                    ));
                };
                let mut cursor = q.cursor;
                loop {
                    let page = t
                        .store
                        .query(
                            &ProcessEvents {
                                cursor,
                                follow: false,
                                ..q.clone()
                            },
                            t.lost(),
                        )
                        .map_err(internal)?;
                    for e in page.events {
                        if sink.send(allox_protocol::Event::Process(e)).await.is_err() {
                            // The subscriber is gone.
                            return Err(ErrorBody::new(ErrorCode::Unavailable, "subscriber gone"));
                        }
                    }
                    cursor = Some(page.next_cursor);
                    if sink.is_closed() {
                        return Err(ErrorBody::new(ErrorCode::Unavailable, "subscriber gone"));
                    }
                    t.store
                        .wait_newer(page.next_cursor, std::time::Duration::from_secs(1))
                        .await;
                }
            }
            Request::ProcessTree(q) => {
                let t = tracker(runs)?;
                session(&q.agent_id, &q.session_id)?;
                Ok(Response::ProcessTree(
                    t.store
                        .tree(&q.agent_id, &q.session_id, q.run_id.as_deref())
                        .map_err(|e| ErrorBody::new(ErrorCode::Internal, e))?,
                ))
            }
            _ => Err(ErrorBody::new(ErrorCode::Internal, "not a process request")),
        }
    }

    fn audit(&self, peer: &str, request_id: u64, req: &Request, out: &Result<Response, ErrorBody>) {
        if !req.is_mutating() {
            return;
        }
        let entry = Entry {
            request_id,
            peer: peer.to_string(),
            action: req.action().to_string(),
            target: req.target(),
            outcome: match out {
                Ok(_) => "ok".to_string(),
                Err(e) => e.code.as_str().to_string(),
            },
            message: out.as_ref().err().map(|e| e.message.clone()),
        };
        if let Err(e) = self.store.audit().append(entry) {
            tracing::error!(error = %e, "cannot append audit record");
        }
    }

    /// Answers one request from `peer` and audits it if it changes state.
    pub fn handle(
        &self,
        peer: &str,
        request_id: u64,
        req: &Request,
    ) -> Result<Response, ErrorBody> {
        let out = self.admit(peer, request_id, req).and_then(|()| {
            // A panic fails this request only: the store's journal is
            // settled where it happened, fences and locks are guards, and
            // the client is told.
            let answered =
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.answer(req))) {
                    Ok(answered) => answered,
                    Err(panic) => {
                        let why = panic_message(panic);
                        tracing::error!(action = req.action(), %why, "request panicked");
                        return Err(ErrorBody::new(
                            ErrorCode::Internal,
                            format!(
                                "{} failed: the supervisor hit a bug ({why}); the operation was undone or finished, as store.check shows",
                                req.action()
                            ),
                        ));
                    }
                };
            answered.map_err(|e| {
                if matches!(e.code(), allox_protocol::ErrorCode::Internal) {
                    tracing::error!(error = %e.chain(), action = req.action(), "request failed");
                }
                e.to_body()
            })
        });
        self.audit(peer, request_id, req, &out);
        out
    }

    /// Whether a request may go ahead. A change is refused while the
    /// supervisor stops or its store is read-only, and unless the record of
    /// its attempt reaches the audit log first (the audit fails closed:
    /// nothing is done unaudited). `system.shutdown` always goes ahead.
    fn admit(&self, peer: &str, request_id: u64, req: &Request) -> Result<(), ErrorBody> {
        if !req.is_mutating() {
            return Ok(());
        }
        let refused = |why: String| {
            Err(ErrorBody::new(
                ErrorCode::Unavailable,
                format!("{} refused: {why}", req.action()),
            ))
        };
        let shutdown = matches!(req, Request::Shutdown(_));
        if self.stop.is_requested() && !shutdown {
            return refused("the supervisor is shutting down".into());
        }
        if let (Some(why), false) = (self.store.read_only_reason(), shutdown) {
            return refused(why);
        }
        let begun = self.store.audit().append(Entry {
            request_id,
            peer: peer.to_string(),
            action: req.action().to_string(),
            target: req.target(),
            outcome: "begun".to_string(),
            message: None,
        });
        match begun {
            Err(e) if !shutdown => {
                let why = allox_protocol::error_chain(&e);
                tracing::error!(error = %why, action = req.action(), "audit log unwritable; refusing the change");
                refused(format!("its audit record cannot be written ({why})"))
            }
            _ => Ok(()),
        }
    }

    fn answer(&self, req: &Request) -> Result<Response, StoreError> {
        let st = &self.store;
        Ok(match req {
            Request::SystemInfo(_) => Response::System(system_info()),
            Request::Shutdown(_) => {
                tracing::info!("system.shutdown requested");
                self.stop.request();
                Response::Stopping(allox_protocol::Stopping {
                    power_off: self.policy.power_off_on_shutdown,
                })
            }
            Request::Ping(_) => Response::Pong(Pong {
                version: PROTOCOL_VERSION,
                build: allox_protocol::build_identity(),
            }),
            Request::AgentCreate(r) => {
                let info = st.agent_create(&r.agent_id)?;
                if let Some(runs) = &self.runs {
                    // `shared/` is the agent's to write in.
                    runs.own(&st.layout().shared(&r.agent_id));
                }
                if r.auto_checkpoint.is_some() || r.keep_last.is_some() {
                    st.policy_set(&allox_protocol::PolicySet {
                        agent_id: r.agent_id.clone(),
                        session_id: None,
                        auto_checkpoint: r.auto_checkpoint,
                        keep_last: r.keep_last,
                    })?;
                }
                Response::Agent(info)
            }
            Request::AgentList(_) => Response::Agents(AgentListing {
                agents: st.agent_list()?,
            }),
            Request::AgentDelete(r) => {
                // The agent's processes die first, every session of it.
                let Some(runs) = &self.runs else {
                    return Ok(Response::Deleted(st.agent_delete(&r.agent_id)?));
                };
                st.session_list(&r.agent_id)?;
                let dir = runs.cgroups().agent_dir(&r.agent_id);
                // No new run in any of its sessions until it is gone.
                let out = runs.fenced(&r.agent_id, "*", || {
                    runs.kill_tree(&dir, true)
                        .map_err(|e| StoreError::Conflict(e.message))?;
                    st.agent_delete(&r.agent_id)
                });
                Response::Deleted(out?)
            }
            Request::SessionCreate(r) => {
                let limits = allox_sandbox::cgroup::Limits {
                    pids_max: r.pids_max,
                    memory_max: r.memory_max,
                    cpu_max: match &r.cpu_max {
                        Some(t) => Some(allox_sandbox::cgroup::Cgroups::parse_cpu_max(t).ok_or_else(|| {
                            StoreError::Invalid(format!(
                                "cpu_max {t:?} must be \"QUOTA PERIOD\" or \"max PERIOD\" in microseconds"
                            ))
                        })?),
                        None => None,
                    },
                };
                let wants_limits = limits != allox_sandbox::cgroup::Limits::default();
                match &self.runs {
                    Some(runs) => runs
                        .cgroups()
                        .check_limits(&limits)
                        .map_err(|e| StoreError::Unsupported(e.to_string()))?,
                    None if wants_limits => {
                        return Err(StoreError::Unsupported(
                            "resource limits need process support (--no-processes is set)".into(),
                        ))
                    }
                    None => {}
                }
                let info = st.session_create(&r.agent_id, &r.session_id)?;
                if let Some(runs) = &self.runs {
                    runs.own(std::path::Path::new(&info.current));
                    let (a, s) = (&r.agent_id, &r.session_id);
                    let applied = runs
                        .cgroups()
                        .ensure_session(a, s, &runs.config().limits)
                        .and_then(|()| {
                            if wants_limits {
                                runs.cgroups().set_limits(a, s, &limits)
                            } else {
                                Ok(())
                            }
                        });
                    if let Err(e) = applied {
                        // Nothing half-made: the session goes again.
                        let _ = st.session_delete(a, s);
                        let msg = format!("cannot apply the session's limits: {e}");
                        return Err(match e {
                            allox_sandbox::cgroup::CgroupError::Unsupported { .. } => {
                                StoreError::Unsupported(msg)
                            }
                            _ => StoreError::Conflict(msg),
                        });
                    }
                }
                // The session's own policy, then the baseline if it is on.
                if r.auto_checkpoint.is_some() || r.keep_last.is_some() {
                    st.policy_set(&allox_protocol::PolicySet {
                        agent_id: r.agent_id.clone(),
                        session_id: Some(r.session_id.clone()),
                        auto_checkpoint: r.auto_checkpoint,
                        keep_last: r.keep_last,
                    })?;
                }
                st.baseline_if_on(&r.agent_id, &r.session_id)?;
                Response::Session(st.session_info_of(&r.agent_id, &r.session_id)?)
            }
            Request::SessionList(r) => Response::Sessions(SessionListing {
                agent_id: r.agent_id.clone(),
                sessions: st.session_list(&r.agent_id)?,
            }),
            Request::SessionDelete(r) => {
                let (a, s) = (&r.agent_id, &r.session_id);
                st.session_info_of(a, s)?;
                let Some(runs) = &self.runs else {
                    return Ok(Response::Deleted(st.session_delete(a, s)?));
                };
                let dir = runs.cgroups().session_dir(a, s);
                let out = runs.fenced(a, s, || {
                    runs.kill_tree(&dir, true)
                        .map_err(|e| StoreError::Conflict(e.message))?;
                    st.session_delete(a, s)
                });
                Response::Deleted(out?)
            }
            Request::CheckpointCreate(r) => Response::Checkpoint(st.checkpoint_create(r)?),
            Request::CheckpointList(r) => {
                Response::Checkpoints(st.checkpoint_list(&r.agent_id, &r.session_id)?)
            }
            Request::CheckpointDelete(r) => Response::Deleted(st.checkpoint_delete(
                &r.agent_id,
                &r.session_id,
                &r.checkpoint_id,
            )?),
            Request::CheckpointPin(r) => Response::Checkpoint(st.checkpoint_pin(
                &r.agent_id,
                &r.session_id,
                &r.checkpoint_id,
                r.pinned,
            )?),
            Request::SessionRollback(r) => {
                let kill = r
                    .kill_processes
                    .unwrap_or(self.policy.kill_processes_on_rollback);
                let r = SessionRollback {
                    kill_processes: Some(kill),
                    ..r.clone()
                };
                let (a, s) = (&r.agent_id, &r.session_id);
                let Some(runs) = &self.runs else {
                    return Ok(Response::RolledBack(st.rollback(&r)?));
                };
                st.checkpoint_list(a, s)?;
                // No new runs while the session is checked, killed and
                // rolled back.
                let out = runs.fenced(a, s, || {
                    let mut killed = 0;
                    // Any process counts, a sandbox still being set up too.
                    // A run that has just ended leaves its sandbox's init
                    // for a moment (copying /tmp, reaping), and one that was
                    // starting when the fence went up is stopped by it: with
                    // no program left, wait for them instead of refusing.
                    if runs.occupied(a, s) && runs.live(a, s) == 0 {
                        runs.wait_unoccupied(a, s, std::time::Duration::from_secs(5));
                    }
                    if runs.occupied(a, s) {
                        if !kill {
                            return Err(StoreError::Conflict(format!(
                                "session {a}/{s} has {} live processes (and sandboxes); stop them or pass \"kill_processes\": true",
                                runs.live(a, s)
                            )));
                        }
                        let dir = runs.cgroups().session_dir(a, s);
                        killed = runs
                            .kill_tree(&dir, false)
                            .map_err(|e| StoreError::Conflict(e.message))?;
                    }
                    let mut done = st.rollback(&r)?;
                    done.killed_processes = killed;
                    Ok(done)
                });
                Response::RolledBack(out?)
            }
            Request::ProcessStart(_)
            | Request::ProcessWait(_)
            | Request::ProcessKill(_)
            | Request::ProcessList(_)
            | Request::ProcessStdin(_)
            | Request::ProcessEvents(_)
            | Request::ProcessTree(_) => {
                return Err(StoreError::Unsupported(
                    "process actions are answered asynchronously".into(),
                ))
            }
            Request::TurnBegin(r) => Response::Turn(st.turn_begin(r)?),
            Request::TurnEnd(r) => Response::Turn(st.turn_end(r)?),
            Request::PolicySet(r) => Response::Policy(st.policy_set(r)?),
            Request::CheckpointDiff(r) => Response::Diff(st.checkpoint_diff(r)?),
            Request::StoreCheck(_) => Response::StoreCheck(st.check()?),
            Request::AuditList(r) => {
                let limit = r.limit.unwrap_or(100).clamp(1, 10_000) as usize;
                Response::Audit(st.audit().read(r.after_seq.unwrap_or(0), limit)?)
            }
        })
    }
}

/// The message a panic carried.
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(p) => p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .unwrap_or_else(|| "a panic without a message".into()),
    }
}

fn tracker(runs: &Runs) -> Result<&Arc<crate::tracker::ProcessTracker>, ErrorBody> {
    runs.config().tracker.as_ref().ok_or_else(|| {
        ErrorBody::new(
            ErrorCode::Unsupported,
            "the process tracker is off; start the supervisor with --process-tracker ebpf",
        )
    })
}

/// What `system.info` reports, read from /proc.
fn system_info() -> allox_protocol::SystemInfo {
    let rss = |pid: &str| -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            })
            .unwrap_or(0)
    };
    let (mut processes, mut init_zombies) = (0u32, 0u32);
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        processes += 1;
        // After the command's closing parenthesis: state, ppid.
        let mut rest = stat
            .rsplit_once(')')
            .map(|(_, r)| r)
            .unwrap_or("")
            .split_whitespace();
        if let (Some("Z"), Some("1")) = (rest.next(), rest.next()) {
            init_zombies += 1;
        }
    }
    let uptime_ms = std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .map(|s| (s * 1000.0) as u64)
        .unwrap_or(0);
    let ppid = rustix::process::getppid().map(|p| p.as_raw_nonzero().get());
    allox_protocol::SystemInfo {
        uptime_ms,
        supervisor_pid: std::process::id(),
        under_init: ppid == Some(1),
        init_rss_kib: rss("1"),
        supervisor_rss_kib: rss("self"),
        processes,
        init_zombies,
    }
}
