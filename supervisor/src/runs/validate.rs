//! Checks of what a client asks to run, before anything is started.

use allox_sandbox::spec::SESSION_MOUNT;
use allox_sandbox::Bind;
use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use thiserror::Error;

/// Largest total size of argv plus env, in bytes.
pub const MAX_ARGS: usize = 256 * 1024;
/// Directories searched for a program name without `/`, inside the sandbox.
pub const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Why a request to run something is refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum Refused {
    #[error("argv must name a program")]
    NoProgram,
    #[error("argv[{0}] contains a NUL byte")]
    NulInArg(usize),
    #[error("environment name {0:?} is empty or contains '=' or NUL")]
    EnvName(String),
    #[error("environment value of {0} contains a NUL byte")]
    NulInEnvValue(String),
    #[error("argv and env take {0} bytes; the limit is {MAX_ARGS}")]
    TooLarge(usize),
    #[error("cwd contains a NUL byte")]
    NulInCwd,
    #[error("cwd {0:?} must be a relative path inside the session, without '..'")]
    CwdOutside(String),
    #[error("program {0:?} does not exist in the sandbox or is not executable")]
    NotExecutable(String),
    #[error("program {0:?} not found in the sandbox's PATH ({1})")]
    NotInPath(String, String),
    #[error("a terminal of {rows} rows and {cols} columns: each must be 1 to {MAX_TERM_SIDE}")]
    TermSize { rows: u16, cols: u16 },
    #[error("terminal type {0:?}: at most 64 of A-Z a-z 0-9 . _ + -")]
    TermType(String),
}

/// Most rows or columns of a run's terminal.
pub const MAX_TERM_SIDE: u16 = 10_000;

/// Checks a terminal's size and type; returns the type (`TERM`).
pub fn terminal(t: &allox_protocol::PtySize) -> Result<String, Refused> {
    let side = 1..=MAX_TERM_SIDE;
    if !side.contains(&t.rows) || !side.contains(&t.cols) {
        return Err(Refused::TermSize {
            rows: t.rows,
            cols: t.cols,
        });
    }
    let term = t
        .term
        .clone()
        .unwrap_or_else(|| allox_protocol::PtySize::DEFAULT_TERM.to_string());
    let ok = |c: char| c.is_ascii_alphanumeric() || "._+-".contains(c);
    if term.is_empty() || term.len() > 64 || !term.chars().all(ok) {
        return Err(Refused::TermType(term));
    }
    Ok(term)
}

/// Checks argv, env and cwd; returns the working directory inside the
/// sandbox.
pub fn check(
    argv: &[String],
    env: &BTreeMap<String, String>,
    cwd: Option<&str>,
) -> Result<String, Refused> {
    if argv.is_empty() || argv[0].is_empty() {
        return Err(Refused::NoProgram);
    }
    let mut total = 0usize;
    for (i, a) in argv.iter().enumerate() {
        if a.contains('\0') {
            return Err(Refused::NulInArg(i));
        }
        total += a.len() + 1;
    }
    for (k, v) in env {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(Refused::EnvName(k.clone()));
        }
        if v.contains('\0') {
            return Err(Refused::NulInEnvValue(k.clone()));
        }
        total += k.len() + v.len() + 2;
    }
    if total > MAX_ARGS {
        return Err(Refused::TooLarge(total));
    }
    let Some(cwd) = cwd.filter(|c| !c.is_empty() && *c != ".") else {
        return Ok(SESSION_MOUNT.to_string());
    };
    if cwd.contains('\0') {
        return Err(Refused::NulInCwd);
    }
    let p = Path::new(cwd);
    for c in p.components() {
        match c {
            Component::Normal(_) | Component::CurDir => {}
            _ => return Err(Refused::CwdOutside(cwd.to_string())),
        }
    }
    Ok(Path::new(SESSION_MOUNT).join(p).display().to_string())
}

/// Where a program name is looked up besides the system directories: the
/// run's `PATH` and the host files bound into its sandbox.
#[derive(Debug, Clone, Copy)]
pub struct Lookup<'a> {
    /// `:`-separated directories inside the sandbox.
    pub path: &'a str,
    pub binds: &'a [Bind],
}

impl Default for Lookup<'_> {
    fn default() -> Self {
        Lookup {
            path: PATH,
            binds: &[],
        }
    }
}

/// Finds the program as the sandbox will see it. `session` is the host
/// path of `current/`, `system` the directories the sandbox binds from the
/// host, `extra` the run's `PATH` and binds. Returns the path inside the
/// sandbox.
pub fn resolve(
    program: &str,
    cwd_inside: &str,
    session: &Path,
    system: &[PathBuf],
    extra: &Lookup<'_>,
) -> Result<String, Refused> {
    let visible = |inside: &Path| -> Option<PathBuf> {
        if let Ok(rest) = inside.strip_prefix(SESSION_MOUNT) {
            return Some(session.join(rest));
        }
        for b in extra.binds {
            if let Ok(rest) = inside.strip_prefix(&b.dst) {
                return Some(if rest.as_os_str().is_empty() {
                    b.src.clone()
                } else {
                    b.src.join(rest)
                });
            }
        }
        system
            .iter()
            .any(|d| inside.starts_with(d))
            .then(|| inside.to_path_buf())
    };
    let executable = |host: &Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(host)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if program.contains('/') {
        let inside = if program.starts_with('/') {
            PathBuf::from(program)
        } else {
            Path::new(cwd_inside).join(program)
        };
        return match visible(&inside) {
            Some(host) if executable(&host) => Ok(inside.display().to_string()),
            _ => Err(Refused::NotExecutable(program.to_string())),
        };
    }
    for dir in extra.path.split(':').filter(|d| d.starts_with('/')) {
        let inside = Path::new(dir).join(program);
        if let Some(host) = visible(&inside) {
            if executable(&host) {
                return Ok(inside.display().to_string());
            }
        }
    }
    Err(Refused::NotInPath(
        program.to_string(),
        extra.path.to_string(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_inputs_are_refused() {
        let env = BTreeMap::new();
        assert!(check(&[], &env, None).is_err());
        assert!(check(&["a\0b".into()], &env, None).is_err());
        assert!(check(&["ls".into(), "x".repeat(MAX_ARGS)], &env, None).is_err());
        for cwd in ["../../..", "/etc", "a/../../b", "a\0"] {
            assert!(check(&["ls".into()], &env, Some(cwd)).is_err(), "{cwd}");
        }
        let mut bad = BTreeMap::new();
        bad.insert("A=B".to_string(), "x".to_string());
        assert!(check(&["ls".into()], &bad, None).is_err());
        assert_eq!(
            check(&["ls".into()], &env, Some("src/x")).unwrap(),
            "/allox/session/src/x"
        );
        assert_eq!(check(&["ls".into()], &env, None).unwrap(), "/allox/session");
    }

    #[test]
    fn programs_resolve_as_the_sandbox_sees_them() {
        let sys = vec![PathBuf::from("/usr"), PathBuf::from("/bin")];
        let s = Path::new("/nonexistent");
        assert!(resolve("sh", "/allox/session", s, &sys, &Lookup::default())
            .unwrap()
            .ends_with("/sh"));
        assert!(resolve(
            "no-such-program-here",
            "/allox/session",
            s,
            &sys,
            &Lookup::default()
        )
        .is_err());
        assert!(resolve("/etc/passwd", "/allox/session", s, &sys, &Lookup::default()).is_err());
        assert!(resolve("./x", "/allox/session", s, &sys, &Lookup::default()).is_err());
    }
}
