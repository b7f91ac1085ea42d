//! A guest request answered for its caller — the run whose listener
//! accepted the connection. Turn actions become the host's `turn.begin` /
//! `turn.end` for the caller's own session, admitted and audited by the
//! [`Supervisor`] like any host request, with the caller as the peer.

use super::routes::{RouteOutcome, SandboxRoutes};
use crate::supervisor::Supervisor;
use allox_protocol::sandbox_api::{
    check_route, PluginResult, SandboxCaller, SandboxRequest, SandboxResponse,
};
use allox_protocol::{ErrorBody, ErrorCode, Request, Response, TurnBegin, TurnEnd};
use allox_store::audit::Entry;
use std::collections::HashMap;
use std::sync::{Arc, Weak};

/// What every listener of the daemon shares.
pub struct SandboxApiContext {
    pub sup: Weak<Supervisor>,
    pub routes: Arc<dyn SandboxRoutes>,
    pub in_flight: InFlight,
}

/// Guest requests being answered at once, by every session together: at
/// most half the daemon's blocking pool
/// ([`crate::supervisor::BLOCKING_THREADS`]), so that the host's
/// control requests always find threads whatever the sandboxes ask.
pub const SANDBOX_IN_FLIGHT: usize = 16;
/// Guest requests of one session being answered at once: a session never
/// takes more than a quarter of the guests' share; past it its requests
/// wait (holding no thread) for one of its own to end.
pub const SESSION_IN_FLIGHT: usize = 4;

// The sandboxes never take more than half the pool, a session less than
// all of their share.
const _: () = assert!(
    SANDBOX_IN_FLIGHT <= crate::supervisor::BLOCKING_THREADS / 2
        && SESSION_IN_FLIGHT < SANDBOX_IN_FLIGHT
);

/// The places guest requests take while they are answered: one of
/// [`SANDBOX_IN_FLIGHT`] and one of their session's [`SESSION_IN_FLIGHT`].
pub struct InFlight {
    all: Arc<tokio::sync::Semaphore>,
    per_session: usize,
    sessions: std::sync::Mutex<HashMap<(String, String), Arc<tokio::sync::Semaphore>>>,
}

impl Default for InFlight {
    fn default() -> Self {
        InFlight::new(SANDBOX_IN_FLIGHT, SESSION_IN_FLIGHT)
    }
}

impl InFlight {
    pub fn new(all: usize, per_session: usize) -> InFlight {
        InFlight {
            all: Arc::new(tokio::sync::Semaphore::new(all)),
            per_session,
            sessions: Default::default(),
        }
    }

    /// Waits for a place of `who`'s session, then one of all: held until
    /// the returned places are dropped. The session's place comes first,
    /// so a session at its bound waits without holding one of all.
    async fn take(&self, who: &SandboxCaller) -> Places {
        let key = (who.agent_id.clone(), who.session_id.clone());
        let mine = {
            let mut m = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
            // Sessions no request holds any more are forgotten.
            if m.len() > 1024 {
                m.retain(|_, s| Arc::strong_count(s) > 1);
            }
            m.entry(key)
                .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(self.per_session)))
                .clone()
        };
        // Neither semaphore is ever closed.
        let session = mine.acquire_owned().await.ok();
        let all = self.all.clone().acquire_owned().await.ok();
        Places {
            _session: session,
            _all: all,
        }
    }
}

