//! A plugin's record file in the store's `state/` (outside every
//! workspace: no rollback touches it): one JSON line per record, numbered
//! from 1, appended as things happen and read in pages or followed. The
//! network audit and the share audit are such files.
//!
//! A file is bounded by records ([`Records::open_bounded`]: the oldest are
//! dropped) or by bytes ([`Records::open_rotating`]: past the size it is
//! renamed `NAME.1`, replacing the one before, and read through both).
//! Where records name their owner ([`Numbered::owner`]), the bytes kept
//! for each owner are counted, so that [`Records::append_admitted`] can
//! hold each to a budget.

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::HashMap;
use std::io::{BufRead, Read, Write};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

/// A record that carries its number.
pub trait Numbered: Serialize + DeserializeOwned {
    fn seq(&self) -> u64;
    fn set_seq(&mut self, seq: u64);
    /// Whom the bytes of the record are counted for (`None`: nobody).
    fn owner(&self) -> Option<String> {
        None
    }
}

/// What an append would add, for [`Records::append_admitted`] to judge.
#[derive(Debug, Clone, Copy)]
pub struct Adding {
    /// The new lines' bytes.
    pub bytes: u64,
    /// The largest new line's bytes.
    pub largest: u64,
    /// The bytes the owner's records take in the file now.
    pub kept: u64,
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
    /// The file's size.
    bytes: u64,
    /// Past this size the file is rotated (`None`: never).
    max_bytes: Option<u64>,
    /// The bytes each owner's records take.
    owners: HashMap<String, u64>,
    /// A rotation that failed (the disk full) is not tried again before.
    rotate_after: Option<std::time::Instant>,
}

