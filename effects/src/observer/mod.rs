//! The observer: the independent process (`allox-observe`) that captures
//! A before the run's first instruction and B after its tree has exited,
//! records the run's history from the kernel, and is the only writer of
//! the evidence chain. [`wire`] is its conversation with the supervisor.
//!
//! Records of a chain, in order: `begin` (the run, its argv, the scope,
//! the executables' hashes, the kernel, the boot id, and `baseline`: the
//! sha256 of the `capture_a` body that follows), `capture_a`, then at the
//! end `history`, `capture_b`, `verdict`, `close` (the history's counters)
//! — or `fault` (why) wherever it stopped.

pub mod domains;
pub mod files;
pub mod history;
pub mod wire;

use crate::chain::{self, Chain};
use crate::collect::{Capture, Difference};
use allox_protocol::{
    Attribution, DomainEffects, EffectChange, EffectsDomain, EffectsVerdict, HistoryRecord,
    RunEffects, EFFECTS_PROTOCOL,
};
use history::History;
use std::collections::BTreeMap;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use wire::{Begin, End, FromObserver, ToObserver};
pub use wire::{Recovered, RecoveryPlan};

/// The file beside the chain with the run's effects as answered. It and
/// the two files below are made empty with the chain: empty, it was
/// never written (the run is still going, or was cut off).
pub const EFFECTS_FILE: &str = "effects.json";
/// The file beside the chain with the run's history records.
pub const HISTORY_FILE: &str = "history.json";
/// The file beside the chain with the run's forks, execs and exits as
/// process events (what `process.events` and `process.tree` answer).
pub const PROCESSES_FILE: &str = "processes.json";

/// `allox-observe`'s main: not dumpable, its conversation on its
/// standard input ([`wire::OBSERVER_FD`]); the exit status is 0 when the
/// evidence closed. (Rust programs ignore SIGPIPE: a write to a
/// supervisor that went away fails with EPIPE, which is handled.)
pub fn main() -> i32 {
    use std::os::fd::AsFd;
    let _ = rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    // Room for the sysctl capture's kept descriptors (collect::sysctl);
    // without it the capture opens each file every time.
    let _ = rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(65536),
            maximum: Some(65536),
        },
    );
    if let Err(e) = keep_only(&CAPABILITIES) {
        eprintln!("allox-observe: drop the capabilities it does not need: {e}");
        return 2;
    }
    let stdin = std::io::stdin();
    let is_socket = rustix::fs::fstat(stdin.as_fd())
        .map(|st| rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Socket)
        .unwrap_or(false);
    if !is_socket {
        eprintln!(
            "allox-observe: its standard input is not a socket: it is started by the supervisor (--plugin system-effects)"
        );
        return 2;
    }
    let sock = match stdin.as_fd().try_clone_to_owned() {
        Ok(fd) => UnixStream::from(fd),
        Err(e) => {
            eprintln!("allox-observe: duplicate its standard input: {e}");
            return 2;
        }
    };
    // The history's programs are loaded now, before the first run is
    // asked for, when the supervisor says how (`--ring-bytes N`,
    // `--without-lsm`, `--registry DIR`); else at the first `Begin`.
    let preload = match Preload::from_args(std::env::args().skip(1)) {
        Ok(p) => p,
        Err(why) => {
            eprintln!("allox-observe: {why}");
            return 2;
        }
    };
    let loaded = preload.map(|p| history::Loaded::load(p.ring_bytes, p.lsm, &p.registry));
    match observe(sock, loaded) {
        Ok(()) => 0,
        Err(why) => {
            eprintln!("allox-observe: {why}");
            1
        }
    }
}

/// How to load the history before the first run.
#[derive(Debug, PartialEq, Eq)]
pub struct Preload {
    pub ring_bytes: u32,
    pub lsm: bool,
    pub registry: std::path::PathBuf,
}

