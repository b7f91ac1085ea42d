//! Loading the programs, feeding their ownership maps, reading their events.

use std::path::Path;

use aya::maps::{HashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::BtfTracePoint;
use aya::{include_bytes_aligned, Btf, Ebpf, EbpfLoader};

use crate::error::{LoadError, TrackerError};
use crate::event::{RawEvent, SHORT_RECORD};

/// The compiled `bpf/tracker.bpf.c`.
static OBJECT: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracker.bpf.o"));

/// Where the kernel publishes its own BTF; CO-RE relocations and `tp_btf`
/// attachment both need it.
pub const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Size of `EVENTS` unless told otherwise: 4 MiB holds about 65,000 fork
/// or exit records, or 13,000 exec records.
pub const DEFAULT_RING_BYTES: u32 = 4 << 20;

/// (program, tracepoint), in attach order: exit first, so that no process
/// is left in `PIDS` because its exit came between two attachments.
/// The move of a run's PID 1 made ahead into its run's cgroup counts as
/// its fork; attached last, like the fork.
const PROGRAMS: [(&str, &str); 4] = [
    ("allox_exit", "sched_process_exit"),
    ("allox_exec", "sched_process_exec"),
    ("allox_fork", "sched_process_fork"),
    ("allox_attach", "cgroup_attach_task"),
];

/// Run-time statistics of one program, from the kernel's `bpf_prog_info`.
/// Zero unless statistics are on (see [`enable_stats`](crate::enable_stats)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgStats {
    pub name: String,
    /// Times the program ran (every fork, exec or exit on the machine, owned
    /// or not).
    pub run_count: u64,
    /// Total nanoseconds spent in it.
    pub run_time_ns: u64,
}

/// The loaded and attached programs and their maps. Dropping it detaches
/// the programs and frees the maps.
pub struct Tracker {
    /// Owns the programs and their links.
    ebpf: Ebpf,
    pids: HashMap<MapData, u32, u64>,
    cgroups: HashMap<MapData, u64, u64>,
    events: RingBuf<MapData>,
    lost: PerCpuArray<MapData, u64>,
    /// Records no drain could decode (none unless the two sides disagree).
    undecodable: u64,
    /// At most this many records are read per drain: one ring's worth.
    drain_limit: usize,
}

impl std::fmt::Debug for Tracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracker").finish_non_exhaustive()
    }
}

fn take_map(ebpf: &mut Ebpf, name: &str) -> Result<aya::maps::Map, LoadError> {
    ebpf.take_map(name).ok_or_else(|| LoadError::Missing {
        what: format!("map {name}"),
    })
}

fn map_kind<T>(name: &str, r: Result<T, aya::maps::MapError>) -> Result<T, LoadError> {
    r.map_err(|e| LoadError::Missing {
        what: format!("map {name} of the expected type and sizes ({e})"),
    })
}

impl Tracker {
    /// Loads the programs with a [`DEFAULT_RING_BYTES`] ring buffer and
    /// attaches all three.
    pub fn load() -> Result<Tracker, LoadError> {
        Tracker::load_with_ring_bytes(DEFAULT_RING_BYTES)
    }

    /// [`load`](Tracker::load) with another ring buffer size (a power of
    /// two, at least a page).
    pub fn load_with_ring_bytes(ring_bytes: u32) -> Result<Tracker, LoadError> {
        if !ring_bytes.is_power_of_two() || ring_bytes < 4096 {
            return Err(LoadError::RingSize(ring_bytes));
        }
        if let Err(source) = std::fs::metadata(KERNEL_BTF) {
            return Err(LoadError::NoBtf {
                path: KERNEL_BTF.into(),
                source,
            });
        }
        let btf = Btf::from_sys_fs().map_err(|source| LoadError::BadBtf {
            path: KERNEL_BTF.into(),
            source,
        })?;
        let mut ebpf = EbpfLoader::new()
            .btf(Some(&btf))
            .map_max_entries("EVENTS", ring_bytes)
            .load(OBJECT)
            .map_err(LoadError::from_object)?;

        for (name, tracepoint) in PROGRAMS {
            let program: &mut BtfTracePoint = ebpf
                .program_mut(name)
                .ok_or_else(|| LoadError::Missing {
                    what: format!("program {name}"),
                })?
                .try_into()
                .map_err(|e| LoadError::from_load(name, tracepoint, e))?;
            program
                .load(tracepoint, &btf)
                .map_err(|e| LoadError::from_load(name, tracepoint, e))?;
            program
                .attach()
                .map_err(|e| LoadError::from_attach(name, tracepoint, e))?;
        }

        let pids = map_kind("PIDS", HashMap::try_from(take_map(&mut ebpf, "PIDS")?))?;
        let cgroups = map_kind(
            "CGROUPS",
            HashMap::try_from(take_map(&mut ebpf, "CGROUPS")?),
        )?;
        let events = map_kind("EVENTS", RingBuf::try_from(take_map(&mut ebpf, "EVENTS")?))?;
        let lost = map_kind("LOST", PerCpuArray::try_from(take_map(&mut ebpf, "LOST")?))?;
        Ok(Tracker {
            ebpf,
            pids,
            cgroups,
            events,
            lost,
            undecodable: 0,
            drain_limit: ring_bytes as usize / (SHORT_RECORD + 8),
        })
    }

