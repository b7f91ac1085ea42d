//! System effects (the `system-effects` plugin): evidence of what an
//! observed run changed outside its workspace, collected by an independent
//! observer before the run's first instruction (A, "S0") and after its
//! whole tree has exited and its cgroup is empty and frozen (B, "S1"),
//! kept as a hash chain, and a verdict per domain (`effects.get`,
//! `effects.list`, `effects.history`, `effects.status`, `effects.unfence`),
//! checked by an independent verifier (`effects.verify`) in the daemon and,
//! over `effects.export`, anywhere else.
//! docs/system-effects.md describes the protocol and the evidence.

use crate::target::target;
use serde::{Deserialize, Serialize};

/// The observer protocol an observed run follows (v2: A, run, B).
pub const EFFECTS_PROTOCOL: u32 = 2;

/// The protocol of a run started with `recovery` (v3: A, run, B, the
/// workspace restored by the pinned recover tool, C).
pub const EFFECTS_PROTOCOL_RECOVERY: u32 = 3;

/// What the evidence covers.
#[derive(
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
)]
#[serde(rename_all = "snake_case")]
pub enum EffectsDomain {
    /// The session's `current/` (always observed).
    Workspace,
    /// The agent's `shared/` (always observed).
    Shared,
    /// The scope file's paths, and every write on their filesystems.
    Filesystem,
    /// BPF programs, maps and links, and bpffs pins.
    Bpf,
    /// `/proc/sys` of the machine and of the session's network namespace.
    Sysctl,
    /// The mount tables of the namespaces involved.
    Mount,
    /// Links, addresses, routes and rules of the namespaces involved.
    Network,
    /// Loaded kernel modules and the taint flags.
    Modules,
    /// Processes whose lineage reaches the run, alive at B.
    Processes,
}

impl EffectsDomain {
    pub const ALL: [EffectsDomain; 9] = [
        EffectsDomain::Workspace,
        EffectsDomain::Shared,
        EffectsDomain::Filesystem,
        EffectsDomain::Bpf,
        EffectsDomain::Sysctl,
        EffectsDomain::Mount,
        EffectsDomain::Network,
        EffectsDomain::Modules,
        EffectsDomain::Processes,
    ];

    /// Its name, as the scope file and the evidence spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            EffectsDomain::Workspace => "workspace",
            EffectsDomain::Shared => "shared",
            EffectsDomain::Filesystem => "filesystem",
            EffectsDomain::Bpf => "bpf",
            EffectsDomain::Sysctl => "sysctl",
            EffectsDomain::Mount => "mount",
            EffectsDomain::Network => "network",
            EffectsDomain::Modules => "modules",
            EffectsDomain::Processes => "processes",
        }
    }

    /// The domain named `name`.
    pub fn parse(name: &str) -> Option<EffectsDomain> {
        EffectsDomain::ALL.into_iter().find(|d| d.as_str() == name)
    }
}

/// What the evidence of a domain (or of a whole run) says. Ordered from
/// best to worst; a run's verdict is the worst of its observed domains.
#[derive(
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EffectsVerdict {
    /// Captured at A and at B, completely, and nothing differs.
    Consistent,
    /// Complete, and something differs: each difference is listed.
    Changed,
    /// Complete, but what it shows cannot be decided.
    Inconclusive,
    /// A capture failed or events were lost: never counted consistent.
    Incomplete,
    /// Not in the scope: not looked at, never counted consistent. A run
    /// whose observed domains are all consistent is still `CONSISTENT`
    /// overall; the domains say which were not observed.
    NotObserved,
}

impl EffectsVerdict {
    pub fn as_str(self) -> &'static str {
        match self {
            EffectsVerdict::Consistent => "CONSISTENT",
            EffectsVerdict::Changed => "CHANGED",
            EffectsVerdict::Inconclusive => "INCONCLUSIVE",
            EffectsVerdict::Incomplete => "INCOMPLETE",
            EffectsVerdict::NotObserved => "NOT_OBSERVED",
        }
    }

    /// The worse of two verdicts of observed domains (`NOT_OBSERVED` is
    /// left out of a run's verdict).
    pub fn worst(self, other: EffectsVerdict) -> EffectsVerdict {
        match (self, other) {
            (EffectsVerdict::NotObserved, o) => o,
            (s, EffectsVerdict::NotObserved) => s,
            (s, o) => s.max(o),
        }
    }
}

