use super::*;
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: SuperviseArgs,
}

use super::fake::FakeHost;

const HOST: FakeHost = FakeHost {
    cgroup2: Some("/sys/fs/cgroup"),
};

fn parse(flags: &[&str]) -> SuperviseArgs {
    let argv = ["supervise", "--root", "/store"].iter().chain(flags);
    Cli::try_parse_from(argv).expect("flags parse").args
}

fn config(flags: &[&str]) -> Result<Supervise, SuperviseError> {
    parse(flags).into_config(&HOST)
}

#[test]
fn defaults_serve_the_standard_socket_with_processes() {
    let s = config(&[]).unwrap();
    let d = &s.daemon;
    assert_eq!(d.root, Path::new("/store"));
    assert_eq!(d.socket, Path::new("/run/allox/ctl.sock"));
    assert!(d.virtio_ports.is_empty());
    assert_eq!(d.store.session_quota, None);
    assert!(!d.policy.kill_processes_on_rollback);
    assert!(!d.policy.power_off_on_shutdown);
    assert_eq!(d.limits.stall, Duration::from_secs(10));
    assert_eq!(d.limits.write, Duration::from_secs(10));
    assert_eq!(d.limits.frame, Duration::from_secs(30));
    assert_eq!(d.limits.inflight, Limits::default().inflight);
    assert_eq!(d.peers, PeerPolicy::default());
    assert!(d.plugins.enabled.is_empty(), "no plugin unless named");
    let rc = d.runs.as_ref().expect("process support is on by default");
    assert_eq!(rc.cgroup_mount, Path::new("/sys/fs/cgroup"));
    assert_eq!(rc.init_exe, Path::new("/usr/bin/allox-init"));
    assert_eq!(rc.stage, Path::new("/run/allox/sandbox-root"));
    assert_eq!((rc.uid, rc.gid), (10_000, 10_000));
    assert!(!rc.isolate_network);
    assert_eq!(rc.limits, CgroupLimits::default());
    assert_eq!(rc.total, CgroupLimits::default());
    assert!(rc.plugins.is_empty());
    assert_eq!(
        rc.finished.output_budget,
        RunsConfig::DEFAULT_FINISHED_OUTPUT_BUDGET
    );
    assert_eq!(rc.finished.max_runs, RunsConfig::DEFAULT_FINISHED_RUNS_MAX);
}

#[test]
fn the_guest_init_s_flags_map_to_the_daemon_s_config() {
    let s = config(&[
        "--listen",
        "unix:/run/x.sock",
        "--listen",
        "virtio:org.allox.ctl",
        "--cgroup-root",
        "/cg",
        "--under-init",
        "--kill-session-processes-on-rollback",
        "--session-quota",
        "1G",
        "--sandbox-uid",
        "2000",
        "--sandbox-gid",
        "3000",
        "--sandbox-network",
        "isolated",
        "--sandbox-stage",
        "/stage",
        "--default-pids-max=64",
        "--default-memory-max=1048576",
        "--default-cpu-max",
        "50000 100000",
        "--sessions-pids-max=1000",
        "--sessions-memory-max=2097152",
        "--process-tracker",
        "ebpf",
        "--process-events-max",
        "99",
        "--allow-uid",
        "1000",
        "--allow-uid",
        "1001",
        "--allow-gid",
        "50",
        "--finished-output-budget",
        "4096",
        "--finished-runs-max",
        "7",
        "--stall-timeout-ms",
        "100",
        "--write-timeout-ms",
        "200",
        "--frame-timeout-ms",
        "300",
    ])
    .unwrap();
    let d = &s.daemon;
    assert_eq!(d.socket, Path::new("/run/x.sock"));
    assert_eq!(d.virtio_ports, ["org.allox.ctl"]);
    assert_eq!(d.store.session_quota, Some(1 << 30));
    assert!(d.policy.kill_processes_on_rollback);
    assert!(d.policy.power_off_on_shutdown);
    assert_eq!(d.limits.stall, Duration::from_millis(100));
    assert_eq!(d.limits.write, Duration::from_millis(200));
    assert_eq!(d.limits.frame, Duration::from_millis(300));
    assert_eq!(d.peers.uids, [1000, 1001]);
    assert_eq!(d.peers.gids, [50]);
    assert_eq!(
        d.plugins,
        PluginsConfig {
            enabled: vec!["process-tree".into()],
            process_events_max: 99,
            monitor: allox_supervisor::plugin_api::MonitorSettings {
                root: None,
                records_max: allox_supervisor::plugins::defaults::monitor::DEFAULT_RECORDS_MAX,
                session_bytes: allox_supervisor::plugins::defaults::monitor::DEFAULT_SESSION_BYTES,
                bytes_per_s: allox_supervisor::plugins::defaults::monitor::DEFAULT_BYTES_PER_S,
                span_bytes: allox_supervisor::plugins::defaults::monitor::DEFAULT_SPAN_BYTES,
                // The session quota caps what the monitor keeps of a session.
                session_quota: Some(1 << 30),
            },
            audit: Default::default(),
            network: allox_supervisor::plugin_api::NetworkSettings::default(),
            effects: allox_supervisor::plugin_api::EffectsSettings {
                ring_bytes: allox_supervisor::plugins::defaults::system_effects::DEFAULT_RING_BYTES
                    as u32,
                ..Default::default()
            },
        }
    );
    let rc = d.runs.as_ref().unwrap();
    assert_eq!(rc.cgroup_mount, Path::new("/cg"));
    assert_eq!(rc.stage, Path::new("/stage"));
    assert_eq!((rc.uid, rc.gid), (2000, 3000));
    assert!(rc.isolate_network);
    assert_eq!(
        rc.limits,
        CgroupLimits {
            pids_max: Some(64),
            memory_max: Some(1 << 20),
            cpu_max: Some((50_000, 100_000)),
        }
    );
    assert_eq!(
        rc.total,
        CgroupLimits {
            pids_max: Some(1000),
            memory_max: Some(2 << 20),
            cpu_max: None,
        }
    );
    assert_eq!(rc.finished.output_budget, 4096);
    assert_eq!(rc.finished.max_runs, 7);
}

