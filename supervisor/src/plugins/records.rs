//! A plugin's record file in the store's `state/` (outside every
//! workspace: no rollback touches it): one JSON line per record, numbered
//! from 1, appended as things happen and read in pages or followed. The
//! network audit and the share audit are such files.

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::io::{BufRead, Write};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

/// A record that carries its number.
pub trait Numbered: Serialize + DeserializeOwned {
    fn seq(&self) -> u64;
    fn set_seq(&mut self, seq: u64);
}

pub struct Records<R> {
    path: PathBuf,
    file: Mutex<std::fs::File>,
    /// The newest record's number, for followers to wait on.
    newest: tokio::sync::watch::Sender<u64>,
    kind: PhantomData<fn(R) -> R>,
}

/// A page of records.
pub struct Page<R> {
    pub records: Vec<R>,
    /// The number of the last record looked at: where the next page
    /// starts.
    pub next_cursor: u64,
}

impl<R: Numbered> Records<R> {
    /// Opens (or makes) the file; its records so far are counted.
    pub fn open(path: &Path) -> std::io::Result<Records<R>> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(path)?;
        let mut newest = 0;
        for line in std::io::BufReader::new(std::fs::File::open(path)?).lines() {
            if let Ok(r) = serde_json::from_str::<R>(&line?) {
                newest = newest.max(r.seq());
            }
        }
        Ok(Records {
            path: path.to_path_buf(),
            file: Mutex::new(file),
            newest: tokio::sync::watch::channel(newest).0,
            kind: PhantomData,
        })
    }

    /// Numbers and appends one record; returns its number (0 if it could
    /// not be written, which is logged).
    pub fn append(&self, mut r: R) -> u64 {
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        r.set_seq(*self.newest.borrow() + 1);
        let Ok(line) = serde_json::to_string(&r) else {
            return 0;
        };
        match writeln!(f, "{line}") {
            Ok(()) => {
                self.newest.send_replace(r.seq());
                r.seq()
            }
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "cannot append a record");
                0
            }
        }
    }

    /// The records after `after` that `keep`, oldest first, at most
    /// `limit` of them.
    pub fn page(
        &self,
        after: u64,
        limit: usize,
        keep: impl Fn(&R) -> bool,
    ) -> std::io::Result<Page<R>> {
        let mut records = Vec::new();
        let mut next_cursor = after;
        let newest = *self.newest.borrow();
        for line in std::io::BufReader::new(std::fs::File::open(&self.path)?).lines() {
            let Ok(r) = serde_json::from_str::<R>(&line?) else {
                continue;
            };
            if r.seq() <= after || r.seq() > newest {
                continue;
            }
            if records.len() == limit {
                break;
            }
            next_cursor = r.seq();
            if keep(&r) {
                records.push(r);
            }
        }
        Ok(Page {
            records,
            next_cursor,
        })
    }

    /// Waits until a record newer than `seq` exists, or `timeout` passes.
    pub async fn wait_newer(&self, seq: u64, timeout: Duration) {
        let mut rx = self.newest.subscribe();
        let _ = tokio::time::timeout(timeout, rx.wait_for(|n| *n > seq)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Line {
        seq: u64,
        who: String,
    }

    impl Numbered for Line {
        fn seq(&self) -> u64 {
            self.seq
        }
        fn set_seq(&mut self, seq: u64) {
            self.seq = seq;
        }
    }

    fn line(who: &str) -> Line {
        Line {
            seq: 0,
            who: who.into(),
        }
    }

    #[test]
    fn records_are_numbered_across_reopening_and_paged() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("r.log");
        let r = Records::<Line>::open(&p).unwrap();
        assert_eq!(r.append(line("a")), 1);
        assert_eq!(r.append(line("b")), 2);
        drop(r);
        let r = Records::<Line>::open(&p).unwrap();
        assert_eq!(r.append(line("a")), 3);
        let page = r.page(0, 1, |l| l.who == "a").unwrap();
        assert_eq!(page.records.len(), 1);
        assert_eq!(page.next_cursor, 1);
        let page = r.page(1, 10, |l| l.who == "a").unwrap();
        assert_eq!(page.records[0].seq, 3);
        assert_eq!(page.next_cursor, 3);
    }
}