/// Who made a change: the observed run, a run of another session, or
/// nobody the evidence can name.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum By {
    /// The observed run (a process of its tree, or its cgroup).
    Run,
    /// A run of another session.
    Session,
    /// The machine itself, a process outside every sandbox, or history
    /// that does not say.
    Unknown,
    /// The recover tool restoring the workspace (protocol v3, B to C).
    Recovery,
}

/// Who made a change, with the ids that name them.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq, Hash)]
pub struct Attribution {
    pub by: By,
    #[serde(default)]
    pub agent_id: Option<String>,
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub run_id: Option<String>,
}

impl Attribution {
    /// The observed run `run_id`.
    pub fn run(run_id: &str) -> Attribution {
        Attribution {
            by: By::Run,
            agent_id: None,
            session_id: None,
            run_id: Some(run_id.to_string()),
        }
    }

    /// A run (if known) of session `agent_id/session_id`.
    pub fn session(agent_id: &str, session_id: &str, run_id: Option<&str>) -> Attribution {
        Attribution {
            by: By::Session,
            agent_id: Some(agent_id.to_string()),
            session_id: Some(session_id.to_string()),
            run_id: run_id.map(str::to_string),
        }
    }

    pub fn unknown() -> Attribution {
        Attribution {
            by: By::Unknown,
            agent_id: None,
            session_id: None,
            run_id: None,
        }
    }
}

/// How an item differs between A and B.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum EffectChangeKind {
    Added,
    Modified,
    Removed,
}

/// One difference between A and B.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
pub struct EffectChange {
    /// What changed, in the domain's terms: a path relative to the
    /// workspace or `shared/`, `net.ipv4.ip_forward`, `prog 42 name`,
    /// `route 10.0.0.0/8 dev dummy0`, `module dummy`, `pid 812 sleep`.
    pub item: String,
    pub kind: EffectChangeKind,
    /// The item's value at A and at B, as the collector shows it (a
    /// size and hash, a sysctl's text).
    #[serde(default)]
    pub before: Option<String>,
    #[serde(default)]
    pub after: Option<String>,
    pub by: Attribution,
}

/// The evidence of one domain.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
pub struct DomainEffects {
    pub domain: EffectsDomain,
    pub verdict: EffectsVerdict,
    /// The differences, in item order; at most 1,000 (see `truncated`).
    #[serde(default)]
    pub changes: Vec<EffectChange>,
    #[serde(default)]
    pub truncated: bool,
    /// Why the domain is `INCOMPLETE`, `INCONCLUSIVE` or `NOT_OBSERVED`.
    #[serde(default)]
    pub note: Option<String>,
    /// How many items were captured at A and at B.
    #[serde(default)]
    pub items: [u64; 2],
}

/// A process of the run still alive once its program had ended: frozen,
/// listed with its lineage, killed before B.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
pub struct Survivor {
    /// Its PID as the supervisor sees it.
    pub pid: u32,
    pub comm: String,
    /// Its ancestors' PIDs up to the run's first process, nearest first.
    pub lineage: Vec<u32>,
}

/// What the observer's history counted.
#[derive(
    Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Default,
)]
pub struct HistoryCounters {
    /// Records the kernel side made (its sequence numbers).
    pub emitted: u64,
    /// Records the observer received.
    pub received: u64,
    /// Records lost (`emitted - received`): any makes the history, and the
    /// domains it attributes, `INCOMPLETE`.
    pub lost: u64,
    /// System calls the run's processes made.
    pub syscalls: u64,
    /// Of those, the ones refused (a negative return).
    pub refused: u64,
}

/// The effects of one observed run: `process.start`'s answer carries it,
/// `effects.get` gives it again.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
pub struct RunEffects {
    /// The observer protocol ([`EFFECTS_PROTOCOL`]).
    pub protocol: u32,
    pub agent_id: String,
    pub session_id: String,
    pub run_id: String,
    /// The sha256 (hex) of the last record of the evidence chain: what
    /// `effects.unfence` must be given.
    pub evidence_root: String,
    /// The worst verdict of the observed domains.
    pub verdict: EffectsVerdict,
    pub domains: Vec<DomainEffects>,
    /// Whether the session is fenced because of this run.
    pub fenced: bool,
    /// Why the session is fenced, if it is.
    #[serde(default)]
    pub fence_reason: Option<String>,
    #[serde(default)]
    pub survivors: Vec<Survivor>,
    #[serde(default)]
    pub history: HistoryCounters,
    /// When the run was started and its evidence closed (ms since the
    /// Unix epoch).
    pub started_ms: u64,
    pub closed_ms: u64,
    /// Protocol v3 (a run started with `recovery`): the restore and the
    /// comparisons B→C and A→C. `domains` and `verdict` stay A→B.
    #[serde(default)]
    pub recovery: Option<Box<RecoveryEffects>>,
}

