//! The index's file, as redb's storage: a file that never gets shorter.
//!
//! redb trims the free pages at its file's end (at commits, and at close)
//! with a `set_len` to a smaller size. On Btrfs a truncate frees every
//! extent past the new end, and with them the room the store keeps
//! allocated there for a full filesystem ([`crate::reserve`]): a store
//! restarted while an agent had filled the disk then found its index with
//! no room, and checkpoints, rollbacks and even the deletes that would free
//! space failed. Here a shorter length is only remembered: the file keeps
//! its blocks (and the room past them), reads and writes past the length
//! redb asked for are refused, and a later growth over the kept blocks
//! zeroes them first, as a fresh extension would be. Opened again, the
//! file's length is what redb finds: longer than its header says after a
//! trim, which redb takes as a file extended after its last commit (its
//! layout is recomputed from the length, the pages past the old end free).

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};
use std::fs::File;
use std::io;
use std::ops::Bound;
use std::os::unix::fs::FileExt;
use std::sync::Mutex;

/// `Database::create(path)` on a [`KeptFile`]: the index's, and the
/// process tracker's events (`state/events.redb`), whose room past its end
/// a trim at close freed alike.
pub fn create(path: &std::path::Path) -> Result<redb::Database, redb::DatabaseError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .and_then(KeptFile::new)
        .map_err(|e| redb::DatabaseError::Storage(redb::StorageError::Io(e)))?;
    redb::Builder::new().create_with_backend(file)
}

/// redb's file storage, with `set_len` never shortening the file.
#[derive(Debug)]
pub struct KeptFile {
    inner: FileBackend,
    /// The same file, for its length and for zeroing kept blocks.
    file: File,
    /// The length redb asked for last (the file's own at open).
    len: Mutex<u64>,
}

impl KeptFile {
    pub fn new(file: File) -> io::Result<KeptFile> {
        let len = file.metadata()?.len();
        let own = file.try_clone()?;
        let inner = FileBackend::new(file).map_err(io::Error::other)?;
        Ok(KeptFile {
            inner,
            file: own,
            len: Mutex::new(len),
        })
    }

    fn len_now(&self) -> u64 {
        *self.len.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn past_end(offset: u64, n: usize, len: u64) -> Option<io::Error> {
        (offset.saturating_add(n as u64) > len).then(|| {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("bytes {offset}+{n} are past the index's end {len}"),
            )
        })
    }
}

impl StorageBackend for KeptFile {
    fn len(&self) -> Result<u64, io::Error> {
        Ok(self.len_now())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        if let Some(e) = Self::past_end(offset, out.len(), self.len_now()) {
            return Err(e);
        }
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        let mut now = self.len.lock().unwrap_or_else(|p| p.into_inner());
        if len > *now {
            // The kept blocks between the old length and the new one (up
            // to the file's end) hold what was there before a trim: zeroed,
            // as new positions must be. Past the file's end the extension
            // gives zeroes itself.
            let file_len = self.file.metadata()?.len();
            let kept_end = len.min(file_len);
            static ZEROES: [u8; 64 * 1024] = [0; 64 * 1024];
            let mut at = *now;
            while at < kept_end {
                let n = (kept_end - at).min(ZEROES.len() as u64) as usize;
                self.file.write_all_at(&ZEROES[..n], at)?;
                at += n as u64;
            }
            if len > file_len {
                self.inner.set_len(len)?;
            }
        }
        *now = len;
        Ok(())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        self.inner.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        if let Some(e) = Self::past_end(offset, data.len(), self.len_now()) {
            return Err(e);
        }
        self.inner.write(offset, data)
    }

    fn close(&self) -> Result<(), io::Error> {
        self.inner.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}

#[cfg(test)]
mod tests {
    use super::KeptFile;
    use redb::{ReadableDatabase, ReadableTable, TableDefinition};

    const T: TableDefinition<u64, &[u8]> = TableDefinition::new("t");

    fn open(path: &std::path::Path) -> redb::Database {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .unwrap();
        redb::Builder::new()
            .create_with_backend(KeptFile::new(f).unwrap())
            .unwrap()
    }

    fn put(db: &redb::Database, keys: std::ops::Range<u64>, byte: u8) {
        let w = db.begin_write().unwrap();
        {
            let mut t = w.open_table(T).unwrap();
            for k in keys {
                t.insert(k, [byte; 1000].as_slice()).unwrap();
            }
        }
        w.commit().unwrap();
    }

    fn remove(db: &redb::Database, keys: std::ops::Range<u64>) {
        let w = db.begin_write().unwrap();
        {
            let mut t = w.open_table(T).unwrap();
            for k in keys {
                t.remove(k).unwrap();
            }
        }
        w.commit().unwrap();
    }

    fn all(db: &redb::Database) -> Vec<(u64, u8)> {
        let r = db.begin_read().unwrap();
        let t = r.open_table(T).unwrap();
        t.iter()
            .unwrap()
            .map(|e| {
                let (k, v) = e.unwrap();
                assert!(v.value().iter().all(|b| *b == v.value()[0]));
                (k.value(), v.value()[0])
            })
            .collect()
    }

    /// Grown, emptied (which trims redb's file), closed and opened again,
    /// several times: the file never gets shorter, and the database holds
    /// exactly what was written, whole, each time.
    #[test]
    fn the_file_never_gets_shorter_and_the_database_stays_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("index.redb");
        let mut longest = 0;
        for round in 0..4u8 {
            let db = open(&path);
            let kept: Vec<(u64, u8)> = (0..10).map(|k| (k, round.max(1) - 1)).collect();
            if round > 0 {
                assert_eq!(all(&db), kept, "round {round}");
            }
            put(&db, 0..5_000, round);
            let grown = std::fs::metadata(&path).unwrap().len();
            assert!(grown >= longest, "round {round}: {grown} < {longest}");
            longest = grown;
            remove(&db, 10..5_000);
            assert_eq!(std::fs::metadata(&path).unwrap().len(), longest);
            assert_eq!(all(&db).len(), 10);
            drop(db);
            // Closing trims redb's file: this one keeps its length.
            assert_eq!(
                std::fs::metadata(&path).unwrap().len(),
                longest,
                "round {round}"
            );
        }
        // A plain redb file shrinks where this one does not (the control).
        let plain = dir.path().join("plain.redb");
        let db = redb::Database::create(&plain).unwrap();
        put(&db, 0..5_000, 1);
        let grown = std::fs::metadata(&plain).unwrap().len();
        remove(&db, 10..5_000);
        drop(db);
        assert!(std::fs::metadata(&plain).unwrap().len() < grown);
    }
}
