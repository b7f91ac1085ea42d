//! Host files and directories bound into the sandbox ([`Bind`]): which
//! targets are allowed ([`check`]; the mounts themselves are made by each
//! run's PID 1 from detached copies the supervisor sends, after every
//! other mount).
//!
//! A target must be an absolute, normalised path that neither falls inside
//! nor covers anything the sandbox builds itself: the workspace
//! (`/allox`, with the session and the shared mounts), `/proc`, `/dev`,
//! `/tmp` and the system directories. Nor may it fall inside (or repeat)
//! an earlier bind's target. So a bind's parents are always created on the
//! sandbox's own tmpfs root, never on a host directory bound into it.

use crate::spec::{Bind, WORKSPACE_MOUNT};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Targets the sandbox mounts itself, besides the system directories.
pub const RESERVED: &[&str] = &[WORKSPACE_MOUNT, "/proc", "/dev", "/tmp"];

/// Files of the system directories a bind may lie over, as they are: the
/// bind is a file, the target an existing regular file there (not made,
/// never through a symlink), read-only. The roots a session's clients
/// trust (Debian's bundle), which the network plugin replaces with one
/// that holds the session's authority too.
pub const SYSTEM_FILES: &[&str] = &["/etc/ssl/certs/ca-certificates.crt"];

/// Whether `dst` is one of [`SYSTEM_FILES`].
pub fn is_system_file(dst: &str) -> bool {
    SYSTEM_FILES.contains(&dst)
}

/// Why a bind's target is refused; each names the target.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum BindError {
    #[error("bind target {0:?} is not an absolute path")]
    NotAbsolute(String),
    #[error("bind target {0:?} is not normalised (empty, `.` or `..` component, or a NUL)")]
    NotNormal(String),
    #[error("bind target {dst:?} would cover or fall inside {reserved}, which the sandbox mounts itself")]
    Reserved { dst: String, reserved: String },
    #[error("bind target {dst:?} falls inside or repeats the earlier bind target {earlier:?}")]
    Overlaps { dst: String, earlier: String },
}

/// Whether `inner` is `outer` or below it (component-wise).
fn within(inner: &Path, outer: &Path) -> bool {
    inner.starts_with(outer)
}

/// Checks every target, in order, against the sandbox's own mounts and
/// `system_dirs` and against the earlier binds.
pub fn check(binds: &[Bind], system_dirs: &[PathBuf]) -> Result<(), BindError> {
    let mut earlier: Vec<&Path> = Vec::new();
    for b in binds {
        let dst = &b.dst;
        if !dst.starts_with('/') {
            return Err(BindError::NotAbsolute(dst.clone()));
        }
        let normal = dst.len() > 1
            && !dst.contains('\0')
            && dst[1..]
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != "..");
        if !normal {
            return Err(BindError::NotNormal(dst.clone()));
        }
        let p = Path::new(dst);
        if is_system_file(dst) && !b.writable {
            if let Some(e) = earlier.iter().find(|e| within(p, e) || within(e, p)) {
                return Err(BindError::Overlaps {
                    dst: dst.clone(),
                    earlier: e.display().to_string(),
                });
            }
            earlier.push(p);
            continue;
        }
        let reserved = RESERVED
            .iter()
            .map(PathBuf::from)
            .chain(system_dirs.iter().cloned());
        for r in reserved {
            if within(p, &r) || within(&r, p) {
                return Err(BindError::Reserved {
                    dst: dst.clone(),
                    reserved: r.display().to_string(),
                });
            }
        }
        if let Some(e) = earlier.iter().find(|e| within(p, e) || within(e, p)) {
            return Err(BindError::Overlaps {
                dst: dst.clone(),
                earlier: e.display().to_string(),
            });
        }
        earlier.push(p);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bind(dst: &str) -> Bind {
        Bind {
            src: PathBuf::from("/host"),
            dst: dst.into(),
            writable: false,
        }
    }

    fn sys() -> Vec<PathBuf> {
        ["/usr", "/bin", "/etc"].iter().map(PathBuf::from).collect()
    }

    #[test]
    fn targets_on_the_tmpfs_root_are_allowed_in_order() {
        let ok = [
            bind("/run/allox/guest.sock"),
            bind("/run/allox/bin"),
            bind("/x"),
        ];
        assert_eq!(check(&ok, &sys()), Ok(()));
    }

    #[test]
    fn only_the_named_system_files_take_a_bind_and_only_read_only() {
        let debian = "/etc/ssl/certs/ca-certificates.crt";
        assert_eq!(check(&[bind(debian)], &sys()), Ok(()));
        let mut writable = bind(debian);
        writable.writable = true;
        assert!(matches!(
            check(&[writable], &sys()),
            Err(BindError::Reserved { .. })
        ));
        for other in ["/etc/ssl/certs/other.crt", "/etc/ssl/certs", "/etc/passwd"] {
            assert!(
                matches!(
                    check(&[bind(other)], &sys()),
                    Err(BindError::Reserved { .. })
                ),
                "{other}"
            );
        }
        assert!(matches!(
            check(&[bind(debian), bind(debian)], &sys()),
            Err(BindError::Overlaps { .. })
        ));
    }

    #[test]
    fn targets_inside_or_over_the_sandbox_s_own_mounts_are_refused() {
        for (dst, reserved) in [
            ("/allox", "/allox"),
            ("/allox/session/x", "/allox"),
            ("/allox/shared", "/allox"),
            ("/usr/lib/x", "/usr"),
            ("/etc", "/etc"),
            ("/proc/1", "/proc"),
            ("/dev/null", "/dev"),
            ("/tmp/sock", "/tmp"),
        ] {
            assert_eq!(
                check(&[bind(dst)], &sys()),
                Err(BindError::Reserved {
                    dst: dst.into(),
                    reserved: reserved.into()
                }),
                "{dst}"
            );
        }
    }

    #[test]
    fn bad_paths_and_nested_binds_are_refused_naming_the_target() {
        assert_eq!(
            check(&[bind("run/x")], &sys()),
            Err(BindError::NotAbsolute("run/x".into()))
        );
        for dst in ["/", "/run/../etc", "/run//x", "/run/./x", "/run/x/"] {
            assert_eq!(
                check(&[bind(dst)], &sys()),
                Err(BindError::NotNormal(dst.into())),
                "{dst}"
            );
        }
        let e = check(&[bind("/run/a"), bind("/run/a/b")], &sys()).unwrap_err();
        assert_eq!(
            e,
            BindError::Overlaps {
                dst: "/run/a/b".into(),
                earlier: "/run/a".into()
            }
        );
        assert!(check(&[bind("/run/a"), bind("/run/a")], &sys()).is_err());
        assert!(check(&[bind("/run/a/b"), bind("/run")], &sys()).is_err());
        // A sibling whose name merely starts the same is not inside.
        assert_eq!(check(&[bind("/run/a"), bind("/run/ab")], &sys()), Ok(()));
    }
}
