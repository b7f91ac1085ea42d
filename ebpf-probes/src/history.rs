//! The system-effects observer's history: loading `bpf/history.bpf.c`,
//! telling it which runs to watch, reading its records and counters.
//!
//! ```no_run
//! # fn main() -> Result<(), allox_ebpf_probes::HistoryError> {
//! use allox_ebpf_probes::History;
//! let mut h = History::load(4 << 20)?;
//! let dir = std::path::Path::new("/sys/fs/cgroup/unified/run-1");
//! h.watch(allox_ebpf_probes::cgroup_id(dir).unwrap(), 7)?;
//! h.attach_sysctl(7, std::fs::File::open(dir).unwrap())?;
//! // … the run …
//! h.poll(|r| println!("{} {}", r.seq, r.detail()));
//! let c = h.counters();
//! assert_eq!(c.emitted, c.received + c.lost);
//! # Ok(()) }
//! ```

use std::os::fd::AsFd;

use aya::maps::{Array, HashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::cgroup_sysctl::CgroupSysctlLinkId;
use aya::programs::{BtfTracePoint, CgroupAttachMode, CgroupSysctl, Lsm, ProgramError};
use aya::{include_bytes_aligned, Btf, BtfError, Ebpf, EbpfLoader};

use crate::error::LoadError;
use crate::history_record::{HistoryRecord, SHORT_RECORD};
use crate::syscalls;
use crate::tracker::{ProgStats, KERNEL_BTF};

/// The compiled `bpf/history.bpf.c`.
static OBJECT: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/history.bpf.o"));

/// Where securityfs lists the active LSMs.
pub const LSM_LIST: &str = "/sys/kernel/security/lsm";

/// (program, tracepoint), in attach order: exit before fork and exec, so
/// that no process stays in `PIDS`; sys_exit before sys_enter, so that no
/// call's arguments wait for an exit that is not watched yet.
const TRACEPOINTS: [(&str, &str); 5] = [
    ("history_exit", "sched_process_exit"),
    ("history_exec", "sched_process_exec"),
    ("history_fork", "sched_process_fork"),
    ("history_sys_exit", "sys_exit"),
    ("history_sys_enter", "sys_enter"),
];

/// (program, LSM hook). `bpf` first: the loader's check that BPF LSM
/// programs run uses it.
const LSM_HOOKS: [(&str, &str); 11] = [
    ("history_bpf", "bpf"),
    ("history_file_open", "file_open"),
    ("history_path_unlink", "path_unlink"),
    ("history_path_mkdir", "path_mkdir"),
    ("history_path_rmdir", "path_rmdir"),
    ("history_path_rename", "path_rename"),
    ("history_sb_mount", "sb_mount"),
    ("history_kernel_read_file", "kernel_read_file"),
    ("history_kernel_load_data", "kernel_load_data"),
    ("history_netlink_send", "netlink_send"),
    ("history_task_kill", "task_kill"),
];

const SYSCTL: &str = "history_sysctl";

/// Why the history could not be loaded or used; each variant names what is
/// missing.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// No BTF, a missing capability, a program the verifier rejected, a
    /// tracepoint it could not attach to, a bad ring size.
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(
        "the kernel has no active BPF LSM: {detail} (needs CONFIG_BPF_LSM=y and `bpf` in the \
         lsm= boot parameter or CONFIG_LSM)"
    )]
    NoBpfLsm { detail: String },
    #[error(
        "the kernel has no LSM hook {hook} (no bpf_lsm_{hook} in its BTF; needs \
         CONFIG_BPF_LSM=y{extra})"
    )]
    NoLsmHook {
        hook: &'static str,
        extra: &'static str,
    },
    #[error(
        "the kernel refused to load the BPF LSM program {program} for hook {hook} although the \
         tracing programs loaded: BPF LSM programs need CAP_SYS_ADMIN and CAP_MAC_ADMIN, or this \
         kernel forbids them"
    )]
    LsmRefused {
        program: &'static str,
        hook: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot update map {map}")]
    Map {
        map: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("cannot attach the sysctl program to the cgroup (needs CONFIG_CGROUP_BPF=y)")]
    Sysctl(#[source] ProgramError),
}

/// The history's counters. `emitted` is the kernel's sequence counter:
/// every record it attempted, for every watched run; `lost` is
/// `emitted - received`, exact once the watched processes are stopped
/// (frozen or gone) and the ring is drained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    pub emitted: u64,
    pub received: u64,
    pub lost: u64,
    /// System calls made by watched processes.
    pub syscalls: u64,
    /// Of those, the ones that returned an error.
    pub refused: u64,
}

