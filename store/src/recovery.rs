//! Start-up recovery: finish or undo every operation left in the journal,
//! then reconcile the index with the subvolumes on disk.
//!
//! A [`Stage::Committed`] entry only has its trashed tree left to remove.
//! A [`Stage::Begun`] entry's End commit never happened (or was lost with
//! everything after it), so the disk shows how far it got: at start-up it is
//! finished if its durable disk steps are complete (a rollback whose
//! snapshot is whole gets its exchange done again) and undone otherwise;
//! after a run-time failure it is always undone, since its caller reports
//! an error. An operation is answered only once recovery would finish it.

use super::{apply::apply, checkpoint_info, Result, Store, StoreError};
use crate::audit::Entry as AuditEntry;
use crate::btrfs;
use crate::index::{AgentRecord, CheckpointRecord, SessionRecord};
use crate::journal::{Entry, Op, Stage};
use crate::layout::Layout;
use allox_protocol::{validate_id, Origin};
use std::path::{Path, PathBuf};

/// What to do with an operation whose disk steps all happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Start-up: finish it (its caller may have been told it succeeded).
    Recover,
    /// Run time, after an error: undo it (its caller is told it failed).
    Abort,
}

/// A delete's tree: where it lives, the subvolume that identifies it (and
/// its ID), and where the operation moves it.
struct Moved {
    home: PathBuf,
    subvol: PathBuf,
    id: u64,
    trash: PathBuf,
}

fn moved(l: &Layout, op: &Op, op_id: u64) -> Option<Moved> {
    Some(match op {
        Op::AgentDelete { agent, subvolume } => Moved {
            home: l.agent_dir(agent),
            subvol: l.workspace(agent),
            id: *subvolume,
            trash: Layout::trash(&l.agents_dir(), op_id),
        },
        Op::SessionDelete {
            agent,
            session,
            subvolume,
        } => Moved {
            home: l.session_dir(agent, session),
            subvol: l.current(agent, session),
            id: *subvolume,
            trash: Layout::trash(&l.sessions_dir(agent), op_id),
        },
        Op::CheckpointDelete {
            agent,
            session,
            checkpoint,
            subvolume,
        } => Moved {
            home: l.checkpoint(agent, session, checkpoint),
            subvol: l.checkpoint(agent, session, checkpoint),
            id: *subvolume,
            trash: Layout::trash(&l.checkpoints_dir(agent, session), op_id),
        },
        _ => return None,
    })
}

fn probe(p: &Path) -> Result<bool> {
    Ok(btrfs::probe_subvolume(p)?)
}

/// Whether a rollback's exchange is on disk: `current/` is no longer the
/// subvolume it was.
fn swapped(current: &Path, old_subvolume: u64) -> Result<bool> {
    Ok(current.exists() && btrfs::subvolume_id(current)? != old_subvolume)
}

