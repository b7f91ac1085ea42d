//! The process tracker as a plugin (`--plugin process-tree`, or its alias
//! `--process-tracker ebpf`): eBPF programs attribute every process of a
//! run to its agent, session and run ([`tracker`]).
//!
//! - start: loads and attaches the programs, opens `state/events.redb`;
//! - before a run: tags the run's cgroup (it exists, empty) with the run,
//!   so the first process in it already counts;
//! - a run of an earlier supervisor: tagged too, from now on;
//! - routes: `process.events` and `process.tree`;
//! - metadata: `process-tree.tracked = ebpf` on every run;
//! - stop: flushes the event store and drops the tracker (the programs
//!   detach, the drain thread ends).

pub mod tracker;

pub use super::defaults::process_tree::NAME;
use crate::plugin_api::{
    Contribution, Manifest, Plugin, PluginError, RouteContext, RouteFuture, RunRef, Settings,
    API_VERSION,
};
use allox_protocol::{ProcessEvents, Request, Response};
use std::sync::{Arc, Mutex};
use tracker::{ProcessTracker, TrackerError};

static MANIFEST: Manifest = Manifest {
    name: NAME,
    api_version: API_VERSION,
    conflicts: &[],
    alias: Some("--process-tracker ebpf"),
    summary: "attributes every process of a run to its agent, session and run (eBPF)",
};

/// The plugin; holds the tracker while started.
#[derive(Default)]
pub struct ProcessTree {
    tracker: Mutex<Option<Arc<ProcessTracker>>>,
}

impl ProcessTree {
    pub fn new() -> ProcessTree {
        ProcessTree::default()
    }

    /// The started tracker.
    pub fn tracker(&self) -> Result<Arc<ProcessTracker>, TrackerError> {
        self.tracker
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(TrackerError::Off)
    }
}

impl Plugin for ProcessTree {
    fn manifest(&self) -> &Manifest {
        &MANIFEST
    }

    fn start(&self, settings: &Settings) -> Result<(), PluginError> {
        let fail = |e: Box<dyn std::error::Error + Send + Sync>| PluginError::Start {
            plugin: NAME,
            alias: MANIFEST.alias,
            source: e,
        };
        std::fs::create_dir_all(&settings.state_dir).map_err(|e| {
            fail(format!("cannot create {}: {e}", settings.state_dir.display()).into())
        })?;
        let t = ProcessTracker::start(&settings.state_dir, settings.process_events_max)
            .map_err(|e| fail(Box::new(e)))?;
        for (name, help, read) in [
            (
                "tracker_events",
                "Process events (forks, execs, exits) the tracker received from the kernel",
                ProcessTracker::received as fn(&ProcessTracker) -> u64,
            ),
            (
                "tracker_events_lost",
                "Process events the kernel could not hand to the tracker (its ring was full)",
                ProcessTracker::lost,
            ),
        ] {
            let weak = Arc::downgrade(&t);
            settings.metrics.register_collector(Box::new(
                crate::plugin_api::metrics::ReadCounter {
                    name,
                    help,
                    read: Box::new(move || weak.upgrade().map_or(0, |t| read(&t))),
                },
            ));
        }
        *self.tracker.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
        Ok(())
    }

    fn stop(&self) {
        let t = self
            .tracker
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(t) = t {
            t.drain_once();
            if let Err(e) = t.store.flush() {
                tracing::warn!(error = %allox_protocol::error_chain(&e), "cannot flush the process event store");
            }
        }
    }

    fn contribute(&self, _run: &RunRef<'_>) -> Contribution {
        Contribution {
            metadata: vec![("tracked".into(), "ebpf".into())],
            ..Contribution::default()
        }
    }

    fn before_run(&self, run: &RunRef<'_>, cgroup_id: u64) -> Result<(), PluginError> {
        self.tracker()
            .and_then(|t| t.tag_run(run.agent, run.session, run.run, cgroup_id))
            .map_err(|e| PluginError::Run {
                plugin: NAME,
                source: Box::new(e),
            })
    }

    fn adopt_run(&self, run: &RunRef<'_>, cgroup_id: u64) {
        if let Ok(t) = self.tracker() {
            let _ = t.tag_run(run.agent, run.session, run.run, cgroup_id);
        }
    }

    fn serve<'a>(&'a self, req: &'a Request, ctx: RouteContext<'a>) -> RouteFuture<'a> {
        Box::pin(async move {
            let t = self.tracker()?;
            match req {
                Request::ProcessEvents(q) => events(&t, q, ctx).await,
                Request::ProcessTree(q) => {
                    ctx.store.session_info_of(&q.agent_id, &q.session_id)?;
                    Ok(Response::ProcessTree(t.store.tree(
                        &q.agent_id,
                        &q.session_id,
                        q.run_id.as_deref(),
                    )?))
                }
                _ => Err(PluginError::NoHandler {
                    plugin: NAME,
                    action: req.action(),
                }),
            }
        })
    }
}

async fn events(
    t: &ProcessTracker,
    q: &ProcessEvents,
    ctx: RouteContext<'_>,
) -> Result<Response, PluginError> {
    events_of(&t.store, &|| t.lost(), q, ctx).await
}

/// `process.events` from `store`: a page, or with `follow` the backlog
/// and then new events as stream events until the subscriber goes. `lost`:
/// the events the kernel could not hand over, so far.
pub(crate) async fn events_of(
    store: &tracker::EventStore,
    lost: &(dyn Fn() -> u64 + Send + Sync),
    q: &ProcessEvents,
    ctx: RouteContext<'_>,
) -> Result<Response, PluginError> {
    let t = Source { store, lost };
    if !q.follow {
        return Ok(Response::ProcessEvents(t.store.query(q, t.lost())?));
    }
    let Some(sink) = ctx.events else {
        return Err(PluginError::FollowNeedsStream);
    };
    let mut cursor = q.cursor;
    loop {
        let page = t.store.query(
            &ProcessEvents {
                cursor,
                follow: false,
                ..q.clone()
            },
            t.lost(),
        )?;
        for e in page.events {
            if sink.send(allox_protocol::Event::Process(e)).await.is_err() {
                // The subscriber is gone.
                return Err(PluginError::SubscriberGone);
            }
        }
        cursor = Some(page.next_cursor);
        if sink.is_closed() {
            return Err(PluginError::SubscriberGone);
        }
        t.store
            .wait_newer(page.next_cursor, std::time::Duration::from_secs(1))
            .await;
    }
}

/// Where `events_of` reads.
struct Source<'a> {
    store: &'a tracker::EventStore,
    lost: &'a (dyn Fn() -> u64 + Send + Sync),
}

impl Source<'_> {
    fn lost(&self) -> u64 {
        (self.lost)()
    }
}
