//! Shared-library closure, the way `ld.so` would find it: for each
//! `DT_NEEDED` name, the needing object's `DT_RUNPATH`/`DT_RPATH` (with
//! `$ORIGIN`), then the default directories. Objects for another machine
//! are passed over, as the loader does. No `ld.so.cache` is read, so the
//! result depends only on the files.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

use crate::elf::{self, ElfError};
use crate::tree::{copy_preserving, Tree, TreeError};

/// Debian's multiarch library directories, in `ld.so`'s order.
pub const DEFAULT_DIRS: &[&str] = &[
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib",
    "/usr/lib",
];

#[derive(Debug, thiserror::Error)]
pub enum LibError {
    #[error("{}: needs {name}, which is in none of {searched}", needed_by.display())]
    NotFound {
        name: String,
        needed_by: PathBuf,
        searched: String,
    },
    #[error(transparent)]
    Elf(#[from] ElfError),
    #[error(transparent)]
    Tree(#[from] TreeError),
}

/// What a set of ELF files needs at run time.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Closure {
    /// Program interpreters (`PT_INTERP`), e.g. the x86-64 `ld.so`.
    pub interpreters: BTreeSet<String>,
    /// Host paths of the libraries, as found (often a soname symlink).
    pub libraries: BTreeSet<PathBuf>,
}

/// Every interpreter and library that `roots` need, transitively.
pub fn closure(roots: &[PathBuf], dirs: &[&Path]) -> Result<Closure, LibError> {
    let mut out = Closure::default();
    let mut queue: VecDeque<PathBuf> = roots.iter().cloned().collect();
    let mut seen: BTreeSet<PathBuf> = BTreeSet::new();
    // Soname to where it was found: a name needed twice resolves once,
    // as in the loader's namespace.
    let mut found: BTreeMap<String, PathBuf> = BTreeMap::new();
    while let Some(obj) = queue.pop_front() {
        if !seen.insert(obj.clone()) {
            continue;
        }
        let info = elf::inspect(&obj)?;
        if let Some(i) = info.interpreter {
            out.interpreters.insert(i);
        }
        let origin = obj.parent().unwrap_or(Path::new("/"));
        let runpath: Vec<PathBuf> = info
            .search
            .iter()
            .map(|s| {
                PathBuf::from(
                    s.replace("${ORIGIN}", "$ORIGIN")
                        .replace("$ORIGIN", &origin.to_string_lossy()),
                )
            })
            .collect();
        for name in info.needed {
            if let Some(p) = found.get(&name) {
                queue.push_back(p.clone());
                continue;
            }
            let candidates: Vec<PathBuf> = if name.contains('/') {
                vec![PathBuf::from(&name)]
            } else {
                runpath
                    .iter()
                    .map(PathBuf::as_path)
                    .chain(dirs.iter().copied())
                    .map(|d| d.join(&name))
                    .collect()
            };
            let hit = candidates
                .iter()
                .find(|c| c.is_file() && elf::inspect(c).is_ok())
                .ok_or_else(|| LibError::NotFound {
                    name: name.clone(),
                    needed_by: obj.clone(),
                    searched: candidates
                        .iter()
                        .filter_map(|c| c.parent())
                        .map(|d| d.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                })?;
            found.insert(name, hit.clone());
            out.libraries.insert(hit.clone());
            queue.push_back(hit.clone());
        }
    }
    Ok(out)
}

/// Lays out Debian's merged /usr in `t` (`/lib` → `usr/lib`, `/lib64` →
/// `usr/lib64`) and copies the loader and every library that `roots`
/// need, each at its Debian path with the symlinks on the way, so `ld.so`
/// finds them by soname with no `ld.so.cache`. The roots themselves are
/// the caller's to place.
pub fn install(t: &mut Tree, roots: &[PathBuf]) -> Result<(), LibError> {
    t.dir("/usr/lib", 0o755)?;
    t.dir("/usr/lib64", 0o755)?;
    t.symlink("/lib", "usr/lib")?;
    t.symlink("/lib64", "usr/lib64")?;
    let dirs: Vec<&Path> = DEFAULT_DIRS.iter().map(Path::new).collect();
    let closure = closure(roots, &dirs)?;
    for interp in &closure.interpreters {
        copy_preserving(t, Path::new(interp))?;
    }
    for lib in &closure.libraries {
        copy_preserving(t, lib)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::skip;

    fn default_dirs() -> Vec<&'static Path> {
        DEFAULT_DIRS.iter().map(Path::new).collect()
    }

    #[test]
    fn ls_needs_libc_and_the_loader() {
        let ls = PathBuf::from("/bin/ls");
        match elf::inspect(&ls) {
            Ok(i) if i.interpreter.is_some() => {}
            _ => {
                return skip(
                    "ls_needs_libc_and_the_loader",
                    "a dynamically linked /bin/ls",
                )
            }
        }
        let c = closure(&[ls], &default_dirs()).unwrap();
        assert!(c.interpreters.contains("/lib64/ld-linux-x86-64.so.2"));
        assert!(c
            .libraries
            .iter()
            .any(|l| l.file_name().is_some_and(|n| n == "libc.so.6")));
    }

    #[test]
    fn a_missing_library_is_named() {
        let ls = PathBuf::from("/bin/ls");
        if elf::inspect(&ls)
            .map(|i| i.needed.is_empty())
            .unwrap_or(true)
        {
            return skip("a_missing_library_is_named", "a dynamically linked /bin/ls");
        }
        let empty = tempfile::tempdir().unwrap();
        let err = closure(&[ls], &[empty.path()]).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("/bin/ls: needs lib"), "{msg}");
        assert!(
            msg.ends_with(&format!("which is in none of {}", empty.path().display())),
            "{msg}"
        );
    }

    #[test]
    fn a_static_binary_needs_nothing() {
        let exe = std::env::current_exe().unwrap();
        let c = closure(&[exe], &default_dirs()).unwrap();
        if !c.interpreters.is_empty() {
            return skip("a_static_binary_needs_nothing", "a +crt-static build");
        }
        assert!(c.libraries.is_empty());
    }
}
