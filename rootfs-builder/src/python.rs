//! The "python" profile: python3 and git as Debian installs them on this
//! host (packages `python3`, `git`), with every shared library they and
//! their extension modules load, the loader, and the standard library.
//!
//! Files keep their Debian paths (merged /usr: `/lib` → `usr/lib`, `/lib64`
//! → `usr/lib64`), and symlinks on the way to a file are kept as symlinks,
//! so `ld.so` finds libraries by soname in its default directories with no
//! `ld.so.cache`. Left out: `__pycache__` (its `.pyc` files record source
//! mtimes, which would make the image depend on when packages were
//! installed), the test suites, IDLE, tkinter, turtledemo, ensurepip and
//! the static `config-*` directory. Git's Perl and shell helpers are copied
//! but have no interpreter in the image.

use std::path::{Path, PathBuf};

use crate::libs::{self, LibError};
use crate::tree::{self, copy_preserving, Tree, TreeError};

const PYTHON: &str = "/usr/bin/python3";
const GIT: &str = "/usr/bin/git";
const GIT_CORE: &str = "/usr/lib/git-core";
const GIT_TEMPLATES: &str = "/usr/share/git-core/templates";
/// Loaded with dlopen by glibc's pthread_cancel, not listed in DT_NEEDED.
const LIBGCC_S: &str = "libgcc_s.so.1";
/// Optional: the CA bundle for HTTPS (package `ca-certificates`).
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

#[derive(Debug, thiserror::Error)]
pub enum PythonError {
    #[error("{path} is missing (apt-get install {package})")]
    Missing { path: String, package: &'static str },
    #[error("{}: cannot read", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Tree(#[from] TreeError),
    #[error("shared libraries")]
    Libs(#[source] LibError),
}

/// Adds python3, its standard library, git, and what they load.
pub fn add(t: &mut Tree) -> Result<(), PythonError> {
    for (path, package) in [(PYTHON, "python3"), (GIT, "git"), (GIT_CORE, "git")] {
        if !Path::new(path).exists() {
            return Err(PythonError::Missing {
                path: path.into(),
                package,
            });
        }
    }
    let python = copy_preserving(t, Path::new(PYTHON))?;
    let name = python.file_name().and_then(|n| n.to_str()).unwrap_or("");
    // "python3.11" → /usr/lib/python3.11
    let stdlib = PathBuf::from(format!("/usr/lib/{name}"));
    if !stdlib.join("os.py").is_file() {
        return Err(PythonError::Missing {
            path: stdlib.join("os.py").display().to_string(),
            package: "libpython3-stdlib",
        });
    }
    let stdlib_dest = tree::utf8(&stdlib)?.to_string();
    tree::add_host_path(t, &stdlib, &stdlib_dest, &left_out, false)?;
    // Debian's sitecustomize.py is a symlink into /etc/python3.X.
    let etc = PathBuf::from(format!("/etc/{name}"));
    if etc.is_dir() {
        tree::add_host_path(t, &etc, tree::utf8(&etc)?, &left_out, false)?;
    }

    copy_preserving(t, Path::new(GIT))?;
    tree::add_host_path(t, Path::new(GIT_CORE), GIT_CORE, &|_| false, false)?;
    if Path::new(GIT_TEMPLATES).is_dir() {
        tree::add_host_path(
            t,
            Path::new(GIT_TEMPLATES),
            GIT_TEMPLATES,
            &|_| false,
            false,
        )?;
    }
    if Path::new(CA_BUNDLE).exists() {
        copy_preserving(t, Path::new(CA_BUNDLE))?;
    }

    let mut roots = Vec::new();
    for (_, src) in t.host_files() {
        if is_elf(src)? {
            roots.push(src.to_path_buf());
        }
    }
    let gcc = libs::DEFAULT_DIRS
        .iter()
        .map(|d| Path::new(d).join(LIBGCC_S))
        .find(|p| p.is_file());
    roots.extend(gcc.clone());
    libs::install(t, &roots).map_err(PythonError::Libs)?;
    if let Some(gcc) = &gcc {
        copy_preserving(t, gcc)?;
    }
    Ok(())
}

/// Names left out of the standard library, at any depth.
fn left_out(name: &str) -> bool {
    matches!(
        name,
        "__pycache__"
            | "test"
            | "tests"
            | "idle_test"
            | "idlelib"
            | "tkinter"
            | "turtledemo"
            | "ensurepip"
    ) || name.starts_with("config-3")
}

fn is_elf(path: &Path) -> Result<bool, PythonError> {
    use std::io::Read;
    let mut magic = [0u8; 4];
    let mut f = std::fs::File::open(path).map_err(|source| PythonError::Read {
        path: path.into(),
        source,
    })?;
    Ok(f.read_exact(&mut magic).is_ok() && &magic == b"\x7fELF")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::Node;

    #[test]
    fn left_out_names() {
        for n in [
            "__pycache__",
            "test",
            "idlelib",
            "config-3.11-x86_64-linux-gnu",
        ] {
            assert!(left_out(n), "{n}");
        }
        for n in ["os.py", "unittest", "encodings", "lib-dynload", "config.py"] {
            assert!(!left_out(n), "{n}");
        }
    }

    #[test]
    fn the_profile_has_python_git_and_their_libraries() {
        let missing: Vec<&str> = [PYTHON, GIT, GIT_CORE]
            .into_iter()
            .filter(|p| !Path::new(p).exists())
            .collect();
        if !missing.is_empty() {
            return crate::test_support::skip(
                "the_profile_has_python_git_and_their_libraries",
                &format!("{} (apt-get install python3 git)", missing.join(", ")),
            );
        }
        let mut t = Tree::new();
        add(&mut t).unwrap();
        assert!(matches!(
            t.get("/usr/bin/python3"),
            Some(Node::Symlink { .. })
        ));
        assert!(matches!(t.get("/usr/bin/git"), Some(Node::File { .. })));
        assert!(matches!(
            t.get("/usr/lib64/ld-linux-x86-64.so.2"),
            Some(Node::Symlink { .. })
        ));
        assert!(matches!(
            t.get("/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
            Some(Node::File { .. })
        ));
        assert!(t.get("/usr/lib/x86_64-linux-gnu/libc.so.6").is_some());
        assert!(t.get("/usr/lib/x86_64-linux-gnu/libgcc_s.so.1").is_some());
        assert!(t.paths().any(|p| p.ends_with("/os.py")));
        assert!(!t.paths().any(|p| p.contains("__pycache__")));
    }
}