/// Finishes or undoes one journaled operation; does not close its entry.
pub fn resolve(st: &Store, op_id: u64, entry: &Entry, mode: Mode) -> Result<bool> {
    let l = &st.layout;
    let rm = |p: &Path| btrfs::remove_tree(p).map_err(StoreError::from);
    let finish = |op: &Op| -> Result<()> {
        st.index.write_quick(|w| apply(w, op))?;
        Ok(())
    };
    let forward = mode == Mode::Recover && entry.stage != Stage::Aborting;
    let op = &entry.op;
    if entry.stage == Stage::Committed {
        // Only the removal of the old tree remains. Failing it leaves
        // garbage under a hidden name, not a wrong state: log and go on.
        let rm = |p: &Path| {
            if let Err(e) = btrfs::remove_tree(p) {
                tracing::error!(error = %StoreError::from(e).chain(), "cannot remove trashed tree");
            }
        };
        // The End commit can reach the disk before the rename it records:
        // if the tree (known by its subvolume ID, never reused) is still at
        // home, move it where the operation put it, then remove it.
        if let Some(m) = moved(l, op, op_id) {
            if probe(&m.subvol)? && btrfs::subvolume_id(&m.subvol)? == m.id && !m.trash.exists() {
                std::fs::rename(&m.home, &m.trash)
                    .map_err(|e| StoreError::io("rename", &m.home, e))?;
            }
            rm(&m.trash);
        } else if let Op::Rollback {
            agent,
            session,
            old_subvolume,
            ..
        } = op
        {
            let fresh = l.rollback_tmp(agent, session, op_id);
            let current = l.current(agent, session);
            if fresh.exists() && current.exists() && !swapped(&current, *old_subvolume)? {
                // The exchange did not reach the disk: do it again.
                btrfs::exchange(&fresh, &current)?;
            }
            rm(&fresh);
        }
        return Ok(true);
    }
    if let Some(m) = moved(l, op, op_id) {
        // A delete is complete once its tree has left home.
        if forward && !m.home.exists() {
            finish(op)?;
            rm(&m.trash)?;
            return Ok(true);
        }
        if m.trash.exists() && !m.home.exists() {
            std::fs::rename(&m.trash, &m.home)
                .map_err(|e| StoreError::io("rename", &m.trash, e))?;
        }
        return Ok(false);
    }
    let finished = match op {
        Op::AgentCreate { agent, .. } => {
            if forward && probe(&l.workspace(agent))? {
                for d in [l.shared(agent), l.sessions_dir(agent)] {
                    std::fs::create_dir_all(&d).map_err(|e| StoreError::io("create", &d, e))?;
                }
                finish(op)?;
                true
            } else {
                rm(&l.agent_dir(agent))?;
                false
            }
        }
        Op::SessionCreate { agent, session, .. } => {
            if forward && probe(&l.current(agent, session))? {
                let d = l.checkpoints_dir(agent, session);
                std::fs::create_dir_all(&d).map_err(|e| StoreError::io("create", &d, e))?;
                finish(op)?;
                true
            } else {
                rm(&l.session_dir(agent, session))?;
                false
            }
        }
        Op::CheckpointCreate {
            agent,
            session,
            checkpoint,
            ..
        } => {
            let p = l.checkpoint(agent, session, checkpoint);
            if forward && probe(&p)? {
                finish(op)?;
                true
            } else {
                rm(&p)?;
                false
            }
        }
        Op::Rollback {
            agent,
            session,
            old_subvolume,
            ..
        } => {
            let fresh = l.rollback_tmp(agent, session, op_id);
            let current = l.current(agent, session);
            let mut swapped = swapped(&current, *old_subvolume)?;
            if forward && !swapped && probe(&fresh)? && current.exists() {
                // The snapshot is whole (it appears only when its
                // transaction commits), so the rollback may have been
                // answered: the exchange that a power cut took is done.
                btrfs::exchange(&fresh, &current)?;
                swapped = true;
            }
            if swapped && forward {
                finish(op)?;
            } else if swapped && fresh.exists() {
                btrfs::exchange(&fresh, &current)?;
            }
            // Either way `fresh` now holds the tree that is not wanted.
            rm(&fresh)?;
            swapped && forward
        }
        Op::SessionFork {
            agent,
            session,
            from,
            ..
        } => {
            // Both snapshots there (each appears whole or not at all): the
            // fork is done.
            let baseline = l.checkpoint(agent, session, &from.baseline);
            if forward && probe(&l.current(agent, session))? && probe(&baseline)? {
                finish(op)?;
                true
            } else {
                rm(&l.session_dir(agent, session))?;
                // The settings its Begin copied go with it: a later session
                // of that name starts from its own.
                let key = crate::index::session_key(agent, session);
                st.index.write_quick(|w| {
                    w.remove_network(&key)?;
                    w.remove_policy(&key)
                })?;
                false
            }
        }
        Op::SessionImport {
            agent,
            session,
            staging,
            checkpoints,
            ..
        } => {
            // The staging directory renamed into place (with every
            // checkpoint, and `current/` made before the rename): done.
            // (The received `.current` goes with the sweep of leftovers.)
            let mut whole = forward && probe(&l.current(agent, session))?;
            for (c, _) in checkpoints {
                whole = whole && probe(&l.checkpoint(agent, session, c))?;
            }
            if whole {
                finish(op)?;
            } else {
                rm(&l.session_dir(agent, session))?;
                rm(&l.sessions_dir(agent).join(staging))?;
                let key = crate::index::session_key(agent, session);
                st.index.write_quick(|w| {
                    w.remove_network(&key)?;
                    w.remove_policy(&key)?;
                    w.remove_clock(agent, session)
                })?;
            }
            whole
        }
        Op::SessionImportSince {
            agent,
            session,
            staging,
            checkpoints,
            old_subvolume,
            ..
        } => {
            // The exchange comes after every checkpoint is in place: once
            // it happened, the import is whole.
            let swapped = swapped(&l.current(agent, session), *old_subvolume)?;
            if forward && swapped {
                finish(op)?;
            } else {
                let staged = l.sessions_dir(agent).join(staging);
                if swapped {
                    btrfs::exchange(&staged.join("current"), &l.current(agent, session))?;
                }
                // Moved in, not in the index: the names were free before.
                for (c, _) in checkpoints {
                    rm(&l.checkpoint(agent, session, c))?;
                }
                rm(&staged)?;
            }
            forward && swapped
        }
        // The deletes were handled above.
        Op::AgentDelete { .. } | Op::SessionDelete { .. } | Op::CheckpointDelete { .. } => false,
    };
    Ok(finished)
}

