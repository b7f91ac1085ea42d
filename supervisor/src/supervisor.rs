//! The supervisor: the store, process support and the daemon's policy
//! behind every client; admits each request, has it answered (`dispatch`)
//! and audits it.

use crate::error::RequestError;
use crate::files::Files;
use crate::plugin_api::{Core, EventSink, SessionDir, WriteWithin};
use crate::plugin_host::Plugins;
use crate::runs::{RunError, Runs};
use allox_protocol::{
    ErrorBody, ErrorCode, FsData, FsEntry, FsList, FsListing, FsRead, FsScope, FsStat, FsWrite,
    FsWritten, Request, Response,
};
use allox_store::audit::Entry;
use allox_store::Store;
use std::sync::Arc;

/// Threads of the daemon's blocking pool, which answers control and guest
/// requests; guest requests take at most half (`SANDBOX_IN_FLIGHT` of the
/// in-sandbox interface).
pub const BLOCKING_THREADS: usize = 32;

/// Daemon-wide request policy.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// `--kill-session-processes-on-rollback`: the default of a rollback's
    /// `kill_processes`.
    pub kill_processes_on_rollback: bool,
    /// The supervisor is the child of the guest's PID 1, which powers the
    /// machine off after `system.shutdown`.
    pub power_off_on_shutdown: bool,
    /// `--uploads-per-session`, `--upload-idle-s`.
    pub uploads: crate::files::uploads::UploadLimits,
    /// `--watches`, `--watches-per-session`.
    pub watches: crate::files::watch::WatchLimits,
    /// `--idle-timeout-ms`: a new session's idle timeout unless it asks
    /// for its own.
    pub idle_timeout_ms: Option<u64>,
    /// `--max-lifetime-ms`: a new session's lifetime unless it asks for
    /// its own.
    pub max_lifetime_ms: Option<u64>,
}

/// Set by `system.shutdown` (or a signal): the daemon stops, and until it
/// has, every request that would change state is refused.
#[derive(Debug, Default)]
pub struct Stop {
    stopping: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
    /// Changes admitted and not yet answered (a run's life is not one of
    /// them): a stop lets them end, and their answers go out, before it
    /// closes the connections.
    changing: std::sync::atomic::AtomicUsize,
    settled: tokio::sync::Notify,
}

/// A change going on ([`Stop::changing`]), counted while it lives.
pub struct Changing<'a>(&'a Stop);

impl Drop for Changing<'_> {
    fn drop(&mut self) {
        if self
            .0
            .changing
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst)
            == 1
        {
            self.0.settled.notify_waiters();
        }
    }
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

    /// Counts `req` among the changes going on while the guard lives,
    /// from before it is admitted (so that a stop requested meanwhile
    /// either waits for it or refuses it). Not a run's start, which lasts
    /// as long as the run (a stop ends the runs), nor the stop's own
    /// request.
    pub fn changing(&self, req: &Request) -> Option<Changing<'_>> {
        let counted =
            req.is_mutating() && !matches!(req, Request::ProcessStart(_) | Request::Shutdown(_));
        counted.then(|| {
            self.changing
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Changing(self)
        })
    }

    /// Waits until no admitted change goes on, at most `limit`: whether
    /// none does.
    pub async fn settled(&self, limit: std::time::Duration) -> bool {
        tokio::time::timeout(limit, async {
            loop {
                let notified = self.settled.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if self.changing.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                    return;
                }
                notified.await;
            }
        })
        .await
        .is_ok()
    }
}

