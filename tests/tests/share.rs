//! Session file sharing (the share plugin) through the real daemon and
//! real sandboxes: `allox share` and the seed's `share.py` inside runs of
//! two agents, escapes tried from a hostile target, a disable racing a
//! thousand requests, reads racing rollbacks, and the daemon without the
//! plugin.

use allox_integration::sandbox_api_raw::{frames, raw_exchange, sandbox_frame};
use allox_integration::{
    alloxctl, call, make_sessions, process_start as start, require, ProcDaemon,
};
use allox_protocol::sandbox_api::*;
use allox_protocol::*;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

const A: (&str, &str) = ("agent-a", "session-1");
const B: (&str, &str) = ("agent-b", "session-1");
const B_TARGET: &str = "agent-b/session-1";

fn setup(name: &str, extra: &[&str]) -> Option<ProcDaemon> {
    if !require(&format!("share::{name}")) {
        return None;
    }
    if allox_integration::cgroup2_mount().is_none() {
        panic!("share::{name} needs a cgroup2 mount (/sys/fs/cgroup or /sys/fs/cgroup/unified)");
    }
    let d = ProcDaemon::start(name, extra);
    make_sessions(&d, &[A, B, ("agent-c", "s")]);
    Some(d)
}

/// Runs `sh -c script` in session `who` and waits.
fn sh(d: &ProcDaemon, who: (&str, &str), script: &str) -> RunResult {
    match call(
        d,
        Request::ProcessStart(start(who.0, who.1, &["/bin/sh", "-c", script])),
    ) {
        Ok(Response::Exited(r)) => r,
        other => panic!("{script}: {other:?}"),
    }
}

/// `sh`, which must succeed; its stdout.
fn ok(d: &ProcDaemon, who: (&str, &str), script: &str) -> String {
    let r = sh(d, who, script);
    assert_eq!(r.exit_code, Some(0), "{script}: {r:?}");
    r.stdout
}

/// `sh`, which must fail with `allox: CODE: ...` containing `needle`.
fn refused(d: &ProcDaemon, who: (&str, &str), script: &str, code: &str, needle: &str) {
    let r = sh(d, who, script);
    assert_eq!(r.exit_code, Some(1), "{script}: {r:?}");
    assert!(
        r.stderr.contains(&format!("allox: {code}: ")) && r.stderr.contains(needle),
        "{script}: wanted {code} with {needle:?}, got {}",
        r.stderr
    );
}

fn current(d: &ProcDaemon, who: (&str, &str)) -> PathBuf {
    d.daemon.root.join(format!(
        "agents/{}/workspace/sessions/{}/current",
        who.0, who.1
    ))
}

