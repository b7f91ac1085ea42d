//! The system-effects collectors (`allox_effects::collect`) against real
//! changes, made in a network and a mount namespace this test makes (a
//! child `unshare -n -m` sleeping), and a BPF map it creates: each change
//! is listed exactly, the host's captures show none of the namespace's,
//! and each domain has a positive control — the same check against a
//! capture that cannot see the change fails.
//!
//! Needs root, `ip`, `unshare`, `nsenter`, `mount` and the bpf syscall.
//! The `#[ignore]`d `capture_cost_against_commands` measures a capture of
//! the non-filesystem domains against `sysctl -a`, `ip route` and
//! `bpftool prog` run as commands (p50/p99 over 20 rounds).

use allox_effects::collect::{bpf, compare, modules, mounts, network, sysctl, Capture, Difference};
use allox_protocol::EffectChangeKind;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn missing() -> Option<String> {
    let mut miss = Vec::new();
    if !rustix::process::geteuid().is_root() {
        miss.push("root".to_string());
    }
    for tool in ["ip", "unshare", "nsenter", "mount"] {
        if allox_integration::which(tool).is_none() {
            miss.push(format!("{tool} on PATH"));
        }
    }
    (!miss.is_empty()).then(|| miss.join(", "))
}

/// A child in a network and a mount namespace of its own, killed (and its
/// namespaces with it) on drop.
struct Namespaces {
    child: Child,
    net: File,
}

