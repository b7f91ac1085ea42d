//! The run's history, from the kernel: the observer's own eBPF programs
//! (`allox_ebpf_probes::History`: fork/exec/exit, system calls, BPF LSM
//! hooks, the cgroup's sysctl accesses), filtered in the kernel by the
//! run's cgroup id and then by lineage. Its records are kept in order, up
//! to [`MAX_RECORDS`]; its counters make any loss exact.

use super::wire::Begin;
use allox_ebpf_probes::History as Programs;
use allox_protocol::{HistoryCounters, HistoryRecord, ProcessEvent, ProcessEventKind};

/// Most records kept for one run; more are counted and make the history
/// incomplete.
pub const MAX_RECORDS: usize = 1_000_000;

/// The history's programs, loaded once per observer and kept across the
/// runs it observes one after the other: loading and verifying them is
/// most of what an observation would cost otherwise.
pub struct Loaded {
    programs: Programs,
    ring_bytes: u32,
    lsm: bool,
    /// The tag of the last run watched (each run its own).
    tag: u64,
}

impl Loaded {
    /// Loads the programs (with or without the BPF LSM hooks) and lists
    /// their objects in `registry` under this process's id.
    pub fn load(ring_bytes: u32, lsm: bool, registry: &std::path::Path) -> Result<Loaded, String> {
        // Made, probed for and listed under the registry's lock: no other
        // observer's capture lists an object of these until they are
        // listed (aya's probes make and drop maps of their own on the way).
        let _made = lock_registry(registry, true);
        // Listed first with no object: while it loads, the objects it makes
        // and drops are other observers' to leave out (they read the
        // descriptors of every observer listed).
        register(registry, &std::process::id().to_string(), &[], &[], &[])?;
        let loaded = load_settled(
            || {
                if lsm {
                    Programs::load(ring_bytes)
                } else {
                    Programs::load_without_lsm(ring_bytes)
                }
            },
            Programs::objects,
        );
        let p = loaded.map_err(|e| format!("load the history's programs: {}", chain(&e)))?;
        let o = p.objects();
        register(
            registry,
            &std::process::id().to_string(),
            &o.progs,
            &o.maps,
            &o.links,
        )?;
        Ok(Loaded {
            programs: p,
            ring_bytes,
            lsm,
            tag: 0,
        })
    }

    /// Whether these programs are what `begin` asks for.
    pub fn fits(&self, begin: &Begin) -> bool {
        self.ring_bytes == begin.ring_bytes && self.lsm == begin.lsm
    }
}

/// The history of one run.
pub struct History {
    loaded: Option<Loaded>,
    tag: u64,
    /// Where the observers list their objects (and lock while they make
    /// or drop them).
    registry: std::path::PathBuf,
    /// Whose run it is, for its process events.
    owner: (String, String, String),
    /// Wall-clock milliseconds at boot (the records' times are since boot).
    boot_ms: i128,
    /// The run's forks, execs and exits, as `process.events` answers them
    /// (kept up to [`MAX_RECORDS`] too).
    processes: Vec<ProcessEvent>,
    /// The counters when the run began: the run's are the difference.
    base: allox_ebpf_probes::Counters,
    records: Vec<HistoryRecord>,
    /// Records received but not kept (past [`MAX_RECORDS`]).
    dropped: u64,
}

impl History {
    /// This observer's own BPF objects now (`prog N`, `map N`, `link N`),
    /// the links attached for the run among them: not the machine's state.
    pub fn objects(&self) -> std::collections::HashSet<String> {
        let Some(l) = &self.loaded else {
            return Default::default();
        };
        let o = l.programs.objects();
        [("prog", &o.progs), ("map", &o.maps), ("link", &o.links)]
            .into_iter()
            .flat_map(|(kind, ids)| ids.iter().map(move |id| format!("{kind} {id}")))
            .collect()
    }

