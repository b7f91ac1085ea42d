//! The scope file (`--system-effects-scope FILE`): which domains beyond
//! `workspace` and `shared` are confirmed at S0/S1, and what the
//! `filesystem` domain covers.
//!
//! ```json
//! {
//!   "domains": ["filesystem", "bpf", "sysctl", "mount", "network", "modules", "processes"],
//!   "paths": ["/etc", "/usr/local"],
//!   "volatile_sysctls": ["kernel.perf_event_max_sample_rate"]
//! }
//! ```
//!
//! Without a scope file only `workspace` and `shared` are observed; every
//! other domain is `NOT_OBSERVED`.

use allox_protocol::EffectsDomain;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A scope, as the observer is given it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scope {
    /// The observed domains, `workspace` and `shared` included, in
    /// [`EffectsDomain`] order.
    pub domains: Vec<EffectsDomain>,
    /// The `filesystem` domain's paths (absolute).
    pub paths: Vec<PathBuf>,
    /// Sysctls (or prefixes ending in `.`) that change on their own, on
    /// top of the collector's pinned list.
    pub volatile_sysctls: Vec<String>,
}

impl Default for Scope {
    fn default() -> Self {
        Scope {
            domains: vec![EffectsDomain::Workspace, EffectsDomain::Shared],
            paths: Vec::new(),
            volatile_sysctls: Vec::new(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    domains: Vec<String>,
    #[serde(default)]
    paths: Vec<PathBuf>,
    #[serde(default)]
    volatile_sysctls: Vec<String>,
}

/// Why a scope file is refused.
#[derive(Debug, thiserror::Error)]
pub enum ScopeError {
    #[error("read the scope file {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the scope file {}: {why}", .path.display())]
    Invalid { path: PathBuf, why: String },
}

impl Scope {
    /// Whether `d` is observed.
    pub fn observes(&self, d: EffectsDomain) -> bool {
        self.domains.contains(&d)
    }

    /// Reads a scope file.
    pub fn load(path: &Path) -> Result<Scope, ScopeError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScopeError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let scope = Scope::parse(&text).map_err(|why| ScopeError::Invalid {
            path: path.to_path_buf(),
            why,
        })?;
        // A path that is not there could not be watched: every observed
        // run would fail at its start and fence its session.
        for p in &scope.paths {
            if let Err(e) = std::fs::metadata(p) {
                return Err(ScopeError::Invalid {
                    path: path.to_path_buf(),
                    why: format!("path {} cannot be watched: {e}", p.display()),
                });
            }
        }
        Ok(scope)
    }

    /// Parses a scope file's text.
    pub fn parse(text: &str) -> Result<Scope, String> {
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if !v.is_object() {
            return Err(format!(
                "a scope is a JSON object ({{\"domains\": [...], \"paths\": [...]}}), not {v}"
            ));
        }
        let f: File = serde_json::from_value(v).map_err(|e| e.to_string())?;
        let mut domains = vec![EffectsDomain::Workspace, EffectsDomain::Shared];
        for name in &f.domains {
            let d = EffectsDomain::parse(name).ok_or_else(|| {
                format!(
                    "unknown domain {name:?} (known: {})",
                    EffectsDomain::ALL.map(|d| d.as_str()).join(", ")
                )
            })?;
            if !domains.contains(&d) {
                domains.push(d);
            }
        }
        domains.sort();
        for p in &f.paths {
            if !p.is_absolute() {
                return Err(format!("path {} is not absolute", p.display()));
            }
        }
        if !f.paths.is_empty() && !domains.contains(&EffectsDomain::Filesystem) {
            return Err("paths are given but the filesystem domain is not in domains".into());
        }
        if domains.contains(&EffectsDomain::Filesystem) && f.paths.is_empty() {
            return Err("the filesystem domain needs at least one path in paths".into());
        }
        Ok(Scope {
            domains,
            paths: f.paths,
            volatile_sysctls: f.volatile_sysctls,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_always_has_workspace_and_shared() {
        let s = Scope::parse(r#"{"domains": ["sysctl", "bpf", "sysctl"]}"#).unwrap();
        assert_eq!(
            s.domains,
            [
                EffectsDomain::Workspace,
                EffectsDomain::Shared,
                EffectsDomain::Bpf,
                EffectsDomain::Sysctl
            ]
        );
        assert!(!s.observes(EffectsDomain::Mount));
        assert_eq!(Scope::default().domains.len(), 2);
    }

    #[test]
    fn bad_scopes_say_what_is_wrong() {
        let e = Scope::parse(r#"{"domains": ["kernel"]}"#).unwrap_err();
        assert!(e.contains("unknown domain \"kernel\""), "{e}");
        let e = Scope::parse(r#"{"domains": ["filesystem"], "paths": ["etc"]}"#).unwrap_err();
        assert!(e.contains("not absolute"), "{e}");
        let e = Scope::parse(r#"{"domains": ["filesystem"]}"#).unwrap_err();
        assert!(e.contains("at least one path"), "{e}");
        let e = Scope::parse(r#"{"domain": []}"#).unwrap_err();
        assert!(e.contains("unknown field"), "{e}");
        let e = Scope::parse("[]").unwrap_err();
        assert!(e.contains("a JSON object"), "{e}");
    }

    /// A path that is not there is refused when the file is loaded (at
    /// the daemon's start), not at every run's.
    #[test]
    fn a_scope_path_that_is_not_there_is_refused_at_load() {
        let dir = std::env::temp_dir().join(format!("allox-scope-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("scope.json");
        let missing = dir.join("missing");
        std::fs::write(
            &file,
            format!(
                r#"{{"domains": ["filesystem"], "paths": ["{}"]}}"#,
                missing.display()
            ),
        )
        .unwrap();
        let e = Scope::load(&file).unwrap_err().to_string();
        assert!(
            e.contains("cannot be watched") && e.contains("missing"),
            "{e}"
        );
        std::fs::create_dir(&missing).unwrap();
        assert_eq!(Scope::load(&file).unwrap().paths, [missing]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
