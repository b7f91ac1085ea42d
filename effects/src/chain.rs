//! The evidence chain of one observed run: records in canonical JSON (RFC
//! 8785) `{"body_sha256", "kind", "prev", "seq"}`, one per line of
//! `chain.jsonl`, and their bodies (canonical JSON too), one per line of
//! `bodies.jsonl`: line `seq` of each file is record `seq` and its body
//! (canonical JSON has no raw newline). `prev` is the sha256 of the
//! previous record's bytes (64 zeros for the first); the chain's root is
//! the sha256 of its last record. Two files, whatever the number of
//! records, so that making a record durable costs two syncs.
//!
//! The observer is the only writer. Every record is durable (its body and
//! its line written and synced, the directory synced once its files are
//! new) before [`Chain::append`] returns, so a root that was answered is on
//! disk. [`Chain::append_later`] writes a record whose durability comes
//! with the next `append`: one sync of each file for several records
//! written together. [`Chain::sync_behind`]
//! starts that sync on a thread (the next sync waits for it), and
//! [`Chain::write_beside`] writes a file beside the chain (one a record
//! holds the hash of) that is synced with the records.
//!
//! [`verify`] reads a chain back and checks everything it can without
//! trusting the writer: canonical form, sequence, links, body hashes, that
//! it begins with `begin` and ends with `close` or `fault`.

use serde::Serialize;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The `prev` of the first record.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The chain's file of records.
pub const RECORDS: &str = "chain.jsonl";
/// The chain's file of bodies, a line each.
pub const BODIES: &str = "bodies.jsonl";
/// The directory of bodies, a file each, of sets written before
/// [`BODIES`] (`bodies/<seq>-<kind>.json`): still read.
pub const BODIES_DIR: &str = "bodies";

#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    #[error("{op} {}", .path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("encode the {kind} record as canonical JSON: {why}")]
    Encode { kind: String, why: String },
    #[error("the evidence chain in {} already has records", .0.display())]
    Exists(PathBuf),
    #[error("the evidence chain is closed: no {0} record may follow")]
    Closed(String),
    #[error("the evidence chain is broken by an earlier failed write: no {0} record may follow")]
    Broken(String),
}

/// One record, as it is hashed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Record {
    pub seq: u64,
    pub prev: String,
    pub kind: String,
    pub body_sha256: String,
}

/// The canonical JSON (RFC 8785) of `v`.
///
/// Most of what the chain holds is plain: object keys in ASCII, whole
/// numbers a double holds exactly, no fractions. For such a value the
/// compact JSON of its `serde_json::Value` is already the canonical form
/// (the value's objects are ordered by key, which for ASCII is RFC 8785's
/// order; strings are escaped as RFC 8785 escapes them), and is written
/// twenty times faster than the canonicalizer's; anything else goes
/// through the canonicalizer. A value whose compact JSON, written
/// straight from it, is [surely canonical](surely_canonical) (its maps'
/// and structs' keys come out ascending) is not built as a
/// `serde_json::Value` at all: that compact JSON is what the value's
/// `Value` would be written as.
pub fn canonical<T: Serialize>(v: &T) -> Result<Vec<u8>, String> {
    if let Ok(bytes) = serde_json::to_vec(v) {
        if surely_canonical(&bytes) {
            return Ok(bytes);
        }
    }
    canonical_value(&serde_json::to_value(v).map_err(|e| e.to_string())?)
}

/// [`canonical`] of a value already parsed (a body read back).
pub fn canonical_value(value: &serde_json::Value) -> Result<Vec<u8>, String> {
    if plain(value) {
        serde_json::to_vec(value).map_err(|e| e.to_string())
    } else {
        serde_json_canonicalizer::to_vec(value).map_err(|e| e.to_string())
    }
}

/// Whether `v`'s compact JSON is its canonical JSON: every object's keys
/// ASCII and strictly ascending as they come (RFC 8785 orders keys by
/// UTF-16 code units, which for ASCII is their bytes' order), every
/// number a whole one of at most 2^53 either way (RFC 8785 writes numbers
/// as ECMAScript does a double's; for these that is their digits).
/// Strings need nothing: serde_json escapes `"`, `\` and the controls
/// below U+0020 as RFC 8785 does (`\b \t \n \f \r`, else `\u00xx`
/// in lower case), and nothing else.
fn plain(v: &serde_json::Value) -> bool {
    use serde_json::Value;
    const EXACT: u64 = 1 << 53;
    match v {
        Value::Null | Value::Bool(_) | Value::String(_) => true,
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => u <= EXACT,
            (None, Some(i)) => i.unsigned_abs() <= EXACT,
            _ => false,
        },
        Value::Array(a) => a.iter().all(plain),
        Value::Object(m) => {
            let mut prev: Option<&str> = None;
            m.iter().all(|(k, v)| {
                let ordered = k.is_ascii() && prev.is_none_or(|p| p.as_bytes() < k.as_bytes());
                prev = Some(k);
                ordered && plain(v)
            })
        }
    }
}

/// Whether `bytes` is certainly the canonical JSON of the value it holds,
/// told without building the value: compact, every object's keys
/// printable ASCII with no escape and strictly ascending, every number a
/// whole one of at most 2^53 either way written as its digits, every
/// string valid UTF-8 escaped as [`canonical`] escapes it (`\"`, `\\`,
/// `\b \t \n \f \r`, else `\u00xx` below U+0020, nothing else). Such
/// bytes are the compact JSON of a plain value, which is its canonical
/// JSON. `false` is "not certain": parse it and compare
/// ([`canonical_value`]).
pub fn surely_canonical(bytes: &[u8]) -> bool {
    let mut s = Scan { b: bytes, i: 0 };
    s.value(0) && s.i == bytes.len()
}