/// What the recovery of a protocol v3 run did and found.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
pub struct RecoveryEffects {
    /// The checkpoint the workspace was restored to.
    pub checkpoint_id: String,
    /// Whether Allox made (and pinned) it before the run was released,
    /// rather than the request naming it.
    pub baseline_made: bool,
    pub scrub_runtime: bool,
    pub require_consistent: bool,
    /// What the recover tool did.
    pub restore: RestoreDone,
    /// The worst verdict of B→C's and of A→C's domains.
    pub b_to_c_verdict: EffectsVerdict,
    pub a_to_c_verdict: EffectsVerdict,
    pub b_to_c: Vec<DomainEffects>,
    pub a_to_c: Vec<DomainEffects>,
    /// A→C is CONSISTENT in every observed domain: nothing of the run is
    /// left. Otherwise the A→C changes are the residue.
    pub consistent: bool,
    /// What the session's context reset removed (`scrub_runtime`).
    #[serde(default)]
    pub scrubbed: Vec<String>,
}

/// The recover tool's account of the workspace restore.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq, Default)]
pub struct RestoreDone {
    /// sha256 (hex) of the pinned `allox-system-effects-recover`.
    pub tool_sha256: String,
    /// The Btrfs subvolume ids: the checkpoint, the workspace's tree at B
    /// (now removed), and the restored tree.
    pub checkpoint_subvolume: u64,
    pub previous_subvolume: u64,
    pub restored_subvolume: u64,
    /// The steps, in order (`snapshot`, `exchange`).
    pub steps: Vec<String>,
}

/// `effects.get`: one observed run's effects.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EffectsGet {
    pub agent_id: String,
    pub session_id: String,
    pub run_id: String,
}

target!(EffectsGet: agent_id, session_id, run_id);

/// `effects.list`: a session's observed runs, newest last.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EffectsList {
    pub agent_id: String,
    pub session_id: String,
}

target!(EffectsList: agent_id, session_id);

/// One line of `effects.list`.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
pub struct EffectsEntry {
    pub run_id: String,
    pub verdict: EffectsVerdict,
    pub evidence_root: String,
    pub fenced: bool,
    pub started_ms: u64,
    /// The domains that are not `CONSISTENT`, with their verdicts.
    #[serde(default)]
    pub not_consistent: Vec<(EffectsDomain, EffectsVerdict)>,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
pub struct EffectsListing {
    pub runs: Vec<EffectsEntry>,
}

/// `effects.history`: what the observer's history recorded of a run,
/// oldest first; `cursor` continues after an earlier answer's last record.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EffectsHistory {
    pub agent_id: String,
    pub session_id: String,
    pub run_id: String,
    #[serde(default)]
    pub cursor: Option<u64>,
    /// Most records in the answer (default 1,000, at most 10,000).
    #[serde(default)]
    pub limit: Option<u32>,
}

target!(EffectsHistory: agent_id, session_id, run_id);

/// One record of a run's history.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
pub struct HistoryRecord {
    /// The kernel side's sequence number.
    pub seq: u64,
    /// Nanoseconds since boot.
    pub time_ns: u64,
    /// `fork`, `exec`, `exit`, `syscall`.
    pub kind: String,
    pub pid: u32,
    #[serde(default)]
    pub ppid: Option<u32>,
    pub comm: String,
    /// The call and its result (`syscall`), the program (`exec`), the
    /// status (`exit`).
    #[serde(default)]
    pub detail: Option<String>,
    /// A call the kernel refused (a negative return).
    #[serde(default)]
    pub refused: bool,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
pub struct EffectsHistoryListing {
    pub records: Vec<HistoryRecord>,
    /// Pass as `cursor` to continue; `None` when there is no more.
    #[serde(default)]
    pub next: Option<u64>,
    pub counters: HistoryCounters,
}

/// `effects.status`: whether the plugin observes runs, what it observes,
/// and the sessions it has fenced.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct EffectsStatusRequest {
    #[serde(default)]
    pub agent_id: Option<String>,
}

