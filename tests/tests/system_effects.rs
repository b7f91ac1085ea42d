//! The system-effects plugin on the host daemon: real runs in real
//! sandboxes, observed by the real observer (`allox-observe`, run from its
//! sealed copy), on a real Btrfs store, with the kernel's own BPF, LSM and
//! fanotify.
//!
//! Each check is a function that returns what is wrong; each is run on
//! the real answer (nothing wrong) and on a control that must fail it (the
//! same check against an answer whose collector was blind to the change).

use allox_integration::{call, make_sessions, process_start, require, ProcDaemon};
use allox_protocol::{
    By, EffectChangeKind, EffectsDomain, EffectsVerdict, Request, Response, RunEffects,
};
use std::path::{Path, PathBuf};

/// The observer beside the daemon, and its sha256 (the pin a release
/// build has at build time).
fn observer() -> (PathBuf, String) {
    pinned("allox-observe")
}

/// The workspace's executable `name` and its sha256.
fn pinned(name: &str) -> (PathBuf, String) {
    let exe = allox_integration::workspace_bin(name);
    let sha = allox_integration::sha256sum(&exe);
    (exe, sha)
}

/// `--plugin system-effects` with the observer and the verifier pinned.
fn plugin_args() -> Vec<String> {
    allox_integration::effects_plugin_args()
}

/// Every domain but `filesystem` in scope.
const SCOPE_MACHINE: &str =
    r#"{"domains": ["bpf", "sysctl", "mount", "network", "modules", "processes"]}"#;

/// One test at a time: each makes and removes a Btrfs mount, and loads and
/// drops BPF programs, which are changes of the machine's mount and bpf
/// domains that another test's run would rightly report.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

type Started = (
    ProcDaemon,
    tempfile::TempDir,
    std::sync::MutexGuard<'static, ()>,
);

/// A daemon with the plugin, `scope` (JSON) as its scope file; the guard
/// keeps the other tests of this file from running meanwhile.
fn start(name: &str, scope: Option<&str>, extra: &[&str]) -> Option<Started> {
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !require(name) {
        return None;
    }
    let (d, dir) = start_beside(name, scope, extra);
    Some((d, dir, guard))
}

/// A daemon with the plugin and `scope` (JSON) as its scope file, without
/// the guard [`start`] takes (a second daemon beside one `start` made).
fn start_beside(
    name: &str,
    scope: Option<&str>,
    extra: &[&str],
) -> (ProcDaemon, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut args = scoped_args(dir.path(), scope);
    if extra.contains(&"--system-effects-verifier") {
        // Another verifier, given by the test.
        let at = args
            .iter()
            .position(|a| a == "--system-effects-verifier")
            .expect("the verifier is pinned");
        args.drain(at..at + 4);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    (ProcDaemon::start(name, &args), dir)
}

/// The daemon's arguments for the plugin: the pinned executables, `scope`
/// (JSON) as its scope file (written in `dir`), and, on a kernel that
/// refuses the history's BPF LSM programs, `--system-effects-without-lsm`.
fn scoped_args(dir: &Path, scope: Option<&str>) -> Vec<String> {
    let mut args = plugin_args();
    if let Some(s) = scope {
        let p = dir.join("scope.json");
        std::fs::write(&p, s).unwrap();
        args.push("--system-effects-scope".into());
        args.push(p.display().to_string());
    }
    if !kernel_runs_bpf_lsm() {
        args.push("--system-effects-without-lsm".into());
    }
    args
}

/// The BPF links of the machine now (their ids).
fn bpf_link_ids() -> Vec<String> {
    allox_effects::collect::bpf::capture()
        .items
        .into_keys()
        .filter(|k| k.starts_with("link "))
        .collect()
}

/// Whether this kernel loads BPF LSM programs. One that refuses them (the
/// development host's) is observed without the history's LSM hooks, and
/// says so once.
fn kernel_runs_bpf_lsm() -> bool {
    static RUNS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *RUNS.get_or_init(|| match allox_ebpf_probes::History::load(4096) {
        Ok(_) => true,
        Err(e) => {
            let _ = std::io::Write::write_fmt(
                &mut std::io::stderr(),
                format_args!("NOTE system_effects: this kernel refuses the history's BPF LSM programs ({e}); the host tests observe with --system-effects-without-lsm\n"),
            );
            false
        }
    })
}

/// Runs `argv` in `a/s` and returns its effects.
fn observed(d: &ProcDaemon, a: &str, s: &str, argv: &[&str]) -> RunEffects {
    match call(d, Request::ProcessStart(process_start(a, s, argv))) {
        Ok(Response::Exited(r)) => match r.effects {
            Some(e) => *e,
            None => panic!("run {} has no effects", r.run_id),
        },
        other => panic!("process.start: {other:?}"),
    }
}

/// Starts `p` without waiting; its run's id.
fn started(c: &mut allox_ctl::client::Client, mut p: allox_protocol::ProcessStart) -> String {
    p.wait = false;
    match c.call(Request::ProcessStart(p)).expect("transport") {
        Ok(Response::Started(s)) => s.run_id,
        other => panic!("start: {other:?}"),
    }
}

/// Run `run`'s effects, as `effects.get` answers them.
fn effects_of(d: &ProcDaemon, a: &str, s: &str, run: &str) -> RunEffects {
    match call(
        d,
        Request::EffectsGet(allox_protocol::EffectsGet {
            agent_id: a.into(),
            session_id: s.into(),
            run_id: run.into(),
        }),
    ) {
        Ok(Response::Effects(e)) => *e,
        other => panic!("effects.get: {other:?}"),
    }
}

/// Waits (30 s at most) for run `run` of `a/s` to end; its result.
fn waited(d: &ProcDaemon, a: &str, s: &str, run: &str) -> allox_protocol::RunResult {
    match call(
        d,
        Request::ProcessWait(allox_protocol::ProcessWait {
            agent_id: a.into(),
            session_id: s.into(),
            run_id: run.into(),
            timeout_ms: Some(30_000),
        }),
    ) {
        Ok(Response::Exited(r)) => r,
        other => panic!("wait: {other:?}"),
    }
}

fn domain(e: &RunEffects, d: EffectsDomain) -> &allox_protocol::DomainEffects {
    e.domains
        .iter()
        .find(|x| x.domain == d)
        .expect("every domain is listed")
}

/// What is wrong with `e` as the effects of the seed's command: the file
/// listed in `workspace` only, attributed to the run, every other observed
/// domain consistent.
fn seed_command_wrong(e: &RunEffects) -> Option<String> {
    let ws = domain(e, EffectsDomain::Workspace);
    let listed = ws.changes.iter().any(|c| {
        c.item == "effect.txt"
            && c.kind == EffectChangeKind::Added
            && c.by.by == By::Run
            && c.by.run_id.as_deref() == Some(e.run_id.as_str())
            && c.after.as_deref().is_some_and(|v| v.contains(" 7 "))
    });
    if !listed || ws.verdict != EffectsVerdict::Changed {
        return Some(format!(
            "workspace does not list effect.txt by the run: {ws:?}"
        ));
    }
    for d in &e.domains {
        if d.domain == EffectsDomain::Workspace || d.verdict == EffectsVerdict::NotObserved {
            continue;
        }
        if d.verdict != EffectsVerdict::Consistent {
            return Some(format!("{} is {:?}: {d:?}", d.domain.as_str(), d.verdict));
        }
    }
    (e.verdict != EffectsVerdict::Changed || e.fenced)
        .then(|| format!("verdict {:?}, fenced {}", e.verdict, e.fenced))
}

#[test]
fn the_seed_command_changes_the_workspace_only_and_true_changes_nothing() {
    let Some((d, _scope, _one)) = start(
        "the_seed_command_changes_the_workspace_only_and_true_changes_nothing",
        Some(SCOPE_MACHINE),
        &[],
    ) else {
        return;
    };
    make_sessions(&d, &[("agent-a", "session-1")]);
    let t = observed(&d, "agent-a", "session-1", &["/bin/true"]);
    assert_eq!(t.verdict, EffectsVerdict::Consistent, "{t:#?}");
    assert!(!t.fenced);
    for dom in &t.domains {
        let want = if matches!(dom.domain, EffectsDomain::Filesystem) {
            EffectsVerdict::NotObserved
        } else {
            EffectsVerdict::Consistent
        };
        assert_eq!(dom.verdict, want, "{dom:?}");
    }
    assert_eq!(t.evidence_root.len(), 64);
    let e = observed(
        &d,
        "agent-a",
        "session-1",
        &["/bin/sh", "-c", "printf changed > effect.txt"],
    );
    assert_eq!(seed_command_wrong(&e), None, "{e:#?}");
    // Control: the same check on the run that changed nothing fails.
    assert!(seed_command_wrong(&t).is_some());
    // The answer is kept, and its chain verifies to its root.
    let got = effects_of(&d, "agent-a", "session-1", &e.run_id);
    assert_eq!(got.evidence_root, e.evidence_root);
    let (dir, kinds) = chain_of(&d, &e);
    assert_eq!(
        kinds,
        [
            "begin",
            "capture_a",
            "history",
            "capture_b",
            "verdict",
            "close"
        ]
    );
    // The root is in the audit log, with the run's start.
    let audit = match call(
        &d,
        Request::AuditList(allox_protocol::AuditList {
            after_seq: None,
            limit: Some(1000),
            before_seq: None,
        }),
    ) {
        Ok(Response::Audit(l)) => l.records,
        other => panic!("audit.list: {other:?}"),
    };
    assert!(
        audit.iter().any(|r| r.action == "process.start"
            && r.message
                .as_deref()
                .is_some_and(|m| m.contains(&e.evidence_root))),
        "{audit:#?}"
    );
    // The snapshots are gone once the evidence is closed, and dropped
    // from the filesystem soon after (left deleted, they slow every later
    // snapshot of the workspace; store::a_started_commit_drops_… is the
    // control).
    assert!(!dir.join("a-workspace").exists() && !dir.join("b-workspace").exists());
    assert!(
        allox_integration::deleted_subvolumes_dropped(&dir, std::time::Duration::from_secs(10)),
        "the runs' deleted snapshots are still on the filesystem after 10 s: {}",
        allox_integration::deleted_subvolumes(&dir)
    );
}

/// Where run `e`'s evidence is, and its chain's record kinds (the chain
/// verified to the run's root).
fn chain_of(d: &ProcDaemon, e: &RunEffects) -> (PathBuf, Vec<String>) {
    let dir = d
        .daemon
        .root
        .join("state/effects")
        .join(&e.agent_id)
        .join(&e.session_id)
        .join(&e.run_id);
    let v = allox_effects::chain::verify(&dir, Some(&e.evidence_root)).expect("the chain verifies");
    (dir, v.kinds)
}

/// What is wrong with the `shared` domain of `e`: `x` by the run, `y` by
/// session `other`.
fn shared_wrong(e: &RunEffects, run: &str, other: &str) -> Option<String> {
    let sh = domain(e, EffectsDomain::Shared);
    let by = |item: &str| {
        sh.changes
            .iter()
            .find(|c| c.item == item)
            .map(|c| c.by.clone())
    };
    match (by("x"), by("y")) {
        (Some(x), Some(y))
            if x.by == By::Run
                && x.run_id.as_deref() == Some(run)
                && y.by == By::Session
                && y.session_id.as_deref() == Some(other) =>
        {
            None
        }
        got => Some(format!("shared says {got:?}: {sh:?}")),
    }
}

#[test]
fn shared_writes_are_attributed_to_the_run_and_to_the_other_session() {
    let Some((d, _scope, _one)) = start(
        "shared_writes_are_attributed_to_the_run_and_to_the_other_session",
        None,
        &[],
    ) else {
        return;
    };
    make_sessions(&d, &[("a", "s1"), ("a", "s2")]);
    // s1 writes x, then waits until s2's run has written y and ended.
    let mut c = d.daemon.client();
    let p = process_start(
        "a",
        "s1",
        &[
            "/bin/sh",
            "-c",
            "echo mine > $ALLOX_AGENT_SHARED/x; while [ ! -e go ]; do sleep 0.02; done",
        ],
    );
    let run = started(&mut c, p);
    // The other session's run writes y while s1's run lives.
    match call(
        &d,
        Request::ProcessStart(process_start(
            "a",
            "s2",
            &["/bin/sh", "-c", "echo theirs > $ALLOX_AGENT_SHARED/y"],
        )),
    ) {
        Ok(Response::Exited(r)) => assert_eq!(r.exit_code, Some(0)),
        other => panic!("s2: {other:?}"),
    }
    std::fs::write(
        d.daemon
            .root
            .join("agents/a/workspace/sessions/s1/current/go"),
        b"",
    )
    .unwrap();
    let e = *waited(&d, "a", "s1", &run).effects.expect("effects");
    assert_eq!(shared_wrong(&e, &run, "s2"), None, "{e:#?}");
    // Control: s2's own run saw y as its own and never saw x.
    let e2 = match call(
        &d,
        Request::EffectsList(allox_protocol::EffectsList {
            agent_id: "a".into(),
            session_id: "s2".into(),
        }),
    ) {
        Ok(Response::EffectsListing(l)) => l.runs.last().expect("s2's run").run_id.clone(),
        other => panic!("list: {other:?}"),
    };
    let e2 = effects_of(&d, "a", "s2", &e2);
    assert!(shared_wrong(&e2, &e2.run_id, "s2").is_some());
    // A directory s2 wrote in, moved by s1's run: what moved with it is
    // the run's doing (the removal of d/f was given to s2, which only
    // wrote it, and e/f to nobody known).
    let r = call(
        &d,
        Request::ProcessStart(process_start(
            "a",
            "s2",
            &[
                "/bin/sh",
                "-c",
                "mkdir $ALLOX_AGENT_SHARED/d && echo theirs > $ALLOX_AGENT_SHARED/d/f",
            ],
        )),
    );
    assert!(
        matches!(r, Ok(Response::Exited(ref x)) if x.exit_code == Some(0)),
        "{r:?}"
    );
    let e = observed(
        &d,
        "a",
        "s1",
        &[
            "/bin/sh",
            "-c",
            "mv $ALLOX_AGENT_SHARED/d $ALLOX_AGENT_SHARED/e",
        ],
    );
    let sh = domain(&e, EffectsDomain::Shared);
    for item in ["d", "d/f", "e", "e/f"] {
        let c = sh
            .changes
            .iter()
            .find(|c| c.item == item)
            .unwrap_or_else(|| panic!("{item} is not listed: {sh:#?}"));
        assert_eq!(
            (c.by.by, c.by.run_id.as_deref()),
            (By::Run, Some(e.run_id.as_str())),
            "{item}: {c:?}"
        );
    }
}

/// What is wrong with `e`'s listing of `name` (`kind`, of `size` bytes on
/// each side given): described by its mode and size, unhashed, on each.
fn unhashed_wrong(e: &RunEffects, name: &str, kind: EffectChangeKind, size: u64) -> Option<String> {
    let ws = domain(e, EffectsDomain::Workspace);
    let Some(c) = ws.changes.iter().find(|c| c.item == name) else {
        return Some(format!("{name} is not listed: {ws:?}"));
    };
    let want = Some(format!("file 644 {size} -"));
    let sides = match kind {
        EffectChangeKind::Added => [None, want.clone()],
        _ => [want.clone(), want.clone()],
    };
    (c.kind != kind || [&c.before, &c.after] != [&sides[0], &sides[1]])
        .then(|| format!("{name}: {c:?}, not {kind:?} with {sides:?}"))
}

/// A run cannot make its observer read without end: files past the bytes
/// the observer hashes for a domain (1 GiB) are listed by their mode and
/// size, unhashed, the others still hashed; a file modified in place past
/// it is listed with alike sides, and the set verifies.
#[test]
fn files_past_the_hashing_budget_are_listed_by_their_size_unhashed() {
    let Some((d, _scope, _one)) = start(
        "files_past_the_hashing_budget_are_listed_by_their_size_unhashed",
        None,
        &[],
    ) else {
        return;
    };
    make_sessions(&d, &[("a", "s")]);
    // Sparse: nothing to write, a terabyte to read.
    let (big, tera) = ("big", 1u64 << 40);
    let e = observed(
        &d,
        "a",
        "s",
        &[
            "/bin/sh",
            "-c",
            "umask 022; truncate -s 1T big && printf x > small",
        ],
    );
    assert_eq!(
        unhashed_wrong(&e, big, EffectChangeKind::Added, tera),
        None,
        "{e:#?}"
    );
    // Control: the small file is hashed, so the same check fails on it.
    assert!(unhashed_wrong(&e, "small", EffectChangeKind::Added, 1).is_some());
    let x = "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881";
    let small = domain(&e, EffectsDomain::Workspace)
        .changes
        .iter()
        .find(|c| c.item == "small");
    assert_eq!(
        small.and_then(|c| c.after.clone()),
        Some(format!("file 644 1 {x}")),
        "{e:#?}"
    );
    assert_eq!((e.verdict, e.fenced), (EffectsVerdict::Changed, false));
    // One byte written in the middle: the same mode and size on each side.
    let m = observed(
        &d,
        "a",
        "s",
        &[
            "/bin/sh",
            "-c",
            "printf y | dd of=big bs=1 seek=4096 conv=notrunc status=none",
        ],
    );
    assert_eq!(
        unhashed_wrong(&m, big, EffectChangeKind::Modified, tera),
        None,
        "{m:#?}"
    );
    assert_eq!(
        (m.verdict, m.fenced),
        (EffectsVerdict::Changed, false),
        "{m:#?}"
    );
    for r in [&e, &m] {
        let v = verified(&d, "a", "s", &r.run_id, Some(&r.evidence_root));
        assert_eq!(verification_wrong(&v, None), None, "{}", v.report);
    }
}

/// What is wrong with `e` as the effects of a run that left `setsid`
/// daemon behind.
fn survivor_wrong(e: &RunEffects) -> Option<String> {
    let s = e
        .survivors
        .iter()
        .find(|s| s.comm == "sh" || s.comm == "busybox");
    let Some(s) = s else {
        return Some(format!("no survivor listed: {:?}", e.survivors));
    };
    if s.lineage.is_empty() && e.survivors.len() < 2 {
        return Some(format!("survivor without lineage: {s:?}"));
    }
    let p = domain(e, EffectsDomain::Processes);
    if !p
        .changes
        .iter()
        .any(|c| c.item.starts_with(&format!("pid {} ", s.pid)))
    {
        return Some(format!("processes does not list it: {p:?}"));
    }
    None
}

#[test]
fn a_setsid_daemon_is_frozen_listed_and_killed_before_b() {
    let Some((d, _scope, _one)) = start(
        "a_setsid_daemon_is_frozen_listed_and_killed_before_b",
        Some(r#"{"domains": ["processes"]}"#),
        &[],
    ) else {
        return;
    };
    make_sessions(&d, &[("a", "s")]);
    // The daemon appends for ever; the program waits until it has begun.
    let e = observed(
        &d,
        "a",
        "s",
        &[
            "/bin/sh",
            "-c",
            "setsid sh -c 'while :; do echo . >> log; done' < /dev/null > /dev/null 2>&1 & while [ ! -s log ]; do sleep 0.01; done",
        ],
    );
    assert_eq!(survivor_wrong(&e), None, "{e:#?}");
    // Nothing of the run is alive, and `log` is what B saw: its size is
    // the one the evidence lists.
    let log = d
        .daemon
        .root
        .join("agents/a/workspace/sessions/s/current/log");
    let size = std::fs::metadata(&log).expect("log").len();
    let ws = domain(&e, EffectsDomain::Workspace);
    let at_b = ws
        .changes
        .iter()
        .find(|c| c.item == "log")
        .and_then(|c| c.after.clone())
        .expect("log listed");
    assert!(
        at_b.contains(&format!(" {size} ")),
        "log is {size} bytes, B saw {at_b}"
    );
    // Empty, or gone: read once (the supervisor may remove it between a
    // look and a read).
    let cg = d.cgroup.join("allox/a/s").join(format!("run-{}", e.run_id));
    let events = std::fs::read_to_string(cg.join("cgroup.events"));
    assert!(
        match &events {
            Ok(ev) => ev.contains("populated 0"),
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        },
        "the run's cgroup still has processes: {events:?}"
    );
    // Control: a run that leaves nothing behind fails the check.
    let t = observed(&d, "a", "s", &["/bin/true"]);
    assert!(survivor_wrong(&t).is_some());
    assert!(t.survivors.is_empty());
}

/// The observer processes of daemon `pid`.
fn observers_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
        if !cmd.starts_with(b"allox-observe\0") {
            continue;
        }
        let st = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        let ppid = st
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().nth(1))
            .and_then(|x| x.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(p);
        }
    }
    out
}

