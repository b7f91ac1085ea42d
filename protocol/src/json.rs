//! The JSON form of requests and answers used by `alloxctl rpc` and the HTTP
//! gateway: `{"action": "...", "params": {...}}` in,
//! `{"result": {...}}` or `{"error": {"code": "...", "message": "..."}}` out.

use crate::error::ErrorBody;
use crate::message::{Request, Response};
use serde_json::{json, Value};

/// Parses `{"action": "...", "params": {...}}`.
pub fn parse_request(text: &str) -> Result<Request, ErrorBody> {
    let (action, params) = split_request(text)?;
    Request::from_json(&action, params)
}

/// The action name and the params (an object, or null) of a JSON request;
/// shared by the host's and the guest's schema.
pub fn split_request(text: &str) -> Result<(String, Value), ErrorBody> {
    let v: Value = serde_json::from_str(text)
        .map_err(|e| ErrorBody::invalid(format!("request is not valid JSON: {e}")))?;
    let Value::Object(mut obj) = v else {
        return Err(ErrorBody::invalid(
            "request must be a JSON object with \"action\" and \"params\"",
        ));
    };
    let action = match obj.remove("action") {
        Some(Value::String(s)) => s,
        Some(_) => return Err(ErrorBody::invalid("\"action\" must be a string")),
        None => return Err(ErrorBody::invalid("request has no \"action\"")),
    };
    let params = obj.remove("params").unwrap_or(Value::Null);
    if let Some(extra) = obj.keys().next() {
        return Err(ErrorBody::invalid(format!(
            "unknown top-level field {extra:?}; expected only \"action\" and \"params\""
        )));
    }
    if !(params.is_object() || params.is_null()) {
        return Err(ErrorBody::invalid("\"params\" must be a JSON object"));
    }
    Ok((action, params))
}

/// The JSON form of a request.
pub fn request_to_json(req: &Request) -> Value {
    json!({"action": req.action(), "params": req.params_json()})
}

/// The JSON answer for an outcome.
pub fn answer_to_json(outcome: &Result<Response, ErrorBody>) -> Value {
    match outcome {
        Ok(r) => json!({"result": r.to_json()}),
        Err(e) => json!({"error": {"code": e.code.as_str(), "message": e.message}}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::*;

    #[test]
    fn seed_examples_parse() {
        let r = parse_request(r#"{"action":"agent.create","params":{"agent_id":"agent-a"}}"#);
        assert_eq!(
            r.unwrap(),
            Request::AgentCreate(AgentCreate::new("agent-a"))
        );
        let r = parse_request(
            r#"{"action":"session.rollback","params":{"agent_id":"agent-a","session_id":"session-1","checkpoint_id":"clean"}}"#,
        )
        .unwrap();
        assert_eq!(
            r,
            Request::SessionRollback(SessionRollback {
                agent_id: "agent-a".into(),
                session_id: "session-1".into(),
                checkpoint_id: "clean".into(),
                kill_processes: None,
            })
        );
    }

    #[test]
    fn every_action_round_trips_through_json() {
        for action in Request::ACTIONS {
            let params =
                json!({"agent_id": "a", "session_id": "s", "checkpoint_id": "c", "pinned": true});
            // Not every action takes every field; strip until it parses.
            let req = [
                params.clone(),
                json!({"agent_id": "a", "session_id": "s", "argv": ["true"], "wait": true}),
                json!({"agent_id": "a", "session_id": "s", "run_id": "r"}),
                json!({"agent_id": "a", "session_id": "s", "run_id": "r", "rows": 24, "cols": 80}),
                json!({"agent_id": "a", "session_id": "s", "turn_id": "t", "status": "ok"}),
                json!({"agent_id": "a", "session_id": "s", "from": "c", "to": "current"}),
                json!({"agent_id": "a", "session_id": "s", "egress": {"allow": ["x.test"], "deny": ["*"]}}),
                json!({"agent_id": "a", "session_id": "s", "path": "d/f", "to": "g"}),
                json!({"agent_id": "a", "session_id": "s", "path": "d/f", "data": "AAEC/w=="}),
                json!({"agent_id": "a", "session_id": "s", "path": "d/f"}),
                json!({"agent_id": "a", "session_id": "s", "checkpoint_id": "c"}),
                json!({"agent_id": "a", "session_id": "s", "enabled": true, "scope": "out", "permission": "write"}),
                json!({"agent_id": "a", "session_id": "s"}),
                json!({"agent_id": "a", "session_id": "s", "spans": [{
                    "trace_id": "0af7651916cd43dd8448eb211c80319c",
                    "span_id": "b7ad6b7169203331",
                    "name": "bash", "operation": "execute_tool", "tool": "bash",
                    "start_unix_nano": 1, "end_unix_nano": 2}]}),
                json!({"agent_id": "a", "session_id": "s", "run_id": "r", "evidence_root": "e"}),
                json!({"agent_id": "a", "session_id": "s", "from": "c", "new_session_id": "t"}),
                json!({"agent_id": "a"}),
                json!({"agent_id": "a", "import_id": "i", "data": "AAEC/w=="}),
                json!({"agent_id": "a", "session_id": "s", "name": "K", "value": "v", "hosts": ["api.test"]}),
                json!({"agent_id": "a", "session_id": "s", "port": 8000}),
                json!({"agent_id": "a", "name": "K"}),
                json!({"realtime_ns": 1, "seed": "AAEC/w=="}),
                json!({}),
            ]
            .into_iter()
            .find_map(|p| Request::from_json(action, p).ok())
            .unwrap_or_else(|| panic!("{action} takes none of the sample params"));
            let text = request_to_json(&req).to_string();
            assert_eq!(parse_request(&text).unwrap(), req, "{action}");
        }
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        for (text, needle) in [
            ("not json", "not valid JSON"),
            ("[]", "JSON object"),
            (r#"{"params":{}}"#, "no \"action\""),
            (r#"{"action":"agent.fly","params":{}}"#, "unknown action"),
            (r#"{"action":"agent.create","params":{}}"#, "agent_id"),
            (
                r#"{"action":"agent.create","params":{"agent_id":"a","x":1}}"#,
                "unknown field",
            ),
            (
                r#"{"action":"agent.create","params":[1]}"#,
                "must be a JSON object",
            ),
            (
                r#"{"action":"agent.list","params":{},"extra":1}"#,
                "top-level",
            ),
        ] {
            let e = parse_request(text).unwrap_err();
            assert_eq!(e.code, crate::ErrorCode::InvalidRequest);
            assert!(e.message.contains(needle), "{text}: {}", e.message);
        }
    }

    #[test]
    fn answers_have_the_documented_shape() {
        let ok = answer_to_json(&Ok(Response::Deleted(Deleted {
            deleted: "a".into(),
        })));
        assert_eq!(ok, json!({"result": {"deleted": "a"}}));
        let err = answer_to_json(&Err(ErrorBody::new(
            crate::ErrorCode::NotFound,
            "no agent a",
        )));
        assert_eq!(
            err,
            json!({"error": {"code": "not_found", "message": "no agent a"}})
        );
    }
}
