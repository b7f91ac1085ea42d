//! The index of agents, sessions and checkpoints, kept in a redb database
//! in `state/` (crash-safe, copy-on-write, checksummed commits).
//!
//! Keys are IDs joined with `/` (which no ID contains): `agent`,
//! `agent/session`, `agent/session/checkpoint`, so a prefix range lists one
//! agent's sessions or one session's checkpoints. Values are postcard.
//! The `journal` table is the write-ahead journal (see `crate::journal`).

use crate::journal::{Entry, Op, Stage};
pub use crate::rows::{
    AgentRecord, CheckpointRecord, ClockRecord, DepartedRecord, ForkRecord, LimitsRecord,
    NetworkRecord, PolicyRecord, SessionRecord, TurnRecord,
};
use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction,
};
use serde::{de::DeserializeOwned, Serialize};
use std::path::Path;
use thiserror::Error;

const AGENTS: TableDefinition<&str, &[u8]> = TableDefinition::new("agents");
const SESSIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("sessions");
const CHECKPOINTS: TableDefinition<&str, &[u8]> = TableDefinition::new("checkpoints");
const JOURNAL: TableDefinition<u64, &[u8]> = TableDefinition::new("journal");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const POLICY: TableDefinition<&str, &[u8]> = TableDefinition::new("policy");
const TURNS: TableDefinition<&str, &[u8]> = TableDefinition::new("turns");
const NETWORK: TableDefinition<&str, &[u8]> = TableDefinition::new("network");
const FORKS: TableDefinition<&str, &[u8]> = TableDefinition::new("forks");
const CLOCKS: TableDefinition<&str, &[u8]> = TableDefinition::new("clocks");
const DEPARTED: TableDefinition<&str, &[u8]> = TableDefinition::new("departed");
const LIMITS: TableDefinition<&str, &[u8]> = TableDefinition::new("limits");

#[derive(Debug, Error)]
pub enum IndexError {
    #[error("index database")]
    Db(#[from] redb::Error),
    #[error("index database is closed after an I/O error and could not be reopened")]
    Closed,
    #[error("index record for {key} is unreadable")]
    Decode {
        key: String,
        #[source]
        source: postcard::Error,
    },
}

impl IndexError {
    /// The OS error behind this failure, if any.
    pub fn os_error(&self) -> Option<&std::io::Error> {
        match self {
            IndexError::Db(redb::Error::Io(e)) => Some(e),
            _ => None,
        }
    }

    /// Whether the database must be reopened before it works again (redb
    /// refuses everything after an I/O error, such as a full disk).
    pub fn needs_reopen(&self) -> bool {
        matches!(
            self,
            IndexError::Db(redb::Error::Io(_)) | IndexError::Db(redb::Error::PreviousIo)
        )
    }
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for IndexError {
            fn from(e: $t) -> Self { IndexError::Db(e.into()) }
        }
    )*};
}
from_redb!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError
);

fn enc<T: Serialize>(v: &T) -> Vec<u8> {
    // Serializing these plain structs into a Vec cannot fail.
    postcard::to_stdvec(v).unwrap_or_default()
}

fn dec<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, IndexError> {
    postcard::from_bytes(bytes).map_err(|source| IndexError::Decode {
        key: key.to_string(),
        source,
    })
}

fn get_from<T: DeserializeOwned>(
    t: &impl ReadableTable<&'static str, &'static [u8]>,
    key: &str,
) -> Result<Option<T>, IndexError> {
    t.get(key)?.map(|g| dec(key, g.value())).transpose()
}

/// Records under `prefix/` (or all), named by their last key component.
fn list_from<T: DeserializeOwned>(
    t: &impl ReadableTable<&'static str, &'static [u8]>,
    prefix: Option<&str>,
) -> Result<Vec<(String, T)>, IndexError> {
    let mut out = Vec::new();
    let mut push = |k: &str, v: &[u8]| -> Result<(), IndexError> {
        let name = k.rsplit('/').next().unwrap_or(k).to_string();
        out.push((name, dec(k, v)?));
        Ok(())
    };
    match prefix {
        Some(p) => {
            let (lo, hi) = under(p);
            for item in t.range(lo.as_str()..hi.as_str())? {
                let (k, v) = item?;
                push(k.value(), v.value())?;
            }
        }
        None => {
            for item in t.iter()? {
                let (k, v) = item?;
                push(k.value(), v.value())?;
            }
        }
    }
    Ok(out)
}

