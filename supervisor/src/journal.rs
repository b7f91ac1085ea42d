//! The write-ahead journal of multi-step store changes.
//!
//! Before an operation touches the disk its `Begin` record is appended and
//! made durable (`fdatasync`); when its last step is done a `Done` record is
//! appended. The index commit of each operation is its point of no return:
//! on start-up, every `Begin` without `Done` is completed if the index shows
//! the operation committed, and undone otherwise (see `store::recovery`).

use crate::records;
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use thiserror::Error;

/// One multi-step change, with what recovery needs to finish or undo it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Op {
    AgentCreate {
        agent: String,
    },
    AgentDelete {
        agent: String,
    },
    SessionCreate {
        agent: String,
        session: String,
    },
    SessionDelete {
        agent: String,
        session: String,
    },
    CheckpointCreate {
        agent: String,
        session: String,
        checkpoint: String,
    },
    CheckpointDelete {
        agent: String,
        session: String,
        checkpoint: String,
    },
    Rollback {
        agent: String,
        session: String,
        checkpoint: String,
        /// Subvolume ID of `current/` before the swap.
        old_subvolume: u64,
    },
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
enum Record {
    Begin { op_id: u64, op: Op },
    Done { op_id: u64 },
}

#[derive(Debug, Error)]
pub enum JournalError {
    #[error("cannot open journal {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write journal {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl JournalError {
    pub fn io(&self) -> &io::Error {
        match self {
            JournalError::Open { source, .. } | JournalError::Write { source, .. } => source,
        }
    }
}

pub struct Journal {
    path: PathBuf,
    file: Mutex<File>,
}

impl Journal {
    /// Opens (or creates) the journal and returns the operations that began
    /// and did not finish, oldest first. A torn last record is cut off.
    pub fn open(path: &Path) -> Result<(Journal, Vec<(u64, Op)>), JournalError> {
        let open_err = |source| JournalError::Open {
            path: path.to_path_buf(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)
            .map_err(open_err)?;
        let scan = records::scan_file(&mut file).map_err(open_err)?;
        let mut pending: Vec<(u64, Op)> = Vec::new();
        for payload in &scan.records {
            match postcard::from_bytes::<Record>(payload) {
                Ok(Record::Begin { op_id, op }) => pending.push((op_id, op)),
                Ok(Record::Done { op_id }) => pending.retain(|(id, _)| *id != op_id),
                Err(e) => tracing::warn!(error = %e, "unreadable journal record skipped"),
            }
        }
        if scan.corrupt > 0 {
            tracing::warn!(corrupt = scan.corrupt, "journal records with bad checksums");
        }
        if file.metadata().map_err(open_err)?.len() != scan.valid_len {
            tracing::warn!(valid = scan.valid_len, "cutting torn journal tail");
            file.set_len(scan.valid_len).map_err(open_err)?;
            file.sync_data().map_err(open_err)?;
        }
        file.seek(SeekFrom::End(0)).map_err(open_err)?;
        let j = Journal {
            path: path.to_path_buf(),
            file: Mutex::new(file),
        };
        Ok((j, pending))
    }

    fn append(&self, rec: &Record, durable: bool) -> Result<(), JournalError> {
        let write_err = |source| JournalError::Write {
            path: self.path.clone(),
            source,
        };
        let payload = postcard::to_stdvec(rec)
            .map_err(|e| write_err(io::Error::new(io::ErrorKind::InvalidData, e)))?;
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let before = f.metadata().map(|m| m.len()).ok();
        if let Err(e) = records::append(&mut f, &payload) {
            // A short write (disk full) must not leave half a record that
            // would hide the records after it: cut back to where we were.
            if let Some(len) = before {
                let _ = f.set_len(len);
            }
            return Err(write_err(e));
        }
        if durable {
            f.sync_data().map_err(write_err)?;
        }
        Ok(())
    }

    /// Records that `op` is about to start; durable when this returns.
    pub fn begin(&self, op_id: u64, op: &Op) -> Result<(), JournalError> {
        self.append(
            &Record::Begin {
                op_id,
                op: op.clone(),
            },
            true,
        )
    }

    /// Records that `op_id` is finished. Not synced: losing it only means
    /// recovery re-checks a finished operation, which is harmless.
    pub fn done(&self, op_id: u64) -> Result<(), JournalError> {
        self.append(&Record::Done { op_id }, false)
    }

    /// Empties the journal; only when no operation is in flight.
    pub fn reset(&self) -> Result<(), JournalError> {
        let f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let write_err = |source| JournalError::Write {
            path: self.path.clone(),
            source,
        };
        f.set_len(0).map_err(write_err)?;
        f.sync_all().map_err(write_err)
    }

    pub fn len(&self) -> u64 {
        let f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        f.metadata().map(|m| m.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn sync(&self) -> Result<(), JournalError> {
        let f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        f.sync_all().map_err(|source| JournalError::Write {
            path: self.path.clone(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(n: &str) -> Op {
        Op::AgentCreate { agent: n.into() }
    }

    #[test]
    fn pending_operations_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("journal");
        {
            let (j, pending) = Journal::open(&p).unwrap();
            assert!(pending.is_empty());
            j.begin(1, &op("a")).unwrap();
            j.begin(2, &op("b")).unwrap();
            j.done(1).unwrap();
            j.begin(3, &op("c")).unwrap();
        }
        let (_, pending) = Journal::open(&p).unwrap();
        assert_eq!(pending, vec![(2, op("b")), (3, op("c"))]);
    }

    #[test]
    fn torn_tail_is_cut_and_appends_continue() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("journal");
        {
            let (j, _) = Journal::open(&p).unwrap();
            j.begin(1, &op("a")).unwrap();
        }
        let len = std::fs::metadata(&p).unwrap().len();
        {
            use std::io::Write;
            let mut f = OpenOptions::new().append(true).open(&p).unwrap();
            f.write_all(&[9, 0, 0, 0, 1]).unwrap();
        }
        let (j, pending) = Journal::open(&p).unwrap();
        assert_eq!(pending.len(), 1);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), len);
        j.done(1).unwrap();
        drop(j);
        let (j, pending) = Journal::open(&p).unwrap();
        assert!(pending.is_empty());
        j.reset().unwrap();
        assert!(j.is_empty());
    }
}
