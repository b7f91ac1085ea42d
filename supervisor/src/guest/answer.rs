//! A guest request answered for its caller — the run whose listener
//! accepted the connection. Turn actions become the host's `turn.begin` /
//! `turn.end` for the caller's own session, admitted and audited by the
//! [`Supervisor`] like any host request, with the caller as the peer.

use super::routes::{GuestRoutes, RouteOutcome};
use crate::supervisor::Supervisor;
use allox_protocol::guest::{
    check_route, GuestIdentity, GuestRequest, GuestResponse, PluginResult,
};
use allox_protocol::{ErrorBody, ErrorCode, Request, Response, TurnBegin, TurnEnd};
use allox_store::audit::Entry;
use std::sync::{Arc, Weak};

/// What every listener of the daemon shares.
pub struct GuestContext {
    pub sup: Weak<Supervisor>,
    pub routes: Arc<dyn GuestRoutes>,
}

/// How audit records name a guest caller.
pub fn peer_label(who: &GuestIdentity) -> String {
    format!("guest {}/{}/{}", who.agent_id, who.session_id, who.run_id)
}

pub async fn answer(
    ctx: &Arc<GuestContext>,
    who: &Arc<GuestIdentity>,
    request_id: u64,
    req: GuestRequest,
) -> Result<GuestResponse, ErrorBody> {
    let sup = ctx
        .sup
        .upgrade()
        .ok_or_else(|| ErrorBody::new(ErrorCode::Unavailable, "the supervisor is stopping"))?;
    let (ctx, who) = (ctx.clone(), who.clone());
    tokio::task::spawn_blocking(move || answer_blocking(&sup, &ctx, &who, request_id, req))
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
    ctx: &GuestContext,
    who: &GuestIdentity,
    request_id: u64,
    req: GuestRequest,
) -> Result<GuestResponse, ErrorBody> {
    let (a, s) = (&who.agent_id, &who.session_id);
    let peer = peer_label(who);
    let turn = |host: Request| match sup.handle(&peer, request_id, &host)? {
        Response::Turn(t) => Ok(GuestResponse::Turn(t)),
        other => Err(ErrorBody::new(
            ErrorCode::Internal,
            format!("{} answered {other:?}", host.action()),
        )),
    };
    match req {
        GuestRequest::Whoami(_) => Ok(GuestResponse::Identity(who.clone())),
        GuestRequest::TurnBegin(t) => turn(Request::TurnBegin(TurnBegin {
            agent_id: a.clone(),
            session_id: s.clone(),
            turn_id: t.turn_id,
        })),
        GuestRequest::TurnEnd(t) => {
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
        GuestRequest::PluginCall(c) => {
            check_route(&c.route)?;
            match ctx.routes.call(sup, who, &c.route, &c.params) {
                // Nothing happened: not recorded (a guest may knock often).
                RouteOutcome::NotOwned => Err(ErrorBody::new(
                    ErrorCode::NotFound,
                    format!("no plugin owns route {:?}", c.route),
                )),
                RouteOutcome::Answered(r) => {
                    let out = r.map(|result| GuestResponse::Plugin(PluginResult { result }));
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
    who: &GuestIdentity,
    route: &str,
    out: &Result<GuestResponse, ErrorBody>,
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
        tracing::error!(error = %allox_protocol::error_chain(&e), "cannot append audit record");
    }
}
