//! HTTPS interception for the hosts a secret asks it for: the broker
//! terminates the client's TLS with a certificate its session's own
//! certificate authority issues for the host the client asked for (the
//! sandbox trusts that authority, and nothing else outside it does), puts
//! the secrets into the request's head, and sends the request on over a
//! TLS connection of its own to the real server, whose certificate it
//! verifies against the system's roots (or `--network-ca-file`). Every
//! other host keeps its end-to-end TLS through `CONNECT`.
//!
//! One request goes per intercepted connection: the broker asks for
//! `Connection: close`, so a client's next request opens a new
//! connection and has its head rewritten too. Only HTTP/1.1 is offered
//! (ALPN) on either side.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair, KeyUsagePurpose,
    SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Where Debian keeps the system's roots.
pub const SYSTEM_ROOTS: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Most hosts' certificates a session keeps made (a wildcard rule can
/// name any number of hosts: past this, the cache starts again).
pub const MAX_LEAVES: usize = 256;

/// Why interception cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum InterceptError {
    #[error("certificate authority: {0}")]
    Ca(String),
    #[error("roots {path}: {why}")]
    Roots { path: String, why: String },
    #[error("certificate for {host}: {why}")]
    Leaf { host: String, why: String },
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The subject of a session's authority.
fn ca_params(label: &str) -> Result<CertificateParams, InterceptError> {
    let mut p = CertificateParams::new(Vec::<String>::new())
        .map_err(|e| InterceptError::Ca(e.to_string()))?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Allox OS");
    dn.push(DnType::CommonName, format!("Allox session CA {label}"));
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(p)
}

/// A new authority for `label` (`agent/session`): its certificate and
/// its key, in PEM. The key is the caller's to keep sealed.
pub fn new_ca(label: &str) -> Result<(String, zeroize::Zeroizing<String>), InterceptError> {
    let key = KeyPair::generate().map_err(|e| InterceptError::Ca(e.to_string()))?;
    let cert = ca_params(label)?
        .self_signed(&key)
        .map_err(|e| InterceptError::Ca(e.to_string()))?;
    Ok((cert.pem(), zeroize::Zeroizing::new(key.serialize_pem())))
}

/// The system's roots (or `file`), for verifying the servers the broker
/// connects to on an intercepted connection's behalf.
pub fn upstream_config(file: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, InterceptError> {
    use rustls::pki_types::pem::PemObject;
    let path = file.unwrap_or(Path::new(SYSTEM_ROOTS));
    let mut roots = rustls::RootCertStore::empty();
    match CertificateDer::pem_file_iter(path) {
        Ok(certs) => {
            let certs: Vec<_> = certs.filter_map(Result::ok).collect();
            roots.add_parsable_certificates(certs);
        }
        // No system roots (a guest without them): every server is then
        // refused as of an unknown issuer, which says so.
        Err(_) if file.is_none() => {}
        Err(e) => {
            return Err(InterceptError::Roots {
                path: path.display().to_string(),
                why: e.to_string(),
            })
        }
    }
    if file.is_some() && roots.is_empty() {
        return Err(InterceptError::Roots {
            path: path.display().to_string(),
            why: "no certificate in it".into(),
        });
    }
    let mut c = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| InterceptError::Roots {
            path: path.display().to_string(),
            why: e.to_string(),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(c))
}

/// A session's authority, loaded, with the certificates it has made.
pub struct SessionCa {
    issuer: rcgen::Certificate,
    key: KeyPair,
    leaves: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
}

impl SessionCa {
    /// From what [`new_ca`] made for the same `label`.
    pub fn load(label: &str, key_pem: &str) -> Result<SessionCa, InterceptError> {
        let key = KeyPair::from_pem(key_pem).map_err(|e| InterceptError::Ca(e.to_string()))?;
        // The issuer's name and key are what a certificate it signs
        // carries: the same subject made again with the same key.
        let issuer = ca_params(label)?
            .self_signed(&key)
            .map_err(|e| InterceptError::Ca(e.to_string()))?;
        Ok(SessionCa {
            issuer,
            key,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The server side of an intercepted connection to `host` (as the
    /// client asked for it: a name or an address).
    pub fn server_config(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, InterceptError> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = leaves.get(host) {
            return Ok(c.clone());
        }
        let leaf_err = |why: String| InterceptError::Leaf {
            host: host.to_string(),
            why,
        };
        let key = KeyPair::generate().map_err(|e| leaf_err(e.to_string()))?;
        let mut p =
            CertificateParams::new(Vec::<String>::new()).map_err(|e| leaf_err(e.to_string()))?;
        p.subject_alt_names = vec![match host.parse::<std::net::IpAddr>() {
            Ok(a) => SanType::IpAddress(a),
            Err(_) => SanType::DnsName(
                host.to_string()
                    .try_into()
                    .map_err(|e: rcgen::Error| leaf_err(e.to_string()))?,
            ),
        }];
        p.distinguished_name.push(DnType::CommonName, host);
        p.use_authority_key_identifier_extension = true;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let cert = p
            .signed_by(&key, &self.issuer, &self.key)
            .map_err(|e| leaf_err(e.to_string()))?;
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut c = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| leaf_err(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], der)
            .map_err(|e| leaf_err(e.to_string()))?;
        c.alpn_protocols = vec![b"http/1.1".to_vec()];
        let c = Arc::new(c);
        if leaves.len() >= MAX_LEAVES {
            leaves.clear();
        }
        leaves.insert(host.to_string(), c.clone());
        Ok(c)
    }

    /// How many hosts' certificates are kept.
    pub fn leaves(&self) -> usize {
        self.leaves.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// The name the upstream's certificate must carry.
pub fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(host.to_string()).map_err(|e| format!("{host}: {e}"))
}

#[cfg(test)]
mod tests;
