//! From a decoded request to its answer: one arm per action the core
//! serves, calling the store, the runs and the files; a plugin's action
//! goes to its plugin. Which path a request takes is the protocol's
//! request table's to say (`Request::route`); admission and the audit
//! record are the [`Supervisor`]'s.

use crate::error::RequestError;
use crate::plugin_api::metrics::StoreOp;
use crate::plugin_api::{RouteContext, SessionNetwork};
use crate::plugins::defaults::network as network_plugin;
use crate::runs::{EventSink, FenceScope, RunError, SessionPaths};
use crate::supervisor::Supervisor;
use allox_protocol::{
    AgentListing, Egress, Killed, NetworkMode, Pong, Request, Response, Route, SessionListing,
    SessionRollback, PROTOCOL_VERSION,
};
use allox_store::StoreError;

impl Supervisor {
    /// Answers a request on the I/O task: the table routes here a
    /// plugin's actions and the core's runs, waits and streams
    /// (`Route::CoreAsync`). A request of `Route::Core` is answered too,
    /// in place.
    pub(crate) async fn answer_async(
        &self,
        req: &Request,
        events: Option<EventSink>,
    ) -> Result<Response, RequestError> {
        match req.route() {
            Route::Plugin(_) => {
                let ctx = RouteContext {
                    store: &self.store,
                    core: self,
                    events,
                };
                return Ok(self.plugins.serve(req, ctx).await?);
            }
            Route::Core => return self.answer(req),
            Route::CoreAsync => {}
        }
        // A few small cgroup files: read on the I/O task, without the
        // blocking pool's hop.
        if let Request::SessionStats(r) = req {
            self.store.session_created(&r.agent_id, &r.session_id)?;
            return Ok(Response::SessionStats(Box::new(
                self.runs()?.session_stats(&r.agent_id, &r.session_id),
            )));
        }
        if let Request::FsWatch(r) = req {
            return Ok(self.files().watch(r, events).await?);
        }
        if let Request::SessionExport(r) = req {
            let limits = match &self.runs {
                Some(runs) => runs.own_limits(&r.agent_id, &r.session_id),
                None => Default::default(),
            };
            let done =
                crate::transfer::export(self.store.clone(), r.clone(), limits, events).await?;
            return Ok(Response::SessionExported(done));
        }
        let runs = self.runs()?;
        let session = |a: &str, s: &str| self.store.session_info_of(a, s);
        match req {
            Request::ProcessStart(p) => {
                session(&p.agent_id, &p.session_id)?;
                let l = self.store.layout();
                let paths = SessionPaths {
                    current: l.current(&p.agent_id, &p.session_id),
                    shared: l.shared(&p.agent_id),
                    network: self.session_network(&p.agent_id, &p.session_id)?,
                };
                // A proxy session of a daemon restarted without the plugin
                // would have no way out at all: said, not left to guess.
                self.check_network(Some(paths.network.mode), None)?;
                // Streaming belongs to a request that waits for the end.
                Ok(runs
                    .start(p, paths, events.filter(|_| p.stream && p.wait))
                    .await?)
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
                    runs.stdin(&p.agent_id, &p.session_id, &p.run_id, &p.data, p.close)
                        .await?,
                ))
            }
            Request::ProcessResize(p) => {
                session(&p.agent_id, &p.session_id)?;
                Ok(Response::Resized(runs.resize(p)?))
            }
            Request::ProcessAttach(p) => {
                session(&p.agent_id, &p.session_id)?;
                Ok(Response::Exited(runs.attach(p, events).await?))
            }
            Request::ProcessLogs(p) => {
                session(&p.agent_id, &p.session_id)?;
                let logs = runs.logs(p, events.filter(|_| p.follow)).await?;
                Ok(Response::Logs(Box::new(logs)))
            }
            _ => Err(RequestError::Misrouted {
                action: req.action(),
                route: req.route(),
            }),
        }
    }

    /// Checks what an `agent.create` or `session.create` asks of the
    /// network, before anything is made.
    pub(crate) fn check_network(
        &self,
        mode: Option<NetworkMode>,
        egress: Option<&Egress>,
    ) -> Result<(), RequestError> {
        if mode == Some(NetworkMode::Proxy) && !self.plugins.has(network_plugin::NAME) {
            return Err(RequestError::NetworkNeedsPlugin(NetworkMode::Proxy));
        }
        if let Some(e) = egress {
            allox_network::check_egress(e.allow.as_deref(), &e.deny)?;
        }
        Ok(())
    }

    /// The limits over time a new session of agent `a` gets when it asks
    /// for `idle` and `life`: its own, else its agent's, else the
    /// daemon's (0: none); `None` when it has neither. (The times are the
    /// session's making, set by the store.)
    pub(crate) fn clock_of(
        &self,
        a: &str,
        idle: Option<u64>,
        life: Option<u64>,
    ) -> Result<Option<allox_store::index::ClockRecord>, RequestError> {
        let agent = self.store.agent_clock(a)?.unwrap_or_default();
        let idle = idle
            .or(agent.idle_timeout_ms)
            .or(self.policy.idle_timeout_ms)
            .filter(|&v| v > 0);
        let life = life
            .or(agent.max_lifetime_ms)
            .or(self.policy.max_lifetime_ms)
            .filter(|&v| v > 0);
        Ok(
            (idle.is_some() || life.is_some()).then(|| allox_store::index::ClockRecord {
                idle_timeout_ms: idle,
                max_lifetime_ms: life,
                ..Default::default()
            }),
        )
    }

    /// The mode a new session of agent `a` gets when it asks for `asked`.
    pub(crate) fn resolve_mode(
        &self,
        a: &str,
        asked: Option<NetworkMode>,
    ) -> Result<NetworkMode, RequestError> {
        let mode = match asked {
            Some(m) => m,
            None => self
                .store
                .network_of(a, None)?
                .mode
                .unwrap_or(self.network_default),
        };
        self.check_network(Some(mode), None)?;
        Ok(mode)
    }

    /// Session `a/s`'s network, as a start needs it.
    pub(crate) fn session_network(&self, a: &str, s: &str) -> Result<SessionNetwork, RequestError> {
        let agent = self.store.network_of(a, None)?;
        let session = self.store.network_of(a, Some(s))?;
        Ok(SessionNetwork {
            // A session made before modes were recorded has the daemon's.
            mode: session.mode.unwrap_or(self.network_default),
            agent: agent.egress,
            session: session.egress,
        })
    }

    pub(crate) fn answer(&self, req: &Request) -> Result<Response, RequestError> {
        let st = &self.store;
        Ok(match req {
            Request::SystemInfo(_) => {
                let mut info = system_info(self.plugins.names(), self.policy.power_off_on_shutdown);
                info.store_read_only = self.store_read_only();
                Response::System(info)
            }
            Request::PluginList(_) => Response::Plugins(self.plugins.listing()),
            Request::Shutdown(_) => {
                tracing::info!("system.shutdown requested");
                self.stop.request();
                Response::Stopping(allox_protocol::Stopping {
                    power_off: self.policy.power_off_on_shutdown,
                })
            }
            Request::SystemResumed(r) => {
                if !self.policy.power_off_on_shutdown {
                    return Err(RequestError::Machine {
                        code: allox_protocol::ErrorCode::Unsupported,
                        why: "system.resumed sets the machine's clock and reseeds its random pool: \
                              only the guest's supervisor (under allox-init) accepts it, not a daemon on a host"
                            .into(),
                    });
                }
                let resumed = crate::resumed::apply(r)?;
                if let Some(runs) = &self.runs {
                    runs.reseed_ids();
                }
                Response::Resumed(resumed)
            }
            Request::Ping(_) => Response::Pong(Pong {
                version: PROTOCOL_VERSION,
                build: allox_protocol::build_identity(),
            }),
            Request::AgentCreate(r) => {
                self.check_network(r.network, r.egress.as_ref())?;
                // Refused before anything is made (as session.create).
                allox_store::check_keep_last(r.keep_last)?;
                let info = st.agent_create_with(
                    &r.agent_id,
                    &allox_store::index::NetworkRecord {
                        mode: r.network,
                        egress: r.egress.clone(),
                    },
                )?;
                if let Some(runs) = &self.runs {
                    // `shared/` is the agent's to write in.
                    runs.own(&st.layout().shared(&r.agent_id));
                }
                if r.idle_timeout_ms.is_some() || r.max_lifetime_ms.is_some() {
                    st.set_agent_clock(
                        &r.agent_id,
                        &allox_store::index::ClockRecord {
                            idle_timeout_ms: r.idle_timeout_ms,
                            max_lifetime_ms: r.max_lifetime_ms,
                            ..Default::default()
                        },
                    )?;
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
                // After any other delete of it (it is then gone).
                let _turn = self
                    .runs
                    .as_ref()
                    .map(|runs| runs.delete_turn(FenceScope::agent(&r.agent_id)));
                // Refused before any process is touched.
                st.agent_delete_allowed(&r.agent_id, r.force)?;
                // The agent's processes die first, every session of it.
                let Some(runs) = &self.runs else {
                    self.files().drop_uploads(&r.agent_id, None, false);
                    let done = st.agent_delete_guarded(&r.agent_id, r.force)?;
                    let _ = self.rollbacks.send((r.agent_id.clone(), String::new()));
                    self.clocks.forget(&r.agent_id, None);
                    return Ok(Response::Deleted(done));
                };
                let dir = runs.cgroups().agent_dir(&r.agent_id);
                // No new run in any of its sessions until it is gone.
                let out = runs.fenced(FenceScope::agent(&r.agent_id), || {
                    // Contexts first (killed and reaped), then the rest.
                    runs.end_contexts_of(&r.agent_id);
                    runs.kill_tree(&dir, true)?;
                    // Its uploads under way go with it (no chunk can come).
                    self.files().drop_uploads(&r.agent_id, None, false);
                    Ok::<_, RequestError>(st.agent_delete_guarded(&r.agent_id, r.force)?)
                });
                // Another delete of it that finished first took its
                // cgroups from under this one: it is gone, as this asked.
                if out.is_err() {
                    st.agent_delete_allowed(&r.agent_id, true)?;
                }
                let out = out?;
                // Watches of its sessions' files end, saying so.
                let _ = self.rollbacks.send((r.agent_id.clone(), String::new()));
                self.clocks.forget(&r.agent_id, None);
                runs.forget(&r.agent_id, None);
                self.plugins.deleted(&r.agent_id, None);
                self.ports.deleted(&r.agent_id, None);
                Response::Deleted(out)
            }
            Request::SessionCreate(r) => {
                let limits = limits_of(r.pids_max, r.memory_max, r.cpu_max.as_deref())?;
                let wants_limits = limits != allox_sandbox::cgroup::Limits::default();
                match &self.runs {
                    Some(runs) => runs
                        .cgroups()
                        .check_limits(&limits)
                        .map_err(RunError::Cgroup)?,
                    None if wants_limits => return Err(RunError::LimitsNeedProcesses.into()),
                    None => {}
                }
                // The network: its rules read and its mode resolved before
                // anything is made, recorded with the session.
                self.check_network(None, r.egress.as_ref())?;
                let network = allox_store::index::NetworkRecord {
                    mode: Some(self.resolve_mode(&r.agent_id, r.network)?),
                    egress: r.egress.clone(),
                };
                // Its limits over time: its own, else its agent's, else the
                // daemon's; recorded with the session too.
                let clock = self.clock_of(&r.agent_id, r.idle_timeout_ms, r.max_lifetime_ms)?;
                // The session's own checkpoint policy, if it has one.
                let policy = (r.auto_checkpoint.is_some() || r.keep_last.is_some()).then_some(
                    allox_store::index::PolicyRecord {
                        auto_checkpoint: r.auto_checkpoint,
                        keep_last: r.keep_last,
                    },
                );
                let new = allox_store::NewSession {
                    network,
                    clock,
                    policy,
                };
                // A delete of the agent waits for the session and its
                // cgroup, and one that came first is seen by the store (a
                // create between the two left the deleted agent's cgroups).
                let _w = self
                    .runs
                    .as_ref()
                    .map(|runs| runs.writing(&r.agent_id, &r.session_id))
                    .transpose()?;
                let info = st.session_create_with(&r.agent_id, &r.session_id, &new)?;
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
                        return Err(RunError::SessionLimits(e).into());
                    }
                    if wants_limits {
                        runs.keep_limits(st, a, s);
                    }
                }
                // The baseline if the policy is on.
                st.baseline_if_on(&r.agent_id, &r.session_id)?;
                Response::Session(st.session_info_of(&r.agent_id, &r.session_id)?)
            }
            Request::SessionList(r) => {
                let mut sessions = st.session_list(&r.agent_id)?;
                if let Some(runs) = &self.runs {
                    for s in &mut sessions {
                        s.paused = runs.paused(&s.agent_id, &s.session_id);
                    }
                }
                Response::Sessions(SessionListing {
                    agent_id: r.agent_id.clone(),
                    sessions,
                })
            }
            Request::SessionDelete(r) => {
                let (a, s) = (&r.agent_id, &r.session_id);
                // After any other delete of it (it is then gone).
                let _turn = self
                    .runs
                    .as_ref()
                    .map(|runs| runs.delete_turn(FenceScope::session(a, s)));
                // Refused before any process is touched.
                st.session_delete_allowed(a, s, r.force)?;
                let Some(runs) = &self.runs else {
                    self.files().drop_uploads(a, Some(s), false);
                    let done = st.session_delete_guarded(a, s, r.force)?;
                    let _ = self.rollbacks.send((a.clone(), s.clone()));
                    self.clocks.forget(a, Some(s));
                    return Ok(Response::Deleted(done));
                };
                let dir = runs.cgroups().session_dir(a, s);
                let out = runs.fenced(FenceScope::session(a, s), || {
                    runs.kill_tree(&dir, true)?;
                    runs.end_context(a, s)?;
                    self.files().drop_uploads(a, Some(s), false);
                    Ok::<_, RequestError>(st.session_delete_guarded(a, s, r.force)?)
                });
                // Another delete that finished first (of it, or of its
                // agent) took its cgroups from under this one: it is gone.
                if out.is_err() {
                    st.session_delete_allowed(a, s, true)?;
                }
                let out = out?;
                // Watches of its files end, saying so.
                let _ = self.rollbacks.send((a.clone(), s.clone()));
                self.clocks.forget(a, Some(s));
                runs.forget(a, Some(s));
                self.plugins.deleted(a, Some(s));
                self.ports.deleted(a, Some(s));
                Response::Deleted(out)
            }
            Request::CheckpointCreate(r) => Response::Checkpoint(
                self.metrics
                    .timed(StoreOp::checkpoint, || st.checkpoint_create(r))?,
            ),
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
                    let done = self.metrics.timed(StoreOp::rollback, || st.rollback(&r))?;
                    self.files().drop_uploads(a, Some(s), true);
                    let _ = self.rollbacks.send((a.clone(), s.clone()));
                    return Ok(Response::RolledBack(done));
                };
                // A rollback that cannot happen (a checkpoint misnamed)
                // is refused before any process is touched.
                st.rollback_allowed(&r)?;
                // No new runs while the session is checked, killed and
                // rolled back.
                let out = runs.fenced(FenceScope::session(a, s), || {
                    let mut killed = 0;
                    st.rollback_allowed(&r)?;
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
                            return Err(RequestError::from(StoreError::SessionBusy {
                                agent: a.into(),
                                session: s.into(),
                                live: runs.live(a, s),
                            }));
                        }
                        let dir = runs.cgroups().session_dir(a, s);
                        killed = runs.kill_tree(&dir, false)?;
                    }
                    let mut done = self.metrics.timed(StoreOp::rollback, || st.rollback(&r))?;
                    // Uploads into the old tree went with it.
                    self.files().drop_uploads(a, Some(s), true);
                    done.killed_processes = killed;
                    Ok(done)
                });
                let done = out?;
                // Watches of the session's files watch the new tree.
                let _ = self.rollbacks.send((a.clone(), s.clone()));
                Response::RolledBack(done)
            }
            Request::FsStat(_)
            | Request::FsList(_)
            | Request::FsRead(_)
            | Request::FsWrite(_)
            | Request::FsMkdir(_)
            | Request::FsRemove(_)
            | Request::FsMove(_)
            | Request::FsUploadLocal(_)
            | Request::FsDownloadLocal(_) => return Ok(self.files().answer(req)?),
            Request::PortExpose(r) => {
                let (a, s) = (&r.agent_id, &r.session_id);
                let mode = st
                    .network_of(a, Some(s))?
                    .mode
                    .unwrap_or(self.network_default);
                let runs = self.runs()?;
                if !runs.has_own_network(mode) {
                    return Err(RequestError::Port {
                        code: allox_protocol::ErrorCode::InvalidRequest,
                        why: format!(
                            "session {a}/{s} is in network mode {mode} and its runs share the daemon's network: only a session with a loopback of its own (isolated or proxy) has ports to expose"
                        ),
                    });
                }
                Response::Port(self.ports.expose(r)?)
            }
            Request::PortUnexpose(r) => {
                st.network_of(&r.agent_id, Some(&r.session_id))?;
                Response::Deleted(allox_protocol::Deleted {
                    deleted: self.ports.unexpose(r)?,
                })
            }
            Request::PortList(r) => {
                st.network_of(&r.agent_id, r.session_id.as_deref())?;
                Response::Ports(self.ports.list(r))
            }
            Request::PortConnect(r) => {
                let runs = self.runs()?;
                let fd = crate::passed::take();
                Response::PortConnected(self.ports.connect(runs, &self.store, r, fd)?)
            }
            Request::SessionImport(r) => {
                // An archive that adds to a session replaces its current/,
                // as a rollback does: not under its runs.
                let added_to = std::cell::Cell::new(false);
                let fence = |a: &str,
                             s: &str,
                             commit: &mut dyn FnMut() -> Result<
                    allox_store::Imported,
                    RequestError,
                >| {
                    added_to.set(true);
                    // The session it adds to is known only now (the
                    // request may not name it): an expired or fenced one
                    // takes no change, as before any other request.
                    let key = format!("{a}/{s}");
                    if let Some(why) = self
                        .clocks
                        .expired_why(&key)
                        .or_else(|| self.plugins.holds(a, s))
                    {
                        return Err(RequestError::Refused {
                            action: "session.import",
                            why,
                        });
                    }
                    let Some(runs) = &self.runs else {
                        return commit();
                    };
                    runs.fenced(FenceScope::session(a, s), || {
                        if runs.occupied(a, s) && runs.live(a, s) == 0 {
                            runs.wait_unoccupied(a, s, std::time::Duration::from_secs(5));
                        }
                        if runs.occupied(a, s) {
                            // (An import has no kill_processes: it says
                            // what to do instead.)
                            return Err(RequestError::Transfer {
                                code: allox_protocol::ErrorCode::Conflict,
                                why: format!(
                                    "session {a}/{s} has {} live processes (and sandboxes): an archive that adds to it replaces its current/; stop them (process.kill, alloxctl kill {a} {s}) and import again",
                                    runs.live(a, s)
                                ),
                            });
                        }
                        commit()
                    })
                };
                // The piece that makes the session: a delete of its agent
                // waits for it and its cgroup (the session's id may be the
                // archive's: the agent's fence covers every one).
                let _w = match (&self.runs, r.commit) {
                    (Some(runs), true) => Some(runs.writing(&r.agent_id, "-")?),
                    _ => None,
                };
                // A new session's limits over time where the archive has
                // none: its agent's, else the daemon's (only looked up as
                // the import begins).
                let clock_default = if r.offset == 0 && !r.abort {
                    self.clock_of(&r.agent_id, None, None)?
                } else {
                    None
                };
                let crate::transfer::Piece {
                    answer: done,
                    limits,
                } = self.imports.piece(&self.store, r, &fence, || {
                    // A new session's network as the archive has it: a mode
                    // this daemon does not serve is refused up front, as
                    // at session.create.
                    let proxy = self.plugins.has(network_plugin::NAME);
                    Box::new(move |n: &allox_store::index::NetworkRecord| {
                        match n.mode {
                            Some(m @ NetworkMode::Proxy) if !proxy => Err(format!(
                                "is in network mode {m}, which needs the network plugin: start the daemon with --plugin network, or import it into one that has it"
                            )),
                            _ => Ok(()),
                        }
                    })
                }, clock_default)?;
                if let Some(i) = &done.session {
                    // Watches of a session an archive added to watch its
                    // new tree.
                    let _ = self
                        .rollbacks
                        .send((i.agent_id.clone(), i.session_id.clone()));
                }
                if let (Some(info), Some(runs)) = (&done.session, &self.runs) {
                    runs.own(std::path::Path::new(&info.current));
                    let (a, s) = (&info.agent_id, &info.session_id);
                    let applied = runs
                        .cgroups()
                        .ensure_session(a, s, &runs.config().limits)
                        .and_then(|()| match limits.filter(|l| *l != Default::default()) {
                            Some(l) => runs.cgroups().set_limits(a, s, &l),
                            None => Ok(()),
                        });
                    if let Err(e) = applied {
                        // Nothing half-made: a new session goes, and the
                        // import again. (One added to keeps what it had.)
                        if !added_to.get() {
                            let _ = st.session_delete(a, s);
                        }
                        return Err(RunError::SessionLimits(e).into());
                    }
                    runs.keep_limits(st, a, s);
                }
                Response::SessionImported(done)
            }
            Request::SessionFork(r) => {
                let na = r.new_agent_id.as_deref().unwrap_or(&r.agent_id);
                let ns = &r.new_session_id;
                // The source's limits, as its cgroup holds them: the fork's.
                let limits = self
                    .runs
                    .as_ref()
                    .map(|runs| runs.cgroups().limits(&r.agent_id, &r.session_id));
                // A session made: its limits over time its agent's, else
                // the daemon's, counted from the fork (none of the source's:
                // a fork of an expired session starts a lifetime of its own).
                let clock = self.clock_of(na, None, None)?;
                // A delete of the fork's agent waits for the fork and its
                // cgroup, and one that came first is seen by the store.
                let _w = self
                    .runs
                    .as_ref()
                    .map(|runs| runs.writing(na, ns))
                    .transpose()?;
                let (info, _) = self
                    .metrics
                    .timed(StoreOp::fork, || st.session_fork_with(r, clock.as_ref()))?;
                if let Some(runs) = &self.runs {
                    runs.own(std::path::Path::new(&info.current));
                    let applied = runs
                        .cgroups()
                        .ensure_session(na, ns, &runs.config().limits)
                        .and_then(|()| match &limits {
                            Some(l) if *l != allox_sandbox::cgroup::Limits::default() => {
                                runs.cgroups().set_limits(na, ns, l)
                            }
                            _ => Ok(()),
                        });
                    if let Err(e) = applied {
                        // Nothing half-made: the fork goes again.
                        let _ = st.session_delete(na, ns);
                        return Err(RunError::SessionLimits(e).into());
                    }
                    runs.keep_limits(st, na, ns);
                }
                Response::Session(info)
            }
            Request::SessionPause(r) => {
                let (a, s) = (&r.agent_id, &r.session_id);
                let runs = self.runs()?;
                // A delete of the session (or its agent) waits for the
                // pause, and one that came first is seen: a pause never
                // makes a deleted session's cgroup again.
                let _w = runs.writing(a, s)?;
                let mut info = st.session_info_of(a, s)?;
                info.paused = Some(runs.pause(a, s, r.hold, "request")?);
                Response::Session(info)
            }
            Request::SessionInfoRequest(r) => {
                let (a, s) = (&r.agent_id, &r.session_id);
                let mut info = st.session_info_of(a, s)?;
                if let Some(runs) = &self.runs {
                    info.paused = runs.paused(a, s);
                }
                Response::Session(info)
            }
            Request::SessionResume(r) => {
                let (a, s) = (&r.agent_id, &r.session_id);
                let info = st.session_info_of(a, s)?;
                self.runs()?.resume(a, s)?;
                Response::Session(info)
            }
            Request::SessionUpdate(r) => {
                let (a, s) = (&r.agent_id, &r.session_id);
                st.session_info_of(a, s)?;
                let info = st.session_info_of(a, s)?;
                let limits = limits_of(r.pids_max, r.memory_max, r.cpu_max.as_deref())?;
                let has_limits = limits != allox_sandbox::cgroup::Limits::default();
                let has_time = r.idle_timeout_ms.is_some() || r.max_lifetime_ms.is_some();
                if !has_limits && !has_time {
                    return Err(StoreError::NothingToUpdate.into());
                }
                let runs = self.runs()?;
                if has_limits {
                    runs.session_update(a, s, &limits)?;
                    runs.keep_limits(st, a, s);
                }
                if has_time {
                    let mut rec = st.clock(a, s)?.unwrap_or(allox_store::index::ClockRecord {
                        lifetime_from_ms: info.created_ms,
                        last_active_ms: info.created_ms,
                        ..Default::default()
                    });
                    if let Some(v) = r.idle_timeout_ms {
                        rec.idle_timeout_ms = (v > 0).then_some(v);
                    }
                    if let Some(v) = r.max_lifetime_ms {
                        // More time counts from now, and an expired
                        // session takes changes again.
                        rec.max_lifetime_ms = (v > 0).then_some(v);
                        rec.lifetime_from_ms = allox_store::clock::now_ms();
                        rec.expired_ms = None;
                    }
                    st.set_clock(a, s, &rec)?;
                    self.clocks.refresh(a, s, &rec);
                }
                Response::SessionStats(Box::new(runs.session_stats(a, s)))
            }
            Request::TurnBegin(r) => Response::Turn(st.turn_begin(r)?),
            Request::TurnEnd(r) => Response::Turn(st.turn_end(r)?),
            Request::PolicySet(r) => Response::Policy(st.policy_set(r)?),
            Request::CheckpointDiff(r) => Response::Diff(
                self.metrics
                    .timed(StoreOp::diff, || st.checkpoint_diff(r))?,
            ),
            Request::SystemMetrics(_) => Response::Metrics(allox_protocol::MetricsText {
                text: self.metrics_text()?,
            }),
            Request::StoreCheck(_) => Response::StoreCheck(st.check()?),
            Request::AuditList(r) => {
                let limit = r.limit.unwrap_or(100).clamp(1, 10_000) as usize;
                Response::Audit(
                    st.audit()
                        .read(r.after_seq, r.before_seq, limit)
                        .map_err(StoreError::from)?,
                )
            }
            // The table gives these to the I/O task (`answer_async`).
            _ => {
                return Err(RequestError::Misrouted {
                    action: req.action(),
                    route: req.route(),
                })
            }
        })
    }
}