/// The key range of everything under `prefix/`.
fn under(prefix: &str) -> (String, String) {
    (format!("{prefix}/"), format!("{prefix}0"))
}

/// A session's key (sessions and per-session policies): `agent/session`.
pub fn session_key(a: &str, s: &str) -> String {
    format!("{a}/{s}")
}

/// The key of one item of a session (a checkpoint, a turn):
/// `agent/session/item`, so that [`session_key`] is a prefix of its range.
pub fn session_item_key(a: &str, s: &str, item: &str) -> String {
    format!("{a}/{s}/{item}")
}

pub struct Index {
    path: std::path::PathBuf,
    db: std::sync::RwLock<Option<Database>>,
}

impl Index {
    pub fn open(path: &Path) -> Result<Index, IndexError> {
        let db = Self::open_db(path)?;
        Ok(Index {
            path: path.to_path_buf(),
            db: std::sync::RwLock::new(Some(db)),
        })
    }

    fn open_db(path: &Path) -> Result<Database, IndexError> {
        // As `Database::create`, on a file that is never made shorter: the
        // room kept past its end stays ([`crate::kept_file`]).
        let db = crate::kept_file::create(path)?;
        let mut w = db.begin_write()?;
        // Creating the tables need not be durable by itself: lost, they are
        // made again at the next open, and every later durable commit
        // carries them.
        let _ = w.set_durability(redb::Durability::None);
        {
            w.open_table(AGENTS)?;
            w.open_table(SESSIONS)?;
            w.open_table(CHECKPOINTS)?;
            w.open_table(JOURNAL)?;
            w.open_table(META)?;
            w.open_table(POLICY)?;
            w.open_table(TURNS)?;
            w.open_table(NETWORK)?;
            w.open_table(FORKS)?;
            w.open_table(CLOCKS)?;
            w.open_table(DEPARTED)?;
            w.open_table(LIMITS)?;
        }
        w.commit()?;
        Ok(db)
    }

    /// An index that could not be opened: every read and write fails with
    /// [`IndexError::Closed`] until a [`Index::reopen`] succeeds.
    pub fn closed(path: &Path) -> Index {
        Index {
            path: path.to_path_buf(),
            db: std::sync::RwLock::new(None),
        }
    }

    /// Closes and reopens the database (after an I/O error).
    pub fn reopen(&self) -> Result<(), IndexError> {
        let mut g = self.db.write().unwrap_or_else(|p| p.into_inner());
        drop(g.take());
        *g = Some(Self::open_db(&self.path)?);
        Ok(())
    }

    fn with_db<T>(
        &self,
        f: impl FnOnce(&Database) -> Result<T, IndexError>,
    ) -> Result<T, IndexError> {
        let g = self.db.read().unwrap_or_else(|p| p.into_inner());
        match g.as_ref() {
            Some(db) => f(db),
            None => Err(IndexError::Closed),
        }
    }

