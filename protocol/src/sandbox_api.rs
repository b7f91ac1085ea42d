//! The in-sandbox interface's own small schema: what a program inside a sandbox
//! may ask of the supervisor over `/run/allox/guest.sock`.
//!
//! # Wire format
//!
//! The same as the host protocol's (see the crate documentation): COBS
//! frames ended by a zero byte, at most [`crate::MAX_FRAME`], holding one
//! strictly decoded postcard message ([`crate::decode`]). There is no
//! conversation number (a Unix socket has no earlier host to tell apart).
//!
//! # Conversation
//!
//! The client's first frame is [`SandboxClientFrame::Hello`] with
//! [`SANDBOX_API_PROTOCOL_VERSION`]; the server answers
//! [`SandboxServerFrame::Welcome`], or [`SandboxServerFrame::Refused`]
//! (`version_mismatch`) and closes. Then [`SandboxClientFrame::Request`]s,
//! each answered by one [`SandboxServerFrame::Response`] with its
//! `request_id`, in order.
//!
//! # Who asks
//!
//! No request names an agent, a session or a run: the caller is the run
//! whose listener accepted the connection, and only that.
//!
//! # Host frames are not spoken here
//!
//! The first two variant indexes of [`SandboxClientFrame`] are those of the
//! host's `ClientFrame::Hello` and `ClientFrame::Request`, and they are
//! reserved: they decode as nothing ([`HostOnly`] has no values). So a host
//! frame never decodes as a guest frame, and a guest frame (index 2 or 3)
//! never decodes as a host frame. A server that receives a frame that is
//! not a guest frame but is a host frame answers it, in the host's own
//! framing, `unsupported` ([`host_frame_refusal`]).
//!
//! # JSON form
//!
//! `{"action": "turn.end", "params": {"status": "ok"}}`, answered by
//! `{"result": {...}}` or `{"error": {"code": ..., "message": ...}}`, as
//! the host's ([`crate::json`]); `plugin.call`'s `params` is any JSON
//! value (carried on the wire as its JSON text).

use crate::error::{ErrorBody, ErrorCode};
use crate::turn::{TurnInfo, TurnStatus};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Version of the guest schema; both sides must agree exactly.
pub const SANDBOX_API_PROTOCOL_VERSION: u32 = 1;

/// Where the in-sandbox interface's socket is inside every sandbox.
pub const SANDBOX_API_SOCKET: &str = "/run/allox/guest.sock";

/// Longest plugin route name, in bytes.
pub const MAX_ROUTE_LEN: usize = 128;

/// A type without values: the reserved variants of [`SandboxClientFrame`]
/// can never be decoded (or built).
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostOnly {}

/// First frame of a guest connection.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
pub struct SandboxHello {
    pub version: u32,
    pub build: String,
}

impl SandboxHello {
    /// This build's greeting.
    pub fn new() -> SandboxHello {
        SandboxHello {
            version: SANDBOX_API_PROTOCOL_VERSION,
            build: crate::build_identity(),
        }
    }
}

impl Default for SandboxHello {
    fn default() -> Self {
        SandboxHello::new()
    }
}

/// Frames a guest client sends.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub enum SandboxClientFrame {
    /// Index 0: the host's `Hello`; never a guest frame.
    ReservedHostHello(HostOnly),
    /// Index 1: the host's `Request`; never a guest frame.
    ReservedHostRequest(HostOnly),
    Hello(SandboxHello),
    Request(SandboxRequestEnvelope),
}

/// Frames the in-sandbox interface sends.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub enum SandboxServerFrame {
    Welcome(SandboxHello),
    /// The handshake was refused; the server closes.
    Refused(ErrorBody),
    Response(SandboxResponseEnvelope),
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct SandboxRequestEnvelope {
    pub request_id: u64,
    pub request: SandboxRequest,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct SandboxResponseEnvelope {
    /// The request this answers; 0 when the server could not read one.
    pub request_id: u64,
    pub outcome: SandboxOutcome,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub enum SandboxOutcome {
    Ok(SandboxResponse),
    Err(ErrorBody),
}

impl From<Result<SandboxResponse, ErrorBody>> for SandboxOutcome {
    fn from(r: Result<SandboxResponse, ErrorBody>) -> Self {
        match r {
            Ok(v) => SandboxOutcome::Ok(v),
            Err(e) => SandboxOutcome::Err(e),
        }
    }
}

impl From<SandboxOutcome> for Result<SandboxResponse, ErrorBody> {
    fn from(o: SandboxOutcome) -> Self {
        match o {
            SandboxOutcome::Ok(v) => Ok(v),
            SandboxOutcome::Err(e) => Err(e),
        }
    }
}

/// `whoami`: the caller's agent, session and run.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct Whoami {}

/// `turn.begin` of the caller's own session.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct SandboxTurnBegin {
    /// Chosen by the caller, or made up (`turn-<n>`).
    #[serde(default)]
    pub turn_id: Option<String>,
}

/// `turn.end` of the caller's own session.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SandboxTurnEnd {
    /// The turn to end; without it, the session's open turn.
    #[serde(default)]
    pub turn_id: Option<String>,
    pub status: TurnStatus,
    /// Label of the automatic checkpoint.
    #[serde(default)]
    pub label: Option<String>,
}

