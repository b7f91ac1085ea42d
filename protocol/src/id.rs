//! The one place where agent, session and checkpoint IDs are checked.
//!
//! An ID is 1–64 bytes of `[A-Za-z0-9._-]` and does not start with `.` or
//! `-`. That keeps every ID a single, harmless path component: no `/`, no
//! `..`, no NUL, no option look-alikes, and no clash with the store's own
//! hidden names (which all start with `.`).

use thiserror::Error;

/// Longest ID in bytes.
pub const MAX_ID_LEN: usize = 64;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum IdError {
    #[error("{kind} is empty")]
    Empty { kind: &'static str },
    #[error("{kind} is {len} bytes long, the limit is {MAX_ID_LEN}")]
    TooLong { kind: &'static str, len: usize },
    #[error("{kind} {shown:?} starts with {first:?}; IDs must start with a letter, digit or '_'")]
    BadStart {
        kind: &'static str,
        shown: String,
        first: char,
    },
    #[error("{kind} {shown:?} is reserved: it names {names}")]
    Reserved {
        kind: &'static str,
        shown: String,
        names: &'static str,
    },
    #[error("{kind} {shown:?} contains {bad:?}; allowed are A-Z a-z 0-9 . _ -")]
    BadChar {
        kind: &'static str,
        shown: String,
        bad: char,
    },
}

/// Checks one ID; `kind` names it in the error ("agent_id", ...).
pub fn validate_id(kind: &'static str, id: &str) -> Result<(), IdError> {
    if id.is_empty() {
        return Err(IdError::Empty { kind });
    }
    if id.len() > MAX_ID_LEN {
        return Err(IdError::TooLong {
            kind,
            len: id.len(),
        });
    }
    let shown = || id.escape_debug().to_string();
    if let Some(bad) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(IdError::BadChar {
            kind,
            shown: shown(),
            bad,
        });
    }
    let first = id.as_bytes()[0] as char;
    if first == '.' || first == '-' {
        return Err(IdError::BadStart {
            kind,
            shown: shown(),
            first,
        });
    }
    Ok(())
}

/// The name `checkpoint.diff`, `session.fork` and the files API give the
/// session's live tree in place of a checkpoint's id.
pub const CURRENT: &str = "current";

/// Checks a new checkpoint's ID: an ID ([`validate_id`]) that is not
/// [`CURRENT`], which would name the live tree where a checkpoint is
/// expected.
pub fn validate_checkpoint_id(id: &str) -> Result<(), IdError> {
    validate_id("checkpoint_id", id)?;
    if id == CURRENT {
        return Err(IdError::Reserved {
            kind: "checkpoint_id",
            shown: id.into(),
            names: "the session's live tree (current/) wherever a checkpoint is asked for",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_is_no_new_checkpoint_s_id() {
        let e = validate_checkpoint_id("current").unwrap_err();
        assert!(matches!(e, IdError::Reserved { .. }), "{e:?}");
        assert!(e.to_string().contains("reserved"), "{e}");
        validate_checkpoint_id("current-1").unwrap();
        validate_checkpoint_id("Current").unwrap();
        assert!(validate_checkpoint_id("").is_err());
        // Any other id may still be "current" (a session may be).
        validate_id("session_id", "current").unwrap();
    }

    #[test]
    fn accepts_ordinary_ids() {
        for id in [
            "a",
            "agent-a",
            "session_1",
            "v1.2",
            "_x",
            "A9",
            &"x".repeat(64),
        ] {
            assert_eq!(validate_id("agent_id", id), Ok(()), "{id}");
        }
    }

    #[test]
    fn refuses_hostile_ids() {
        let long = "x".repeat(65);
        for id in [
            "", ".", "..", "a/b", "a\0b", &long, "é", "-rf", ".hidden", "a b", "a\\b", "a\n",
        ] {
            assert!(validate_id("agent_id", id).is_err(), "{id:?} accepted");
        }
    }

    #[test]
    fn errors_name_the_field_and_the_problem() {
        let e = validate_id("session_id", "a/b").unwrap_err().to_string();
        assert!(e.contains("session_id") && e.contains("'/'"), "{e}");
        let e = validate_id("agent_id", &"y".repeat(70))
            .unwrap_err()
            .to_string();
        assert!(e.contains("70 bytes"), "{e}");
    }
}
