//! The audit log: one checksummed, append-only record per mutating request
//! (time, request id, peer, action, target, outcome), in `state/audit.log`,
//! outside every rollback.
//!
//! Records are written with one `write` each, so a crash of the process
//! loses none; they are synced to disk by [`Audit::sync`], which the server
//! calls periodically and at shutdown.

use crate::records;
use allox_protocol::{AuditListing, AuditRecord};
use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
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
}

pub struct Audit {
    path: PathBuf,
    /// `None` when the log could not be opened: every append fails.
    tail: Mutex<Option<Tail>>,
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
            })),
        })
    }

    /// An audit log that refuses every append (it could not be opened):
    /// with it, the supervisor refuses every change.
    pub fn unavailable(path: &Path) -> Audit {
        Audit {
            path: path.to_path_buf(),
            tail: Mutex::new(None),
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
        Ok(rec.seq)
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
        let file = std::fs::File::open(&self.path).map_err(read_err)?;
        let limit = limit.max(1);
        let mut out = std::collections::VecDeque::new();
        let (mut unreadable, mut older, mut newer) = (0, false, false);
        let scan = records::scan_reader(std::io::BufReader::new(file), |p| {
            let Ok(r) = postcard::from_bytes::<AuditRecord>(p) else {
                unreadable += 1;
                return true;
            };
            match after {
                // Forward: the first `limit` above `after`, and whether one
                // more follows them.
                Some(a) if r.seq <= a => older = true,
                Some(_) if out.len() == limit => {
                    newer = true;
                    return false;
                }
                Some(_) => out.push_back(r),
                // Back: the last `limit` below `before`.
                None if before.is_some_and(|b| r.seq >= b) => newer = true,
                None => {
                    if out.len() == limit {
                        out.pop_front();
                        older = true;
                    }
                    out.push_back(r);
                }
            }
            true
        })
        .map_err(read_err)?;
        let records: Vec<AuditRecord> = out.into();
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
}
