//! The JSON form of a call, as `alloxctl rpc` and the gateway speak it:
//! `{"action": "...", "params": {...}}` in, `{"result": {...}}` or
//! `{"error": {"code": "...", "message": "..."}}` out.

use allox_client::{Answer, Caller};
use allox_protocol::json::{answer_to_json, parse_request};
use serde_json::Value;

/// Runs one JSON request and returns whether it succeeded and the JSON
/// answer. A request that does not parse is answered `invalid_request`
/// without contacting the daemon; a transport failure is answered with its
/// code (`unavailable` when the daemon cannot be reached).
pub fn rpc_json(client: &mut impl Caller, text: &str) -> (bool, Value) {
    let answer = rpc_answer(client, text);
    (answer.is_ok(), answer_to_json(&answer))
}

/// Runs one JSON request; transport failures become protocol errors.
pub fn rpc_answer(client: &mut impl Caller, text: &str) -> Answer {
    let request = parse_request(text)?;
    client
        .call(request)
        .unwrap_or_else(|err| Err(err.to_body()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use allox_client::fake::{deleted, Fake};
    use allox_client::ClientError;
    use allox_protocol::{ErrorBody, ErrorCode};
    use serde_json::json;

    #[test]
    fn bad_json_is_answered_locally() {
        let mut fake = Fake {
            calls: 0,
            answer: deleted,
        };
        let (ok, v) = rpc_json(&mut fake, "{not json");
        assert!(!ok);
        assert_eq!(v["error"]["code"], "invalid_request");
        assert!(v["error"]["message"].as_str().unwrap().contains("JSON"));
        let (ok, v) = rpc_json(&mut fake, r#"{"action":"agent.fly"}"#);
        assert!(!ok);
        assert_eq!(v["error"]["code"], "invalid_request");
        assert_eq!(fake.calls, 0);
    }

    #[test]
    fn results_and_errors_have_the_json_shape() {
        let mut fake = Fake {
            calls: 0,
            answer: deleted,
        };
        let text = r#"{"action":"agent.delete","params":{"agent_id":"a"}}"#;
        assert_eq!(
            rpc_json(&mut fake, text),
            (true, json!({"result": {"deleted": "a"}}))
        );
        fake.answer = |_| Ok(Err(ErrorBody::new(ErrorCode::Conflict, "busy")));
        assert_eq!(
            rpc_json(&mut fake, text),
            (
                false,
                json!({"error": {"code": "conflict", "message": "busy"}})
            )
        );
        fake.answer = |_| Err(ClientError::Closed);
        let (ok, v) = rpc_json(&mut fake, text);
        assert!(!ok);
        assert_eq!(v["error"]["code"], "unavailable");
        assert_eq!(fake.calls, 3);
    }
}
