//! The audit log: one checksummed, append-only record per mutating request
//! (time, request id, peer, action, target, outcome), in `state/audit.log`,
//! outside every rollback.
//!
//! Records are written with one `write` each, so a crash of the process
//! loses none; they are synced to disk by [`Audit::sync`], which the server
//! calls periodically and at shutdown.
//!
//! The log is bounded ([`Audit::bound`], `--audit-file-bytes`): past its
//! size it is renamed `audit.log.1` (replacing the one before) and a new
//! one begins, numbering on; reading goes through both. Records a guest
//! can cause ([`Audit::append_for`]) are limited per session
//! (`--audit-lines-per-s`): past the rate they are counted, not written,
//! and the next one written is preceded by one record saying how many
//! were left out.

use crate::rate::{Buckets, Taken};
use crate::records;
use allox_protocol::{AuditListing, AuditRecord};
use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum AuditError {
    #[error("cannot open audit log {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write audit log {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("audit log {path} could not be opened at start")]
    Unavailable { path: PathBuf },
    #[error("cannot read audit log {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A record a guest caused, when the disk is full and what is left of
    /// the log's room is kept for the host's requests.
    #[error("the disk is full, and what is left of audit log {path}'s room is kept for the host's requests (its deletes and kills among them): a sandbox's call is not recorded, so it is not served")]
    KeptForHost { path: PathBuf },
}

/// What is left of the audit log's room that a guest's record may not
/// take on a full disk: a few thousand host records (a kill, a delete,
/// a rollback: about 200 bytes each), so that an agent that filled the
/// disk and then the room with its own calls cannot stop the host's
/// requests that would end it (they were all refused, for want of an
/// audit record, even after a restart).
pub const KEPT_FOR_HOST: u64 = 512 << 10;

/// Whether a record is a guest's (a sandboxed program's call): its peer.
/// Whether `peer` (a record's) is a sandbox's: `guest …`.
pub fn is_guest(peer: &str) -> bool {
    peer.starts_with("guest ")
}

/// The fields of a record before it gets its sequence number and time.
#[derive(Debug, Clone)]
pub struct Entry {
    pub request_id: u64,
    pub peer: String,
    pub action: String,
    pub target: String,
    pub outcome: String,
    pub message: Option<String>,
}

struct Tail {
    file: File,
    next_seq: u64,
    /// Records written since the last sync.
    unsynced: bool,
    /// A rotation that failed (the disk full) is not tried again before.
    rotate_after: Option<std::time::Instant>,
}

pub struct Audit {
    path: PathBuf,
    /// `None` when the log could not be opened: every append fails.
    tail: Mutex<Option<Tail>>,
    /// Past this size the log is rotated (`None`: never).
    max_bytes: std::sync::atomic::AtomicU64,
    /// Records of guests' calls, per session.
    lines: std::sync::RwLock<Option<Buckets>>,
}