impl Counters {
    /// The protocol's form.
    pub fn to_protocol(&self) -> allox_protocol::HistoryCounters {
        allox_protocol::HistoryCounters {
            emitted: self.emitted,
            received: self.received,
            lost: self.lost,
            syscalls: self.syscalls,
            refused: self.refused,
        }
    }
}

/// The loaded and attached history programs and their maps. Dropping it
/// detaches every program (the sysctl attachments included) and closes
/// every program, map and link: no BPF object of it is left.
pub struct History {
    /// Owns the programs and their links.
    ebpf: Ebpf,
    watched: HashMap<MapData, u64, u64>,
    pids: HashMap<MapData, u32, u64>,
    ring: RingBuf<MapData>,
    seq: Array<MapData, u64>,
    /// `[cgroups watched, epoch]`: the programs' gate and the epoch of
    /// their per-CPU answers (see history.bpf.c).
    gate: Array<MapData, u64>,
    counts: PerCpuArray<MapData, u64>,
    received: u64,
    undecodable: u64,
    drain_limit: usize,
    sysctl_links: Vec<(u64, CgroupSysctlLinkId)>,
    /// Whether the BPF LSM programs are attached.
    lsm: bool,
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History")
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

fn take<T>(
    ebpf: &mut Ebpf,
    name: &str,
    convert: impl FnOnce(aya::maps::Map) -> Result<T, aya::maps::MapError>,
) -> Result<T, LoadError> {
    let map = ebpf.take_map(name).ok_or_else(|| LoadError::Missing {
        what: format!("map {name}"),
    })?;
    convert(map).map_err(|e| LoadError::Missing {
        what: format!("map {name} of the expected type and sizes ({e})"),
    })
}

fn missing_program(name: &str) -> LoadError {
    LoadError::Missing {
        what: format!("program {name}"),
    }
}

/// Whether securityfs says BPF LSM is active: `Some(false)` with the list
/// when it is not, `None` when the list cannot be read.
fn lsm_list() -> Option<String> {
    std::fs::read_to_string(LSM_LIST)
        .ok()
        .map(|s| s.trim().to_owned())
}

impl History {
    /// Loads and attaches every program (the sysctl program is loaded and
    /// attached later, per cgroup, by [`attach_sysctl`](History::attach_sysctl))
    /// with a ring buffer of `ring_bytes` (a power of two, at least a
    /// page). Fails naming what the kernel lacks: BTF, BPF LSM, a hook.
    pub fn load(ring_bytes: u32) -> Result<History, HistoryError> {
        History::load_parts(ring_bytes, true)
    }

    /// [`load`](History::load) without the BPF LSM programs: processes,
    /// system calls and sysctl only, for a kernel without BPF LSM. The
    /// history then misses write opens, the path hooks' names, module
    /// loads, netlink messages and allowed signals.
    pub fn load_without_lsm(ring_bytes: u32) -> Result<History, HistoryError> {
        History::load_parts(ring_bytes, false)
    }

