//! Who shares what: each session's choice (made by the session itself or
//! by the host), each agent's settings, and the sharing that follows from
//! them. Kept in `state/share.json` (outside every workspace, so a
//! rollback keeps it), written whole beside itself and renamed into place.
//!
//! A session's entry remembers when the session was made: a session
//! deleted and made again under its name is another session and does not
//! inherit the old one's sharing.

use allox_protocol::{ShareAgentInfo, ShareInfo, ShareOrigin, SharePermission};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// An agent's settings.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct AgentSettings {
    pub allowed: bool,
    pub default_on: bool,
    pub default_scope: String,
    pub default_permission: SharePermission,
}

impl Default for AgentSettings {
    /// Sharing allowed, off by default, read-only by default.
    fn default() -> Self {
        AgentSettings {
            allowed: true,
            default_on: false,
            default_scope: ".".into(),
            default_permission: SharePermission::Read,
        }
    }
}

/// A session's own choice.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct SessionChoice {
    /// When the session was made (which session of that name this is).
    pub created_ms: u64,
    pub enabled: bool,
    pub scope: String,
    pub permission: SharePermission,
    /// `session` or `host`.
    pub origin: ShareOrigin,
    pub since_ms: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
pub struct Saved {
    #[serde(default)]
    pub agents: BTreeMap<String, AgentSettings>,
    /// By `agent/session`.
    #[serde(default)]
    pub sessions: BTreeMap<String, SessionChoice>,
}

pub fn key(a: &str, s: &str) -> String {
    format!("{a}/{s}")
}

impl Saved {
    /// Reads the file; a missing one is the defaults.
    pub fn load(path: &Path) -> std::io::Result<Saved> {
        match std::fs::read(path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{} does not read: {e}", path.display()),
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Saved::default()),
            Err(e) => Err(e),
        }
    }

    /// Writes the file whole: beside it, synced, renamed over it. For a
    /// sandbox's own choice (`by_session`) without the spare room the
    /// store keeps for a full disk: that is for the host's.
    pub fn save(&self, path: &Path, by_session: bool) -> std::io::Result<()> {
        let text = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        // The root's alone, as every state file (it was the umask's).
        if by_session {
            crate::plugin_api::state_file::write_without_spare(path, &text, 0o600)
        } else {
            crate::plugin_api::state_file::write(path, &text, 0o600)
        }
    }

    pub fn agent(&self, a: &str) -> AgentSettings {
        self.agents.get(a).cloned().unwrap_or_default()
    }

    /// Session `a/s` (made at `created_ms`)'s sharing now.
    pub fn effective(&self, a: &str, s: &str, created_ms: u64) -> ShareInfo {
        let agent = self.agent(a);
        let mut info = ShareInfo {
            agent_id: a.to_string(),
            session_id: s.to_string(),
            enabled: false,
            scope: None,
            permission: None,
            origin: ShareOrigin::Default,
            since_ms: None,
        };
        if !agent.allowed {
            info.origin = ShareOrigin::AgentDenied;
            return info;
        }
        let own = self
            .sessions
            .get(&key(a, s))
            .filter(|c| c.created_ms == created_ms);
        match own {
            Some(c) => {
                info.enabled = c.enabled;
                info.origin = c.origin;
                info.since_ms = Some(c.since_ms);
                if c.enabled {
                    info.scope = Some(c.scope.clone());
                    info.permission = Some(c.permission);
                }
            }
            None if agent.default_on => {
                info.enabled = true;
                info.origin = ShareOrigin::Agent;
                info.scope = Some(agent.default_scope.clone());
                info.permission = Some(agent.default_permission);
            }
            None => {}
        }
        info
    }

    /// Records session `a/s`'s choice: `Some((scope, permission))` shares,
    /// `None` does not.
    pub fn choose(
        &mut self,
        a: &str,
        s: &str,
        created_ms: u64,
        offer: Option<(String, SharePermission)>,
        origin: ShareOrigin,
        now_ms: u64,
    ) {
        let (enabled, (scope, permission)) = match offer {
            Some(o) => (true, o),
            None => (false, (".".to_string(), SharePermission::Read)),
        };
        self.sessions.insert(
            key(a, s),
            SessionChoice {
                created_ms,
                enabled,
                scope,
                permission,
                origin,
                since_ms: now_ms,
            },
        );
    }

    /// The choices of sessions that no longer exist (as `exists` tells)
    /// are dropped; returns whether any was.
    pub fn forget_gone(&mut self, exists: impl Fn(&str, &str, u64) -> bool) -> bool {
        let before = self.sessions.len();
        self.sessions.retain(|k, c| {
            let (a, s) = k.split_once('/').unwrap_or((k, ""));
            exists(a, s, c.created_ms)
        });
        self.sessions.len() != before
    }
}