/// [`surely_canonical`]'s reader: `i` is the next byte.
struct Scan<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Scan<'a> {
    /// Deeper than this is left to the parser (serde_json's own limit
    /// is 128).
    const DEPTH: usize = 64;

    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn value(&mut self, depth: usize) -> bool {
        if depth > Self::DEPTH {
            return false;
        }
        match self.peek() {
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'"') => self.string(),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b't') => self.word(b"true"),
            Some(b'f') => self.word(b"false"),
            Some(b'n') => self.word(b"null"),
            _ => false,
        }
    }

    fn word(&mut self, w: &[u8]) -> bool {
        let found = self.b[self.i..].starts_with(w);
        if found {
            self.i += w.len();
        }
        found
    }

    fn object(&mut self, depth: usize) -> bool {
        self.i += 1;
        if self.peek() == Some(b'}') {
            self.i += 1;
            return true;
        }
        let mut prev: Option<&[u8]> = None;
        loop {
            let Some(key) = self.key() else {
                return false;
            };
            if prev.is_some_and(|p| p >= key) || self.peek() != Some(b':') {
                return false;
            }
            prev = Some(key);
            self.i += 1;
            if !self.value(depth + 1) {
                return false;
            }
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return true;
                }
                _ => return false,
            }
        }
    }

    /// A key of printable ASCII and no escape, whose bytes are its text.
    fn key(&mut self) -> Option<&'a [u8]> {
        if self.peek() != Some(b'"') {
            return None;
        }
        let start = self.i + 1;
        let len = self.b.get(start..)?.iter().position(|&c| c == b'"')?;
        let key = &self.b[start..start + len];
        if !key.iter().all(|&c| (0x20..0x7f).contains(&c) && c != b'\\') {
            return None;
        }
        self.i = start + len + 1;
        Some(key)
    }

    fn array(&mut self, depth: usize) -> bool {
        self.i += 1;
        if self.peek() == Some(b']') {
            self.i += 1;
            return true;
        }
        loop {
            if !self.value(depth + 1) {
                return false;
            }
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b']') => {
                    self.i += 1;
                    return true;
                }
                _ => return false,
            }
        }
    }

    fn string(&mut self) -> bool {
        self.i += 1;
        let start = self.i;
        let mut ascii = true;
        loop {
            let Some(c) = self.peek() else {
                return false;
            };
            match c {
                b'"' => break,
                b'\\' => {
                    let Some(e) = self.b.get(self.i + 1) else {
                        return false;
                    };
                    match e {
                        b'"' | b'\\' | b'b' | b'f' | b'n' | b'r' | b't' => self.i += 2,
                        b'u' => {
                            // Only a control character without a short
                            // escape, as `\u00xx` in lower case.
                            let Some(&[b'0', b'0', h, l]) = self.b.get(self.i + 2..self.i + 6)
                            else {
                                return false;
                            };
                            let hex = |d: u8| match d {
                                b'0'..=b'9' => Some(d - b'0'),
                                b'a'..=b'f' => Some(d - b'a' + 10),
                                _ => None,
                            };
                            let (Some(h), Some(l)) = (hex(h), hex(l)) else {
                                return false;
                            };
                            let v = h * 16 + l;
                            if v >= 0x20 || matches!(v, 0x08 | 0x09 | 0x0a | 0x0c | 0x0d) {
                                return false;
                            }
                            self.i += 6;
                        }
                        _ => return false,
                    }
                }
                0x00..=0x1f => return false,
                0x80..=0xff => {
                    ascii = false;
                    self.i += 1;
                }
                _ => self.i += 1,
            }
        }
        let whole = ascii || std::str::from_utf8(&self.b[start..self.i]).is_ok();
        self.i += 1;
        whole
    }

    fn number(&mut self) -> bool {
        let negative = self.peek() == Some(b'-');
        if negative {
            self.i += 1;
        }
        let start = self.i;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.i += 1;
        }
        let digits = &self.b[start..self.i];
        // 2^53 has 16 digits; `0` alone, never `-0` or a leading zero;
        // no fraction or exponent.
        if digits.is_empty()
            || digits.len() > 16
            || (digits[0] == b'0' && (digits.len() > 1 || negative))
            || matches!(self.peek(), Some(b'.' | b'e' | b'E'))
        {
            return false;
        }
        let v = digits
            .iter()
            .fold(0u64, |v, d| v * 10 + u64::from(d - b'0'));
        v <= 1 << 53
    }
}

/// A value's canonical JSON, as [`Canonical::of`] encoded it: the only
/// way to hand [`Chain::append_canonical_later`] bytes, so a body in the
/// chain is always canonical.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Canonical(Vec<u8>);