target!(EffectsStatusRequest: agent_id);

/// A session fenced by the plugin.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
pub struct EffectsFence {
    pub agent_id: String,
    pub session_id: String,
    pub run_id: String,
    pub reason: String,
    /// The run's evidence root (`effects.unfence` needs it); empty when
    /// the chain never got a record.
    pub evidence_root: String,
    pub fenced_ms: u64,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
pub struct EffectsStatus {
    pub protocol: u32,
    /// The observer's pinned sha256 (hex).
    pub observer_sha256: String,
    /// The verifier's pinned sha256 (hex).
    #[serde(default)]
    pub verifier_sha256: String,
    /// The domains the scope observes (`workspace` and `shared` always).
    pub domains: Vec<EffectsDomain>,
    /// The scope file, if one was given.
    #[serde(default)]
    pub scope_file: Option<String>,
    pub fences: Vec<EffectsFence>,
    /// Observed runs going on now.
    pub observing: u32,
    /// Whether the history has its BPF LSM hooks (off with
    /// `--system-effects-without-lsm`, on a kernel that refuses them).
    #[serde(default)]
    pub lsm_hooks: bool,
    /// The recover tool's pinned sha256 (hex): protocol v3's restore.
    #[serde(default)]
    pub recover_sha256: String,
}

/// `effects.unfence`: lifts the fence a run put on its session, given that
/// run's evidence root (audited).
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EffectsUnfence {
    pub agent_id: String,
    pub session_id: String,
    pub run_id: String,
    pub evidence_root: String,
}

target!(EffectsUnfence: agent_id, session_id, run_id);

#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
pub struct EffectsUnfenced {
    pub agent_id: String,
    pub session_id: String,
    pub run_id: String,
}

/// `effects.verify`: the independent verifier (the pinned
/// `allox-system-effects-verify`) run again over a closed run's evidence
/// set. With `evidence_root` (the root the caller kept from the run's
/// answer), a set whose chain was made again ends at another root and is
/// named so.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EffectsVerify {
    pub agent_id: String,
    pub session_id: String,
    pub run_id: String,
    #[serde(default)]
    pub evidence_root: Option<String>,
}

target!(EffectsVerify: agent_id, session_id, run_id);

/// What the verifier found.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq, Eq)]
pub struct EffectsVerified {
    /// Whether the set is sound and its verdict follows from its captures.
    pub ok: bool,
    /// The first bad file and record, as one line, when not.
    #[serde(default)]
    pub first_bad: Option<String>,
    /// The verifier's report, exactly as it wrote it (canonical JSON, one
    /// line): the same bytes the verifier writes for an export of the set
    /// on another machine.
    pub report: String,
}

/// `effects.export`: a closed run's evidence set as one tar archive
/// (ustar, made the same way every time), in pieces of at most
/// [`crate::FS_CHUNK`] bytes from `offset`; the verifier reads it
/// (`allox-system-effects-verify --export FILE`).
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EffectsExport {
    pub agent_id: String,
    pub session_id: String,
    pub run_id: String,
    #[serde(default)]
    pub offset: Option<u64>,
}

target!(EffectsExport: agent_id, session_id, run_id);

/// A piece of an export.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
pub struct EffectsExportChunk {
    pub offset: u64,
    pub data: crate::Bytes,
    /// The whole archive's size.
    pub size: u64,
    /// Whether `data` reaches its end.
    pub eof: bool,
    /// The whole archive's sha256 (hex).
    pub sha256: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_verdict_leaves_not_observed_out() {
        use EffectsVerdict::*;
        assert_eq!(Consistent.worst(NotObserved), Consistent);
        assert_eq!(NotObserved.worst(Changed), Changed);
        assert_eq!(Changed.worst(Incomplete), Incomplete);
        assert_eq!(Inconclusive.worst(Changed), Inconclusive);
        assert_eq!(NotObserved.worst(NotObserved), NotObserved);
    }

    #[test]
    fn domains_round_trip_by_name() {
        for d in EffectsDomain::ALL {
            assert_eq!(EffectsDomain::parse(d.as_str()), Some(d));
            assert_eq!(
                serde_json::to_value(d).unwrap(),
                serde_json::Value::String(d.as_str().into())
            );
        }
        assert_eq!(EffectsDomain::parse("kernel"), None);
        assert_eq!(
            serde_json::to_value(EffectsVerdict::NotObserved).unwrap(),
            "NOT_OBSERVED"
        );
    }
}