impl Namespaces {
    fn new() -> Namespaces {
        let mut child = Command::new("unshare")
            .args(["-n", "-m", "--propagation", "private", "sleep", "600"])
            .stdin(Stdio::null())
            .spawn()
            .expect("unshare");
        let pid = child.id();
        let mine = std::fs::read_link("/proc/self/ns/net").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        // unshare execs sleep once the namespaces are made.
        loop {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let ns = std::fs::read_link(format!("/proc/{pid}/ns/net")).ok();
            if comm.trim() == "sleep" && ns.as_ref() != Some(&mine) {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("the namespace child did not start");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let net = File::open(format!("/proc/{pid}/ns/net")).unwrap();
        Namespaces { child, net }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn netns(&self) -> BorrowedFd<'_> {
        self.net.as_fd()
    }

    /// Runs `args` inside the child's namespaces (`-n` or `-m`).
    fn run(&self, ns: &str, args: &[&str]) {
        let out = Command::new("nsenter")
            .args(["-t", &self.pid().to_string(), ns, "--"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?} in the namespace failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn try_run(&self, ns: &str, args: &[&str]) -> bool {
        Command::new("nsenter")
            .args(["-t", &self.pid().to_string(), ns, "--"])
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `BPF_MAP_CREATE`: an array map named `name`, its fd.
#[allow(unsafe_code)]
fn create_map(name: &str) -> std::io::Result<OwnedFd> {
    #[repr(C)]
    #[derive(Default)]
    struct MapCreate {
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        map_flags: u32,
        inner_map_fd: u32,
        numa_node: u32,
        map_name: [u8; 16],
        _pad: u32,
    }
    let mut attr = MapCreate {
        map_type: 2, // BPF_MAP_TYPE_ARRAY
        key_size: 4,
        value_size: 8,
        max_entries: 3,
        ..MapCreate::default()
    };
    attr.map_name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: `attr` is a zero-padded `bpf_attr` prefix for BPF_MAP_CREATE
    // (cmd 0), its size passed along; the kernel only reads it.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            0,
            &attr as *const MapCreate,
            std::mem::size_of::<MapCreate>(),
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: BPF_MAP_CREATE returned a new fd, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

/// The differences between `a` and `b` whose key `matches`.
fn found(a: &Capture, b: &Capture, matches: impl Fn(&str) -> bool) -> Vec<Difference> {
    compare(a, b)
        .into_iter()
        .filter(|d| matches(&d.key))
        .collect()
}

/// Whether `diffs` lists `key` as `kind`, with `after` when given.
fn listed(
    diffs: &[Difference],
    key: &str,
    kind: EffectChangeKind,
    after: Option<&str>,
) -> Result<(), String> {
    let d = diffs
        .iter()
        .find(|d| d.key == key)
        .ok_or_else(|| format!("{key} is not listed among {:?}", keys(diffs)))?;
    if d.kind != kind {
        return Err(format!("{key} is {:?}, not {kind:?}", d.kind));
    }
    if let Some(want) = after {
        if d.after.as_deref() != Some(want) {
            return Err(format!("{key} is {:?} after, not {want:?}", d.after));
        }
    }
    Ok(())
}

fn keys(diffs: &[Difference]) -> Vec<&str> {
    diffs.iter().map(|d| d.key.as_str()).collect()
}

fn complete(what: &str, c: &Capture) {
    assert!(c.is_complete(), "{what} has gaps: {:?}", c.gaps);
}

struct All {
    ns_sysctl: Capture,
    host_sysctl: Capture,
    ns_net: Capture,
    host_net: Capture,
    mounts: Capture,
    host_mounts: Capture,
    bpf: Capture,
    modules: Capture,
}

fn capture_all(ns: &Namespaces) -> All {
    let me = std::process::id() as i32;
    All {
        ns_sysctl: sysctl::capture(Some(ns.netns()), sysctl::VOLATILE),
        host_sysctl: sysctl::capture(None, sysctl::VOLATILE),
        ns_net: network::capture(Some(ns.netns())),
        host_net: network::capture(None),
        mounts: mounts::capture(&[("host", me), ("session", ns.pid())]),
        host_mounts: mounts::capture(&[("host", me)]),
        bpf: bpf::capture(),
        modules: modules::capture(),
    }
}

#[test]
fn each_change_in_the_namespaces_is_listed_and_the_host_shows_none() {
    const TEST: &str = "each_change_in_the_namespaces_is_listed_and_the_host_shows_none";
    if !allox_integration::needs(TEST, missing()) {
        return;
    }
    let dirs = tempfile::tempdir().unwrap();
    let (src, dst) = (dirs.path().join("src"), dirs.path().join("dst"));
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&dst).unwrap();
    let ns = Namespaces::new();

    let a = capture_all(&ns);
    for (what, c) in [
        ("the namespace's sysctls", &a.ns_sysctl),
        ("the host's sysctls", &a.host_sysctl),
        ("the namespace's network", &a.ns_net),
        ("the host's network", &a.host_net),
        ("the mounts", &a.mounts),
        ("bpf", &a.bpf),
        ("modules", &a.modules),
    ] {
        complete(what, c);
    }
    assert!(
        a.ns_sysctl.items.keys().all(|k| k.starts_with("net.")),
        "a namespace's capture holds net.* only"
    );
    let ttl = "net.ipv4.ip_default_ttl";
    let host_ttl = a.host_sysctl.items[ttl].clone();
    assert_ne!(host_ttl, "77", "the host's {ttl} is already 77");

    // The changes: a sysctl, a link with an address, a route and a rule in
    // the namespace; a bind mount in its mount namespace; a BPF map.
    ns.run("-n", &["sysctl", "-q", "-w", &format!("{ttl}=77")]);
    let kind = if ns.try_run("-n", &["ip", "link", "add", "eff0", "type", "dummy"]) {
        "dummy"
    } else {
        // A kernel without CONFIG_DUMMY (the development machines): a
        // bridge, which every kernel here has.
        ns.run("-n", &["ip", "link", "add", "eff0", "type", "bridge"]);
        "bridge"
    };
    ns.run("-n", &["ip", "addr", "add", "10.1.2.3/24", "dev", "eff0"]);
    ns.run("-n", &["ip", "link", "set", "eff0", "up"]);
    ns.run("-n", &["ip", "route", "add", "10.9.0.0/16", "dev", "eff0"]);
    ns.run(
        "-n",
        &[
            "ip", "rule", "add", "priority", "100", "from", "all", "lookup", "100",
        ],
    );
    // nftables: a table, a base chain and a rule with a counter.
    ns.run("-n", &["nft", "add", "table", "inet", "alloxeff"]);
    ns.run(
        "-n",
        &[
            "nft",
            "add chain inet alloxeff input { type filter hook input priority 0 ; }",
        ],
    );
    ns.run(
        "-n",
        &[
            "nft", "add", "rule", "inet", "alloxeff", "input", "counter", "accept",
        ],
    );
    ns.run(
        "-m",
        &[
            "mount",
            "--bind",
            src.to_str().unwrap(),
            dst.to_str().unwrap(),
        ],
    );
    let map = create_map("allox_eff_test").expect("BPF_MAP_CREATE (needs the bpf syscall)");
    let map_id = std::fs::read_to_string(format!(
        "/proc/self/fdinfo/{}",
        std::os::fd::AsRawFd::as_raw_fd(&map)
    ))
    .unwrap()
    .lines()
    .find_map(|l| l.strip_prefix("map_id:").map(|v| v.trim().to_string()))
    .expect("a map fd's fdinfo names its id");

    let b = capture_all(&ns);

    // sysctl: the namespace's value, exactly; the host's is untouched.
    // New links bring their own net.*.conf.eff0.* keys: all of them added.
    let d = found(&a.ns_sysctl, &b.ns_sysctl, |_| true);
    listed(&d, ttl, EffectChangeKind::Modified, Some("77")).unwrap();
    for x in &d {
        assert!(
            x.key == ttl || (x.key.contains(".eff0.") && x.kind == EffectChangeKind::Added),
            "unexpected sysctl difference {x:?}"
        );
    }
    let control = found(&a.host_sysctl, &b.host_sysctl, |k| k == ttl);
    assert!(listed(&control, ttl, EffectChangeKind::Modified, Some("77")).is_err());
    assert_eq!(b.host_sysctl.items[ttl], host_ttl);

    // network: each thing made is listed as added, in the namespace only.
    let d = found(&a.ns_net, &b.ns_net, |_| true);
    let made = [
        "link eff0",
        "addr eff0 10.1.2.3/24",
        "route main 10.9.0.0/16 dev eff0",
        "rule inet 100 from all lookup 100",
    ];
    for key in made {
        listed(&d, key, EffectChangeKind::Added, None).unwrap();
    }
    assert!(
        b.ns_net.items["link eff0"].contains(&format!("kind={kind}")),
        "{}",
        b.ns_net.items["link eff0"]
    );
    for key in ["nft table inet alloxeff", "nft chain inet alloxeff input"] {
        listed(&d, key, EffectChangeKind::Added, None).unwrap();
    }
    assert_eq!(
        d.iter()
            .filter(|x| x.key.starts_with("nft rule inet alloxeff input ")
                && x.kind == EffectChangeKind::Added)
            .count(),
        1,
        "the rule: {:?}",
        keys(&d)
    );
    for x in &d {
        assert!(
            made.contains(&x.key.as_str())
                || x.key.contains("eff0")
                || x.key.starts_with("nft ") && x.key.contains(" alloxeff"),
            "unexpected network difference {x:?}"
        );
    }
    let control = found(&a.host_net, &b.host_net, |k| {
        k.contains("eff0")
            || k.contains("10.9.0.0")
            || k.starts_with("rule inet 100 ")
            || k.contains("alloxeff")
    });
    assert!(control.is_empty(), "the host shows {:?}", keys(&control));
    for key in made {
        assert!(listed(&control, key, EffectChangeKind::Added, None).is_err());
    }

    // mount: the bind mount, in the session's namespace, with its root.
    let key = format!("session {}#1", dst.display());
    let d = found(&a.mounts, &b.mounts, |k| {
        k.contains(dirs.path().to_str().unwrap())
    });
    assert_eq!(keys(&d), vec![key.as_str()]);
    listed(&d, &key, EffectChangeKind::Added, None).unwrap();
    let v = b.mounts.items[&key].clone();
    assert!(
        v.contains(&format!("root={}", src.display())) || v.contains("root=/"),
        "{v}"
    );
    let control = found(&a.host_mounts, &b.host_mounts, |k| {
        k.contains(dirs.path().to_str().unwrap())
    });
    assert!(listed(&control, &key, EffectChangeKind::Added, None).is_err());

    // bpf: the map, with what it is.
    let key = format!("map {map_id}");
    let d = found(&a.bpf, &b.bpf, |k| k == key);
    listed(&d, &key, EffectChangeKind::Added, None).unwrap();
    let v = &b.bpf.items[&key];
    assert!(
        v.contains("name=allox_eff_test") && v.contains("key=4 value=8 max_entries=3"),
        "{v}"
    );
    let control = found(&a.bpf, &a.bpf, |k| k == key);
    assert!(listed(&control, &key, EffectChangeKind::Added, None).is_err());

    // modules: nothing was loaded (nothing can be, here): the same.
    assert!(compare(&a.modules, &b.modules).is_empty());

    drop(map);
    let c = bpf::capture();
    assert!(
        !c.items.contains_key(&key),
        "the map is gone once its fd is closed"
    );
}

/// A sysctl written in the namespace is seen by the namespace's capture
/// and not by the host's, and back: the capture really reads from inside.
#[test]
fn a_namespace_capture_reads_the_namespace_values() {
    const TEST: &str = "a_namespace_capture_reads_the_namespace_values";
    if !allox_integration::needs(TEST, missing()) {
        return;
    }
    let ns = Namespaces::new();
    let key = "net.ipv4.tcp_keepalive_probes";
    ns.run("-n", &["sysctl", "-q", "-w", &format!("{key}=3")]);
    let inside = sysctl::capture(Some(ns.netns()), sysctl::VOLATILE);
    let host = sysctl::capture(None, sysctl::VOLATILE);
    assert_eq!(inside.items[key], "3");
    assert_ne!(host.items[key], "3", "the host's {key} happens to be 3");
    let net = network::capture(Some(ns.netns()));
    let links: Vec<_> = net
        .items
        .keys()
        .filter(|k| k.starts_with("link "))
        .collect();
    assert_eq!(
        links,
        vec!["link lo"],
        "a new namespace has a loopback only"
    );
}

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn time(rounds: usize, mut f: impl FnMut()) -> (Duration, Duration) {
    let mut v: Vec<Duration> = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    (percentile(&mut v, 0.5), percentile(&mut v, 0.99))
}

fn command(args: &[&str]) {
    let _ = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Speed, measured not asserted: the non-filesystem domains' capture
/// against the commands an administrator would run.
#[test]
#[ignore]
fn capture_cost_against_commands() {
    const TEST: &str = "capture_cost_against_commands";
    if !allox_integration::needs(TEST, missing()) {
        return;
    }
    let me = std::process::id() as i32;
    let (c50, c99) = time(20, || {
        let _ = sysctl::capture(None, sysctl::VOLATILE);
        let _ = mounts::capture(&[("host", me)]);
        let _ = network::capture(None);
        let _ = bpf::capture();
        let _ = modules::capture();
    });
    let bpftool = allox_integration::which("bpftool").is_some();
    let (r50, r99) = time(20, || {
        command(&["sysctl", "-a"]);
        command(&["ip", "route"]);
        if bpftool {
            command(&["bpftool", "prog"]);
        }
    });
    println!(
        "capture of sysctl+mount+network+bpf+modules: p50 {c50:?} p99 {c99:?}; \
         sysctl -a + ip route{}: p50 {r50:?} p99 {r99:?}; ratio p50 {:.2}",
        if bpftool {
            " + bpftool prog"
        } else {
            " (no bpftool here)"
        },
        c50.as_secs_f64() / r50.as_secs_f64()
    );
}
