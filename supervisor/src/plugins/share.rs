//! The `share` plugin (`--share-tools`): sessions reach each other's files
//! through the in-sandbox interface, the seed's share plugin.
//!
//! Sharing is off by default and read-only by default. A session turns it
//! on with `allox share enable [--scope DIR] [--permission read|write]`
//! (or `python3 /run/allox/share.py enable ...`); from then on every other
//! session that shares too may list, stat and read — and, with `write`,
//! write — the files below its scope, naming it `agent/session`. No key is
//! handed out: the caller is the run whose guest socket the request came
//! through. `disable` refuses every request decided after it answers.
//!
//! Each access is resolved by the core's file API beneath the target's
//! scope, reached without following links; it holds the target's access
//! guard, so a rollback of the target and the access exclude each other
//! (`conflict`), and a write is refused while the target has a live run.
//! Every access and every change of sharing is recorded in
//! `state/share-audit.log`; the choices are kept in `state/share.json`
//! ([`state`]). The host sees and changes them with `share.list`,
//! `share.agent.set` and `share.session.set`.

pub mod state;

pub use super::defaults::share::NAME;
use super::records::{Numbered, Records};
use super::slot::Slot;
use crate::plugin_api::{
    Contribution, Core, Manifest, Plugin, PluginError, RouteContext, RouteFuture, RunRef,
    SessionDir, Settings, WriteWithin, API_VERSION,
};
use allox_protocol::sandbox_api::SandboxCaller;
use allox_protocol::{
    validate_id, ErrorBody, ErrorCode, Request, Response, ShareAgentSet, ShareAuditRecord,
    ShareData, ShareEnable, ShareInfo, ShareListing, ShareOrigin, SharePath, SharePermission,
    ShareRead, ShareStatus, ShareWrite, SHARE_READ_MAX, SHARE_WRITE_MAX,
};
use serde::de::DeserializeOwned;
use state::Saved;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Where the choices are kept, in the store's `state/`.
pub const STATE_FILE: &str = "share.json";

/// The audit file, in the store's `state/`; bounded in size
/// (`--audit-file-bytes`: past it, renamed `share-audit.log.1`, replacing
/// the one before) and in lines a second for each session
/// (`--audit-lines-per-s`: past it, lines are counted and the next one
/// written is preceded by one saying how many were left out).
pub const AUDIT_FILE: &str = "share-audit.log";

/// The bytes of a path or message an audit line keeps: the rest is cut,
/// with a marker saying how long it was.
pub const AUDIT_TEXT_MAX: usize = 256;

/// Where the seed's entry point appears inside the sandbox.
pub const SHIM: &str = "/run/allox/share.py";

/// The routes it serves inside sandboxes.
pub const SANDBOX_ROUTES: &[&str] = &[
    "share.enable",
    "share.disable",
    "share.status",
    "share.list",
    "share.stat",
    "share.read",
    "share.write",
];

impl Numbered for ShareAuditRecord {
    fn seq(&self) -> u64 {
        self.seq
    }
    fn set_seq(&mut self, seq: u64) {
        self.seq = seq;
    }
}

struct Started {
    path: PathBuf,
    saved: Mutex<Saved>,
    audit: Records<ShareAuditRecord>,
    /// Audit lines a second, per session.
    lines: allox_store::rate::Buckets,
    /// `share.py`, bound into every sandbox.
    shim: PathBuf,
}

pub struct Share {
    manifest: Manifest,
    started: Slot<Started>,
}

impl Share {
    pub fn new() -> Share {
        Share {
            manifest: Manifest {
                name: NAME,
                api_version: API_VERSION,
                conflicts: &[],
                alias: Some("--share-tools"),
                summary: "sessions that enable sharing reach each other's files (read-only by default) through the in-sandbox interface, audited",
            },
            started: Slot::default(),
        }
    }

    fn started(&self) -> Option<Arc<Started>> {
        self.started.get()
    }
}

