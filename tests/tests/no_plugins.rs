//! A supervisor built without plugins (`cargo build -p allox-init
//! --no-default-features`; `scripts/test.sh` builds it into
//! `target/no-plugins/` and runs the core's tests on it as well): its
//! stripped binary holds no BPF object and none of the plugins' code,
//! `plugin.list` is empty, `--plugin NAME` is refused naming the build,
//! and the core serves as ever.

use allox_integration::{call, needs, require, workspace_bin, ProcDaemon, NO_PLUGINS_INIT};
use allox_protocol::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What only a plugin's code holds: its manifest's summary, the tracker's
/// BPF program sections.
const PLUGIN_MARKERS: [&str; 7] = [
    "attributes every process of a run to its agent, session and run (eBPF)",
    "the proxy of each proxy-mode session at 127.0.0.1:3128",
    "sessions that enable sharing reach each other's files",
    "keeps the spans agent frameworks send",
    "evidence of what each run changed outside its workspace",
    "tp_btf/sched_process_fork",
    "tp_btf/sched_process_exec",
];

/// ELF objects for the BPF machine (`e_machine` 247) embedded in `bin`.
fn bpf_objects(bin: &[u8]) -> usize {
    let mut n = 0;
    let mut i = 1;
    while let Some(at) = bin[i..].windows(4).position(|w| w == b"\x7fELF") {
        let h = i + at;
        if bin.len() > h + 20
            && bin[h + 4] == 2
            && u16::from_le_bytes([bin[h + 18], bin[h + 19]]) == 247
        {
            n += 1;
        }
        i = h + 4;
    }
    n
}

fn stripped(bin: &Path, dir: &Path, name: &str) -> Vec<u8> {
    let out = dir.join(name);
    let st = Command::new("strip")
        .arg("-o")
        .arg(&out)
        .arg(bin)
        .status()
        .expect("strip");
    assert!(st.success(), "strip {}", bin.display());
    std::fs::read(out).unwrap()
}

fn no_plugins_init(test: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(NO_PLUGINS_INIT);
    let missing = (!p.exists()).then(|| {
        format!(
            "{} (scripts/test.sh builds it: cargo build -p allox-init --no-default-features, copied there)",
            p.display()
        )
    });
    needs(test, missing).then_some(p)
}

