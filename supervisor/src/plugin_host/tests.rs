//! The core's rules with fake plugins behind the trait: conflicts named by
//! both plugins, the API version, start and stop order (a failure in
//! plugin k of n stops k−1…1), and an empty merge when nothing is enabled.

use super::*;
use crate::plugin_api::{
    Contribution, Core, Manifest, Plugin, PluginError, RunRef, SessionDir, SessionNetwork,
    Settings, WriteWithin, API_VERSION,
};
#[cfg(any(feature = "network", feature = "process-tree"))]
use crate::plugins::installed;
use crate::plugins::installed_names;
#[cfg(any(feature = "network", feature = "process-tree"))]
use allox_protocol::Request;
use allox_protocol::{ErrorBody, FsData, FsEntry, FsListing, FsWritten, Route};
use allox_sandbox::spec::Bind;
use allox_store::failpoint::Failpoints;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

type Log = Arc<Mutex<Vec<String>>>;

/// How a fake's start goes.
#[derive(Clone, Copy, PartialEq)]
enum Start {
    Ok,
    Fail,
    Panic,
}

struct Fake {
    manifest: Manifest,
    log: Log,
    start: Start,
    refuse_runs: bool,
    contribution: Contribution,
    /// Routes it serves from inside sandboxes; it answers with who called.
    guest: &'static [&'static str],
    /// Plugins it stands in for.
    stands_in: &'static [&'static str],
}

impl Plugin for Fake {
    fn manifest(&self) -> &Manifest {
        &self.manifest
    }
    fn stands_in_for(&self) -> &'static [&'static str] {
        self.stands_in
    }
    fn start(&self, _: &Settings) -> Result<(), PluginError> {
        self.log
            .lock()
            .unwrap()
            .push(format!("start {}", self.manifest.name));
        match self.start {
            Start::Ok => Ok(()),
            Start::Fail => Err(PluginError::Start {
                plugin: self.manifest.name,
                alias: None,
                source: "injected".into(),
            }),
            Start::Panic => panic!("injected panic"),
        }
    }
    fn stop(&self) {
        self.log
            .lock()
            .unwrap()
            .push(format!("stop {}", self.manifest.name));
    }
    fn contribute(&self, _: &RunRef<'_>) -> Contribution {
        self.contribution.clone()
    }
    fn before_run(&self, _: &RunRef<'_>, _: u64) -> Result<(), PluginError> {
        self.log
            .lock()
            .unwrap()
            .push(format!("before {}", self.manifest.name));
        if self.refuse_runs {
            return Err(PluginError::Run {
                plugin: self.manifest.name,
                source: "no".into(),
            });
        }
        Ok(())
    }
    fn after_run(&self, _: &RunRef<'_>) {
        self.log
            .lock()
            .unwrap()
            .push(format!("after {}", self.manifest.name));
    }
    fn sandbox_routes(&self) -> &'static [&'static str] {
        self.guest
    }
    fn sandbox_call(
        &self,
        _core: &dyn Core,
        caller: &allox_protocol::sandbox_api::SandboxCaller,
        route: &str,
        params: &str,
    ) -> Result<String, allox_protocol::ErrorBody> {
        Ok(format!(
            "{} {route} {}/{}/{} {params}",
            self.manifest.name, caller.agent_id, caller.session_id, caller.run_id
        ))
    }
}

fn manifest(name: &'static str) -> Manifest {
    Manifest {
        name,
        api_version: API_VERSION,
        conflicts: &[],
        alias: None,
        summary: "",
    }
}

fn fake(log: &Log, m: Manifest) -> Fake {
    Fake {
        manifest: m,
        log: log.clone(),
        start: Start::Ok,
        refuse_runs: false,
        contribution: Contribution::default(),
        guest: &[],
        stands_in: &[],
    }
}

fn load(plugins: Vec<Fake>, enabled: &[&str]) -> Result<Plugins, PluginHostError> {
    load_with(plugins, enabled, &[])
}