impl Preload {
    /// `--ring-bytes N [--without-lsm] --registry DIR`, or nothing.
    pub fn from_args(args: impl Iterator<Item = String>) -> Result<Option<Preload>, String> {
        let (mut ring, mut lsm, mut registry) = (None, true, None);
        let mut args = args;
        while let Some(a) = args.next() {
            match a.as_str() {
                "--ring-bytes" => {
                    let v = args.next().ok_or("--ring-bytes needs a value")?;
                    ring = Some(
                        v.parse::<u32>()
                            .map_err(|_| format!("--ring-bytes {v:?} is not a number"))?,
                    );
                }
                "--without-lsm" => lsm = false,
                "--registry" => {
                    registry = Some(std::path::PathBuf::from(
                        args.next().ok_or("--registry needs a value")?,
                    ))
                }
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        match (ring, registry) {
            (None, None) if lsm => Ok(None),
            (Some(ring_bytes), Some(registry)) => Ok(Some(Preload {
                ring_bytes,
                lsm,
                registry,
            })),
            _ => {
                Err("--ring-bytes and --registry go together (and --without-lsm with them)".into())
            }
        }
    }
}

/// What the observer needs, and nothing else: its history's programs
/// (`BPF`, `PERFMON`, `MAC_ADMIN` for the LSM hooks, `NET_ADMIN` for the
/// cgroup sysctl program, `SYS_RESOURCE` for locked memory), its
/// snapshots, filesystem marks and namespace joins (`SYS_ADMIN`; a
/// snapshot of a tree the sandbox's user owns needs `FOWNER` too), reading
/// every file and directory handle it must (`DAC_READ_SEARCH`,
/// `DAC_OVERRIDE`), and other processes' `/proc` entries (`SYS_PTRACE`).
/// The rest are dropped from every set, the bounding set included, so no
/// program it could run gets them back.
pub const CAPABILITIES: [caps::Capability; 10] = [
    caps::Capability::CAP_BPF,
    caps::Capability::CAP_PERFMON,
    caps::Capability::CAP_MAC_ADMIN,
    caps::Capability::CAP_NET_ADMIN,
    caps::Capability::CAP_SYS_RESOURCE,
    caps::Capability::CAP_SYS_ADMIN,
    caps::Capability::CAP_DAC_READ_SEARCH,
    caps::Capability::CAP_DAC_OVERRIDE,
    caps::Capability::CAP_SYS_PTRACE,
    caps::Capability::CAP_FOWNER,
];

/// Keeps `keep` of the capabilities this process has and drops every
/// other from every set, the bounding set included (so no program it
/// could run gets them back); ambient and inheritable are cleared.
pub fn keep_only(keep: &[caps::Capability]) -> Result<(), caps::errors::CapsError> {
    use caps::CapSet;
    let keep: caps::CapsHashSet = keep.iter().copied().collect();
    for c in caps::all() {
        if !keep.contains(&c) {
            caps::drop(None, CapSet::Bounding, c)?;
        }
    }
    caps::clear(None, CapSet::Ambient)?;
    caps::clear(None, CapSet::Inheritable)?;
    let have = caps::read(None, CapSet::Permitted)?;
    let kept: caps::CapsHashSet = have.intersection(&keep).copied().collect();
    caps::set(None, CapSet::Effective, &kept)?;
    caps::set(None, CapSet::Permitted, &kept)?;
    Ok(())
}

/// The observer's whole life: runs observed on `sock` one after the other,
/// with the history's programs `loaded` once (or at the first `Begin`).
/// Returns when the supervisor ends the conversation between runs; the
/// first fault ends it too, after the fault is recorded and answered: an
/// observer that failed is not used again.
pub fn observe(
    mut sock: UnixStream,
    mut loaded: Option<Result<history::Loaded, String>>,
) -> Result<(), String> {
    loop {
        let begin = match wire::recv::<ToObserver>(&mut sock) {
            Ok(Some(ToObserver::Begin(b))) => b,
            Ok(Some(other)) => return Err(format!("expected Begin, got {other:?}")),
            Ok(None) => return Ok(()),
            Err(e) => return Err(format!("read Begin: {e}")),
        };
        let programs = match loaded.take() {
            Some(Ok(l)) if l.fits(&begin) => Ok(l),
            Some(Err(why)) => Err(why),
            _ => history::Loaded::load(begin.ring_bytes, begin.lsm, &begin.registry),
        };
        loaded = Some(Ok(observe_one(&mut sock, &begin, programs)?));
    }
}

/// One run: A sealed, B closed and answered; the programs back for the
/// next run.
fn observe_one(
    sock: &mut UnixStream,
    begin: &Begin,
    programs: Result<history::Loaded, String>,
) -> Result<history::Loaded, String> {
    // The files beside the chain made with it, empty: their names are
    // durable with A's records, so that B's need no sync of the directory.
    let beside = [HISTORY_FILE, PROCESSES_FILE, EFFECTS_FILE];
    let mut chain = match Chain::create_with(&begin.evidence, &beside) {
        Ok(c) => c,
        Err(e) => {
            let why = e.to_string();
            let _ = wire::send(
                sock,
                &FromObserver::Failed {
                    why: why.clone(),
                    head: String::new(),
                },
            );
            return Err(why);
        }
    };
    let started = programs.and_then(|p| Observation::start(begin, &mut chain, p));
    let mut obs = match started {
        Ok(o) => o,
        Err(why) => return Err(fail(sock, begin, &mut chain, None, why)),
    };
    if let Err(e) = wire::send(
        sock,
        &FromObserver::Sealed {
            baseline: chain.head().to_string(),
        },
    ) {
        return Err(fail(
            sock,
            begin,
            &mut chain,
            Some(obs),
            format!("answer Sealed: {e}"),
        ));
    }
    // A's records made durable while the run runs: what is left for the
    // end is B's.
    if let Err(e) = chain.sync_behind() {
        let why = format!("make A durable: {e}");
        return Err(fail(sock, begin, &mut chain, Some(obs), why));
    }
    let end = match wire::recv::<ToObserver>(sock) {
        Ok(Some(ToObserver::End(end))) => end,
        Ok(Some(other)) => {
            let why = format!("expected End, got {other:?}");
            return Err(fail(sock, begin, &mut chain, Some(obs), why));
        }
        Ok(None) => {
            let why = "the supervisor went away before the run's end".to_string();
            return Err(fail(sock, begin, &mut chain, Some(obs), why));
        }
        Err(e) => {
            return Err(fail(
                sock,
                begin,
                &mut chain,
                Some(obs),
                format!("read End: {e}"),
            ))
        }
    };
    match obs.finish(begin, &end, &mut chain, sock) {
        Ok(effects) => {
            // Answered first, while the last records are written back (the
            // supervisor verifies the set meanwhile); then durable.
            let sent = wire::send(sock, &FromObserver::Closed(Box::new(effects)));
            let durable = match chain.sync() {
                Ok(()) => FromObserver::Durable {
                    root: chain.head().to_string(),
                },
                Err(e) => FromObserver::Failed {
                    why: format!("make the evidence durable: {e}"),
                    head: chain.head().to_string(),
                },
            };
            // The snapshots go after the sync (Btrfs may commit the whole
            // transaction for a sync in a directory a subvolume was just
            // deleted from) and before `Durable`, after which the
            // supervisor starts the commit that has Btrfs drop them.
            obs.remove_snapshots();
            let sent = sent.and_then(|()| wire::send(sock, &durable));
            let loaded = obs.cleanup();
            sent.map_err(|e| format!("answer Closed: {e}"))?;
            if let FromObserver::Failed { why, .. } = durable {
                return Err(why);
            }
            loaded.ok_or_else(|| "the history's programs cannot be used again".to_string())
        }
        Err(why) => Err(fail(sock, begin, &mut chain, Some(obs), why)),
    }
}

/// Closes the chain with a `fault` record and tells the supervisor;
/// returns why. The record names the run: a fault before `begin` (at the
/// start) is then still one run's, its root no other's.
fn fail(
    sock: &mut UnixStream,
    begin: &Begin,
    chain: &mut Chain,
    obs: Option<Observation>,
    why: String,
) -> String {
    if let Some(o) = obs {
        o.cleanup();
    }
    let body = serde_json::json!({
        "why": why,
        "agent": begin.agent,
        "session": begin.session,
        "run": begin.run,
    });
    let head = match chain.append("fault", &body) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("allox-observe: cannot record the fault ({why}): {e}");
            chain.head().to_string()
        }
    };
    let _ = wire::send(
        sock,
        &FromObserver::Failed {
            why: why.clone(),
            head,
        },
    );
    why
}

