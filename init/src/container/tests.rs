use super::*;
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: ContainerArgs,
}

use crate::supervise::fake::FakeHost;

const V2: FakeHost = FakeHost {
    cgroup2: Some("/sys/fs/cgroup"),
};

fn plan_on(host: &FakeHost, argv: &[&str]) -> Result<Plan, ContainerError> {
    let argv = ["container"].iter().chain(argv);
    Cli::try_parse_from(argv)
        .expect("flags parse")
        .args
        .plan(host)
}

fn args_of(cmd: &Command) -> Vec<String> {
    cmd.get_args()
        .map(|a| a.to_str().unwrap().to_string())
        .collect()
}

#[test]
fn on_cgroup_v2_the_supervisor_gets_the_store_the_guest_socket_and_the_guest_limits() {
    let p = plan_on(
        &V2,
        &[
            "--store",
            "/dev/allox-store",
            "--format-blank",
            "--allow-uid",
            "65532",
        ],
    )
    .unwrap();
    assert_eq!(p.store, Path::new("/dev/allox-store"));
    assert!(p.format_blank);
    assert_eq!(p.stop_timeout, Duration::from_secs(20));
    assert_eq!(p.cgroup, CgroupPlan::Leaf("/sys/fs/cgroup".into()));
    let cmd = p.command(Path::new("/init"), 4 << 30, 32_768);
    assert_eq!(
        args_of(&cmd),
        [
            "supervise",
            "--root",
            "/mnt/store/allox",
            "--listen",
            "unix:/run/allox/ctl.sock",
            "--under-init",
            "--cgroup-root",
            "/sys/fs/cgroup",
            "--allow-uid",
            "65532",
            "--default-pids-max=1024",
            "--default-memory-max=2147483648",
            "--sessions-pids-max=32512",
            "--sessions-memory-max=3758096384",
        ]
    );
}

#[test]
fn a_given_cgroup_root_is_used_as_it_is_without_limits() {
    // This host's hybrid hierarchy: no cgroup2 at /sys/fs/cgroup.
    let host = FakeHost { cgroup2: None };
    let p = plan_on(
        &host,
        &[
            "--store",
            "/dev/x",
            "--stop-timeout",
            "5",
            "--listen",
            "unix:/run/a/ctl.sock",
            "--cgroup-root",
            "/sys/fs/cgroup/unified/t",
        ],
    )
    .unwrap();
    assert_eq!(p.stop_timeout, Duration::from_secs(5));
    assert_eq!(
        p.cgroup,
        CgroupPlan::Given("/sys/fs/cgroup/unified/t".into())
    );
    assert_eq!(
        args_of(&p.command(Path::new("/init"), 1 << 30, 32_768)),
        [
            "supervise",
            "--root",
            "/mnt/store/allox",
            "--under-init",
            "--listen",
            "unix:/run/a/ctl.sock",
            "--cgroup-root",
            "/sys/fs/cgroup/unified/t",
        ]
    );
}

#[test]
fn without_cgroup_v2_or_a_cgroup_root_the_container_says_what_to_do() {
    let e = plan_on(&FakeHost { cgroup2: None }, &["--store", "/dev/x"]).unwrap_err();
    assert!(
        e.to_string().contains("systemd.unified_cgroup_hierarchy=1"),
        "{e}"
    );
    assert!(e.to_string().contains("--cgroup-root"), "{e}");
    // A hybrid host's unified mount is not the container's own cgroup.
    let hybrid = FakeHost {
        cgroup2: Some("/sys/fs/cgroup/unified"),
    };
    assert!(plan_on(&hybrid, &["--store", "/dev/x"]).is_err());
    // Without processes, no cgroup is needed.
    let p = plan_on(&hybrid, &["--store", "/dev/x", "--no-processes"]).unwrap();
    assert_eq!(p.cgroup, CgroupPlan::None);
}

#[test]
fn bad_options_are_refused_before_anything_is_touched_naming_the_option() {
    let e = |argv: &[&str]| plan_on(&V2, argv).unwrap_err().to_string();
    assert_eq!(
        e(&["--store", "/dev/x", "--root", "/elsewhere"]),
        "--root is set by the container (the store is mounted at /mnt/store/allox); drop it"
    );
    assert!(e(&["--store", "/dev/x", "--bogus"]).contains("'--bogus'"));
    assert!(e(&["--store", "/dev/x", "--listen", "tcp:1"]).contains("--listen \"tcp:1\""));
    assert_eq!(
        e(&["--store", "dev/x"]),
        "--store dev/x: expected an absolute path to the store's block device"
    );
    assert_eq!(
        e(&["--store", "/dev/x", "--stop-timeout", "0"]),
        "--stop-timeout 0: expected 1 to 3600 seconds"
    );
    assert!(e(&["--store", "/dev/x", "--session-network", "proxy"]).contains("--plugin network"));
}

#[test]
fn the_containers_own_options_may_come_after_supervise_options() {
    let p = plan_on(
        &V2,
        &[
            "--allow-uid",
            "65532",
            "--format-blank",
            "--store=/dev/s",
            "--stop-timeout",
            "7",
            "--plugin",
            "share",
        ],
    )
    .unwrap();
    assert!(p.format_blank);
    assert_eq!(p.store, Path::new("/dev/s"));
    assert_eq!(p.stop_timeout, Duration::from_secs(7));
    assert_eq!(p.supervise, ["--allow-uid", "65532", "--plugin", "share"]);
    let e = |argv: &[&str]| plan_on(&V2, argv).unwrap_err().to_string();
    assert_eq!(
        e(&["--plugin", "share"]),
        "--store DEVICE is required: the store's block device"
    );
    assert_eq!(
        e(&["--store", "/dev/x", "--plugin", "share", "--stop-timeout"]),
        "--stop-timeout needs a value"
    );
}

#[test]
fn a_listen_option_replaces_the_default_socket() {
    let p = plan_on(&V2, &["--store", "/dev/x", "--listen=unix:/s"]).unwrap();
    let args = args_of(&p.command(Path::new("/init"), 1 << 30, 32_768));
    assert!(
        !args.iter().any(|a| a == "unix:/run/allox/ctl.sock"),
        "{args:?}"
    );
    assert!(args.iter().any(|a| a == "--listen=unix:/s"), "{args:?}");
}