    /// Watches `begin`'s cgroup (made and still empty) with `loaded`'s
    /// programs under a tag of the run's own, and attaches the sysctl
    /// program to it. On failure the programs are dropped (the observer
    /// stops after a fault).
    pub fn attach(begin: &Begin, mut loaded: Loaded) -> Result<History, String> {
        // Whatever an earlier run left in the ring is read and counted
        // now, not charged to this run.
        loaded.programs.poll(|_| {});
        loaded.tag += 1;
        let tag = loaded.tag;
        let base = loaded.programs.counters();
        let p = &mut loaded.programs;
        p.watch(begin.cgroup_id, tag)
            .map_err(|e| format!("watch the run's cgroup: {}", chain(&e)))?;
        let cg = std::fs::File::open(&begin.cgroup)
            .map_err(|e| format!("open the run's cgroup {}: {e}", begin.cgroup.display()))?;
        {
            // The run's sysctl link, made under the registry's lock: held
            // by this observer from then on, which the others' captures
            // read.
            let _made = lock_registry(&begin.registry, true);
            p.attach_sysctl(tag, &cg)
                .map_err(|e| format!("attach the sysctl program: {}", chain(&e)))?;
        }
        Ok(History {
            loaded: Some(loaded),
            tag,
            registry: begin.registry.clone(),
            owner: (
                begin.agent.clone(),
                begin.session.clone(),
                begin.run.clone(),
            ),
            boot_ms: allox_store::clock::now_ms() as i128
                - allox_store::clock::since_boot().as_millis() as i128,
            processes: Vec::new(),
            base,
            records: Vec::new(),
            dropped: 0,
        })
    }

    /// Reads what the kernel side has made since the last call.
    pub fn poll(&mut self) {
        let Some(l) = self.loaded.as_mut() else {
            return;
        };
        let (records, dropped, tag) = (&mut self.records, &mut self.dropped, self.tag);
        let (processes, owner, boot_ms) = (&mut self.processes, &self.owner, self.boot_ms);
        l.programs.poll(|r| {
            if r.tag != tag {
                return;
            }
            if records.len() < MAX_RECORDS {
                if let Some(e) = process_event(&r, owner, boot_ms) {
                    processes.push(e);
                }
                records.push(r.to_protocol());
            } else {
                *dropped += 1;
            }
        });
    }

    /// Drains what is left (the run's tree has exited), stops watching
    /// the run, and returns the records, the run's counters, and why the
    /// history is incomplete if it is. The programs stay loaded, for the
    /// next run: [`take_loaded`](History::take_loaded).
    pub fn finish(&mut self) -> (Vec<HistoryRecord>, HistoryCounters, Option<String>) {
        if self.loaded.is_none() {
            return (
                std::mem::take(&mut self.records),
                HistoryCounters::default(),
                Some("the history's programs were not attached".into()),
            );
        }
        // Until the ring is empty: nothing of the run writes to it now.
        loop {
            let before = self.records.len() as u64 + self.dropped;
            self.poll();
            if self.records.len() as u64 + self.dropped == before {
                break;
            }
        }
        let l = self.loaded.as_mut().expect("checked above");
        let now = l.programs.counters();
        let mut note = None;
        // The run's sysctl link is dropped under the registry's lock.
        let dropped = {
            let _dropping = lock_registry(&self.registry, true);
            l.programs.unwatch(self.tag)
        };
        if let Err(e) = dropped {
            // Programs that cannot stop watching are not used again.
            note = Some(format!("stop watching the run: {}", chain(&e)));
            self.loaded = None;
        }
        let emitted = now.emitted.saturating_sub(self.base.emitted);
        let received = now.received.saturating_sub(self.base.received);
        let c = HistoryCounters {
            emitted,
            received,
            lost: emitted.saturating_sub(received),
            syscalls: now.syscalls.saturating_sub(self.base.syscalls),
            refused: now.refused.saturating_sub(self.base.refused),
        };
        if c.lost > 0 {
            note = Some(format!(
                "the history lost {} of {} records (its ring buffer was full: --system-effects-ring-bytes)",
                c.lost, c.emitted
            ));
        } else if self.dropped > 0 {
            note = Some(format!(
                "the history kept {MAX_RECORDS} records and dropped {} more",
                self.dropped
            ));
        }
        (std::mem::take(&mut self.records), c, note)
    }

    /// The run's process events (fork, exec, exit), taken.
    pub fn take_processes(&mut self) -> Vec<ProcessEvent> {
        std::mem::take(&mut self.processes)
    }

