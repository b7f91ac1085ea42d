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
        Scope::parse(&text).map_err(|why| ScopeError::Invalid {
            path: path.to_path_buf(),
            why,
        })
    }

    /// Parses a scope file's text.
    pub fn parse(text: &str) -> Result<Scope, String> {
        let f: File = serde_json::from_str(text).map_err(|e| e.to_string())?;
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
    }
}
