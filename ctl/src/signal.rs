//! Signal numbers and their Linux names, without libc.

/// Standard Linux signals, numbers 1 to 31.
const NAMES: [&str; 31] = [
    "SIGHUP",
    "SIGINT",
    "SIGQUIT",
    "SIGILL",
    "SIGTRAP",
    "SIGABRT",
    "SIGBUS",
    "SIGFPE",
    "SIGKILL",
    "SIGUSR1",
    "SIGSEGV",
    "SIGUSR2",
    "SIGPIPE",
    "SIGALRM",
    "SIGTERM",
    "SIGSTKFLT",
    "SIGCHLD",
    "SIGCONT",
    "SIGSTOP",
    "SIGTSTP",
    "SIGTTIN",
    "SIGTTOU",
    "SIGURG",
    "SIGXCPU",
    "SIGXFSZ",
    "SIGVTALRM",
    "SIGPROF",
    "SIGWINCH",
    "SIGIO",
    "SIGPWR",
    "SIGSYS",
];

/// The highest signal number Linux has (`SIGRTMAX`).
pub const MAX: i32 = 64;

/// The name of a standard signal number, such as `SIGKILL` for 9.
pub fn name(sig: i32) -> Option<&'static str> {
    let index = usize::try_from(sig).ok()?.checked_sub(1)?;
    NAMES.get(index).copied()
}

/// `signal 9 (SIGKILL)`, or `signal 40` for a number without a name.
pub fn label(sig: i32) -> String {
    match name(sig) {
        Some(name) => format!("signal {sig} ({name})"),
        None => format!("signal {sig}"),
    }
}

/// A signal given as a number (`9`) or a name (`KILL`, `SIGKILL`, `term`).
pub fn parse(text: &str) -> Result<i32, String> {
    if let Ok(sig) = text.parse::<i32>() {
        return if (1..=MAX).contains(&sig) {
            Ok(sig)
        } else {
            Err(format!("signal numbers go from 1 to {MAX}"))
        };
    }
    let upper = text.to_ascii_uppercase();
    let wanted = upper.strip_prefix("SIG").unwrap_or(&upper);
    (1..=MAX)
        .find(|&sig| name(sig).is_some_and(|n| &n[3..] == wanted))
        .ok_or_else(|| format!("unknown signal {text:?}: give a number or a name such as TERM"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels() {
        assert_eq!(name(1), Some("SIGHUP"));
        assert_eq!(name(9), Some("SIGKILL"));
        assert_eq!(name(15), Some("SIGTERM"));
        assert_eq!(name(31), Some("SIGSYS"));
        assert_eq!(name(0), None);
        assert_eq!(name(-9), None);
        assert_eq!(name(34), None);
        assert_eq!(label(9), "signal 9 (SIGKILL)");
        assert_eq!(label(40), "signal 40");
    }

    #[test]
    fn parses_numbers_and_names() {
        for (text, sig) in [
            ("9", 9),
            ("KILL", 9),
            ("sigterm", 15),
            ("Int", 2),
            ("64", 64),
        ] {
            assert_eq!(parse(text), Ok(sig), "{text}");
        }
        for text in ["0", "65", "-1", "SIG", "FLY", ""] {
            assert!(parse(text).is_err(), "{text}");
        }
    }
}