struct Places {
    _session: Option<tokio::sync::OwnedSemaphorePermit>,
    _all: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// How audit records name a guest caller.
pub fn peer_label(who: &SandboxCaller) -> String {
    format!("guest {}/{}/{}", who.agent_id, who.session_id, who.run_id)
}

pub async fn answer(
    ctx: &Arc<SandboxApiContext>,
    who: &Arc<SandboxCaller>,
    request_id: u64,
    req: SandboxRequest,
) -> Result<SandboxResponse, ErrorBody> {
    let sup = ctx
        .sup
        .upgrade()
        .ok_or_else(|| ErrorBody::new(ErrorCode::Unavailable, "the supervisor is stopping"))?;
    let places = ctx.in_flight.take(who).await;
    let (ctx, who) = (ctx.clone(), who.clone());
    tokio::task::spawn_blocking(move || {
        let _places = places;
        answer_blocking(&sup, &ctx, &who, request_id, req)
    })
    .await
    .unwrap_or_else(|e| {
        Err(ErrorBody::new(
            ErrorCode::Internal,
            format!("the guest request's task failed: {e}"),
        ))
    })
}

fn answer_blocking(
    sup: &Supervisor,
    ctx: &SandboxApiContext,
    who: &SandboxCaller,
    request_id: u64,
    req: SandboxRequest,
) -> Result<SandboxResponse, ErrorBody> {
    let (a, s) = (&who.agent_id, &who.session_id);
    let peer = peer_label(who);
    let turn = |host: Request| match sup.handle(&peer, request_id, &host)? {
        Response::Turn(t) => Ok(SandboxResponse::Turn(t)),
        other => Err(ErrorBody::new(
            ErrorCode::Internal,
            format!("{} answered {other:?}", host.action()),
        )),
    };
    match req {
        SandboxRequest::Whoami(_) => Ok(SandboxResponse::Identity(who.clone())),
        SandboxRequest::TurnBegin(t) => turn(Request::TurnBegin(TurnBegin {
            agent_id: a.clone(),
            session_id: s.clone(),
            turn_id: t.turn_id,
        })),
        SandboxRequest::TurnEnd(t) => {
            let turn_id = match t.turn_id {
                Some(id) => id,
                None => sup
                    .store
                    .open_turn(a, s)
                    .map_err(|e| e.to_body())?
                    .ok_or_else(|| {
                        ErrorBody::new(
                            ErrorCode::Conflict,
                            format!("session {a}/{s} has no turn that has begun and not ended"),
                        )
                    })?,
            };
            turn(Request::TurnEnd(TurnEnd {
                agent_id: a.clone(),
                session_id: s.clone(),
                turn_id,
                status: t.status,
                label: t.label,
            }))
        }
        SandboxRequest::PluginCall(c) => {
            check_route(&c.route)?;
            // Not served if it could not be recorded.
            sup.store.audit().guest_may_record().map_err(|e| {
                ErrorBody::new(ErrorCode::Unavailable, allox_protocol::error_chain(&e))
            })?;
            match ctx.routes.call(sup, who, &c.route, &c.params) {
                // Nothing happened: not recorded (a guest may knock often).
                RouteOutcome::NotOwned => Err(ErrorBody::new(
                    ErrorCode::NotFound,
                    format!("no plugin owns route {:?}", c.route),
                )),
                RouteOutcome::Answered(r) => {
                    let out = r.map(|result| SandboxResponse::Plugin(PluginResult { result }));
                    audit_call(sup, &peer, request_id, who, &c.route, &out);
                    out
                }
            }
        }
    }
}

/// A plugin call's record: the caller, the route and how it went; held to
/// the session's rate (`--audit-lines-per-s`), past which records are
/// counted and said in one.
fn audit_call(
    sup: &Supervisor,
    peer: &str,
    request_id: u64,
    who: &SandboxCaller,
    route: &str,
    out: &Result<SandboxResponse, ErrorBody>,
) {
    let entry = Entry {
        request_id,
        peer: peer.to_string(),
        action: "plugin.call".into(),
        target: format!("{}/{}/{}:{route}", who.agent_id, who.session_id, who.run_id),
        outcome: match out {
            Ok(_) => "ok".into(),
            Err(e) => e.code.as_str().into(),
        },
        message: out.as_ref().err().map(|e| e.message.clone()),
    };
    let session = format!("{}/{}", who.agent_id, who.session_id);
    if let Err(e) = sup.store.audit().append_for(&session, entry) {
        if let Some(held_back) = crate::supervisor::sandbox_line() {
            tracing::error!(error = %allox_protocol::error_chain(&e), held_back, "cannot append audit record");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn who(s: &str) -> SandboxCaller {
        SandboxCaller {
            agent_id: "a".into(),
            session_id: s.into(),
            run_id: "r".into(),
        }
    }

    /// Whether `take` gets its places within a moment.
    async fn gets(f: &InFlight, w: &SandboxCaller) -> Option<Places> {
        tokio::time::timeout(Duration::from_millis(50), f.take(w))
            .await
            .ok()
    }

    #[tokio::test]
    async fn a_session_at_its_bound_waits_and_holds_no_place_of_the_others() {
        let f = InFlight::new(3, 2);
        let (a, b) = (who("a"), who("b"));
        let a1 = gets(&f, &a).await.expect("a's first");
        let _a2 = gets(&f, &a).await.expect("a's second");
        // A third of a's waits; b is not held up by it.
        assert!(gets(&f, &a).await.is_none(), "a went past its bound");
        let b1 = gets(&f, &b).await.expect("b waited for a");
        // All three places are taken: b's second waits for one of all.
        assert!(gets(&f, &b).await.is_none(), "past the bound of all");
        drop(a1);
        let _b2 = gets(&f, &b).await.expect("a place came free");
        drop(b1);
        // The defaults leave the control requests half the pool.
        let d = InFlight::default();
        assert_eq!(d.all.available_permits(), SANDBOX_IN_FLIGHT);
    }
}