    fn get<T: DeserializeOwned>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        key: &str,
    ) -> Result<Option<T>, IndexError> {
        self.with_db(|db| get_from(&db.begin_read()?.open_table(table)?, key))
    }

    fn list<T: DeserializeOwned>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        prefix: Option<&str>,
    ) -> Result<Vec<(String, T)>, IndexError> {
        self.with_db(|db| list_from(&db.begin_read()?.open_table(table)?, prefix))
    }

    pub fn agent(&self, a: &str) -> Result<Option<AgentRecord>, IndexError> {
        self.get(AGENTS, a)
    }
    pub fn agents(&self) -> Result<Vec<(String, AgentRecord)>, IndexError> {
        self.list(AGENTS, None)
    }
    pub fn session(&self, a: &str, s: &str) -> Result<Option<SessionRecord>, IndexError> {
        self.get(SESSIONS, &session_key(a, s))
    }
    pub fn sessions(&self, a: &str) -> Result<Vec<(String, SessionRecord)>, IndexError> {
        let mut v: Vec<(String, SessionRecord)> = self.list(SESSIONS, Some(a))?;
        // A prefix range over "a/" also holds "a/s" only: sessions have one
        // slash, so nothing else matches here.
        v.sort_by(|x, y| (x.1.created_ms, &x.0).cmp(&(y.1.created_ms, &y.0)));
        Ok(v)
    }
    pub fn checkpoint(
        &self,
        a: &str,
        s: &str,
        c: &str,
    ) -> Result<Option<CheckpointRecord>, IndexError> {
        self.get(CHECKPOINTS, &session_item_key(a, s, c))
    }
    /// Session `a/s`'s deleted trees, by uuid (hex).
    pub fn departed(&self, a: &str, s: &str) -> Result<Vec<(String, DepartedRecord)>, IndexError> {
        self.list(DEPARTED, Some(&session_key(a, s)))
    }

    /// A session's checkpoints, oldest first.
    pub fn checkpoints(
        &self,
        a: &str,
        s: &str,
    ) -> Result<Vec<(String, CheckpointRecord)>, IndexError> {
        let mut v: Vec<(String, CheckpointRecord)> =
            self.list(CHECKPOINTS, Some(&session_key(a, s)))?;
        v.sort_by_key(|(_, r)| r.seq);
        Ok(v)
    }
    pub fn policy(&self, key: &str) -> Result<Option<PolicyRecord>, IndexError> {
        self.get(POLICY, key)
    }
    pub fn turn(&self, a: &str, s: &str, t: &str) -> Result<Option<TurnRecord>, IndexError> {
        self.get(TURNS, &session_item_key(a, s, t))
    }
    pub fn network(&self, key: &str) -> Result<Option<NetworkRecord>, IndexError> {
        self.get(NETWORK, key)
    }
    /// Session `a/s`'s limits over time, if it has any.
    pub fn clock(&self, a: &str, s: &str) -> Result<Option<ClockRecord>, IndexError> {
        self.get(CLOCKS, &session_key(a, s))
    }
    /// Agent `a`'s defaults for its sessions' limits over time.
    pub fn agent_clock(&self, a: &str) -> Result<Option<ClockRecord>, IndexError> {
        self.get(CLOCKS, a)
    }
    /// Every session's own cgroup limits: `(agent/session, record)`, of
    /// sessions that exist.
    pub fn all_limits(&self) -> Result<Vec<(String, LimitsRecord)>, IndexError> {
        self.of_sessions(LIMITS)
    }
    /// Every session with limits over time: `(agent/session, record)`,
    /// and the agents' defaults (`agent`, record). A session's record
    /// left by a creation that failed (written in its Begin) is not
    /// listed: the session does not exist.
    pub fn clocks(&self) -> Result<Vec<(String, ClockRecord)>, IndexError> {
        self.of_sessions(CLOCKS)
    }
    /// `table`'s records of sessions that exist (`agent/session`), and of
    /// agents (keys without a `/`).
    fn of_sessions<T: DeserializeOwned>(
        &self,
        table: TableDefinition<&str, &[u8]>,
    ) -> Result<Vec<(String, T)>, IndexError> {
        self.with_db(|db| {
            let tx = db.begin_read()?;
            let (t, sessions) = (tx.open_table(table)?, tx.open_table(SESSIONS)?);
            let mut out = Vec::new();
            for item in t.iter()? {
                let (k, v) = item?;
                let key = k.value();
                if key.contains('/') && sessions.get(key)?.is_none() {
                    continue;
                }
                out.push((key.to_string(), dec(key, v.value())?));
            }
            Ok(out)
        })
    }
    /// Where session `a/s` was forked from, if it was.
    pub fn fork(&self, a: &str, s: &str) -> Result<Option<ForkRecord>, IndexError> {
        self.get(FORKS, &session_key(a, s))
    }
    /// A session's turns, in order.
    pub fn turns(&self, a: &str, s: &str) -> Result<Vec<(String, TurnRecord)>, IndexError> {
        let mut v: Vec<(String, TurnRecord)> = self.list(TURNS, Some(&session_key(a, s)))?;
        v.sort_by_key(|(_, r)| r.number);
        Ok(v)
    }

    /// Journal entries still open, oldest first.
    pub fn pending(&self) -> Result<Vec<(u64, Entry)>, IndexError> {
        self.with_db(|db| {
            let r = db.begin_read()?;
            let t = r.open_table(JOURNAL)?;
            let mut out = Vec::new();
            for item in t.iter()? {
                let (k, v) = item?;
                let id = k.value();
                out.push((id, dec(&format!("journal/{id}"), v.value())?));
            }
            Ok(out)
        })
    }

    /// Runs `f` in one write transaction and commits it durably.
    pub fn write<T>(
        &self,
        f: impl FnOnce(&mut Writer<'_>) -> Result<T, IndexError>,
    ) -> Result<T, IndexError> {
        self.commit(true, f)
    }

    /// Like [`Index::write`], without waiting for the disk: the commit is
    /// atomic and ordered, and becomes durable with the next durable one.
    pub fn write_quick<T>(
        &self,
        f: impl FnOnce(&mut Writer<'_>) -> Result<T, IndexError>,
    ) -> Result<T, IndexError> {
        self.commit(false, f)
    }

    fn commit<T>(
        &self,
        durable: bool,
        f: impl FnOnce(&mut Writer<'_>) -> Result<T, IndexError>,
    ) -> Result<T, IndexError> {
        self.with_db(|db| {
            let mut tx = db.begin_write()?;
            if !durable {
                tx.set_durability(Durability::None)?;
            }
            let out = {
                let mut w = Writer { tx: &tx };
                f(&mut w)?
            };
            tx.commit()?;
            Ok(out)
        })
    }

    /// Journal Begin: builds the operation (which may take counters from
    /// the index) and commits it durably.
    pub fn begin(
        &self,
        op_id: u64,
        build: impl FnOnce(&mut Writer<'_>) -> Result<Op, IndexError>,
    ) -> Result<Op, IndexError> {
        self.write(|w| {
            let op = build(w)?;
            w.journal_put(
                op_id,
                &Entry {
                    op: op.clone(),
                    stage: Stage::Begun,
                },
            )?;
            Ok(op)
        })
    }
}

/// Changes inside one index transaction.
pub struct Writer<'a> {
    tx: &'a WriteTransaction,
}

impl Writer<'_> {
    fn put<T: Serialize>(
        &mut self,
        table: TableDefinition<&str, &[u8]>,
        key: &str,
        v: &T,
    ) -> Result<(), IndexError> {
        self.tx.open_table(table)?.insert(key, enc(v).as_slice())?;
        Ok(())
    }

    fn remove_under(
        &mut self,
        table: TableDefinition<&str, &[u8]>,
        prefix: &str,
    ) -> Result<(), IndexError> {
        let (lo, hi) = under(prefix);
        let mut t = self.tx.open_table(table)?;
        t.retain_in(lo.as_str()..hi.as_str(), |_, _| false)?;
        Ok(())
    }

    pub fn put_agent(&mut self, a: &str, r: &AgentRecord) -> Result<(), IndexError> {
        self.put(AGENTS, a, r)
    }
    /// Removes an agent with all its sessions, checkpoints, turns and
    /// policies.
    pub fn remove_agent(&mut self, a: &str) -> Result<(), IndexError> {
        self.tx.open_table(AGENTS)?.remove(a)?;
        self.tx.open_table(POLICY)?.remove(a)?;
        self.tx.open_table(NETWORK)?.remove(a)?;
        self.remove_under(SESSIONS, a)?;
        self.remove_under(POLICY, a)?;
        self.remove_under(NETWORK, a)?;
        self.remove_under(FORKS, a)?;
        self.remove_under(CLOCKS, a)?;
        self.tx.open_table(CLOCKS)?.remove(a)?;
        self.remove_under(TURNS, a)?;
        self.remove_under(DEPARTED, a)?;
        self.remove_under(LIMITS, a)?;
        self.remove_under(CHECKPOINTS, a)
    }
    pub fn put_policy(&mut self, key: &str, r: &PolicyRecord) -> Result<(), IndexError> {
        self.put(POLICY, key, r)
    }
    pub fn put_network(&mut self, key: &str, r: &NetworkRecord) -> Result<(), IndexError> {
        self.put(NETWORK, key, r)
    }
    pub fn remove_policy(&mut self, key: &str) -> Result<(), IndexError> {
        self.tx.open_table(POLICY)?.remove(key)?;
        Ok(())
    }
    pub fn remove_network(&mut self, key: &str) -> Result<(), IndexError> {
        self.tx.open_table(NETWORK)?.remove(key)?;
        Ok(())
    }
    pub fn put_turn(
        &mut self,
        a: &str,
        s: &str,
        t: &str,
        r: &TurnRecord,
    ) -> Result<(), IndexError> {
        self.put(TURNS, &session_item_key(a, s, t), r)
    }
    pub fn remove_turn(&mut self, a: &str, s: &str, t: &str) -> Result<(), IndexError> {
        self.tx
            .open_table(TURNS)?
            .remove(session_item_key(a, s, t).as_str())?;
        Ok(())
    }
    pub fn put_agent_clock(&mut self, a: &str, r: &ClockRecord) -> Result<(), IndexError> {
        self.put(CLOCKS, a, r)
    }
    pub fn put_clock(&mut self, a: &str, s: &str, r: &ClockRecord) -> Result<(), IndexError> {
        self.put(CLOCKS, &session_key(a, s), r)
    }
    pub fn remove_clock(&mut self, a: &str, s: &str) -> Result<(), IndexError> {
        self.tx
            .open_table(CLOCKS)?
            .remove(session_key(a, s).as_str())?;
        Ok(())
    }
    /// Keeps session `a/s`'s own cgroup limits (none: forgets them).
    pub fn put_limits(
        &mut self,
        a: &str,
        s: &str,
        r: Option<&LimitsRecord>,
    ) -> Result<(), IndexError> {
        match r {
            Some(r) => self.put(LIMITS, &session_key(a, s), r),
            None => {
                self.tx
                    .open_table(LIMITS)?
                    .remove(session_key(a, s).as_str())?;
                Ok(())
            }
        }
    }
    pub fn put_fork(&mut self, a: &str, s: &str, r: &ForkRecord) -> Result<(), IndexError> {
        self.put(FORKS, &session_key(a, s), r)
    }
    pub fn put_session(&mut self, a: &str, s: &str, r: &SessionRecord) -> Result<(), IndexError> {
        self.put(SESSIONS, &session_key(a, s), r)
    }
    /// Removes a session with all its checkpoints, turns and policy.
    pub fn remove_session(&mut self, a: &str, s: &str) -> Result<(), IndexError> {
        let k = session_key(a, s);
        self.tx.open_table(SESSIONS)?.remove(k.as_str())?;
        self.tx.open_table(POLICY)?.remove(k.as_str())?;
        self.tx.open_table(NETWORK)?.remove(k.as_str())?;
        self.tx.open_table(FORKS)?.remove(k.as_str())?;
        self.tx.open_table(CLOCKS)?.remove(k.as_str())?;
        self.tx.open_table(LIMITS)?.remove(k.as_str())?;
        self.remove_under(TURNS, &k)?;
        self.remove_under(DEPARTED, &k)?;
        self.remove_under(CHECKPOINTS, &k)
    }
    /// Keeps the lineage of session `a/s`'s deleted tree `uuid` (hex).
    pub fn put_departed(
        &mut self,
        a: &str,
        s: &str,
        uuid: &str,
        r: &DepartedRecord,
    ) -> Result<(), IndexError> {
        self.put(DEPARTED, &session_item_key(a, s, uuid), r)
    }
    /// Forgets the lineage of session `a/s`'s deleted tree `uuid` (hex).
    pub fn remove_departed(&mut self, a: &str, s: &str, uuid: &str) -> Result<(), IndexError> {
        self.tx
            .open_table(DEPARTED)?
            .remove(session_item_key(a, s, uuid).as_str())?;
        Ok(())
    }
    pub fn put_checkpoint(
        &mut self,
        a: &str,
        s: &str,
        c: &str,
        r: &CheckpointRecord,
    ) -> Result<(), IndexError> {
        self.put(CHECKPOINTS, &session_item_key(a, s, c), r)
    }
    pub fn remove_checkpoint(&mut self, a: &str, s: &str, c: &str) -> Result<(), IndexError> {
        self.tx
            .open_table(CHECKPOINTS)?
            .remove(session_item_key(a, s, c).as_str())?;
        Ok(())
    }
    pub fn journal_put(&mut self, op_id: u64, e: &Entry) -> Result<(), IndexError> {
        self.tx
            .open_table(JOURNAL)?
            .insert(op_id, enc(e).as_slice())?;
        Ok(())
    }
    pub fn journal_remove(&mut self, op_id: u64) -> Result<(), IndexError> {
        self.tx.open_table(JOURNAL)?.remove(op_id)?;
        Ok(())
    }
    fn get<T: DeserializeOwned>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        key: &str,
    ) -> Result<Option<T>, IndexError> {
        get_from(&self.tx.open_table(table)?, key)
    }
    pub fn session(&self, a: &str, s: &str) -> Result<Option<SessionRecord>, IndexError> {
        self.get(SESSIONS, &session_key(a, s))
    }
    pub fn clock(&self, a: &str, s: &str) -> Result<Option<ClockRecord>, IndexError> {
        self.get(CLOCKS, &session_key(a, s))
    }
    pub fn turn(&self, a: &str, s: &str, t: &str) -> Result<Option<TurnRecord>, IndexError> {
        self.get(TURNS, &session_item_key(a, s, t))
    }
    pub fn checkpoint(
        &self,
        a: &str,
        s: &str,
        c: &str,
    ) -> Result<Option<CheckpointRecord>, IndexError> {
        self.get(CHECKPOINTS, &session_item_key(a, s, c))
    }
    /// A session's checkpoints, in key order.
    pub fn checkpoints(
        &self,
        a: &str,
        s: &str,
    ) -> Result<Vec<(String, CheckpointRecord)>, IndexError> {
        list_from(&self.tx.open_table(CHECKPOINTS)?, Some(&session_key(a, s)))
    }
    /// The next value of a store-wide counter.
    pub fn next_seq(&mut self, name: &str) -> Result<u64, IndexError> {
        let mut t = self.tx.open_table(META)?;
        let n = t.get(name)?.map(|g| g.value()).unwrap_or(0) + 1;
        t.insert(name, n)?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allox_protocol::Origin;

    fn ck(seq: u64, parent: Option<&str>) -> CheckpointRecord {
        CheckpointRecord {
            created_ms: 1,
            seq,
            parent: parent.map(String::from),
            origin: Origin::Manual,
            pinned: false,
            label: None,
            turn_id: None,
        }
    }

    #[test]
    fn prefix_listing_is_exact() {
        let dir = tempfile::tempdir().unwrap();
        let ix = Index::open(&dir.path().join("index.redb")).unwrap();
        ix.write(|w| {
            for a in ["a", "a-b", "a.b", "ab"] {
                w.put_agent(a, &AgentRecord { created_ms: 1 })?;
                w.put_session(
                    a,
                    "s",
                    &SessionRecord {
                        created_ms: 1,
                        head: None,
                    },
                )?;
                w.put_checkpoint(a, "s", "c2", &ck(2, Some("c1")))?;
                w.put_checkpoint(a, "s", "c1", &ck(1, None))?;
            }
            w.put_session(
                "a",
                "s2",
                &SessionRecord {
                    created_ms: 2,
                    head: None,
                },
            )?;
            w.journal_put(
                7,
                &Entry {
                    op: Op::AgentDelete {
                        agent: "a".into(),
                        subvolume: 256,
                    },
                    stage: Stage::Begun,
                },
            )
        })
        .unwrap();
        assert_eq!(ix.agents().unwrap().len(), 4);
        let s: Vec<String> = ix.sessions("a").unwrap().into_iter().map(|x| x.0).collect();
        assert_eq!(s, ["s", "s2"]);
        let c: Vec<String> = ix
            .checkpoints("a", "s")
            .unwrap()
            .into_iter()
            .map(|x| x.0)
            .collect();
        assert_eq!(c, ["c1", "c2"]);
        assert_eq!(ix.pending().unwrap().len(), 1);
        ix.write_quick(|w| w.journal_remove(7)).unwrap();
        assert!(ix.pending().unwrap().is_empty());
        ix.write(|w| w.remove_agent("a")).unwrap();
        assert!(ix.agent("a").unwrap().is_none());
        assert!(ix.sessions("a").unwrap().is_empty());
        assert!(ix.checkpoints("a", "s").unwrap().is_empty());
        assert_eq!(ix.checkpoints("a-b", "s").unwrap().len(), 2);
        assert_eq!(ix.sessions("ab").unwrap().len(), 1);
    }

    #[test]
    fn failed_transaction_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let ix = Index::open(&dir.path().join("index.redb")).unwrap();
        let r: Result<(), IndexError> = ix.write(|w| {
            w.put_agent("a", &AgentRecord { created_ms: 1 })?;
            Err(IndexError::Decode {
                key: "x".into(),
                source: postcard::Error::DeserializeUnexpectedEnd,
            })
        });
        assert!(r.is_err());
        assert!(ix.agent("a").unwrap().is_none());
    }
}