    /// The programs, once the run is finished, for the next run (none if
    /// they could not stop watching this one).
    pub fn take_loaded(&mut self) -> Option<Loaded> {
        self.loaded.take()
    }
}

/// A fork, exec or exit record as a process event of `owner`'s run
/// (`process.events`); `None` for the other kinds.
pub fn process_event(
    r: &allox_ebpf_probes::HistoryRecord,
    owner: &(String, String, String),
    boot_ms: i128,
) -> Option<ProcessEvent> {
    use allox_ebpf_probes::HistoryKind;
    let kind = match r.kind {
        HistoryKind::Fork => ProcessEventKind::Fork,
        HistoryKind::Exec => ProcessEventKind::Exec,
        HistoryKind::Exit => ProcessEventKind::Exit,
        _ => return None,
    };
    let (exit_code, signal) = match (kind, r.ret as i32) {
        (ProcessEventKind::Exit, w) if w & 0x7f == 0 => (Some((w >> 8) & 0xff), None),
        (ProcessEventKind::Exit, w) => (None, Some(w & 0x7f)),
        _ => (None, None),
    };
    Some(ProcessEvent {
        seq: 0,
        time_ms: (r.time_ns as i128 / 1_000_000 + boot_ms).max(0) as u64,
        kind,
        agent_id: owner.0.clone(),
        session_id: owner.1.clone(),
        run_id: owner.2.clone(),
        pid: r.args[0] as u32,
        ppid: r.args[1] as u32,
        host_pid: r.tgid,
        host_ppid: r.ppid,
        comm: r.comm.clone(),
        filename: (kind == ProcessEventKind::Exec).then(|| r.text.clone()),
        exit_code,
        signal,
        evicted: None,
    })
}

/// The longest wait for the BPF objects a load made and dropped on its
/// way to be gone ([`load_settled`]).
pub const TRANSIENT_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs `load`, which makes BPF objects (those `own` lists, and the ones
/// aya's feature probes make and drop on the way), and then waits, for at
/// most [`TRANSIENT_WAIT`], until every object made meanwhile that `own`
/// does not list is gone again. The caller holds the registry's lock
/// exclusively throughout, so no capture lists one of those. (A probe's
/// map is used by a probe program, and the kernel frees it only after
/// that program, an RCU grace period and a work item after its last
/// descriptor closed: without the wait a capture taken just after the
/// lock listed it, as made by no one it knows.) An object still there
/// after the wait is left alone: then it is not the load's own but
/// another's, made meanwhile, which is not this to hide.
pub fn load_settled<T, E>(
    load: impl FnOnce() -> Result<T, E>,
    own: impl Fn(&T) -> allox_ebpf_probes::BpfObjects,
) -> Result<T, E> {
    use allox_ebpf_probes::BpfObjects;
    let before = BpfObjects::loaded();
    let loaded = load();
    let mine = loaded.as_ref().map(&own).unwrap_or_default();
    // What the load made and did not keep, as the kernel lists it just
    // after: only these are waited for (one made since is another's).
    let after = BpfObjects::loaded();
    let left = |kind: fn(&BpfObjects) -> &Vec<u32>| -> Vec<u32> {
        kind(&after)
            .iter()
            .filter(|id| kind(&before).binary_search(id).is_err() && !kind(&mine).contains(id))
            .copied()
            .collect()
    };
    let waited = [left(|o| &o.progs), left(|o| &o.maps), left(|o| &o.links)];
    let until = std::time::Instant::now() + TRANSIENT_WAIT;
    let mut now = after;
    while std::time::Instant::now() < until {
        let lists = [&now.progs, &now.maps, &now.links];
        let gone = waited
            .iter()
            .zip(lists)
            .all(|(w, l)| w.iter().all(|id| l.binary_search(id).is_err()));
        if gone {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
        now = BpfObjects::loaded();
    }
    loaded
}

/// Whether `pid` is an observer: a process run from a sealed
/// `allox-observe`.
pub fn is_observer(pid: u32) -> bool {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .is_ok_and(|p| p.to_string_lossy().starts_with("/memfd:allox-observe"))
}

/// The pids of the observers listed in `registry` (the files' names) that
/// are running, this process left out.
pub fn listed_observers(registry: &std::path::Path) -> Vec<u32> {
    let me = std::process::id();
    std::fs::read_dir(registry)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me && is_observer(pid))
        .collect()
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        s.push_str(": ");
        s.push_str(&x.to_string());
        src = x.source();
    }
    s
}