impl Canonical {
    pub fn of<T: Serialize>(v: &T) -> Result<Canonical, String> {
        canonical(v).map(Canonical)
    }

    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// `b` in lower-case hex.
pub fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

fn io(op: &'static str, path: &Path, source: std::io::Error) -> ChainError {
    ChainError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// The writer of a run's chain.
#[derive(Debug)]
pub struct Chain {
    dir: PathBuf,
    records: std::fs::File,
    bodies: std::fs::File,
    next: u64,
    head: String,
    closed: bool,
    /// A body or record only partly written: the files no longer pair
    /// line by line, and nothing more may be appended.
    broken: bool,
    /// Files written beside the chain, not synced yet.
    unsynced: Vec<(PathBuf, std::fs::File)>,
    /// Whether the directory itself is to be synced (its first record, a
    /// file made beside the chain).
    dir_unsynced: bool,
    /// Files made (empty) with the chain, whose names are durable with its
    /// first sync: writing one later needs no sync of the directory.
    made: Vec<String>,
    /// A sync started by [`Chain::sync_behind`], to be waited for.
    behind: Option<std::thread::JoinHandle<Result<(), ChainError>>>,
}

impl Chain {
    /// Starts a chain in `dir` (made if missing, 0700); refused if it has
    /// records already.
    pub fn create(dir: &Path) -> Result<Chain, ChainError> {
        Chain::create_with(dir, &[])
    }

    /// [`create`](Chain::create), and makes the files `beside` empty at
    /// once, to be written by [`write_beside`](Chain::write_beside) later
    /// (an empty one was never written).
    pub fn create_with(dir: &Path, beside: &[&str]) -> Result<Chain, ChainError> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| io("create", dir, e))?;
        let open = |name: &str| {
            let path = dir.join(name);
            std::fs::OpenOptions::new()
                .create_new(true)
                .append(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::AlreadyExists => ChainError::Exists(dir.to_path_buf()),
                    _ => io("create", &path, e),
                })
        };
        let records = open(RECORDS)?;
        let bodies = open(BODIES)?;
        for name in beside {
            open(name)?;
        }
        Ok(Chain {
            dir: dir.to_path_buf(),
            records,
            bodies,
            next: 0,
            head: GENESIS.to_string(),
            closed: false,
            broken: false,
            unsynced: Vec::new(),
            dir_unsynced: true,
            made: beside.iter().map(|n| n.to_string()).collect(),
            behind: None,
        })
    }

    /// The hash of the last record (the root once closed); [`GENESIS`]
    /// before any.
    pub fn head(&self) -> &str {
        &self.head
    }

    /// Records written so far.
    pub fn len(&self) -> u64 {
        self.next
    }

    pub fn is_empty(&self) -> bool {
        self.next == 0
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Appends a record of `kind` with `body`, durably (with every record
    /// written before it); returns its hash (the new head). `close` and
    /// `fault` end the chain.
    pub fn append<T: Serialize>(&mut self, kind: &str, body: &T) -> Result<String, ChainError> {
        let hash = self.append_later(kind, body)?;
        self.sync()?;
        Ok(hash)
    }

    /// Appends a record as [`append`](Chain::append) does, but leaves it
    /// to the next `append` to make it durable.
    pub fn append_later<T: Serialize>(
        &mut self,
        kind: &str,
        body: &T,
    ) -> Result<String, ChainError> {
        if self.closed {
            return Err(ChainError::Closed(kind.to_string()));
        }
        let body = canonical(body).map_err(|why| ChainError::Encode {
            kind: kind.to_string(),
            why,
        })?;
        self.append_canonical_later(kind, Canonical(body))
    }

    /// [`append_later`](Chain::append_later) of a body already in
    /// canonical form (encoded once where its hash was needed first).
    pub fn append_canonical_later(
        &mut self,
        kind: &str,
        body: Canonical,
    ) -> Result<String, ChainError> {
        if self.closed {
            return Err(ChainError::Closed(kind.to_string()));
        }
        if self.broken {
            return Err(ChainError::Broken(kind.to_string()));
        }
        let encode = |why: String| ChainError::Encode {
            kind: kind.to_string(),
            why,
        };
        let mut body = body.0;
        if body.contains(&b'\n') {
            return Err(encode("a raw newline in canonical JSON".into()));
        }
        let record = Record {
            seq: self.next,
            prev: self.head.clone(),
            kind: kind.to_string(),
            body_sha256: sha256_hex(&body),
        };
        let mut line = canonical(&record).map_err(encode)?;
        let hash = sha256_hex(&line);
        line.push(b'\n');
        body.push(b'\n');
        // The body first, then its record: a record is never on disk
        // before its body. A write cut short leaves the two files out of
        // step, so the chain takes no more records.
        for (name, f, bytes) in [
            (BODIES, &mut self.bodies, &body),
            (RECORDS, &mut self.records, &line),
        ] {
            if let Err(e) = f.write_all(bytes) {
                self.broken = true;
                return Err(io("write", &self.dir.join(name), e));
            }
        }
        self.next += 1;
        self.head = hash.clone();
        if kind == "close" || kind == "fault" {
            self.closed = true;
        }
        Ok(hash)
    }

    /// Writes `bytes` as the file `name` beside the chain (a file a record
    /// holds the hash of), made durable with the records (the directory
    /// too, unless the file was made with the chain).
    pub fn write_beside(&mut self, name: &str, bytes: &[u8]) -> Result<(), ChainError> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.dir.join(name);
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io("create", &path, e))?;
        f.write_all(bytes).map_err(|e| io("write", &path, e))?;
        self.unsynced.push((path, f));
        if !self.made.iter().any(|m| m == name) {
            self.dir_unsynced = true;
        }
        Ok(())
    }

    /// Makes every record written so far durable: the files beside the
    /// chain, the bodies, the records (and the chain's directory when a
    /// file was made in it).
    pub fn sync(&mut self) -> Result<(), ChainError> {
        self.wait_behind()?;
        self.sync_job()?.run()
    }

    /// Waits for the sync [`Chain::sync_behind`] started, if any.
    fn wait_behind(&mut self) -> Result<(), ChainError> {
        match self.behind.take() {
            None => Ok(()),
            Some(b) => b.join().unwrap_or_else(|_| {
                Err(io(
                    "sync",
                    &self.dir,
                    std::io::Error::other("the sync's thread panicked"),
                ))
            }),
        }
    }

    /// Starts [`sync`](Chain::sync) of what was written so far on a thread
    /// of its own (the run goes on meanwhile); the next `sync` waits for
    /// it, so what it covers is durable before the next `sync` returns.
    pub fn sync_behind(&mut self) -> Result<(), ChainError> {
        // One at a time: the one before is waited for.
        self.wait_behind()?;
        let job = self.sync_job()?;
        self.start_behind(job)
    }

    /// Starts a sync of the files written beside the chain so far, and of
    /// those only, on a thread of its own: they can be made durable while
    /// the records that will hold their hashes are still being made. The
    /// next `sync` waits for it before the bodies and records (so a record
    /// is still never durable before a file it holds the hash of).
    pub fn sync_beside_behind(&mut self) -> Result<(), ChainError> {
        self.wait_behind()?;
        if self.unsynced.is_empty() {
            return Ok(());
        }
        let job = SyncJob {
            files: std::mem::take(&mut self.unsynced),
            dir: None,
        };
        self.start_behind(job)
    }

    fn start_behind(&mut self, job: SyncJob) -> Result<(), ChainError> {
        let t = std::thread::Builder::new()
            .name("chain-sync".into())
            .spawn(move || job.run())
            .map_err(|e| io("sync", &self.dir, e))?;
        self.behind = Some(t);
        Ok(())
    }

    /// What a sync of everything written so far has to do, taken from the
    /// chain (which may write on meanwhile).
    fn sync_job(&mut self) -> Result<SyncJob, ChainError> {
        let mut files = std::mem::take(&mut self.unsynced);
        // The bodies before the records that hold their hashes.
        for (name, f) in [(BODIES, &self.bodies), (RECORDS, &self.records)] {
            let path = self.dir.join(name);
            let f = f.try_clone().map_err(|e| io("sync", &path, e))?;
            files.push((path, f));
        }
        Ok(SyncJob {
            files,
            dir: std::mem::take(&mut self.dir_unsynced).then(|| self.dir.clone()),
        })
    }
}