/// What the observer holds between A and B.
struct Observation {
    history: Arc<Mutex<History>>,
    drain: Option<std::thread::JoinHandle<()>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    snaps_a: files::Snapshots,
    /// Whether the snapshots were deleted.
    snapshots_removed: bool,
    snaps_b: Option<files::Snapshots>,
    /// Protocol v3: the workspace after its restore.
    snaps_c: Option<files::Snapshots>,
    captures_a: BTreeMap<EffectsDomain, Capture>,
    /// Its own BPF objects during the run (when `bpf` is in scope).
    own: std::collections::HashSet<String>,
    fs: Option<domains::FsWatch>,
    started_ms: u64,
    /// How long each step took (in the `close` record).
    phases: Phases,
}

/// The time each step of an observation took, in µs.
struct Phases {
    at: std::time::Instant,
    took: Vec<(String, u64)>,
}

impl Phases {
    fn new() -> Phases {
        Phases {
            at: std::time::Instant::now(),
            took: Vec::new(),
        }
    }

    fn done(&mut self, what: &str) {
        let now = std::time::Instant::now();
        self.took.push((
            what.to_string(),
            now.duration_since(self.at).as_micros() as u64,
        ));
        self.at = now;
    }

    /// Notes a step that ran beside others (not counted in the sequence).
    fn beside(&mut self, what: String, us: u64) {
        self.took.push((what, us));
    }

