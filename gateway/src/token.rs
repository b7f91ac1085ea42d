//! The gateway's bearer token and the file that holds it.
//!
//! The first gateway (or `alloxctl token`) to find no file makes one: 32
//! random bytes from the kernel (`getrandom`), written as 64 hex digits to a
//! temporary file created with `O_EXCL` and mode 0600 (never wider, not even
//! for a moment), made durable, then hard-linked to its name, which fails if
//! the name exists; so two starting at once agree on one token and nobody
//! ever reads a half-written file. An existing file is read and never
//! rewritten; one that is a symbolic link, not owned by the user reading it,
//! or open to its group or others is refused with the fix in the message.
//!
//! Tokens are compared in constant time ([`Token::matches`]).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The token file's name beside the control socket, where it is looked for
/// unless `--token-file` says otherwise.
pub const DEFAULT_FILE_NAME: &str = "gateway.token";
/// Random bytes in a new token.
pub const TOKEN_BYTES: usize = 32;
/// Shortest token accepted from an existing file.
pub const MIN_TOKEN_LEN: usize = 32;
/// Largest token file read.
const MAX_FILE_LEN: u64 = 4096;

#[derive(Debug, Error)]
pub enum TokenError {
    #[error("cannot read token file {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot create token file {}", path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot get random bytes for a new token: {0}")]
    Random(String),
    #[error("token file {} is a symbolic link; give the real path with --token-file", path.display())]
    Symlink { path: PathBuf },
    #[error("token file {} is not a regular file", path.display())]
    NotAFile { path: PathBuf },
    #[error("token file {} is open to its group or others (mode {mode:04o}); run `chmod 600 {}`, or remove it to get a new token", path.display(), path.display())]
    Permissions { path: PathBuf, mode: u32 },
    #[error("token file {} belongs to uid {owner}, not to this user (uid {me}); use your own file", path.display())]
    Owner { path: PathBuf, owner: u32, me: u32 },
    #[error("token file {} holds no usable token: {why}; remove it to get a new one", path.display())]
    Invalid { path: PathBuf, why: &'static str },
    #[error("--token-env {name}: the environment variable is not set")]
    EnvMissing { name: String },
    #[error("--token-env {name}: the environment variable holds no usable token: {why}")]
    EnvInvalid { name: String, why: &'static str },
}

/// A bearer token.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

/// Whether `a` and `b` are the same bytes, in time that depends only on
/// their lengths.
pub fn same(a: impl AsRef<[u8]>, b: impl AsRef<[u8]>) -> bool {
    let (a, b) = (a.as_ref(), b.as_ref());
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

impl Token {
    /// A new random token: [`TOKEN_BYTES`] bytes as lowercase hex.
    pub fn generate() -> Result<Token, TokenError> {
        let mut bytes = [0u8; TOKEN_BYTES];
        getrandom::fill(&mut bytes).map_err(|e| TokenError::Random(e.to_string()))?;
        Ok(Token(hex(&bytes)))
    }

    /// The token as sent in `Authorization: Bearer <token>`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `given` is this token, in time that depends only on the
    /// lengths (the token's length is no secret: 64 for generated ones).
    pub fn matches(&self, given: &[u8]) -> bool {
        same(self.0.as_bytes(), given)
    }

    /// A token from a file's text: surrounding white space is dropped; the
    /// rest must be at least [`MIN_TOKEN_LEN`] visible ASCII characters, as
    /// an HTTP header carries them.
    fn parse(path: &Path, text: &[u8]) -> Result<Token, TokenError> {
        Token::check(text).map_err(|why| TokenError::Invalid {
            path: path.to_owned(),
            why,
        })
    }

    /// The token in `text`, or why there is none.
    fn check(text: &[u8]) -> Result<Token, &'static str> {
        let text = text.trim_ascii();
        if !text.iter().all(|b| b.is_ascii_graphic()) {
            return Err("it has characters other than visible ASCII in it");
        }
        if text.len() < MIN_TOKEN_LEN {
            return Err("it is shorter than 32 characters");
        }
        Ok(Token(String::from_utf8_lossy(text).into_owned()))
    }
}

/// The token held by the environment variable `name` (a Kubernetes
/// Secret given through `secretKeyRef`, which cannot be a file of the
/// reader's own with mode 0600): the same rules as a file's text.
pub fn from_env(name: &str) -> Result<Token, TokenError> {
    let value = std::env::var_os(name).ok_or_else(|| TokenError::EnvMissing {
        name: name.to_owned(),
    })?;
    Token::check(value.as_encoded_bytes()).map_err(|why| TokenError::EnvInvalid {
        name: name.to_owned(),
        why,
    })
}

/// A token with a known value, for tests.
#[cfg(test)]
pub(crate) fn tests_token(text: &str) -> Token {
    Token(text.to_owned())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The token file used when none is given: beside the control socket. The
/// token grants what the socket grants, so it lives with it, in the same
/// directory and with the same owner (`/run/allox/gateway.token` for the
/// default socket: on a tmpfs, so a new token every boot).
pub fn default_path(socket: &Path) -> PathBuf {
    socket.with_file_name(DEFAULT_FILE_NAME)
}

/// Reads the token at `path`, refusing a file that others could read or
/// change.
pub fn read(path: &Path) -> Result<Token, TokenError> {
    let file = open_private(path)?;
    let mut text = Vec::new();
    file.take(MAX_FILE_LEN + 1)
        .read_to_end(&mut text)
        .map_err(|source| TokenError::Read {
            path: path.to_owned(),
            source,
        })?;
    if text.len() as u64 > MAX_FILE_LEN {
        return Err(TokenError::Invalid {
            path: path.to_owned(),
            why: "it is larger than 4096 bytes",
        });
    }
    Token::parse(path, &text)
}

/// Reads the token at `path`, or makes a new one there if there is no
/// file; says whether it made it.
pub fn load_or_create(path: &Path) -> Result<(Token, bool), TokenError> {
    match read(path) {
        Err(TokenError::Read { source, .. }) if source.kind() == io::ErrorKind::NotFound => {}
        other => return other.map(|t| (t, false)),
    }
    let token = Token::generate()?;
    if create(path, &token)? {
        Ok((token, true))
    } else {
        // Another gateway made it first: use that one.
        read(path).map(|t| (t, false))
    }
}

/// Opens `path` for reading if it is a regular file of this user's, with
/// no permission for group or others, and not a symbolic link.
fn open_private(path: &Path) -> Result<File, TokenError> {
    let read_err = |source| TokenError::Read {
        path: path.to_owned(),
        source,
    };
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) {
                TokenError::Symlink {
                    path: path.to_owned(),
                }
            } else {
                read_err(e)
            }
        })?;
    let meta = file.metadata().map_err(read_err)?;
    if !meta.is_file() {
        return Err(TokenError::NotAFile {
            path: path.to_owned(),
        });
    }
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        return Err(TokenError::Owner {
            path: path.to_owned(),
            owner: meta.uid(),
            me,
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(TokenError::Permissions {
            path: path.to_owned(),
            mode,
        });
    }
    Ok(file)
}

/// Writes `token` to `path` unless a file is there already (then returns
/// false and leaves it alone).
fn create(path: &Path, token: &Token) -> Result<bool, TokenError> {
    let create_err = |source| TokenError::Create {
        path: path.to_owned(),
        source,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).map_err(create_err)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = loop {
        let mut salt = [0u8; 8];
        getrandom::fill(&mut salt).map_err(|e| TokenError::Random(e.to_string()))?;
        let tmp = dir.join(format!(
            ".{}.{}.tmp",
            name.as_deref().unwrap_or(DEFAULT_FILE_NAME),
            hex(&salt)
        ));
        // O_EXCL with mode 0600: the file never exists with wider bits.
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&tmp)
        {
            Ok(mut f) => {
                let written = f
                    .write_all(format!("{}\n", token.as_str()).as_bytes())
                    .and_then(|()| f.sync_all());
                if let Err(e) = written {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(create_err(e));
                }
                break tmp;
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(create_err(e)),
        }
    };
    // link(2) never replaces: the first writer's token wins.
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            if let Ok(d) = File::open(&dir) {
                let _ = d.sync_all();
            }
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(create_err(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn a_new_token_file_is_0600_and_read_back_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("gateway.token");
        let (token, created) = load_or_create(&path).unwrap();
        assert!(created);
        assert_eq!(token.as_str().len(), 2 * TOKEN_BYTES);
        assert!(token.as_str().bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(mode(&path), 0o600);
        let before = std::fs::metadata(&path).unwrap().modified().unwrap();
        let (again, created) = load_or_create(&path).unwrap();
        assert!(!created);
        assert_eq!(again, token);
        assert_eq!(
            std::fs::metadata(&path).unwrap().modified().unwrap(),
            before
        );
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["gateway.token"]);
    }

    #[test]
    fn tokens_are_random() {
        assert_ne!(Token::generate().unwrap(), Token::generate().unwrap());
    }

    #[test]
    fn a_file_open_to_group_or_others_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        std::fs::write(&path, "x".repeat(64)).unwrap();
        for bits in [0o640, 0o604, 0o620, 0o660] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(bits)).unwrap();
            let err = load_or_create(&path).unwrap_err();
            assert!(matches!(err, TokenError::Permissions { .. }), "{err:?}");
            let text = err.to_string();
            assert!(text.contains("chmod 600"), "{text}");
        }
        // Never rewritten, even when refused.
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "x".repeat(64));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert_eq!(read(&path).unwrap().as_str(), "x".repeat(64));
    }

    #[test]
    fn symlinks_and_weak_tokens_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::write(&real, "y".repeat(40)).unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(matches!(
            read(&link).unwrap_err(),
            TokenError::Symlink { .. }
        ));
        // A dangling link is not replaced by a new file either.
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        assert!(load_or_create(&dangling).is_err());
        assert!(!dir.path().join("nowhere").exists());

        for text in ["short\n", "", "has a space in it but is long enough.."] {
            std::fs::write(&real, text).unwrap();
            let err = read(&real).unwrap_err();
            assert!(
                matches!(err, TokenError::Invalid { .. }),
                "{text:?}: {err:?}"
            );
        }
        std::fs::write(&real, format!("  {}\n\n", "z".repeat(32))).unwrap();
        assert_eq!(read(&real).unwrap().as_str(), "z".repeat(32));
    }

    #[test]
    fn a_token_from_the_environment_follows_the_files_rules() {
        // Names of this test's own: other tests run in other threads.
        std::env::set_var("ALLOX_TEST_TOKEN_GOOD", format!("  {}\n", "a1".repeat(32)));
        std::env::set_var("ALLOX_TEST_TOKEN_SHORT", "abc");
        let t = from_env("ALLOX_TEST_TOKEN_GOOD").unwrap();
        assert_eq!(t.as_str(), "a1".repeat(32));
        assert_eq!(
            from_env("ALLOX_TEST_TOKEN_SHORT").unwrap_err().to_string(),
            "--token-env ALLOX_TEST_TOKEN_SHORT: the environment variable holds no usable token: it is shorter than 32 characters"
        );
        assert_eq!(
            from_env("ALLOX_TEST_TOKEN_UNSET").unwrap_err().to_string(),
            "--token-env ALLOX_TEST_TOKEN_UNSET: the environment variable is not set"
        );
    }

    #[test]
    fn matching_is_exact() {
        let t = Token("a".repeat(64));
        assert!(t.matches("a".repeat(64).as_bytes()));
        assert!(!t.matches("a".repeat(63).as_bytes()));
        assert!(!t.matches("a".repeat(65).as_bytes()));
        assert!(!t.matches(format!("{}b", "a".repeat(63)).as_bytes()));
        assert!(!t.matches(b""));
    }

    #[test]
    fn default_path_is_beside_the_socket() {
        assert_eq!(
            default_path(Path::new("/run/allox/ctl.sock")),
            Path::new("/run/allox/gateway.token")
        );
    }
}
