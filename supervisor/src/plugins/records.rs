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
    file: Mutex<Appender>,
    /// The newest record's number, for followers to wait on.
    newest: tokio::sync::watch::Sender<u64>,
    kind: PhantomData<fn(R) -> R>,
}

/// The file appended to, with how many records it holds and how many it
/// may hold.
struct Appender {
    file: std::fs::File,
    lines: u64,
    /// Once `lines` passes half again this, the oldest go until `max` are
    /// left (`None`: unbounded).
    max: Option<u64>,
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
        Records::open_bounded(path, None)
    }

    /// [`Records::open`], keeping about the newest `max` records: when
    /// half as many again have come, the oldest are dropped (their
    /// numbers are not reused; a cursor before them reads on from the
    /// oldest kept).
    pub fn open_bounded(path: &Path, max: Option<u64>) -> std::io::Result<Records<R>> {
        use std::os::unix::fs::OpenOptionsExt;
        // Private to the daemon's user, as everything in state/.
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .mode(0o600)
            .append(true)
            .read(true)
            .open(path)?;
        let (mut newest, mut lines, mut torn) = (0, 0, false);
        for line in std::io::BufReader::new(std::fs::File::open(path)?).split(b'\n') {
            let line = line?;
            lines += 1;
            match serde_json::from_slice::<R>(&line) {
                Ok(r) => newest = newest.max(r.seq()),
                Err(_) => torn = true,
            }
        }
        // A power cut may have left the last line half written: it is
        // ended here, so the next record starts a line of its own (the
        // half line is skipped by every reader).
        if torn && file.metadata()?.len() > 0 {
            use std::io::{Read, Seek, SeekFrom};
            let mut last = [0u8];
            let mut r = std::fs::File::open(path)?;
            r.seek(SeekFrom::End(-1))?;
            r.read_exact(&mut last)?;
            if last[0] != b'\n' {
                file.write_all(b"\n")?;
            }
        }
        Ok(Records {
            path: path.to_path_buf(),
            file: Mutex::new(Appender {
                file,
                lines,
                max: max.map(|m| m.max(1)),
            }),
            newest: tokio::sync::watch::channel(newest).0,
            kind: PhantomData,
        })
    }

    /// Numbers and appends one record; returns its number (0 if it could
    /// not be written, which is logged).
    pub fn append(&self, r: R) -> u64 {
        self.append_all(vec![r]).map_or(0, |(first, _)| first)
    }

    /// Numbers and appends records in one write; returns the first and
    /// last numbers (`None` for none, or if they could not be written,
    /// which is logged).
    pub fn append_all(&self, rs: Vec<R>) -> Option<(u64, u64)> {
        if rs.is_empty() {
            return None;
        }
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let first = *self.newest.borrow() + 1;
        let mut buf = Vec::with_capacity(rs.len() * 256);
        let mut seq = first;
        for mut r in rs {
            r.set_seq(seq);
            if serde_json::to_writer(&mut buf, &r).is_err() {
                continue;
            }
            buf.push(b'\n');
            seq += 1;
        }
        let last = seq - 1;
        if last < first {
            return None;
        }
        if let Err(e) = f.file.write_all(&buf) {
            tracing::error!(path = %self.path.display(), error = %e, "cannot append records");
            return None;
        }
        f.lines += last - first + 1;
        self.newest.send_replace(last);
        if let Some(max) = f.max.filter(|m| f.lines > m + m / 2) {
            if let Err(e) = self.keep_newest(&mut f, max) {
                tracing::error!(path = %self.path.display(), error = %e, "cannot drop the oldest records");
            }
        }
        Some((first, last))
    }

    /// Rewrites the file with its newest `max` lines (a new file renamed
    /// over it: readers of the old one read it to its end).
    fn keep_newest(&self, f: &mut Appender, max: u64) -> std::io::Result<()> {
        let tmp = self.path.with_extension("tmp");
        let skip = f.lines.saturating_sub(max);
        {
            use std::os::unix::fs::OpenOptionsExt;
            let mut out = std::io::BufWriter::new(
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&tmp)?,
            );
            let mut input = std::io::BufReader::new(std::fs::File::open(&self.path)?);
            let mut line = Vec::new();
            let mut n = 0u64;
            loop {
                line.clear();
                if input.read_until(b'\n', &mut line)? == 0 {
                    break;
                }
                n += 1;
                if n > skip {
                    out.write_all(&line)?;
                }
            }
            out.into_inner().map_err(|e| e.into_error())?.sync_data()?;
        }
        std::fs::rename(&tmp, &self.path)?;
        f.file = std::fs::OpenOptions::new()
            .append(true)
            .read(true)
            .open(&self.path)?;
        f.lines = f.lines.min(max);
        Ok(())
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
        for line in std::io::BufReader::new(std::fs::File::open(&self.path)?).split(b'\n') {
            // A half-written line (a power cut) is skipped.
            let Ok(r) = serde_json::from_slice::<R>(&line?) else {
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

    #[test]
    fn a_half_written_last_line_is_skipped_and_ended() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("r.log");
        let r = Records::<Line>::open(&p).unwrap();
        r.append(line("a"));
        drop(r);
        // Cut in the middle of a two-byte character.
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"{\"seq\":2,\"who\":\"\xc3").unwrap();
        drop(f);
        let r = Records::<Line>::open(&p).unwrap();
        assert_eq!(r.append(line("b")), 2);
        let all = r.page(0, 100, |_| true).unwrap().records;
        assert_eq!(
            all,
            [
                Line {
                    seq: 1,
                    who: "a".into()
                },
                Line {
                    seq: 2,
                    who: "b".into()
                }
            ]
        );
    }

    #[test]
    fn a_bounded_file_drops_the_oldest_and_keeps_numbering() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("r.log");
        let r = Records::<Line>::open_bounded(&p, Some(10)).unwrap();
        for i in 0..15 {
            r.append(line(&format!("w{i}")));
        }
        // 15 is not over 10 + 5: all kept.
        assert_eq!(r.page(0, 100, |_| true).unwrap().records.len(), 15);
        assert_eq!(r.append_all(vec![line("x"), line("y")]), Some((16, 17)));
        let all = r.page(0, 100, |_| true).unwrap().records;
        let seqs: Vec<u64> = all.iter().map(|l| l.seq).collect();
        assert_eq!(seqs, (8..=17).collect::<Vec<_>>());
        drop(r);
        let r = Records::<Line>::open_bounded(&p, Some(10)).unwrap();
        assert_eq!(r.append(line("z")), 18);
        assert_eq!(r.page(3, 1, |_| true).unwrap().records[0].seq, 8);
    }
}