impl Default for Share {
    fn default() -> Self {
        Share::new()
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `s`, cut to at most `max` bytes (on a character boundary) with a
/// marker saying how long it was.
fn clipped(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…[cut: {} bytes]", &s[..end], s.len())
}

fn not_started(why: impl Into<String>) -> PluginError {
    PluginError::Start {
        plugin: NAME,
        alias: Some("--share-tools"),
        source: why.into().into(),
    }
}

fn params<T: DeserializeOwned>(route: &str, text: &str) -> Result<T, ErrorBody> {
    serde_json::from_str(text)
        .map_err(|e| ErrorBody::invalid(format!("bad params for {route}: {e}")))
}

fn json(v: &impl serde::Serialize) -> Result<String, ErrorBody> {
    serde_json::to_string(v).map_err(|e| ErrorBody::new(ErrorCode::Internal, e.to_string()))
}

/// `agent/session`, checked.
fn target_of(t: &str) -> Result<(&str, &str), ErrorBody> {
    let bad = |why: String| ErrorBody::invalid(format!("target {t:?} {why}"));
    let (a, s) = t
        .split_once('/')
        .ok_or_else(|| bad("is not agent/session".into()))?;
    validate_id("agent_id", a).map_err(|e| bad(e.to_string()))?;
    validate_id("session_id", s).map_err(|e| bad(e.to_string()))?;
    Ok((a, s))
}

/// A scope as given: relative, without `..` (`.` when none is).
fn scope_of(core: &dyn Core, scope: Option<&str>) -> Result<String, ErrorBody> {
    let scope = scope.unwrap_or(".");
    core.relative_path(scope)
        .map_err(|e| ErrorBody::invalid(format!("scope: {}", e.message)))
}

/// What an access needs of the target, once allowed.
struct Allowed {
    agent: String,
    session: String,
    scope: String,
}

impl Allowed {
    /// The target's shared directory, as the core reaches it.
    fn dir(&self) -> SessionDir<'_> {
        SessionDir {
            agent: &self.agent,
            session: &self.session,
            dir: &self.scope,
        }
    }
}

impl Started {
    fn saved(&self) -> std::sync::MutexGuard<'_, Saved> {
        self.saved.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a session's choice (in memory at once, then in the file).
    /// Turning sharing off takes effect even if the file cannot be
    /// written: the error says so.
    fn choose(
        &self,
        core: &dyn Core,
        a: &str,
        s: &str,
        offer: Option<(String, SharePermission)>,
        origin: ShareOrigin,
    ) -> Result<ShareInfo, ErrorBody> {
        let created = core.session_created(a, s)?;
        if offer.is_some() {
            let agent = self.saved().agent(a);
            if !agent.allowed {
                return Err(ErrorBody::new(
                    ErrorCode::Unauthorized,
                    format!("agent {a} may not share files: the host turned sharing off for it (share.agent.set)"),
                ));
            }
        }
        if let Some((scope, _)) = &offer {
            // The scope must be a directory of the session's files now.
            core.stat_within(
                &SessionDir {
                    agent: a,
                    session: s,
                    dir: scope,
                },
                ".",
            )?;
        }
        let turning_off = offer.is_none();
        let mut saved = self.saved();
        let before = saved.clone();
        saved.choose(a, s, created, offer, origin, now_ms());
        let info = saved.effective(a, s, created);
        if let Err(e) = saved.save(&self.path, origin == ShareOrigin::Session) {
            let why = format!("cannot record the choice in {}: {e}", self.path.display());
            let code = crate::plugin_api::state_file::error_code(&e);
            if turning_off {
                return Err(ErrorBody::new(
                    code,
                    format!("sharing of {a}/{s} is off now, but {why}; it may be on again after a restart: turn it off again once there is room"),
                ));
            }
            *saved = before;
            return Err(ErrorBody::new(code, why));
        }
        Ok(info)
    }

    /// Whether session `a/s` may reach `target` (and write there): both
    /// share, and the target allows writes if asked. Decided under the
    /// choices' lock, so nothing is allowed once a `disable` has answered.
    fn allow(
        &self,
        core: &dyn Core,
        a: &str,
        s: &str,
        target: &str,
        write: bool,
    ) -> Result<Allowed, ErrorBody> {
        let (ta, ts) = target_of(target)?;
        let unreachable = || {
            ErrorBody::new(
                ErrorCode::NotFound,
                format!("session {target} does not share its files (or does not exist)"),
            )
        };
        let created = core.session_created(a, s)?;
        let t_created = core.session_created(ta, ts).map_err(|_| unreachable())?;
        let saved = self.saved();
        if !saved.effective(a, s, created).enabled {
            return Err(ErrorBody::new(
                ErrorCode::Unauthorized,
                format!("session {a}/{s} does not share: sessions reach each other only when both share (allox share enable)"),
            ));
        }
        let t = saved.effective(ta, ts, t_created);
        let (true, Some(scope), Some(perm)) = (t.enabled, t.scope, t.permission) else {
            return Err(unreachable());
        };
        if write && perm != SharePermission::Write {
            return Err(ErrorBody::new(
                ErrorCode::Unauthorized,
                format!("session {target} shares its files read-only"),
            ));
        }
        Ok(Allowed {
            agent: ta.into(),
            session: ts.into(),
            scope,
        })
    }

    /// The sessions sharing now (all agents', or `only`'s).
    fn sharing(&self, core: &dyn Core, agents: &[String]) -> Vec<ShareInfo> {
        let mut out = Vec::new();
        for a in agents {
            for (s, created) in core.sessions_of(a) {
                let i = self.saved().effective(a, &s, created);
                if i.enabled {
                    out.push(i);
                }
            }
        }
        out
    }