/// The lines a page holds at most: its answer, encoded, fits in a frame
/// (1 MiB) whatever the `limit` asked.
pub const PAGE_BYTES: usize = 512 * 1024;

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
        Records::open_with(path, max, None)
    }

    /// [`Records::open`], rotated past `max_bytes`: renamed `NAME.1`
    /// (replacing the one before), a new file begun.
    /// The file the records are appended to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn open_rotating(path: &Path, max_bytes: Option<u64>) -> std::io::Result<Records<R>> {
        Records::open_with(path, None, max_bytes)
    }

    fn open_with(
        path: &Path,
        max: Option<u64>,
        max_bytes: Option<u64>,
    ) -> std::io::Result<Records<R>> {
        use std::os::unix::fs::OpenOptionsExt;
        // Private to the daemon's user, as everything in state/.
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .mode(0o600)
            .append(true)
            .read(true)
            .open(path)?;
        let (mut newest, mut lines, mut torn) = (0, 0, false);
        let mut owners = HashMap::new();
        for line in std::io::BufReader::new(std::fs::File::open(path)?).split(b'\n') {
            let line = line?;
            lines += 1;
            match serde_json::from_slice::<R>(&line) {
                Ok(r) => {
                    newest = newest.max(r.seq());
                    if let Some(o) = r.owner() {
                        *owners.entry(o).or_insert(0) += line.len() as u64 + 1;
                    }
                }
                Err(_) => torn = true,
            }
        }
        if newest == 0 {
            // Just rotated: the numbers go on from the rotated file's.
            if let Ok(old) = std::fs::File::open(rotated(path)) {
                for line in std::io::BufReader::new(old).split(b'\n') {
                    if let Ok(r) = serde_json::from_slice::<R>(&line?) {
                        newest = newest.max(r.seq());
                    }
                }
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
                bytes: file.metadata()?.len(),
                file,
                lines,
                max: max.map(|m| m.max(1)),
                max_bytes,
                owners,
                rotate_after: None,
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
        self.append_admitted::<()>(None, rs, |_| Ok(()))
            .unwrap_or(None)
    }

    /// [`Records::append_all`] of `owner`'s records, if `admit` lets
    /// what they would add in: all or none are written.
    pub fn append_admitted<E>(
        &self,
        owner: Option<&str>,
        rs: Vec<R>,
        admit: impl FnOnce(&Adding) -> Result<(), E>,
    ) -> Result<Option<(u64, u64)>, E> {
        if rs.is_empty() {
            return Ok(None);
        }
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let first = *self.newest.borrow() + 1;
        let mut buf = Vec::with_capacity(rs.len() * 256);
        let mut seq = first;
        let mut largest = 0;
        // Each record's owner when the caller did not name one.
        let mut each: Vec<(String, u64)> = Vec::new();
        for mut r in rs {
            r.set_seq(seq);
            let at = buf.len();
            if serde_json::to_writer(&mut buf, &r).is_err() {
                buf.truncate(at);
                continue;
            }
            buf.push(b'\n');
            let len = (buf.len() - at) as u64;
            largest = largest.max(len);
            if owner.is_none() {
                if let Some(o) = r.owner() {
                    each.push((o, len));
                }
            }
            seq += 1;
        }
        let last = seq - 1;
        if last < first {
            return Ok(None);
        }
        let bytes = buf.len() as u64;
        admit(&Adding {
            bytes,
            largest,
            kept: owner.map_or(0, |o| f.owners.get(o).copied().unwrap_or(0)),
        })?;
        let before = f.file.metadata().map(|m| m.len());
        if let Err(e) = f.file.write_all(&buf) {
            // A line cut short (the room ran out half-way) is taken back:
            // the next record would be glued onto it and lost with it.
            if let Ok(len) = before {
                let _ = f.file.set_len(len);
            }
            tracing::error!(path = %self.path.display(), error = %e, "cannot append records");
            return Ok(None);
        }
        f.lines += last - first + 1;
        f.bytes += bytes;
        match owner {
            Some(o) => match f.owners.get_mut(o) {
                Some(n) => *n += bytes,
                None => {
                    f.owners.insert(o.to_string(), bytes);
                }
            },
            None => {
                for (o, len) in each {
                    *f.owners.entry(o).or_insert(0) += len;
                }
            }
        }
        self.newest.send_replace(last);
        if let Some(max) = f.max.filter(|m| f.lines > m + m / 2) {
            if let Err(e) = self.keep_newest(&mut f, max) {
                tracing::error!(path = %self.path.display(), error = %e, "cannot drop the oldest records");
            }
        }
        let due = f
            .rotate_after
            .is_none_or(|at| std::time::Instant::now() >= at);
        if due && f.max_bytes.is_some_and(|m| f.bytes > m) {
            match self.rotate(&mut f) {
                Ok(()) => f.rotate_after = None,
                Err(e) => {
                    // Tried again in a minute, said once a minute.
                    f.rotate_after =
                        Some(std::time::Instant::now() + std::time::Duration::from_secs(60));
                    tracing::error!(
                        path = %self.path.display(), error = %e,
                        "cannot rotate the records (the new file could not get its room); the file grows past its bound meanwhile"
                    );
                }
            }
        }
        Ok(Some((first, last)))
    }

    /// The bytes `owner`'s records take in the file.
    pub fn kept(&self, owner: &str) -> u64 {
        let f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        f.owners.get(owner).copied().unwrap_or(0)
    }

    /// Renames the file `NAME.1` and begins a new one, private as the
    /// first, which gets its room first: on a full disk the file is not
    /// rotated (a new one with no room would lose every record).
    fn rotate(&self, f: &mut Appender) -> std::io::Result<()> {
        f.file = allox_store::reserve::rotate_with_room(&self.path, &rotated(&self.path), &f.file)?;
        f.lines = 0;
        f.bytes = 0;
        f.owners.clear();
        Ok(())
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
            let (mut bytes, mut owners) = (0, HashMap::new());
            loop {
                line.clear();
                if input.read_until(b'\n', &mut line)? == 0 {
                    break;
                }
                n += 1;
                if n > skip {
                    out.write_all(&line)?;
                    bytes += line.len() as u64;
                    if let Some(o) = serde_json::from_slice::<R>(&line)
                        .ok()
                        .and_then(|r| r.owner())
                    {
                        *owners.entry(o).or_insert(0) += line.len() as u64;
                    }
                }
            }
            f.bytes = bytes;
            f.owners = owners;
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
    /// `limit` of them and at most [`PAGE_BYTES`] of their lines (at least
    /// one record), so that a page always fits in one answer.
    pub fn page(
        &self,
        after: u64,
        limit: usize,
        keep: impl Fn(&R) -> bool,
    ) -> std::io::Result<Page<R>> {
        self.page_within(after, limit, PAGE_BYTES, keep)
    }

    /// [`Records::page`] with a budget of `bytes` of lines of your own.
    pub fn page_within(
        &self,
        after: u64,
        limit: usize,
        bytes: usize,
        keep: impl Fn(&R) -> bool,
    ) -> std::io::Result<Page<R>> {
        let mut kept_bytes = 0usize;
        let mut records = Vec::new();
        let mut next_cursor = after;
        let newest = *self.newest.borrow();
        // A rotated file's records come first; it is opened first, so a
        // rotation in between repeats nothing.
        let old: Box<dyn Read> = match std::fs::File::open(rotated(&self.path)) {
            Ok(f) => Box::new(f),
            Err(_) => Box::new(std::io::empty()),
        };
        let input = old.chain(std::fs::File::open(&self.path)?);
        for line in std::io::BufReader::new(input).split(b'\n') {
            // A half-written line (a power cut) is skipped.
            let line = line?;
            let Ok(r) = serde_json::from_slice::<R>(&line) else {
                continue;
            };
            if r.seq() <= after || r.seq() > newest {
                continue;
            }
            if records.len() == limit {
                break;
            }
            let k = keep(&r);
            if k && !records.is_empty() && kept_bytes + line.len() > bytes {
                break;
            }
            next_cursor = r.seq();
            if k {
                kept_bytes += line.len();
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

/// The rotated file beside `path` (`NAME.1`).
pub fn rotated(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
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
    fn a_page_of_large_records_fits_an_answer_and_the_next_goes_on() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("r.log");
        let r = Records::<Line>::open(&p).unwrap();
        // 400 records of 4 KiB: 1.6 MiB, more than a frame.
        let big = "x".repeat(4096);
        for _ in 0..400 {
            r.append(line(&big));
        }
        let mut seen = Vec::new();
        let mut cursor = 0;
        loop {
            let page = r.page(cursor, 10_000, |_| true).unwrap();
            if page.records.is_empty() {
                break;
            }
            let bytes: usize = page.records.iter().map(|l| l.who.len() + 20).sum();
            assert!(bytes <= PAGE_BYTES, "a page of {bytes} bytes");
            assert!(page.records.len() < 400, "one page held everything");
            seen.extend(page.records.iter().map(|l| l.seq));
            cursor = page.next_cursor;
        }
        assert_eq!(
            seen,
            (1..=400).collect::<Vec<_>>(),
            "a record lost or repeated"
        );
        // One record larger than the budget still comes, alone.
        let huge = "y".repeat(PAGE_BYTES + 1);
        let n = r.append(line(&huge));
        let page = r.page(cursor, 10, |_| true).unwrap();
        assert_eq!(page.records.len(), 1);
        assert_eq!(page.next_cursor, n);
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

    #[test]
    fn a_rotating_file_stays_within_two_files_and_pages_through_both() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("r.log");
        let r = Records::<Line>::open_rotating(&p, Some(1000)).unwrap();
        for i in 0..500 {
            r.append(line(&format!("w{i}")));
        }
        for f in [p.clone(), rotated(&p)] {
            let m = std::fs::metadata(&f).unwrap();
            assert!(m.len() <= 1000 + 30, "{f:?}");
            // The root's alone, the file a rotation began too.
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(m.permissions().mode() & 0o777, 0o600, "{f:?}");
        }
        let seqs: Vec<u64> = r
            .page(0, 1000, |_| true)
            .unwrap()
            .records
            .iter()
            .map(|l| l.seq)
            .collect();
        assert_eq!(*seqs.last().unwrap(), 500);
        assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1));
        // Reopened just after a rotation: numbering goes on.
        drop(r);
        std::fs::rename(&p, rotated(&p)).unwrap();
        let r = Records::<Line>::open_rotating(&p, Some(1000)).unwrap();
        assert_eq!(r.append(line("x")), 501);
    }
}
