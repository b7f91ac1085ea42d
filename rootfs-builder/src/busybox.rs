//! Busybox and its applet links.
//!
//! The applet list comes from the binary itself (`busybox --list-full`, run
//! at build time), so it always matches the busybox that goes in; for a
//! given binary the list is fixed, so the image stays reproducible. The
//! image uses Debian's merged-/usr layout (`/bin` → `usr/bin`, `/sbin` →
//! `usr/sbin`), so `bin/ls` and `usr/bin/ls` land in the same place.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where busybox lives in the image.
pub const IMAGE_PATH: &str = "/usr/bin/busybox";

/// Applets left out: the image's init is allox-init, and busybox does not
/// link to itself.
const LEFT_OUT: &[&str] = &["linuxrc", "sbin/init", "bin/busybox", "usr/bin/busybox"];

#[derive(Debug, thiserror::Error)]
pub enum BusyboxError {
    #[error("{}: cannot run `busybox --list-full`", path.display())]
    Run {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: `busybox --list-full` failed ({status}): {stderr}", path.display())]
    Failed {
        path: PathBuf,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("{}: `busybox --list-full` printed no applets", path.display())]
    Empty { path: PathBuf },
}

/// The applet paths `busybox --list-full` prints, e.g. `usr/bin/head`.
pub fn list_applets(busybox: &Path) -> Result<Vec<String>, BusyboxError> {
    let out = Command::new(busybox)
        .arg("--list-full")
        .env_clear()
        .output()
        .map_err(|source| BusyboxError::Run {
            path: busybox.into(),
            source,
        })?;
    if !out.status.success() {
        return Err(BusyboxError::Failed {
            path: busybox.into(),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().into(),
        });
    }
    let list: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    if list.is_empty() {
        return Err(BusyboxError::Empty {
            path: busybox.into(),
        });
    }
    Ok(list)
}

/// Image path and symlink target of each applet, sorted, without the
/// ones left out and without duplicates. `bin/ls` becomes
/// `/usr/bin/ls` → `busybox`; `sbin/mount` becomes `/usr/sbin/mount` →
/// `../bin/busybox`. Applets whose name is not a plain file name are
/// skipped.
pub fn applet_links(applets: &[String]) -> Vec<(String, &'static str)> {
    let mut links: Vec<(String, &'static str)> = applets
        .iter()
        .filter(|a| !LEFT_OUT.contains(&a.as_str()))
        .filter_map(|a| {
            let (dir, name) = a.rsplit_once('/')?;
            if name.is_empty() || name == "." || name == ".." {
                return None;
            }
            match dir {
                "bin" | "usr/bin" => Some((format!("/usr/bin/{name}"), "busybox")),
                "sbin" | "usr/sbin" => Some((format!("/usr/sbin/{name}"), "../bin/busybox")),
                _ => None,
            }
        })
        .collect();
    links.sort();
    links.dedup();
    links
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_follow_merged_usr() {
        let list: Vec<String> = [
            "linuxrc",
            "bin/busybox",
            "bin/sh",
            "usr/bin/[",
            "sbin/init",
            "sbin/mount",
            "usr/sbin/chroot",
            "bin/sh",
            "opt/odd",
            "bin/",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            applet_links(&list),
            [
                ("/usr/bin/[".to_string(), "busybox"),
                ("/usr/bin/sh".to_string(), "busybox"),
                ("/usr/sbin/chroot".to_string(), "../bin/busybox"),
                ("/usr/sbin/mount".to_string(), "../bin/busybox"),
            ]
        );
    }

    #[test]
    fn debian_busybox_lists_the_basics() {
        let bb = Path::new("/bin/busybox");
        if !bb.exists() {
            return crate::test_support::skip(
                "debian_busybox_lists_the_basics",
                "/bin/busybox (apt-get install busybox-static)",
            );
        }
        let links = applet_links(&list_applets(bb).unwrap());
        for want in [
            "/usr/bin/sh",
            "/usr/bin/ls",
            "/usr/bin/[",
            "/usr/sbin/poweroff",
        ] {
            assert!(links.iter().any(|(p, _)| p == want), "{want} missing");
        }
    }

    #[test]
    fn a_missing_busybox_is_named() {
        let err = list_applets(Path::new("/no/busybox")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "/no/busybox: cannot run `busybox --list-full`"
        );
    }
}