fn load_with(
    plugins: Vec<Fake>,
    enabled: &[&str],
    table: &[(&'static str, Route)],
) -> Result<Plugins, PluginHostError> {
    let installed: Vec<Arc<dyn Plugin>> = plugins
        .into_iter()
        .map(|p| Arc::new(p) as Arc<dyn Plugin>)
        .collect();
    let enabled: Vec<String> = enabled.iter().map(|s| s.to_string()).collect();
    let system: Vec<PathBuf> = ["/usr", "/etc"].iter().map(PathBuf::from).collect();
    Plugins::load(installed, &enabled, table, &system, Failpoints::default())
}

fn settings() -> Settings {
    Settings {
        state_dir: PathBuf::from("/nonexistent"),
        process_events_max: 10,
        monitor: Default::default(),
        network: Default::default(),
        audit: Default::default(),
        effects: Default::default(),
        metrics: Default::default(),
        store: None,
    }
}

fn with(log: &Log, name: &'static str, c: Contribution) -> Fake {
    Fake {
        contribution: c,
        ..fake(log, manifest(name))
    }
}

fn env(k: &str) -> Contribution {
    Contribution {
        env: vec![(k.into(), "v".into())],
        ..Contribution::default()
    }
}

fn bind(dst: &str) -> Contribution {
    Contribution {
        binds: vec![Bind {
            src: "/host".into(),
            dst: dst.into(),
            writable: false,
        }],
        ..Contribution::default()
    }
}

fn err(plugins: Vec<Fake>, enabled: &[&str]) -> String {
    allox_protocol::error_chain(&load(plugins, enabled).expect_err("refused"))
}

#[test]
fn nothing_enabled_loads_nothing_and_contributes_nothing() {
    let log = Log::default();
    let p = load(
        vec![with(&log, "a", env("A")), with(&log, "b", bind("/run/b"))],
        &[],
    )
    .unwrap();
    assert!(p.is_empty());
    assert!(p.names().is_empty());
    let run = RunRef {
        agent: "a",
        session: "s",
        run: "r",
        network: &SessionNetwork::default(),
    };
    assert_eq!(p.contributions(&run).unwrap(), Contribution::default());
    p.start(&settings()).unwrap();
    p.before_run(&run, 1).unwrap();
    p.stop();
    assert!(log.lock().unwrap().is_empty(), "{:?}", log.lock().unwrap());
    let l = p.listing();
    assert!(l.loaded.is_empty());
    assert_eq!(l.installed.len(), 2);
    assert!(l.installed.iter().all(|i| !i.enabled));
}

#[test]
#[cfg(feature = "network")]
fn each_plugin_s_routes_are_the_table_s_lines_naming_it_in_table_order() {
    let p = Plugins::load(
        installed(),
        &["network".to_string()],
        Request::ROUTES,
        &[],
        Failpoints::default(),
    )
    .unwrap();
    assert_eq!(
        p.routes_of("network"),
        [
            "network.policy.set",
            "network.policy.get",
            "network.audit",
            "secret.set",
            "secret.list",
            "secret.delete"
        ]
    );
    assert_eq!(
        p.routes_of("share"),
        ["share.list", "share.agent.set", "share.session.set"]
    );
    assert_eq!(p.listing().loaded[0].routes, p.routes_of("network"));
    assert!(p.routes_of("nobody").is_empty());
}

#[test]
#[cfg(feature = "process-tree")]
fn the_real_installed_plugins_contribute_nothing_unless_enabled() {
    let p = Plugins::load(
        installed(),
        &[],
        Request::ROUTES,
        &[],
        Failpoints::default(),
    )
    .unwrap();
    let run = RunRef {
        agent: "a",
        session: "s",
        run: "r",
        network: &SessionNetwork::default(),
    };
    assert_eq!(p.contributions(&run).unwrap(), Contribution::default());
    assert!(installed_names().contains(&"process-tree"));
}

#[test]
fn contributions_merge_in_load_order_with_metadata_under_the_plugin_s_name() {
    let log = Log::default();
    let a = Contribution {
        prefix: vec!["/usr/bin/wrap".into()],
        metadata: vec![("k".into(), "1".into())],
        ..env("A")
    };
    let b = Contribution {
        metadata: vec![("k".into(), "2".into())],
        ..bind("/run/b")
    };
    let p = load(vec![with(&log, "a", a), with(&log, "b", b)], &["b", "a"]).unwrap();
    assert_eq!(p.names(), ["b", "a"]);
    let m = p
        .contributions(&RunRef {
            agent: "x",
            session: "y",
            run: "z",
            network: &SessionNetwork::default(),
        })
        .unwrap();
    assert_eq!(m.prefix, ["/usr/bin/wrap"]);
    assert_eq!(m.env, [("A".to_string(), "v".to_string())]);
    assert_eq!(m.binds[0].dst, "/run/b");
    assert_eq!(
        m.metadata,
        [
            ("b.k".to_string(), "2".to_string()),
            ("a.k".to_string(), "1".to_string())
        ]
    );
}

#[test]
fn the_same_env_key_mount_target_route_or_a_second_prefix_names_both_plugins() {
    let log = Log::default();
    assert_eq!(
        err(
            vec![with(&log, "a", env("X")), with(&log, "b", env("X"))],
            &["a", "b"]
        ),
        "plugins a and b both contribute environment variable X"
    );
    assert_eq!(
        err(
            vec![
                with(&log, "a", bind("/run/s")),
                with(&log, "b", bind("/run/s"))
            ],
            &["a", "b"]
        ),
        "plugins a and b both contribute mount target /run/s"
    );
    assert!(err(
        vec![
            with(&log, "a", bind("/run")),
            with(&log, "b", bind("/run/s"))
        ],
        &["a", "b"]
    )
    .starts_with("plugins a and b both contribute mount targets /run and /run/s"));
    let prefix = || Contribution {
        prefix: vec!["/usr/bin/x".into()],
        ..Contribution::default()
    };
    assert_eq!(
        err(
            vec![with(&log, "a", prefix()), with(&log, "b", prefix())],
            &["b", "a"]
        ),
        "plugins b and a both contribute a command prefix"
    );
    // Nothing was started on the way.
    assert!(log.lock().unwrap().is_empty());
}

#[test]
fn declared_conflicts_name_both_plugins_whichever_side_declares() {
    let log = Log::default();
    let a = || {
        fake(
            &log,
            Manifest {
                conflicts: &["b"],
                ..manifest("a")
            },
        )
    };
    let b = || fake(&log, manifest("b"));
    assert_eq!(
        err(vec![a(), b()], &["a", "b"]),
        "plugins a and b cannot be loaded together (a declares the conflict)"
    );
    assert_eq!(
        err(vec![a(), b()], &["b", "a"]),
        "plugins b and a cannot be loaded together (a declares the conflict)"
    );
    // Installed together is fine; only loading both is refused.
    assert!(load(vec![a(), b()], &["a"]).is_ok());
}

#[test]
fn another_api_version_an_unknown_name_a_bad_route_or_mount_are_refused_by_name() {
    let log = Log::default();
    let old = fake(
        &log,
        Manifest {
            api_version: 2,
            ..manifest("old")
        },
    );
    assert_eq!(
        err(vec![old], &["old"]),
        "plugin old is written for plugin API v2; this supervisor implements v1"
    );
    assert_eq!(
        err(
            vec![fake(&log, manifest("a")), fake(&log, manifest("b"))],
            &["nope"]
        ),
        "unknown plugin \"nope\"; installed: a, b"
    );
    let table = [("process.events", Route::Plugin("nobody"))];
    assert_eq!(
        allox_protocol::error_chain(
            &load_with(vec![fake(&log, manifest("r"))], &["r"], &table).expect_err("refused")
        ),
        "the request table gives process.events to plugin nobody, which is not installed (installed: r)"
    );
    let e = err(vec![with(&log, "m", bind("/allox/session/x"))], &["m"]);
    assert!(
        e.starts_with(
            "plugin m contributes a mount the sandbox refuses: bind target \"/allox/session/x\""
        ),
        "{e}"
    );
    let e = err(vec![with(&log, "m", bind("/usr/x"))], &["m"]);
    assert!(e.contains("/usr"), "{e}");
}

/// n plugins `p1`…`pn`, the k-th (from 1) starting as `how`.
fn chain(log: &Log, n: usize, k: usize, how: Start) -> Plugins {
    const NAMES: [&str; 5] = ["p1", "p2", "p3", "p4", "p5"];
    let fakes = (1..=n)
        .map(|i| Fake {
            start: if i == k { how } else { Start::Ok },
            ..fake(log, manifest(NAMES[i - 1]))
        })
        .collect();
    load(fakes, &NAMES[..n]).unwrap()
}

#[test]
fn a_start_failure_in_plugin_k_stops_k_minus_1_to_1_in_that_order() {
    for how in [Start::Fail, Start::Panic] {
        for k in 1..=4 {
            let log = Log::default();
            let p = chain(&log, 4, k, how);
            let e = p.start(&settings()).unwrap_err();
            assert!(e.to_string().starts_with(&format!("plugin p{k} ")), "{e}");
            let mut want: Vec<String> = (1..=k).map(|i| format!("start p{i}")).collect();
            want.extend((1..k).rev().map(|i| format!("stop p{i}")));
            assert_eq!(*log.lock().unwrap(), want, "k = {k}");
            // Nothing is left to stop.
            p.stop();
            assert_eq!(*log.lock().unwrap(), want);
        }
    }
}

#[test]
fn plugins_start_in_load_order_and_stop_in_the_reverse_once() {
    let log = Log::default();
    let p = Arc::new(chain(&log, 3, 0, Start::Ok));
    {
        let _running = p.start_guarded(&settings()).unwrap();
        assert_eq!(*log.lock().unwrap(), ["start p1", "start p2", "start p3"]);
    }
    p.stop();
    assert_eq!(
        *log.lock().unwrap(),
        ["start p1", "start p2", "start p3", "stop p3", "stop p2", "stop p1"]
    );
}

#[test]
fn a_run_refused_by_plugin_k_is_released_by_the_ones_before_in_reverse() {
    let log = Log::default();
    let fakes = vec![
        fake(&log, manifest("a")),
        fake(&log, manifest("b")),
        Fake {
            refuse_runs: true,
            ..fake(&log, manifest("c"))
        },
    ];
    let p = load(fakes, &["a", "b", "c"]).unwrap();
    let run = RunRef {
        agent: "x",
        session: "y",
        run: "z",
        network: &SessionNetwork::default(),
    };
    let e = p.before_run(&run, 7).unwrap_err();
    assert_eq!(e.to_string(), "plugin c refused the run");
    assert_eq!(
        *log.lock().unwrap(),
        ["before a", "before b", "before c", "after b", "after a"]
    );
    log.lock().unwrap().clear();
    p.after_run(&run);
    assert_eq!(*log.lock().unwrap(), ["after c", "after b", "after a"]);
}

#[test]
fn every_installed_plugin_has_a_start_failpoint() {
    for name in installed_names() {
        let point = format!("plugin_start.{name}");
        assert!(
            allox_store::failpoint::PLUGIN_STARTS.contains(&point.as_str()),
            "{point} is not declared"
        );
    }
}

/// A core with no sessions.
struct NoCore;

impl Core for NoCore {
    fn session_created(&self, a: &str, s: &str) -> Result<u64, allox_protocol::ErrorBody> {
        Err(allox_protocol::ErrorBody::new(
            allox_protocol::ErrorCode::NotFound,
            format!("no session {a}/{s}"),
        ))
    }
    fn sessions_of(&self, _: &str) -> Vec<(String, u64)> {
        Vec::new()
    }
    fn relative_path(&self, _: &str) -> Result<String, ErrorBody> {
        unreachable!("no files")
    }
    fn stat_within(&self, _: &SessionDir<'_>, _: &str) -> Result<FsEntry, ErrorBody> {
        unreachable!("no files")
    }
    fn list_within(
        &self,
        _: &SessionDir<'_>,
        _: &str,
        _: Option<u32>,
    ) -> Result<FsListing, ErrorBody> {
        unreachable!("no files")
    }
    fn read_within(
        &self,
        _: &SessionDir<'_>,
        _: &str,
        _: Option<u64>,
        _: Option<u64>,
    ) -> Result<(FsData, u64), ErrorBody> {
        unreachable!("no files")
    }
    fn write_within(&self, _: &SessionDir<'_>, _: WriteWithin) -> Result<FsWritten, ErrorBody> {
        unreachable!("no files")
    }
}

#[test]
fn a_guest_route_goes_to_its_plugin_with_the_caller_s_identity() {
    let log = Log::default();
    let fakes = vec![
        fake(&log, manifest("a")),
        Fake {
            guest: &["net.connect"],
            ..fake(&log, manifest("b"))
        },
    ];
    let p = load(fakes, &["a", "b"]).unwrap();
    let caller = allox_protocol::sandbox_api::SandboxCaller {
        agent_id: "ag".into(),
        session_id: "se".into(),
        run_id: "r1".into(),
    };
    assert_eq!(
        p.sandbox_call(&NoCore, &caller, "net.connect", "{}"),
        Some(Ok("b net.connect ag/se/r1 {}".into()))
    );
    assert_eq!(p.sandbox_call(&NoCore, &caller, "share.read", "{}"), None);
    // A plugin installed but not enabled serves nothing.
    let fakes = vec![Fake {
        guest: &["net.connect"],
        ..fake(&log, manifest("b"))
    }];
    let none = load(fakes, &[]).unwrap();
    assert_eq!(
        none.sandbox_call(&NoCore, &caller, "net.connect", "{}"),
        None
    );
}

#[test]
fn two_plugins_with_one_guest_route_name_both() {
    let log = Log::default();
    let fakes = vec![
        Fake {
            guest: &["x.y"],
            ..fake(&log, manifest("a"))
        },
        Fake {
            guest: &["x.y"],
            ..fake(&log, manifest("b"))
        },
    ];
    let e = err(fakes, &["a", "b"]);
    assert!(
        e.contains("a") && e.contains("b") && e.contains("guest route x.y"),
        "{e}"
    );
}

#[test]
fn a_plugin_standing_in_for_another_answers_its_actions_only_while_it_is_not_loaded() {
    let log = Log::default();
    let table = [("process.events", Route::Plugin("owner"))];
    let both = || {
        vec![
            fake(&log, manifest("owner")),
            Fake {
                stands_in: &["owner"],
                ..fake(&log, manifest("stand"))
            },
        ]
    };
    let p = load_with(both(), &["stand"], &table).unwrap();
    assert_eq!(p.owner("process.events").unwrap().manifest().name, "stand");
    assert_eq!(p.routes_of("stand"), ["process.events"]);
    assert!(p.routes_of("owner").is_empty());
    // The owner loaded: its own actions are its.
    let p = load_with(both(), &["owner", "stand"], &table).unwrap();
    assert_eq!(p.owner("process.events").unwrap().manifest().name, "owner");
    // Neither loaded: the action names the owner to enable.
    let p = load_with(both(), &[], &table).unwrap();
    let e = p.owner("process.events").err().expect("not enabled");
    assert!(e.to_string().contains("owner"), "{e}");
    // A plugin that stands in for nobody does not answer.
    let p = load_with(
        vec![fake(&log, manifest("owner")), fake(&log, manifest("other"))],
        &["other"],
        &table,
    )
    .unwrap();
    assert!(p.owner("process.events").is_err());
}
