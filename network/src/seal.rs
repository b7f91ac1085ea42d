//! Secrets at rest: sealed (ChaCha20-Poly1305) under a key kept outside
//! the store (`--secrets-key-file`), so the store's disk never holds a
//! secret's value or a session CA's key in the clear. Each sealed blob is
//! bound to what it is (`agent/session/NAME`): one cannot be moved to
//! stand for another.

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// Why the key or a sealed blob cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("secrets key {path}: {source}")]
    Key {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("secrets key {path}: {why}")]
    BadKey { path: PathBuf, why: String },
    #[error("sealed {what}: cannot be opened with the secrets key (another key, or damaged)")]
    Open { what: String },
}

/// The key, read (or made) once.
pub struct Sealer {
    key: LessSafeKey,
}

const KEY_LEN: usize = 32;

impl Sealer {
    /// The key in `path`: 32 bytes, the file 0600 and owned by this user.
    /// Made (with its directory, 0700) when there is none.
    pub fn open_or_create(path: &Path) -> Result<Sealer, SealError> {
        let key_err = |source| SealError::Key {
            path: path.to_path_buf(),
            source,
        };
        let bad = |why: String| SealError::BadKey {
            path: path.to_path_buf(),
            why,
        };
        let bytes = match std::fs::read(path) {
            Ok(b) => Zeroizing::new(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(dir) = path.parent() {
                    std::fs::DirBuilder::new()
                        .recursive(true)
                        .mode(0o700)
                        .create(dir)
                        .map_err(key_err)?;
                }
                let mut k = Zeroizing::new(vec![0u8; KEY_LEN]);
                getrandom::fill(&mut k).map_err(|e| key_err(std::io::Error::other(e)))?;
                let tmp = path.with_extension("new");
                let _ = std::fs::remove_file(&tmp);
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&tmp)
                    .map_err(key_err)?;
                f.write_all(&k)
                    .and_then(|()| f.sync_all())
                    .map_err(key_err)?;
                // Another daemon may have made one meanwhile: theirs stays.
                match std::fs::hard_link(&tmp, path) {
                    Ok(()) => {
                        let _ = std::fs::remove_file(&tmp);
                        k
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        let _ = std::fs::remove_file(&tmp);
                        Zeroizing::new(std::fs::read(path).map_err(key_err)?)
                    }
                    Err(e) => {
                        let _ = std::fs::remove_file(&tmp);
                        return Err(key_err(e));
                    }
                }
            }
            Err(e) => return Err(key_err(e)),
        };
        if bytes.len() != KEY_LEN {
            return Err(bad(format!(
                "{} bytes; a secrets key is {KEY_LEN} random bytes",
                bytes.len()
            )));
        }
        let meta = std::fs::metadata(path).map_err(key_err)?;
        use std::os::unix::fs::MetadataExt;
        if meta.mode() & 0o077 != 0 {
            return Err(bad(format!(
                "mode {:o}: others may read it; it must be 0600",
                meta.mode() & 0o777
            )));
        }
        if meta.uid() != rustix::process::geteuid().as_raw() {
            return Err(bad(format!(
                "owned by uid {}, not by this daemon's user",
                meta.uid()
            )));
        }
        let key = UnboundKey::new(&CHACHA20_POLY1305, &bytes)
            .map_err(|_| bad("not a ChaCha20-Poly1305 key".into()))?;
        Ok(Sealer {
            key: LessSafeKey::new(key),
        })
    }

    /// `plain` sealed for `what`: a random nonce, then the ciphertext and
    /// its tag.
    pub fn seal(&self, what: &str, plain: &[u8]) -> Vec<u8> {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).expect("the kernel's random numbers");
        let mut buf = plain.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(what.as_bytes()),
                &mut buf,
            )
            .expect("a buffer under 256 GiB");
        let mut out = nonce.to_vec();
        out.extend_from_slice(&buf);
        zeroize::Zeroize::zeroize(&mut buf);
        out
    }

    /// What [`Sealer::seal`] sealed for `what`.
    pub fn open(&self, what: &str, sealed: &[u8]) -> Result<Zeroizing<Vec<u8>>, SealError> {
        let refused = || SealError::Open {
            what: what.to_string(),
        };
        if sealed.len() < NONCE_LEN {
            return Err(refused());
        }
        let (nonce, ct) = sealed.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| refused())?;
        let mut buf = Zeroizing::new(ct.to_vec());
        let n = self
            .key
            .open_in_place(nonce, Aad::from(what.as_bytes()), &mut buf)
            .map_err(|_| refused())?
            .len();
        buf.truncate(n);
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_opens_only_for_what_it_was_sealed_for_and_with_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys/secrets.key");
        let s = Sealer::open_or_create(&path).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let sealed = s.seal("a/s/K", b"the value");
        assert!(!sealed.windows(9).any(|w| w == b"the value"));
        assert_eq!(&s.open("a/s/K", &sealed).unwrap()[..], b"the value");
        assert!(s.open("a/s/OTHER", &sealed).is_err(), "bound to its name");
        // The same key from the file; a new key cannot open it.
        let again = Sealer::open_or_create(&path).unwrap();
        assert_eq!(&again.open("a/s/K", &sealed).unwrap()[..], b"the value");
        let other = Sealer::open_or_create(&dir.path().join("other.key")).unwrap();
        let e = other.open("a/s/K", &sealed).unwrap_err().to_string();
        assert!(e.contains("a/s/K"), "{e}");
        // A key others can read is refused, naming the mode.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Sealer::open_or_create(&path).err().unwrap().to_string();
        assert!(e.contains("0600"), "{e}");
        std::fs::write(dir.path().join("short.key"), b"abc").unwrap();
        std::fs::set_permissions(
            dir.path().join("short.key"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        let e = Sealer::open_or_create(&dir.path().join("short.key"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("3 bytes"), "{e}");
    }
}
