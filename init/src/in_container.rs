//! `allox-init container` as a container's PID 1: the wiring of
//! [`allox_init::container`].
//!
//! It checks every option, takes its signals through a descriptor, mounts
//! the store from its block device (the guest's rules, the container's
//! words), moves the container's processes to a cgroup leaf on v2, and
//! keeps the supervisor running ([`allox_init::keeper`]) until SIGTERM,
//! SIGINT or `system.shutdown`; then it stops it in order within the stop
//! timeout, syncs, unmounts the store and exits 0. It never reboots. A
//! store or cgroup it cannot use is one line on stderr and exit status 1,
//! with the device untouched.

use allox_init::container::{cgroup, CgroupPlan, ContainerArgs, Plan, LEAF};
use allox_init::guest::{log, store_disk, STORE_ROOT};
use allox_init::keeper::{self, Keeper, KillRest};
use allox_init::supervise::ThisMachine;
use anyhow::Context;

/// Runs the container; returns its exit status.
pub fn run(args: ContainerArgs) -> anyhow::Result<i32> {
    let plan = args.plan(&ThisMachine)?;
    let pid1 = rustix::process::getpid().is_init();
    if !pid1 {
        // Started by hand or under another init: the runs' orphans are
        // still ours to reap.
        rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
            .context("cannot become a child subreaper")?;
    }
    let exe = std::fs::read_link("/proc/self/exe").context("cannot find this binary")?;
    // Before any thread: signals arrive through a descriptor only.
    let sfd = keeper::signal_fd().context("cannot take signals through a signalfd")?;
    store_disk::mount_store(&plan.store, plan.format_blank, &store_disk::CONTAINER)
        .map_err(|e| anyhow::anyhow!(allox_protocol::error_chain(&e)))?;
    let _ = std::fs::create_dir_all(STORE_ROOT);
    log(format_args!("store {} mounted", plan.store.display()));
    if let Err(e) = set_up_cgroup(&plan) {
        store_disk::unmount_store();
        return Err(e);
    }
    let (mem_total, pid_max) = memory_and_pids(&plan);
    // Failpoints (tests) are armed in the first supervisor only: its
    // restart must come up clean.
    let mut failpoints = std::env::var("ALLOX_FAILPOINTS").ok();
    let why = Keeper::new(sfd, plan.stop_timeout, move || {
        let mut cmd = plan.command(&exe, mem_total, pid_max);
        if allox_init::guest::logs_json() {
            cmd.env("ALLOX_LOG_FORMAT", "json");
        }
        match failpoints.take() {
            Some(f) => {
                log(format_args!("arming failpoints {f} in this supervisor"));
                cmd.env("ALLOX_FAILPOINTS", f);
            }
            None => {
                cmd.env_remove("ALLOX_FAILPOINTS");
            }
        }
        cmd
    })
    .run(if pid1 {
        KillRest::Everything
    } else {
        KillRest::Nothing
    });
    store_disk::unmount_store();
    log(format_args!("stopped ({why})"));
    Ok(0)
}

fn set_up_cgroup(plan: &Plan) -> anyhow::Result<()> {
    if let CgroupPlan::Leaf(dir) = &plan.cgroup {
        let moved = cgroup::move_to_leaf(&cgroup::Kernel, dir, LEAF)?;
        log(format_args!(
            "cgroup v2: {} processes moved to {}/{LEAF}; enabled for the sessions: {}",
            moved.processes,
            dir.display(),
            if moved.enabled.is_empty() {
                "none".to_string()
            } else {
                moved.enabled.join(" ")
            }
        ));
    }
    Ok(())
}

/// The memory the container may use (its cgroup's `memory.max` when it
/// has one below the machine's) and the process ids, for the sessions'
/// default limits.
fn memory_and_pids(plan: &Plan) -> (u64, u64) {
    let (mem, pid_max) = allox_init::limits::machine();
    let own = match &plan.cgroup {
        CgroupPlan::Leaf(dir) => std::fs::read_to_string(dir.join("memory.max"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok()),
        _ => None,
    };
    (own.map_or(mem, |m| m.min(mem)), pid_max)
}