/// The registry's lock ([`lock_registry`]), released when dropped.
pub struct RegistryLock {
    _file: Option<std::fs::File>,
    /// Whether it was taken within [`LOCK_WAIT`].
    pub held: bool,
}

/// The longest wait for the registry's lock: one held longer (by a
/// process that is no observer: only root can) is not waited for.
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The file of the registry's lock: not an observer's list.
const LOCK: &str = ".lock";

/// Takes the registry's lock: shared by a bpf capture while it lists the
/// kernel's objects and tells the observers' own, exclusive for an
/// observer while it makes or drops objects of its own until they are
/// listed or held (its programs' load, aya's probes among it; a run's
/// sysctl link attached or detached). So a capture never lists an object
/// that an observer made and has not listed yet, or is dropping. Without
/// the lock file (a registry that cannot be written) nothing is held: the
/// capture is then as without it.
pub fn lock_registry(registry: &std::path::Path, exclusive: bool) -> RegistryLock {
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::create_dir_all(registry);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(0o600)
        .open(registry.join(LOCK))
        .ok();
    let op = if exclusive {
        rustix::fs::FlockOperation::NonBlockingLockExclusive
    } else {
        rustix::fs::FlockOperation::NonBlockingLockShared
    };
    let until = std::time::Instant::now() + LOCK_WAIT;
    let held = file.as_ref().is_some_and(|f| loop {
        match rustix::fs::flock(f, op) {
            Ok(()) => break true,
            Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR)
                if std::time::Instant::now() < until =>
            {
                std::thread::sleep(std::time::Duration::from_millis(1))
            }
            Err(e) => {
                eprintln!("allox-observe: cannot lock the observers' registry: {e}");
                break false;
            }
        }
    });
    RegistryLock { _file: file, held }
}

/// Lists BPF objects (ids) as `name`'s in `registry`: every observer's
/// bpf capture leaves out the objects listed there. A file is never
/// removed while its objects may still be loaded (the kernel frees a
/// program a moment after its last descriptor closes);
/// [`registered`] removes the files whose objects are all gone.
pub fn register(
    registry: &std::path::Path,
    name: &str,
    progs: &[u32],
    maps: &[u32],
    links: &[u32],
) -> Result<(), String> {
    let mut text = String::new();
    for (kind, ids) in [("prog", progs), ("map", maps), ("link", links)] {
        for id in ids {
            text.push_str(&format!("{kind} {id}\n"));
        }
    }
    std::fs::create_dir_all(registry)
        .and_then(|()| std::fs::write(registry.join(name), text))
        .map_err(|e| format!("list the observer's objects in {}: {e}", registry.display()))
}

/// Every object listed in `registry` (`prog 12`, `map 3`, `link 7`),
/// after removing the files none of whose objects is still loaded and
/// whose observer (the file's name, a pid) is gone.
pub fn registered(registry: &std::path::Path) -> std::collections::HashSet<String> {
    let loaded = allox_ebpf_probes::BpfObjects::loaded();
    let is_loaded = |key: &str| -> bool {
        let mut w = key.split(' ');
        let (Some(kind), Some(Ok(id))) = (w.next(), w.next().map(str::parse::<u32>)) else {
            return false;
        };
        match kind {
            "prog" => loaded.progs.contains(&id),
            "map" => loaded.maps.contains(&id),
            "link" => loaded.links.contains(&id),
            _ => false,
        }
    };
    let mut out = std::collections::HashSet::new();
    for e in std::fs::read_dir(registry).into_iter().flatten().flatten() {
        // The lock is no list (and is never removed: its holders would
        // lock nothing).
        if e.file_name() == LOCK {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        let keys: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
        // Whether its observer runs is read only for a file that would
        // otherwise go (a `readlink` of its `/proc/PID/exe`).
        let observer = || {
            e.file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
                .is_some_and(is_observer)
        };
        if !keys.iter().any(|k| is_loaded(k)) && !observer() {
            let _ = std::fs::remove_file(e.path());
        }
        out.extend(keys.into_iter().map(str::to_string));
    }
    out
}
