//! The process tracker's eBPF side: three `tp_btf` programs written in C
//! (`bpf/tracker.bpf.c`, compiled by `build.rs` with clang, CO-RE) and the
//! aya loader that attaches them and reads their events.
//!
//! The programs attach to `sched_process_fork`, `sched_process_exec` and
//! `sched_process_exit`. A process is owned when its cgroup was tagged with
//! [`Tracker::tag_cgroup`] (or it was tagged with [`Tracker::tag_pid`]),
//! or its parent was owned when it forked; fork, exec and exit of owned
//! processes reach [`Tracker::drain`] as [`RawEvent`]s through a ring
//! buffer that is polled, never woken per event. Threads produce nothing:
//! a fork is a new process, an exit the end of its last thread. The record
//! layout is documented in [`event`].
//!
//! The system-effects observer's history is a second set of programs
//! (`bpf/history.bpf.c`, [`History`]): fork/exec/exit, system calls, BPF
//! LSM hooks and `cgroup/sysctl`, filtered in the kernel by the run's
//! cgroup, with exact loss counting; the README describes it.
//!
//! Needs a kernel with BTF (`/sys/kernel/btf/vmlinux`), Linux 5.8 or newer
//! (ring buffer, boot clock), and CAP_BPF with CAP_PERFMON, or
//! CAP_SYS_ADMIN.

pub mod event;
pub mod history_record;
pub mod syscalls;

mod error;
mod history;
mod stats;
mod tracker;

pub use error::{LoadError, TrackerError};
pub use event::{EventKind, RawEvent};
pub use history::{BpfObjects, Counters, History, HistoryError, LSM_LIST};
pub use history_record::{HistoryKind, HistoryRecord};
pub use stats::{enable_stats, StatsGuard};
pub use tracker::{cgroup_id, ProgStats, Tracker, DEFAULT_RING_BYTES, KERNEL_BTF};