/// `plugin.call`: a route a plugin owns, with its parameters as JSON text.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PluginCall {
    pub route: String,
    /// JSON text (`{}` when there are none).
    pub params: String,
}

/// Every guest request. Variants are only ever appended.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub enum SandboxRequest {
    Whoami(Whoami),
    TurnBegin(SandboxTurnBegin),
    TurnEnd(SandboxTurnEnd),
    PluginCall(PluginCall),
}

impl SandboxRequest {
    /// All action names, in wire order.
    pub const ACTIONS: &'static [&'static str] =
        &["whoami", "turn.begin", "turn.end", "plugin.call"];

    /// The action name.
    pub fn action(&self) -> &'static str {
        match self {
            SandboxRequest::Whoami(_) => "whoami",
            SandboxRequest::TurnBegin(_) => "turn.begin",
            SandboxRequest::TurnEnd(_) => "turn.end",
            SandboxRequest::PluginCall(_) => "plugin.call",
        }
    }

    /// Builds a request from its JSON form.
    pub fn from_json(action: &str, params: Value) -> Result<Self, ErrorBody> {
        let params = if params.is_null() { json!({}) } else { params };
        let bad =
            |e: serde_json::Error| ErrorBody::invalid(format!("bad params for {action}: {e}"));
        match action {
            "whoami" => serde_json::from_value(params)
                .map(SandboxRequest::Whoami)
                .map_err(bad),
            "turn.begin" => serde_json::from_value(params)
                .map(SandboxRequest::TurnBegin)
                .map_err(bad),
            "turn.end" => serde_json::from_value(params)
                .map(SandboxRequest::TurnEnd)
                .map_err(bad),
            "plugin.call" => {
                #[derive(Deserialize)]
                #[serde(deny_unknown_fields)]
                struct Call {
                    route: String,
                    #[serde(default)]
                    params: Value,
                }
                let c: Call = serde_json::from_value(params).map_err(bad)?;
                let params = if c.params.is_null() {
                    json!({})
                } else {
                    c.params
                };
                Ok(SandboxRequest::PluginCall(PluginCall {
                    route: c.route,
                    params: params.to_string(),
                }))
            }
            other => Err(ErrorBody::invalid(format!(
                "unknown guest action {other:?}; known actions: {}",
                Self::ACTIONS.join(", ")
            ))),
        }
    }

    /// The JSON `params` object of this request.
    pub fn params_json(&self) -> Value {
        let v = match self {
            SandboxRequest::Whoami(p) => serde_json::to_value(p),
            SandboxRequest::TurnBegin(p) => serde_json::to_value(p),
            SandboxRequest::TurnEnd(p) => serde_json::to_value(p),
            SandboxRequest::PluginCall(p) => {
                let params = serde_json::from_str::<Value>(&p.params)
                    .unwrap_or_else(|_| Value::String(p.params.clone()));
                return json!({"route": p.route, "params": params});
            }
        };
        v.unwrap_or(Value::Null)
    }
}

/// Who is asking: the run whose listener accepted the connection.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
pub struct SandboxCaller {
    pub agent_id: String,
    pub session_id: String,
    pub run_id: String,
}

/// A plugin route's answer, as JSON text.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
pub struct PluginResult {
    pub result: String,
}

/// Every guest response. Variants are only ever appended.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub enum SandboxResponse {
    Identity(SandboxCaller),
    Turn(TurnInfo),
    Plugin(PluginResult),
}

impl SandboxResponse {
    /// The JSON `result` object (a plugin's answer as the JSON it is).
    pub fn to_json(&self) -> Value {
        let v = match self {
            SandboxResponse::Identity(v) => serde_json::to_value(v),
            SandboxResponse::Turn(v) => serde_json::to_value(v),
            SandboxResponse::Plugin(p) => {
                return serde_json::from_str(&p.result)
                    .unwrap_or_else(|_| Value::String(p.result.clone()))
            }
        };
        v.unwrap_or(Value::Null)
    }
}

/// Parses `{"action": "...", "params": {...}}` into a guest request.
pub fn parse_json_request(text: &str) -> Result<SandboxRequest, ErrorBody> {
    let (action, params) = crate::json::split_request(text)?;
    SandboxRequest::from_json(&action, params)
}

/// The JSON form of a guest request.
pub fn request_to_json(req: &SandboxRequest) -> Value {
    json!({"action": req.action(), "params": req.params_json()})
}

/// The JSON answer for a guest outcome.
pub fn answer_to_json(outcome: &Result<SandboxResponse, ErrorBody>) -> Value {
    match outcome {
        Ok(r) => json!({"result": r.to_json()}),
        Err(e) => json!({"error": {"code": e.code.as_str(), "message": e.message}}),
    }
}

