//! A daemon's refusal in the words of the command line: its messages name
//! request fields as the JSON form spells them (`pass "force": true`),
//! which the CLI shows as the flag that sets them.

use allox_protocol::ErrorBody;

/// The JSON form's words in the daemon's messages, and the CLI's.
const WORDS: &[(&str, &str)] = &[
    ("pass \"kill_processes\": true", "pass --kill-processes"),
    ("pass \"force\": true", "pass --force"),
    (
        "(checkpoint.pin with pinned=false)",
        "(alloxctl checkpoint unpin)",
    ),
];

/// `CODE: MESSAGE`, the message in the CLI's words.
pub fn refusal(body: &ErrorBody) -> String {
    let mut m = body.message.clone();
    for (json, cli) in WORDS {
        if m.contains(json) {
            m = m.replace(json, cli);
        }
    }
    format!("{}: {m}", body.code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use allox_protocol::ErrorCode;

    #[test]
    fn fields_are_named_as_flags() {
        let b = |m: &str| ErrorBody {
            code: ErrorCode::Conflict,
            message: m.into(),
        };
        assert_eq!(
            refusal(&b(
                "session a/s has 2 live processes; stop them or pass \"kill_processes\": true"
            )),
            "conflict: session a/s has 2 live processes; stop them or pass --kill-processes"
        );
        assert_eq!(
            refusal(&b(
                "agent a has 1 session (s): unpin, or pass \"force\": true"
            )),
            "conflict: agent a has 1 session (s): unpin, or pass --force"
        );
        assert_eq!(refusal(&b("plain")), "conflict: plain");
    }
}