pub struct Supervisor {
    pub store: Arc<Store>,
    pub policy: Policy,
    /// Process support; `None` when the daemon runs without it.
    pub runs: Option<Arc<Runs>>,
    /// The loaded plugins (`plugin.list`, their routes).
    pub plugins: Arc<Plugins>,
    pub stop: Stop,
    /// The network mode of sessions whose request and agent name none
    /// (`--session-network`).
    pub network_default: allox_protocol::NetworkMode,
    /// The file API's uploads under way.
    pub uploads: Arc<crate::files::uploads::Live>,
    /// The file API's watches open.
    pub watches: crate::files::watch::Watches,
    /// The session imports under way.
    pub imports: crate::transfer::Imports,
    /// Each session rolled back (agent, session), for `fs.watch`.
    pub rollbacks: tokio::sync::broadcast::Sender<(String, String)>,
    /// Sessions' idle and lifetime clocks.
    pub clocks: crate::clocks::Clocks,
    /// What `system.metrics` exports (shared with the runs and plugins).
    pub metrics: Arc<crate::plugin_api::metrics::Metrics>,
    /// The sessions' exposed ports (`port.*`).
    pub ports: Arc<crate::ports::Ports>,
}

impl Supervisor {
    pub fn new(
        store: Arc<Store>,
        policy: Policy,
        runs: Option<Arc<Runs>>,
        plugins: Arc<Plugins>,
    ) -> Self {
        let clocks = crate::clocks::Clocks::from_store(&store);
        let ports = Arc::new(crate::ports::Ports::load(&store.layout().state_dir()));
        let uploads = Arc::new(crate::files::uploads::Live::new(policy.uploads));
        // A checkpoint, fork or export of a session leaves out the partial
        // files of its uploads under way (a fork, or the session rolled
        // back, kept them with no record, for ever).
        let live = uploads.clone();
        store.leave_out_of_snapshots(Box::new(move |a, s| live.partials_in(a, s)));
        Supervisor {
            ports,
            uploads,
            watches: crate::files::watch::Watches::new(policy.watches),
            imports: Default::default(),
            store,
            policy,
            runs,
            plugins,
            stop: Stop::default(),
            network_default: allox_protocol::NetworkMode::Disabled,
            rollbacks: tokio::sync::broadcast::channel(64).0,
            clocks,
            metrics: Arc::default(),
        }
    }

    pub(crate) fn runs(&self) -> Result<&Arc<Runs>, RunError> {
        self.runs.as_ref().ok_or(RunError::NoProcesses)
    }