fn share_audit(d: &ProcDaemon) -> Vec<ShareAuditRecord> {
    std::fs::read_to_string(d.daemon.root.join("state/share-audit.log"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn sessions_reach_each_other_only_when_both_share_and_write_only_when_allowed() {
    let Some(d) = setup(
        "sessions_reach_each_other_only_when_both_share_and_write_only_when_allowed",
        &["--share-tools"],
    ) else {
        return;
    };
    ok(&d, B, "echo 'findings: 3' > report.txt");
    let read = format!("allox share read {B_TARGET} report.txt");
    // Neither shares: the caller is told to enable first.
    refused(&d, A, &read, "unauthorized", "both share");
    ok(&d, A, "allox share enable");
    // The target has not enabled sharing: unreachable, like a session
    // that does not exist.
    refused(&d, A, &read, "not_found", "does not share its files");
    refused(
        &d,
        A,
        "allox share read agent-x/nobody report.txt",
        "not_found",
        "does not share its files",
    );
    // On, read-only by default: the seed's example reads; writes are refused.
    let st = ok(&d, B, "python3 /run/allox/share.py enable");
    assert_eq!(
        st,
        "agent-b/session-1 shares . (read, set by the session)\n"
    );
    assert_eq!(
        ok(
            &d,
            A,
            &format!("python3 /run/allox/share.py read {B_TARGET} report.txt")
        ),
        "findings: 3\n"
    );
    refused(
        &d,
        A,
        &format!("echo changed | allox share write {B_TARGET} report.txt"),
        "unauthorized",
        "read-only",
    );
    assert_eq!(
        std::fs::read_to_string(current(&d, B).join("report.txt")).unwrap(),
        "findings: 3\n"
    );
    // Listing and stat reach the target's scope.
    let listed = ok(&d, A, &format!("allox share list {B_TARGET}"));
    assert!(listed.contains("report.txt"), "{listed}");
    let stat = ok(
        &d,
        A,
        &format!("allox share stat {B_TARGET} report.txt --json"),
    );
    let e: FsEntry = serde_json::from_str(&stat).unwrap();
    assert_eq!((e.kind, e.size), (FsKind::File, 12));
    // Status shows the caller's sharing and whom it can reach.
    let status = ok(&d, A, "allox share status");
    assert!(
        status.contains("agent-a/session-1 shares .")
            && status.contains("reachable: agent-b/session-1 shares ."),
        "{status}"
    );

    // With write permission: whole files replace, large ones as uploads,
    // and what is written belongs to the target's sandbox user.
    ok(&d, B, "mkdir data && allox share enable --permission write");
    ok(
        &d,
        A,
        &format!("echo 'reviewed by agent-a' | allox share write {B_TARGET} review.txt"),
    );
    let b = current(&d, B);
    assert_eq!(
        std::fs::read_to_string(b.join("review.txt")).unwrap(),
        "reviewed by agent-a\n"
    );
    let own = std::fs::metadata(b.join("report.txt")).unwrap();
    let written = std::fs::metadata(b.join("review.txt")).unwrap();
    assert_eq!(
        (written.uid(), written.gid()),
        (own.uid(), own.gid()),
        "the file written through the share is not the target's sandbox user's"
    );
    assert_ne!(written.uid(), 0);
    // 700 KiB: three write calls (an upload), then three reads, one tree.
    let out = ok(
        &d,
        A,
        &format!(
            "head -c 716800 /dev/urandom > big.bin && allox share write {B_TARGET} data/big.bin --from big.bin 2>&1; \
             allox share read {B_TARGET} data/big.bin | cmp - big.bin && echo same"
        ),
    );
    assert!(out.ends_with("same\n"), "{out}");
    assert_eq!(
        std::fs::read(b.join("data/big.bin")).unwrap(),
        std::fs::read(current(&d, A).join("big.bin")).unwrap()
    );
    assert!(
        std::fs::read_dir(b.join("data")).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with(".allox-")),
        "an upload left its partial file"
    );

    // Every access is recorded outside the workspaces: who, whom, what,
    // and how it went.
    let audit = share_audit(&d);
    let reads: Vec<_> = audit.iter().filter(|r| r.route == "share.read").collect();
    assert!(
        reads.iter().any(|r| r.verdict == "unauthorized"),
        "{audit:?}"
    );
    assert!(reads.iter().any(|r| r.verdict == "not_found"), "{audit:?}");
    let first_ok = reads.iter().find(|r| r.verdict == "ok").unwrap();
    assert!(
        first_ok.caller.starts_with("agent-a/session-1/"),
        "{first_ok:?}"
    );
    assert_eq!(first_ok.target, B_TARGET);
    assert_eq!(first_ok.path.as_deref(), Some("report.txt"));
    assert!(audit
        .iter()
        .any(|r| r.route == "share.write" && r.verdict == "unauthorized"));
    assert!(audit
        .iter()
        .any(|r| r.route == "share.enable" && r.target == B_TARGET));
    // Nothing of it is in the sessions' files.
    for who in [A, B] {
        let found = std::process::Command::new("grep")
            .args(["-rl", "share.read"])
            .arg(current(&d, who))
            .output()
            .unwrap();
        assert!(found.stdout.is_empty(), "{:?}", found);
    }

    // The host sees who shares what.
    let (code, out, err) = alloxctl(&d.daemon.socket, &["share", "list"]);
    let out = String::from_utf8_lossy(&out);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("agent-a/session-1") && out.contains("agent-b/session-1"),
        "{out}"
    );
    assert!(out.contains("write") && out.contains("session"), "{out}");
}

#[test]
fn escapes_through_dot_dot_links_a_linked_scope_and_proc_are_refused() {
    let Some(d) = setup(
        "escapes_through_dot_dot_links_a_linked_scope_and_proc_are_refused",
        &["--share-tools"],
    ) else {
        return;
    };
    // A hostile target: its scope `out` is full of links out of it.
    ok(
        &d,
        B,
        "echo secret > secret.txt && mkdir -p out/d && echo public > out/pub.txt && \
         ln -s ../secret.txt out/up && ln -s /etc/passwd out/abs && ln -s /etc out/etc && \
         ln -s /proc/self/root out/root && ln -s ../.. out/d/upup && ln -s pub.txt out/inside && \
         allox share enable --scope out --permission write",
    );
    ok(&d, A, "allox share enable");
    let t = B_TARGET;
    assert_eq!(
        ok(&d, A, &format!("allox share read {t} pub.txt")),
        "public\n"
    );
    // A link that stays inside the scope is followed.
    assert_eq!(
        ok(&d, A, &format!("allox share read {t} inside")),
        "public\n"
    );
    for (path, code, needle) in [
        ("../secret.txt", "invalid_request", "`..`"),
        ("/etc/passwd", "invalid_request", "absolute"),
        ("/proc/self/root/etc/passwd", "invalid_request", "absolute"),
        ("up", "invalid_request", "leads outside the shared scope"),
        ("abs", "invalid_request", "leads outside"),
        ("etc/passwd", "invalid_request", "leads outside"),
        ("root/etc/passwd", "invalid_request", "leads outside"),
        ("d/upup/secret.txt", "invalid_request", "leads outside"),
    ] {
        refused(&d, A, &format!("allox share read {t} {path}"), code, needle);
    }
    refused(
        &d,
        A,
        &format!("allox share list {t} etc"),
        "invalid_request",
        "leads outside",
    );
    // Writing through them never lands outside: a link as the last name is
    // replaced, not followed; a link on the way is refused.
    ok(
        &d,
        A,
        &format!("echo overwritten | allox share write {t} up"),
    );
    let b = current(&d, B);
    assert_eq!(
        std::fs::read_to_string(b.join("secret.txt")).unwrap(),
        "secret\n"
    );
    assert_eq!(
        std::fs::read_to_string(b.join("out/up")).unwrap(),
        "overwritten\n"
    );
    refused(
        &d,
        A,
        &format!("echo x | allox share write {t} etc/allox-share-escape"),
        "invalid_request",
        "leads outside",
    );
    assert!(!std::path::Path::new("/etc/allox-share-escape").exists());
    refused(
        &d,
        A,
        &format!("echo x | allox share write {t} d/upup/secret.txt"),
        "invalid_request",
        "leads outside",
    );
    assert_eq!(
        std::fs::read_to_string(b.join("secret.txt")).unwrap(),
        "secret\n"
    );

    // A scope that is a link: refused when enabled, and refused at access
    // when the target swaps its scope for one afterwards.
    refused(
        &d,
        B,
        "ln -s . dot && allox share enable --scope dot",
        "invalid_request",
        "symbolic link",
    );
    refused(
        &d,
        B,
        "ln -s / slash && allox share enable --scope slash/etc",
        "invalid_request",
        "symbolic link",
    );
    ok(&d, B, "mv out real && ln -s .. out");
    refused(
        &d,
        A,
        &format!("allox share read {t} secret.txt"),
        "invalid_request",
        "symbolic link",
    );
    refused(
        &d,
        A,
        &format!("allox share list {t}"),
        "invalid_request",
        "symbolic link",
    );
}

#[test]
fn nothing_is_accepted_once_disable_has_answered() {
    let Some(d) = setup(
        "nothing_is_accepted_once_disable_has_answered",
        &["--share-tools"],
    ) else {
        return;
    };
    ok(&d, B, "echo x > f && allox share enable");
    ok(&d, A, "allox share enable");
    // A's loop: 1,000 requests, each line `<ns before sending> ok|no`.
    let log = current(&d, A).join("log");
    let dd = &d;
    let (disabled_at, lines) = std::thread::scope(|s| {
        let looped = s.spawn(move || {
            ok(
                dd,
                A,
                &format!(
                    "for i in $(seq 1000); do t=$(date +%s%N); \
                     if allox share stat {B_TARGET} f >/dev/null 2>err; then echo \"$t ok\"; \
                     else echo \"$t no $(cut -c1-60 err | head -1)\"; fi; done > log"
                ),
            )
        });
        // Once a fair part has gone through, B disables; the time is taken
        // after the answer.
        let t0 = std::time::Instant::now();
        while std::fs::read_to_string(&log)
            .map(|t| t.lines().count())
            .unwrap_or(0)
            < 300
        {
            assert!(t0.elapsed().as_secs() < 120, "the loop does not advance");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let at: u128 = ok(dd, B, "allox share disable >/dev/null && date +%s%N")
            .trim()
            .parse()
            .unwrap();
        looped.join().unwrap();
        (at, std::fs::read_to_string(&log).unwrap())
    });
    let results: Vec<(u128, &str)> = lines
        .lines()
        .map(|l| {
            let (t, rest) = l.split_once(' ').unwrap();
            (t.parse().unwrap(), rest)
        })
        .collect();
    assert_eq!(results.len(), 1000);
    let before = results.iter().filter(|(t, _)| *t < disabled_at).count();
    let after: Vec<_> = results.iter().filter(|(t, _)| *t > disabled_at).collect();
    assert!(
        before >= 300 && after.len() >= 100,
        "the disable did not fall inside the loop ({before} before, {} after)",
        after.len()
    );
    assert!(results[..before].iter().any(|(_, r)| *r == "ok"));
    let accepted: Vec<_> = after.iter().filter(|(_, r)| !r.starts_with("no")).collect();
    assert!(
        accepted.is_empty(),
        "{} requests sent after disable answered were accepted: {:?}",
        accepted.len(),
        &accepted[..accepted.len().min(5)]
    );
    assert!(
        after
            .iter()
            .all(|(_, r)| r.contains("not_found") && r.contains("does not share")),
        "{:?}",
        &after[..3]
    );
}

#[test]
fn reads_during_rollbacks_never_mix_trees_and_writes_wait_for_no_live_run() {
    let Some(d) = setup(
        "reads_during_rollbacks_never_mix_trees_and_writes_wait_for_no_live_run",
        &["--share-tools"],
    ) else {
        return;
    };
    // Two trees of B: a 700 KiB file of `A`s (three reads) and one of `B`s.
    let b = current(&d, B);
    let checkpoint = |c: &str| {
        call(
            &d,
            Request::CheckpointCreate(CheckpointCreate {
                agent_id: B.0.into(),
                session_id: B.1.into(),
                checkpoint_id: c.into(),
                pinned: false,
                label: None,
            }),
        )
        .unwrap();
    };
    std::fs::write(b.join("big.txt"), vec![b'A'; 716_800]).unwrap();
    std::fs::write(b.join("other.txt"), "tree A").unwrap();
    checkpoint("ca");
    std::fs::write(b.join("big.txt"), vec![b'B'; 716_800]).unwrap();
    std::fs::write(b.join("other.txt"), "tree B").unwrap();
    checkpoint("cb");
    ok(&d, B, "allox share enable --permission write");
    ok(&d, A, "allox share enable");
    let rollback = |c: &str| {
        call(
            &d,
            Request::SessionRollback(SessionRollback {
                agent_id: B.0.into(),
                session_id: B.1.into(),
                checkpoint_id: c.into(),
                kill_processes: None,
            }),
        )
    };
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (out, rollbacks) = std::thread::scope(|s| {
        let roller = s.spawn(|| {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                rollback(if n % 2 == 0 { "ca" } else { "cb" }).unwrap();
                n += 1;
                // Short pauses race the reads; long ones let whole reads
                // through between two rollbacks, however slow the machine
                // (a read is three requests through a sandbox's client).
                let pause = if n % 3 == 0 { 400 } else { 20 };
                std::thread::sleep(std::time::Duration::from_millis(pause));
            }
            n
        });
        // Each read: what the whole file holds (its distinct bytes), or the
        // refusal.
        let out = ok(
            &d,
            A,
            &format!(
                "for i in $(seq 150); do \
                 if allox share read {B_TARGET} big.txt > got 2>err; then \
                 echo \"$(wc -c < got) $(tr -d '\\n' < got | fold -w1 | sort -u | tr -d '\\n')\"; \
                 else echo \"ERR $(head -c 120 err)\"; fi; done"
            ),
        );
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        (out, roller.join().unwrap())
    });
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    for l in out.lines() {
        let kind = if let Some(e) = l.strip_prefix("ERR ") {
            assert!(e.contains("conflict"), "a read failed otherwise: {l}");
            "conflict".to_string()
        } else {
            assert!(
                l == "716800 A" || l == "716800 B",
                "a read mixed trees or came short: {l}"
            );
            l.to_string()
        };
        *seen.entry(kind).or_default() += 1;
    }
    assert!(rollbacks >= 10, "only {rollbacks} rollbacks ran meanwhile");
    assert!(
        seen.contains_key("716800 A") && seen.contains_key("716800 B"),
        "the reads did not span rollbacks: {seen:?} ({rollbacks} rollbacks)"
    );
    eprintln!("reads during {rollbacks} rollbacks: {seen:?}");

    // A write while the target has a live run: conflict; after it, done.
    let started = call(
        &d,
        Request::ProcessStart(ProcessStart {
            wait: false,
            ..start(B.0, B.1, &["sleep", "60"])
        }),
    )
    .unwrap();
    let Response::Started(run) = started else {
        panic!("{started:?}")
    };
    refused(
        &d,
        A,
        &format!("echo late | allox share write {B_TARGET} late.txt"),
        "conflict",
        "has a live run",
    );
    assert!(!b.join("late.txt").exists());
    call(
        &d,
        Request::ProcessKill(ProcessKill {
            agent_id: B.0.into(),
            session_id: B.1.into(),
            run_id: Some(run.run_id.clone()),
            signal: None,
        }),
    )
    .unwrap();
    call(
        &d,
        Request::ProcessWait(ProcessWait {
            agent_id: B.0.into(),
            session_id: B.1.into(),
            run_id: run.run_id,
            timeout_ms: Some(10_000),
        }),
    )
    .unwrap();
    ok(
        &d,
        A,
        &format!("echo late | allox share write {B_TARGET} late.txt"),
    );
    assert_eq!(
        std::fs::read_to_string(b.join("late.txt")).unwrap(),
        "late\n"
    );
}

#[test]
fn the_host_switches_sharing_and_its_actions_are_refused_inside() {
    let Some(d) = setup(
        "the_host_switches_sharing_and_its_actions_are_refused_inside",
        &["--share-tools"],
    ) else {
        return;
    };
    ok(&d, B, "echo x > f && allox share enable");
    ok(&d, A, "allox share enable");
    // Host actions through the in-sandbox interface: no route, and as a host
    // frame, refused as a host action.
    for route in ["share.agent.set", "share.session.set"] {
        refused(
            &d,
            A,
            &format!(
                r#"allox call {route} '{{"agent_id":"agent-b","session_id":"session-1","enabled":true,"allowed":true}}'"#
            ),
            "not_found",
            "no plugin owns route",
        );
    }
    let hello = sandbox_frame(&SandboxClientFrame::Hello(SandboxHello::new()));
    let host = encode(&ClientFrame::Request(RequestEnvelope {
        conversation: 1,
        request_id: 5,
        request: Request::ShareAgentSet(ShareAgentSet {
            agent_id: "agent-a".into(),
            default_on: Some(true),
            ..ShareAgentSet::default()
        }),
    }))
    .unwrap();
    let got = raw_exchange(&d, A.0, A.1, &[([hello, host].concat(), 2)]);
    let f = frames(&got[0]);
    let e = match decode::<ServerFrame>(&f[1]) {
        Ok(ServerFrame::Response(ResponseEnvelope {
            outcome: Outcome::Err(e),
            ..
        })) => e,
        other => panic!("{other:?}"),
    };
    assert_eq!(e.code, ErrorCode::Unsupported);
    assert!(
        e.message.starts_with("share.agent.set is a host action"),
        "{}",
        e.message
    );
    // The host, through alloxctl: an agent not allowed shares nothing and
    // cannot enable.
    let ctl = |args: &[&str]| {
        let (code, out, err) = alloxctl(&d.daemon.socket, args);
        assert_eq!(code, 0, "{args:?}: {err}");
        String::from_utf8_lossy(&out).into_owned()
    };
    let out = ctl(&["share", "agent", "agent-b", "--allowed", "no"]);
    assert_eq!(out, "agent agent-b: sharing not allowed; by default off\n");
    refused(
        &d,
        A,
        &format!("allox share read {B_TARGET} f"),
        "not_found",
        "does not share",
    );
    refused(
        &d,
        B,
        "allox share enable",
        "unauthorized",
        "turned sharing off",
    );
    ctl(&["share", "agent", "agent-b", "--allowed", "yes"]);
    // B's own choice comes back with its agent allowed again.
    assert_eq!(ok(&d, A, &format!("allox share read {B_TARGET} f")), "x\n");
    // An agent's default: its sessions share without enabling.
    ok(&d, ("agent-c", "s"), "echo c > f");
    refused(
        &d,
        A,
        "allox share read agent-c/s f",
        "not_found",
        "does not share",
    );
    let out = ctl(&["share", "agent", "agent-c", "--default", "on"]);
    assert_eq!(
        out,
        "agent agent-c: sharing allowed; by default on (scope ., read)\n"
    );
    assert_eq!(ok(&d, A, "allox share read agent-c/s f"), "c\n");
    // The host turns one session off; a session deleted and made again
    // does not inherit the old one's sharing.
    let out = ctl(&["share", "session", "agent-c", "s", "off"]);
    assert_eq!(out, "agent-c/s does not share (set by host)\n");
    refused(
        &d,
        A,
        "allox share read agent-c/s f",
        "not_found",
        "does not share",
    );
    ctl(&[
        "share",
        "session",
        "agent-b",
        "session-1",
        "on",
        "--permission",
        "write",
    ]);
    call(
        &d,
        Request::SessionDelete(SessionDelete {
            agent_id: B.0.into(),
            session_id: B.1.into(),
            force: true,
        }),
    )
    .unwrap();
    make_sessions(&d, &[B]);
    ctl(&["share", "agent", "agent-c", "--default", "off"]);
    let out = ctl(&["share", "list"]);
    assert!(
        out.contains("agent-a/session-1")
            && !out.contains("agent-b/session-1")
            && !out.contains("agent-c/s "),
        "{out}"
    );
    // Bad input, named.
    let (code, _, err) = alloxctl(
        &d.daemon.socket,
        &[
            "share",
            "session",
            "agent-b",
            "session-1",
            "on",
            "--scope",
            "../x",
        ],
    );
    assert_eq!(code, 1);
    assert!(err.contains("`..`"), "{err}");
    let (code, _, err) = alloxctl(
        &d.daemon.socket,
        &["share", "agent", "nobody", "--default", "on"],
    );
    assert_eq!(code, 1);
    assert!(err.contains("nobody"), "{err}");
    // The choices outlive the daemon.
    let mut d = d;
    d.restart(&["--share-tools"]);
    assert_eq!(
        ok(&d, B, "echo y > f && allox share status"),
        "agent-b/session-1 does not share (set by default)\n"
    );
    ok(&d, B, "allox share enable");
    assert_eq!(ok(&d, A, &format!("allox share read {B_TARGET} f")), "y\n");
}

#[test]
fn with_the_plugin_installed_but_not_enabled_the_sandbox_is_unchanged() {
    let Some(off) = setup(
        "with_the_plugin_installed_but_not_enabled_the_sandbox_is_unchanged",
        &[],
    ) else {
        return;
    };
    let on = ProcDaemon::start("share_plugin_on", &["--share-tools"]);
    make_sessions(&on, &[A]);
    // Mount points (inside the sandbox) and the environment's names and
    // values, but for the run's own id.
    let view = "awk '{print $5, $6}' /proc/self/mountinfo; env | grep -v '^ALLOX_RUN_ID=' | sort";
    let without = ok(&off, A, view);
    let with = ok(&on, A, view);
    let extra: Vec<_> = with
        .lines()
        .filter(|l| !without.lines().any(|w| w == *l))
        .collect();
    let missing: Vec<_> = without
        .lines()
        .filter(|l| !with.lines().any(|w| w == *l))
        .collect();
    assert!(missing.is_empty(), "{missing:?}");
    assert_eq!(extra.len(), 1, "{extra:?}");
    assert!(extra[0].starts_with("/run/allox/share.py ro"), "{extra:?}");
    // No route, no entry point, no files in state/.
    refused(
        &off,
        A,
        "allox share status",
        "not_found",
        "no plugin owns route \"share.status\"",
    );
    let r = sh(&off, A, "test -e /run/allox/share.py");
    assert_eq!(r.exit_code, Some(1));
    for f in ["share.json", "share-audit.log", "share.py"] {
        assert!(!off.daemon.root.join("state").join(f).exists(), "{f}");
    }
    let (code, _, err) = alloxctl(&off.daemon.socket, &["share", "list"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("share.list is served by the share plugin, which is not enabled")
            && err.contains("--share-tools"),
        "{err}"
    );
}

#[test]
fn share_stat_with_long_paths_in_a_tight_loop_keeps_the_audit_files_bounded() {
    let name = "share_stat_with_long_paths_in_a_tight_loop_keeps_the_audit_files_bounded";
    // A rate low enough that the flood passes it however slow the
    // machine (10 lines a second, 100 at once).
    let args = [
        "--share-tools",
        "--audit-file-bytes",
        "1M",
        "--audit-lines-per-s",
        "10",
    ];
    let Some(d) = setup(name, &args) else {
        return;
    };
    ok(&d, B, "allox share enable");
    ok(&d, A, "allox share enable");
    let mut c = d.daemon.client();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = stop.clone();
    let pinger = std::thread::spawn(move || {
        let mut worst = std::time::Duration::ZERO;
        while !s2.load(std::sync::atomic::Ordering::Relaxed) {
            let t = std::time::Instant::now();
            match c.call(Request::Ping(Ping {})) {
                Ok(Ok(Response::Pong(_))) => worst = worst.max(t.elapsed()),
                other => panic!("ping: {other:?}"),
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        worst
    });
    // share.stat of 4 KiB paths, two callers at once, for 8 s.
    let r = sh(
        &d,
        A,
        &format!(
            "p=$(head -c 4000 /dev/zero | tr '\\0' x); end=$(( $(date +%s) + 8 )); n=0; \
             flood() {{ while [ $(date +%s) -lt $end ]; do \
               allox share stat {B_TARGET} \"$p/$n\" >/dev/null 2>&1; done; }}; \
             flood & flood & wait; echo done"
        ),
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let worst = pinger.join().unwrap();
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert!(
        worst < std::time::Duration::from_secs(1),
        "ping took {worst:?}"
    );
    let state = d.daemon.root.join("state");
    for f in ["share-audit.log", "audit.log"] {
        for g in [f.to_string(), format!("{f}.1")] {
            let n = std::fs::metadata(state.join(&g)).map_or(0, |m| m.len());
            assert!(n < (1 << 20) + 4096, "{g} holds {n} bytes");
        }
    }
    let recs = share_audit(&d);
    assert!(
        recs.iter()
            .all(|r| r.path.as_ref().is_none_or(|p| p.len() < 300)),
        "a long path kept whole"
    );
    assert!(
        recs.iter().any(|r| r.verdict == "suppressed"
            && r.message.as_ref().unwrap().contains("--audit-lines-per-s")),
        "no suppression line"
    );
    // The flood got its burst and its rate, the lines that count what was
    // refused among them, at most one a second (they were one between
    // every two allowed, doubling the rate).
    let flood: Vec<_> = recs
        .iter()
        .filter(|r| r.caller.starts_with("agent-a/session-1/"))
        .collect();
    let span_s = (flood.last().unwrap().time_ms - flood[0].time_ms) as f64 / 1000.0;
    let said = flood.iter().filter(|r| r.verdict == "suppressed").count();
    assert!(
        said as f64 <= span_s + 2.0,
        "{said} suppressed lines in {span_s} s"
    );
    assert!(
        flood.len() as f64 <= 100.0 + 10.0 * (span_s + 1.0),
        "{} lines in {span_s} s",
        flood.len()
    );
    // The daemon's audit log says the same of its records of guest calls.
    let audit = match call(
        &d,
        Request::AuditList(AuditList {
            limit: Some(1000),
            ..Default::default()
        }),
    ) {
        Ok(Response::Audit(l)) => l,
        other => panic!("{other:?}"),
    };
    assert!(
        audit.records.iter().any(|r| r.outcome == "suppressed"
            && r.message.as_ref().unwrap().contains("--audit-lines-per-s")),
        "no suppression record in the audit log"
    );
    let said = audit
        .records
        .iter()
        .filter(|r| r.outcome == "suppressed" && r.target == "agent-a/session-1")
        .count();
    assert!(
        said as f64 <= span_s + 2.0,
        "{said} suppressed records in {span_s} s"
    );
    // A burst of harmless calls does not hide the access after it: past
    // the rate a call is refused, not served unrecorded (a read of another
    // session's file was only one of a count, its target and path nowhere).
    ok(&d, B, "echo PASSWORD=hunter2 > w-secret.txt");
    let r = sh(
        &d,
        A,
        &format!(
            "i=0; while [ $i -lt 300 ]; do allox share stat {B_TARGET} . >/dev/null 2>&1; i=$((i+1)); done; \
             allox share read {B_TARGET} w-secret.txt 2>&1; echo rc=$?"
        ),
    );
    let read = share_audit(&d)
        .into_iter()
        .any(|r| r.route == "share.read" && r.path.as_deref() == Some("w-secret.txt"));
    if r.stdout.contains("hunter2") {
        assert!(read, "the read was served and not recorded: {r:?}");
    } else {
        assert!(r.stdout.contains("past its audit rate") && !read, "{r:?}");
    }
}

/// Uploads begun by another session through sharing are the caller's: they
/// count against the caller's budget of uploads under way, not the
/// target's (16 of them refused the host's own uploads into the target),
/// and no one else adds to or commits them by their id.
#[test]
fn a_writer_s_uploads_are_charged_to_it_and_are_its_own() {
    let name = "a_writer_s_uploads_are_charged_to_it_and_are_its_own";
    let Some(d) = setup(name, &["--share-tools", "--uploads-per-session", "3"]) else {
        return;
    };
    ok(&d, B, "allox share enable --permission write");
    ok(&d, A, "allox share enable");
    let begin = |i: usize| {
        format!(
            "allox call share.write '{{\"target\":\"{B_TARGET}\",\"path\":\"f{i}\",\"data\":\"QUFB\",\"upload\":\"x{i}\",\"offset\":0}}'"
        )
    };
    for i in 0..3 {
        ok(&d, A, &begin(i));
    }
    // The caller's fourth: refused, naming the caller's budget.
    refused(
        &d,
        A,
        &begin(3),
        "unavailable",
        "session agent-a/session-1 has 3 uploads under way",
    );
    // The target's own (the host's here) are not held back by them.
    let host = |id: &str, commit: bool| {
        call(
            &d,
            Request::FsWrite(FsWrite {
                offset: Some(0),
                upload: Some(id.into()),
                commit,
                ..FsWrite::whole(B.0, B.1, &format!("h-{id}"), "host")
            }),
        )
    };
    for id in ["h0", "h1", "h2"] {
        host(id, false).unwrap();
    }
    // The caller's upload x0 is not the host's x0: a chunk of "x0" from the
    // host begins nothing of the caller's (it is told nothing is under way).
    let e = call(
        &d,
        Request::FsWrite(FsWrite {
            offset: Some(3),
            upload: Some("x0".into()),
            commit: true,
            ..FsWrite::whole(B.0, B.1, "f0", "BBB")
        }),
    )
    .unwrap_err();
    assert!(e.message.contains("nothing is under way"), "{e:?}");
    assert!(
        !current(&d, B).join("f0").exists(),
        "another's upload was committed"
    );
    // The caller commits its own.
    ok(
        &d,
        A,
        &format!(
            "allox call share.write '{{\"target\":\"{B_TARGET}\",\"path\":\"f0\",\"data\":\"QkJC\",\"upload\":\"x0\",\"offset\":3,\"commit\":true}}'"
        ),
    );
    assert_eq!(std::fs::read(current(&d, B).join("f0")).unwrap(), b"AAABBB");
    // The caller deleted: its uploads under way in the target go with it.
    let partials = || {
        std::fs::read_dir(current(&d, B))
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(".allox-upload-s")
            })
            .count()
    };
    assert_eq!(partials(), 2);
    call(
        &d,
        Request::SessionDelete(SessionDelete {
            force: true,
            ..SessionDelete::new(A.0, A.1)
        }),
    )
    .unwrap();
    assert_eq!(
        partials(),
        0,
        "the deleted caller's uploads are left in the target"
    );
}

/// A sandbox's `allox share write` refused for want of room in the
/// target (its session quota) drops its upload: nothing is left to hold
/// the target's quota (its partial file kept the target full until the
/// upload's idle timeout, five minutes).
#[test]
fn a_share_write_refused_for_want_of_room_leaves_the_target_its_room() {
    let name = "a_share_write_refused_for_want_of_room_leaves_the_target_its_room";
    let Some(d) = setup(name, &["--share-tools", "--session-quota", "16M"]) else {
        return;
    };
    ok(&d, B, "allox share enable --permission write");
    ok(&d, A, "allox share enable");
    refused(
        &d,
        A,
        &format!(
            "head -c 40M /dev/zero > /tmp/big && allox share write {B_TARGET} big --from /tmp/big"
        ),
        "unavailable",
        "no room left",
    );
    let left: Vec<_> = std::fs::read_dir(current(&d, B))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.is_empty(), "left in the target: {left:?}");
    let records: Vec<_> = std::fs::read_dir(d.daemon.root.join("state/uploads"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(records.is_empty(), "upload records left: {records:?}");
    // The target writes its own files.
    ok(&d, B, "echo hi > mine && cat mine");
}

/// A disk filled by an agent: the daemon with the plugin restarts (its
/// entry point is not rewritten: it was, truncated, and a write that
/// failed stopped the daemon), every access to another session's files is
/// recorded in `share-audit.log` (its room kept, as the daemon's own audit
/// log's) or refused, never served unrecorded, and the host's choice is
/// kept across a restart, nothing half-written beside the choices' file.
#[test]
fn on_a_full_disk_the_daemon_starts_and_no_access_goes_unrecorded() {
    let Some(mut d) = setup(
        "on_a_full_disk_the_daemon_starts_and_no_access_goes_unrecorded",
        &["--share-tools"],
    ) else {
        return;
    };
    ok(
        &d,
        B,
        "echo 'findings: 3' > report.txt && allox share enable",
    );
    ok(&d, A, "allox share enable");
    let state = d.daemon.root.join("state");
    let shim = std::fs::read(state.join("share.py")).unwrap();
    // The disk filled (as a session's own files would fill it), to the
    // last small write.
    allox_integration::fill_disk(&current(&d, ("agent-c", "s")));
    // One cut short (by an earlier build, on a full disk) is kept until
    // there is room: the daemon starts all the same.
    std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(state.join("share.py"))
        .unwrap();
    d.restart(&["--share-tools"]);
    let kept = std::fs::read(state.join("share.py")).unwrap();
    assert!(kept.is_empty() || kept == shim, "{kept:?}");
    let read = format!("allox share read {B_TARGET} report.txt");
    for _ in 0..20 {
        let before = share_audit(&d).len();
        let r = sh(&d, A, &read);
        let after = share_audit(&d);
        if r.exit_code == Some(0) {
            assert_eq!(r.stdout, "findings: 3\n");
            assert_eq!(after.len(), before + 1, "a read served unrecorded");
            let last = after.last().unwrap();
            assert_eq!(
                (
                    last.route.as_str(),
                    last.target.as_str(),
                    last.path.as_deref()
                ),
                ("share.read", B_TARGET, Some("report.txt"))
            );
        } else {
            assert!(
                r.stderr.contains("allox: unavailable: ")
                    && r.stderr.contains("cannot be recorded"),
                "{r:?}"
            );
            assert!(!r.stdout.contains("findings"), "{r:?}");
        }
    }
    // The host's choice is kept: the spare room the store keeps in
    // `state/` is given up for it (it was lost at the next restart,
    // sharing on again, with write). The entry point took it at the
    // start; the store takes it again within a second.
    let spare = state.join(".spare-room");
    let t0 = std::time::Instant::now();
    while std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&spare).unwrap()) == 0 {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "the spare room is not taken again"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // A session's own choice does not spend it (an agent that keeps the
    // disk full spent it before the host's came): refused, said so.
    let r = sh(&d, A, "allox share disable");
    assert_ne!(r.exit_code, Some(0), "{r:?}");
    assert!(r.stderr.contains("unavailable"), "{r:?}");
    assert!(
        std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&spare).unwrap()) > 0,
        "a session's own choice spent the spare room"
    );
    let (code, _, err) = alloxctl(
        &d.daemon.socket,
        &["share", "session", "agent-b", "session-1", "off"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(!state.join(".share.json.new").exists());
    d.restart(&["--share-tools"]);
    let (code, out, err) = alloxctl(&d.daemon.socket, &["share", "list"]);
    assert_eq!(code, 0, "{err}");
    let out = String::from_utf8_lossy(&out);
    // (a-1's own `disable` took effect in memory; the host's write kept
    // it too.)
    assert!(!out.contains("agent-b/session-1"), "{out}");
    let r = sh(&d, A, &read);
    assert_ne!(r.exit_code, Some(0), "{r:?}");
    assert!(!r.stdout.contains("findings"), "{r:?}");
    assert!(!state.join(".share.json.new").exists());
    // No entry point at all, and no room for one (the spare room spent,
    // its blocks taken): the daemon starts without it (it did not start).
    d.daemon.terminate();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&spare)
        .unwrap()
        .set_len(0)
        .unwrap();
    let _ = std::process::Command::new("sync").status();
    let more = current(&d, ("agent-c", "s")).join("more");
    std::fs::create_dir(&more).unwrap();
    allox_integration::fill_disk(&more);
    std::fs::remove_file(state.join("share.py")).unwrap();
    d.restart(&["--share-tools"]);
    let (code, _, err) = alloxctl(&d.daemon.socket, &["share", "list"]);
    assert_eq!(code, 0, "{err}");
}
