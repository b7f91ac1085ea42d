use super::*;
use rustls::pki_types::pem::PemObject;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn client_trusting(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("ca.pem");
    std::fs::write(&f, ca_pem).unwrap();
    upstream_config(Some(&f)).unwrap()
}

/// A TLS handshake and one line each way between `server` and a client
/// with `client` asking for `host`.
async fn handshake(
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
    host: &str,
) -> Result<(), String> {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let acceptor = tokio_rustls::TlsAcceptor::from(server);
    let srv = tokio::spawn(async move {
        let mut s = acceptor.accept(a).await.map_err(|e| e.to_string())?;
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
        s.write_all(b"pong!").await.map_err(|e| e.to_string())?;
        s.flush().await.map_err(|e| e.to_string())?;
        Ok::<_, String>(buf)
    });
    let connector = tokio_rustls::TlsConnector::from(client);
    let mut c = connector
        .connect(server_name(host)?, b)
        .await
        .map_err(|e| e.to_string())?;
    c.write_all(b"ping!").await.map_err(|e| e.to_string())?;
    let mut buf = [0u8; 5];
    c.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
    assert_eq!(&buf, b"pong!");
    assert_eq!(&srv.await.unwrap()?, b"ping!");
    Ok(())
}

#[tokio::test]
async fn a_session_s_authority_issues_certificates_its_clients_trust_for_the_host_asked() {
    let (cert, key) = new_ca("a/s").unwrap();
    assert!(cert.contains("BEGIN CERTIFICATE"));
    assert!(
        !cert.contains("PRIVATE KEY"),
        "the certificate carries no key"
    );
    let ca = SessionCa::load("a/s", &key).unwrap();
    let trusting = client_trusting(&cert);
    handshake(
        ca.server_config("api.test").unwrap(),
        trusting.clone(),
        "api.test",
    )
    .await
    .unwrap();
    // An address as asked.
    handshake(
        ca.server_config("127.0.0.1").unwrap(),
        trusting.clone(),
        "127.0.0.1",
    )
    .await
    .unwrap();
    // Another host's certificate does not pass for this one.
    let e = handshake(ca.server_config("echo.test").unwrap(), trusting, "api.test")
        .await
        .unwrap_err();
    assert!(e.contains("NotValidForName") || e.contains("name"), "{e}");
    // Loaded again (a restart), it issues certificates the same clients
    // trust.
    let again = SessionCa::load("a/s", &key).unwrap();
    handshake(
        again.server_config("api.test").unwrap(),
        client_trusting(&cert),
        "api.test",
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn another_session_s_authority_is_not_trusted() {
    let (cert_a, _) = new_ca("a/s1").unwrap();
    let (_, key_b) = new_ca("a/s2").unwrap();
    let b = SessionCa::load("a/s2", &key_b).unwrap();
    let e = handshake(
        b.server_config("api.test").unwrap(),
        client_trusting(&cert_a),
        "api.test",
    )
    .await
    .unwrap_err();
    assert!(
        e.contains("UnknownIssuer") || e.contains("BadSignature"),
        "{e}"
    );
}

#[test]
fn the_certificates_kept_are_bounded() {
    let (_, key) = new_ca("a/s").unwrap();
    let ca = SessionCa::load("a/s", &key).unwrap();
    for i in 0..MAX_LEAVES + 10 {
        ca.server_config(&format!("h{i}.api.test")).unwrap();
        assert!(ca.leaves() <= MAX_LEAVES);
    }
    // Made once per host while kept.
    let x = ca.server_config("h300.api.test").unwrap();
    assert!(Arc::ptr_eq(&x, &ca.server_config("h300.api.test").unwrap()));
}

#[test]
fn a_roots_file_that_is_not_one_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("empty.pem");
    std::fs::write(&f, "not a certificate\n").unwrap();
    let e = upstream_config(Some(&f)).err().unwrap().to_string();
    assert!(
        e.contains("empty.pem") && e.contains("no certificate"),
        "{e}"
    );
    let e = upstream_config(Some(&dir.path().join("missing.pem")))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("missing.pem"), "{e}");
    // A key file is not a root.
    let (_, key) = new_ca("a/s").unwrap();
    assert!(CertificateDer::pem_slice_iter(key.as_bytes())
        .next()
        .is_none());
}