    fn json(&self) -> serde_json::Value {
        self.took
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::from(*v)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
}

impl Observation {
    /// Attaches the history, starts the filesystem watch, captures A and
    /// writes `begin` and `capture_a`.
    fn start(
        begin: &Begin,
        chain: &mut Chain,
        programs: history::Loaded,
    ) -> Result<Observation, String> {
        let started_ms = allox_store::clock::now_ms();
        let mut phases = Phases::new();
        let history = History::attach(begin, programs)?;
        // Its own objects, the run's links among them, known here rather
        // than read from its descriptors by each bpf capture.
        let own = if begin.scope.domains.contains(&EffectsDomain::Bpf) {
            history.objects()
        } else {
            Default::default()
        };
        phases.done("history_attach");
        let history = Arc::new(Mutex::new(history));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let drain = {
            let (h, stop) = (history.clone(), stop.clone());
            std::thread::Builder::new()
                .name("history".into())
                .spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        h.lock().unwrap_or_else(|e| e.into_inner()).poll();
                        // Woken at once when the run ends (unpark).
                        std::thread::park_timeout(std::time::Duration::from_millis(10));
                    }
                })
                .map_err(|e| format!("start the history's reader: {e}"))?
        };
        let fs = domains::FsWatch::start(begin)?;
        phases.done("watch_start");
        let (snaps_a, mut captures_a, took) = capture_all(begin, files::POINTS[0], &[], &own);
        for (what, us) in took {
            phases.beside(what, us);
        }
        let snaps_a = snaps_a?;
        captures_a.insert(EffectsDomain::Workspace, files::identity(&snaps_a));
        let body = captures_body(&captures_a);
        // Encoded once: its hash is the baseline, its bytes the record.
        let body = chain::Canonical::of(&body)?;
        let baseline = chain::sha256_hex(body.bytes());
        chain
            .append_later(
                "begin",
                &serde_json::json!({
                    "protocol": protocol_of(begin),
                    "recovery": begin.recovery,
                    "agent": begin.agent,
                    "session": begin.session,
                    "run": begin.run,
                    "argv": begin.argv,
                    "scope": begin.scope,
                    "cgroup_id": begin.cgroup_id,
                    "executables": begin.executables,
                    "kernel": kernel(),
                    "boot_id": std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                        .map(|s| s.trim().to_string())
                        .unwrap_or_default(),
                    "baseline": baseline,
                    "started_ms": started_ms,
                }),
            )
            .map_err(|e| e.to_string())?;
        phases.done("captures_a");
        // Not synced before the run is let go (but beside it, once it is):
        // the pending marker fences the session if the machine stops
        // before B, and B's seal waits for every record to be durable
        // before the answer.
        chain
            .append_canonical_later("capture_a", body)
            .map_err(|e| e.to_string())?;
        phases.done("chain_a");
        Ok(Observation {
            history,
            drain: Some(drain),
            stop,
            snaps_a,
            snapshots_removed: false,
            snaps_b: None,
            snaps_c: None,
            captures_a,
            own,
            fs,
            started_ms,
            phases,
        })
    }

    /// Captures B, compares, writes the rest of the chain, verifies it.
    fn finish(
        &mut self,
        begin: &Begin,
        end: &End,
        chain: &mut Chain,
        sock: &mut UnixStream,
    ) -> Result<RunEffects, String> {
        // The tree has exited: what the kernel side made is all there is.
        self.phases.at = std::time::Instant::now();
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.drain.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        let (records, counters, history_note, processes) = {
            let mut h = self.history.lock().unwrap_or_else(|e| e.into_inner());
            h.poll();
            let (r, c, n) = h.finish();
            (r, c, n, h.take_processes())
        };
        self.phases.done("history_drain");
        let fs_seen = self.fs.take().map(|w| w.stop());
        self.phases.done("watch_stop");
        let survivors = with_lineage(&end.survivors, &records);
        // What the run's processes did, the sandbox's init (which builds
        // the run's own mounts in its own namespaces) left out.
        let acting: Vec<HistoryRecord> = records
            .iter()
            .filter(|r| Some(r.pid) != end.init_pid)
            .cloned()
            .collect();
        let err = |e: chain::ChainError| e.to_string();
        // B's captures start at once (the snapshots' commit is most of
        // them); the history, all there is now, is written beside them
        // (the files beside the chain, which holds their hashes, and its
        // record), made durable with B's records after `Closed` (a sync
        // beside the snapshots' commit waits for it, and slows it).
        let ((snaps_b, mut captures_b, took), written) = std::thread::scope(|s| {
            let b = s.spawn(|| capture_all(begin, files::POINTS[1], &records, &self.own));
            let t = std::time::Instant::now();
            let written = write_history(chain, &records, &processes, &counters);
            let us = t.elapsed().as_micros() as u64;
            let b = b.join().unwrap_or_else(|_| {
                (
                    Err("the captures at B panicked".to_string()),
                    BTreeMap::new(),
                    Vec::new(),
                )
            });
            (b, written.map(|()| us))
        });
        let written = written.inspect_err(|_| {
            if let Ok(s) = &snaps_b {
                s.remove();
            }
        })?;
        self.phases.beside("chain_history".to_string(), written);
        for (what, us) in took {
            self.phases.beside(what, us);
        }
        let snaps_b = snaps_b?;
        // The history's files, written beside B's captures, made durable
        // while B is compared (B's snapshots are taken: no commit to slow).
        if let Err(e) = chain.sync_beside_behind() {
            snaps_b.remove();
            return Err(err(e));
        }
        captures_b.insert(EffectsDomain::Workspace, files::identity(&snaps_b));
        self.phases.done("captures_b");
        let mut domains_out = Vec::new();
        for d in EffectsDomain::ALL {
            let mut de = unobserved(d);
            if !begin.scope.observes(d) {
                de.note = Some("not in the scope".into());
                domains_out.push(de);
                continue;
            }
            let (diffs, truncated, gaps) = differences(
                d,
                (&self.snaps_a, &snaps_b),
                (&self.captures_a, &captures_b),
                ("A", "B"),
                &mut de.items,
            );
            let extra = domains::extra(d, fs_seen.as_ref(), &survivors);
            let mut gaps = gaps;
            gaps.extend(extra.gaps);
            let changes: Vec<EffectChange> = diffs
                .into_iter()
                .chain(extra.differences)
                .map(|diff| {
                    let by = domains::attribute(d, begin, &diff, &acting, fs_seen.as_ref());
                    to_change(diff, by)
                })
                .collect();
            settle(&mut de, changes, truncated, &gaps, history_note.as_deref());
            domains_out.push(de);
        }
        if let Some(f) = &end.fault {
            for de in domains_out.iter_mut() {
                if de.verdict != EffectsVerdict::NotObserved {
                    de.verdict = EffectsVerdict::Incomplete;
                    de.note = Some(f.clone());
                }
            }
        }
        let verdict = domains_out
            .iter()
            .fold(EffectsVerdict::NotObserved, |v, d| v.worst(d.verdict));
        self.phases.done("compare");
        chain
            .append_later("capture_b", &captures_body(&captures_b))
            .map_err(err)?;
        chain
            .append_later(
                "verdict",
                &serde_json::json!({
                    "verdict": verdict,
                    "domains": &domains_out,
                    "survivors": &survivors,
                    "status": end.status,
                }),
            )
            .map_err(err)?;
        self.phases.done("chain_b");
        let recovery = match &begin.recovery {
            None => None,
            Some(plan) => Some(self.recover(
                RecoverCtx {
                    begin,
                    plan,
                    records: &records,
                    captures_b: &captures_b,
                    snaps_b: &snaps_b,
                    ab: &domains_out,
                    history_note: history_note.as_deref(),
                },
                chain,
                sock,
            )?),
        };
        // Made durable after `Closed` is answered ([`observe_one`]).
        let root = chain
            .append_later(
                "close",
                &serde_json::json!({ "counters": counters, "phases_us": self.phases.json() }),
            )
            .map_err(err)?;
        self.snaps_b = Some(snaps_b);
        // The chain as written is read back by the verifier, an
        // executable of its own the supervisor runs once this answers.
        let (fenced, fence_reason) = fenced(verdict, recovery.as_ref());
        let effects = RunEffects {
            protocol: protocol_of(begin),
            agent_id: begin.agent.clone(),
            session_id: begin.session.clone(),
            run_id: begin.run.clone(),
            evidence_root: root,
            verdict,
            domains: domains_out,
            fenced,
            fence_reason,
            survivors,
            history: counters,
            started_ms: self.started_ms,
            closed_ms: allox_store::clock::now_ms(),
            recovery: recovery.map(Box::new),
        };
        // Durable with the chain: what `effects.get` reads after a power cut.
        chain
            .write_beside(
                EFFECTS_FILE,
                &serde_json::to_vec(&effects).map_err(|e| e.to_string())?,
            )
            .map_err(|e| format!("write {EFFECTS_FILE}: {e}"))?;
        Ok(effects)
    }

    /// Deletes the run's snapshots (once).
    fn remove_snapshots(&mut self) {
        if std::mem::replace(&mut self.snapshots_removed, true) {
            return;
        }
        self.snaps_a.remove();
        for s in [&self.snaps_b, &self.snaps_c].into_iter().flatten() {
            s.remove();
        }
    }

    /// Deletes the snapshots and stops the reader; the history's
    /// programs come back for the next run when they can be used again.
    fn cleanup(mut self) -> Option<history::Loaded> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.drain.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        self.remove_snapshots();
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take_loaded()
    }
}