    fn load_parts(ring_bytes: u32, lsm: bool) -> Result<History, HistoryError> {
        if !ring_bytes.is_power_of_two() || ring_bytes < 4096 {
            return Err(LoadError::RingSize(ring_bytes).into());
        }
        if let Err(source) = std::fs::metadata(KERNEL_BTF) {
            return Err(LoadError::NoBtf {
                path: KERNEL_BTF.into(),
                source,
            }
            .into());
        }
        // Before anything is loaded: a kernel whose LSM list lacks bpf
        // would accept and attach the LSM programs and never run them.
        if let Some(list) = lsm_list().filter(|_| lsm) {
            if !list.split(',').any(|l| l == "bpf") {
                return Err(HistoryError::NoBpfLsm {
                    detail: format!("{LSM_LIST} lists {list:?}"),
                });
            }
        }
        let btf = Btf::from_sys_fs().map_err(|source| LoadError::BadBtf {
            path: KERNEL_BTF.into(),
            source,
        })?;
        let mut ebpf = EbpfLoader::new()
            .btf(Some(&btf))
            .map_max_entries("RING", ring_bytes)
            .load(OBJECT)
            .map_err(LoadError::from_object)?;

        // The recorded calls, before any program runs.
        {
            let mut recorded: Array<&mut MapData, [u8; 8]> =
                Array::try_from(ebpf.map_mut("RECORDED").ok_or_else(|| LoadError::Missing {
                    what: "map RECORDED".into(),
                })?)
                .map_err(|e| LoadError::Missing {
                    what: format!("map RECORDED of the expected type ({e})"),
                })?;
            for s in syscalls::RECORDED {
                let spec = [
                    1,
                    s.str1.unwrap_or(0xff),
                    s.str2.unwrap_or(0xff),
                    0,
                    0,
                    0,
                    0,
                    0,
                ];
                recorded
                    .set(s.nr, spec, 0)
                    .map_err(|source| HistoryError::Map {
                        map: "RECORDED",
                        source,
                    })?;
            }
        }

        for (name, tracepoint) in TRACEPOINTS {
            let program: &mut BtfTracePoint = ebpf
                .program_mut(name)
                .ok_or_else(|| missing_program(name))?
                .try_into()
                .map_err(|e| LoadError::from_load(name, tracepoint, e))?;
            program
                .load(tracepoint, &btf)
                .map_err(|e| LoadError::from_load(name, tracepoint, e))?;
            program
                .attach()
                .map_err(|e| LoadError::from_attach(name, tracepoint, e))?;
        }

        for (name, hook) in LSM_HOOKS.into_iter().filter(|_| lsm) {
            let program: &mut Lsm = ebpf
                .program_mut(name)
                .ok_or_else(|| missing_program(name))?
                .try_into()
                .map_err(|e| LoadError::from_load(name, hook, e))?;
            program.load(hook, &btf).map_err(|e| match e {
                ProgramError::Btf(BtfError::UnknownBtfTypeName { .. }) => HistoryError::NoLsmHook {
                    hook,
                    extra: match hook {
                        "path_unlink" | "path_mkdir" | "path_rmdir" | "path_rename" => {
                            " and CONFIG_SECURITY_PATH=y"
                        }
                        "netlink_send" => " and CONFIG_SECURITY_NETWORK=y",
                        _ => "",
                    },
                },
                ProgramError::LoadError { io_error, .. } if io_error.raw_os_error() == Some(1) => {
                    HistoryError::LsmRefused {
                        program: name,
                        hook,
                        source: io_error,
                    }
                }
                other => LoadError::from_load(name, hook, other).into(),
            })?;
            program
                .attach()
                .map_err(|e| LoadError::from_attach(name, hook, e))?;
        }
        if lsm {
            probe_lsm(&mut ebpf)?;
        }

        let sysctl: &mut CgroupSysctl = ebpf
            .program_mut(SYSCTL)
            .ok_or_else(|| missing_program(SYSCTL))?
            .try_into()
            .map_err(|e| LoadError::from_load(SYSCTL, "cgroup/sysctl", e))?;
        sysctl
            .load()
            .map_err(|e| LoadError::from_load(SYSCTL, "cgroup/sysctl", e))?;

        let watched = take(&mut ebpf, "WATCHED", HashMap::try_from)?;
        let pids = take(&mut ebpf, "PIDS", HashMap::try_from)?;
        let ring = take(&mut ebpf, "RING", RingBuf::try_from)?;
        let seq = take(&mut ebpf, "SEQ", Array::try_from)?;
        let gate = take(&mut ebpf, "GATE", Array::try_from)?;
        let counts = take(&mut ebpf, "COUNTS", PerCpuArray::try_from)?;
        Ok(History {
            ebpf,
            watched,
            pids,
            ring,
            seq,
            gate,
            counts,
            received: 0,
            undecodable: 0,
            drain_limit: ring_bytes as usize / (SHORT_RECORD + 8),
            sysctl_links: Vec::new(),
            lsm,
        })
    }

