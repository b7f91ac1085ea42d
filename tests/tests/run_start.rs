//! A run's start that fails at any of its steps leaves nothing of the run:
//! no cgroup, nothing a service attached to it (a directory named after
//! the run, as the in-sandbox interface makes for its listener), no plugin
//! still holding it. Each step has a failpoint
//! (`allox_store::failpoint::RUN_STARTS`); a panic there, as a bug in that
//! step would make, is the hardest path for the undo: nothing returns
//! through it.

use allox_integration::{require, workspace_bin};
use allox_protocol::*;
use allox_store::failpoint::{Failpoints, RUN_STARTS};
use allox_supervisor::plugin_api::{Manifest, Plugin, PluginError, RunRef, Settings, API_VERSION};
use allox_supervisor::plugin_host::Plugins;
use allox_supervisor::runs::{
    Attachment, RunIdentity, RunServices, Runs, RunsConfig, SessionPaths,
};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A plugin that holds each run from `before_run` to `after_run`.
#[derive(Default)]
struct Holds {
    runs: Mutex<BTreeSet<String>>,
    told: Mutex<u32>,
}

static HOLDS: Manifest = Manifest {
    name: "holds",
    api_version: API_VERSION,
    conflicts: &[],
    alias: None,
    summary: "test",
};

impl Plugin for Holds {
    fn manifest(&self) -> &Manifest {
        &HOLDS
    }
    fn start(&self, _: &Settings) -> Result<(), PluginError> {
        Ok(())
    }
    fn stop(&self) {}
    fn before_run(&self, run: &RunRef<'_>, _: u64) -> Result<(), PluginError> {
        *self.told.lock().unwrap() += 1;
        self.runs.lock().unwrap().insert(run.run.to_string());
        Ok(())
    }
    fn after_run(&self, run: &RunRef<'_>) {
        self.runs.lock().unwrap().remove(run.run);
    }
}

/// A service that makes a directory per run, removed when the run lets
/// go of it.
struct Dirs(PathBuf);

struct Made(PathBuf);

impl Drop for Made {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

impl RunServices for Dirs {
    fn attach(
        &self,
        run: &RunIdentity,
    ) -> Result<Attachment, Box<dyn std::error::Error + Send + Sync>> {
        let dir = self.0.join(&run.run);
        std::fs::create_dir(&dir)?;
        Ok(Attachment {
            guard: Box::new(Made(dir)),
            ..Attachment::none()
        })
    }
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Waits (a failed start's undo may still be going on) until nothing of
/// any run is left, or says what is.
fn nothing_left(session_cgroup: &Path, attached: &Path, plugin: &Holds) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let cgroups = entries(session_cgroup);
        let dirs = entries(attached);
        let held = plugin.runs.lock().unwrap().clone();
        if cgroups.is_empty() && dirs.is_empty() && held.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "cgroups {cgroups:?}, attached {dirs:?}, plugin holds {held:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_start_failing_at_any_step_leaves_no_cgroup_attachment_or_plugin_state() {
    if !require("run_start::a_start_failing_at_any_step_leaves_nothing") {
        return;
    }
    let fs = allox_integration::BtrfsFs::new(256).unwrap();
    let current = fs.scratch().join("current");
    let shared = fs.scratch().join("shared");
    let attached = fs.scratch().join("attached");
    for d in [&current, &shared, &attached] {
        std::fs::create_dir(d).unwrap();
    }
    let cg = allox_integration::cgroup2_mount()
        .unwrap()
        .join(format!("allox-test-{}-runstart", std::process::id()));
    std::fs::create_dir_all(&cg).unwrap();
    let mut rc = RunsConfig::new(
        cg.clone(),
        workspace_bin("allox-init"),
        fs.scratch().join("stage"),
    );
    // Each point fails once: the first start at the first step, the next
    // at the second, and so on; then a start goes through.
    let armed: Vec<String> = RUN_STARTS.iter().map(|p| format!("{p}=panic")).collect();
    rc.failpoints = Failpoints::parse(&armed.join(","));
    let plugin = Arc::new(Holds::default());
    rc.plugins = Arc::new(
        Plugins::load(
            vec![plugin.clone() as Arc<dyn Plugin>],
            &["holds".to_string()],
            &[],
            &rc.system_dirs,
            Default::default(),
        )
        .unwrap(),
    );
    let runs = Arc::new(Runs::new(rc).unwrap());
    assert!(runs.set_services(Arc::new(Dirs(attached.clone()))));
    let session_cgroup = runs.cgroups().session_dir("a", "s");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let start = |argv: &[&str]| {
        let runs = runs.clone();
        let mut p = allox_integration::process_start("a", "s", argv);
        p.wait = true;
        let paths = SessionPaths {
            current: current.clone(),
            shared: shared.clone(),
            network: Default::default(),
        };
        rt.block_on(rt.spawn(async move { runs.start(&p, paths, None).await }))
    };
    let mut failures = Vec::new();
    for (i, point) in RUN_STARTS.iter().enumerate() {
        let out = start(&["/bin/true"]);
        match out {
            Err(e) if e.is_panic() => {}
            other => failures.push(format!("{point}: the start did not fail there: {other:?}")),
        }
        if let Err(left) = nothing_left(&session_cgroup, &attached, &plugin) {
            failures.push(format!("{point}: left {left}"));
        }
        // The plugins hear of the run from the third step on.
        let told = *plugin.told.lock().unwrap();
        let want = (i as u32).saturating_sub(1);
        if told != want {
            failures.push(format!(
                "{point}: the plugin heard of {told} runs, not {want}"
            ));
        }
    }
    // Every point spent: the start goes through, and the run's end leaves
    // nothing either.
    match start(&["/bin/true"]) {
        Ok(Ok(Response::Exited(r))) if r.exit_code == Some(0) => {}
        other => failures.push(format!("the last start: {other:?}")),
    }
    if let Err(left) = nothing_left(&session_cgroup, &attached, &plugin) {
        failures.push(format!("after the run: left {left}"));
    }
    let _ = std::fs::write(cg.join("cgroup.kill"), "1");
    drop(runs);
    rt.shutdown_timeout(Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(200));
    allox_integration::remove_cgroup_tree(&cg);
    assert!(failures.is_empty(), "{failures:#?}");
}