/// What a protocol v3 recovery works from: the run's B.
struct RecoverCtx<'a> {
    begin: &'a Begin,
    plan: &'a wire::RecoveryPlan,
    records: &'a [HistoryRecord],
    captures_b: &'a BTreeMap<EffectsDomain, Capture>,
    snaps_b: &'a files::Snapshots,
    /// The A→B domains (a residue names who made it there).
    ab: &'a [DomainEffects],
    /// Why the history is incomplete, if it is.
    history_note: Option<&'a str>,
}

impl Observation {
    /// Protocol v3, after B's records: makes them durable, answers
    /// `CapturedB`, waits for the supervisor's `Recovered`, records what
    /// it did (`recover`), captures C (`capture_c`) and compares B→C and
    /// A→C (`recovery_verdict`).
    fn recover(
        &mut self,
        x: RecoverCtx<'_>,
        chain: &mut Chain,
        sock: &mut UnixStream,
    ) -> Result<allox_protocol::RecoveryEffects, String> {
        chain.sync().map_err(|e| e.to_string())?;
        wire::send(
            sock,
            &FromObserver::CapturedB {
                head: chain.head().to_string(),
            },
        )
        .map_err(|e| format!("answer CapturedB: {e}"))?;
        let rec = match wire::recv::<ToObserver>(sock) {
            Ok(Some(ToObserver::Recovered(r))) => r,
            Ok(Some(other)) => return Err(format!("expected Recovered, got {other:?}")),
            Ok(None) => {
                return Err("the supervisor went away before the workspace was restored".into())
            }
            Err(e) => return Err(format!("read Recovered: {e}")),
        };
        self.phases.at = std::time::Instant::now();
        chain
            .append_later(
                "recover",
                &serde_json::json!({
                    "checkpoint_id": x.plan.checkpoint_id,
                    "restore": rec.restore,
                    "scrubbed": rec.scrubbed,
                }),
            )
            .map_err(|e| e.to_string())?;
        let restore = rec
            .restore
            .clone()
            .map_err(|why| format!("the workspace restore failed: {why}"))?;
        let mut at_c = x.begin.clone();
        at_c.context_pid = rec.context_pid;
        let own = if at_c.scope.domains.contains(&EffectsDomain::Bpf) {
            self.history
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .objects()
        } else {
            Default::default()
        };
        let (snaps_c, mut captures_c, took) = capture_all(&at_c, files::POINTS[2], x.records, &own);
        for (what, us) in took {
            self.phases.beside(what, us);
        }
        let snaps_c = snaps_c?;
        captures_c.insert(EffectsDomain::Workspace, files::identity(&snaps_c));
        self.snaps_c = Some(snaps_c);
        let snaps_c = self.snaps_c.as_ref().expect("just set");
        self.phases.done("captures_c");
        chain
            .append_later("capture_c", &captures_body(&captures_c))
            .map_err(|e| e.to_string())?;
        let compare_to_c = |from: &BTreeMap<EffectsDomain, Capture>,
                            snaps: &files::Snapshots,
                            label: &str,
                            by_recovery: bool| {
            EffectsDomain::ALL
                .into_iter()
                .map(|d| {
                    let mut de = unobserved(d);
                    if !x.begin.scope.observes(d) {
                        de.note = Some("not in the scope".into());
                        return de;
                    }
                    let (diffs, truncated, gaps) = differences(
                        d,
                        (snaps, snaps_c),
                        (from, &captures_c),
                        (label, "C"),
                        &mut de.items,
                    );
                    let changes: Vec<EffectChange> = diffs
                        .into_iter()
                        .map(|diff| {
                            let by = if by_recovery && d == EffectsDomain::Workspace {
                                Attribution {
                                    by: allox_protocol::By::Recovery,
                                    agent_id: None,
                                    session_id: None,
                                    run_id: None,
                                }
                            } else {
                                // A residue is whoever made it between A and B.
                                x.ab.iter()
                                    .find(|e| e.domain == d)
                                    .and_then(|e| e.changes.iter().find(|c| c.item == diff.key))
                                    .map(|c| c.by.clone())
                                    .unwrap_or_else(Attribution::unknown)
                            };
                            to_change(diff, by)
                        })
                        .collect();
                    settle(&mut de, changes, truncated, &gaps, x.history_note);
                    de
                })
                .collect::<Vec<_>>()
        };
        let b_to_c = compare_to_c(x.captures_b, x.snaps_b, "B", true);
        let a_to_c = compare_to_c(&self.captures_a, &self.snaps_a, "A", false);
        let worst = |ds: &[DomainEffects]| {
            ds.iter()
                .fold(EffectsVerdict::NotObserved, |v, d| v.worst(d.verdict))
        };
        let (b_to_c_verdict, a_to_c_verdict) = (worst(&b_to_c), worst(&a_to_c));
        let consistent = consistent(&a_to_c);
        self.phases.done("compare_c");
        chain
            .append_later(
                "recovery_verdict",
                &serde_json::json!({
                    "b_to_c_verdict": b_to_c_verdict,
                    "a_to_c_verdict": a_to_c_verdict,
                    "b_to_c": &b_to_c,
                    "a_to_c": &a_to_c,
                    "consistent": consistent,
                }),
            )
            .map_err(|e| e.to_string())?;
        Ok(allox_protocol::RecoveryEffects {
            checkpoint_id: x.plan.checkpoint_id.clone(),
            baseline_made: x.plan.baseline_made,
            scrub_runtime: x.plan.scrub_runtime,
            require_consistent: x.plan.require_consistent,
            restore,
            b_to_c_verdict,
            a_to_c_verdict,
            b_to_c,
            a_to_c,
            consistent,
            scrubbed: rec.scrubbed.clone(),
        })
    }
}