    /// Admits a guest's call to its session's audit rate, before anything
    /// is served: past it the call is refused (`unavailable`), so that no
    /// access goes unrecorded (one burst of harmless calls made the next
    /// read of another session's file one of a count, its target and path
    /// nowhere). The refused ones are counted in one `suppressed` line when
    /// the next is admitted. The host's calls are not held to a rate.
    fn admit(&self, caller: &str, route: &str) -> Result<(), ErrorBody> {
        let Some((session, _run)) = caller.rsplit_once('/') else {
            return Ok(());
        };
        match self.lines.take(session, 1) {
            allox_store::rate::Taken::No => Err(ErrorBody::new(
                ErrorCode::Unavailable,
                format!(
                    "{session}'s share calls are past its audit rate (--audit-lines-per-s): \
                     every access is recorded, so this one is refused; try again in a moment"
                ),
            )),
            allox_store::rate::Taken::Yes { refused_before: 0 } => Ok(()),
            allox_store::rate::Taken::Yes { refused_before } => {
                self.audit.append(ShareAuditRecord {
                    seq: 0,
                    time_ms: now_ms(),
                    caller: clipped(caller, AUDIT_TEXT_MAX),
                    route: clipped(route, AUDIT_TEXT_MAX),
                    target: session.into(),
                    path: None,
                    verdict: "suppressed".into(),
                    message: Some(format!(
                        "{refused_before} calls of {session} were refused past the session's \
                         rate (--audit-lines-per-s), each before it reached anything: none was served"
                    )),
                });
                Ok(())
            }
        }
    }

    /// Records a call that was admitted ([`Share::admit`]) and gives its
    /// answer, or, when the record cannot be written (the disk is full
    /// past the audit file's room), refuses it: no access goes
    /// unrecorded, so what it read is not given (a write has happened;
    /// its answer says it was not recorded).
    fn audited(
        &self,
        caller: &str,
        route: &str,
        target: &str,
        path: Option<&str>,
        out: Result<String, ErrorBody>,
    ) -> Result<String, ErrorBody> {
        if self.audit(caller, route, target, path, &out) {
            return out;
        }
        let done = if out.is_ok() && route == "share.write" {
            "it was done, but "
        } else {
            ""
        };
        Err(ErrorBody::new(
            ErrorCode::Unavailable,
            format!(
                "{route} of {target}: {done}this access cannot be recorded in {} (is the disk full?), \
                 and no access goes unrecorded; try again once there is room",
                self.audit.path().display()
            ),
        ))
    }

    /// Records a call that was admitted ([`Share::admit`]); whether the
    /// record was written.
    fn audit(
        &self,
        caller: &str,
        route: &str,
        target: &str,
        path: Option<&str>,
        out: &Result<String, ErrorBody>,
    ) -> bool {
        self.audit
            .append_all(vec![ShareAuditRecord {
                seq: 0,
                time_ms: now_ms(),
                caller: clipped(caller, AUDIT_TEXT_MAX),
                route: clipped(route, AUDIT_TEXT_MAX),
                target: clipped(target, AUDIT_TEXT_MAX),
                path: path.map(|p| clipped(p, AUDIT_TEXT_MAX)),
                verdict: match out {
                    Ok(_) => "ok".into(),
                    Err(e) => e.code.as_str().into(),
                },
                message: out
                    .as_ref()
                    .err()
                    .map(|e| clipped(&e.message, 2 * AUDIT_TEXT_MAX)),
            }])
            .is_some()
    }

