//! Turning on the kernel's per-program run-time statistics.

use std::os::fd::OwnedFd;

use aya::sys::Stats;

use crate::error::TrackerError;

/// While alive, the kernel counts runs and run time of every BPF program
/// (`BPF_ENABLE_STATS`, Linux 5.8); [`Tracker::prog_stats`](crate::Tracker::prog_stats)
/// reads them. Dropping it turns counting off again unless something else
/// (another guard, or `kernel.bpf_stats_enabled=1`) keeps it on. Counting
/// costs two clock reads per program run.
#[derive(Debug)]
pub struct StatsGuard {
    _fd: OwnedFd,
}

/// Turns statistics on for as long as the guard lives.
pub fn enable_stats() -> Result<StatsGuard, TrackerError> {
    aya::sys::enable_stats(Stats::RunTime)
        .map(|fd| StatsGuard { _fd: fd })
        .map_err(TrackerError::Stats)
}
