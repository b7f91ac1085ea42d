//! The secrets of the network plugin and each session's certificate
//! authority, kept in the store's `state/network-secrets/` (outside every
//! workspace and every sandbox, kept across rollbacks and restarts, gone
//! with their session or agent):
//!
//! ```text
//! network-secrets/AGENT/agent/NAME.json              the agent's, for every session
//! network-secrets/AGENT/session/SESSION/NAME.json    one session's own
//! network-secrets/AGENT/session/SESSION/ca/cert.pem  its authority's certificate
//! network-secrets/AGENT/session/SESSION/ca/key.sealed
//! network-secrets/AGENT/session/SESSION/ca/bundle.pem  the roots its runs trust
//! ```
//!
//! A secret's file holds its name, hosts and placeholder in the clear and
//! its value sealed ([`allox_network::seal`]) under `--secrets-key-file`,
//! which is not in the store: the store's disk never holds a value, nor
//! an authority's key, in the clear. Files are 0600 in 0700 directories,
//! written aside and renamed in.

use allox_network::broker::SessionSecrets;
use allox_network::intercept::{self, SessionCa};
use allox_network::seal::Sealer;
use allox_network::secrets::Secret;
use allox_protocol::{SecretInfo, SecretSet};
use base64::Engine;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use zeroize::Zeroizing;

/// The directory in the store's `state/`.
pub const DIR: &str = "network-secrets";

/// Where a session's runs find the roots they trust (its authority's
/// certificate among them), and the variables that point clients there.
pub const BUNDLE: &str = "/run/allox/ca-bundle.pem";
pub const BUNDLE_ENV: &[&str] = &[
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "NODE_EXTRA_CA_CERTS",
];

/// Most secrets of one agent or one session.
pub const MAX_SECRETS: usize = 64;

/// A secret's file.
#[derive(Serialize, Deserialize)]
struct Stored {
    name: String,
    hosts: Vec<String>,
    header: Option<String>,
    query: Option<String>,
    intercept: bool,
    placeholder: String,
    updated_ms: u64,
    /// The value sealed for [`what`], base64.
    sealed: String,
}

/// `agent` and, for a session's own, its session.
type Level = (String, Option<String>);

struct Entry {
    stored: Stored,
    secret: Secret,
}

/// What a seal is bound to: the level and the name.
fn what(a: &str, s: Option<&str>, name: &str) -> String {
    format!("secret {a}/{}/{name}", s.unwrap_or("*"))
}

fn ca_what(a: &str, s: &str) -> String {
    format!("certificate authority {a}/{s}")
}

pub(super) struct Vault {
    dir: PathBuf,
    key_file: PathBuf,
    sealer: OnceLock<Arc<Sealer>>,
    ca_file: Option<PathBuf>,
    levels: RwLock<HashMap<Level, BTreeMap<String, Entry>>>,
    cas: Mutex<HashMap<(String, String), Arc<SessionCa>>>,
}

fn invalid(why: impl Into<String>) -> allox_protocol::ErrorBody {
    allox_protocol::ErrorBody::invalid(why.into())
}