/// Domain `d`'s differences between two points (`labels`, as gaps name
/// them): the snapshots' for `workspace` and `shared`, the captures' for
/// the rest (their item counts into `items`); whether the listing was
/// cut; the gaps.
fn differences(
    d: EffectsDomain,
    (from, to): (&files::Snapshots, &files::Snapshots),
    (caps_from, caps_to): (
        &BTreeMap<EffectsDomain, Capture>,
        &BTreeMap<EffectsDomain, Capture>,
    ),
    (la, lb): (&str, &str),
    items: &mut [u64; 2],
) -> (Vec<Difference>, bool, Vec<String>) {
    let walked = |r: Result<(Vec<Difference>, bool), String>| match r {
        Ok((dd, t)) => (dd, t, Vec::new()),
        Err(e) => (Vec::new(), false, vec![e]),
    };
    match d {
        EffectsDomain::Workspace => walked(files::diff(&from.workspace, &to.workspace, true)),
        EffectsDomain::Shared => walked(files::diff(&from.shared(), &to.shared(), false)),
        _ => match (caps_from.get(&d), caps_to.get(&d)) {
            (Some(a), Some(b)) => {
                *items = [a.items.len() as u64, b.items.len() as u64];
                let mut gaps: Vec<String> =
                    a.gaps.iter().map(|g| format!("at {la}: {g}")).collect();
                gaps.extend(b.gaps.iter().map(|g| format!("at {lb}: {g}")));
                (crate::collect::compare(a, b), false, gaps)
            }
            _ => (Vec::new(), false, vec!["no capture".to_string()]),
        },
    }
}

/// Domain `d` before anything is known of it.
fn unobserved(d: EffectsDomain) -> DomainEffects {
    DomainEffects {
        domain: d,
        verdict: EffectsVerdict::NotObserved,
        changes: Vec::new(),
        truncated: false,
        note: None,
        items: [0, 0],
    }
}