    /// Owns every process later created in the cgroup (and their
    /// descendants, wherever they go). Tag a cgroup before its first
    /// process is created in it, e.g. by clone3 with CLONE_INTO_CGROUP,
    /// and no process escapes.
    pub fn tag_cgroup(&mut self, cgroup_id: u64, owner: u64) -> Result<(), TrackerError> {
        self.cgroups
            .insert(cgroup_id, owner, 0)
            .map_err(|source| TrackerError::Map {
                map: "CGROUPS",
                source,
            })
    }

    /// Stops owning new processes of the cgroup; the processes already
    /// owned stay owned until they exit. Untagging an untagged cgroup is
    /// not an error.
    pub fn untag_cgroup(&mut self, cgroup_id: u64) -> Result<(), TrackerError> {
        match self.cgroups.remove(&cgroup_id) {
            Ok(()) => Ok(()),
            Err(aya::maps::MapError::SyscallError(e))
                if e.io_error.kind() == std::io::ErrorKind::NotFound =>
            {
                Ok(())
            }
            Err(source) => Err(TrackerError::Map {
                map: "CGROUPS",
                source,
            }),
        }
    }

    /// Owns a running process (and its later children). `tgid` is the pid
    /// in the initial pid namespace. Its fork and exec before now are not
    /// reported; a tgid that is not running stays in `PIDS` until that pid
    /// is reused and exits, so prefer [`tag_cgroup`](Tracker::tag_cgroup).
    pub fn tag_pid(&mut self, tgid: u32, owner: u64) -> Result<(), TrackerError> {
        self.pids
            .insert(tgid, owner, 0)
            .map_err(|source| TrackerError::Map {
                map: "PIDS",
                source,
            })
    }

    /// Hands every event now in the ring buffer to `f`, oldest first, and
    /// returns how many. Reads at most one ring's worth, so that a process
    /// forking without pause cannot keep the caller here.
    pub fn drain(&mut self, mut f: impl FnMut(RawEvent)) -> usize {
        let mut n = 0;
        for _ in 0..self.drain_limit {
            let decoded = match self.events.next() {
                Some(record) => RawEvent::decode(&record),
                None => break,
            };
            match decoded {
                Ok(event) => {
                    f(event);
                    n += 1;
                }
                Err(_) => self.undecodable += 1,
            }
        }
        n
    }

    /// Events that did not reach user space: the ring buffer was full when
    /// the kernel had one to report (summed over CPUs), plus records that
    /// could not be decoded.
    pub fn lost(&self) -> u64 {
        let kernel: u64 = self
            .lost
            .get(&0, 0)
            .map(|per_cpu| per_cpu.iter().sum())
            .unwrap_or(0);
        kernel + self.undecodable
    }

    /// Processes now in `PIDS` (owned and not yet exited).
    pub fn tracked_pids(&self) -> usize {
        self.pids.keys().filter(Result::is_ok).count()
    }

    /// Run count and time of each program.
    pub fn prog_stats(&self) -> Vec<ProgStats> {
        PROGRAMS
            .iter()
            .filter_map(|(name, _)| {
                let program: &BtfTracePoint = self.ebpf.program(name)?.try_into().ok()?;
                let info = program.info().ok()?;
                Some(ProgStats {
                    name: (*name).to_owned(),
                    run_count: info.run_count(),
                    run_time_ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
                })
            })
            .collect()
    }
}

/// The cgroup id of a cgroup2 directory: its inode number, which is the
/// kernfs node id the programs read (`cgroups->dfl_cgrp->kn->id`).
pub fn cgroup_id(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(dir)?;
    if !meta.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} is not a cgroup directory", dir.display()),
        ));
    }
    Ok(meta.ino())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tracker_can_move_between_threads() {
        fn is_send<T: Send>() {}
        is_send::<Tracker>();
    }

    #[test]
    fn ring_sizes_are_checked_before_touching_the_kernel() {
        for bad in [0, 1000, 4095, 6000] {
            assert!(
                matches!(Tracker::load_with_ring_bytes(bad), Err(LoadError::RingSize(n)) if n == bad)
            );
        }
    }

    #[test]
    fn cgroup_id_is_the_inode_and_refuses_files() {
        let dir = std::env::temp_dir();
        let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&dir).unwrap());
        assert_eq!(cgroup_id(&dir).unwrap(), ino);
        let file = dir.join(format!("allox-ebpf-probes-{}", std::process::id()));
        std::fs::write(&file, b"").unwrap();
        assert_eq!(
            cgroup_id(&file).unwrap_err().kind(),
            std::io::ErrorKind::InvalidInput
        );
        std::fs::remove_file(&file).unwrap();
        assert!(cgroup_id(Path::new("/nonexistent/cgroup")).is_err());
    }

    #[test]
    fn the_object_has_the_programs_and_maps() {
        let obj = aya_obj_parse();
        for (name, _) in PROGRAMS {
            assert!(
                obj.0.contains(&name.to_owned()),
                "program {name} missing: {:?}",
                obj.0
            );
        }
        for map in ["PIDS", "CGROUPS", "EVENTS", "LOST"] {
            assert!(
                obj.1.contains(&map.to_owned()),
                "map {map} missing: {:?}",
                obj.1
            );
        }
    }

    fn aya_obj_parse() -> (Vec<String>, Vec<String>) {
        let obj = aya_obj::Object::parse(OBJECT).expect("the embedded object parses");
        (
            obj.programs.keys().cloned().collect(),
            obj.maps.keys().cloned().collect(),
        )
    }
}
