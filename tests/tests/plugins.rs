//! Plugins through the real daemon: with every plugin compiled in and none
//! enabled a run's sandbox is exactly what it was before plugins existed;
//! `plugin.list`, `system.info` and `alloxctl plugins` show what is loaded;
//! an unknown name or a failing start stops the daemon naming the plugin;
//! `--plugin process-tree` is the process tracker.

use allox_integration::{call, needs, require, workspace_bin, ProcDaemon};
use allox_protocol::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

fn setup(d: &ProcDaemon) {
    call(d, Request::AgentCreate(AgentCreate::new("a"))).unwrap();
    call(d, Request::SessionCreate(SessionCreate::new("a", "s"))).unwrap();
}

fn start(script: &str, wait: bool) -> Request {
    Request::ProcessStart(ProcessStart {
        agent_id: "a".into(),
        session_id: "s".into(),
        argv: ["/bin/sh", "-c", script]
            .iter()
            .map(|x| x.to_string())
            .collect(),
        env: BTreeMap::new(),
        cwd: None,
        stdin: Some(Default::default()),
        timeout_ms: None,
        wait,
        stream: false,
        pty: None,
        trace: None,
        on_disconnect: Default::default(),
        recovery: None,
    })
}

/// What a run sees: its environment (sorted, the run id masked), the
/// mount points with their options, and its seccomp state.
fn sandbox_view(d: &ProcDaemon) -> (Vec<String>, Vec<String>, Vec<String>) {
    let script =
        "env; echo ---; cat /proc/self/mountinfo; echo ---; grep Seccomp /proc/self/status";
    let Ok(Response::Exited(r)) = call(d, start(script, true)) else {
        panic!("the run failed");
    };
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    let mut parts = r.stdout.split("---\n");
    let mut env: Vec<String> = parts
        .next()
        .unwrap()
        .lines()
        .map(|l| match l.split_once('=') {
            Some(("ALLOX_RUN_ID", _)) => "ALLOX_RUN_ID=*".to_string(),
            _ => l.to_string(),
        })
        .collect();
    env.sort();
    // Mount point and its options (fields 5 and 6), in mount order.
    let mounts = parts
        .next()
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            format!("{} {}", f[4], f[5])
        })
        .collect();
    let seccomp = parts.next().unwrap().lines().map(str::to_string).collect();
    (env, mounts, seccomp)
}