/// One sync of a chain: its unsynced files beside it, its bodies and
/// records, and the chain's directory when a file was made in it.
struct SyncJob {
    files: Vec<(PathBuf, std::fs::File)>,
    dir: Option<PathBuf>,
}

impl SyncJob {
    fn run(self) -> Result<(), ChainError> {
        for (p, f) in &self.files {
            f.sync_all().map_err(|e| io("sync", p, e))?;
        }
        if let Some(d) = &self.dir {
            sync_dir(d)?;
        }
        Ok(())
    }
}

fn sync_dir(dir: &Path) -> Result<(), ChainError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io("sync", dir, e))
}

/// What [`verify`] found in a sound chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The hash of the last record.
    pub root: String,
    /// The records' kinds, in order.
    pub kinds: Vec<String>,
    /// Whether it ends with `close` (else `fault`, or nothing yet).
    pub closed: bool,
    /// Whether it ends with `fault`.
    pub faulted: bool,
}

/// Why a chain does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("cannot read {0}: {1}")]
    Read(String, String),
    #[error("record {seq}: {why}")]
    Record {
        seq: u64,
        /// The file found bad (relative to the set): the chain's own file,
        /// or the record's body.
        file: String,
        why: String,
    },
    #[error("the chain is empty")]
    Empty,
    #[error("the chain's first record is {0}, not begin")]
    NoBegin(String),
    #[error("the chain's root is {found}, not {expected}")]
    Root { expected: String, found: String },
}

/// Where a set of evidence files is read from: its directory, or the
/// files of an export held in memory ([`crate::export`]). Names are
/// relative to the set (`chain.jsonl`, `bodies.jsonl`).
pub trait Source {
    /// The bytes of file `name`.
    fn read(&self, name: &str) -> std::io::Result<Vec<u8>>;
}

/// A set in its directory.
pub struct Dir<'a>(pub &'a Path);

impl Source for Dir<'_> {
    fn read(&self, name: &str) -> std::io::Result<Vec<u8>> {
        std::fs::read(self.0.join(name))
    }
}

/// The name of body `seq` of kind `kind` in a set written before
/// [`BODIES`].
pub fn old_body_name(seq: u64, kind: &str) -> String {
    format!("{BODIES_DIR}/{seq:06}-{kind}.json")
}

/// The bodies of a set, read once: the lines of `bodies.jsonl` (those
/// ended by a newline; a last line cut short is not one), or, for a set
/// written before it, the files of `bodies/` read one by one.
pub struct BodyReader<'a> {
    src: &'a dyn Source,
    lines: Option<Vec<Vec<u8>>>,
    /// Whether `bodies.jsonl` ends in a line cut short.
    cut: bool,
}