/// Whether `route` is a well-formed plugin route: 1–[`MAX_ROUTE_LEN`]
/// bytes of `[a-z0-9._-]`, starting with a letter (`tracker.tree`).
pub fn check_route(route: &str) -> Result<(), ErrorBody> {
    let ok = !route.is_empty()
        && route.len() <= MAX_ROUTE_LEN
        && route.starts_with(|c: char| c.is_ascii_lowercase())
        && route
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ErrorBody::invalid(format!(
            "route {:?} must be 1-{MAX_ROUTE_LEN} bytes of a-z 0-9 . _ - starting with a letter",
            route.chars().take(MAX_ROUTE_LEN).collect::<String>()
        )))
    }
}

/// What a frame that is not a guest frame but decodes as a host frame is
/// answered, in the host's framing: `unsupported`, naming what it was.
/// `None` when the payload is not a host frame either.
pub fn host_frame_refusal(payload: &[u8]) -> Option<crate::ServerFrame> {
    use crate::message::{ClientFrame, Outcome, ResponseEnvelope, ServerFrame};
    let frame = crate::decode::<ClientFrame>(payload).ok()?;
    Some(match frame {
        ClientFrame::Hello(_) => ServerFrame::Refused(ErrorBody::new(
            ErrorCode::Unsupported,
            "this is the in-sandbox interface, which does not speak the host protocol; \
             use the guest schema (whoami, turn.begin, turn.end, plugin.call)",
        )),
        ClientFrame::Request(env) => ServerFrame::Response(ResponseEnvelope {
            conversation: env.conversation,
            request_id: env.request_id,
            outcome: Outcome::Err(ErrorBody::new(
                ErrorCode::Unsupported,
                format!(
                    "{} is a host action; the in-sandbox interface answers only whoami, turn.begin, \
                     turn.end and plugin.call, for the caller's own session",
                    env.request.action()
                ),
            )),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode, ClientFrame, Hello, Request, RequestEnvelope, TurnEnd};

    #[test]
    fn host_frames_never_decode_as_guest_frames_and_the_other_way_round() {
        let host = [
            ClientFrame::Hello(Hello::new(7)),
            ClientFrame::Request(RequestEnvelope {
                conversation: 1,
                request_id: 2,
                request: Request::TurnEnd(TurnEnd {
                    agent_id: "a".into(),
                    session_id: "other".into(),
                    turn_id: "t".into(),
                    status: TurnStatus::Ok,
                    label: None,
                }),
            }),
        ];
        for h in &host {
            let p = postcard::to_stdvec(h).unwrap();
            assert!(decode::<SandboxClientFrame>(&p).is_err(), "{h:?}");
            assert!(host_frame_refusal(&p).is_some());
        }
        let guest = [
            SandboxClientFrame::Hello(SandboxHello::new()),
            SandboxClientFrame::Request(SandboxRequestEnvelope {
                request_id: 1,
                request: SandboxRequest::Whoami(Whoami {}),
            }),
        ];
        for g in &guest {
            let p = postcard::to_stdvec(g).unwrap();
            assert!(decode::<ClientFrame>(&p).is_err(), "{g:?}");
            assert_eq!(&decode::<SandboxClientFrame>(&p).unwrap(), g);
        }
    }

    #[test]
    fn every_action_round_trips_through_json() {
        for (action, params) in [
            ("whoami", json!({})),
            ("turn.begin", json!({"turn_id": "t1"})),
            ("turn.end", json!({"status": "failed", "label": "x"})),
            (
                "plugin.call",
                json!({"route": "net.connect", "params": {"host": "h"}}),
            ),
        ] {
            let req = SandboxRequest::from_json(action, params).unwrap();
            assert_eq!(req.action(), action);
            let text = request_to_json(&req).to_string();
            assert_eq!(parse_json_request(&text).unwrap(), req, "{action}");
        }
    }

    #[test]
    fn forged_identities_are_unknown_fields() {
        for (action, params) in [
            ("whoami", json!({"agent_id": "b"})),
            ("turn.begin", json!({"session_id": "other"})),
            ("turn.end", json!({"status": "ok", "agent_id": "b"})),
            ("plugin.call", json!({"route": "x", "run_id": "r"})),
        ] {
            let e = SandboxRequest::from_json(action, params).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidRequest);
            assert!(e.message.contains("unknown field"), "{}", e.message);
        }
        let e = SandboxRequest::from_json("session.delete", json!({})).unwrap_err();
        assert!(e.message.contains("unknown guest action"), "{}", e.message);
    }

    #[test]
    fn routes_are_checked() {
        assert!(check_route("tracker.tree").is_ok());
        for bad in [
            "",
            "Upper",
            "9x",
            "a/b",
            "a b",
            &"a".repeat(MAX_ROUTE_LEN + 1),
        ] {
            assert!(check_route(bad).is_err(), "{bad:?}");
        }
    }
}