/// A domain given its changes and gaps: listed up to the cut, its
/// verdict, its note; lost history makes it INCOMPLETE.
fn settle(
    de: &mut DomainEffects,
    mut changes: Vec<EffectChange>,
    truncated: bool,
    gaps: &[String],
    history_note: Option<&str>,
) {
    de.truncated = truncated || changes.len() > files::MAX_LISTED;
    changes.truncate(files::MAX_LISTED);
    de.verdict = if !gaps.is_empty() {
        EffectsVerdict::Incomplete
    } else if !changes.is_empty() {
        EffectsVerdict::Changed
    } else {
        EffectsVerdict::Consistent
    };
    if !gaps.is_empty() {
        de.note = Some(gaps.join("; "));
    }
    if let Some(n) = history_note {
        if de.verdict != EffectsVerdict::Incomplete {
            de.verdict = EffectsVerdict::Incomplete;
            de.note = Some(n.to_string());
        }
    }
    de.changes = changes;
}

/// A→C leaves nothing of the run: every observed domain CONSISTENT.
pub fn consistent(a_to_c: &[DomainEffects]) -> bool {
    a_to_c.iter().all(|d| {
        matches!(
            d.verdict,
            EffectsVerdict::Consistent | EffectsVerdict::NotObserved
        )
    })
}

/// The protocol a run follows: v3 with recovery, else v2.
pub fn protocol_of(begin: &Begin) -> u32 {
    if begin.recovery.is_some() {
        allox_protocol::EFFECTS_PROTOCOL_RECOVERY
    } else {
        EFFECTS_PROTOCOL
    }
}

/// Whether a closed run fences its session, and why: INCOMPLETE evidence
/// (A→B, B→C or A→C), or a v3 run whose A→C is not CONSISTENT while it
/// requires it (the residue named).
pub fn fenced(
    verdict: EffectsVerdict,
    recovery: Option<&allox_protocol::RecoveryEffects>,
) -> (bool, Option<String>) {
    let incomplete = verdict == EffectsVerdict::Incomplete
        || recovery.is_some_and(|r| {
            r.b_to_c_verdict == EffectsVerdict::Incomplete
                || r.a_to_c_verdict == EffectsVerdict::Incomplete
        });
    if incomplete {
        return (true, Some("the evidence is INCOMPLETE".into()));
    }
    match recovery {
        Some(r) if r.require_consistent && !r.consistent => {
            let residue: Vec<String> = r
                .a_to_c
                .iter()
                .flat_map(|d| {
                    d.changes
                        .iter()
                        .map(move |c| format!("{} {}", d.domain.as_str(), c.item))
                })
                .take(10)
                .collect();
            (
                true,
                Some(format!(
                    "A→C is not CONSISTENT after recovery (require_consistent): residue {}",
                    residue.join(", ")
                )),
            )
        }
        _ => (false, None),
    }
}

/// Writes the history beside the chain (`history.json`, `processes.json`)
/// and its record, which holds their hashes (made durable with the next
/// sync).
fn write_history(
    chain: &mut Chain,
    records: &[HistoryRecord],
    processes: &impl serde::Serialize,
    counters: &impl serde::Serialize,
) -> Result<(), String> {
    let history_json = serde_json::to_vec(records).map_err(|e| e.to_string())?;
    chain
        .write_beside(HISTORY_FILE, &history_json)
        .map_err(|e| format!("write the history: {e}"))?;
    let processes_json = serde_json::to_vec(processes).map_err(|e| e.to_string())?;
    chain
        .write_beside(PROCESSES_FILE, &processes_json)
        .map_err(|e| format!("write the process events: {e}"))?;
    chain
        .append_later(
            "history",
            &serde_json::json!({
                "records": records.len(),
                "sha256": chain::sha256_hex(&history_json),
                "processes_sha256": chain::sha256_hex(&processes_json),
                "counters": counters,
            }),
        )
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Capture `which` (`a` or `b`): the workspace snapshots and each scoped
/// domain, all at once, each on a thread of its own (they read different
/// things; the longest decides how long the capture takes). Also how long
/// each took, in µs, named `<which>.<what>`.
#[allow(clippy::type_complexity)]
fn capture_all(
    begin: &Begin,
    which: &str,
    records: &[HistoryRecord],
    own: &std::collections::HashSet<String>,
) -> (
    Result<files::Snapshots, String>,
    BTreeMap<EffectsDomain, Capture>,
    Vec<(String, u64)>,
) {
    let timed = |f: &dyn Fn() -> Option<Capture>| {
        let t = std::time::Instant::now();
        let c = f();
        (c, t.elapsed().as_micros() as u64)
    };
    std::thread::scope(|s| {
        let snaps = s.spawn(|| {
            let t = std::time::Instant::now();
            let r = files::Snapshots::take(
                &begin.evidence,
                which,
                &begin.workspace,
                &begin.agent_workspace,
            );
            (r, t.elapsed().as_micros() as u64)
        });
        let domains: Vec<_> = begin
            .scope
            .domains
            .iter()
            .copied()
            .map(|d| {
                (
                    d,
                    s.spawn(move || timed(&|| domains::capture(d, begin, records, own))),
                )
            })
            .collect();
        let mut captures = BTreeMap::new();
        let mut took = Vec::new();
        for (d, h) in domains {
            let (c, us) = h.join().unwrap_or_else(|_| {
                let mut c = Capture::new();
                c.gap(format!("{}: the capture panicked", d.as_str()));
                (Some(c), 0)
            });
            took.push((format!("{which}.{}", d.as_str()), us));
            if let Some(c) = c {
                captures.insert(d, c);
            }
        }
        let (snaps, us) = snaps
            .join()
            .unwrap_or_else(|_| (Err(format!("the snapshots at {which} panicked")), 0));
        took.push((format!("{which}.snapshots"), us));
        (snaps, captures, took)
    })
}

/// A `capture_a`, `capture_b` or `capture_c` record's body: the captures
/// by their domains' names, the order of its canonical JSON (written as
/// it is, never built as a `serde_json::Value`: `chain::canonical`).
#[derive(serde::Serialize)]
struct CapturesBody<'a> {
    captures: BTreeMap<&'static str, &'a crate::collect::Capture>,
}