#[test]
fn a_build_without_plugins_has_no_bpf_object_or_plugin_code_and_serves_the_core() {
    let name =
        "no_plugins::a_build_without_plugins_has_no_bpf_object_or_plugin_code_and_serves_the_core";
    if !require(name) {
        return;
    }
    let Some(none) = no_plugins_init(name) else {
        return;
    };
    let missing =
        allox_integration::which("strip").map_or(Some("strip (binutils)".to_string()), |_| None);
    if !needs(name, missing) {
        return;
    }
    // The workspace's own build, with every plugin: what the checks find
    // there shows they can find it.
    let all = workspace_bin("alloxctl").with_file_name("allox-init");
    let d = ProcDaemon::start_exe("no_plugins", &none, &[]);
    let scratch = d.fs.scratch().to_path_buf();
    let (with, without) = (
        stripped(&all, &scratch, "all"),
        stripped(&none, &scratch, "none"),
    );
    assert!(
        bpf_objects(&with) >= 1,
        "the check finds no BPF object in the default build"
    );
    assert_eq!(
        bpf_objects(&without),
        0,
        "a BPF object in the build without plugins"
    );
    for m in PLUGIN_MARKERS {
        let has = |b: &[u8]| b.windows(m.len()).any(|w| w == m.as_bytes());
        assert!(has(&with), "the default build lacks {m:?}");
        assert!(!has(&without), "the build without plugins holds {m:?}");
    }
    println!(
        "stripped allox-init: {} bytes with every plugin, {} without ({:.0}%)",
        with.len(),
        without.len(),
        100.0 * without.len() as f64 / with.len() as f64
    );

    // plugin.list: nothing loaded, nothing installed.
    match call(&d, Request::PluginList(PluginListRequest {})) {
        Ok(Response::Plugins(l)) => {
            assert!(l.loaded.is_empty() && l.installed.is_empty(), "{l:?}")
        }
        other => panic!("plugin.list: {other:?}"),
    }
    // A plugin's action: refused, naming the plugin.
    match call(
        &d,
        Request::ProcessEvents(ProcessEvents {
            agent_id: Some("a".into()),
            ..Default::default()
        }),
    ) {
        Err(e) => assert!(e.message.contains("process-tree"), "{e:?}"),
        other => panic!("process.events: {other:?}"),
    }
    // `--plugin share` stops the start, naming the build.
    let other = d.fs.path().join("other");
    let cg = allox_integration::cgroup2_mount()
        .expect("cgroup2")
        .join(format!("allox-test-no-plugins-{}", std::process::id()));
    std::fs::create_dir_all(&cg).unwrap();
    std::fs::create_dir(&other).unwrap();
    let out = Command::new(&none)
        .arg("supervise")
        .arg("--root")
        .arg(&other)
        .arg("--listen")
        .arg(format!("unix:{}", scratch.join("other.sock").display()))
        .arg("--cgroup-root")
        .arg(&cg)
        .args(["--plugin", "share"])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir(&cg);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("plugin share is not built into this allox-init"),
        "{err}"
    );

    // The core: an agent, a session, a run, files, a checkpoint, a
    // rollback, a diff, a fork, the metrics (no plugin family).
    allox_integration::make_sessions(&d, &[("a", "s")]);
    let ran = call(
        &d,
        Request::ProcessStart(allox_integration::process_start(
            "a",
            "s",
            &["/bin/sh", "-c", "echo one > f; cat f"],
        )),
    );
    match ran {
        Ok(Response::Exited(r)) => assert_eq!((r.exit_code, r.stdout.as_str()), (Some(0), "one\n")),
        other => panic!("process.start: {other:?}"),
    }
    let ck = |id: &str| {
        call(
            &d,
            Request::CheckpointCreate(CheckpointCreate {
                agent_id: "a".into(),
                session_id: "s".into(),
                checkpoint_id: id.into(),
                pinned: false,
                label: None,
            }),
        )
        .expect("checkpoint.create")
    };
    ck("c1");
    let (code, _, err) = allox_integration::alloxctl(
        &d.daemon.socket,
        &["exec", "a", "s", "--", "/bin/sh", "-c", "echo two > f"],
    );
    assert_eq!(code, 0, "{err}");
    ck("c2");
    let (code, out, err) =
        allox_integration::alloxctl(&d.daemon.socket, &["diff", "a", "s", "c1", "c2"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        String::from_utf8_lossy(&out).contains('f'),
        "{}",
        String::from_utf8_lossy(&out)
    );
    call(
        &d,
        Request::SessionRollback(SessionRollback {
            agent_id: "a".into(),
            session_id: "s".into(),
            checkpoint_id: "c1".into(),
            kill_processes: None,
        }),
    )
    .expect("session.rollback");
    let (code, out, err) =
        allox_integration::alloxctl(&d.daemon.socket, &["exec", "a", "s", "--", "cat", "f"]);
    assert_eq!(
        (code, String::from_utf8_lossy(&out).as_ref()),
        (0, "one\n"),
        "{err}"
    );
    let (code, _, err) = allox_integration::alloxctl(
        &d.daemon.socket,
        &["session", "fork", "a", "s", "t", "--from", "c2"],
    );
    assert_eq!(code, 0, "{err}");
    match call(&d, Request::SystemMetrics(SystemMetricsRequest {})) {
        Ok(Response::Metrics(m)) => {
            assert!(
                m.text.contains("allox_sessions{state=\"active\"} 2"),
                "{}",
                m.text
            );
            for family in ["allox_network_", "allox_tracker_", "allox_observer_"] {
                assert!(!m.text.contains(family), "{family} in\n{}", m.text);
            }
        }
        other => panic!("system.metrics: {other:?}"),
    }
}