    /// Watches every process in the cgroup `cgroup_id` (see
    /// [`cgroup_id`](crate::cgroup_id)) and, from then on, their
    /// descendants wherever they go, under `tag`. Watch a cgroup before its
    /// first process is created in it.
    pub fn watch(&mut self, cgroup_id: u64, tag: u64) -> Result<(), HistoryError> {
        self.watched
            .insert(cgroup_id, tag, 0)
            .map_err(|source| HistoryError::Map {
                map: "WATCHED",
                source,
            })?;
        self.open_gate()
    }

    /// Tells the programs how many cgroups are watched (none: every hook
    /// returns at once) and moves the epoch of their per-CPU answers.
    fn open_gate(&mut self) -> Result<(), HistoryError> {
        let n = self.watched.keys().filter(Result::is_ok).count() as u64;
        let epoch = self.gate.get(&1, 0).unwrap_or(0).wrapping_add(1);
        let map = |source| HistoryError::Map {
            map: "GATE",
            source,
        };
        self.gate.set(1, epoch, 0).map_err(map)?;
        self.gate.set(0, n, 0).map_err(map)
    }

    /// Stops watching everything tagged `tag`: its cgroups, its processes,
    /// and the sysctl program attached for it.
    pub fn unwatch(&mut self, tag: u64) -> Result<(), HistoryError> {
        let cgroups: Vec<u64> = self
            .watched
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, t)| *t == tag)
            .map(|(k, _)| k)
            .collect();
        for k in cgroups {
            ignore_missing(self.watched.remove(&k), "WATCHED")?;
        }
        let pids: Vec<u32> = self
            .pids
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, t)| *t == tag)
            .map(|(k, _)| k)
            .collect();
        for k in pids {
            ignore_missing(self.pids.remove(&k), "PIDS")?;
        }
        self.open_gate()?;
        let (mine, others): (Vec<_>, Vec<_>) = std::mem::take(&mut self.sysctl_links)
            .into_iter()
            .partition(|(t, _)| *t == tag);
        self.sysctl_links = others;
        if let Some(program) = self.sysctl_program() {
            for (_, link) in mine {
                program.detach(link).map_err(HistoryError::Sysctl)?;
            }
        }
        Ok(())
    }

    /// Attaches the sysctl program to a cgroup (an open cgroup2
    /// directory), alongside any other program there, for `tag`: every
    /// sysctl read or write of a process in it or below it is recorded and
    /// allowed. Detached by [`unwatch`](History::unwatch)`(tag)` or when
    /// the history is dropped.
    pub fn attach_sysctl(&mut self, tag: u64, cgroup: impl AsFd) -> Result<(), HistoryError> {
        let program = self
            .sysctl_program()
            .ok_or_else(|| HistoryError::from(missing_program(SYSCTL)))?;
        let link = program
            // A bpf_link (Linux 5.7+, which aya uses when it can) takes no
            // flags and always lets other programs attach beside it.
            .attach(cgroup, CgroupAttachMode::Single)
            .map_err(HistoryError::Sysctl)?;
        self.sysctl_links.push((tag, link));
        Ok(())
    }

    fn sysctl_program(&mut self) -> Option<&mut CgroupSysctl> {
        self.ebpf.program_mut(SYSCTL)?.try_into().ok()
    }

    /// Hands every record now in the ring buffer to `f`, oldest first, and
    /// returns how many. Reads at most one ring's worth, so that a storm
    /// cannot keep the caller here; call it every few tens of milliseconds.
    pub fn poll(&mut self, mut f: impl FnMut(HistoryRecord)) -> usize {
        let mut n = 0;
        for _ in 0..self.drain_limit {
            let decoded = match self.ring.next() {
                Some(record) => HistoryRecord::decode(&record),
                None => break,
            };
            self.received += 1;
            match decoded {
                Ok(r) => {
                    f(r);
                    n += 1;
                }
                Err(_) => self.undecodable += 1,
            }
        }
        n
    }

    /// Whether the BPF LSM programs are attached (not after
    /// [`load_without_lsm`](History::load_without_lsm)).
    pub fn has_lsm(&self) -> bool {
        self.lsm
    }

    /// Records read from the ring that could not be decoded (none unless
    /// the two sides disagree on the layout); they count as received.
    pub fn undecodable(&self) -> u64 {
        self.undecodable
    }

    /// The counters now (see [`Counters`]).
    pub fn counters(&self) -> Counters {
        let emitted = self.seq.get(&0, 0).unwrap_or(0);
        let sum = |i: u32| -> u64 {
            self.counts
                .get(&i, 0)
                .map(|per_cpu| per_cpu.iter().sum())
                .unwrap_or(0)
        };
        Counters {
            emitted,
            received: self.received,
            lost: emitted.saturating_sub(self.received),
            syscalls: sum(0),
            refused: sum(1),
        }
    }

    /// Processes now watched by lineage (in `PIDS`).
    pub fn watched_pids(&self) -> usize {
        self.pids.keys().filter(Result::is_ok).count()
    }

    /// Run count and time of each program (zero unless statistics are on,
    /// see [`enable_stats`](crate::enable_stats)).
    pub fn prog_stats(&self) -> Vec<ProgStats> {
        self.ebpf
            .programs()
            .filter_map(|(name, program)| {
                let info = program.info().ok()?;
                Some(ProgStats {
                    name: name.to_owned(),
                    run_count: info.run_count(),
                    run_time_ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
                })
            })
            .collect()
    }

    /// The kernel ids of this history's programs, the maps they use and
    /// their links (while it lives).
    pub fn objects(&self) -> BpfObjects {
        let mut o = BpfObjects::default();
        for (_, p) in self.ebpf.programs() {
            // Programs not loaded (the LSM ones without BPF LSM) have none.
            let Ok(info) = p.info() else { continue };
            if !o.progs.contains(&info.id()) {
                o.progs.push(info.id());
            }
            for m in info.map_ids().ok().flatten().unwrap_or_default() {
                if !o.maps.contains(&m) {
                    o.maps.push(m);
                }
            }
        }
        // Maps no loaded program uses (PROBE without the LSM programs):
        // still this history's, held by it.
        for (_, m) in self.ebpf.maps() {
            use aya::maps::Map;
            let d = match m {
                Map::Array(d)
                | Map::HashMap(d)
                | Map::LruHashMap(d)
                | Map::PerCpuArray(d)
                | Map::PerCpuHashMap(d)
                | Map::RingBuf(d) => d,
                _ => continue,
            };
            if let Ok(info) = d.info() {
                if !o.maps.contains(&info.id()) {
                    o.maps.push(info.id());
                }
            }
        }
        o.links = aya::programs::loaded_links()
            .filter_map(Result::ok)
            .filter(|l| o.progs.contains(&l.program_id()))
            .map(|l| l.id())
            .collect();
        o.progs.sort_unstable();
        o.maps.sort_unstable();
        o.links.sort_unstable();
        o
    }
}