    /// A guest route, for `who`.
    fn call(
        &self,
        core: &dyn Core,
        who: &SandboxCaller,
        route: &str,
        text: &str,
    ) -> Result<String, ErrorBody> {
        let (a, s) = (who.agent_id.as_str(), who.session_id.as_str());
        let caller = format!("{a}/{s}/{}", who.run_id);
        let own = format!("{a}/{s}");
        if route != "share.status" {
            self.admit(&caller, route)?;
        }
        match route {
            "share.enable" => {
                let out = params::<ShareEnable>(route, text).and_then(|p| {
                    let offer = (
                        scope_of(core, p.scope.as_deref())?,
                        p.permission.unwrap_or_default(),
                    );
                    json(&self.choose(core, a, s, Some(offer), ShareOrigin::Session)?)
                });
                self.audited(&caller, route, &own, None, out)
            }
            "share.disable" => {
                let out = params::<serde_json::Map<String, serde_json::Value>>(route, text)
                    .and_then(|p| match p.keys().next() {
                        Some(k) => Err(ErrorBody::invalid(format!(
                            "bad params for {route}: unknown field `{k}`, there are none"
                        ))),
                        None => json(&self.choose(core, a, s, None, ShareOrigin::Session)?),
                    });
                self.audited(&caller, route, &own, None, out)
            }
            "share.status" => {
                let created = core.session_created(a, s)?;
                let me = self.saved().effective(a, s, created);
                let mut peers = Vec::new();
                if me.enabled {
                    let mut agents: Vec<String> = self.saved().agents.keys().cloned().collect();
                    for k in self.saved().sessions.keys() {
                        if let Some((x, _)) = k.split_once('/') {
                            agents.push(x.to_string());
                        }
                    }
                    agents.sort();
                    agents.dedup();
                    peers = self.sharing(core, &agents);
                    peers.retain(|p| !(p.agent_id == a && p.session_id == s));
                }
                json(&ShareStatus { own: me, peers })
            }
            "share.list" | "share.stat" => {
                let p = params::<SharePath>(route, text)?;
                let path = p.path.clone().unwrap_or_else(|| ".".into());
                let out = self.allow(core, a, s, &p.target, false).and_then(|t| {
                    if route == "share.list" {
                        json(&core.list_within(&t.dir(), &path, p.depth)?)
                    } else {
                        json(&core.stat_within(&t.dir(), &path)?)
                    }
                });
                self.audited(&caller, route, &p.target, Some(&path), out)
            }
            "share.read" => {
                let p = params::<ShareRead>(route, text)?;
                let out = self.allow(core, a, s, &p.target, false).and_then(|t| {
                    let length = Some(p.length.unwrap_or(SHARE_READ_MAX).min(SHARE_READ_MAX));
                    let (file, tree) = core.read_within(&t.dir(), &p.path, p.offset, length)?;
                    if p.tree.is_some_and(|t| t != tree) {
                        return Err(ErrorBody::new(
                            ErrorCode::Conflict,
                            format!("the files of {} were replaced (a rollback) since the tree of the earlier parts; read the file again from its start", p.target),
                        ));
                    }
                    json(&ShareData { file, tree })
                });
                self.audited(&caller, route, &p.target, Some(&p.path), out)
            }
            "share.write" => {
                let p = params::<ShareWrite>(route, text)?;
                let out = check_write(&p)
                    .and_then(|()| self.allow(core, a, s, &p.target, true))
                    .and_then(|t| {
                        let write = WriteWithin {
                            path: p.path.clone(),
                            data: p.data.clone(),
                            offset: p.offset,
                            create: p.create,
                            upload: p
                                .upload
                                .as_deref()
                                .map(|id| caller_upload(&own, id))
                                .transpose()?,
                            commit: p.commit,
                            charged_to: Some(own.clone()),
                        };
                        json(&core.write_within(&t.dir(), write)?)
                    });
                self.audited(&caller, route, &p.target, Some(&p.path), out)
            }
            other => Err(ErrorBody::new(
                ErrorCode::NotFound,
                format!("the share plugin has no route {other:?}"),
            )),
        }
    }
}

/// A caller's upload id as the target has it: tagged with the caller's
/// session, so that no other writer (nor the host) adds to or commits it,
/// and the caller's uploads are told from the target's own.
fn caller_upload(caller: &str, id: &str) -> Result<String, ErrorBody> {
    use sha2::Digest;
    let tag: String = sha2::Sha256::digest(caller.as_bytes())[..5]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let tagged = format!("s{tag}-{id}");
    allox_protocol::validate_id("upload", &tagged).map_err(|_| {
        ErrorBody::invalid(format!(
            "upload id {id:?} is not an id of at most {} bytes (a write to another session tags it with the caller's)",
            allox_protocol::MAX_ID_LEN - tag.len() - 2
        ))
    })?;
    Ok(tagged)
}

/// A write is whole (written beside the file and renamed over it), or a
/// chunk of an upload that its `commit` chunk renames into place.
fn check_write(p: &ShareWrite) -> Result<(), ErrorBody> {
    if p.data.len() > SHARE_WRITE_MAX {
        return Err(ErrorBody::invalid(format!(
            "share.write carries at most {SHARE_WRITE_MAX} bytes ({} given); send a larger file as an upload (upload, offset, commit)",
            p.data.len()
        )));
    }
    if p.offset.is_some() && p.upload.is_none() {
        return Err(ErrorBody::invalid(
            "share.write replaces whole files: an offset is for the chunks of an upload (upload, offset, commit)",
        ));
    }
    Ok(())
}

impl Plugin for Share {
    fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    fn start(&self, settings: &Settings) -> Result<(), PluginError> {
        let path = settings.state_dir.join(STATE_FILE);
        let saved = Saved::load(&path).map_err(|e| not_started(e.to_string()))?;
        // The entry point, then the audit file; a failure leaves neither
        // behind (an audit file that was there stays as it was).
        let shim = settings.state_dir.join("share.py");
        crate::plugin_api::write_shim(&shim, "share")
            .map_err(|e| not_started(format!("write {}: {e}", shim.display())))?;
        let audit_path = settings.state_dir.join(AUDIT_FILE);
        // Room kept for it, as for the daemon's own audit log, so that
        // accesses go on being recorded (and served) on a full disk.
        allox_store::reserve::prepare(
            &audit_path,
            allox_store::reserve::room_for(&settings.state_dir),
        );
        let max = (settings.audit.file_bytes > 0).then_some(settings.audit.file_bytes);
        let audit = Records::open_rotating(&audit_path, max).map_err(|e| {
            let _ = std::fs::remove_file(&shim);
            not_started(format!("open {}: {e}", audit_path.display()))
        })?;
        self.started.fill(Started {
            path,
            saved: Mutex::new(saved),
            audit,
            lines: allox_store::rate::Buckets::new(
                settings.audit.lines_per_s,
                settings.audit.lines_per_s.saturating_mul(10),
            ),
            shim,
        });
        Ok(())
    }

