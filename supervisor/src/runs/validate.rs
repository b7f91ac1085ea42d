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
    #[error("program {0:?} not found in the run's PATH ({1})")]
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
            // Named up to its '=' (a `KEY=VALUE` given as the name would
            // put a secret in the log and the audit).
            let shown = match k.split_once('=') {
                Some((name, _)) => format!("{name}=…"),
                None => k.clone(),
            };
            return Err(Refused::EnvName(shown));
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

/// What a path names as the sandbox will see it, resolved link by link
/// as the sandbox would, each link read where it is (below the session's
/// tree, a bind's source or a system directory), never followed on the
/// host: a link an agent plants (to `/root/...`, to another session) is
/// read as the sandbox reads it, not through the host's root.
struct SandboxView<'a> {
    session: &'a Path,
    system: &'a [PathBuf],
    binds: &'a [Bind],
}

/// The most links one lookup follows, as the kernel's `MAXSYMLINKS`.
const MAX_LINKS: u32 = 40;

impl SandboxView<'_> {
    /// The host directory that holds `inside`, and its path below it; or
    /// none where the sandbox has nothing of the host's (its own root).
    fn place(&self, inside: &Path) -> Option<(PathBuf, PathBuf)> {
        if let Ok(rest) = inside.strip_prefix(SESSION_MOUNT) {
            return Some((self.session.to_path_buf(), rest.to_path_buf()));
        }
        for b in self.binds {
            if let Ok(rest) = inside.strip_prefix(&b.dst) {
                return Some((b.src.clone(), rest.to_path_buf()));
            }
        }
        self.system.iter().any(|d| inside.starts_with(d)).then(|| {
            (
                PathBuf::from("/"),
                inside.strip_prefix("/").unwrap_or(inside).to_path_buf(),
            )
        })
    }

    /// `rest` below `root`, opened without following any link (a link
    /// last is opened itself): what it is, and a link's target.
    fn look(root: &Path, rest: &Path) -> Option<(rustix::fs::Stat, Option<PathBuf>)> {
        use rustix::fs::{Mode, OFlags, ResolveFlags};
        // The place itself (the daemon's: a session's tree, a bind's
        // source, which may be a file, or `/`) is opened as it is named.
        if rest.as_os_str().is_empty() {
            let fd = rustix::fs::open(root, OFlags::PATH | OFlags::CLOEXEC, Mode::empty()).ok()?;
            return Some((rustix::fs::fstat(&fd).ok()?, None));
        }
        let dir = rustix::fs::open(
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        let fd = rustix::fs::openat2(
            &dir,
            rest,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
        .ok()?;
        let st = rustix::fs::fstat(&fd).ok()?;
        let link = rustix::fs::FileType::from_raw_mode(st.st_mode)
            .is_symlink()
            .then(|| rustix::fs::readlinkat(&fd, "", Vec::new()).ok())
            .flatten()
            .map(|t| PathBuf::from(std::ffi::OsString::from_vec(t.into_bytes())));
        Some((st, link))
    }

    /// What `inside` (absolute) is in the sandbox, its links followed.
    fn stat(&self, inside: &Path) -> Option<rustix::fs::Stat> {
        use std::ffi::OsString;
        // Components still to walk, the next last.
        let mut todo: Vec<OsString> = Vec::new();
        let push = |todo: &mut Vec<OsString>, p: &Path| {
            for c in p.components().rev() {
                match c {
                    Component::Normal(n) => todo.push(n.to_os_string()),
                    Component::ParentDir => todo.push("..".into()),
                    Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
                }
            }
        };
        push(&mut todo, inside);
        let mut at = PathBuf::from("/");
        let mut links = 0;
        let mut last = None;
        while let Some(c) = todo.pop() {
            if c == ".." {
                at.pop();
                last = None;
                continue;
            }
            let next = at.join(&c);
            let Some((root, rest)) = self.place(&next) else {
                // A directory of the sandbox's own root (`/allox`).
                at = next;
                last = None;
                continue;
            };
            let (st, link) = Self::look(&root, &rest)?;
            if let Some(target) = link {
                links += 1;
                if links > MAX_LINKS {
                    return None;
                }
                if target.is_absolute() {
                    at = PathBuf::from("/");
                }
                push(&mut todo, &target);
                continue;
            }
            let dir = rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir();
            if !todo.is_empty() && !dir {
                return None;
            }
            at = next;
            last = Some(st);
        }
        last
    }
}

use std::os::unix::ffi::OsStringExt;

/// Whether `dir` (relative to the session, as `process.start`'s `cwd`) is
/// a directory as the sandbox will see it: the session's links followed
/// as the sandbox follows them, none on the host.
pub fn is_session_dir(dir: &str, session: &Path, system: &[PathBuf], binds: &[Bind]) -> bool {
    let view = SandboxView {
        session,
        system,
        binds,
    };
    view.stat(&Path::new(SESSION_MOUNT).join(dir))
        .is_some_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir())
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
    let view = SandboxView {
        session,
        system,
        binds: extra.binds,
    };
    let executable = |inside: &Path| {
        view.stat(inside).is_some_and(|st| {
            rustix::fs::FileType::from_raw_mode(st.st_mode).is_file() && st.st_mode & 0o111 != 0
        })
    };
    if program.contains('/') {
        let inside = if program.starts_with('/') {
            PathBuf::from(program)
        } else {
            Path::new(cwd_inside).join(program)
        };
        return if executable(&inside) {
            Ok(inside.display().to_string())
        } else {
            Err(Refused::NotExecutable(program.to_string()))
        };
    }
    for dir in extra.path.split(':').filter(|d| d.starts_with('/')) {
        let inside = Path::new(dir).join(program);
        if executable(&inside) {
            return Ok(inside.display().to_string());
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
        bad.insert("API_KEY=sk-secret".to_string(), "x".to_string());
        // Named up to its '=': what follows may be a secret, and the
        // refusal goes to the log and the audit.
        let e = check(&["ls".into()], &bad, None).unwrap_err().to_string();
        assert!(e.contains("\"API_KEY=…\"") && !e.contains("secret"), "{e}");
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

    #[test]
    fn links_in_the_session_are_followed_as_the_sandbox_follows_them() {
        use std::os::unix::fs::{symlink, PermissionsExt};
        let sys = vec![PathBuf::from("/usr"), PathBuf::from("/bin")];
        let session = tempfile::tempdir().unwrap();
        let host = tempfile::tempdir().unwrap();
        let s = session.path();
        let exe = |p: &Path| {
            std::fs::write(p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        exe(&s.join("tool"));
        exe(&host.path().join("tool"));
        std::fs::create_dir(s.join("sub")).unwrap();
        symlink("tool", s.join("rel")).unwrap();
        symlink("/bin/sh", s.join("python")).unwrap();
        symlink("/allox/session/tool", s.join("abs-in")).unwrap();
        symlink(host.path().join("tool"), s.join("out")).unwrap();
        symlink(host.path(), s.join("outdir")).unwrap();
        symlink("sub", s.join("subdir")).unwrap();
        symlink("loop", s.join("loop")).unwrap();
        let run = |p: &str| resolve(p, "/allox/session", s, &sys, &Lookup::default());
        for ok in [
            "./tool",
            "./rel",
            "./python",
            "./abs-in",
            "sub/../tool",
            "/allox/session/sub/../../session/tool",
        ] {
            assert!(run(ok).is_ok(), "{ok}: {:?}", run(ok));
        }
        // A link to the host's files outside what the sandbox binds names
        // nothing in the sandbox, whatever is there on the host.
        for bad in [
            "./out",
            "./outdir/tool",
            "./loop",
            "./sub",
            "./missing",
            "./tool/x",
        ] {
            assert_eq!(
                run(bad),
                Err(Refused::NotExecutable(bad.to_string())),
                "{bad}"
            );
        }
        // A bind of a file (the in-sandbox interface's `allox`), found on
        // the PATH, and a bind of a directory.
        let binds = [
            Bind {
                src: host.path().join("tool"),
                dst: "/run/allox/bin/allox".into(),
                writable: false,
            },
            Bind {
                src: host.path().to_path_buf(),
                dst: "/opt/host".into(),
                writable: false,
            },
        ];
        let lookup = Lookup {
            path: "/usr/bin:/run/allox/bin",
            binds: &binds,
        };
        for p in ["allox", "/run/allox/bin/allox", "/opt/host/tool"] {
            assert!(
                resolve(p, "/allox/session", s, &sys, &lookup).is_ok(),
                "{p}"
            );
        }
        let dir = |d: &str| is_session_dir(d, s, &sys, &[]);
        assert!(dir("sub") && dir("subdir") && dir("."));
        assert!(!dir("outdir") && !dir("tool") && !dir("loop") && !dir("missing"));
    }
}