    /// The file API, lent the store, the runs and the uploads.
    pub fn files(&self) -> Files<'_> {
        Files {
            store: &self.store,
            runs: self.runs.as_ref(),
            uploads: &self.uploads,
            watches: &self.watches,
            charged_to: None,
            rollbacks: &self.rollbacks,
        }
    }

    /// Answers a request on the I/O task (what the request table routes
    /// there: a plugin's actions, and runs, waits and streams, which can
    /// be long), and audits it if it changes state.
    pub async fn handle_async(
        &self,
        peer: &str,
        request_id: u64,
        req: &Request,
        events: Option<EventSink>,
    ) -> Result<Response, ErrorBody> {
        use tracing::Instrument;
        let span = request_span(req);
        self.handle_async_in(peer, request_id, req, events)
            .instrument(span)
            .await
    }

    async fn handle_async_in(
        &self,
        peer: &str,
        request_id: u64,
        req: &Request,
        events: Option<EventSink>,
    ) -> Result<Response, ErrorBody> {
        let t0 = std::time::Instant::now();
        let _changing = self.stop.changing(req);
        self.clocks.seen(req);
        let _in_use = self.clocks.in_use(req);
        let admitted = self
            .admit(req, peer, request_id)
            .and_then(|()| self.wake(req));
        // A request whose future is dropped before its answer (its client
        // went away, the daemon stops) still gets its outcome: it was left
        // `begun`, which says the supervisor died in it.
        let mut cut = Cut {
            sup: self,
            peer,
            request_id,
            req,
            t0,
            run: Arc::new(std::sync::OnceLock::new()),
            armed: admitted.is_ok(),
        };
        let out = match admitted {
            Err(e) => Err(e),
            Ok(()) => {
                crate::runs::STARTED
                    .scope(cut.run.clone(), self.answer_async(req, events))
                    .await
            }
        }
        .map_err(|e| self.report(req, e));
        cut.armed = false;
        self.audit(peer, request_id, req, &out);
        self.count(req, &out, t0.elapsed());
        out
    }

    /// The outcome of a request cut before its answer, in the audit log,
    /// the log and the metrics: `cancelled`, with the run it started.
    fn audit_cut(
        &self,
        peer: &str,
        request_id: u64,
        req: &Request,
        run: Option<&str>,
        took: std::time::Duration,
    ) {
        self.metrics.request(req.action(), "cancelled", took);
        if !req.is_mutating() {
            return;
        }
        let message = match run {
            Some(run) => format!("its connection ended before the answer; run {run} had started"),
            None => "its connection ended before the answer".to_string(),
        };
        let sandbox = allox_store::audit::is_guest(peer);
        if let Some(held_back) = if sandbox { sandbox_line() } else { Some(0) } {
            tracing::info!(
                peer,
                request_id,
                outcome = "cancelled",
                run_id = run,
                held_back,
                "request cut before its answer"
            );
        }
        let entry = Entry {
            request_id,
            peer: peer.to_string(),
            action: req.action().to_string(),
            target: req.target(),
            outcome: "cancelled".to_string(),
            message: Some(message),
        };
        if let Err(e) = self.store.audit().append(entry) {
            if let Some(held_back) = if sandbox { sandbox_line() } else { Some(0) } {
                tracing::error!(error = %allox_protocol::error_chain(&e), held_back, "cannot append audit record");
            }
        }
    }

    /// A request answered, in the metrics: its action, outcome and time;
    /// a file's bytes.
    fn count(&self, req: &Request, out: &Result<Response, ErrorBody>, took: std::time::Duration) {
        use crate::plugin_api::metrics::Direction;
        let outcome = match out {
            Ok(_) => "ok",
            Err(e) => e.code.as_str(),
        };
        self.metrics.request(req.action(), outcome, took);
        match (req, out) {
            (Request::FsWrite(w), Ok(_)) => self
                .metrics
                .file_bytes(Direction::In, w.data.0.len() as u64),
            (_, Ok(Response::FsData(d))) => self
                .metrics
                .file_bytes(Direction::Out, d.data.0.len() as u64),
            // A passed file: the bytes the daemon moved (a chunk's end
            // less where it began).
            (Request::FsUploadLocal(u), Ok(Response::FsCopied(c))) => self
                .metrics
                .file_bytes(Direction::In, c.size.saturating_sub(u.offset.unwrap_or(0))),
            (Request::FsDownloadLocal(_), Ok(Response::FsCopied(c))) => {
                self.metrics.file_bytes(Direction::Out, c.size)
            }
            _ => {}
        }
    }

    fn audit(&self, peer: &str, request_id: u64, req: &Request, out: &Result<Response, ErrorBody>) {
        // A sandbox calls as fast as it likes: its lines are held to a
        // rate, each saying how many were left out before it.
        let sandbox = allox_store::audit::is_guest(peer);
        let held_back = if sandbox { sandbox_line() } else { Some(0) };
        // One line per request in the log (its span names it): changes at
        // info, reads at debug; the code and message of a refusal, never
        // the params.
        let outcome = match out {
            Ok(_) => "ok",
            Err(e) => e.code.as_str(),
        };
        let why = out.as_ref().err().map(|e| e.message.as_str());
        if req.is_mutating() {
            // A run started: its id, which the request could not name.
            let run_id = match out {
                Ok(Response::Started(r)) => Some(r.run_id.as_str()),
                Ok(Response::Exited(r)) => Some(r.run_id.as_str()),
                _ => None,
            };
            if let Some(held_back) = held_back {
                tracing::info!(
                    peer,
                    request_id,
                    outcome,
                    why,
                    run_id,
                    held_back,
                    "request answered"
                );
            }
        } else {
            tracing::debug!(peer, request_id, outcome, why, "request answered");
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
            message: match out {
                Err(e) => Some(e.message.clone()),
                // An observed run's evidence root, as its answer carries it.
                Ok(Response::Exited(r)) => r.effects.as_ref().map(|e| {
                    format!(
                        "effects {} of run {}: evidence root {}{}",
                        e.verdict.as_str(),
                        e.run_id,
                        e.evidence_root,
                        if e.fenced { "; session fenced" } else { "" }
                    )
                }),
                Ok(_) => None,
            },
        };
        if let Err(e) = self.store.audit().append(entry) {
            if let Some(held_back) = if sandbox { sandbox_line() } else { Some(0) } {
                tracing::error!(error = %allox_protocol::error_chain(&e), held_back, "cannot append audit record");
            }
        }
    }

    /// Answers one request from `peer` on the calling thread (what the
    /// request table gives `Route::Core`: blocking work) and audits it if
    /// it changes state.
    pub fn handle(
        &self,
        peer: &str,
        request_id: u64,
        req: &Request,
    ) -> Result<Response, ErrorBody> {
        let _span = request_span(req).entered();
        let t0 = std::time::Instant::now();
        let _changing = self.stop.changing(req);
        self.clocks.seen(req);
        let out = self
            .admit(req, peer, request_id)
            .and_then(|()| self.wake(req))
            .and_then(|()| {
                // A panic fails this request only: the store's journal is
                // settled where it happened, fences and locks are guards, and
                // the client is told.
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.answer(req)))
                    .unwrap_or_else(|panic| {
                        let why = crate::panic::message(panic);
                        tracing::error!(action = req.action(), %why, "request panicked");
                        Err(RequestError::Panicked {
                            action: req.action(),
                            why,
                        })
                    })
            })
            .map_err(|e| self.report(req, e));
        self.audit(peer, request_id, req, &out);
        self.count(req, &out, t0.elapsed());
        out
    }

    /// Whether a request may go ahead. A change is refused while the
    /// supervisor stops or its store is read-only, and unless the record of
    /// its attempt reaches the audit log first (the audit fails closed:
    /// nothing is done unaudited). `system.shutdown` always goes ahead.
    fn admit(&self, req: &Request, peer: &str, request_id: u64) -> Result<(), RequestError> {
        if !req.is_mutating() {
            return Ok(());
        }
        let refused = |why: String| {
            Err(RequestError::Refused {
                action: req.action(),
                why,
            })
        };
        let shutdown = matches!(req, Request::Shutdown(_));
        if self.stop.is_requested() && !shutdown {
            return refused("the supervisor is shutting down".into());
        }
        if let (Some(why), false) = (self.store.read_only_reason(), shutdown) {
            return refused(why);
        }
        // An expired session takes no change but its deletion and more
        // time.
        if !matches!(
            req,
            Request::SessionDelete(_) | Request::SessionUpdate(_) | Request::SessionFork(_)
        ) {
            if let Some(why) = self.clocks.expired_why(&req.target()) {
                return refused(why);
            }
        }
        // A session a plugin fenced takes no change but its deletion and
        // the lifting of the fence.
        if !matches!(req, Request::SessionDelete(_) | Request::EffectsUnfence(_)) {
            // A file request's target is `agent/session:path`.
            let target = req.target();
            if let (Some(a), Some(s)) = allox_protocol::target::agent_and_session(&target) {
                if let Some(why) = self.plugins.holds(a, s) {
                    return refused(why);
                }
            }
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
                let sandbox = allox_store::audit::is_guest(peer);
                if let Some(held_back) = if sandbox { sandbox_line() } else { Some(0) } {
                    tracing::error!(error = %why, action = req.action(), held_back, "audit log unwritable; refusing the change");
                }
                refused(format!("its audit record cannot be written ({why})"))
            }
            _ => Ok(()),
        }
    }

    /// Before a request that needs its session to run: a paused session
    /// is resumed (or the request refused while it is held). The other
    /// requests leave a paused session paused: reads, checkpoints, a share
    /// read from another session.
    fn wake(&self, req: &Request) -> Result<(), RequestError> {
        let (a, s) = match req {
            Request::ProcessStart(r) => (&r.agent_id, &r.session_id),
            Request::ProcessWait(r) => (&r.agent_id, &r.session_id),
            Request::ProcessKill(r) => (&r.agent_id, &r.session_id),
            Request::ProcessStdin(r) => (&r.agent_id, &r.session_id),
            Request::ProcessResize(r) => (&r.agent_id, &r.session_id),
            Request::ProcessAttach(r) => (&r.agent_id, &r.session_id),
            Request::FsWrite(r) => (&r.agent_id, &r.session_id),
            Request::FsMkdir(r) => (&r.agent_id, &r.session_id),
            Request::FsRemove(r) => (&r.agent_id, &r.session_id),
            Request::FsMove(r) => (&r.agent_id, &r.session_id),
            Request::TurnBegin(r) => (&r.agent_id, &r.session_id),
            Request::TurnEnd(r) => (&r.agent_id, &r.session_id),
            _ => return Ok(()),
        };
        match &self.runs {
            Some(runs) => Ok(runs.wake(a, s)?),
            None => Ok(()),
        }
    }

    /// What the client is told of a failed request; a failure of the
    /// supervisor or its host is logged too.
    fn report(&self, req: &Request, e: RequestError) -> ErrorBody {
        // A panic was logged where it was caught.
        if e.code() == ErrorCode::Internal && !matches!(e, RequestError::Panicked { .. }) {
            tracing::error!(error = %e.chain(), action = req.action(), "request failed");
        }
        e.to_body()
    }
}

