//! The conversation between the supervisor and the observer, on a Unix
//! stream socket the supervisor made (the observer's standard input): each
//! message a little-endian `u32` length and its postcard bytes.
//!
//! ```text
//! supervisor                         observer
//!   Begin ──────────────────────────►  attaches its history, seals A
//!         ◄────────────────────────── Sealed { baseline } | Failed
//!   (clone the run into its frozen cgroup, thaw, … run ends, freeze,
//!    survivors listed and killed, cgroup empty and frozen)
//!   End ────────────────────────────►  captures B, closes
//!         ◄────────────────────────── Closed(RunEffects) | Failed
//!   (the pinned verifier reads the set)   makes the chain durable
//!         ◄────────────────────────── Durable { root } | Failed
//! ```
//!
//! `Closed` comes before the chain's last records are synced, so that
//! the supervisor's verifier reads the set while the observer's syncs
//! are written; the supervisor answers the run only after `Durable`.
//!
//! Protocol v3 (`Begin.recovery`): after B the observer makes the records
//! so far durable and answers `CapturedB`; the supervisor fences the
//! session, has the recover tool restore the workspace, and answers
//! `Recovered`; the observer records what was done, captures C, compares
//! A→B, B→C and A→C, closes and answers `Closed`.
//!
//! The socket closing before `End` is a fault: the observer closes the
//! chain with a `fault` record and exits. After `Closed` the same
//! conversation may carry the next run's `Begin`; the socket closing
//! then ends the observer without a fault.

use crate::scope::Scope;
use allox_protocol::{RunEffects, Survivor};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::path::PathBuf;

/// The descriptor the observer reads and writes its conversation on.
pub const OBSERVER_FD: i32 = 0;

/// Largest message (an answer with many changes listed).
pub const MAX_MESSAGE: usize = 64 << 20;

/// What the observer is to observe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Begin {
    pub agent: String,
    pub session: String,
    pub run: String,
    pub argv: Vec<String>,
    pub scope: Scope,
    /// The run's cgroup (made, frozen, empty) and its id.
    pub cgroup: PathBuf,
    pub cgroup_id: u64,
    /// The daemon's cgroup root: a writer's cgroup below it names its
    /// agent, session and run.
    pub cgroup_root: PathBuf,
    /// Where the chain is kept (`state/effects/<agent>/<session>/<run>/`).
    pub evidence: PathBuf,
    /// The session's `current/` and its agent's workspace (the subvolume
    /// `shared/` is in); both snapshotted read-only at A and at B.
    pub workspace: PathBuf,
    pub agent_workspace: PathBuf,
    /// The session's context process, whose namespaces (network, mount)
    /// the run's sandbox is made in; `None` if it has none yet.
    pub context_pid: Option<i32>,
    /// The history's ring buffer, in bytes.
    pub ring_bytes: u32,
    /// Whether the history has its BPF LSM hooks.
    pub lsm: bool,
    /// Where every observer lists its own BPF objects (one file each), so
    /// that no observer counts another's, or its own, as a change.
    pub registry: PathBuf,
    /// The supervisor's pid (its own BPF objects are not the machine's
    /// state either).
    pub supervisor_pid: u32,
    /// sha256 (hex) of the supervisor's and the observer's executables.
    pub executables: Vec<(String, String)>,
    /// Protocol v3: restore the workspace after B and capture C.
    pub recovery: Option<RecoveryPlan>,
}

/// A protocol v3 run's recovery, as the `begin` record states it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryPlan {
    /// The checkpoint the workspace is restored to (equal to `current/`
    /// at A).
    pub checkpoint_id: String,
    /// Whether the supervisor made and pinned it for this run.
    pub baseline_made: bool,
    pub scrub_runtime: bool,
    pub require_consistent: bool,
}

/// What the supervisor did between B and C.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recovered {
    /// The recover tool's account of the restore, or why it failed (the
    /// rollback is then undone, and the evidence ends in a fault).
    pub restore: Result<allox_protocol::RestoreDone, String>,
    /// What the context reset removed (`scrub_runtime`).
    pub scrubbed: Vec<String>,
    /// The session's context process C is captured in (a new one after a
    /// reset), if it has one.
    pub context_pid: Option<i32>,
}

/// How the observed run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct End {
    /// The program's status as the supervisor read it (`exit 0`,
    /// `signal 9`, `unknown`).
    pub status: String,
    /// Processes still alive once the program had ended, frozen, then
    /// killed.
    pub survivors: Vec<Survivor>,
    /// The sandbox's init (its own mounts, in its own namespace, are not
    /// the run's doing).
    pub init_pid: Option<u32>,
    /// A fault of the supervisor's side (a freeze that did not finish, a
    /// cgroup that did not empty): the evidence is then at best
    /// `INCOMPLETE`.
    pub fault: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToObserver {
    Begin(Box<Begin>),
    End(End),
    Recovered(Box<Recovered>),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FromObserver {
    /// A is captured and sealed: the chain's head.
    Sealed { baseline: String },
    /// The evidence is closed and verified.
    Closed(Box<RunEffects>),
    /// The observer could not go on: why, and the chain's head (empty if
    /// it has no record).
    Failed { why: String, head: String },
    /// Protocol v3: B and its verdict are durable, the chain's head is
    /// `head`; the workspace may be restored.
    CapturedB { head: String },
    /// After `Closed`: every record of the chain, up to its root `root`,
    /// is durable.
    Durable { root: String },
}

/// Writes one message.
pub fn send<T: Serialize>(w: &mut impl Write, m: &T) -> std::io::Result<()> {
    let bytes = postcard::to_stdvec(m).map_err(std::io::Error::other)?;
    let len = u32::try_from(bytes.len()).map_err(std::io::Error::other)?;
    let mut out = Vec::with_capacity(4 + bytes.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&bytes);
    w.write_all(&out)?;
    w.flush()
}

/// Reads one message; `None` at a clean end of stream.
pub fn recv<T: for<'de> Deserialize<'de>>(r: &mut impl Read) -> std::io::Result<Option<T>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MESSAGE {
        return Err(std::io::Error::other(format!(
            "a message of {len} bytes (at most {MAX_MESSAGE})"
        )));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf)?;
    postcard::from_bytes(&buf)
        .map(Some)
        .map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_a_short_stream_is_the_end() {
        let m = ToObserver::End(End {
            status: "exit 0".into(),
            survivors: vec![Survivor {
                pid: 7,
                comm: "sleep".into(),
                lineage: vec![5, 3],
            }],
            init_pid: Some(3),
            fault: None,
        });
        let mut buf = Vec::new();
        send(&mut buf, &m).unwrap();
        let mut r = &buf[..];
        assert_eq!(recv::<ToObserver>(&mut r).unwrap(), Some(m));
        assert_eq!(recv::<ToObserver>(&mut r).unwrap(), None);
        let huge = (MAX_MESSAGE as u32 + 1).to_le_bytes();
        assert!(recv::<ToObserver>(&mut &huge[..]).is_err());
    }
}