    fn stop(&self) {
        self.started.empty();
    }

    fn contribute(&self, _run: &RunRef<'_>) -> Contribution {
        // The target is what the core checks when it loads the plugins;
        // the source is known once it has started.
        Contribution {
            binds: vec![allox_sandbox::spec::Bind {
                src: self.started().map(|st| st.shim.clone()).unwrap_or_default(),
                dst: SHIM.into(),
                writable: false,
            }],
            ..Contribution::default()
        }
    }

    fn sandbox_routes(&self) -> &'static [&'static str] {
        SANDBOX_ROUTES
    }

    fn sandbox_call(
        &self,
        core: &dyn Core,
        caller: &SandboxCaller,
        route: &str,
        params: &str,
    ) -> Result<String, ErrorBody> {
        let st = self.started().ok_or_else(|| {
            ErrorBody::new(ErrorCode::Unavailable, "the share plugin is stopping")
        })?;
        st.call(core, caller, route, params)
    }

    fn serve<'a>(&'a self, req: &'a Request, ctx: RouteContext<'a>) -> RouteFuture<'a> {
        Box::pin(async move {
            let st = self.started().ok_or_else(|| PluginError::Run {
                plugin: NAME,
                source: "the share plugin is stopping".into(),
            })?;
            let body = |e: ErrorBody| PluginError::Answered(e);
            match req {
                Request::ShareList(q) => {
                    let agents: Vec<String> = match &q.agent_id {
                        Some(a) => {
                            ctx.store.session_list(a)?;
                            vec![a.clone()]
                        }
                        None => ctx
                            .store
                            .agent_list()?
                            .into_iter()
                            .map(|a| a.agent_id)
                            .collect(),
                    };
                    // Choices of sessions deleted since are forgotten.
                    {
                        let mut saved = st.saved();
                        let core = ctx.core;
                        if saved.forget_gone(|a, s, c| core.session_created(a, s) == Ok(c)) {
                            let _ = saved.save(&st.path, false);
                        }
                    }
                    let saved = st.saved().clone();
                    Ok(Response::Shares(ShareListing {
                        shares: st.sharing(ctx.core, &agents),
                        agents: saved
                            .agents
                            .iter()
                            .filter(|(a, _)| agents.contains(a))
                            .map(|(a, x)| x.info(a))
                            .collect(),
                    }))
                }
                Request::ShareAgentSet(p) => Ok(Response::ShareAgent(
                    agent_set(&st, ctx.store, ctx.core, p).map_err(body)?,
                )),
                Request::ShareSessionSet(p) => {
                    let offer = if p.enabled {
                        Some((
                            scope_of(ctx.core, p.scope.as_deref()).map_err(body)?,
                            p.permission.unwrap_or_default(),
                        ))
                    } else {
                        None
                    };
                    let out = st.choose(
                        ctx.core,
                        &p.agent_id,
                        &p.session_id,
                        offer,
                        ShareOrigin::Host,
                    );
                    st.audit(
                        "host",
                        "share.session.set",
                        &format!("{}/{}", p.agent_id, p.session_id),
                        None,
                        &out.as_ref().map(|_| String::new()).map_err(Clone::clone),
                    );
                    Ok(Response::Share(out.map_err(body)?))
                }
                _ => Err(PluginError::NoHandler {
                    plugin: NAME,
                    action: req.action(),
                }),
            }
        })
    }
}