/// Ids of BPF objects in the kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BpfObjects {
    pub progs: Vec<u32>,
    pub maps: Vec<u32>,
    pub links: Vec<u32>,
}

impl BpfObjects {
    /// Every BPF program, map and link the kernel has now (needs
    /// CAP_SYS_ADMIN).
    pub fn loaded() -> BpfObjects {
        let mut o = BpfObjects {
            progs: aya::programs::loaded_programs()
                .filter_map(Result::ok)
                .map(|p| p.id())
                .collect(),
            maps: aya::maps::loaded_maps()
                .filter_map(Result::ok)
                .map(|m| m.id())
                .collect(),
            links: aya::programs::loaded_links()
                .filter_map(Result::ok)
                .map(|l| l.id())
                .collect(),
        };
        o.progs.sort_unstable();
        o.maps.sort_unstable();
        o.links.sort_unstable();
        o
    }

    /// The objects of `self` that are also in `other`.
    pub fn still_in(&self, other: &BpfObjects) -> BpfObjects {
        let keep = |a: &[u32], b: &[u32]| a.iter().copied().filter(|x| b.contains(x)).collect();
        BpfObjects {
            progs: keep(&self.progs, &other.progs),
            maps: keep(&self.maps, &other.maps),
            links: keep(&self.links, &other.links),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.progs.is_empty() && self.maps.is_empty() && self.links.is_empty()
    }
}

fn ignore_missing(
    r: Result<(), aya::maps::MapError>,
    map: &'static str,
) -> Result<(), HistoryError> {
    match r {
        Ok(()) => Ok(()),
        Err(aya::maps::MapError::SyscallError(e))
            if e.io_error.kind() == std::io::ErrorKind::NotFound =>
        {
            Ok(())
        }
        Err(source) => Err(HistoryError::Map { map, source }),
    }
}

/// Proves that the BPF LSM programs run: `history_bpf` counts the bpf()
/// calls of the process named in `PROBE`, and reading `PROBE` is one.
/// Attached LSM programs that never run (BPF LSM built but not in the LSM
/// list, and no securityfs to say so) fail here.
fn probe_lsm(ebpf: &mut Ebpf) -> Result<(), HistoryError> {
    let map = ebpf.map_mut("PROBE").ok_or_else(|| LoadError::Missing {
        what: "map PROBE".into(),
    })?;
    let mut probe: Array<&mut MapData, [u64; 2]> =
        Array::try_from(map).map_err(|e| LoadError::Missing {
            what: format!("map PROBE of the expected type ({e})"),
        })?;
    probe
        .set(0, [u64::from(std::process::id()), 0], 0)
        .map_err(|source| HistoryError::Map {
            map: "PROBE",
            source,
        })?;
    let hits = probe.get(&0, 0).map_err(|source| HistoryError::Map {
        map: "PROBE",
        source,
    })?[1];
    // Off again: the program counts nothing more.
    let _ = probe.set(0, [0, 0], 0);
    if hits == 0 {
        return Err(HistoryError::NoBpfLsm {
            detail: format!(
                "the LSM programs attached but did not run for a bpf() call{}",
                match lsm_list() {
                    Some(l) => format!(" ({LSM_LIST} lists {l:?})"),
                    None => format!(" ({LSM_LIST} cannot be read: is securityfs mounted?)"),
                }
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_history_can_move_between_threads() {
        fn is_send<T: Send>() {}
        is_send::<History>();
    }

    #[test]
    fn ring_sizes_are_checked_before_touching_the_kernel() {
        for bad in [0, 1000, 4095, 6000] {
            assert!(matches!(
                History::load(bad),
                Err(HistoryError::Load(LoadError::RingSize(n))) if n == bad
            ));
        }
    }

    #[test]
    fn the_object_has_every_program_and_map() {
        let obj = aya_obj::Object::parse(OBJECT).expect("the embedded object parses");
        let programs: Vec<&String> = obj.programs.keys().collect();
        for name in TRACEPOINTS
            .iter()
            .chain(LSM_HOOKS.iter())
            .map(|(n, _)| *n)
            .chain([SYSCTL])
        {
            assert!(
                programs.iter().any(|p| p.as_str() == name),
                "program {name} missing: {programs:?}"
            );
        }
        assert_eq!(programs.len(), TRACEPOINTS.len() + LSM_HOOKS.len() + 1);
        for map in [
            "WATCHED", "PIDS", "EXITED", "RECORDED", "INFLIGHT", "SCRATCH", "RING", "SEQ",
            "COUNTS", "PROBE",
        ] {
            assert!(obj.maps.contains_key(map), "map {map} missing");
        }
    }

    #[test]
    fn missing_pieces_are_named() {
        let e = HistoryError::NoLsmHook {
            hook: "path_unlink",
            extra: " and CONFIG_SECURITY_PATH=y",
        };
        let t = e.to_string();
        assert!(
            t.contains("bpf_lsm_path_unlink") && t.contains("CONFIG_SECURITY_PATH"),
            "{t}"
        );
        let e = HistoryError::NoBpfLsm { detail: "x".into() };
        assert!(e.to_string().contains("BPF LSM"), "{e}");
    }
}