fn internal(why: impl Into<String>) -> allox_protocol::ErrorBody {
    allox_protocol::ErrorBody::new(allox_protocol::ErrorCode::Internal, why.into())
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A file of the vault that could not be written: `unavailable` for a full
/// disk or quota (free space and retry), else `internal`.
fn not_written(path: &Path, e: std::io::Error) -> allox_protocol::ErrorBody {
    let code = crate::plugin_api::state_file::error_code(&e);
    allox_protocol::ErrorBody::new(code, format!("write {}: {e}", path.display()))
}

impl Vault {
    /// Loads what `state_dir` holds. Secrets there whose session or agent
    /// is gone (deleted while no supervisor ran) are removed.
    pub(super) fn open(
        state_dir: &Path,
        key_file: &Path,
        ca_file: Option<&Path>,
        store: Option<&allox_store::Store>,
    ) -> Result<Vault, String> {
        let v = Vault {
            dir: state_dir.join(DIR),
            key_file: key_file.to_path_buf(),
            sealer: OnceLock::new(),
            ca_file: ca_file.map(Path::to_path_buf),
            levels: RwLock::new(HashMap::new()),
            cas: Mutex::new(HashMap::new()),
        };
        let mut files = Vec::new();
        for agent in read_dir_names(&v.dir) {
            let adir = v.dir.join(&agent);
            let gone = |s: Option<&str>| {
                store.is_some_and(|st| {
                    matches!(
                        st.network_of(&agent, s),
                        Err(allox_store::StoreError::NotFound(_))
                    )
                })
            };
            if gone(None) {
                let _ = std::fs::remove_dir_all(&adir);
                continue;
            }
            for f in read_dir_names(&adir.join("agent")) {
                files.push(((agent.clone(), None), adir.join("agent").join(f)));
            }
            for sess in read_dir_names(&adir.join("session")) {
                let sdir = adir.join("session").join(&sess);
                if gone(Some(&sess)) {
                    let _ = std::fs::remove_dir_all(&sdir);
                    continue;
                }
                for f in read_dir_names(&sdir) {
                    files.push(((agent.clone(), Some(sess.clone())), sdir.join(f)));
                }
            }
        }
        files.retain(|(_, p)| p.extension().is_some_and(|e| e == "json"));
        if files.is_empty() {
            return Ok(v);
        }
        let sealer = v.sealer().map_err(|e| {
            format!(
                "{} holds {} secrets sealed under the secrets key, which cannot be used: {e}",
                v.dir.display(),
                files.len()
            )
        })?;
        let mut levels = HashMap::<Level, BTreeMap<String, Entry>>::new();
        for (level, path) in files {
            let read = std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<Stored>(&b).map_err(|e| e.to_string()));
            let stored = read.map_err(|e| format!("{}: {e}", path.display()))?;
            let secret =
                unseal(&sealer, &level, stored).map_err(|e| format!("{}: {e}", path.display()))?;
            levels
                .entry(level)
                .or_default()
                .insert(secret.stored.name.clone(), secret);
        }
        *v.levels.write().unwrap_or_else(|e| e.into_inner()) = levels;
        Ok(v)
    }

    /// The key, opened (or made) on first use.
    fn sealer(&self) -> Result<Arc<Sealer>, String> {
        if let Some(s) = self.sealer.get() {
            return Ok(s.clone());
        }
        let s = Arc::new(Sealer::open_or_create(&self.key_file).map_err(|e| e.to_string())?);
        Ok(self.sealer.get_or_init(|| s).clone())
    }

    fn level_dir(&self, a: &str, s: Option<&str>) -> PathBuf {
        match s {
            None => self.dir.join(a).join("agent"),
            Some(s) => self.dir.join(a).join("session").join(s),
        }
    }

    /// `secret.set`, once the caller has checked the agent or session.
    pub(super) fn set(&self, p: &SecretSet) -> Result<SecretInfo, allox_protocol::ErrorBody> {
        let (a, s) = (p.agent_id.as_str(), p.session_id.as_deref());
        let level: Level = (a.to_string(), s.map(str::to_string));
        let mut levels = self.levels.write().unwrap_or_else(|e| e.into_inner());
        let existing = levels.get(&level);
        let placeholder = existing
            .and_then(|m| m.get(&p.name))
            .map(|e| e.stored.placeholder.clone())
            .unwrap_or_else(allox_network::secrets::placeholder);
        if existing.is_some_and(|m| m.len() >= MAX_SECRETS && !m.contains_key(&p.name)) {
            return Err(invalid(format!(
                "{} has {MAX_SECRETS} secrets, the most it may have; delete one first",
                match s {
                    Some(s) => format!("session {a}/{s}"),
                    None => format!("agent {a}"),
                }
            )));
        }
        let secret = Secret::new(
            &p.name,
            placeholder.clone(),
            Zeroizing::new(p.value.0.clone()),
            &p.hosts,
            p.header.as_deref(),
            p.query.as_deref(),
            p.intercept,
        )
        .map_err(|e| invalid(e.to_string()))?;
        let sealer = self
            .sealer()
            .map_err(|e| internal(format!("cannot seal the secret: {e}")))?;
        let sealed = sealer.seal(&what(a, s, &p.name), p.value.0.as_bytes());
        let stored = Stored {
            name: p.name.clone(),
            hosts: p.hosts.clone(),
            header: p.header.clone(),
            query: p.query.clone(),
            intercept: p.intercept,
            placeholder,
            updated_ms: now_ms(),
            sealed: base64::engine::general_purpose::STANDARD.encode(sealed),
        };
        let path = self.level_dir(a, s).join(format!("{}.json", p.name));
        let json = serde_json::to_vec_pretty(&stored).map_err(|e| internal(e.to_string()))?;
        crate::plugin_api::state_file::write(&path, &json, 0o600)
            .map_err(|e| not_written(&path, e))?;
        let info = info(&level, &stored);
        levels
            .entry(level)
            .or_default()
            .insert(p.name.clone(), Entry { stored, secret });
        Ok(info)
    }

    /// `secret.delete`: whether there was one.
    pub(super) fn delete(
        &self,
        a: &str,
        s: Option<&str>,
        name: &str,
    ) -> Result<bool, allox_protocol::ErrorBody> {
        let level: Level = (a.to_string(), s.map(str::to_string));
        let mut levels = self.levels.write().unwrap_or_else(|e| e.into_inner());
        let Some(m) = levels.get_mut(&level) else {
            return Ok(false);
        };
        if !m.contains_key(name) {
            return Ok(false);
        }
        let path = self.level_dir(a, s).join(format!("{name}.json"));
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(internal(format!("remove {}: {e}", path.display()))),
        }
        m.remove(name);
        Ok(true)
    }

    /// `secret.list`: the agent's, and the session's own when asked.
    pub(super) fn list(&self, a: &str, s: Option<&str>) -> Vec<SecretInfo> {
        let levels = self.levels.read().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        let mut add = |level: Level| {
            if let Some(m) = levels.get(&level) {
                out.extend(m.values().map(|e| info(&level, &e.stored)));
            }
        };
        add((a.to_string(), None));
        if let Some(s) = s {
            add((a.to_string(), Some(s.to_string())));
        }
        out
    }

    /// What applies to session `a/s`: the agent's secrets and its own
    /// (its own win on a name), by name.
    fn applying(&self, a: &str, s: &str) -> BTreeMap<String, Secret> {
        let levels = self.levels.read().unwrap_or_else(|e| e.into_inner());
        let mut out = BTreeMap::new();
        for level in [(a.to_string(), None), (a.to_string(), Some(s.to_string()))] {
            if let Some(m) = levels.get(&level) {
                for (n, e) in m {
                    out.insert(n.clone(), e.secret.clone());
                }
            }
        }
        out
    }

    /// What a run of session `a/s` gets: each secret's variable set to its
    /// placeholder, and, when one intercepts, the session's roots bound
    /// in and named by the usual variables.
    pub(super) fn contribution(
        &self,
        a: &str,
        s: &str,
    ) -> (Vec<(String, String)>, Option<PathBuf>) {
        let secrets = self.applying(a, s);
        let mut env: Vec<(String, String)> = secrets
            .values()
            .map(|x| (x.name.clone(), x.placeholder.clone()))
            .collect();
        if !secrets.values().any(|x| x.intercept) {
            return (env, None);
        }
        match self.ca(a, s) {
            Ok(_) => {
                for k in BUNDLE_ENV {
                    env.push((k.to_string(), BUNDLE.to_string()));
                }
                (env, Some(self.bundle_path(a, s)))
            }
            Err(e) => {
                tracing::error!(agent = a, session = s, error = %e, "cannot make the session's certificate authority; its intercepted hosts will fail the client's TLS");
                (env, None)
            }
        }
    }

    /// What the broker uses for session `a/s`.
    pub(super) fn session_secrets(&self, a: &str, s: &str) -> SessionSecrets {
        let list: Vec<Secret> = self.applying(a, s).into_values().collect();
        let ca = if list.iter().any(|x| x.intercept) {
            match self.ca(a, s) {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::error!(agent = a, session = s, error = %e, "cannot load the session's certificate authority; its intercepted hosts are refused");
                    None
                }
            }
        } else {
            None
        };
        SessionSecrets { list, ca }
    }

    fn ca_dir(&self, a: &str, s: &str) -> PathBuf {
        self.level_dir(a, Some(s)).join("ca")
    }

    fn bundle_path(&self, a: &str, s: &str) -> PathBuf {
        self.ca_dir(a, s).join("bundle.pem")
    }

    /// Session `a/s`'s authority: loaded, or made (with its bundle) the
    /// first time.
    fn ca(&self, a: &str, s: &str) -> Result<Arc<SessionCa>, String> {
        let k = (a.to_string(), s.to_string());
        let mut cas = self.cas.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = cas.get(&k) {
            return Ok(c.clone());
        }
        let sealer = self.sealer()?;
        let dir = self.ca_dir(a, s);
        let label = format!("{a}/{s}");
        let key_path = dir.join("key.sealed");
        let key = match std::fs::read(&key_path) {
            Ok(sealed) => {
                let k = sealer
                    .open(&ca_what(a, s), &sealed)
                    .map_err(|e| format!("{}: {e}", key_path.display()))?;
                Zeroizing::new(String::from_utf8_lossy(&k).into_owned())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let (cert, key) = intercept::new_ca(&label).map_err(|e| e.to_string())?;
                let bundle = self.bundle(&cert);
                crate::plugin_api::state_file::write(&dir.join("cert.pem"), cert.as_bytes(), 0o644)
                    .and_then(|()| {
                        crate::plugin_api::state_file::write(
                            &dir.join("bundle.pem"),
                            bundle.as_bytes(),
                            0o644,
                        )
                    })
                    .and_then(|()| {
                        crate::plugin_api::state_file::write(
                            &key_path,
                            &sealer.seal(&ca_what(a, s), key.as_bytes()),
                            0o600,
                        )
                    })
                    .map_err(|e| format!("{}: {e}", dir.display()))?;
                key
            }
            Err(e) => return Err(format!("{}: {e}", key_path.display())),
        };
        let ca = Arc::new(SessionCa::load(&label, &key).map_err(|e| e.to_string())?);
        cas.insert(k, ca.clone());
        Ok(ca)
    }

    /// The roots a session's runs trust: the system's, `--network-ca-file`
    /// and the session's authority.
    fn bundle(&self, cert: &str) -> String {
        let mut out = String::new();
        for p in [
            Some(Path::new(intercept::SYSTEM_ROOTS)),
            self.ca_file.as_deref(),
        ]
        .into_iter()
        .flatten()
        {
            if let Ok(t) = std::fs::read_to_string(p) {
                out.push_str(&t);
                if !out.ends_with('\n') {
                    out.push('\n');
                }
            }
        }
        out.push_str(cert);
        out
    }

    /// Session `a/s` (or every session of `a`, and `a`'s own secrets) was
    /// deleted: their secrets and authorities go.
    pub(super) fn deleted(&self, a: &str, s: Option<&str>) {
        let mut levels = self.levels.write().unwrap_or_else(|e| e.into_inner());
        levels.retain(|(la, ls), _| la != a || (s.is_some() && ls.as_deref() != s));
        self.cas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(ca, cs), _| ca != a || s.is_some_and(|s| s != cs));
        let dir = match s {
            Some(s) => self.level_dir(a, Some(s)),
            None => self.dir.join(a),
        };
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::error!(dir = %dir.display(), error = %e, "cannot remove the deleted session's secrets");
            }
        }
    }
}

fn read_dir_names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default()
}

fn unseal(sealer: &Sealer, level: &Level, stored: Stored) -> Result<Entry, String> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(&stored.sealed)
        .map_err(|e| e.to_string())?;
    let value = sealer
        .open(&what(&level.0, level.1.as_deref(), &stored.name), &raw)
        .map_err(|e| e.to_string())?;
    let value = Zeroizing::new(
        String::from_utf8(value.to_vec()).map_err(|_| "the value is not UTF-8".to_string())?,
    );
    let secret = Secret::new(
        &stored.name,
        stored.placeholder.clone(),
        value,
        &stored.hosts,
        stored.header.as_deref(),
        stored.query.as_deref(),
        stored.intercept,
    )
    .map_err(|e| e.to_string())?;
    Ok(Entry { stored, secret })
}

fn info(level: &Level, s: &Stored) -> SecretInfo {
    SecretInfo {
        agent_id: level.0.clone(),
        session_id: level.1.clone(),
        name: s.name.clone(),
        hosts: s.hosts.clone(),
        header: s.header.clone(),
        query: s.query.clone(),
        intercept: s.intercept,
        placeholder: s.placeholder.clone(),
        updated_ms: s.updated_ms,
    }
}