/// `share.agent.set`: an agent's settings, changed where given.
fn agent_set(
    st: &Started,
    store: &allox_store::Store,
    core: &dyn Core,
    p: &ShareAgentSet,
) -> Result<allox_protocol::ShareAgentInfo, ErrorBody> {
    store
        .session_list(&p.agent_id)
        .map_err(|e| PluginError::from(e).to_body())?;
    let scope = p
        .default_scope
        .as_deref()
        .map(|s| scope_of(core, Some(s)))
        .transpose()?;
    let mut saved = st.saved();
    let before = saved.clone();
    let x = saved.agents.entry(p.agent_id.clone()).or_default();
    if let Some(v) = p.allowed {
        x.allowed = v;
    }
    if let Some(v) = p.default_on {
        x.default_on = v;
    }
    if let Some(v) = scope {
        x.default_scope = v;
    }
    if let Some(v) = p.default_permission {
        x.default_permission = v;
    }
    let info = x.info(&p.agent_id);
    if let Err(e) = saved.save(&st.path, false) {
        *saved = before;
        return Err(ErrorBody::new(
            crate::plugin_api::state_file::error_code(&e),
            format!("cannot record the settings in {}: {e}", st.path.display()),
        ));
    }
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;
    use allox_protocol::{FsData, FsEntry, FsKind, FsWritten};
    use std::collections::HashMap;

    /// Sessions by `agent/session` (with their creation times), and the
    /// file requests that reached the core.
    #[derive(Default)]
    struct FakeCore {
        sessions: HashMap<String, u64>,
        seen: Mutex<Vec<(String, String)>>,
    }

    impl Core for FakeCore {
        fn session_created(&self, a: &str, s: &str) -> Result<u64, ErrorBody> {
            self.sessions
                .get(&format!("{a}/{s}"))
                .copied()
                .ok_or_else(|| ErrorBody::new(ErrorCode::NotFound, format!("no {a}/{s}")))
        }
        fn sessions_of(&self, a: &str) -> Vec<(String, u64)> {
            let mut v: Vec<_> = self
                .sessions
                .iter()
                .filter_map(|(k, c)| {
                    let (x, s) = k.split_once('/')?;
                    (x == a).then(|| (s.to_string(), *c))
                })
                .collect();
            v.sort();
            v
        }
        fn relative_path(&self, path: &str) -> Result<String, ErrorBody> {
            // The file API's words for the two ways out.
            if path.starts_with('/') {
                return Err(ErrorBody::invalid(format!("path {path:?} is absolute")));
            }
            if path.split('/').any(|p| p == "..") {
                return Err(ErrorBody::invalid(format!("path {path:?} contains `..`")));
            }
            Ok(if path.is_empty() {
                ".".into()
            } else {
                path.into()
            })
        }
        fn stat_within(&self, d: &SessionDir<'_>, path: &str) -> Result<FsEntry, ErrorBody> {
            self.saw("fs.stat", d, path);
            Ok(FsEntry {
                path: ".".into(),
                kind: FsKind::Dir,
                size: 0,
                mode: 0o755,
                mtime_ms: 0,
                link: None,
                escaped: false,
            })
        }
        fn list_within(
            &self,
            d: &SessionDir<'_>,
            path: &str,
            _depth: Option<u32>,
        ) -> Result<allox_protocol::FsListing, ErrorBody> {
            self.saw("fs.list", d, path);
            Ok(allox_protocol::FsListing {
                entries: Vec::new(),
                truncated: false,
            })
        }
        fn read_within(
            &self,
            d: &SessionDir<'_>,
            path: &str,
            _offset: Option<u64>,
            _length: Option<u64>,
        ) -> Result<(FsData, u64), ErrorBody> {
            self.saw("fs.read", d, path);
            Ok((
                FsData {
                    path: path.into(),
                    offset: 0,
                    data: Bytes(b"report".to_vec()),
                    size: 6,
                    eof: true,
                    inode: 1,
                },
                42,
            ))
        }
        fn write_within(&self, d: &SessionDir<'_>, w: WriteWithin) -> Result<FsWritten, ErrorBody> {
            self.saw("fs.write", d, &w.path);
            Ok(FsWritten {
                path: w.path,
                size: w.data.len() as u64,
                committed: true,
            })
        }
    }

    impl FakeCore {
        /// Records a file operation as `action agent/session:path` with its
        /// directory.
        fn saw(&self, action: &str, d: &SessionDir<'_>, path: &str) {
            self.seen.lock().unwrap().push((
                format!("{action} {}/{}:{path}", d.agent, d.session),
                d.dir.into(),
            ));
        }
    }

    use allox_protocol::Bytes;

    fn who(a: &str, s: &str) -> SandboxCaller {
        SandboxCaller {
            agent_id: a.into(),
            session_id: s.into(),
            run_id: "r1".into(),
        }
    }

    fn started(dir: &std::path::Path) -> Share {
        let p = Share::new();
        p.start(&Settings {
            state_dir: dir.to_path_buf(),
            process_events_max: 10,
            monitor: Default::default(),
            network: Default::default(),
            audit: Default::default(),
            effects: Default::default(),
            metrics: Default::default(),
            store: None,
        })
        .unwrap();
        p
    }

    fn core() -> FakeCore {
        FakeCore {
            sessions: [
                ("agent-a/s1", 1),
                ("agent-b/session-1", 2),
                ("agent-c/s", 3),
            ]
            .into_iter()
            .map(|(k, c)| (k.to_string(), c))
            .collect(),
            ..FakeCore::default()
        }
    }

    fn code(r: Result<String, ErrorBody>) -> ErrorCode {
        r.unwrap_err().code
    }

    #[test]
    fn sessions_reach_each_other_only_when_both_share_and_writes_need_write() {
        let d = tempfile::tempdir().unwrap();
        let p = started(d.path());
        let c = core();
        let (a, b) = (who("agent-a", "s1"), who("agent-b", "session-1"));
        let read = r#"{"target":"agent-b/session-1","path":"report.txt"}"#;
        let write = r#"{"target":"agent-b/session-1","path":"r.txt","data":"aGk="}"#;
        // Neither shares: the caller is told to enable first.
        assert_eq!(
            code(p.sandbox_call(&c, &a, "share.read", read)),
            ErrorCode::Unauthorized
        );
        p.sandbox_call(&c, &a, "share.enable", "{}").unwrap();
        // The target does not share: unreachable, as if it did not exist.
        let e = p.sandbox_call(&c, &a, "share.read", read).unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        assert!(e.message.contains("does not share"), "{}", e.message);
        let e = p
            .sandbox_call(
                &c,
                &a,
                "share.read",
                r#"{"target":"agent-x/nope","path":"f"}"#,
            )
            .unwrap_err();
        assert_eq!(
            e.code,
            ErrorCode::NotFound,
            "a missing session reads the same"
        );
        // Read-only by default.
        p.sandbox_call(&c, &b, "share.enable", r#"{"scope":"out"}"#)
            .unwrap();
        let got: ShareData =
            serde_json::from_str(&p.sandbox_call(&c, &a, "share.read", read).unwrap()).unwrap();
        assert_eq!(got.file.data.0, b"report");
        assert_eq!(got.tree, 42);
        assert_eq!(
            code(p.sandbox_call(&c, &a, "share.write", write)),
            ErrorCode::Unauthorized
        );
        p.sandbox_call(
            &c,
            &b,
            "share.enable",
            r#"{"scope":"out","permission":"write"}"#,
        )
        .unwrap();
        p.sandbox_call(&c, &a, "share.write", write).unwrap();
        // Every access went to the target's scope, never the caller's.
        let seen = c.seen.lock().unwrap().clone();
        assert!(
            seen.iter().all(|(_, dir)| dir == "out" || dir == "."),
            "{seen:?}"
        );
        assert!(seen.contains(&("fs.read agent-b/session-1:report.txt".into(), "out".into())));
        assert!(seen.contains(&("fs.write agent-b/session-1:r.txt".into(), "out".into())));
        // A tree other than the one named is a conflict, not a mix.
        let stale = r#"{"target":"agent-b/session-1","path":"report.txt","offset":6,"tree":41}"#;
        assert_eq!(
            code(p.sandbox_call(&c, &a, "share.read", stale)),
            ErrorCode::Conflict
        );
        // Disabled: refused at once.
        p.sandbox_call(&c, &b, "share.disable", "{}").unwrap();
        assert_eq!(
            code(p.sandbox_call(&c, &a, "share.read", read)),
            ErrorCode::NotFound
        );
    }

    #[test]
    fn bad_parameters_are_named_and_nothing_else_names_the_caller() {
        let d = tempfile::tempdir().unwrap();
        let p = started(d.path());
        let c = core();
        let a = who("agent-a", "s1");
        for (route, params, why) in [
            (
                "share.enable",
                r#"{"agent_id":"agent-b"}"#,
                "unknown field `agent_id`",
            ),
            ("share.enable", r#"{"scope":"../x"}"#, "`..`"),
            ("share.enable", r#"{"scope":"/etc"}"#, "absolute"),
            (
                "share.enable",
                r#"{"permission":"admin"}"#,
                "unknown variant",
            ),
            (
                "share.disable",
                r#"{"session_id":"x"}"#,
                "unknown field `session_id`",
            ),
            (
                "share.read",
                r#"{"target":"agent-b","path":"f"}"#,
                "not agent/session",
            ),
            ("share.read", r#"{"target":"a/../b","path":"f"}"#, "target"),
            (
                "share.write",
                r#"{"target":"agent-b/session-1","path":"f","data":"","offset":3}"#,
                "upload",
            ),
        ] {
            let e = p.sandbox_call(&c, &a, route, params).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidRequest, "{route} {params}");
            assert!(e.message.contains(why), "{route} {params}: {}", e.message);
        }
    }

    #[test]
    fn every_access_is_audited_with_caller_target_path_and_verdict() {
        let d = tempfile::tempdir().unwrap();
        let p = started(d.path());
        let c = core();
        let a = who("agent-a", "s1");
        p.sandbox_call(&c, &a, "share.enable", "{}").unwrap();
        let _ = p.sandbox_call(
            &c,
            &a,
            "share.read",
            r#"{"target":"agent-b/session-1","path":"x"}"#,
        );
        let text = std::fs::read_to_string(d.path().join(AUDIT_FILE)).unwrap();
        let recs: Vec<ShareAuditRecord> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(recs.len(), 2, "{text}");
        assert_eq!(recs[0].route, "share.enable");
        assert_eq!(recs[0].verdict, "ok");
        assert_eq!(recs[1].caller, "agent-a/s1/r1");
        assert_eq!(recs[1].target, "agent-b/session-1");
        assert_eq!(recs[1].path.as_deref(), Some("x"));
        assert_eq!(recs[1].verdict, "not_found");
    }

    #[test]
    fn choices_outlive_the_plugin_and_status_lists_peers() {
        let d = tempfile::tempdir().unwrap();
        let p = started(d.path());
        let c = core();
        p.sandbox_call(&c, &who("agent-b", "session-1"), "share.enable", "{}")
            .unwrap();
        p.stop();
        let p = started(d.path());
        let a = who("agent-a", "s1");
        let st: ShareStatus =
            serde_json::from_str(&p.sandbox_call(&c, &a, "share.status", "{}").unwrap()).unwrap();
        assert!(!st.own.enabled);
        assert!(
            st.peers.is_empty(),
            "a session that does not share sees no one"
        );
        p.sandbox_call(&c, &a, "share.enable", "{}").unwrap();
        let st: ShareStatus =
            serde_json::from_str(&p.sandbox_call(&c, &a, "share.status", "{}").unwrap()).unwrap();
        let peers: Vec<String> = st.peers.iter().map(|p| p.target()).collect();
        assert_eq!(peers, ["agent-b/session-1"]);
    }

    #[test]
    fn audit_lines_are_cut_and_held_to_the_sessions_rate() {
        let d = tempfile::tempdir().unwrap();
        let p = Share::new();
        p.start(&Settings {
            state_dir: d.path().to_path_buf(),
            process_events_max: 10,
            monitor: Default::default(),
            network: Default::default(),
            audit: allox_store::audit::AuditBounds {
                file_bytes: 1 << 20,
                lines_per_s: 2,
            },
            effects: Default::default(),
            metrics: Default::default(),
            store: None,
        })
        .unwrap();
        let st = p.started().unwrap();
        let long = "x".repeat(4096);
        let refused: Result<String, ErrorBody> = Err(ErrorBody::invalid(format!("no {long}")));
        // Past the rate, a call is refused before it is served (and so
        // before anything is recorded of it): none goes unrecorded.
        let mut admitted = 0;
        for _ in 0..100 {
            if st.admit("a/s/r", "share.stat").is_ok() {
                admitted += 1;
                st.audit("a/s/r", "share.stat", "b/t", Some(&long), &refused);
            }
        }
        assert_eq!(admitted, 20);
        let e = st.admit("a/s/r", "share.read").unwrap_err();
        assert_eq!(e.code, ErrorCode::Unavailable, "{e:?}");
        // Another session's calls are not held back.
        st.admit("b/t/r", "share.stat").unwrap();
        st.audit("b/t/r", "share.stat", "a/s", Some("f"), &Ok(String::new()));
        std::thread::sleep(std::time::Duration::from_millis(600));
        st.admit("a/s/r", "share.stat").unwrap();
        st.audit("a/s/r", "share.stat", "b/t", Some(&long), &refused);
        let text = std::fs::read_to_string(d.path().join(AUDIT_FILE)).unwrap();
        let recs: Vec<ShareAuditRecord> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        // The burst (20), the other session's, the count, the last.
        assert_eq!(recs.len(), 23, "{text}");
        assert!(recs
            .iter()
            .all(|r| r.path.as_ref().is_none_or(|p| p.len() < 300)));
        assert!(recs[0]
            .path
            .as_ref()
            .unwrap()
            .ends_with("…[cut: 4096 bytes]"));
        let said: Vec<_> = recs.iter().filter(|r| r.verdict == "suppressed").collect();
        assert_eq!(said.len(), 1);
        assert!(said[0]
            .message
            .as_ref()
            .unwrap()
            .starts_with("81 calls of a/s were refused"));
        assert!(text.len() < 23 * 1200);
    }
}