impl AgentSettings {
    pub fn info(&self, a: &str) -> ShareAgentInfo {
        ShareAgentInfo {
            agent_id: a.to_string(),
            allowed: self.allowed,
            default_on: self.default_on,
            default_scope: self.default_scope.clone(),
            default_permission: self.default_permission,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharing_is_off_and_read_only_by_default() {
        let s = Saved::default();
        let i = s.effective("a", "s", 1);
        assert!(!i.enabled);
        assert_eq!(i.origin, ShareOrigin::Default);
        let mut s = Saved::default();
        s.agents.insert(
            "a".into(),
            AgentSettings {
                default_on: true,
                ..AgentSettings::default()
            },
        );
        let i = s.effective("a", "s", 1);
        assert!(i.enabled);
        assert_eq!(i.permission, Some(SharePermission::Read));
        assert_eq!(i.scope.as_deref(), Some("."));
        assert_eq!(i.origin, ShareOrigin::Agent);
        assert!(!s.effective("b", "s", 1).enabled, "another agent's default");
    }

    #[test]
    fn a_session_s_choice_wins_over_its_agent_s_default_but_not_a_denial() {
        let mut s = Saved::default();
        s.agents.insert(
            "a".into(),
            AgentSettings {
                default_on: true,
                ..AgentSettings::default()
            },
        );
        s.choose("a", "s", 7, None, ShareOrigin::Session, 100);
        assert!(!s.effective("a", "s", 7).enabled);
        s.choose(
            "a",
            "t",
            8,
            Some(("out".into(), SharePermission::Write)),
            ShareOrigin::Session,
            100,
        );
        let t = s.effective("a", "t", 8);
        assert!(t.enabled && t.permission == Some(SharePermission::Write));
        s.agents.get_mut("a").unwrap().allowed = false;
        let t = s.effective("a", "t", 8);
        assert!(!t.enabled);
        assert_eq!(t.origin, ShareOrigin::AgentDenied);
    }

    #[test]
    fn a_session_made_again_under_its_name_does_not_inherit_sharing() {
        let mut s = Saved::default();
        s.choose(
            "a",
            "s",
            7,
            Some((".".into(), SharePermission::Write)),
            ShareOrigin::Session,
            100,
        );
        assert!(s.effective("a", "s", 7).enabled);
        assert!(!s.effective("a", "s", 9).enabled);
        assert!(s.forget_gone(|_, _, created| created == 9));
        assert!(s.sessions.is_empty());
    }

    #[test]
    fn the_file_is_written_whole_and_read_back() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("share.json");
        assert_eq!(Saved::load(&p).unwrap(), Saved::default());
        let mut s = Saved::default();
        s.choose(
            "a",
            "s",
            7,
            Some(("out".into(), SharePermission::Read)),
            ShareOrigin::Host,
            100,
        );
        s.save(&p, false).unwrap();
        assert_eq!(Saved::load(&p).unwrap(), s);
        assert!(!d.path().join("share.json.tmp").exists());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "share.json is {mode:o}");
        std::fs::write(&p, "{not json").unwrap();
        let e = Saved::load(&p).unwrap_err().to_string();
        assert!(e.contains("share.json does not read"), "{e}");
    }
}