/// The view captured from the code before plugins existed, on a host
/// whose system directories are those that exist here, plus what the core
/// gives every run since: the in-sandbox interface (its directory last on
/// `PATH`, its socket, client and Python entry points bound last), and the
/// sandbox's own user database over the files of the host's /etc.
fn expected_view() -> (Vec<String>, Vec<String>, Vec<String>) {
    let mut env: Vec<String> = [
        "ALLOX_AGENT_ID=a",
        "ALLOX_AGENT_SHARED=/allox/shared",
        "ALLOX_AGENT_WORKSPACE=/allox",
        "ALLOX_RUN_ID=*",
        "ALLOX_SESSION_ID=s",
        "HOME=/allox/session",
        "LANG=C.UTF-8",
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/run/allox/bin",
        "PWD=/allox/session",
        "TMPDIR=/tmp",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    env.sort();
    let mut mounts = vec!["/ ro,nosuid,nodev,relatime".to_string()];
    // The system directories that are directories here (symlinks are
    // recreated, not mounted).
    for dir in [
        "/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/etc", "/opt",
    ] {
        let real = std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir());
        if real {
            mounts.push(format!("{dir} ro,nosuid,nodev,relatime"));
        }
    }
    if std::fs::symlink_metadata("/etc").is_ok_and(|m| m.is_dir()) {
        for f in ["/etc/passwd", "/etc/group", "/etc/nsswitch.conf"] {
            if std::fs::symlink_metadata(f).is_ok_and(|m| m.is_file()) {
                mounts.push(format!("{f} ro,nosuid,nodev,relatime"));
            }
        }
    }
    mounts.extend(
        [
            "/proc rw,nosuid,nodev,noexec,relatime",
            "/dev ro,nosuid,noexec,relatime",
            "/dev/null rw,relatime",
            "/dev/zero rw,relatime",
            "/dev/full rw,relatime",
            "/dev/random rw,relatime",
            "/dev/urandom rw,relatime",
            "/dev/tty rw,relatime",
            "/dev/pts rw,nosuid,noexec,relatime",
            "/dev/shm rw,nosuid,nodev,relatime",
            "/tmp rw,nosuid,nodev,relatime",
            "/allox/session rw,nosuid,nodev,relatime",
            "/allox/shared rw,nosuid,nodev,relatime",
            "/run/allox/bin/allox ro,nosuid,nodev,relatime",
            "/run/allox/guest ro,nosuid,nodev,relatime",
            "/run/allox/turn.py ro,nosuid,nodev,relatime",
            "/run/allox/whoami.py ro,nosuid,nodev,relatime",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    let seccomp = vec!["Seccomp:\t2".to_string(), "Seccomp_filters:\t1".to_string()];
    (env, mounts, seccomp)
}

/// Whether the host has system directories with mounts nested inside
/// (their submounts would show in the sandbox too, beyond the list).
fn nested_system_mounts() -> bool {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mi.lines().any(|l| {
        let mp = l.split(' ').nth(4).unwrap_or("");
        ["/usr/", "/etc/", "/opt/"]
            .iter()
            .any(|d| mp.starts_with(d))
    })
}

#[test]
fn with_none_enabled_a_run_s_environment_mounts_and_seccomp_are_as_before_plugins() {
    if !require("plugins::with_none_enabled_a_run_is_as_before") {
        return;
    }
    let plain = ProcDaemon::start("plugins-plain", &[]);
    let off = ProcDaemon::start("plugins-off", &["--process-tracker", "off"]);
    setup(&plain);
    setup(&off);
    let a = sandbox_view(&plain);
    let b = sandbox_view(&off);
    assert_eq!(a, b, "no flag and nothing enabled differ");
    let want = expected_view();
    assert_eq!(a.0, want.0, "environment");
    assert_eq!(a.2, want.2, "seccomp");
    if !nested_system_mounts() {
        // As sets: the order of mountinfo's lines follows the order of
        // mounting, which the session context changed (the workspace and
        // the binds are detached copies made first).
        let sorted = |v: &[String]| {
            let mut v = v.to_vec();
            v.sort();
            v
        };
        assert_eq!(sorted(&a.1), sorted(&want.1), "mounts");
    }
    // Nothing loaded, everything installed shown as not enabled.
    let Ok(Response::Plugins(l)) = call(&plain, Request::PluginList(PluginListRequest {})) else {
        panic!("plugin.list");
    };
    assert!(l.loaded.is_empty(), "{l:?}");
    let tree = l.installed.iter().find(|p| p.name == "process-tree");
    assert!(
        tree.is_some_and(|p| !p.enabled && p.api_version == 1),
        "{l:?}"
    );
    let Ok(Response::System(i)) = call(&plain, Request::SystemInfo(SystemInfoRequest {})) else {
        panic!("system.info");
    };
    assert!(i.plugins.is_empty());
    let out = alloxctl(&plain.daemon.socket, &["plugins"]);
    assert!(out.starts_with("no plugins loaded\n"), "{out}");
    assert!(
        out.lines().any(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.len() > 3 && w[..3] == ["process-tree", "v1", "no"]
        }),
        "{out}"
    );
    let out = alloxctl(&plain.daemon.socket, &["info"]);
    assert!(out.contains("plugins:         none\n"), "{out}");
}

fn alloxctl(socket: &Path, args: &[&str]) -> String {
    let out = Command::new(workspace_bin("alloxctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .expect("run alloxctl");
    assert!(out.status.success(), "alloxctl {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// Starts the daemon expecting it to refuse: its exit status, its
/// standard error, and whether its socket was left behind.
fn refused_start(name: &str, env: &[(&str, &str)], args: &[&str]) -> (Option<i32>, String, bool) {
    let fs = allox_integration::BtrfsFs::new(256).unwrap();
    let root = fs.path().join("store");
    std::fs::create_dir(&root).unwrap();
    let cg = allox_integration::cgroup2_mount()
        .unwrap()
        .join(format!("allox-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&cg).unwrap();
    let sock = fs.scratch().join("ctl.sock");
    let exe = workspace_bin("allox-init");
    let out = allox_integration::supervise_command(&exe, &root, &sock, Some(&cg))
        .arg("--sandbox-stage")
        .arg(fs.scratch().join("stage"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run allox-init");
    // Nothing below the daemon's cgroup either.
    let left: Vec<_> = std::fs::read_dir(&cg)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name())
        .collect();
    allox_integration::remove_cgroup_tree(&cg);
    assert!(left.is_empty(), "cgroups left behind: {left:?}");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code(), err, sock.exists())
}

#[test]
fn an_unknown_plugin_stops_the_start_naming_it_and_the_installed_ones() {
    if !require("plugins::an_unknown_plugin_stops_the_start") {
        return;
    }
    let (code, err, listened) = refused_start("nope", &[], &["--plugin", "nope"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("unknown plugin \"nope\"; installed: process-tree, network"),
        "{err}"
    );
    assert!(!listened, "it listened");
}

#[test]
fn an_injected_start_failure_stops_the_daemon_naming_the_plugin_and_leaves_nothing() {
    if !require("plugins::an_injected_start_failure") {
        return;
    }
    let (code, err, listened) = refused_start(
        "failstart",
        &[("ALLOX_FAILPOINTS", "plugin_start.process-tree=panic")],
        &["--plugin", "process-tree"],
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("plugin process-tree (--process-tracker ebpf) panicked while starting"),
        "{err}"
    );
    assert!(!listened, "it listened");
}

#[test]
fn the_network_plugin_s_start_failures_stop_the_daemon_and_leave_nothing() {
    if !require("plugins::the_network_plugin_s_start_failures") {
        return;
    }
    let net = ["--plugin", "network"];
    let (code, err, listened) = refused_start(
        "failnet",
        &[("ALLOX_FAILPOINTS", "plugin_start.network=panic")],
        &net,
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("plugin network panicked while starting"),
        "{err}"
    );
    assert!(!listened, "it listened");
    // Sessions in proxy mode by default, without the plugin that serves
    // them.
    let (code, err, listened) = refused_start("nonet", &[], &["--session-network", "proxy"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("--session-network proxy needs the network plugin"),
        "{err}"
    );
    assert!(!listened, "it listened");
    // A rule that does not read.
    let mut args = net.to_vec();
    args.extend(["--network-allow", "bad host.test"]);
    let (code, err, listened) = refused_start("badrule", &[], &args);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("\"bad host.test\""), "{err}");
    assert!(!listened, "it listened");
}

#[test]
fn plugin_process_tree_is_the_process_tracker_and_plugin_list_shows_it() {
    let name = "plugins::plugin_process_tree_is_the_tracker";
    if !require(name) {
        return;
    }
    let btf = allox_ebpf_probes::KERNEL_BTF;
    let missing = (!Path::new(btf).exists()).then(|| format!("a kernel with BTF ({btf})"));
    if !needs(name, missing) {
        return;
    }
    let d = ProcDaemon::start("plugins-tree", &["--plugin", "process-tree"]);
    setup(&d);
    let Ok(Response::Plugins(l)) = call(&d, Request::PluginList(PluginListRequest {})) else {
        panic!("plugin.list");
    };
    assert_eq!(l.loaded.len(), 1, "{l:?}");
    assert_eq!(l.loaded[0].name, "process-tree");
    assert_eq!(l.loaded[0].api_version, 1);
    assert_eq!(l.loaded[0].routes, ["process.events", "process.tree"]);
    assert!(l
        .installed
        .iter()
        .any(|p| p.name == "process-tree" && p.enabled));
    let Ok(Response::System(i)) = call(&d, Request::SystemInfo(SystemInfoRequest {})) else {
        panic!("system.info");
    };
    assert_eq!(i.plugins, ["process-tree"]);
    // The tracker works: a run's exec is recorded.
    let Ok(Response::Exited(r)) = call(&d, start("/bin/true", true)) else {
        panic!("run");
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let q = ProcessEvents {
            run_id: Some(r.run_id.clone()),
            ..Default::default()
        };
        let Ok(Response::ProcessEvents(l)) = call(&d, Request::ProcessEvents(q)) else {
            panic!("process.events");
        };
        if l.events
            .iter()
            .any(|e| e.filename.as_deref() == Some("/bin/true"))
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no exec event: {l:?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // The plugin's metadata shows with a live run.
    let Ok(Response::Started(bg)) = call(&d, start("sleep 30", false)) else {
        panic!("background run");
    };
    // Listed once the program is up (the sandbox's init is not listed).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let l = loop {
        let Ok(Response::Processes(l)) = call(
            &d,
            Request::ProcessList(SessionRef {
                agent_id: "a".into(),
                session_id: "s".into(),
            }),
        ) else {
            panic!("process.list");
        };
        if !l.processes.is_empty() || std::time::Instant::now() > deadline {
            break l;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(
        l.run_metadata
            .get(&bg.run_id)
            .and_then(|m| m.get("process-tree.tracked"))
            .map(String::as_str),
        Some("ebpf"),
        "{l:?}"
    );
    let out = alloxctl(&d.daemon.socket, &["plugins"]);
    assert!(out.contains("1  process-tree  v1"), "{out}");
    let out = alloxctl(&d.daemon.socket, &["info"]);
    assert!(out.contains("plugins:         process-tree\n"), "{out}");
}

/// A store on a loop-backed Btrfs of its own (kept while `fs` lives).
fn store_on_btrfs() -> (allox_integration::BtrfsFs, allox_store::Store) {
    let fs = allox_integration::BtrfsFs::new(256).unwrap();
    let root = fs.path().join("store");
    std::fs::create_dir(&root).unwrap();
    let store = allox_store::Store::open(&root, Default::default()).unwrap();
    (fs, store)
}

/// A plugin contributing one of everything, for the test below.
struct Contributes {
    dir: std::path::PathBuf,
    file: std::path::PathBuf,
}

static CONTRIBUTES: allox_supervisor::plugin_api::Manifest =
    allox_supervisor::plugin_api::Manifest {
        name: "contributes",
        api_version: allox_supervisor::plugin_api::API_VERSION,
        conflicts: &[],
        alias: None,
        summary: "test",
    };

impl allox_supervisor::plugin_api::Plugin for Contributes {
    fn manifest(&self) -> &allox_supervisor::plugin_api::Manifest {
        &CONTRIBUTES
    }
    fn start(
        &self,
        _: &allox_supervisor::plugin_api::Settings,
    ) -> Result<(), allox_supervisor::plugin_api::PluginError> {
        Ok(())
    }
    fn stop(&self) {}
    fn contribute(
        &self,
        _: &allox_supervisor::plugin_api::RunRef<'_>,
    ) -> allox_supervisor::plugin_api::Contribution {
        use allox_sandbox::spec::Bind;
        allox_supervisor::plugin_api::Contribution {
            prefix: vec!["/usr/bin/env".into(), "FROM_PREFIX=p".into()],
            env: vec![("PLUGIN_VAR".into(), "v".into())],
            binds: vec![
                Bind {
                    src: self.dir.clone(),
                    dst: "/run/plugin/ro".into(),
                    writable: false,
                },
                Bind {
                    src: self.file.clone(),
                    dst: "/run/plugin/rw.txt".into(),
                    writable: true,
                },
            ],
            metadata: vec![("k".into(), "1".into())],
        }
    }
}

#[test]
fn a_plugin_s_prefix_env_and_binds_reach_the_sandbox_in_order() {
    use allox_supervisor::plugin_api::Plugin;
    use allox_supervisor::plugin_host::Plugins;
    use allox_supervisor::runs::{Runs, RunsConfig, SessionPaths};
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Arc;
    if !require("plugins::a_plugin_s_prefix_env_and_binds_reach_the_sandbox") {
        return;
    }
    let (fs, store) = store_on_btrfs();
    store.agent_create("a").unwrap();
    let info = store.session_create("a", "s").unwrap();
    let dir = fs.scratch().join("ro");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("hello"), "from the host\n").unwrap();
    // Writable by anyone: only the read-only mount keeps the run out.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let file = fs.scratch().join("rw.txt");
    std::fs::write(&file, "").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
    let cg = allox_integration::cgroup2_mount()
        .unwrap()
        .join(format!("allox-test-{}-binds", std::process::id()));
    std::fs::create_dir_all(&cg).unwrap();
    let mut rc = RunsConfig::new(
        cg.clone(),
        workspace_bin("allox-init"),
        fs.scratch().join("stage"),
    );
    let plugin: Arc<dyn Plugin> = Arc::new(Contributes {
        dir: dir.clone(),
        file: file.clone(),
    });
    rc.plugins = Arc::new(
        Plugins::load(
            vec![plugin],
            &["contributes".to_string()],
            // It serves no action.
            &[],
            &rc.system_dirs,
            Default::default(),
        )
        .unwrap(),
    );
    let runs = Arc::new(Runs::new(rc).unwrap());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let script = "echo \"$PLUGIN_VAR $FROM_PREFIX\"; cat /run/plugin/ro/hello; \
                  echo written > /run/plugin/rw.txt; \
                  touch /run/plugin/ro/x 2>/dev/null && echo ro-writable || echo ro-refused; \
                  awk '{print $5}' /proc/self/mountinfo | grep -E '^/(allox/shared|run/plugin)'";
    let Request::ProcessStart(req) = start(script, true) else {
        unreachable!()
    };
    let paths = SessionPaths {
        current: info.current.clone().into(),
        shared: store.layout().shared("a"),
        network: Default::default(),
    };
    let r = rt.block_on(runs.start(&req, paths, None));
    let _ = std::fs::write(cg.join("cgroup.kill"), "1");
    std::thread::sleep(std::time::Duration::from_millis(200));
    allox_integration::remove_cgroup_tree(&cg);
    let Ok(Response::Exited(r)) = r else {
        panic!("{r:?}");
    };
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert_eq!(
        r.stdout,
        "v p\nfrom the host\nro-refused\n/allox/shared\n/run/plugin/ro\n/run/plugin/rw.txt\n",
        "{r:?}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "written\n");
    assert!(!dir.join("x").exists());
}

/// A plugin answering whatever the table gives it with its name.
struct Answers;

static ANSWERS: allox_supervisor::plugin_api::Manifest = allox_supervisor::plugin_api::Manifest {
    name: "answers",
    api_version: allox_supervisor::plugin_api::API_VERSION,
    conflicts: &[],
    alias: None,
    summary: "test",
};

impl allox_supervisor::plugin_api::Plugin for Answers {
    fn manifest(&self) -> &allox_supervisor::plugin_api::Manifest {
        &ANSWERS
    }
    fn start(
        &self,
        _: &allox_supervisor::plugin_api::Settings,
    ) -> Result<(), allox_supervisor::plugin_api::PluginError> {
        Ok(())
    }
    fn stop(&self) {}
    fn serve<'a>(
        &'a self,
        req: &'a Request,
        _: allox_supervisor::plugin_api::RouteContext<'a>,
    ) -> allox_supervisor::plugin_api::RouteFuture<'a> {
        Box::pin(async move {
            Err(allox_supervisor::plugin_api::PluginError::Answered(
                ErrorBody::new(
                    ErrorCode::Conflict,
                    format!("answers served {}", req.action()),
                ),
            ))
        })
    }
}

/// A core that lends nothing: the route below never asks.
struct NoCore;

impl allox_supervisor::plugin_api::Core for NoCore {
    fn session_created(&self, _: &str, _: &str) -> Result<u64, ErrorBody> {
        unreachable!()
    }
    fn sessions_of(&self, _: &str) -> Vec<(String, u64)> {
        unreachable!()
    }
    fn relative_path(&self, _: &str) -> Result<String, ErrorBody> {
        unreachable!()
    }
    fn stat_within(
        &self,
        _: &allox_supervisor::plugin_api::SessionDir<'_>,
        _: &str,
    ) -> Result<FsEntry, ErrorBody> {
        unreachable!()
    }
    fn list_within(
        &self,
        _: &allox_supervisor::plugin_api::SessionDir<'_>,
        _: &str,
        _: Option<u32>,
    ) -> Result<FsListing, ErrorBody> {
        unreachable!()
    }
    fn read_within(
        &self,
        _: &allox_supervisor::plugin_api::SessionDir<'_>,
        _: &str,
        _: Option<u64>,
        _: Option<u64>,
    ) -> Result<(FsData, u64), ErrorBody> {
        unreachable!()
    }
    fn write_within(
        &self,
        _: &allox_supervisor::plugin_api::SessionDir<'_>,
        _: allox_supervisor::plugin_api::WriteWithin,
    ) -> Result<FsWritten, ErrorBody> {
        unreachable!()
    }
}

/// One line of the request table routes an action to a plugin, and that
/// plugin serves it (the action a core one otherwise); a table naming a
/// plugin that is not installed stops the load, naming both.
#[test]
fn a_route_the_table_gives_a_plugin_is_served_by_it_and_a_mismatch_stops_the_start() {
    use allox_supervisor::plugin_api::{Plugin, RouteContext};
    use allox_supervisor::plugin_host::Plugins;
    use std::sync::Arc;
    if !require("plugins::a_route_the_table_gives_a_plugin_is_served_by_it") {
        return;
    }
    let (_fs, store) = store_on_btrfs();
    let installed = || vec![Arc::new(Answers) as Arc<dyn Plugin>];
    let enabled = ["answers".to_string()];
    // The one line: `checkpoint.list` (the core's) given to the plugin.
    let table = [("checkpoint.list", Route::Plugin("answers"))];
    let plugins = Plugins::load(installed(), &enabled, &table, &[], Default::default()).unwrap();
    assert_eq!(plugins.routes_of("answers"), vec!["checkpoint.list"]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let ask = |req: Request| {
        let ctx = RouteContext {
            store: &store,
            core: &NoCore,
            events: None,
        };
        rt.block_on(plugins.serve(&req, ctx))
            .map(|_| String::new())
            .unwrap_or_else(|e| e.to_body().message)
    };
    assert_eq!(
        ask(Request::CheckpointList(SessionRef {
            agent_id: "a".into(),
            session_id: "s".into(),
        })),
        "answers served checkpoint.list"
    );
    // What the table does not give it stays the core's.
    assert_eq!(
        ask(Request::AgentList(AgentList {})),
        "agent.list is served by the core, not by a plugin"
    );
    // Not enabled: the error names the plugin the table gives it to.
    let off = Plugins::load(installed(), &[], &table, &[], Default::default()).unwrap();
    let ctx = RouteContext {
        store: &store,
        core: &NoCore,
        events: None,
    };
    let req = Request::CheckpointList(SessionRef {
        agent_id: "a".into(),
        session_id: "s".into(),
    });
    let e = rt.block_on(off.serve(&req, ctx)).unwrap_err().to_body();
    assert_eq!(e.code, ErrorCode::Unsupported);
    assert!(
        e.message
            .starts_with("checkpoint.list is served by the answers plugin, which is not enabled"),
        "{}",
        e.message
    );
    // A table that gives an action to a plugin nobody installed: refused
    // before anything starts, naming the action and the plugin.
    let ghost = [("checkpoint.list", Route::Plugin("ghost"))];
    let e = Plugins::load(installed(), &enabled, &ghost, &[], Default::default())
        .expect_err("a table naming a plugin not installed is refused");
    assert_eq!(
        e.to_string(),
        "the request table gives checkpoint.list to plugin ghost, which is not installed (installed: answers)"
    );
    // The real table and the real plugins agree.
    Plugins::load(
        allox_supervisor::plugins::installed(),
        &[],
        Request::ROUTES,
        &[],
        Default::default(),
    )
    .unwrap();
}