fn captures_body(c: &BTreeMap<EffectsDomain, crate::collect::Capture>) -> CapturesBody<'_> {
    CapturesBody {
        captures: c.iter().map(|(d, c)| (d.as_str(), c)).collect(),
    }
}

/// `survivors` with their lineage from the history's forks when it says
/// more than the supervisor could read (a process whose parent exited was
/// re-parented to the sandbox's init: `/proc` no longer shows where it
/// came from; the history does).
fn with_lineage(
    survivors: &[allox_protocol::Survivor],
    history: &[HistoryRecord],
) -> Vec<allox_protocol::Survivor> {
    let parent: std::collections::HashMap<u32, u32> = history
        .iter()
        .filter(|r| r.kind == "fork")
        .filter_map(|r| Some((r.pid, r.ppid?)))
        .collect();
    // The run's own processes: its lineage stops at the first that is
    // not (the supervisor that made the sandbox's init).
    let ours: std::collections::HashSet<u32> = history.iter().map(|r| r.pid).collect();
    survivors
        .iter()
        .map(|s| {
            let mut lineage = Vec::new();
            let mut at = s.pid;
            while let Some(&p) = parent.get(&at) {
                if !ours.contains(&p) || lineage.contains(&p) || lineage.len() >= 64 {
                    break;
                }
                lineage.push(p);
                at = p;
            }
            let mut s = s.clone();
            if lineage.len() > s.lineage.len() {
                s.lineage = lineage;
            }
            s
        })
        .collect()
}

fn to_change(d: Difference, by: Attribution) -> EffectChange {
    EffectChange {
        item: d.key,
        kind: d.kind,
        before: d.before,
        after: d.after,
        by,
    }
}

fn kernel() -> String {
    let u = rustix::system::uname();
    format!(
        "{} {}",
        u.release().to_string_lossy(),
        u.version().to_string_lossy()
    )
}

/// The history records of `dir`'s run (for `effects.history`).
pub fn read_history(dir: &std::path::Path) -> std::io::Result<Vec<HistoryRecord>> {
    let bytes = std::fs::read(dir.join(HISTORY_FILE))?;
    serde_json::from_slice(&bytes).map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::Preload;

    /// A capture record's body is written straight as its canonical JSON
    /// (never built as a `Value`), and it is the canonicalizer's.
    #[test]
    fn a_capture_body_is_written_straight_in_canonical_form() {
        use allox_protocol::EffectsDomain;
        let mut all = std::collections::BTreeMap::new();
        for d in EffectsDomain::ALL {
            let mut c = crate::collect::Capture::new();
            c.insert(format!("{} b", d.as_str()), "x \"y\" \u{1}");
            c.insert(format!("{} a", d.as_str()), "é");
            c.gap("one thing unseen");
            all.insert(d, c);
        }
        let body = super::captures_body(&all);
        let direct = serde_json::to_vec(&body).unwrap();
        assert!(crate::chain::surely_canonical(&direct));
        let value = serde_json::to_value(&body).unwrap();
        assert_eq!(direct, serde_json_canonicalizer::to_vec(&value).unwrap());
        // What the verifier reads back.
        let back: std::collections::BTreeMap<EffectsDomain, crate::collect::Capture> =
            serde_json::from_value(value["captures"].clone()).unwrap();
        assert_eq!(back, all);
    }

    fn parse(a: &[&str]) -> Result<Option<Preload>, String> {
        Preload::from_args(a.iter().map(|s| s.to_string()))
    }

    #[test]
    fn the_history_is_loaded_ahead_only_when_told_how() {
        assert_eq!(parse(&[]), Ok(None));
        assert_eq!(
            parse(&["--ring-bytes", "8192", "--without-lsm", "--registry", "/r"]),
            Ok(Some(Preload {
                ring_bytes: 8192,
                lsm: false,
                registry: "/r".into(),
            }))
        );
        for bad in [
            &["--ring-bytes", "x", "--registry", "/r"][..],
            &["--ring-bytes", "8192"][..],
            &["--without-lsm"][..],
            &["--registry"][..],
            &["--other"][..],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
