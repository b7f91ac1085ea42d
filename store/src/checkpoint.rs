//! `checkpoint.create`, `checkpoint.list`, `checkpoint.delete`,
//! `checkpoint.pin`.

use super::{checkpoint_info, with_fork, After, Result, Store, StoreError, MAX_LABEL};
use crate::btrfs;
use crate::index::CheckpointRecord;
use crate::journal::Op;
use allox_protocol::{
    validate_id, CheckpointCreate, CheckpointInfo, CheckpointListing, Deleted, Origin,
};

/// Dirty memory past which a checkpoint writes it out before it takes the
/// store's lock ([`Store::checkpoint_create_as`]).
const DIRTY_FIRST: u64 = 32 << 20;

/// The machine's memory waiting to be written back (`Dirty:` of
/// `/proc/meminfo`).
fn dirty_bytes() -> Option<u64> {
    let m = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("Dirty:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb << 10)
}

impl Store {
    pub fn checkpoint_create(&self, p: &CheckpointCreate) -> Result<CheckpointInfo> {
        self.checkpoint_create_as(p, Origin::Manual, None)
    }

    /// Takes a read-only snapshot of `current/`; its parent is the session's
    /// head, and it becomes the new head.
    pub fn checkpoint_create_as(
        &self,
        p: &CheckpointCreate,
        origin: Origin,
        turn_id: Option<String>,
    ) -> Result<CheckpointInfo> {
        let (a, s, c) = (&*p.agent_id, &*p.session_id, &*p.checkpoint_id);
        validate_id("agent_id", a)?;
        validate_id("session_id", s)?;
        allox_protocol::validate_checkpoint_id(c)?;
        if let Some(l) = &p.label {
            if l.len() > MAX_LABEL || l.chars().any(char::is_control) {
                return Err(StoreError::BadLabel);
            }
        }
        // What the session wrote and the kernel has not written out yet is
        // written out now, before the store's lock is taken: the snapshot
        // below writes out the rest under it, and an agent that wrote
        // gigabytes before its turn's end held every other agent's changes
        // for seconds while its data went to disk.
        // Only when there is much to write (the machine's dirty memory past
        // DIRTY_FIRST): otherwise the extra commit would cost every
        // checkpoint a few milliseconds for nothing.
        if dirty_bytes().is_some_and(|n| n > DIRTY_FIRST) {
            if let Ok(d) = rustix::fs::open(
                self.layout.current(a, s),
                rustix::fs::OFlags::RDONLY
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            ) {
                let _ = rustix::fs::syncfs(&d);
            }
        }
        let _g = self.guard();
        let session = self.need_session(a, s)?;
        if self.index.checkpoint(a, s, c)?.is_some() {
            return Err(StoreError::Exists(format!("checkpoint {a}/{s}/{c}")));
        }
        self.room_for_checkpoints(a, s, 1)?;
        let dest = self.layout.checkpoint(a, s, c);
        if dest.exists() {
            return Err(StoreError::OnDiskNotIndexed(dest));
        }
        let build = |w: &mut crate::index::Writer<'_>| {
            Ok(Op::CheckpointCreate {
                agent: a.into(),
                session: s.into(),
                checkpoint: c.into(),
                record: CheckpointRecord {
                    created_ms: crate::clock::now_ms(),
                    seq: w.next_seq("checkpoint")?,
                    parent: session.head.clone(),
                    origin,
                    pinned: p.pinned,
                    label: p.label.clone(),
                    turn_id: turn_id.clone(),
                },
            })
        };
        // No free-space check: a snapshot adds metadata only, and the index
        // and audit log keep their own room (`crate::reserve`), so a session
        // that filled the filesystem does not stop checkpoints.
        //
        // No commit is needed before the answer: the snapshot ioctl commits
        // the filesystem's transaction itself, so once it returns the
        // durable Begin and the snapshot make recovery finish this
        // operation even if the End commit below is lost.
        let rec = self.journaled(build, |op_id, op| {
            self.crash_point("checkpoint_create.after_journal");
            self.snapshot_current(a, s, &dest, true)?;
            self.crash_point("checkpoint_create.after_snapshot");
            self.end(op_id, op, &After::Nothing)?;
            self.crash_point("checkpoint_create.after_commit");
            let Op::CheckpointCreate { record, .. } = op else {
                unreachable!("built above")
            };
            Ok((record.clone(), After::Nothing))
        })?;
        Ok(checkpoint_info(a, s, c, &rec))
    }

    pub fn checkpoint_list(&self, a: &str, s: &str) -> Result<CheckpointListing> {
        let session = self.need_session(a, s)?;
        let fork = self.index.fork(a, s)?;
        let checkpoints = self
            .index
            .checkpoints(a, s)?
            .iter()
            .map(|(c, r)| with_fork(checkpoint_info(a, s, c, r), fork.as_ref()))
            .collect();
        Ok(CheckpointListing {
            agent_id: a.to_string(),
            session_id: s.to_string(),
            head: session.head,
            checkpoints,
        })
    }

    /// Deletes an unpinned checkpoint. Its children take its parent, and if
    /// `current/` descended from it, the head moves to its parent too, so
    /// the DAG stays connected.
    pub fn checkpoint_delete(&self, a: &str, s: &str, c: &str) -> Result<Deleted> {
        let _g = self.guard();
        let rec = self.need_checkpoint(a, s, c)?;
        if rec.pinned {
            return Err(StoreError::CheckpointPinned {
                agent: a.into(),
                session: s.into(),
                checkpoint: c.into(),
            });
        }
        let subvolume = btrfs::subvolume_id(&self.layout.checkpoint(a, s, c))?;
        // Where it descends from, kept once it is deleted (a tree rolled
        // back to it descends from it).
        let gone = btrfs::root_info(&self.layout.checkpoint(a, s, c)).ok();
        let op = Op::CheckpointDelete {
            agent: a.into(),
            session: s.into(),
            checkpoint: c.into(),
            subvolume,
        };
        self.delete_committed(
            op,
            &self.layout.checkpoint(a, s, c),
            &self.layout.checkpoints_dir(a, s),
            [
                "checkpoint_delete.after_commit",
                "checkpoint_delete.after_rename",
            ],
        )?;
        if let Some(gone) = gone {
            self.keep_departed(a, s, &gone);
        }
        Ok(Deleted {
            deleted: format!("{a}/{s}/{c}"),
        })
    }

    /// Pins or unpins a checkpoint (one index transaction; no disk change).
    pub fn checkpoint_pin(
        &self,
        a: &str,
        s: &str,
        c: &str,
        pinned: bool,
    ) -> Result<CheckpointInfo> {
        let _g = self.guard();
        let mut rec = self.need_checkpoint(a, s, c)?;
        rec.pinned = pinned;
        self.index.write(|w| w.put_checkpoint(a, s, c, &rec))?;
        Ok(checkpoint_info(a, s, c, &rec))
    }
}