impl Supervisor {
    /// Why the store refuses changes, if it does: its own reason, or its
    /// filesystem mounted read-only.
    fn store_read_only(&self) -> Option<String> {
        let st = &self.store;
        st.read_only_reason().or_else(|| {
            rustix::fs::statvfs(st.layout().root())
                .ok()
                .filter(|v| v.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY))
                .map(|_| "the store's filesystem is mounted read-only".to_string())
        })
    }

    /// `system.metrics`: the counters as they stand and the gauges of what
    /// is, read now (the index's agents and sessions, the runs' table and
    /// cgroups, the store's filesystem).
    pub fn metrics_text(&self) -> Result<String, RequestError> {
        use crate::plugin_api::metrics::{SessionState, Snapshot};
        if !self.metrics.enabled() {
            return Err(RequestError::MetricsOff);
        }
        let st = &self.store;
        let index = st.index();
        let agents = index.agents().map_err(StoreError::from)?;
        let mut counts = [0i64; 4];
        for (a, _) in &agents {
            for (s, _) in index.sessions(a).map_err(StoreError::from)? {
                let state = if self.plugins.holds(a, &s).is_some() {
                    SessionState::fenced
                } else if self.clocks.expired_why(&format!("{a}/{s}")).is_some() {
                    SessionState::expired
                } else if self.runs.as_ref().is_some_and(|r| r.is_paused(a, &s)) {
                    SessionState::paused
                } else {
                    SessionState::active
                };
                counts[state as usize] += 1;
            }
        }
        let (runs_live, processes) = self
            .runs
            .as_ref()
            .map(|r| r.live_counts())
            .unwrap_or((0, 0));
        let fs = rustix::fs::statvfs(st.layout().root()).ok();
        let bytes = |blocks: u64| {
            fs.as_ref()
                .map(|v| (blocks.saturating_mul(v.f_frsize)) as i64)
                .unwrap_or(0)
        };
        let snap = Snapshot {
            agents: agents.len() as i64,
            sessions: [
                SessionState::active,
                SessionState::paused,
                SessionState::expired,
                SessionState::fenced,
            ]
            .into_iter()
            .map(|s| (s, counts[s as usize]))
            .collect(),
            runs_live: runs_live as i64,
            processes: processes as i64,
            store_read_only: self.store_read_only().is_some(),
            store_used_bytes: fs
                .as_ref()
                .map_or(0, |v| bytes(v.f_blocks.saturating_sub(v.f_bfree))),
            store_free_bytes: fs.as_ref().map_or(0, |v| bytes(v.f_bavail)),
            store_reserve_bytes: (allox_store::RESERVE_MIB << 20) as i64,
        };
        Ok(self.metrics.encode(&snap))
    }
}