/// Whether a guest's record may be appended to `file` (at `path`): the
/// file's own room past its end holds more than [`KEPT_FOR_HOST`], or the
/// filesystem has room to spare (64 MiB: the room is topped up from it).
fn room_beyond_host(file: &File, path: &Path) -> bool {
    let Ok(st) = rustix::fs::fstat(file) else {
        return true;
    };
    let own = (st.st_blocks as u64 * 512).saturating_sub(st.st_size as u64);
    if own > KEPT_FOR_HOST {
        return true;
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    rustix::fs::statvfs(dir).map_or(true, |v| v.f_bavail.saturating_mul(v.f_frsize) > 64 << 20)
}

/// The rotated log beside `path` (`audit.log.1`).
pub fn rotated(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

/// How big the audit log grows and how fast a session's guest calls are
/// recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditBounds {
    /// `--audit-file-bytes`: past this, the file is rotated (0: never).
    pub file_bytes: u64,
    /// `--audit-lines-per-s`: records of a session's guest calls a
    /// second (0: no limit); ten times as many may come at once.
    pub lines_per_s: u64,
}

/// A page of records ([`Audit::read`]) holds at most this many bytes of
/// them, whatever its `limit`, so that it fits in a frame.
pub const PAGE_BYTES: usize = 512 << 10;

/// `--audit-file-bytes` unless given.
pub const DEFAULT_FILE_BYTES: u64 = 64 << 20;
/// `--audit-lines-per-s` unless given.
pub const DEFAULT_LINES_PER_S: u64 = 100;

impl Default for AuditBounds {
    fn default() -> Self {
        AuditBounds {
            file_bytes: DEFAULT_FILE_BYTES,
            lines_per_s: DEFAULT_LINES_PER_S,
        }
    }
}

impl Audit {
    pub fn open(path: &Path) -> Result<Audit, AuditError> {
        let open_err = |source| AuditError::Open {
            path: path.to_path_buf(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .open(path)
            .map_err(open_err)?;
        let mut last = 0;
        let scan = records::scan_reader(std::io::BufReader::new(&file), |p| {
            if let Ok(r) = postcard::from_bytes::<AuditRecord>(p) {
                last = r.seq;
            }
            true
        })
        .map_err(open_err)?;
        if last == 0 {
            // Just rotated: the numbers go on from the rotated file's.
            if let Ok(old) = File::open(rotated(path)) {
                let _ = records::scan_reader(std::io::BufReader::new(old), |p| {
                    if let Ok(r) = postcard::from_bytes::<AuditRecord>(p) {
                        last = r.seq;
                    }
                    true
                });
            }
        }
        if file.metadata().map_err(open_err)?.len() != scan.valid_len {
            tracing::warn!(valid = scan.valid_len, "cutting torn audit log tail");
            file.set_len(scan.valid_len).map_err(open_err)?;
        }
        file.seek(SeekFrom::End(0)).map_err(open_err)?;
        Ok(Audit {
            path: path.to_path_buf(),
            tail: Mutex::new(Some(Tail {
                file,
                next_seq: last + 1,
                unsynced: false,
                rotate_after: None,
            })),
            max_bytes: 0.into(),
            lines: Default::default(),
        })
    }

    /// Bounds the log's size and the rate of guests' records.
    pub fn bound(&self, b: AuditBounds) {
        self.max_bytes
            .store(b.file_bytes, std::sync::atomic::Ordering::Relaxed);
        *self.lines.write().unwrap_or_else(|p| p.into_inner()) = Some(Buckets::new(
            b.lines_per_s,
            b.lines_per_s.saturating_mul(10),
        ));
    }

    /// [`Audit::append`] for a record a guest of session `key` caused,
    /// within the session's rate: past it the record is counted and left
    /// out (`Ok(None)`), and the next one written is preceded by a
    /// record saying how many were.
    pub fn append_for(&self, key: &str, e: Entry) -> Result<Option<u64>, AuditError> {
        let taken = match &*self.lines.read().unwrap_or_else(|p| p.into_inner()) {
            Some(b) => b.take(key, 1),
            None => Taken::Yes { refused_before: 0 },
        };
        match taken {
            Taken::No => Ok(None),
            Taken::Yes { refused_before } => {
                if refused_before > 0 {
                    self.append(Entry {
                        request_id: 0,
                        peer: e.peer.clone(),
                        action: e.action.clone(),
                        target: key.to_string(),
                        outcome: "suppressed".into(),
                        message: Some(format!(
                            "{refused_before} records of {key}'s calls were suppressed: more than \
                             the session's rate (--audit-lines-per-s)"
                        )),
                    })?;
                }
                self.append(e).map(Some)
            }
        }
    }

    /// Whether a guest's record may be written now ([`KEPT_FOR_HOST`]):
    /// asked before a guest's call is served, so that none is served
    /// that could not be recorded.
    pub fn guest_may_record(&self) -> Result<(), AuditError> {
        let g = self.tail.lock().unwrap_or_else(|p| p.into_inner());
        match g.as_ref() {
            Some(t) if !room_beyond_host(&t.file, &self.path) => Err(AuditError::KeptForHost {
                path: self.path.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// An audit log that refuses every append (it could not be opened):
    /// with it, the supervisor refuses every change.
    pub fn unavailable(path: &Path) -> Audit {
        Audit {
            path: path.to_path_buf(),
            tail: Mutex::new(None),
            max_bytes: 0.into(),
            lines: Default::default(),
        }
    }

    /// Appends a record and returns its sequence number. Fields a client
    /// controls are cut to a bounded length first, so that requests cannot
    /// grow the log faster than a few hundred bytes each.
    pub fn append(&self, e: Entry) -> Result<u64, AuditError> {
        let mut g = self.tail.lock().unwrap_or_else(|p| p.into_inner());
        let Some(t) = g.as_mut() else {
            return Err(AuditError::Unavailable {
                path: self.path.clone(),
            });
        };
        let rec = AuditRecord {
            seq: t.next_seq,
            time_ms: crate::clock::now_ms(),
            request_id: e.request_id,
            peer: clip(e.peer, 64),
            action: clip(e.action, 64),
            target: clip(e.target, 200),
            outcome: clip(e.outcome, 32),
            message: e.message.map(|m| clip(m, 1024)),
        };
        let write_err = |source| AuditError::Write {
            path: self.path.clone(),
            source,
        };
        if is_guest(&rec.peer) && !room_beyond_host(&t.file, &self.path) {
            return Err(AuditError::KeptForHost {
                path: self.path.clone(),
            });
        }
        let payload = postcard::to_stdvec(&rec)
            .map_err(|e| write_err(io::Error::new(io::ErrorKind::InvalidData, e)))?;
        let before = t.file.metadata().map(|m| m.len()).ok();
        if let Err(err) = records::append(&mut t.file, &payload) {
            if let Some(len) = before {
                let _ = t.file.set_len(len);
            }
            return Err(write_err(err));
        }
        t.next_seq += 1;
        t.unsynced = true;
        let max = self.max_bytes.load(std::sync::atomic::Ordering::Relaxed);
        let due = t
            .rotate_after
            .is_none_or(|at| std::time::Instant::now() >= at);
        if max > 0 && due && t.file.metadata().is_ok_and(|m| m.len() > max) {
            match self.rotate(t) {
                Ok(()) => t.rotate_after = None,
                Err(e) => {
                    // Tried again in a minute, said once a minute.
                    t.rotate_after =
                        Some(std::time::Instant::now() + std::time::Duration::from_secs(60));
                    tracing::error!(
                        path = %self.path.display(), error = %e,
                        "cannot rotate the audit log (its new file could not get its room); it grows past its bound meanwhile"
                    );
                }
            }
        }
        Ok(rec.seq)
    }

    /// Renames the log `audit.log.1` and begins a new one, which gets its
    /// room first: on a full disk the log is not rotated (a new file with
    /// no room would refuse the host's records: every change refused).
    fn rotate(&self, t: &mut Tail) -> io::Result<()> {
        t.file = crate::reserve::rotate_with_room(&self.path, &rotated(&self.path), &t.file)?;
        t.unsynced = false;
        Ok(())
    }

    /// At most `limit` records, oldest first: the oldest with `seq >
    /// after` when `after` is given, else the newest with `seq < before`
    /// (the newest of all without it); with cursors to the records on
    /// either side that were left out.
    pub fn read(
        &self,
        after: Option<u64>,
        before: Option<u64>,
        limit: usize,
    ) -> Result<AuditListing, AuditError> {
        let read_err = |source| AuditError::Read {
            path: self.path.clone(),
            source,
        };
        // The rotated file's records come first (none if there is none);
        // it is opened first, so a rotation in between repeats nothing.
        let old: Box<dyn io::Read> = match File::open(rotated(&self.path)) {
            Ok(f) => Box::new(f),
            Err(_) => Box::new(io::empty()),
        };
        let file = std::fs::File::open(&self.path).map_err(read_err)?;
        let file = io::Read::chain(old, file);
        let limit = limit.max(1);
        // Records with their sizes, and the sum of those: a page is at most
        // `limit` records and at most PAGE_BYTES of them (always one), so
        // that any page fits in a frame whatever `limit` asked.
        let mut out = std::collections::VecDeque::<(AuditRecord, usize)>::new();
        let mut bytes = 0usize;
        let (mut unreadable, mut older, mut newer) = (0, false, false);
        let scan = records::scan_reader(std::io::BufReader::new(file), |p| {
            let Ok(r) = postcard::from_bytes::<AuditRecord>(p) else {
                unreadable += 1;
                return true;
            };
            match after {
                // Forward: the first `limit` above `after` that fit, and
                // whether one more follows them.
                Some(a) if r.seq <= a => older = true,
                Some(_)
                    if out.len() == limit || (!out.is_empty() && bytes + p.len() > PAGE_BYTES) =>
                {
                    newer = true;
                    return false;
                }
                Some(_) => {
                    bytes += p.len();
                    out.push_back((r, p.len()));
                }
                // Back: the last `limit` below `before` that fit.
                None if before.is_some_and(|b| r.seq >= b) => newer = true,
                None => {
                    bytes += p.len();
                    out.push_back((r, p.len()));
                    while out.len() > limit || (out.len() > 1 && bytes > PAGE_BYTES) {
                        if let Some((_, n)) = out.pop_front() {
                            bytes -= n;
                        }
                        older = true;
                    }
                }
            }
            true
        })
        .map_err(read_err)?;
        let records: Vec<AuditRecord> = out.into_iter().map(|(r, _)| r).collect();
        Ok(AuditListing {
            earlier: older.then(|| {
                records
                    .first()
                    .map_or(after.unwrap_or(0).saturating_add(1), |r| r.seq)
            }),
            later: newer.then(|| {
                records
                    .last()
                    .map_or(before.unwrap_or(1).saturating_sub(1), |r| r.seq)
            }),
            records,
            corrupt: scan.corrupt + unreadable,
        })
    }

    /// Makes the records written so far durable (nothing to do, and no
    /// disk flush, when none were written since the last time).
    pub fn sync(&self) -> Result<(), AuditError> {
        let mut g = self.tail.lock().unwrap_or_else(|p| p.into_inner());
        let Some(t) = g.as_mut() else {
            return Ok(());
        };
        if !t.unsynced {
            return Ok(());
        }
        t.file.sync_data().map_err(|source| AuditError::Write {
            path: self.path.clone(),
            source,
        })?;
        t.unsynced = false;
        Ok(())
    }
}

/// Cuts `s` to at most `max` bytes on a character boundary, marking the cut.
fn clip(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max.saturating_sub(3);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(action: &str) -> Entry {
        Entry {
            request_id: 1,
            peer: "test".into(),
            action: action.into(),
            target: "a".into(),
            outcome: "ok".into(),
            message: None,
        }
    }

    #[test]
    fn sequence_continues_across_reopen_and_corruption_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("audit.log");
        {
            let a = Audit::open(&p).unwrap();
            assert_eq!(a.append(entry("agent.create")).unwrap(), 1);
            assert_eq!(a.append(entry("agent.delete")).unwrap(), 2);
        }
        // Flip a byte inside the first record's payload.
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[14] ^= 0x40;
        std::fs::write(&p, &bytes).unwrap();
        let a = Audit::open(&p).unwrap();
        assert_eq!(a.append(entry("session.create")).unwrap(), 3);
        let l = a.read(Some(0), None, 100).unwrap();
        assert_eq!(l.corrupt, 1);
        let seqs: Vec<u64> = l.records.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, [2, 3]);
        assert_eq!(a.read(Some(2), None, 100).unwrap().records.len(), 1);
        assert_eq!(a.read(Some(0), None, 1).unwrap().records.len(), 1);
        // Client-controlled fields are bounded.
        let mut e = entry("x");
        e.target = "t".repeat(1 << 20);
        let seq = a.append(e).unwrap();
        let r = a.read(Some(seq - 1), None, 1).unwrap().records.remove(0);
        assert!(r.target.len() <= 200 && r.target.ends_with("..."));
    }

    #[test]
    fn the_newest_come_first_when_cut_with_cursors_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        let a = Audit::open(&dir.path().join("audit.log")).unwrap();
        for i in 0..131 {
            a.append(entry(&format!("x{i}"))).unwrap();
        }
        let seqs = |l: &AuditListing| l.records.iter().map(|r| r.seq).collect::<Vec<_>>();
        // No cursor: the newest 100, oldest of them first; older ones exist.
        let l = a.read(None, None, 100).unwrap();
        assert_eq!(seqs(&l), (32..=131).collect::<Vec<_>>());
        assert_eq!((l.earlier, l.later), (Some(32), None));
        // Back from there: the 31 left.
        let l = a.read(None, l.earlier, 100).unwrap();
        assert_eq!(seqs(&l), (1..=31).collect::<Vec<_>>());
        assert_eq!((l.earlier, l.later), (None, Some(31)));
        // Forward from the oldest: 100, then more.
        let l = a.read(Some(0), None, 100).unwrap();
        assert_eq!(seqs(&l), (1..=100).collect::<Vec<_>>());
        assert_eq!((l.earlier, l.later), (None, Some(100)));
        let l = a.read(l.later, None, 100).unwrap();
        assert_eq!(seqs(&l), (101..=131).collect::<Vec<_>>());
        assert_eq!((l.earlier, l.later), (Some(101), None));
        // Everything fits: no cursor either way.
        let l = a.read(None, None, 1000).unwrap();
        assert_eq!((l.records.len(), l.earlier, l.later), (131, None, None));
        // Cursors past either end.
        assert!(a.read(None, Some(0), 10).unwrap().records.is_empty());
        assert!(a.read(Some(u64::MAX), None, 10).unwrap().records.is_empty());
    }

    #[test]
    fn a_page_is_cut_to_its_bytes_whatever_its_limit_and_paging_reaches_every_record() {
        let dir = tempfile::tempdir().unwrap();
        let a = Audit::open(&dir.path().join("audit.log")).unwrap();
        let n = 12_000u64;
        for i in 0..n {
            let mut e = entry(&format!("x{i}"));
            e.message = Some("m".repeat(100));
            a.append(e).unwrap();
        }
        let frame = |l: &AuditListing| postcard::to_allocvec(l).unwrap().len();
        // Back from the newest: the newest that fit, the rest earlier.
        let mut seen = 0;
        let mut before = None;
        loop {
            let l = a.read(None, before, 10_000).unwrap();
            assert!(frame(&l) < 1 << 20, "a page of {} bytes", frame(&l));
            assert!(!l.records.is_empty() && l.records.len() < 10_000);
            seen += l.records.len() as u64;
            match l.earlier {
                Some(e) => before = Some(e),
                None => break,
            }
        }
        assert_eq!(seen, n);
        // Forward from the oldest, likewise.
        let (mut seen, mut after, mut last) = (0, Some(0), 0);
        while let Some(from) = after {
            let l = a.read(Some(from), None, 10_000).unwrap();
            assert!(frame(&l) < 1 << 20, "a page of {} bytes", frame(&l));
            assert_eq!(l.records[0].seq, last + 1);
            last = l.records.last().unwrap().seq;
            seen += l.records.len() as u64;
            after = l.later;
        }
        assert_eq!((seen, last), (n, n));
    }

    #[test]
    fn the_log_rotates_past_its_size_and_numbers_on_across_both_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("audit.log");
        let a = Audit::open(&p).unwrap();
        a.bound(AuditBounds {
            file_bytes: 4096,
            lines_per_s: 0,
        });
        for i in 0..2000 {
            a.append(entry(&format!("x{i}"))).unwrap();
        }
        // Never more than the bound and one record, in each of two files;
        // each the root's alone (the one a rotation began was the
        // umask's, 0644).
        for f in [p.clone(), rotated(&p)] {
            let m = std::fs::metadata(&f).unwrap();
            assert!(m.len() < 4096 + 200, "{f:?}");
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(m.permissions().mode() & 0o777, 0o600, "{f:?}");
        }
        let l = a.read(None, None, 100_000).unwrap();
        let seqs: Vec<u64> = l.records.iter().map(|r| r.seq).collect();
        assert_eq!(*seqs.last().unwrap(), 2000);
        assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1));
        assert!(seqs.len() < 400);
        // Reopened just after a rotation: numbering goes on.
        drop(a);
        std::fs::rename(&p, rotated(&p)).unwrap();
        let a = Audit::open(&p).unwrap();
        assert_eq!(a.append(entry("y")).unwrap(), 2001);
    }

    #[test]
    fn a_sessions_guest_records_past_its_rate_are_counted_in_one_record() {
        let dir = tempfile::tempdir().unwrap();
        let a = Audit::open(&dir.path().join("audit.log")).unwrap();
        a.bound(AuditBounds {
            file_bytes: 0,
            lines_per_s: 1,
        });
        let mut written = 0;
        for _ in 0..500 {
            written += a.append_for("a/s", entry("plugin.call")).unwrap().is_some() as u32;
        }
        // The burst (ten), perhaps one more as the bucket fills.
        assert!((10..=11).contains(&written), "{written}");
        // Another session is not held back.
        assert!(a.append_for("b/s", entry("plugin.call")).unwrap().is_some());
        std::thread::sleep(std::time::Duration::from_millis(1100));
        assert!(a.append_for("a/s", entry("plugin.call")).unwrap().is_some());
        let l = a.read(None, None, 1000).unwrap();
        let said: Vec<&AuditRecord> = l
            .records
            .iter()
            .filter(|r| r.outcome == "suppressed")
            .collect();
        assert_eq!(said.len(), 1);
        let n = 500 - written as u64;
        assert!(
            said[0]
                .message
                .as_deref()
                .unwrap()
                .starts_with(&format!("{n} records of a/s")),
            "{:?}",
            said[0].message
        );
    }
}