/// The descriptors in `dir` (a `/proc/PID/fd` or a task's) that are
/// files of `/proc/sys`.
fn proc_sys_descriptors(dir: &str) -> usize {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.starts_with("/proc/sys")))
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn an_observers_kept_sysctl_descriptors_stay_out_of_its_listed_table() {
    let Some((d, _scope, _one)) = start(
        "an_observers_kept_sysctl_descriptors_stay_out_of_its_listed_table",
        Some(r#"{"domains": ["sysctl", "bpf"]}"#),
        &[],
    ) else {
        return;
    };
    make_sessions(&d, &[("a", "s")]);
    for _ in 0..2 {
        let e = observed(&d, "a", "s", &["/bin/true"]);
        assert_eq!(e.verdict, EffectsVerdict::Consistent, "{e:#?}");
        // The root answered is the chain's as written.
        let dir = d.daemon.root.join("state/effects/a/s").join(&e.run_id);
        let v = allox_effects::chain::verify(&dir, Some(&e.evidence_root));
        assert!(v.as_ref().is_ok_and(|v| v.closed), "{v:?}");
    }
    // The observer that captured keeps its `/proc/sys` descriptors for the
    // next capture, on a thread whose table is its own: the process's
    // table, which `/proc/PID/fd` lists (and every capture of the bpf
    // domain lists for each observer), holds none of them.
    let obs = observers_of(d.daemon.child.id());
    assert!(!obs.is_empty(), "no observer waits");
    let mut kept = 0;
    for o in &obs {
        let listed = proc_sys_descriptors(&format!("/proc/{o}/fd"));
        assert_eq!(
            listed, 0,
            "observer {o} lists {listed} /proc/sys descriptors"
        );
        for t in std::fs::read_dir(format!("/proc/{o}/task"))
            .unwrap()
            .flatten()
        {
            kept = kept.max(proc_sys_descriptors(&format!("{}/fd", t.path().display())));
        }
    }
    assert!(
        kept >= 100,
        "no observer's thread keeps the /proc/sys descriptors ({kept})"
    );
}

#[test]
fn the_observer_killed_from_outside_fences_the_session() {
    let Some((d, _scope, _one)) = start(
        "the_observer_killed_from_outside_fences_the_session",
        None,
        &[],
    ) else {
        return;
    };
    make_sessions(&d, &[("a", "s"), ("a", "other")]);
    let mut c = d.daemon.client();
    let p = process_start("a", "s", &["/bin/sh", "-c", "while :; do sleep 0.05; done"]);
    let run = started(&mut c, p);
    let obs = observers_of(d.daemon.child.id());
    assert_eq!(obs.len(), 1, "one observer for the one run: {obs:?}");
    // It holds only the capabilities it needs: none to load modules, to
    // signal, to change identity or to make devices.
    let status = std::fs::read_to_string(format!("/proc/{}/status", obs[0])).unwrap();
    let cap = |name: &str| -> u64 {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in {status}"));
        u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
    };
    let (eff, bnd) = (cap("CapEff:"), cap("CapBnd:"));
    for (bit, what) in [
        (16, "SYS_MODULE"),
        (5, "KILL"),
        (7, "SETUID"),
        (27, "MKNOD"),
        (22, "SYS_BOOT"),
    ] {
        assert_eq!(eff & (1 << bit), 0, "the observer has CAP_{what}: {eff:x}");
        assert_eq!(
            bnd & (1 << bit),
            0,
            "the observer may regain CAP_{what}: {bnd:x}"
        );
    }
    for (bit, what) in [(21, "SYS_ADMIN"), (39, "BPF")] {
        assert_ne!(
            eff & (1 << bit),
            0,
            "the observer lacks CAP_{what}: {eff:x}"
        );
    }
    // The observer's own programs, by its descriptors.
    let its_progs = prog_ids_of(obs[0]);
    assert!(!its_progs.is_empty(), "the observer holds no BPF program");
    let killed = std::process::Command::new("kill")
        .args(["-9", &obs[0].to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let r = waited(&d, "a", "s", &run);
    assert_eq!(r.signal, Some(9), "the run was killed: {r:?}");
    let e = *r.effects.expect("effects");
    assert!(e.fenced, "{e:#?}");
    assert_eq!(e.verdict, EffectsVerdict::Incomplete);
    assert!(
        e.fence_reason.as_deref().unwrap_or("").contains("observer"),
        "{e:?}"
    );
    // The killed observer's A snapshots (a copy of current/) are not left
    // in the evidence (before, they stayed for good).
    let evidence = d.daemon.root.join("state/effects/a/s").join(&run);
    assert!(
        evidence.join("chain.jsonl").exists(),
        "{}",
        evidence.display()
    );
    for left in ["a-workspace", "a-agent", "b-workspace", "b-agent"] {
        assert!(
            !evidence.join(left).exists(),
            "{left} is left in {}",
            evidence.display()
        );
    }
    // Fenced: changes refused naming run, reason and root; reads work;
    // another session is untouched.
    let refused = call(
        &d,
        Request::ProcessStart(process_start("a", "s", &["/bin/true"])),
    )
    .expect_err("a fenced session runs nothing");
    assert_eq!(refused.code, allox_protocol::ErrorCode::Unavailable);
    for want in [run.as_str(), "observer", e.evidence_root.as_str()] {
        assert!(
            refused.message.contains(want),
            "{} lacks {want}",
            refused.message
        );
    }
    // The file API's changes too, in current/ and in the agent's shared/
    // named through the fenced session (a file request's target is
    // `a/s:path`), and `alloxctl cp` into it.
    use allox_protocol::{FsMkdir, FsMove, FsRemove, FsScope, FsWrite};
    std::fs::write(session_file(&d, "a", "s", "there"), b"x").unwrap();
    let shared_write = FsWrite {
        scope: FsScope::Shared,
        ..FsWrite::whole("a", "s", "via-fenced", "x")
    };
    for (what, req) in [
        (
            "fs.write",
            Request::FsWrite(FsWrite::whole("a", "s", "w", "x")),
        ),
        ("fs.write to shared/", Request::FsWrite(shared_write)),
        (
            "fs.mkdir",
            Request::FsMkdir(FsMkdir {
                agent_id: "a".into(),
                session_id: "s".into(),
                scope: FsScope::Session,
                path: "dd".into(),
                parents: false,
            }),
        ),
        (
            "fs.move",
            Request::FsMove(FsMove {
                agent_id: "a".into(),
                session_id: "s".into(),
                scope: FsScope::Session,
                path: "there".into(),
                to: "moved".into(),
            }),
        ),
        (
            "fs.remove",
            Request::FsRemove(FsRemove {
                agent_id: "a".into(),
                session_id: "s".into(),
                scope: FsScope::Session,
                path: "there".into(),
                recursive: false,
            }),
        ),
    ] {
        let e = call(&d, req).expect_err(what);
        assert_eq!(
            e.code,
            allox_protocol::ErrorCode::Unavailable,
            "{what}: {e:?}"
        );
        assert!(e.message.contains(&run), "{what}: {}", e.message);
    }
    let local = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(local.path(), b"from the host").unwrap();
    let (code, _, err) = allox_integration::alloxctl(
        &d.daemon.socket,
        &["cp", local.path().to_str().unwrap(), "a/s:copied"],
    );
    assert_ne!(code, 0, "cp into a fenced session: {err}");
    assert!(err.contains("fenced"), "{err}");
    for gone in ["w", "dd", "moved", "copied"] {
        assert!(
            !session_file(&d, "a", "s", gone).exists(),
            "{gone} was made"
        );
    }
    assert!(session_file(&d, "a", "s", "there").exists());
    assert!(!d
        .daemon
        .root
        .join("agents/a/workspace/shared/via-fenced")
        .exists());
    // Reads still work.
    assert!(matches!(
        call(
            &d,
            Request::FsStat(allox_protocol::FsStat {
                agent_id: "a".into(),
                session_id: "s".into(),
                scope: FsScope::Session,
                checkpoint_id: None,
                path: "there".into(),
            })
        ),
        Ok(Response::FsEntry(_))
    ));
    assert!(matches!(
        call(
            &d,
            Request::CheckpointList(allox_protocol::SessionRef {
                agent_id: "a".into(),
                session_id: "s".into(),
            })
        ),
        Ok(Response::Checkpoints(_))
    ));
    let other = observed(&d, "a", "other", &["/bin/true"]);
    assert_eq!(other.verdict, EffectsVerdict::Consistent, "{other:#?}");
    // No BPF program of the killed observer is left. The kernel lets a
    // link's program go after an RCU grace period, which a lazy RCU
    // (CONFIG_RCU_LAZY) may hold for up to 10 s: the programs have that
    // long, and more, to go.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let now = bpf_prog_ids();
        let left: Vec<_> = its_progs.iter().filter(|id| now.contains(id)).collect();
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "programs left 30 s after the observer was killed: {left:?} (loaded: {now:?})"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // Unfence needs that run's root.
    let wrong = call(
        &d,
        Request::EffectsUnfence(allox_protocol::EffectsUnfence {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: run.clone(),
            evidence_root: "0".repeat(64),
        }),
    );
    assert_eq!(
        wrong.expect_err("a wrong root").code,
        allox_protocol::ErrorCode::Conflict
    );
    call(
        &d,
        Request::EffectsUnfence(allox_protocol::EffectsUnfence {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: run,
            evidence_root: e.evidence_root.clone(),
        }),
    )
    .expect("unfence with the run's root");
    let again = observed(&d, "a", "s", &["/bin/true"]);
    assert_eq!(again.verdict, EffectsVerdict::Consistent);
}

/// BPF program ids loaded now (`prog ID` keys of the bpf collector).
fn bpf_prog_ids() -> Vec<u32> {
    allox_effects::collect::bpf::capture()
        .items
        .keys()
        .filter_map(|k| {
            k.strip_prefix("prog ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// The BPF programs process `pid` holds descriptors of (its fdinfo's
/// `prog_id`).
fn prog_ids_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let info = std::fs::read_to_string(e.path()).unwrap_or_default();
        for l in info.lines() {
            if let Some(id) = l.strip_prefix("prog_id:") {
                if let Ok(id) = id.trim().parse() {
                    out.push(id);
                }
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

#[test]
fn another_daemons_run_started_during_this_one_is_not_a_change_of_bpf() {
    let Some((d, _scope, _one)) = start(
        "another_daemons_run_started_during_this_one_is_not_a_change_of_bpf",
        Some(SCOPE_MACHINE),
        &[],
    ) else {
        return;
    };
    let (other, _other_scope) = start_beside(
        "another_daemons_run_started_during_this_one_is_not_a_change_of_bpf-other",
        Some(SCOPE_MACHINE),
        &[],
    );
    make_sessions(&d, &[("a", "s")]);
    make_sessions(&other, &[("b", "t")]);
    // The other daemon's observer has loaded its programs (listed them
    // where every observer looks) before this run's A.
    let first = observed(&other, "b", "t", &["/bin/true"]);
    assert_eq!(first.verdict, EffectsVerdict::Consistent, "{first:#?}");
    let wait = ["/bin/sh", "-c", "while [ ! -e go ]; do sleep 0.02; done"];
    let run = started(&mut d.daemon.client(), process_start("a", "s", &wait));
    // After this run's A, the other's run starts: its observer attaches a
    // link for it (listed nowhere), still there at this run's B.
    let before = bpf_link_ids();
    let other_run = started(&mut other.daemon.client(), process_start("b", "t", &wait));
    let during = bpf_link_ids();
    assert!(
        during.iter().any(|l| !before.contains(l)),
        "the other run attached no link: {before:?} -> {during:?}"
    );
    let go = |d: &ProcDaemon, a: &str, s: &str| {
        std::fs::write(
            d.daemon
                .root
                .join(format!("agents/{a}/workspace/sessions/{s}/current/go")),
            b"",
        )
        .unwrap()
    };
    go(&d, "a", "s");
    let e = *waited(&d, "a", "s", &run).effects.expect("effects");
    assert_eq!(
        domain(&e, EffectsDomain::Bpf).verdict,
        EffectsVerdict::Consistent,
        "the other observer's link was counted as the machine's: {e:#?}"
    );
    go(&other, "b", "t");
    let o = *waited(&other, "b", "t", &other_run)
        .effects
        .expect("effects");
    assert_eq!(
        domain(&o, EffectsDomain::Bpf).verdict,
        EffectsVerdict::Consistent,
        "{o:#?}"
    );
}

#[test]
fn an_observed_run_holds_its_session_alone() {
    let Some((d, _scope, _one)) = start("an_observed_run_holds_its_session_alone", None, &[])
    else {
        return;
    };
    make_sessions(&d, &[("a", "s")]);
    let mut c = d.daemon.client();
    let p = process_start(
        "a",
        "s",
        &["/bin/sh", "-c", "while [ ! -e go ]; do sleep 0.02; done"],
    );
    let run = started(&mut c, p);
    let second = call(
        &d,
        Request::ProcessStart(process_start("a", "s", &["/bin/true"])),
    )
    .expect_err("a second run of the session is refused");
    assert_eq!(second.code, allox_protocol::ErrorCode::Conflict);
    assert!(second.message.contains(&run), "{}", second.message);
    std::fs::write(
        d.daemon
            .root
            .join("agents/a/workspace/sessions/s/current/go"),
        b"",
    )
    .unwrap();
    let e = *waited(&d, "a", "s", &run).effects.expect("effects");
    // `go` was written by the host while the run lived: a workspace change.
    assert_eq!(
        domain(&e, EffectsDomain::Workspace).verdict,
        EffectsVerdict::Changed
    );
    // Once it has ended, the session runs again.
    let again = observed(&d, "a", "s", &["/bin/true"]);
    assert_eq!(again.verdict, EffectsVerdict::Consistent);
    // Starts sent at once, while the first is still being begun (its A
    // not sealed yet): one runs, the others are refused. (Before, each
    // passed the check and one run went on unobserved to its end.)
    for round in 0..5 {
        let answers: Vec<_> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..3)
                .map(|i| {
                    let d = &d;
                    sc.spawn(move || {
                        let mut p = process_start(
                            "a",
                            "s",
                            &["/bin/sh", "-c", &format!("echo {i} > at-once-{i}")],
                        );
                        p.wait = false;
                        d.daemon
                            .client()
                            .call(Request::ProcessStart(p))
                            .expect("transport")
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let runs: Vec<String> = answers
            .iter()
            .filter_map(|a| match a {
                Ok(Response::Started(s)) => Some(s.run_id.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(runs.len(), 1, "round {round}: {answers:?}");
        for a in &answers {
            if let Err(e) = a {
                assert_eq!(
                    e.code,
                    allox_protocol::ErrorCode::Conflict,
                    "round {round}: {e:?}"
                );
            }
        }
        let e = *waited(&d, "a", "s", &runs[0]).effects.expect("effects");
        assert!(!e.fenced, "round {round}: {e:#?}");
        let made: Vec<_> = (0..3)
            .filter(|i| session_file(&d, "a", "s", &format!("at-once-{i}")).exists())
            .collect();
        assert_eq!(made.len(), 1, "round {round}: runs that wrote: {made:?}");
        std::fs::remove_file(session_file(&d, "a", "s", &format!("at-once-{}", made[0]))).unwrap();
    }
}

/// A run that sets an extended attribute on a file or changes a FIFO's
/// mode: the workspace CHANGED with the entry listed and both sides
/// described apart, never the run's own evidence refused by the verifier
/// and the session fenced (before, both sides read alike).
#[test]
fn an_xattr_or_a_fifo_s_mode_changed_by_a_run_is_listed_and_not_fenced() {
    let Some((d, _scope, _one)) = start(
        "an_xattr_or_a_fifo_s_mode_changed_by_a_run_is_listed_and_not_fenced",
        None,
        &[],
    ) else {
        return;
    };
    make_sessions(&d, &[("a", "s")]);
    let made = observed(
        &d,
        "a",
        "s",
        &["/bin/sh", "-c", "echo data > f && mkfifo p"],
    );
    assert!(!made.fenced, "{made:#?}");
    for (argv, item) in [
        (
            vec![
                "/usr/bin/python3",
                "-c",
                "import os; os.setxattr('f', 'user.note', b'1')",
            ],
            "f",
        ),
        (vec!["/bin/chmod", "600", "p"], "p"),
    ] {
        let e = observed(&d, "a", "s", &argv);
        assert!(
            !e.fenced && e.verdict == EffectsVerdict::Changed,
            "{argv:?}: {e:#?}"
        );
        let ws = domain(&e, EffectsDomain::Workspace);
        let change = ws
            .changes
            .iter()
            .find(|c| c.item == item)
            .unwrap_or_else(|| panic!("{item} not listed: {ws:#?}"));
        assert_eq!(change.kind, EffectChangeKind::Modified, "{change:?}");
        assert_ne!(change.before, change.after, "{change:?}");
        assert_eq!(change.by.by, By::Run, "{change:?}");
    }
    // A run on a terminal is observed as any other. (Its PID 1, started
    // in the frozen cgroup, could not send its terminal before the thaw,
    // which waited for it: every terminal run failed after 10 s, 126.)
    let mut p = process_start("a", "s", &["/bin/sh", "-c", "tty; echo on-a-tty > t"]);
    p.pty = Some(allox_protocol::PtySize {
        rows: 24,
        cols: 80,
        term: None,
    });
    let r = match call(&d, Request::ProcessStart(p)) {
        Ok(Response::Exited(r)) => r,
        other => panic!("process.start on a terminal: {other:?}"),
    };
    assert!(
        r.exit_code == Some(0) && r.stdout.contains("/dev/pts/"),
        "{r:#?}"
    );
    let e = r.effects.expect("a terminal run is observed");
    let ws = domain(&e, EffectsDomain::Workspace);
    assert!(
        !e.fenced
            && ws
                .changes
                .iter()
                .any(|c| c.item == "t" && c.by.by == By::Run),
        "{e:#?}"
    );
}

/// A run whose observation fails at its start (here: the scope's path
/// removed after the daemon started) is refused and fences its session,
/// and is still shown: `effects.get` and `effects.list` give it
/// INCOMPLETE and fenced, and its chain's fault names it, so two such
/// runs never share a root. (Before, neither showed it, and every such
/// chain was the same bytes.)
#[test]
fn a_run_whose_observation_fails_at_start_is_shown_and_its_root_is_its_own() {
    let watched = tempfile::tempdir_in("/var/tmp").unwrap();
    let scope = format!(
        r#"{{"domains": ["filesystem"], "paths": ["{}"]}}"#,
        watched.path().display()
    );
    let Some((d, _scope, _one)) = start(
        "a_run_whose_observation_fails_at_start_is_shown_and_its_root_is_its_own",
        Some(&scope),
        &[],
    ) else {
        return;
    };
    make_sessions(&d, &[("a", "s"), ("a", "t")]);
    let path = watched.path().to_path_buf();
    drop(watched);
    assert!(!path.exists());
    let mut roots = Vec::new();
    for s in ["s", "t"] {
        let e = call(
            &d,
            Request::ProcessStart(process_start("a", s, &["/bin/true"])),
        )
        .expect_err("refused: its observation cannot start");
        assert_eq!(e.code, allox_protocol::ErrorCode::Unavailable, "{e:?}");
        // "run not started: run RUN refused: its observation failed at
        // start (…)"
        let run = e
            .message
            .split(" refused: its observation")
            .next()
            .and_then(|x| x.rsplit(' ').next())
            .unwrap_or_else(|| panic!("no run id in {}", e.message))
            .to_string();
        assert!(e.message.contains("failed at start"), "{}", e.message);
        let got = effects_of(&d, "a", s, &run);
        assert!(
            got.fenced && got.verdict == EffectsVerdict::Incomplete,
            "{got:#?}"
        );
        let listed = match call(
            &d,
            Request::EffectsList(allox_protocol::EffectsList {
                agent_id: "a".into(),
                session_id: s.into(),
            }),
        ) {
            Ok(Response::EffectsListing(l)) => l.runs.iter().any(|r| r.run_id == run),
            other => panic!("list: {other:?}"),
        };
        assert!(listed, "{run} is not listed");
        // Its history was never written: said so, not a parser's error.
        let h = call(
            &d,
            Request::EffectsHistory(allox_protocol::EffectsHistory {
                agent_id: "a".into(),
                session_id: s.into(),
                run_id: run.clone(),
                cursor: None,
                limit: None,
            }),
        )
        .expect_err("no history");
        assert!(
            h.code == allox_protocol::ErrorCode::NotFound && h.message.contains("has no history"),
            "{h:?}"
        );
        roots.push(got.evidence_root);
    }
    assert_ne!(roots[0], roots[1], "two runs' faults share a root");
    // Under protocol v3 the baseline is made and pinned before the
    // observer is asked: refused, the run ran nothing, and its baseline is
    // gone with it (else a pinned checkpoint nobody made would stand in
    // the way of the session's delete).
    make_sessions(&d, &[("a", "v")]);
    let mut p = process_start("a", "v", &["/bin/true"]);
    p.recovery = Some(Box::new(recovery(None, false, true)));
    let e = call(&d, Request::ProcessStart(p)).expect_err("refused under v3 too");
    assert_eq!(e.code, allox_protocol::ErrorCode::Unavailable, "{e:?}");
    match call(
        &d,
        Request::CheckpointList(allox_protocol::SessionRef {
            agent_id: "a".into(),
            session_id: "v".into(),
        }),
    ) {
        Ok(Response::Checkpoints(l)) => assert!(l.checkpoints.is_empty(), "{l:?}"),
        other => panic!("checkpoint.list: {other:?}"),
    }
    call(
        &d,
        Request::SessionDelete(allox_protocol::SessionDelete {
            agent_id: "a".into(),
            session_id: "v".into(),
            force: false,
        }),
    )
    .expect("a fenced session with no pinned checkpoint is deleted without force");
}

/// The daemon's own per-run guest socket (`<socket>.guest/RUN/sock`,
/// made before A) stays until the run's B is captured: with the
/// `filesystem` domain watching that directory, a run that changes
/// nothing is CONSISTENT. (Before, it was removed before B and listed as
/// removed `by unknown`: every run CHANGED.)
#[test]
fn the_daemon_s_own_guest_socket_is_no_change_of_a_run() {
    let name = "the_daemon_s_own_guest_socket_is_no_change_of_a_run";
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !require(name) {
        return;
    }
    // Started once without the plugin to learn where its socket is, then
    // again with the plugin watching the socket's guest directory.
    let mut d = ProcDaemon::start(name, &[]);
    let guest = PathBuf::from(format!("{}.guest", d.daemon.socket.display()));
    assert!(guest.is_dir(), "{}", guest.display());
    let dir = tempfile::tempdir().unwrap();
    let scope = format!(
        r#"{{"domains": ["filesystem"], "paths": ["{}"]}}"#,
        guest.display()
    );
    let args = scoped_args(dir.path(), Some(&scope));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    d.restart(&args);
    make_sessions(&d, &[("a", "s")]);
    for _ in 0..3 {
        let e = observed(&d, "a", "s", &["/bin/true"]);
        let fs = domain(&e, EffectsDomain::Filesystem);
        assert_eq!(fs.verdict, EffectsVerdict::Consistent, "{fs:#?}");
        assert_eq!(e.verdict, EffectsVerdict::Consistent, "{e:#?}");
    }
}

/// Runs of several sessions observed at once, each with an observer of
/// its own, new observers loading their programs (and aya's probes
/// making and dropping maps) while the others capture, and each run's
/// sysctl link made and dropped: no observer's object is ever a change
/// of another's run. (Before, one round in two or so listed one as made
/// or removed `by unknown`.)
#[test]
fn runs_observed_at_once_never_see_each_other_s_observers() {
    let Some((d, _scope, _one)) = start(
        "runs_observed_at_once_never_see_each_other_s_observers",
        Some(r#"{"domains": ["bpf"]}"#),
        &[],
    ) else {
        return;
    };
    let sessions = ["p1", "p2", "p3", "p4"];
    make_sessions(&d, &sessions.map(|s| ("a", s)));
    for round in 0..4 {
        // Each started once the one before is (its A sealed): the next
        // observer loads while the earlier runs live and end.
        let mut c = d.daemon.client();
        let runs: Vec<(&str, String)> = sessions
            .iter()
            .map(|&s| {
                let p = process_start("a", s, &["/bin/sh", "-c", "sleep 0.2"]);
                (s, started(&mut c, p))
            })
            .collect();
        for (s, run) in runs {
            let e = *waited(&d, "a", s, &run).effects.expect("effects");
            let bpf = domain(&e, EffectsDomain::Bpf);
            assert_eq!(
                bpf.verdict,
                EffectsVerdict::Consistent,
                "round {round}, {s}: {bpf:#?}"
            );
            assert_eq!(
                e.verdict,
                EffectsVerdict::Consistent,
                "round {round}, {s}: {e:#?}"
            );
        }
    }
}

/// An orderly shutdown while an observed run lives ends the run as a
/// kill does: its B captured while the session's context still lives,
/// the evidence whole, the session not fenced after the restart. (Before,
/// the shutdown killed the contexts with the runs, B could not read the
/// session's mount namespace: INCOMPLETE, fenced.)
#[test]
fn an_orderly_shutdown_ends_observed_runs_without_fencing_their_sessions() {
    let name = "an_orderly_shutdown_ends_observed_runs_without_fencing_their_sessions";
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !require(name) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let args = scoped_args(dir.path(), Some(SCOPE_MACHINE));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut d = ProcDaemon::start(name, &args);
    make_sessions(&d, &[("a", "s")]);
    let mut c = d.daemon.client();
    let run = started(
        &mut c,
        process_start("a", "s", &["/bin/sh", "-c", "echo begun > begun; sleep 30"]),
    );
    let t = std::time::Instant::now();
    while !session_file(&d, "a", "s", "begun").exists() {
        assert!(t.elapsed().as_secs() < 30, "the run did not begin");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    match call(&d, Request::Shutdown(allox_protocol::Shutdown {})) {
        Ok(Response::Stopping(_)) => {}
        other => panic!("shutdown: {other:?}"),
    }
    let st = d.daemon.child.wait().expect("wait for the daemon");
    assert!(st.success(), "{st}");
    d.restart(&args);
    match call(
        &d,
        Request::EffectsStatus(allox_protocol::EffectsStatusRequest::default()),
    ) {
        Ok(Response::EffectsStatus(s)) => assert!(s.fences.is_empty(), "{s:#?}"),
        other => panic!("{other:?}"),
    }
    let e = effects_of(&d, "a", "s", &run);
    assert!(!e.fenced, "{e:#?}");
    for dom in &e.domains {
        assert_ne!(dom.verdict, EffectsVerdict::Incomplete, "{dom:#?}");
    }
    let again = observed(&d, "a", "s", &["/bin/true"]);
    assert!(!again.fenced, "{again:#?}");
}

/// A session deleted (or its agent, with `force`) while an observed run
/// lives: the run is killed and its evidence kept, but no fence is left
/// on the name: a session made again under it is another, and runs.
/// (Before, the run's end fenced the deleted name after the delete had
/// lifted its fences, and `session.create` of it was refused.)
#[test]
fn a_session_deleted_during_an_observed_run_leaves_no_fence_on_its_name() {
    let Some((d, _scope, _one)) = start(
        "a_session_deleted_during_an_observed_run_leaves_no_fence_on_its_name",
        None,
        &[],
    ) else {
        return;
    };
    make_sessions(&d, &[("a", "x"), ("b", "s")]);
    let ctl = |args: &[&str]| {
        let (code, out, err) = allox_integration::alloxctl(&d.daemon.socket, args);
        assert_eq!(code, 0, "{args:?}: {}{err}", String::from_utf8_lossy(&out));
    };
    let observing = || match call(
        &d,
        Request::EffectsStatus(allox_protocol::EffectsStatusRequest::default()),
    ) {
        Ok(Response::EffectsStatus(s)) => s.observing,
        other => panic!("{other:?}"),
    };
    let mut old = Vec::new();
    for (a, s, delete) in [
        ("a", "x", ["session", "delete", "a", "x"]),
        ("b", "s", ["agent", "delete", "--force", "b"]),
    ] {
        // Started and answered on a connection of its own: its answer
        // comes once the run's end is settled, fence or not.
        let mut c = d.daemon.client();
        let p = process_start(a, s, &["/bin/sh", "-c", "sleep 30"]);
        let ran = std::thread::spawn(move || c.call(Request::ProcessStart(p)).expect("transport"));
        let t = std::time::Instant::now();
        while observing() == 0 {
            assert!(
                t.elapsed().as_secs() < 30,
                "{a}/{s}: the run is not observed"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        ctl(&delete);
        match ran.join().unwrap() {
            Ok(Response::Exited(r)) => {
                assert_eq!(r.signal, Some(9), "{r:?}");
                old.push((a, s, r.run_id));
            }
            other => panic!("{a}/{s}: {other:?}"),
        }
    }
    let status = match call(
        &d,
        Request::EffectsStatus(allox_protocol::EffectsStatusRequest::default()),
    ) {
        Ok(Response::EffectsStatus(s)) => s,
        other => panic!("{other:?}"),
    };
    assert!(status.fences.is_empty(), "{status:#?}");
    ctl(&["session", "create", "a", "x"]);
    ctl(&["agent", "create", "b"]);
    ctl(&["session", "create", "b", "s"]);
    let list = |a: &str, s: &str| {
        call(
            &d,
            Request::EffectsList(allox_protocol::EffectsList {
                agent_id: a.into(),
                session_id: s.into(),
            }),
        )
    };
    for (a, s) in [("a", "x"), ("b", "s")] {
        let e = observed(&d, a, s, &["/bin/true"]);
        assert_eq!(e.verdict, EffectsVerdict::Consistent, "{a}/{s}: {e:#?}");
        // The session made again lists its own run, not the deleted one's.
        match list(a, s) {
            Ok(Response::EffectsListing(l)) => {
                let ids: Vec<_> = l.runs.iter().map(|r| r.run_id.as_str()).collect();
                assert_eq!(ids, [e.run_id.as_str()], "{a}/{s}");
            }
            other => panic!("{other:?}"),
        }
    }
    let none = list("a", "nope").expect_err("no such session");
    assert_eq!(none.code, allox_protocol::ErrorCode::NotFound, "{none:?}");
    // Nor is the deleted one's run got by its id as the new one's (it was).
    for (a, s, run) in old {
        let got = call(
            &d,
            Request::EffectsGet(allox_protocol::EffectsGet {
                agent_id: a.into(),
                session_id: s.into(),
                run_id: run.clone(),
            }),
        );
        match got {
            Err(e) => assert!(
                e.code == allox_protocol::ErrorCode::NotFound
                    && e.message.contains("deleted before this one was made"),
                "{a}/{s}/{run}: {e:?}"
            ),
            other => panic!("{a}/{s}: the deleted session's run {run}: {other:?}"),
        }
    }
}

#[test]
fn the_daemon_refuses_a_wrong_observer_or_verifier_and_the_process_tree_plugin() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !require("the_daemon_refuses_a_wrong_observer_or_verifier_and_the_process_tree_plugin") {
        return;
    }
    let fs = allox_integration::BtrfsFs::new(256).expect("btrfs");
    let root = fs.path().join("store");
    std::fs::create_dir(&root).unwrap();
    let (exe, sha) = observer();
    let refused = |args: &[&str]| -> String {
        let out = std::process::Command::new(allox_integration::workspace_bin("allox-init"))
            .arg("supervise")
            .arg("--root")
            .arg(&root)
            .arg("--listen")
            .arg(format!("unix:{}", fs.scratch().join("s.sock").display()))
            .arg("--cgroup-root")
            .arg(
                allox_integration::cgroup2_mount()
                    .unwrap()
                    .join(format!("allox-test-{}-refuse", std::process::id())),
            )
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "the daemon started with {args:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let exe = exe.display().to_string();
    let wrong = "1".repeat(64);
    let e = refused(&[
        "--plugin",
        "system-effects",
        "--system-effects-observer",
        &exe,
        "--system-effects-observer-sha256",
        &wrong,
    ]);
    assert!(e.contains("not the pinned") && e.contains(&wrong), "{e}");
    // A swapped verifier (the observer's bytes where the verifier should
    // be) stops the daemon, naming it.
    let (_, vsha) = pinned("allox-system-effects-verify");
    let e = refused(&[
        "--plugin",
        "system-effects",
        "--system-effects-observer",
        &exe,
        "--system-effects-observer-sha256",
        &sha,
        "--system-effects-verifier",
        &exe,
        "--system-effects-verifier-sha256",
        &vsha,
    ]);
    assert!(
        e.contains(&format!(
            "the verifier {exe} has sha256 {sha}, not the pinned {vsha}"
        )),
        "{e}"
    );
    // So does a swapped recover tool.
    let (vexe, _) = pinned("allox-system-effects-verify");
    let vexe = vexe.display().to_string();
    let (_, rsha) = pinned("allox-system-effects-recover");
    let e = refused(&[
        "--plugin",
        "system-effects",
        "--system-effects-observer",
        &exe,
        "--system-effects-observer-sha256",
        &sha,
        "--system-effects-verifier",
        &vexe,
        "--system-effects-verifier-sha256",
        &vsha,
        "--system-effects-recover",
        &exe,
        "--system-effects-recover-sha256",
        &rsha,
    ]);
    assert!(
        e.contains(&format!(
            "the recover tool {exe} has sha256 {sha}, not the pinned {rsha}"
        )),
        "{e}"
    );
    let e = refused(&[
        "--plugin",
        "system-effects",
        "--plugin",
        "process-tree",
        "--system-effects-observer",
        &exe,
        "--system-effects-observer-sha256",
        &sha,
    ]);
    assert!(
        e.contains("process-tree") && e.contains("system-effects"),
        "{e}"
    );
    let bad_scope = fs.scratch().join("scope.json");
    std::fs::write(&bad_scope, r#"{"domains": ["kernel"]}"#).unwrap();
    let e = refused(&[
        "--plugin",
        "system-effects",
        "--system-effects-observer",
        &exe,
        "--system-effects-observer-sha256",
        &sha,
        "--system-effects-scope",
        bad_scope.to_str().unwrap(),
    ]);
    assert!(e.contains("unknown domain \"kernel\""), "{e}");
    let _ = std::fs::remove_dir(
        allox_integration::cgroup2_mount()
            .unwrap()
            .join(format!("allox-test-{}-refuse", std::process::id()))
            .join("allox"),
    );
    let _ = std::fs::remove_dir(
        allox_integration::cgroup2_mount()
            .unwrap()
            .join(format!("allox-test-{}-refuse", std::process::id())),
    );
}

#[test]
fn with_the_plugin_off_runs_answer_as_before() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !require("with_the_plugin_off_runs_answer_as_before") {
        return;
    }
    let d = ProcDaemon::start("with_the_plugin_off_runs_answer_as_before", &[]);
    make_sessions(&d, &[("a", "s")]);
    match call(
        &d,
        Request::ProcessStart(process_start("a", "s", &["/bin/true"])),
    ) {
        Ok(Response::Exited(r)) => {
            assert_eq!(r.exit_code, Some(0));
            assert!(r.effects.is_none());
        }
        other => panic!("{other:?}"),
    }
    assert!(!d.daemon.root.join("state/effects").exists());
    let e = call(
        &d,
        Request::EffectsStatus(allox_protocol::EffectsStatusRequest::default()),
    )
    .expect_err("no plugin, no effects");
    assert!(e.message.contains("system-effects"), "{}", e.message);
    // Recovery (protocol v3) needs the plugin: refused, nothing run.
    let mut p = process_start("a", "s", &["/bin/sh", "-c", "echo x > ran"]);
    p.recovery = Some(Box::new(recovery(None, false, true)));
    let e = call(&d, Request::ProcessStart(p)).expect_err("no plugin, no recovery");
    assert_eq!(e.code, allox_protocol::ErrorCode::InvalidRequest, "{e:?}");
    assert!(
        e.message.contains("--plugin system-effects"),
        "{}",
        e.message
    );
    assert!(!session_file(&d, "a", "s", "ran").exists());
}

/// The refused attempts a sandboxed agent makes: a BPF map, a module, a
/// mount, a route (its output says what each got).
const ATTEMPTS: &str = r#"
import ctypes, subprocess
libc = ctypes.CDLL(None, use_errno=True)
attr = (ctypes.c_uint32 * 8)(2, 4, 4, 1, 0, 0, 0, 0)
print("bpf", libc.syscall(321, 0, attr, 32), ctypes.get_errno())
print("finit_module", libc.syscall(313, 0, b"", 0), ctypes.get_errno())
print("mount", libc.mount(b"none", b"/tmp", b"tmpfs", 0, None), ctypes.get_errno())
r = subprocess.run(["ip", "route", "add", "unreachable", "10.99.0.0/16"], capture_output=True)
print("route", r.returncode)
"#;

/// What a root process placed in the run's cgroup does for real (standing
/// in for an agent that escaped its sandbox): a pinned BPF map, a mount in
/// the machine's namespace, a sysctl and a route in the session's network
/// namespace. Arguments: the run's cgroup, the session context's pid, the
/// pin's path, the mount point.
const ESCAPED: &str = r#"
import ctypes, os, subprocess, sys
cg, ctx, pin, mnt, watched = sys.argv[1:6]
open(os.path.join(cg, "cgroup.procs"), "w").write(str(os.getpid()))
libc = ctypes.CDLL(None, use_errno=True)
attr = (ctypes.c_uint32 * 8)(2, 4, 4, 1, 0, 0, 0, 0)
fd = libc.syscall(321, 0, attr, 32)
assert fd >= 0, ctypes.get_errno()
path = ctypes.create_string_buffer(pin.encode())
pattr = (ctypes.c_uint64 * 2)(ctypes.addressof(path), fd)
assert libc.syscall(321, 6, pattr, 16) == 0, ctypes.get_errno()
assert libc.mount(b"none", mnt.encode(), b"tmpfs", 0, None) == 0, ctypes.get_errno()
open(os.path.join(watched, "escaped.txt"), "w").write("from the run")
ns = os.open(f"/proc/{ctx}/ns/net", os.O_RDONLY)
assert libc.setns(ns, 0x40000000) == 0, ctypes.get_errno()
open("/proc/sys/net/ipv4/ip_default_ttl", "w").write("77")
subprocess.run(["ip", "route", "add", "unreachable", "10.99.0.0/16"], check=True)
subprocess.run(["nft", "add", "table", "inet", "alloxescaped"], check=True)
print("done")
"#;

/// What is wrong with `e` as the effects of a run whose root helper made
/// each change: each domain CHANGED with the change listed, by the run.
fn escaped_wrong(e: &RunEffects, pin: &str, mnt: &str) -> Option<String> {
    let want: [(EffectsDomain, String); 5] = [
        (EffectsDomain::Bpf, format!("pin {pin}")),
        (EffectsDomain::Mount, format!("machine {mnt}#1")),
        (
            EffectsDomain::Sysctl,
            "session net.ipv4.ip_default_ttl".to_string(),
        ),
        (EffectsDomain::Network, "10.99.0.0/16".to_string()),
        (
            EffectsDomain::Network,
            "session nft table inet alloxescaped".to_string(),
        ),
    ];
    for (d, item) in want {
        let dom = domain(e, d);
        let found = dom
            .changes
            .iter()
            .find(|c| c.item.contains(&item) && c.by.by == By::Run);
        if dom.verdict != EffectsVerdict::Changed || found.is_none() {
            return Some(format!(
                "{} does not list {item} by the run: {dom:?}",
                d.as_str()
            ));
        }
    }
    None
}

/// What is wrong with `h` as the history of [`ATTEMPTS`]: each refused.
fn attempts_wrong(h: &[allox_protocol::HistoryRecord]) -> Option<String> {
    let refused = |call: &str| {
        h.iter().any(|r| {
            r.kind == "syscall"
                && r.refused
                && r.detail
                    .as_deref()
                    .is_some_and(|d| d.starts_with(&format!("{call}(")))
        })
    };
    for call in ["bpf", "finit_module", "mount"] {
        if !refused(call) {
            return Some(format!("no refused {call} in the history"));
        }
    }
    // A call the sandbox refuses before it begins shows the strings it
    // was given, as one refused later does.
    let mount = h.iter().find_map(|r| {
        r.detail
            .as_deref()
            .filter(|d| r.refused && d.starts_with("mount("))
    });
    if let Some(d) = mount.filter(|d| !d.contains(r#""/tmp", "tmpfs""#)) {
        return Some(format!("the refused mount's strings are not shown: {d}"));
    }
    let netlink = h.iter().any(|r| {
        r.kind == "syscall"
            && r.detail
                .as_deref()
                .is_some_and(|d| d.contains("AF_NETLINK"))
    });
    (!netlink).then(|| "no netlink socket in the history".to_string())
}

fn history_of(d: &ProcDaemon, a: &str, s: &str, run: &str) -> Vec<allox_protocol::HistoryRecord> {
    match call(
        d,
        Request::EffectsHistory(allox_protocol::EffectsHistory {
            agent_id: a.into(),
            session_id: s.into(),
            run_id: run.into(),
            cursor: None,
            limit: Some(10_000),
        }),
    ) {
        Ok(Response::EffectsHistory(h)) => h.records,
        other => panic!("effects.history: {other:?}"),
    }
}

#[test]
fn refused_attempts_are_in_the_history_and_a_root_helper_in_the_run_changes_each_domain() {
    let name =
        "refused_attempts_are_in_the_history_and_a_root_helper_in_the_run_changes_each_domain";
    // The filesystem domain's path: a directory of the host only root
    // writes to.
    let watched = tempfile::Builder::new()
        .prefix("allox-effects-watched-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::write(watched.path().join("kept"), b"as it was").unwrap();
    std::fs::write(watched.path().join("grouped"), b"x").unwrap();
    let scope_text = format!(
        r#"{{"domains": ["filesystem", "bpf", "sysctl", "mount", "network", "modules", "processes"], "paths": [{:?}]}}"#,
        watched.path().display().to_string()
    );
    let Some((d, scope, _one)) = start(name, Some(&scope_text), &["--sandbox-network", "isolated"])
    else {
        return;
    };
    make_sessions(&d, &[("a", "s")]);
    // bpffs where the helper pins (made before any run: not a change of
    // the runs below).
    let bpffs = Path::new("/sys/fs/bpf");
    let mounted = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.contains(" /sys/fs/bpf ") && l.contains(" - bpf "));
    if !mounted {
        assert!(std::process::Command::new("mount")
            .args(["-t", "bpf", "bpf", "/sys/fs/bpf"])
            .status()
            .unwrap()
            .success());
    }
    // Inside the sandbox: each attempt refused, each in the history, and
    // nothing changed.
    let e = observed(&d, "a", "s", &["/usr/bin/python3", "-c", ATTEMPTS]);
    let h = history_of(&d, "a", "s", &e.run_id);
    assert_eq!(attempts_wrong(&h), None, "{h:#?}");
    for dom in &e.domains {
        assert!(
            matches!(
                dom.verdict,
                EffectsVerdict::Consistent | EffectsVerdict::NotObserved
            ),
            "{dom:?}"
        );
    }
    // Control: a run that attempts nothing fails the history check.
    let t = observed(&d, "a", "s", &["/bin/true"]);
    assert!(attempts_wrong(&history_of(&d, "a", "s", &t.run_id)).is_some());

    // A root helper placed in the run's cgroup does each for real.
    let mut c = d.daemon.client();
    let p = process_start(
        "a",
        "s",
        &["/bin/sh", "-c", "while [ ! -e go ]; do sleep 0.02; done"],
    );
    let run = started(&mut c, p);
    let base = d.cgroup.join("allox/a");
    let run_cg = base.join("s").join(format!("run-{run}"));
    let ctx = std::fs::read_to_string(base.join(".context-s/cgroup.procs"))
        .unwrap()
        .lines()
        .next()
        .expect("the session's context")
        .to_string();
    let pin = bpffs.join(format!("allox-effects-test-{}", std::process::id()));
    let mnt = scope.path().join("escaped");
    std::fs::create_dir(&mnt).unwrap();
    let out = std::process::Command::new("/usr/bin/python3")
        .args(["-c", ESCAPED])
        .arg(&run_cg)
        .arg(&ctx)
        .arg(&pin)
        .arg(&mnt)
        .arg(watched.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Meanwhile the machine changes a sysctl of its own (this test,
    // outside every sandbox): not the run's, though the run wrote one.
    let host_key = "/proc/sys/vm/dirty_background_ratio";
    let host_was = std::fs::read_to_string(host_key).unwrap();
    let host_now = if host_was.trim() == "11" { "12" } else { "11" };
    std::fs::write(host_key, host_now).unwrap();
    // And gives a file under the scoped path a capability (`setcap
    // cap_net_raw+ep`), the group of another: each only an attribute of
    // the file, which the filesystem domain did not capture (CONSISTENT).
    let kept = watched.path().join("kept");
    rustix::fs::setxattr(
        &kept,
        "security.capability",
        &[
            1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ],
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    rustix::fs::chown(
        watched.path().join("grouped"),
        None,
        Some(rustix::fs::Gid::from_raw(4321)),
    )
    .unwrap();
    std::fs::write(
        d.daemon
            .root
            .join("agents/a/workspace/sessions/s/current/go"),
        b"",
    )
    .unwrap();
    let e = *waited(&d, "a", "s", &run).effects.expect("effects");
    std::fs::write(host_key, host_was.trim()).unwrap();
    let _ = std::fs::remove_file(&pin);
    let _ = std::process::Command::new("umount").arg(&mnt).status();
    if !mounted {
        let _ = std::process::Command::new("umount").arg(bpffs).status();
    }
    let host_change = domain(&e, EffectsDomain::Sysctl)
        .changes
        .iter()
        .find(|c| c.item == "vm.dirty_background_ratio")
        .unwrap_or_else(|| panic!("the machine's sysctl change is not listed: {e:#?}"));
    assert_eq!(host_change.by.by, By::Unknown, "{host_change:?}");
    let (pin, mnt) = (pin.display().to_string(), mnt.display().to_string());
    assert_eq!(escaped_wrong(&e, &pin, &mnt), None, "{e:#?}");
    let fs = domain(&e, EffectsDomain::Filesystem);
    let escaped = format!("{}/escaped.txt", watched.path().display());
    assert!(
        fs.verdict == EffectsVerdict::Changed
            && fs
                .changes
                .iter()
                .any(|c| c.item == escaped && c.by.by == By::Run),
        "{fs:?}"
    );
    for name in ["kept", "grouped"] {
        let item = format!("{}/{name}", watched.path().display());
        let c = fs
            .changes
            .iter()
            .find(|c| c.item == item)
            .unwrap_or_else(|| panic!("{item} is not listed: {fs:#?}"));
        assert_eq!(
            (c.kind, c.by.by),
            (EffectChangeKind::Modified, By::Unknown),
            "{c:?}"
        );
    }
    // Control: the run whose attempts were refused fails the same check.
    let refused = effects_of(&d, "a", "s", &t.run_id);
    assert!(escaped_wrong(&refused, &pin, &mnt).is_some());
}

/// What is wrong with `e` as the effects of a storm that overflowed the
/// history's ring: the loss counted exactly, never consistent, fenced.
fn storm_wrong(e: &RunEffects) -> Option<String> {
    let h = e.history;
    if h.lost == 0 || h.emitted != h.received + h.lost {
        return Some(format!("loss not counted exactly: {h:?}"));
    }
    if e.verdict != EffectsVerdict::Incomplete || !e.fenced {
        return Some(format!("verdict {:?}, fenced {}", e.verdict, e.fenced));
    }
    e.domains
        .iter()
        .find(|d| d.verdict == EffectsVerdict::Consistent)
        .map(|d| format!("{} is CONSISTENT", d.domain.as_str()))
}

const STORM: &str =
    "i=0; while [ $i -lt 5000 ]; do rmdir /nonexistent 2>/dev/null; i=$((i+1)); done";

#[test]
fn a_syscall_storm_on_a_small_ring_is_counted_and_never_consistent() {
    let Some((d, _scope, _one)) = start(
        "a_syscall_storm_on_a_small_ring_is_counted_and_never_consistent",
        None,
        &["--system-effects-ring-bytes", "4K"],
    ) else {
        return;
    };
    make_sessions(&d, &[("a", "s")]);
    let e = observed(&d, "a", "s", &["/bin/sh", "-c", STORM]);
    assert_eq!(storm_wrong(&e), None, "{e:#?}");
    drop(d);
    // Control: the same storm on the default ring loses nothing.
    drop(_one);
    let Some((d, _scope2, _one2)) = start(
        "a_syscall_storm_on_a_small_ring_is_counted_and_never_consistent",
        None,
        &[],
    ) else {
        return;
    };
    make_sessions(&d, &[("a", "s")]);
    let full = observed(&d, "a", "s", &["/bin/sh", "-c", STORM]);
    assert_eq!(full.history.lost, 0, "{:?}", full.history);
    assert!(storm_wrong(&full).is_some());
}

#[test]
fn a_freeze_that_cannot_finish_fences_the_session() {
    // A freeze may take no time at all: one of a busy process never does.
    let Some((d, _scope, _one)) = start(
        "a_freeze_that_cannot_finish_fences_the_session",
        None,
        &["--freeze-timeout-ms", "0"],
    ) else {
        return;
    };
    make_sessions(&d, &[("a", "s")]);
    let e = observed(
        &d,
        "a",
        "s",
        &[
            "/bin/sh",
            "-c",
            // Twenty busy processes on two CPUs: most are waiting for a
            // CPU when the freeze is asked, and none stops before it runs.
            "i=0; while [ $i -lt 20 ]; do setsid sh -c 'while :; do :; done' < /dev/null > /dev/null 2>&1 & i=$((i+1)); done; sleep 0.2",
        ],
    );
    assert!(e.fenced, "{e:#?}");
    assert_eq!(e.verdict, EffectsVerdict::Incomplete);
    let why = e.fence_reason.clone().unwrap_or_default();
    let notes: Vec<_> = e.domains.iter().filter_map(|d| d.note.clone()).collect();
    assert!(
        notes.iter().any(|n| n.contains("did not freeze")),
        "{why}: {notes:?}"
    );
    // Nothing of the run is left running.
    let cg = d.cgroup.join("allox/a/s").join(format!("run-{}", e.run_id));
    let left = std::fs::read_to_string(cg.join("cgroup.procs")).unwrap_or_default();
    assert!(left.trim().is_empty(), "left in the run's cgroup: {left}");
    // Deleting the fenced session lifts its fence: a session made again
    // under its name is another, and runs.
    call(
        &d,
        Request::SessionDelete(allox_protocol::SessionDelete {
            agent_id: "a".into(),
            session_id: "s".into(),
            force: true,
        }),
    )
    .expect("a fenced session can be deleted");
    make_sessions(&d, &[("a", "s")]);
    match call(
        &d,
        Request::EffectsStatus(allox_protocol::EffectsStatusRequest::default()),
    ) {
        Ok(Response::EffectsStatus(st)) => assert!(st.fences.is_empty(), "{st:?}"),
        other => panic!("{other:?}"),
    }
    // A change to the new session is taken (no run here: with a freeze
    // bound of 0 the end of any run whose init is still exiting is a fault).
    let made = call(
        &d,
        Request::CheckpointCreate(allox_protocol::CheckpointCreate {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: "after".into(),
            pinned: false,
            label: None,
        }),
    );
    assert!(made.is_ok(), "{made:?}");
}

#[test]
fn the_agent_cannot_signal_the_observer_and_the_attempt_is_in_the_history() {
    let Some((d, _scope, _one)) = start(
        "the_agent_cannot_signal_the_observer_and_the_attempt_is_in_the_history",
        None,
        &[],
    ) else {
        return;
    };
    make_sessions(&d, &[("a", "s")]);
    let mut c = d.daemon.client();
    let p = process_start(
        "a",
        "s",
        &[
            "/bin/sh",
            "-c",
            "while [ ! -s opid ]; do sleep 0.02; done; kill -9 $(cat opid); echo $?",
        ],
    );
    let run = started(&mut c, p);
    let obs = observers_of(d.daemon.child.id());
    assert_eq!(obs.len(), 1, "{obs:?}");
    std::fs::write(
        d.daemon
            .root
            .join("agents/a/workspace/sessions/s/current/opid"),
        obs[0].to_string(),
    )
    .unwrap();
    let e = *waited(&d, "a", "s", &run).effects.expect("effects");
    // The observer lived to close the evidence.
    assert!(!e.fenced, "{e:#?}");
    let h = history_of(&d, "a", "s", &run);
    let tried = |h: &[allox_protocol::HistoryRecord]| {
        h.iter().any(|r| {
            r.kind == "syscall"
                && r.refused
                && r.detail
                    .as_deref()
                    .is_some_and(|x| x.starts_with(&format!("kill({}, 9)", obs[0])))
        })
    };
    assert!(tried(&h), "{h:#?}");
    // Control: a run that signals nobody has no such record.
    let t = observed(&d, "a", "s", &["/bin/true"]);
    assert!(!tried(&history_of(&d, "a", "s", &t.run_id)));
}

/// Starts a run on a daemon armed to die at `point`, restarts the daemon,
/// and returns the fence it found.
/// A daemon with the plugin, armed to die at `point`, with session
/// `a/s`; the arguments to restart it with.
fn armed(name: &str, point: &str) -> Option<(ProcDaemon, Vec<String>)> {
    if !require(name) {
        return None;
    }
    let mut args = plugin_args();
    if !kernel_runs_bpf_lsm() {
        args.push("--system-effects-without-lsm".into());
    }
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = ProcDaemon::start_with_env(&name.replace('.', "-"), &[("ALLOX_FAILPOINTS", point)], &a);
    make_sessions(&d, &[("a", "s")]);
    Some((d, args))
}

/// Sends `p` to a daemon armed to die on its way, waits for it to die,
/// restarts it, and returns the fence on `a/s` it finds.
fn dies_at(
    d: &mut ProcDaemon,
    args: &[String],
    point: &str,
    p: allox_protocol::ProcessStart,
) -> allox_protocol::EffectsFence {
    // The daemon dies at the point: the call fails or answers started.
    let _ = d.daemon.client().call(Request::ProcessStart(p));
    let st = d.daemon.child.wait().expect("wait for the daemon");
    assert!(!st.success(), "{point}: the daemon did not die ({st})");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    d.restart(&args);
    let status = match call(
        d,
        Request::EffectsStatus(allox_protocol::EffectsStatusRequest::default()),
    ) {
        Ok(Response::EffectsStatus(s)) => s,
        other => panic!("{point}: status {other:?}"),
    };
    let f = status
        .fences
        .iter()
        .find(|f| f.agent_id == "a" && f.session_id == "s")
        .unwrap_or_else(|| panic!("{point}: a/s is not fenced: {status:?}"))
        .clone();
    assert!(f.reason.contains("stopped in the middle"), "{point}: {f:?}");
    f
}

fn killed_at(point: &str) {
    let name = format!("the_supervisor_killed_at_{point}");
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((mut d, args)) = armed(&name, point) else {
        return;
    };
    let mut p = process_start("a", "s", &["/bin/sh", "-c", "echo x > f; sleep 30"]);
    p.wait = point.starts_with("run_end");
    if p.wait {
        p.argv = vec!["/bin/sh".into(), "-c".into(), "echo x > f".into()];
    }
    let f = dies_at(&mut d, &args, point, p);
    let refused = call(
        &d,
        Request::ProcessStart(process_start("a", "s", &["/bin/true"])),
    )
    .expect_err("fenced");
    assert_eq!(
        refused.code,
        allox_protocol::ErrorCode::Unavailable,
        "{point}"
    );
    // The evidence says at best INCOMPLETE, and names the same root.
    let e = effects_of(&d, "a", "s", &f.run_id);
    assert_eq!(e.verdict, EffectsVerdict::Incomplete, "{point}");
    assert_eq!(e.evidence_root, f.evidence_root, "{point}");
    // Nothing of the run is left, frozen or running.
    let cg = d.cgroup.join("allox/a/s").join(format!("run-{}", f.run_id));
    let left = std::fs::read_to_string(cg.join("cgroup.procs")).unwrap_or_default();
    assert!(left.trim().is_empty(), "{point}: left {left}");
}

#[test]
fn the_supervisor_killed_at_each_step_of_the_protocol_leaves_the_session_fenced() {
    for point in [
        "run_start.after_plugins",
        "run_start.after_spawn",
        "run_start.after_stdio",
        "run_end.after_freeze",
        "run_end.after_kill",
    ] {
        killed_at(point);
    }
}

/// What a machine that stops right after an observed run was answered
/// may leave: the run's `pending` marker (its removal is not synced). The
/// next start finds the run's `closed` line in the audit log: the run
/// keeps the effects it was answered with and the session stays open.
/// A marker with no such line (a run cut off in the middle) still fences.
#[test]
fn a_marker_left_by_an_answered_run_does_not_fence_but_one_left_in_the_middle_does() {
    let name = "system_effects::a_marker_left_by_an_answered_run_does_not_fence";
    let Some((mut d, _dir, _g)) = start(name, None, &[]) else {
        return;
    };
    make_sessions(&d, &[("a", "s"), ("a", "t")]);
    let answered = observed(&d, "a", "s", &["/bin/true"]);
    assert_eq!(
        answered.verdict,
        EffectsVerdict::Consistent,
        "{answered:#?}"
    );
    let (set, _) = chain_of(&d, &answered);
    // The same marker for another session's run that never closed.
    let cut = set
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("t/cut-off-run");
    std::fs::create_dir_all(&cut).unwrap();
    let marker = br#"{"cgroup":null,"observer":null,"started_ms":1}"#;
    for dir in [&set, &cut] {
        std::fs::write(dir.join("pending"), marker).unwrap();
    }
    let args = plugin_args();
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    if !kernel_runs_bpf_lsm() {
        args.push("--system-effects-without-lsm");
    }
    d.restart(&args);
    let status = match call(
        &d,
        Request::EffectsStatus(allox_protocol::EffectsStatusRequest::default()),
    ) {
        Ok(Response::EffectsStatus(s)) => s,
        other => panic!("status {other:?}"),
    };
    let fenced: Vec<_> = status
        .fences
        .iter()
        .map(|f| {
            (
                f.agent_id.as_str(),
                f.session_id.as_str(),
                f.run_id.as_str(),
            )
        })
        .collect();
    assert_eq!(fenced, [("a", "t", "cut-off-run")], "{status:#?}");
    assert!(
        !set.join("pending").exists(),
        "the answered run's marker is left"
    );
    let kept = effects_of(&d, "a", "s", &answered.run_id);
    assert_eq!(kept.verdict, answered.verdict);
    assert_eq!(kept.evidence_root, answered.evidence_root);
    assert!(!kept.fenced);
    // The session takes runs.
    let next = observed(&d, "a", "s", &["/bin/true"]);
    assert_eq!(next.verdict, EffectsVerdict::Consistent, "{next:#?}");
}

/// What is wrong with `h` as the history of one run that follows
/// another, whose history was `before`: a record of the earlier run's
/// processes, counters that are not this run's own, or no `exec` of
/// `/bin/true`.
fn own_history_wrong(
    h: &[allox_protocol::HistoryRecord],
    counters: &allox_protocol::HistoryCounters,
    before: &[allox_protocol::HistoryRecord],
) -> Option<String> {
    let earlier: std::collections::HashSet<u32> = before.iter().map(|r| r.pid).collect();
    if let Some(r) = h.iter().find(|r| earlier.contains(&r.pid)) {
        return Some(format!("a record of the earlier run's process: {r:?}"));
    }
    if counters.received != h.len() as u64 || counters.lost != 0 {
        return Some(format!(
            "counters {counters:?} are not those of the {} records",
            h.len()
        ));
    }
    if !h
        .iter()
        .any(|r| r.kind == "exec" && r.detail.as_deref().unwrap_or("").contains("/bin/true"))
    {
        return Some("no exec of /bin/true".into());
    }
    None
}

#[test]
fn one_observer_serves_runs_one_after_the_other_and_a_dead_one_is_replaced() {
    let name = "one_observer_serves_runs_one_after_the_other_and_a_dead_one_is_replaced";
    let Some((d, _scope, _one)) = start(name, Some(SCOPE_MACHINE), &[]) else {
        return;
    };
    make_sessions(&d, &[("a", "s"), ("a", "t")]);
    let pid = d.daemon.child.id();
    // Loaded before the first run is asked for.
    let waiting = observers_of(pid);
    assert_eq!(waiting.len(), 1, "one observer waits: {waiting:?}");
    let first = observed(&d, "a", "s", &["/bin/sh", "-c", "echo x > one.txt"]);
    let second = observed(&d, "a", "t", &["/bin/true"]);
    assert_eq!(
        observers_of(pid),
        waiting,
        "the observer that waited served both runs"
    );
    assert_eq!(first.verdict, EffectsVerdict::Changed, "{first:#?}");
    assert_eq!(second.verdict, EffectsVerdict::Consistent, "{second:#?}");
    let h1 = history_of(&d, "a", "s", &first.run_id);
    let h2 = history_of(&d, "a", "t", &second.run_id);
    assert_eq!(
        own_history_wrong(&h2, &second.history, &h1),
        None,
        "{h2:#?}"
    );
    // Control: both runs' records, or counters kept from the first run,
    // fail the check.
    let both: Vec<_> = h1.iter().chain(&h2).cloned().collect();
    assert!(own_history_wrong(&both, &second.history, &h1).is_some());
    let mut summed = second.history;
    summed.received += first.history.received;
    assert!(own_history_wrong(&h2, &summed, &[]).is_some());
    // The observer dies while it waits: the next run gets a new one and
    // is observed as any other, its session not fenced.
    let killed = std::process::Command::new("kill")
        .args(["-9", &waiting[0].to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let third = observed(&d, "a", "t", &["/bin/true"]);
    assert!(!third.fenced, "{third:#?}");
    assert_eq!(third.verdict, EffectsVerdict::Consistent, "{third:#?}");
    let now = observers_of(pid);
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(now, waiting, "a new observer served the third run");
}

/// What is wrong with `roots` as the process tree of a run of
/// `sh -c '/bin/true; exit 3'`: the shell (its own pid namespace's number,
/// not the host's) with `/bin/true` below it, each ended.
fn tree_wrong(roots: &[allox_protocol::ProcessNode], run: &str) -> Option<String> {
    fn all(n: &allox_protocol::ProcessNode, out: &mut Vec<allox_protocol::ProcessNode>) {
        out.push(n.clone());
        for c in &n.children {
            all(c, out);
        }
    }
    let mut nodes = Vec::new();
    for r in roots {
        all(r, &mut nodes);
    }
    let Some(sh) = nodes
        .iter()
        .find(|n| n.execs.iter().any(|e| e == "/bin/sh"))
    else {
        return Some(format!("no /bin/sh among {} processes", nodes.len()));
    };
    if sh.run_id != run {
        return Some(format!("the shell is run {}'s", sh.run_id));
    }
    if sh.exit_code != Some(3) || sh.ended_ms.is_none() {
        return Some(format!("the shell did not end with 3: {sh:?}"));
    }
    if sh.pid == 0 || sh.pid == sh.host_pid {
        return Some(format!("the shell's pid is not its namespace's: {sh:?}"));
    }
    let mut below = Vec::new();
    for c in &sh.children {
        all(c, &mut below);
    }
    if !below
        .iter()
        .any(|n| n.execs.iter().any(|e| e == "/bin/true") && n.exit_code == Some(0))
    {
        return Some(format!("no /bin/true below the shell: {sh:#?}"));
    }
    None
}

#[test]
fn the_observer_serves_process_events_and_the_tree_of_observed_runs() {
    let name = "the_observer_serves_process_events_and_the_tree_of_observed_runs";
    let Some((d, _scope, _one)) = start(name, None, &[]) else {
        return;
    };
    make_sessions(&d, &[("a", "s"), ("a", "t")]);
    let e = observed(&d, "a", "s", &["/bin/sh", "-c", "/bin/true; exit 3"]);
    let other = observed(&d, "a", "t", &["/bin/true"]);
    let tree = |s: &str, run: Option<&str>| match call(
        &d,
        Request::ProcessTree(allox_protocol::ProcessTreeRequest {
            agent_id: "a".into(),
            session_id: s.into(),
            run_id: run.map(str::to_string),
        }),
    ) {
        Ok(Response::ProcessTree(t)) => t.roots,
        other => panic!("process.tree: {other:?}"),
    };
    let roots = tree("s", Some(&e.run_id));
    assert_eq!(tree_wrong(&roots, &e.run_id), None, "{roots:#?}");
    assert_eq!(tree_wrong(&tree("s", None), &e.run_id), None);
    // Control: the other session's tree, and this one's under another
    // run's id, are not that tree.
    assert!(tree_wrong(&tree("t", None), &e.run_id).is_some());
    assert!(tree_wrong(&tree("s", Some(&other.run_id)), &e.run_id).is_some());
    match call(
        &d,
        Request::ProcessEvents(allox_protocol::ProcessEvents {
            agent_id: Some("a".into()),
            session_id: Some("t".into()),
            ..Default::default()
        }),
    ) {
        Ok(Response::ProcessEvents(p)) => {
            assert!(
                p.events.iter().all(|ev| ev.run_id == other.run_id),
                "{p:#?}"
            );
            assert!(
                p.events
                    .iter()
                    .any(|ev| ev.kind == allox_protocol::ProcessEventKind::Exec
                        && ev.filename.as_deref() == Some("/bin/true")),
                "{p:#?}"
            );
            assert_eq!(p.lost, 0);
        }
        other => panic!("process.events: {other:?}"),
    }
}

/// `effects.verify` of run `a/s/run`, with `root` kept from the answer.
fn verified(
    d: &ProcDaemon,
    a: &str,
    s: &str,
    run: &str,
    root: Option<&str>,
) -> allox_protocol::EffectsVerified {
    match call(
        d,
        Request::EffectsVerify(allox_protocol::EffectsVerify {
            agent_id: a.into(),
            session_id: s.into(),
            run_id: run.into(),
            evidence_root: root.map(str::to_string),
        }),
    ) {
        Ok(Response::EffectsVerified(v)) => v,
        other => panic!("effects.verify: {other:?}"),
    }
}

/// What is wrong with a verification that should name `file` as the
/// first bad one (`None`: nothing should be wrong).
fn verification_wrong(v: &allox_protocol::EffectsVerified, file: Option<&str>) -> Option<String> {
    let report: allox_protocol::effects_report::Report = match serde_json::from_str(&v.report) {
        Ok(r) => r,
        Err(e) => return Some(format!("the report does not parse: {e}: {}", v.report)),
    };
    if report.ok != v.ok {
        return Some(format!("ok {} but the report says {}", v.ok, report.ok));
    }
    match (file, &report.first_bad) {
        (None, None) if v.ok => None,
        (None, b) => Some(format!("not sound: {b:?}")),
        (Some(_), None) => Some("a tampered set verified".into()),
        (Some(f), Some(b)) if b.file == f => None,
        (Some(f), Some(b)) => Some(format!("names {b:?}, not {f}")),
    }
}

/// The verifier checks every observed run before it is answered, again
/// on request in the daemon, and over an export on the host: the same
/// report bytes each time; a byte flipped in each kind of file of the set,
/// a record dropped or cut, and a chain made again are each named.
#[test]
fn the_verifier_names_the_first_bad_file_and_an_export_verifies_the_same_on_the_host() {
    let Some((d, dir, _g)) = start(
        "the_verifier_names_the_first_bad_file_and_an_export_verifies_the_same_on_the_host",
        Some(SCOPE_MACHINE),
        &[],
    ) else {
        return;
    };
    make_sessions(&d, &[("a", "s")]);
    let e = observed(&d, "a", "s", &["/bin/sh", "-c", "echo hi > effect.txt"]);
    assert!(!e.fenced, "{:?}", e.fence_reason);
    let root = e.evidence_root.clone();
    let run = e.run_id.clone();
    let v = verified(&d, "a", "s", &run, Some(&root));
    if let Some(w) = verification_wrong(&v, None) {
        panic!("{w}");
    }
    let report: allox_protocol::effects_report::Report = serde_json::from_str(&v.report).unwrap();
    assert_eq!(report.root.as_deref(), Some(root.as_str()));
    assert_eq!(report.verdict, Some(e.verdict));
    assert_eq!(report.run_id.as_deref(), Some(run.as_str()));

    // The export, verified on the host by the verifier and through
    // alloxctl: the daemon's bytes.
    let tar = dir.path().join("set.tar");
    let (code, _, err) = allox_integration::alloxctl(
        &d.daemon.socket,
        &[
            "effects",
            "export",
            "a",
            "s",
            &run,
            "-o",
            tar.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{err}");
    let out = std::process::Command::new(allox_integration::workspace_bin(
        "allox-system-effects-verify",
    ))
    .args(["--root", &root, "--export"])
    .arg(&tar)
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!("{}\n", v.report)
    );
    let (code, out, err) = allox_integration::alloxctl(
        &d.daemon.socket,
        &[
            "--json",
            "effects",
            "verify",
            "--export",
            tar.to_str().unwrap(),
            "--root",
            &root,
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(String::from_utf8(out).unwrap(), format!("{}\n", v.report));
    let (code, out, err) = allox_integration::alloxctl(
        &d.daemon.socket,
        &[
            "--json", "effects", "verify", "a", "s", &run, "--root", &root,
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(String::from_utf8(out).unwrap(), format!("{}\n", v.report));

    // Tampering in the store, each undone after it is checked.
    let set = d.daemon.root.join("state/effects/a/s").join(&run);
    // Each file, a byte in its middle; each body (a line of
    // bodies.jsonl), a byte in the middle of its line.
    let mut files: Vec<(String, usize)> = [
        "chain.jsonl",
        "history.json",
        "processes.json",
        "effects.json",
    ]
    .iter()
    .map(|f| {
        (
            f.to_string(),
            std::fs::metadata(set.join(f)).unwrap().len() as usize / 2,
        )
    })
    .collect();
    let bodies = std::fs::read_to_string(set.join("bodies.jsonl")).unwrap();
    let mut at = 0;
    for line in bodies.lines() {
        files.push(("bodies.jsonl".into(), at + line.len() / 2));
        at += line.len() + 1;
    }
    assert_eq!(files.len(), 4 + 6, "six bodies: {bodies}");
    for (f, i) in &files {
        let (f, i) = (f.as_str(), *i);
        let p = set.join(f);
        let keep = std::fs::read(&p).unwrap();
        let mut b = keep.clone();
        b[i] ^= 0x01;
        std::fs::write(&p, &b).unwrap();
        let v = verified(&d, "a", "s", &run, Some(&root));
        std::fs::write(&p, &keep).unwrap();
        if let Some(w) = verification_wrong(&v, Some(f)) {
            let around = String::from_utf8_lossy(&b[i.saturating_sub(40)..(i + 40).min(b.len())]);
            panic!("a byte flipped in {f} ({around}): {w}");
        }
        // The control: undone, it verifies again.
        if let Some(w) = verification_wrong(&verified(&d, "a", "s", &run, Some(&root)), None) {
            panic!("after {f} was restored: {w}");
        }
    }
    let chain = set.join("chain.jsonl");
    let keep = std::fs::read_to_string(&chain).unwrap();
    let lines: Vec<&str> = keep.lines().collect();
    for (what, text) in [
        (
            "dropped",
            format!("{}\n{}\n", lines[0], lines[2..].join("\n")),
        ),
        ("reordered", {
            let mut l = lines.clone();
            l.swap(1, 2);
            l.join("\n") + "\n"
        }),
        ("cut short", keep[..keep.len() - 20].to_string()),
    ] {
        std::fs::write(&chain, &text).unwrap();
        let v = verified(&d, "a", "s", &run, Some(&root));
        std::fs::write(&chain, &keep).unwrap();
        if let Some(w) = verification_wrong(&v, Some("chain.jsonl")) {
            panic!("a record {what}: {w}");
        }
        assert!(
            v.first_bad.as_deref().unwrap_or("").starts_with("record "),
            "{what}: {v:?}"
        );
    }
    // A root that is not the one kept: named.
    let other = "0".repeat(64);
    let v = verified(&d, "a", "s", &run, Some(&other));
    assert!(
        !v.ok && v.first_bad.as_deref().unwrap_or("").contains("kept root"),
        "{v:?}"
    );
    // Another run's set (of another session) put in this run's place: not
    // this run's evidence, whether the client keeps a root (the daemon
    // checks against the one it audited) or gives the other's; and its
    // answer is not served as this run's. (Each said "sound", and
    // `effects get` gave the other run's answer under this run's id.)
    make_sessions(&d, &[("a", "t")]);
    let donor = observed(&d, "a", "t", &["/bin/true"]);
    let donor_set = d.daemon.root.join("state/effects/a/t").join(&donor.run_id);
    let kept: Vec<(std::path::PathBuf, Vec<u8>)> = std::fs::read_dir(&set)
        .unwrap()
        .flatten()
        .map(|e| (e.path(), std::fs::read(e.path()).unwrap()))
        .collect();
    for e in std::fs::read_dir(&donor_set).unwrap().flatten() {
        std::fs::copy(e.path(), set.join(e.file_name())).unwrap();
    }
    let without = verified(&d, "a", "s", &run, None);
    let with_theirs = verified(&d, "a", "s", &run, Some(&donor.evidence_root));
    let got = call(
        &d,
        Request::EffectsGet(allox_protocol::EffectsGet {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: run.clone(),
        }),
    );
    let exported = call(
        &d,
        Request::EffectsExport(allox_protocol::EffectsExport {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: run.clone(),
            offset: None,
        }),
    );
    for (p, b) in &kept {
        std::fs::write(p, b).unwrap();
    }
    match exported {
        Err(b) => assert_eq!(b.code, allox_protocol::ErrorCode::Conflict, "{b:?}"),
        other => panic!("the export of a replaced set: {other:?}"),
    }
    // An export of the other run's set named as this run's (made by hand):
    // the verifier on the host says whose it is.
    let renamed = dir.path().join("renamed.tar");
    std::fs::write(
        &renamed,
        allox_effects::export::tar_set(&donor_set, &format!("effects-a-s-{run}")).unwrap(),
    )
    .unwrap();
    let out = std::process::Command::new(allox_integration::workspace_bin(
        "allox-system-effects-verify",
    ))
    .arg("--export")
    .arg(&renamed)
    .output()
    .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.code() == Some(1) && said.contains("another run's set"),
        "{out:?}"
    );
    assert!(
        !without.ok
            && without
                .first_bad
                .as_deref()
                .unwrap_or("")
                .contains("kept root"),
        "{without:?}"
    );
    assert!(
        !with_theirs.ok
            && with_theirs
                .first_bad
                .as_deref()
                .unwrap_or("")
                .contains(&format!("the set is run {} of a/t", donor.run_id)),
        "{with_theirs:?}"
    );
    match got {
        Err(b) => assert!(
            b.code == allox_protocol::ErrorCode::Conflict
                && b.message.contains("another run's set"),
            "{b:?}"
        ),
        other => panic!("effects.get of a replaced set: {other:?}"),
    }
    // Control: restored, it is this run's again, with the audited root.
    if let Some(w) = verification_wrong(&verified(&d, "a", "s", &run, None), None) {
        panic!("restored: {w}");
    }
    // The export of a run that is not observed: not found.
    match call(
        &d,
        Request::EffectsExport(allox_protocol::EffectsExport {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: "nosuchrun".into(),
            offset: None,
        }),
    ) {
        Err(b) => assert_eq!(b.code, allox_protocol::ErrorCode::NotFound, "{b:?}"),
        other => panic!("export of no run: {other:?}"),
    }
    // Nor its effects, named as a run, not by the store's path on the host.
    match call(
        &d,
        Request::EffectsGet(allox_protocol::EffectsGet {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: "nosuchrun".into(),
        }),
    ) {
        Err(b) => assert!(
            b.code == allox_protocol::ErrorCode::NotFound
                && b.message.contains("run a/s/nosuchrun")
                && !b.message.contains(d.daemon.root.to_str().unwrap()),
            "{b:?}"
        ),
        other => panic!("effects.get of no run: {other:?}"),
    }
}

/// A verifier that gives no report fences the session: the evidence is
/// not taken on the observer's word alone. (The control is every other
/// test here: the real verifier leaves a sound run unfenced.)
#[test]
fn a_verifier_that_fails_fences_the_session() {
    let false_sha = {
        let out = std::process::Command::new("sha256sum")
            .arg("/bin/false")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    let Some((d, _dir, _g)) = start(
        "a_verifier_that_fails_fences_the_session",
        None,
        &[
            "--system-effects-verifier",
            "/bin/false",
            "--system-effects-verifier-sha256",
            &false_sha,
        ],
    ) else {
        return;
    };
    make_sessions(&d, &[("a", "s")]);
    let e = observed(&d, "a", "s", &["/bin/true"]);
    assert!(e.fenced, "{e:?}");
    assert_eq!(e.verdict, EffectsVerdict::Incomplete);
    let why = e.fence_reason.clone().unwrap_or_default();
    assert!(why.contains("verifier"), "{why}");
    match call(
        &d,
        Request::ProcessStart(process_start("a", "s", &["/bin/true"])),
    ) {
        Err(b) => {
            assert_eq!(b.code, allox_protocol::ErrorCode::Unavailable, "{b:?}");
            assert!(b.message.contains(&e.evidence_root), "{b:?}");
        }
        other => panic!("a fenced session ran: {other:?}"),
    }
}

// Protocol v3: recovery.

fn recovery(
    checkpoint: Option<&str>,
    scrub_runtime: bool,
    require_consistent: bool,
) -> allox_protocol::ProcessRecovery {
    allox_protocol::ProcessRecovery {
        checkpoint_id: checkpoint.map(str::to_string),
        scrub_runtime,
        require_consistent,
    }
}

fn session_file(d: &ProcDaemon, a: &str, s: &str, name: &str) -> PathBuf {
    d.daemon
        .root
        .join(format!("agents/{a}/workspace/sessions/{s}/current"))
        .join(name)
}

/// Runs `argv` in `a/s` under protocol v3 with `rec`; its effects.
fn recovered(
    d: &ProcDaemon,
    a: &str,
    s: &str,
    argv: &[&str],
    rec: allox_protocol::ProcessRecovery,
) -> RunEffects {
    let mut p = process_start(a, s, argv);
    p.recovery = Some(Box::new(rec));
    match call(d, Request::ProcessStart(p)) {
        Ok(Response::Exited(r)) => *r.effects.expect("an observed run has effects"),
        other => panic!("process.start with recovery: {other:?}"),
    }
}

/// What is wrong with `e` as the seed's v3 example: A→B and B→C CHANGED
/// (effect.txt made by the run, removed by the recovery), A→C CONSISTENT,
/// not fenced.
fn seed_v3_wrong(e: &RunEffects) -> Option<String> {
    let Some(r) = &e.recovery else {
        return Some("no recovery".into());
    };
    let removed = r
        .b_to_c
        .iter()
        .find(|d| d.domain == EffectsDomain::Workspace)
        .is_some_and(|d| {
            d.changes.iter().any(|c| {
                c.item == "effect.txt"
                    && c.kind == EffectChangeKind::Removed
                    && c.by.by == By::Recovery
            })
        });
    if e.protocol != 3
        || e.verdict != EffectsVerdict::Changed
        || r.b_to_c_verdict != EffectsVerdict::Changed
        || r.a_to_c_verdict != EffectsVerdict::Consistent
        || !r.consistent
        || !removed
        || e.fenced
    {
        return Some(format!("{e:#?}"));
    }
    None
}

#[test]
fn v3_restores_the_workspace_and_a_shared_residue_fences_unless_allowed() {
    let Some((d, _scope, _one)) = start(
        "v3_restores_the_workspace_and_a_shared_residue_fences_unless_allowed",
        Some(SCOPE_MACHINE),
        &[],
    ) else {
        return;
    };
    make_sessions(&d, &[("agent-a", "session-1")]);
    // The seed's example, verbatim: {"scrub_runtime": true, "require_consistent": true}.
    let e = recovered(
        &d,
        "agent-a",
        "session-1",
        &["/bin/sh", "-c", "printf changed > effect.txt"],
        recovery(None, true, true),
    );
    assert_eq!(seed_v3_wrong(&e), None);
    assert!(!session_file(&d, "agent-a", "session-1", "effect.txt").exists());
    let r = e.recovery.as_ref().unwrap();
    assert!(
        r.baseline_made && r.restore.steps == ["snapshot", "exchange"],
        "{r:?}"
    );
    assert_eq!(
        r.restore.tool_sha256,
        pinned("allox-system-effects-recover").1
    );
    // The baseline is a pinned checkpoint of the session.
    match call(
        &d,
        Request::CheckpointList(allox_protocol::SessionRef {
            agent_id: "agent-a".into(),
            session_id: "session-1".into(),
        }),
    ) {
        Ok(Response::Checkpoints(l)) => assert!(
            l.checkpoints
                .iter()
                .any(|c| c.checkpoint_id == r.checkpoint_id && c.pinned),
            "{l:?}"
        ),
        other => panic!("checkpoint.list: {other:?}"),
    }
    // The chain has v3's records, and the verifier recomputes B→C and A→C.
    let (dir, kinds) = chain_of(&d, &e);
    assert_eq!(
        kinds,
        [
            "begin",
            "capture_a",
            "history",
            "capture_b",
            "verdict",
            "recover",
            "capture_c",
            "recovery_verdict",
            "close"
        ]
    );
    let report =
        allox_effects::verify::verify_set(&allox_effects::chain::Dir(&dir), Some(&e.evidence_root));
    assert!(report.ok, "{report:?}");
    assert!(
        report.recovery.as_ref().is_some_and(|x| x.consistent),
        "{report:?}"
    );
    // Control: the same command without recovery leaves the file, and
    // its effects fail the check.
    let plain = observed(
        &d,
        "agent-a",
        "session-1",
        &["/bin/sh", "-c", "printf changed > effect.txt"],
    );
    assert!(seed_v3_wrong(&plain).is_some());
    assert!(session_file(&d, "agent-a", "session-1", "effect.txt").exists());

    // A residue in shared/: listed with its path, the session fenced.
    let write_shared = [
        "/bin/sh",
        "-c",
        "echo left > $ALLOX_AGENT_SHARED/left; echo x > y",
    ];
    let f = recovered(
        &d,
        "agent-a",
        "session-1",
        &write_shared,
        recovery(None, false, true),
    );
    let fr = f.recovery.as_ref().expect("recovery");
    let residue = |r: &allox_protocol::RecoveryEffects| {
        r.a_to_c
            .iter()
            .find(|x| x.domain == EffectsDomain::Shared)
            .is_some_and(|x| {
                x.changes
                    .iter()
                    .any(|c| c.item == "left" && c.by.by == By::Run)
            })
    };
    assert!(residue(fr) && !fr.consistent, "{f:#?}");
    assert!(
        f.fenced
            && f.fence_reason
                .as_deref()
                .is_some_and(|w| w.contains("left")),
        "{f:#?}"
    );
    assert!(!session_file(&d, "agent-a", "session-1", "y").exists());
    let refused = call(
        &d,
        Request::ProcessStart(process_start("agent-a", "session-1", &["/bin/true"])),
    )
    .expect_err("fenced");
    assert_eq!(refused.code, allox_protocol::ErrorCode::Unavailable);
    // Control: the seed example's recovery lists no residue.
    assert!(!residue(r));
    match call(
        &d,
        Request::EffectsUnfence(allox_protocol::EffectsUnfence {
            agent_id: "agent-a".into(),
            session_id: "session-1".into(),
            run_id: f.run_id.clone(),
            evidence_root: f.evidence_root.clone(),
        }),
    ) {
        Ok(Response::EffectsUnfenced(_)) => {}
        other => panic!("unfence: {other:?}"),
    }
    // Without require_consistent: listed, not fenced.
    std::fs::remove_file(d.daemon.root.join("agents/agent-a/workspace/shared/left")).unwrap();
    let g = recovered(
        &d,
        "agent-a",
        "session-1",
        &write_shared,
        recovery(None, false, false),
    );
    let gr = g.recovery.as_ref().expect("recovery");
    assert!(residue(gr) && !gr.consistent && !g.fenced, "{g:#?}");
    observed(&d, "agent-a", "session-1", &["/bin/true"]);
}

#[test]
fn v3_refuses_a_checkpoint_that_is_missing_incomplete_or_not_current_and_runs_nothing() {
    let Some((d, _scope, _one)) = start(
        "v3_refuses_a_checkpoint_that_is_missing_incomplete_or_not_current_and_runs_nothing",
        None,
        &[],
    ) else {
        return;
    };
    make_sessions(&d, &[("a", "s")]);
    let cp = |id: &str| match call(
        &d,
        Request::CheckpointCreate(allox_protocol::CheckpointCreate {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: id.into(),
            pinned: false,
            label: None,
        }),
    ) {
        Ok(Response::Checkpoint(_)) => {}
        other => panic!("checkpoint.create: {other:?}"),
    };
    std::fs::write(session_file(&d, "a", "s", "kept"), b"A").unwrap();
    cp("before-run");
    cp("made-writable");
    let tree = d
        .daemon
        .root
        .join("agents/a/workspace/sessions/s/checkpoints/made-writable");
    let st = std::process::Command::new("btrfs")
        .args(["property", "set", "-f"])
        .arg(&tree)
        .args(["ro", "false"])
        .status()
        .expect("btrfs property set");
    assert!(st.success());
    let runs = |d: &ProcDaemon| match call(
        d,
        Request::EffectsList(allox_protocol::EffectsList {
            agent_id: "a".into(),
            session_id: "s".into(),
        }),
    ) {
        Ok(Response::EffectsListing(l)) => l.runs.len(),
        other => panic!("effects.list: {other:?}"),
    };
    let argv = ["/bin/sh", "-c", "echo x > ran"];
    let try_with = |c: &str| {
        let mut p = process_start("a", "s", &argv);
        p.recovery = Some(Box::new(recovery(Some(c), false, true)));
        call(&d, Request::ProcessStart(p))
    };
    for (c, code, says) in [
        (
            "no-such",
            allox_protocol::ErrorCode::InvalidRequest,
            "is not a checkpoint",
        ),
        (
            "before",
            allox_protocol::ErrorCode::InvalidRequest,
            "a full id is needed",
        ),
        (
            "bad/id",
            allox_protocol::ErrorCode::InvalidRequest,
            "not an id",
        ),
        (
            "made-writable",
            allox_protocol::ErrorCode::InvalidRequest,
            "incomplete",
        ),
    ] {
        let e = try_with(c).expect_err(c);
        assert_eq!(e.code, code, "{c}: {e:?}");
        assert!(e.message.contains(says), "{c}: {}", e.message);
    }
    // current/ moves on: the checkpoint is no longer what a run starts from.
    std::fs::write(session_file(&d, "a", "s", "kept"), b"changed").unwrap();
    let e = try_with("before-run").expect_err("differs");
    assert_eq!(e.code, allox_protocol::ErrorCode::Conflict, "{e:?}");
    assert!(e.message.contains("kept"), "{}", e.message);
    // Nothing ran, nothing was observed, the session is not fenced.
    assert!(!session_file(&d, "a", "s", "ran").exists());
    assert_eq!(runs(&d), 0);
    // Control: a checkpoint equal to current/ is taken and restored to.
    cp("now");
    match try_with("now") {
        Ok(Response::Exited(r)) => {
            let e = r.effects.expect("effects");
            let rec = e.recovery.expect("recovery");
            assert!(!rec.baseline_made && rec.checkpoint_id == "now" && rec.consistent);
            assert!(!e.fenced);
        }
        other => panic!("v3 with an explicit checkpoint: {other:?}"),
    }
    assert!(!session_file(&d, "a", "s", "ran").exists());
    assert_eq!(
        std::fs::read(session_file(&d, "a", "s", "kept")).unwrap(),
        b"changed"
    );
    assert_eq!(runs(&d), 1);
}

/// A digest of every file under `dir` (relative path and content).
fn tree_hash(dir: &Path) -> String {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        for e in std::fs::read_dir(&p).unwrap().flatten() {
            let path = e.path();
            if e.file_type().unwrap().is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(dir).unwrap().display().to_string();
                files.push((rel, std::fs::read(&path).unwrap_or_default()));
            }
        }
    }
    files.sort();
    let mut all = Vec::new();
    for (k, v) in files {
        all.extend(k.as_bytes());
        all.push(0);
        all.extend(allox_effects::chain::sha256_hex(&v).as_bytes());
    }
    allox_effects::chain::sha256_hex(&all)
}

/// A v3 run on a daemon armed to die at `point` (between B and C); the
/// daemon restarted: the session fenced, `current/` exactly A or B, the
/// evidence INCOMPLETE, and the run's root unfences it.
fn killed_in_recovery(point: &str, want_a: bool) {
    let name = format!("v3_killed_at_{point}");
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((mut d, args)) = armed(&name, point) else {
        return;
    };
    observed(&d, "a", "s", &["/bin/sh", "-c", "echo A > f"]);
    let current = session_file(&d, "a", "s", "");
    let at_a = tree_hash(&current);
    let mut p = process_start("a", "s", &["/bin/sh", "-c", "echo B > f; echo new > g"]);
    p.recovery = Some(Box::new(recovery(None, false, true)));
    let f = dies_at(&mut d, &args, point, p);
    let now = tree_hash(&current);
    let at_b = {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("f"), b"B\n").unwrap();
        std::fs::write(t.path().join("g"), b"new\n").unwrap();
        tree_hash(t.path())
    };
    assert_ne!(at_a, at_b);
    let listing = |dir: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| {
                let body = std::fs::read(e.path()).ok();
                format!("{} {body:?}", e.file_name().to_string_lossy())
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        now,
        if want_a { &at_a } else { &at_b }.clone(),
        "{point}: current/ is not {}: {:?}",
        if want_a { "A" } else { "B" },
        listing(&current)
    );
    let e = effects_of(&d, "a", "s", &f.run_id);
    assert_eq!(e.verdict, EffectsVerdict::Incomplete, "{point}");
    assert_eq!(e.evidence_root, f.evidence_root, "{point}");
    // The set as left verifies (it ends in a fault: INCOMPLETE).
    let dir = d.daemon.root.join("state/effects/a/s").join(&f.run_id);
    let report =
        allox_effects::verify::verify_set(&allox_effects::chain::Dir(&dir), Some(&f.evidence_root));
    assert!(
        report.ok && report.verdict == Some(EffectsVerdict::Incomplete),
        "{point}: {report:?}"
    );
    match call(
        &d,
        Request::EffectsUnfence(allox_protocol::EffectsUnfence {
            agent_id: "a".into(),
            session_id: "s".into(),
            run_id: f.run_id.clone(),
            evidence_root: f.evidence_root.clone(),
        }),
    ) {
        Ok(Response::EffectsUnfenced(_)) => {}
        other => panic!("{point}: unfence {other:?}"),
    }
    match call(
        &d,
        Request::ProcessStart(process_start("a", "s", &["/bin/true"])),
    ) {
        Ok(Response::Exited(r)) => assert_eq!(r.exit_code, Some(0), "{point}"),
        other => panic!("{point}: a run after the unfence: {other:?}"),
    }
}

#[test]
fn v3_the_supervisor_killed_at_each_step_between_b_and_c_leaves_a_or_b_fenced() {
    for (point, a) in [
        ("effects_v3.after_fence", false),
        ("rollback.after_journal", false),
        ("rollback.after_exchange", true),
        ("rollback.after_commit", true),
        ("effects_v3.after_restore", true),
    ] {
        killed_in_recovery(point, a);
    }
}

/// A root helper, standing in for an agent that escaped its sandbox: it
/// joins the run's cgroup (so the history sees its fork), and forks a
/// server that enters the session's network namespace, sets a sysctl of
/// that namespace, leaves for the root cgroup (so the run's end does not
/// kill it) and listens on the session's loopback. Prints the server's
/// pid.
const LEFT_LISTENING: &str = r#"
import ctypes, os, socket, sys, time
libc = ctypes.CDLL(None, use_errno=True)
run_cg, ctx, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
open(os.path.join(run_cg, "cgroup.procs"), "w").write(str(os.getpid()))
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    null = os.open("/dev/null", os.O_RDWR)
    for n in (0, 1, 2):
        os.dup2(null, n)
    fd = os.open(f"/proc/{ctx}/ns/net", os.O_RDONLY)
    assert libc.setns(fd, 0x40000000) == 0, ctypes.get_errno()
    open("/proc/sys/net/ipv4/ip_default_ttl", "w").write("99")
    open("/sys/fs/cgroup/unified/cgroup.procs", "w").write(str(os.getpid()))
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    os.write(w, b"up")
    os.close(w)
    while True:
        time.sleep(1000)
os.close(w)
assert os.read(r, 2) == b"up"
print(pid)
"#;

/// Whether `pid` is alive.
fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

/// A v3 run in an isolated session, with a server left listening in the
/// session's namespace by a root helper; `scrub` asked or not. The
/// server's pid and the run's effects.
fn left_listening(d: &ProcDaemon, s: &str, scrub: bool) -> (u32, RunEffects) {
    let mut c = d.daemon.client();
    let mut create = allox_protocol::SessionCreate::new("a", s);
    create.network = Some(allox_protocol::NetworkMode::Isolated);
    c.call(Request::SessionCreate(create))
        .expect("transport")
        .expect("session.create");
    let mut p = process_start(
        "a",
        s,
        &["/bin/sh", "-c", "while [ ! -e go ]; do sleep 0.02; done"],
    );
    p.recovery = Some(Box::new(recovery(None, scrub, true)));
    let run = started(&mut c, p);
    let run_cg = d.cgroup.join("allox/a").join(s).join(format!("run-{run}"));
    let ctx = std::fs::read_to_string(d.cgroup.join(format!("allox/a/.context-{s}/cgroup.procs")))
        .unwrap()
        .lines()
        .next()
        .expect("the session's context")
        .to_string();
    let out = std::process::Command::new("/usr/bin/python3")
        .args(["-c", LEFT_LISTENING])
        .arg(&run_cg)
        .arg(&ctx)
        .arg("8089")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let server: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(alive(server));
    std::fs::write(session_file(d, "a", s, "go"), b"").unwrap();
    let e = *waited(d, "a", s, &run).effects.expect("effects");
    (server, e)
}

/// The residue of `e` (A→C): the process `pid`, and the session's
/// sysctl the helper set.
fn residue_of(e: &RunEffects, pid: u32) -> (bool, bool) {
    let listed = |dom: EffectsDomain, item: &str| {
        e.recovery.as_ref().is_some_and(|r| {
            r.a_to_c
                .iter()
                .any(|d| d.domain == dom && d.changes.iter().any(|c| c.item == item))
        })
    };
    (
        listed(EffectsDomain::Processes, &format!("pid {pid}")),
        listed(EffectsDomain::Sysctl, "session net.ipv4.ip_default_ttl"),
    )
}

#[test]
fn v3_scrub_runtime_ends_a_server_left_in_the_sessions_namespace_else_it_is_a_residue() {
    let Some((d, _scope, _one)) = start(
        "v3_scrub_runtime_ends_a_server_left_in_the_sessions_namespace_else_it_is_a_residue",
        Some(SCOPE_MACHINE),
        &[],
    ) else {
        return;
    };
    make_sessions(&d, &[("a", "plain")]);
    // Without scrub_runtime: the server lives on, listed as the residue,
    // and the session is fenced.
    let (server, kept) = left_listening(&d, "kept", false);
    let still = alive(server);
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_raw(server as i32).unwrap(),
        rustix::process::Signal::KILL,
    );
    assert!(still, "the server died without scrub_runtime");
    assert_eq!(residue_of(&kept, server), (true, true), "{kept:#?}");
    assert!(kept.fenced, "{kept:#?}");
    // With it: the server is ended before C, named, and A→C is CONSISTENT.
    let (server, scrubbed) = left_listening(&d, "scrubbed", true);
    let gone = !alive(server);
    if !gone {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(server as i32).unwrap(),
            rustix::process::Signal::KILL,
        );
    }
    assert!(
        gone,
        "scrub_runtime left the server {server}: {scrubbed:#?}"
    );
    let r = scrubbed.recovery.as_ref().expect("recovery");
    assert!(
        r.scrubbed
            .iter()
            .any(|x| x.starts_with(&format!("pid {server} "))),
        "{r:#?}"
    );
    assert!(
        r.scrubbed
            .iter()
            .any(|x| x.contains("replaced by new ones")),
        "{r:#?}"
    );
    assert!(
        residue_of(&scrubbed, server) == (false, false) && r.consistent && !scrubbed.fenced,
        "{scrubbed:#?}"
    );
    // The session runs on in its new namespaces.
    match call(
        &d,
        Request::ProcessStart(process_start("a", "scrubbed", &["/bin/true"])),
    ) {
        Ok(Response::Exited(x)) => assert_eq!(x.exit_code, Some(0)),
        other => panic!("a run after the scrub: {other:?}"),
    }
}