impl<'a> BodyReader<'a> {
    pub fn new(src: &'a dyn Source) -> Result<BodyReader<'a>, VerifyError> {
        let (lines, cut) = match src.read(BODIES) {
            Ok(text) => {
                let mut lines: Vec<Vec<u8>> =
                    text.split(|&b| b == b'\n').map(<[u8]>::to_vec).collect();
                // What follows the last newline: nothing, or a line cut
                // short.
                let cut = lines.pop().is_some_and(|l| !l.is_empty());
                (Some(lines), cut)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (None, false),
            Err(e) => return Err(VerifyError::Read(BODIES.to_string(), e.to_string())),
        };
        Ok(BodyReader { src, lines, cut })
    }

    /// The file that holds body `seq` (relative to the set).
    pub fn file(&self, seq: u64, kind: &str) -> String {
        match self.lines {
            Some(_) => BODIES.to_string(),
            None => old_body_name(seq, kind),
        }
    }

    /// The body of record `seq`, of kind `kind`.
    pub fn get(&self, seq: u64, kind: &str) -> Result<Vec<u8>, String> {
        match &self.lines {
            Some(lines) => lines.get(seq as usize).cloned().ok_or_else(|| {
                format!(
                    "{BODIES} has {} whole lines: no body of record {seq} ({kind})",
                    lines.len()
                )
            }),
            None => {
                let name = old_body_name(seq, kind);
                self.src
                    .read(&name)
                    .map_err(|e| format!("body {name}: {e}"))
            }
        }
    }

    /// Lines of `bodies.jsonl` past `records` bodies, a last line cut
    /// short counted: what an ended chain must not have.
    fn past(&self, records: usize) -> usize {
        self.lines.as_ref().map_or(0, |l| {
            l.len().saturating_sub(records) + usize::from(self.cut)
        })
    }
}

/// Reads the chain in `dir` back and checks it; with `root`, that it ends
/// at that root.
pub fn verify(dir: &Path, root: Option<&str>) -> Result<Verified, VerifyError> {
    verify_in(&Dir(dir), root)
}

/// [`verify`], reading the set from `src`.
pub fn verify_in(src: &dyn Source, root: Option<&str>) -> Result<Verified, VerifyError> {
    verify_with(src, &BodyReader::new(src)?, root)
}

/// [`verify_in`], with the set's bodies already read.
pub fn verify_with(
    src: &dyn Source,
    bodies: &BodyReader<'_>,
    root: Option<&str>,
) -> Result<Verified, VerifyError> {
    let text = src
        .read(RECORDS)
        .map_err(|e| VerifyError::Read(RECORDS.to_string(), e.to_string()))?;
    let mut head = GENESIS.to_string();
    let mut kinds = Vec::new();
    let mut ended = None;
    let lines: Vec<&[u8]> = text.split(|&b| b == b'\n').collect();
    for (i, line) in lines.iter().enumerate() {
        let line = *line;
        if line.is_empty() {
            if i + 1 == lines.len() {
                continue;
            }
            return Err(VerifyError::Record {
                seq: i as u64,
                file: RECORDS.into(),
                why: "an empty line".into(),
            });
        }
        let seq = i as u64;
        let bad = |why: String| VerifyError::Record {
            seq,
            file: RECORDS.into(),
            why,
        };
        let bad_body = |file: &str, why: String| VerifyError::Record {
            seq,
            file: file.into(),
            why,
        };
        if i + 1 == lines.len() {
            return Err(bad("cut short: the last line has no end".into()));
        }
        if let Some(k) = &ended {
            return Err(bad(format!("follows the {k} record that ends the chain")));
        }
        let rec: Record =
            serde_json::from_slice(line).map_err(|e| bad(format!("not a record: {e}")))?;
        let again = canonical(&rec).map_err(bad)?;
        if again != line {
            return Err(bad("not in canonical form".into()));
        }
        if rec.seq != seq {
            return Err(bad(format!("numbered {}", rec.seq)));
        }
        if rec.prev != head {
            return Err(bad(format!("links to {}, not {head}", rec.prev)));
        }
        let bfile = bodies.file(seq, &rec.kind);
        let bname = format!("{} of record {seq}", rec.kind);
        let body = bodies
            .get(seq, &rec.kind)
            .map_err(|why| bad_body(&bfile, why))?;
        if sha256_hex(&body) != rec.body_sha256 {
            // Which of the two was changed: the record itself when what
            // follows it (the next record's link, or the kept root) does
            // not hold its hash.
            let line_hash = sha256_hex(line);
            let next_links = match lines.get(i + 1).filter(|l| !l.is_empty()) {
                Some(next) => serde_json::from_slice::<Record>(next)
                    .map(|n| n.prev == line_hash)
                    .unwrap_or(false),
                None => root.is_none_or(|r| r == line_hash),
            };
            return Err(if next_links {
                bad_body(&bfile, format!("body {bname} does not match its hash"))
            } else {
                bad(format!("the record does not hold the hash of body {bname}, and what follows it does not hold the record's: the record was changed"))
            });
        }
        // Most bodies are told canonical as they are read; the others are
        // parsed and written again.
        if !surely_canonical(&body) {
            let value: serde_json::Value = serde_json::from_slice(&body)
                .map_err(|e| bad_body(&bfile, format!("body {bname}: {e}")))?;
            if canonical_value(&value).map_err(|e| bad_body(&bfile, e))? != body {
                return Err(bad_body(
                    &bfile,
                    format!("body {bname} not in canonical form"),
                ));
            }
        }
        if seq == 0 && rec.kind != "begin" {
            return Err(VerifyError::NoBegin(rec.kind));
        }
        if rec.kind == "close" || rec.kind == "fault" {
            ended = Some(rec.kind.clone());
        }
        head = sha256_hex(line);
        kinds.push(rec.kind);
    }
    if kinds.is_empty() {
        return Err(VerifyError::Empty);
    }
    // A chain cut short may have a body written before its record; an
    // ended one has a body for each record and no more.
    if ended.is_some() && bodies.past(kinds.len()) > 0 {
        return Err(VerifyError::Record {
            seq: kinds.len() as u64,
            file: BODIES.into(),
            why: format!(
                "{} bodies with no record after the {} record that ends the chain",
                bodies.past(kinds.len()),
                ended.unwrap_or_default()
            ),
        });
    }
    if let Some(r) = root {
        if r != head {
            return Err(VerifyError::Root {
                expected: r.to_string(),
                found: head,
            });
        }
    }
    Ok(Verified {
        root: head,
        closed: ended.as_deref() == Some("close"),
        faulted: ended.as_deref() == Some("fault"),
        kinds,
    })
}

/// Reads body `seq` of kind `kind` from the chain in `dir`.
pub fn read_body(dir: &Path, seq: u64, kind: &str) -> Result<Vec<u8>, String> {
    let src = Dir(dir);
    BodyReader::new(&src)
        .map_err(|e| e.to_string())?
        .get(seq, kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values built from every ASCII character, keys that sort in the
    /// corners of byte order, and numbers at the edges of a double's
    /// whole numbers: the direct path writes what the canonicalizer
    /// writes; what it cannot write goes to the canonicalizer.
    /// A small deterministic generator (xorshift) for the tests below.
    struct Gen(u64);

    impl Gen {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        /// A string of the characters a sysctl, a path or a hostile name
        /// may hold: quotes, backslashes, controls, DEL, non-ASCII.
        fn text(&mut self, plain: bool) -> String {
            const ANY: &[&str] = &[
                "a", "Z", "0", ".", "/", " ", "-", "_", "\"", "\\", "\n", "\t", "\u{1}", "\u{1f}",
                "\u{7f}", "é", "\u{2028}", "😀", "\u{ffff}",
            ];
            const PLAIN: &[&str] = &["a", "b", "Z", "0", "9", ".", "/", " ", "-", "_", "~"];
            let pool = if plain { PLAIN } else { ANY };
            (0..self.below(8))
                .map(|_| pool[self.below(pool.len())])
                .collect()
        }

        fn value(&mut self, depth: usize, plain: bool) -> serde_json::Value {
            use serde_json::Value;
            let kinds = if depth >= 4 { 6 } else { 8 };
            match self.below(kinds) {
                0 => Value::Null,
                1 => Value::Bool(self.below(2) == 0),
                2 => Value::String(self.text(plain)),
                3 => {
                    const N: &[i64] = &[0, 1, -1, 42, -42, 1 << 53, -(1 << 53), 1_000_000_007];
                    serde_json::json!(N[self.below(N.len())])
                }
                4 if !plain => {
                    const F: &[serde_json::Value] = &[];
                    let _ = F;
                    match self.below(4) {
                        0 => serde_json::json!(1.5),
                        1 => serde_json::json!((1u64 << 53) + 1),
                        2 => serde_json::json!(u64::MAX),
                        _ => serde_json::json!(-1e300),
                    }
                }
                4 | 5 => Value::String(self.text(plain)),
                6 => Value::Array(
                    (0..self.below(4))
                        .map(|_| self.value(depth + 1, plain))
                        .collect(),
                ),
                _ => Value::Object(
                    (0..self.below(5))
                        .map(|_| (self.text(plain), self.value(depth + 1, plain)))
                        .collect(),
                ),
            }
        }
    }

    /// Whether the parser and writer say `bytes` is canonical JSON.
    fn canonical_by_parsing(bytes: &[u8]) -> bool {
        serde_json::from_slice::<serde_json::Value>(bytes)
            .ok()
            .and_then(|v| canonical_value(&v).ok())
            .is_some_and(|c| c == bytes)
    }

    /// What is told canonical without parsing is what parsing and writing
    /// again would tell canonical: over generated values of every kind
    /// (hostile strings, fractions, numbers past 2^53) and thousands of
    /// their bytes changed, inserted and removed; and plain values are
    /// told canonical without parsing.
    #[test]
    fn what_is_surely_canonical_is_canonical_by_parsing() {
        let mut g = Gen(0x9e37_79b9_7f4a_7c15);
        const NOISE: &[u8] = b" \"\\01-.eE,:{}[]aubnt\x00\x1f\x7f\xc3\xa9\xff";
        let (mut sure, mut mutants_sure) = (0, 0);
        for round in 0..4000 {
            let plain = round % 2 == 0;
            let v = g.value(0, plain);
            let bytes = canonical(&v).unwrap();
            let told = surely_canonical(&bytes);
            if plain {
                assert!(
                    told,
                    "plain, yet not told canonical: {}",
                    String::from_utf8_lossy(&bytes)
                );
            }
            if told {
                sure += 1;
                assert!(canonical_by_parsing(&bytes));
            }
            for _ in 0..8 {
                let mut m = bytes.clone();
                let at = g.below(m.len() + 1);
                match g.below(4) {
                    0 if at < m.len() => m[at] = NOISE[g.below(NOISE.len())],
                    1 => m.insert(at, NOISE[g.below(NOISE.len())]),
                    2 if at < m.len() => {
                        m.remove(at);
                    }
                    _ if at + 1 < m.len() => m.swap(at, at + 1),
                    _ => m.push(b' '),
                }
                if surely_canonical(&m) {
                    mutants_sure += 1;
                    assert!(
                        canonical_by_parsing(&m),
                        "told canonical, but it is not: {}",
                        String::from_utf8_lossy(&m)
                    );
                }
            }
        }
        assert!(sure >= 2000 && mutants_sure > 1000, "{sure} {mutants_sure}");
    }

    #[test]
    fn forms_that_are_not_canonical_are_never_told_so() {
        for (not, why) in [
            (&br#"{"a":1, "b":2}"#[..], "a space"),
            (br#"{"b":1,"a":2}"#, "keys out of order"),
            (br#"{"a":1,"a":2}"#, "a key twice"),
            (br#"-0"#, "minus zero"),
            (br#"01"#, "a leading zero"),
            (br#"1.0"#, "a fraction"),
            (br#"1e3"#, "an exponent"),
            (br#"9007199254740993"#, "past 2^53"),
            (br#""\u0041""#, "an escaped letter"),
            (br#""\/""#, "an escaped slash"),
            (br#""\u001F""#, "upper-case hex"),
            (br#""\u007f""#, "an escaped DEL"),
            (br#""\u000a""#, "a long escape for a short one"),
            (br#""\u0008""#, "a long escape for \\b"),
            (b"\"\x01\"", "a raw control"),
            (b"\"\xc3\"", "cut UTF-8"),
            (br#"{"a":1}x"#, "bytes after the value"),
            (br#"[1,]"#, "a trailing comma"),
            (br#"tru"#, "a word cut short"),
            (br#""#, "nothing"),
        ] {
            assert!(!surely_canonical(not), "{why}");
            assert!(!canonical_by_parsing(not), "{why} (the parser)");
        }
        for yes in [
            &br#"{"a":[1,-2,null,true,false,"x\"\\\n\u001f"],"b":{}}"#[..],
            br#"9007199254740992"#,
            br#"-9007199254740992"#,
            "\"é😀\u{7f}\"".as_bytes(),
        ] {
            assert!(surely_canonical(yes), "{}", String::from_utf8_lossy(yes));
            assert!(canonical_by_parsing(yes));
        }
    }

    #[test]
    fn plain_values_are_written_as_the_canonicalizer_writes_them() {
        use serde_json::{json, Value};
        let all_ascii: String = (0u8..128).map(char::from).collect();
        let mut values = vec![
            json!(null),
            json!({}),
            json!([]),
            json!(""),
            json!(all_ascii),
            json!("é, ü, 中文, 🦀, \u{2028}\u{2029}, \u{7f}, \u{fffd}"),
            json!({ "a": 1, "aa": 2, "b": 3, "B": 4, "_": 5, "0": 6, "~": 7, "a b": 8, "a\u{1}": 9 }),
            json!([
                0,
                1,
                -1,
                9007199254740992_u64,
                -9007199254740992_i64,
                true,
                false
            ]),
            json!({ "nested": { "deeper": [ { "z": "last", "a": "first" }, [], {} ] } }),
        ];
        // Every ASCII character as a key and in a value, one by one.
        let mut m = serde_json::Map::new();
        for c in 0u8..128 {
            let c = char::from(c);
            m.insert(format!("k{c}"), json!(format!("v{c}v")));
        }
        values.push(Value::Object(m));
        for v in &values {
            assert!(plain(v), "{v}");
            let expected = serde_json_canonicalizer::to_vec(v).unwrap();
            assert_eq!(
                canonical(v).unwrap(),
                expected,
                "{}",
                String::from_utf8_lossy(&expected)
            );
        }
        // Not plain: a fraction, a whole number past 2^53, a key outside
        // ASCII (whose UTF-16 order may differ from its bytes').
        for v in [
            json!({ "x": 1.5 }),
            json!([9007199254740993_u64]),
            json!([-9007199254740993_i64]),
            json!({ "\u{e000}": 1, "\u{1f980}": 2 }),
        ] {
            assert!(!plain(&v), "{v}");
            assert_eq!(
                canonical(&v).unwrap(),
                serde_json_canonicalizer::to_vec(&v).unwrap()
            );
        }
        // Keys out of order (a map that keeps its insertion order) are
        // not plain either.
        let mut out_of_order = serde_json::Map::new();
        out_of_order.insert("b".into(), json!(1));
        out_of_order.insert("a".into(), json!(2));
        let v = Value::Object(out_of_order);
        let ordered: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(plain(&v), ordered == ["a", "b"]);
        // Typed bodies, written straight when their keys come out
        // ascending, through a `Value` when not (fields out of order, a
        // map keyed by numbers, a fraction): the canonicalizer's bytes.
        #[derive(Serialize)]
        struct InOrder {
            a: u64,
            b: Vec<&'static str>,
            c: std::collections::BTreeMap<String, String>,
        }
        #[derive(Serialize)]
        struct OutOfOrder {
            z: u64,
            a: std::collections::BTreeMap<u64, bool>,
            m: f64,
        }
        let in_order = InOrder {
            a: 1,
            b: vec!["x\"", "\u{1}"],
            c: [("k.b", "1"), ("k.a", "2")]
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        };
        let direct = serde_json::to_vec(&in_order).unwrap();
        assert!(surely_canonical(&direct));
        assert_eq!(canonical(&in_order).unwrap(), direct);
        assert_eq!(
            direct,
            serde_json_canonicalizer::to_vec(&serde_json::to_value(&in_order).unwrap()).unwrap()
        );
        let out = OutOfOrder {
            z: 1,
            a: [(2, true), (10, false)].into_iter().collect(),
            m: 0.5,
        };
        assert!(!surely_canonical(&serde_json::to_vec(&out).unwrap()));
        assert_eq!(
            canonical(&out).unwrap(),
            serde_json_canonicalizer::to_vec(&serde_json::to_value(&out).unwrap()).unwrap()
        );
        // A typed body, fields in declaration order, comes out sorted.
        let r = Record {
            seq: 3,
            prev: GENESIS.into(),
            kind: "capture_a".into(),
            body_sha256: "ab".into(),
        };
        assert_eq!(
            canonical(&r).unwrap(),
            serde_json_canonicalizer::to_vec(&r).unwrap()
        );
    }

    #[test]
    fn a_sync_begun_behind_is_waited_for_and_files_beside_the_chain_are_synced_with_it() {
        let (_d, mut c) = chain();
        c.append_later("begin", &serde_json::json!({ "n": 1 }))
            .unwrap();
        c.write_beside("history.json", b"[]").unwrap();
        assert_eq!(c.unsynced.len(), 1, "a file beside the chain waits");
        assert!(c.dir_unsynced);
        c.sync_behind().unwrap();
        assert!(
            c.unsynced.is_empty() && !c.dir_unsynced,
            "taken by the sync behind"
        );
        assert!(c.behind.is_some());
        c.append_later("close", &serde_json::json!({})).unwrap();
        c.write_beside("history.json", b"[1]").unwrap();
        c.sync().unwrap();
        assert!(c.behind.is_none(), "waited for");
        assert!(c.unsynced.is_empty() && !c.dir_unsynced);
        assert_eq!(std::fs::read(c.dir().join("history.json")).unwrap(), b"[1]");
        let v = verify(c.dir(), Some(c.head())).unwrap();
        assert!(v.closed);
    }

    #[test]
    fn files_beside_the_chain_are_synced_behind_alone_and_waited_for() {
        let d = tempfile::tempdir().unwrap();
        let mut c = Chain::create_with(&d.path().join("run"), &["history.json"]).unwrap();
        c.append("begin", &serde_json::json!({ "n": 1 })).unwrap();
        assert!(!c.dir_unsynced);
        // Nothing beside the chain: nothing started.
        c.sync_beside_behind().unwrap();
        assert!(c.behind.is_none());
        c.write_beside("history.json", b"[]").unwrap();
        c.append_later("history", &serde_json::json!({})).unwrap();
        c.sync_beside_behind().unwrap();
        assert!(c.unsynced.is_empty(), "taken by the sync behind");
        assert!(c.behind.is_some());
        assert!(!c.dir_unsynced, "made with the chain: its name is durable");
        c.append_later("close", &serde_json::json!({})).unwrap();
        c.sync().unwrap();
        assert!(c.behind.is_none(), "waited for before the records");
        let v = verify(c.dir(), Some(c.head())).unwrap();
        assert_eq!(v.kinds, ["begin", "history", "close"]);
    }

    fn chain() -> (tempfile::TempDir, Chain) {
        let d = tempfile::tempdir().unwrap();
        let c = Chain::create(&d.path().join("run")).unwrap();
        (d, c)
    }

    #[test]
    fn a_written_chain_verifies_to_its_root() {
        let (d, mut c) = chain();
        c.append_later(
            "begin",
            &serde_json::json!({"run": "r1", "argv": ["/bin/true"]}),
        )
        .unwrap();
        c.append("capture_a", &serde_json::json!({"z": 1, "a": "é/\n"}))
            .unwrap();
        let root = c.append("close", &serde_json::json!({"lost": 0})).unwrap();
        let v = verify(&d.path().join("run"), Some(&root)).unwrap();
        assert_eq!(v.root, root);
        assert_eq!(v.kinds, ["begin", "capture_a", "close"]);
        assert!(v.closed && !v.faulted);
        assert!(matches!(
            c.append("more", &1).unwrap_err(),
            ChainError::Closed(_)
        ));
        // Keys sorted, no spaces: RFC 8785.
        let b = read_body(&d.path().join("run"), 1, "capture_a").unwrap();
        assert_eq!(String::from_utf8(b).unwrap(), "{\"a\":\"é/\\n\",\"z\":1}");
    }

    #[test]
    fn a_body_encoded_first_is_the_record_it_would_have_been() {
        let body = serde_json::json!({"z": [1, 2], "a": {"y": "x", "b": null}});
        let (d1, mut one) = chain();
        let (d2, mut two) = chain();
        for c in [&mut one, &mut two] {
            c.append_later("begin", &serde_json::json!({"run": "r1"}))
                .unwrap();
        }
        let a = one.append_later("capture_a", &body).unwrap();
        let encoded = Canonical::of(&body).unwrap();
        let b = two.append_canonical_later("capture_a", encoded).unwrap();
        assert_eq!(a, b, "the same record, so the same head");
        for (d, c) in [(&d1, &mut one), (&d2, &mut two)] {
            let root = c.append("close", &serde_json::json!({})).unwrap();
            let v = verify(&d.path().join("run"), Some(&root)).unwrap();
            assert_eq!(v.kinds, ["begin", "capture_a", "close"]);
        }
        assert_eq!(
            read_body(&d1.path().join("run"), 1, "capture_a").unwrap(),
            read_body(&d2.path().join("run"), 1, "capture_a").unwrap()
        );
        assert!(matches!(
            one.append_canonical_later("more", Canonical::of(&1).unwrap())
                .unwrap_err(),
            ChainError::Closed(_)
        ));
    }

    #[test]
    fn an_edited_body_a_dropped_record_or_another_root_is_found() {
        let (d, mut c) = chain();
        let dir = d.path().join("run");
        c.append("begin", &serde_json::json!({"run": "r1"}))
            .unwrap();
        c.append("capture_a", &serde_json::json!({"x": 1})).unwrap();
        let root = c.append("close", &serde_json::json!({})).unwrap();
        assert!(verify(&dir, Some(&root)).is_ok());
        assert!(matches!(
            verify(&dir, Some(GENESIS)),
            Err(VerifyError::Root { .. })
        ));
        // A body changed after the fact.
        let b = dir.join(BODIES);
        let bodies = std::fs::read_to_string(&b).unwrap();
        std::fs::write(&b, bodies.replace(r#"{"x":1}"#, r#"{"x":2}"#)).unwrap();
        let e = verify(&dir, None).unwrap_err();
        assert!(
            matches!(&e, VerifyError::Record { seq: 1, file, .. } if file == BODIES)
                && e.to_string().contains("does not match its hash"),
            "{e}"
        );
        std::fs::write(&b, &bodies).unwrap();
        // A record dropped from the middle.
        let text = std::fs::read_to_string(dir.join(RECORDS)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        std::fs::write(dir.join(RECORDS), format!("{}\n{}\n", lines[0], lines[2])).unwrap();
        let e = verify(&dir, None).unwrap_err();
        assert!(matches!(e, VerifyError::Record { seq: 1, .. }), "{e}");
    }

    /// Two files whatever the number of records; a body past the records
    /// is what a cut may leave before the chain ends, never after.
    #[test]
    fn bodies_are_lines_of_one_file_and_none_may_follow_the_end() {
        let (d, mut c) = chain();
        let dir = d.path().join("run");
        c.append("begin", &serde_json::json!({"run": "r1"}))
            .unwrap();
        c.append_later("capture_a", &serde_json::json!({"a": "x\ny"}))
            .unwrap();
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, [BODIES, RECORDS]);
        let bodies = std::fs::read_to_string(dir.join(BODIES)).unwrap();
        assert_eq!(bodies, "{\"run\":\"r1\"}\n{\"a\":\"x\\ny\"}\n");
        // A body written, its record not (a cut between the two): the
        // chain so far still verifies.
        let extra = format!("{bodies}{{\"x\":1}}\n");
        std::fs::write(dir.join(BODIES), &extra).unwrap();
        assert_eq!(verify(&dir, None).unwrap().kinds, ["begin", "capture_a"]);
        std::fs::write(dir.join(BODIES), &bodies).unwrap();
        let root = c.append("close", &serde_json::json!({})).unwrap();
        assert!(verify(&dir, Some(&root)).unwrap().closed);
        // After the end: a whole line, or one cut short, is found.
        let closed = std::fs::read_to_string(dir.join(BODIES)).unwrap();
        for tail in ["{}\n", "{\"x\""] {
            std::fs::write(dir.join(BODIES), format!("{closed}{tail}")).unwrap();
            let e = verify(&dir, Some(&root)).unwrap_err();
            assert!(
                matches!(&e, VerifyError::Record { seq: 3, file, .. } if file == BODIES),
                "{e}"
            );
        }
        // A body missing: named.
        let cut: String = closed.lines().take(2).map(|l| format!("{l}\n")).collect();
        std::fs::write(dir.join(BODIES), cut).unwrap();
        let e = verify(&dir, Some(&root)).unwrap_err();
        assert!(
            matches!(&e, VerifyError::Record { seq: 2, file, .. } if file == BODIES)
                && e.to_string().contains("no body of record 2 (close)"),
            "{e}"
        );
    }

    /// Files made with the chain: their names durable with its first
    /// sync, so writing one later leaves the directory alone; another
    /// file beside it does not.
    #[test]
    fn a_file_made_with_the_chain_needs_no_sync_of_the_directory() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("run");
        let mut c = Chain::create_with(&dir, &["effects.json"]).unwrap();
        assert_eq!(std::fs::read(dir.join("effects.json")).unwrap(), b"");
        c.append("begin", &1).unwrap();
        assert!(!c.dir_unsynced);
        c.write_beside("effects.json", b"{}").unwrap();
        assert!(!c.dir_unsynced, "made with the chain");
        c.write_beside("history.json", b"[]").unwrap();
        assert!(c.dir_unsynced, "a new name");
        c.sync().unwrap();
        assert_eq!(std::fs::read(dir.join("effects.json")).unwrap(), b"{}");
        assert!(matches!(
            Chain::create_with(&dir, &["effects.json"]).unwrap_err(),
            ChainError::Exists(_)
        ));
    }

    /// A set written before `bodies.jsonl`, a body per file, still reads.
    #[test]
    fn a_set_with_a_body_per_file_still_verifies() {
        let (d, mut c) = chain();
        let dir = d.path().join("run");
        c.append("begin", &serde_json::json!({"run": "r1"}))
            .unwrap();
        let root = c.append("close", &serde_json::json!({})).unwrap();
        let bodies = std::fs::read_to_string(dir.join(BODIES)).unwrap();
        std::fs::remove_file(dir.join(BODIES)).unwrap();
        std::fs::create_dir(dir.join(BODIES_DIR)).unwrap();
        for (seq, (kind, body)) in ["begin", "close"].iter().zip(bodies.lines()).enumerate() {
            std::fs::write(dir.join(old_body_name(seq as u64, kind)), body).unwrap();
        }
        assert!(verify(&dir, Some(&root)).unwrap().closed);
        assert_eq!(read_body(&dir, 1, "close").unwrap(), b"{}");
        std::fs::write(dir.join(old_body_name(1, "close")), b"{\"a\":1}").unwrap();
        let e = verify(&dir, Some(&root)).unwrap_err();
        assert!(
            matches!(&e, VerifyError::Record { seq: 1, file, .. } if file == "bodies/000001-close.json"),
            "{e}"
        );
    }

    /// A write that fails part way leaves the files out of step: no
    /// record follows it.
    #[test]
    fn no_record_follows_a_failed_write() {
        let (_d, mut c) = chain();
        c.append("begin", &1).unwrap();
        c.broken = true;
        assert!(matches!(
            c.append("fault", &serde_json::json!({})).unwrap_err(),
            ChainError::Broken(_)
        ));
    }

    #[test]
    fn a_chain_is_made_once() {
        let (d, mut c) = chain();
        c.append("begin", &1).unwrap();
        assert!(matches!(
            Chain::create(&d.path().join("run")).unwrap_err(),
            ChainError::Exists(_)
        ));
    }
}