/// What `system.info` reports, read from /proc. `under_init`: this
/// supervisor is the child of the guest's `allox-init` (`--under-init`),
/// whose memory and unreaped children are reported; a host daemon whose
/// parent is the host's PID 1 (started detached, or by systemd) reported
/// that one's as its init's.
fn system_info(plugins: Vec<String>, under_init: bool) -> allox_protocol::SystemInfo {
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
        if let (Some("Z"), Some("1"), true) = (rest.next(), rest.next(), under_init) {
            init_zombies += 1;
        }
    }
    let uptime_ms = std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .map(|s| (s * 1000.0) as u64)
        .unwrap_or(0);
    // The supervisor's start, in clock ticks after boot (field 22).
    let started_ms = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|st| {
            let rest = st.rsplit_once(')')?.1;
            rest.split_whitespace().nth(19)?.parse::<u64>().ok()
        })
        .map(|ticks| ticks * 1000 / rustix::param::clock_ticks_per_second().max(1))
        .unwrap_or(0);
    allox_protocol::SystemInfo {
        uptime_ms,
        supervisor_pid: std::process::id(),
        under_init,
        init_rss_kib: if under_init { rss("1") } else { 0 },
        supervisor_rss_kib: rss("self"),
        processes,
        init_zombies,
        plugins,
        supervisor_uptime_ms: uptime_ms.saturating_sub(started_ms),
        store_read_only: None,
    }
}

/// A session's limits as a request gives them (`cpu_max` as `"QUOTA
/// PERIOD"` or `"max PERIOD"`, µs).
fn limits_of(
    pids_max: Option<u64>,
    memory_max: Option<u64>,
    cpu_max: Option<&str>,
) -> Result<allox_sandbox::cgroup::Limits, StoreError> {
    let limits = allox_sandbox::cgroup::Limits {
        pids_max,
        memory_max,
        cpu_max: match cpu_max {
            Some(t) => Some(
                allox_sandbox::cgroup::Cgroups::parse_cpu_max(t)
                    .ok_or_else(|| StoreError::BadCpuMax(t.to_string()))?,
            ),
            None => None,
        },
    };
    match limits.refused() {
        Some(why) => Err(StoreError::BadLimit(why)),
        None => Ok(limits),
    }
}