/// What the supervisor lends plugins.
impl Core for Supervisor {
    fn session_created(&self, a: &str, s: &str) -> Result<u64, ErrorBody> {
        self.store
            .session_created(a, s)
            .map_err(|e| RequestError::from(e).to_body())
    }

    fn sessions_of(&self, a: &str) -> Vec<(String, u64)> {
        self.store
            .session_list(a)
            .map(|l| {
                l.into_iter()
                    .map(|i| (i.session_id, i.created_ms))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn relative_path(&self, path: &str) -> Result<String, ErrorBody> {
        crate::files::path::Rel::parse(path)
            .map(|r| r.joined())
            .map_err(|e| RequestError::from(e).to_body())
    }

    fn stat_within(&self, d: &SessionDir<'_>, path: &str) -> Result<FsEntry, ErrorBody> {
        let req = Request::FsStat(FsStat {
            agent_id: d.agent.into(),
            session_id: d.session.into(),
            scope: FsScope::Session,
            checkpoint_id: None,
            path: path.into(),
        });
        match self.within(&req, d)?.0 {
            Response::FsEntry(e) => Ok(e),
            other => Err(answered_otherwise(&req, &other)),
        }
    }

    fn list_within(
        &self,
        d: &SessionDir<'_>,
        path: &str,
        depth: Option<u32>,
    ) -> Result<FsListing, ErrorBody> {
        let req = Request::FsList(FsList {
            agent_id: d.agent.into(),
            session_id: d.session.into(),
            scope: FsScope::Session,
            checkpoint_id: None,
            path: path.into(),
            depth,
        });
        match self.within(&req, d)?.0 {
            Response::FsListing(l) => Ok(l),
            other => Err(answered_otherwise(&req, &other)),
        }
    }

    fn read_within(
        &self,
        d: &SessionDir<'_>,
        path: &str,
        offset: Option<u64>,
        length: Option<u64>,
    ) -> Result<(FsData, u64), ErrorBody> {
        let req = Request::FsRead(FsRead {
            agent_id: d.agent.into(),
            session_id: d.session.into(),
            scope: FsScope::Session,
            checkpoint_id: None,
            path: path.into(),
            offset,
            length,
        });
        match self.within(&req, d)? {
            (Response::FsData(f), tree) => Ok((f, tree)),
            (other, _) => Err(answered_otherwise(&req, &other)),
        }
    }

    fn write_within(&self, d: &SessionDir<'_>, w: WriteWithin) -> Result<FsWritten, ErrorBody> {
        let req = Request::FsWrite(FsWrite {
            agent_id: d.agent.into(),
            session_id: d.session.into(),
            scope: FsScope::Session,
            path: w.path,
            data: w.data,
            offset: w.offset,
            create: w.create,
            truncate: false,
            upload: w.upload,
            commit: w.commit,
            abort: false,
        });
        let files = Files {
            charged_to: w.charged_to.as_deref(),
            ..self.files()
        };
        let answered = files
            .answer_within(&req, d.dir)
            .map_err(|e| RequestError::from(e).to_body())?;
        match answered.0 {
            Response::FsWritten(w) => Ok(w),
            other => Err(answered_otherwise(&req, &other)),
        }
    }
}

impl Supervisor {
    /// A file request answered within the directory `d` of a session's
    /// files, with the id of the tree it came from.
    fn within(&self, req: &Request, d: &SessionDir<'_>) -> Result<(Response, u64), ErrorBody> {
        self.files()
            .answer_within(req, d.dir)
            .map_err(|e| RequestError::from(e).to_body())
    }
}

/// A file request answered with another kind of thing (a bug).
fn answered_otherwise(req: &Request, got: &Response) -> ErrorBody {
    ErrorBody::new(
        ErrorCode::Internal,
        format!("{} answered {}", req.action(), got.kind()),
    )
}

/// An admitted request's outcome, written when its future is dropped
/// before the answer (see [`Supervisor::audit_cut`]).
struct Cut<'a> {
    sup: &'a Supervisor,
    peer: &'a str,
    request_id: u64,
    req: &'a Request,
    t0: std::time::Instant,
    /// The run it started, once known ([`crate::runs::STARTED`]).
    run: Arc<std::sync::OnceLock<String>>,
    armed: bool,
}

impl Drop for Cut<'_> {
    fn drop(&mut self) {
        if self.armed {
            let run = self.run.get().map(String::as_str);
            self.sup
                .audit_cut(self.peer, self.request_id, self.req, run, self.t0.elapsed());
        }
    }
}

/// The span a request's log lines carry (`span` in JSON logs): its action,
/// and the agent, session and run its target names. Never its params (a
/// file's content, a secret).
fn request_span(req: &Request) -> tracing::Span {
    let target = req.target();
    let (agent, session) = allox_protocol::target::agent_and_session(&target);
    let action = req.action();
    // A run's id is the third part of a run's target.
    let run = target
        .splitn(3, '/')
        .nth(2)
        .filter(|_| action.starts_with("process.") || action.starts_with("effects."))
        .filter(|r| !r.is_empty() && !r.contains('/'));
    tracing::info_span!("request", action, agent, session, run)
}

/// Lines of the daemon's log that a sandbox's calls cause, as fast as it
/// makes them: 100 at once, then 10 a second (held back past that, and
/// counted in the next line's `held_back`), whatever the sessions.
static SANDBOX_LINES: std::sync::LazyLock<std::sync::Mutex<crate::ratelimit::RateLimit>> =
    std::sync::LazyLock::new(|| {
        std::sync::Mutex::new(crate::ratelimit::RateLimit::new(
            100,
            std::time::Duration::from_millis(100),
            std::time::Instant::now(),
        ))
    });

/// Whether a line a sandbox caused may be logged now: `Some(n)`, `n` held
/// back before it.
pub(crate) fn sandbox_line() -> Option<u64> {
    SANDBOX_LINES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .allow(std::time::Instant::now())
}