#[test]
fn a_cgroup_root_outside_a_cgroup2_filesystem_is_refused() {
    let e = config(&["--cgroup-root", "/plain/allox-x"]).unwrap_err();
    assert!(
        matches!(&e, SuperviseError::NotCgroup2(p) if p == Path::new("/plain/allox-x")),
        "{e:?}"
    );
    assert!(e.to_string().contains("not in a cgroup2 filesystem"), "{e}");
    config(&["--cgroup-root", "/sys/fs/cgroup/unified/allox-x"]).unwrap();
}

#[test]
fn store_only_needs_no_cgroup_mount() {
    let s = parse(&["--no-processes"])
        .into_config(&FakeHost { cgroup2: None })
        .unwrap();
    assert!(s.daemon.runs.is_none());
    assert!(s.daemon.plugins.enabled.is_empty());
    let e = parse(&[])
        .into_config(&FakeHost { cgroup2: None })
        .unwrap_err();
    assert!(e
        .to_string()
        .contains("pass --cgroup-root or --no-processes"));
}

#[test]
fn bad_combinations_name_the_flag() {
    let err = |flags: &[&str]| config(flags).unwrap_err().to_string();
    assert_eq!(
        err(&["--no-processes", "--process-tracker", "ebpf"]),
        "--process-tracker ebpf needs process support; drop --no-processes"
    );
    assert_eq!(
        err(&["--no-processes", "--plugin", "process-tree"]),
        "--plugin process-tree needs process support; drop --no-processes"
    );
    assert_eq!(
        err(&["--listen", "unix:/a", "--listen", "unix:/b"]),
        "--listen \"unix:/b\": only one unix: socket"
    );
    assert_eq!(
        err(&["--listen", "tcp:1"]),
        "--listen \"tcp:1\": expected unix:PATH or virtio:PORT-NAME"
    );
    assert_eq!(
        err(&["--listen", "unix:"]),
        "--listen \"unix:\": expected unix:PATH or virtio:PORT-NAME"
    );
    assert_eq!(
        err(&["--listen", "virtio:org.x"]),
        "--listen: one unix:PATH is required"
    );
    assert!(err(&["--default-cpu-max", "lots"]).starts_with("--default-cpu-max \"lots\""));
    assert_eq!(
        err(&["--system-effects-scope", "/s.json"]),
        "--system-effects-scope is a setting of the system-effects plugin: add --plugin system-effects"
    );
    assert!(config(&[
        "--plugin",
        "system-effects",
        "--system-effects-scope",
        "/s.json"
    ])
    .is_ok());
}

#[test]
fn values_clap_refuses_never_reach_the_config() {
    for flags in [
        &["--sandbox-network", "bridged"][..],
        &["--process-tracker", "on"],
        &["--session-quota", "ten"],
        &["--sandbox-uid", "-1"],
        &["--system-effects-ring-bytes", "3000"],
        &["--system-effects-ring-bytes", "2G"],
        &["--system-effects-ring-bytes", "lots"],
    ] {
        let argv = ["supervise", "--root", "/store"].iter().chain(flags);
        assert!(Cli::try_parse_from(argv).is_err(), "{flags:?}");
    }
}

#[test]
fn the_cgroup2_mount_is_the_first_candidate_with_both_files() {
    let dir = tempfile::tempdir().unwrap();
    let v1 = dir.path().join("v1");
    let unified = dir.path().join("unified");
    std::fs::create_dir_all(&v1).unwrap();
    std::fs::create_dir_all(&unified).unwrap();
    std::fs::write(v1.join("cgroup.procs"), "").unwrap();
    assert_eq!(cgroup2_mount_among(&[&v1, &unified]), None);
    std::fs::write(unified.join("cgroup.procs"), "").unwrap();
    std::fs::write(unified.join("cgroup.subtree_control"), "").unwrap();
    assert_eq!(cgroup2_mount_among(&[&v1, &unified]), Some(unified));
}

#[test]
fn plugins_load_in_flag_order_with_the_tracker_alias_first() {
    let s = config(&[
        "--plugin",
        "b",
        "--process-tracker",
        "ebpf",
        "--plugin",
        "a",
    ])
    .unwrap();
    assert_eq!(s.daemon.plugins.enabled, ["process-tree", "b", "a"]);
    let s = config(&["--plugin", "process-tree"]).unwrap();
    assert_eq!(s.daemon.plugins.enabled, ["process-tree"]);
}