/// Runs at start-up, before the store serves anything.
/// Finishes or undoes what the journal holds; returns how many operations.
pub(super) fn recover(st: &Store) -> Result<u64> {
    let mut notes = Vec::new();
    let mut replayed = 0;
    let mut settled = Vec::new();
    for (op_id, entry) in st.index.pending()? {
        let done = resolve(st, op_id, &entry, Mode::Recover)?;
        settled.push(op_id);
        let what = match (entry.stage, done) {
            (Stage::Committed, _) => "finished removal for",
            (Stage::Begun, true) => "completed",
            (Stage::Begun | Stage::Aborting, _) => "undid",
        };
        tracing::warn!(op_id, op = ?entry.op, "recovery {what} an interrupted operation");
        notes.push(format!("{what} {:?}", entry.op));
        replayed += 1;
    }
    st.close_entries(&settled)?;
    notes.extend(reconcile(st)?);
    // One durable commit for everything above.
    st.index.write(|_| Ok(()))?;
    for n in notes {
        let _ = st.audit.append(AuditEntry {
            request_id: 0,
            peer: "startup".into(),
            action: "store.recover".into(),
            target: String::new(),
            outcome: "ok".into(),
            message: Some(n),
        });
    }
    Ok(replayed)
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn created_ms(p: &Path) -> u64 {
    std::fs::metadata(p)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Makes the index match the subvolumes present; returns what it changed.
/// Index entries whose subvolume is gone are dropped; subvolumes without an
/// entry are adopted (nothing on disk is thrown away); leftover in-flight
/// names (starting with `.`) are removed.
fn reconcile(st: &Store) -> Result<Vec<String>> {
    let l = &st.layout;
    let mut notes = Vec::new();
    let mut note = |s: String| {
        tracing::warn!("reconcile: {s}");
        notes.push(s);
    };
    let sweep = |dir: &Path, note: &mut dyn FnMut(String)| -> Result<()> {
        for name in entries(dir) {
            if name.starts_with('.') {
                let p = dir.join(&name);
                match btrfs::remove_tree(&p) {
                    Ok(()) => note(format!("removed leftover {}", p.display())),
                    Err(e) => note(format!(
                        "cannot remove leftover {}: {}",
                        p.display(),
                        StoreError::from(e).chain()
                    )),
                }
            }
        }
        Ok(())
    };

    // Index → disk. A record is dropped only when its subvolume is
    // certainly gone; a tree that cannot be looked at stops recovery.
    for (a, _) in st.index.agents()? {
        if !probe(&l.workspace(&a))? {
            st.index.write(|w| w.remove_agent(&a))?;
            note(format!("dropped agent {a}: its workspace is missing"));
            continue;
        }
        // Made after the subvolume, and so possibly lost with a power cut
        // that kept the operation's durable steps.
        for d in [l.shared(&a), l.sessions_dir(&a)] {
            std::fs::create_dir_all(&d).map_err(|e| StoreError::io("create", &d, e))?;
        }
        for (s, _) in st.index.sessions(&a)? {
            if !probe(&l.current(&a, &s))? {
                st.index.write(|w| w.remove_session(&a, &s))?;
                note(format!("dropped session {a}/{s}: its current/ is missing"));
                continue;
            }
            let d = l.checkpoints_dir(&a, &s);
            std::fs::create_dir_all(&d).map_err(|e| StoreError::io("create", &d, e))?;
            for (c, _) in st.index.checkpoints(&a, &s)? {
                if probe(&l.checkpoint(&a, &s, &c))? {
                    continue;
                }
                // `apply` reads the records as they are now, so a chain of
                // missing checkpoints is re-linked step by step.
                let gone = Op::CheckpointDelete {
                    agent: a.clone(),
                    session: s.clone(),
                    checkpoint: c.clone(),
                    subvolume: 0,
                };
                st.index.write(|w| apply(w, &gone))?;
                note(format!(
                    "dropped checkpoint {a}/{s}/{c}: its snapshot is missing"
                ));
            }
        }
    }

    // Disk → index.
    sweep(&l.agents_dir(), &mut note)?;
    for a in entries(&l.agents_dir()) {
        if a.starts_with('.') {
            continue;
        }
        if validate_id("agent_id", &a).is_err() {
            note(format!("ignored {a:?} in agents/: not a valid agent id"));
            continue;
        }
        if st.index.agent(&a)?.is_none() {
            if !probe(&l.workspace(&a))? {
                note(format!("ignored agents/{a}: no workspace subvolume"));
                continue;
            }
            for d in [l.shared(&a), l.sessions_dir(&a)] {
                std::fs::create_dir_all(&d).map_err(|e| StoreError::io("create", &d, e))?;
            }
            let rec = AgentRecord {
                created_ms: created_ms(&l.workspace(&a)),
            };
            st.index.write(|w| w.put_agent(&a, &rec))?;
            note(format!("adopted agent {a} found on disk"));
        }
        sweep(&l.sessions_dir(&a), &mut note)?;
        for s in entries(&l.sessions_dir(&a)) {
            if s.starts_with('.') || validate_id("session_id", &s).is_err() {
                continue;
            }
            if st.index.session(&a, &s)?.is_none() {
                if !probe(&l.current(&a, &s))? {
                    note(format!(
                        "ignored session dir {a}/{s}: no current/ subvolume"
                    ));
                    continue;
                }
                let d = l.checkpoints_dir(&a, &s);
                std::fs::create_dir_all(&d).map_err(|e| StoreError::io("create", &d, e))?;
                let rec = SessionRecord {
                    created_ms: created_ms(&l.current(&a, &s)),
                    head: None,
                };
                st.index.write(|w| w.put_session(&a, &s, &rec))?;
                note(format!("adopted session {a}/{s} found on disk"));
            }
            sweep(&l.session_dir(&a, &s), &mut note)?;
            sweep(&l.checkpoints_dir(&a, &s), &mut note)?;
            for c in entries(&l.checkpoints_dir(&a, &s)) {
                if c.starts_with('.') || validate_id("checkpoint_id", &c).is_err() {
                    continue;
                }
                let p = l.checkpoint(&a, &s, &c);
                if st.index.checkpoint(&a, &s, &c)?.is_none() && probe(&p)? {
                    let rec = st.index.write(|w| {
                        let rec = CheckpointRecord {
                            created_ms: created_ms(&p),
                            seq: w.next_seq("checkpoint")?,
                            parent: None,
                            origin: Origin::Recovered,
                            pinned: false,
                            label: None,
                            turn_id: None,
                        };
                        w.put_checkpoint(&a, &s, &c, &rec)?;
                        Ok(rec)
                    })?;
                    let info = checkpoint_info(&a, &s, &c, &rec);
                    note(format!(
                        "adopted checkpoint {a}/{s}/{} found on disk",
                        info.checkpoint_id
                    ));
                }
            }
        }
    }
    Ok(notes)
}
