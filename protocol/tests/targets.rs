//! The target of every action, as the audit log shows it: pinned here so
//! that where each params type says its own cannot change what is logged.

use allox_protocol::Request;
use serde_json::{json, Value};

fn target(action: &str, params: Value) -> String {
    Request::from_json(action, params)
        .unwrap_or_else(|e| panic!("{action}: {}", e.message))
        .target()
}

/// Each action with the fullest params of its shape (and the other shapes
/// where ids may be left out), and the target it must have.
fn table() -> Vec<(&'static str, Value, &'static str)> {
    let a = json!({"agent_id": "a"});
    let s = json!({"agent_id": "a", "session_id": "s"});
    let c = json!({"agent_id": "a", "session_id": "s", "checkpoint_id": "c"});
    let r = json!({"agent_id": "a", "session_id": "s", "run_id": "r"});
    let file =
        |scope: &str| json!({"agent_id": "a", "session_id": "s", "scope": scope, "path": "d/f"});
    vec![
        ("system.ping", json!({}), ""),
        ("agent.create", a.clone(), "a"),
        ("agent.list", json!({}), ""),
        ("agent.delete", a.clone(), "a"),
        ("session.create", s.clone(), "a/s"),
        ("session.list", a.clone(), "a"),
        ("session.delete", s.clone(), "a/s"),
        ("checkpoint.create", c.clone(), "a/s/c"),
        ("checkpoint.list", s.clone(), "a/s"),
        ("checkpoint.delete", c.clone(), "a/s/c"),
        (
            "checkpoint.pin",
            json!({"agent_id": "a", "session_id": "s", "checkpoint_id": "c", "pinned": true}),
            "a/s/c",
        ),
        ("session.rollback", c.clone(), "a/s/c"),
        ("audit.list", json!({}), ""),
        (
            "process.start",
            json!({"agent_id": "a", "session_id": "s", "argv": ["true"]}),
            "a/s",
        ),
        ("process.wait", r.clone(), "a/s/r"),
        ("process.kill", r.clone(), "a/s/r"),
        ("process.kill", s.clone(), "a/s"),
        ("process.list", s.clone(), "a/s"),
        ("process.stdin", r.clone(), "a/s/r"),
        ("turn.begin", s.clone(), "a/s"),
        (
            "turn.end",
            json!({"agent_id": "a", "session_id": "s", "turn_id": "t", "status": "ok"}),
            "a/s/t",
        ),
        (
            "turn.end",
            json!({"agent_id": "a", "session_id": "s", "status": "ok"}),
            "a/s/",
        ),
        ("policy.set", s.clone(), "a/s"),
        ("policy.set", a.clone(), "a"),
        (
            "checkpoint.diff",
            json!({"agent_id": "a", "session_id": "s", "from": "c1", "to": "current"}),
            "a/s/c1..current",
        ),
        ("system.shutdown", json!({}), ""),
        ("system.info", json!({}), ""),
        ("process.events", r.clone(), "a/s/r"),
        ("process.events", json!({"session_id": "s"}), "s"),
        ("process.events", json!({}), ""),
        ("process.tree", r.clone(), "a/s/r"),
        ("process.tree", s.clone(), "a/s"),
        ("store.check", json!({}), ""),
        ("plugin.list", json!({}), ""),
        (
            "network.policy.set",
            json!({"agent_id": "a", "session_id": "s", "egress": {}}),
            "a/s",
        ),
        (
            "network.policy.set",
            json!({"agent_id": "a", "egress": {}}),
            "a",
        ),
        ("network.policy.get", s.clone(), "a/s"),
        ("network.policy.get", a.clone(), "a"),
        ("network.audit", s.clone(), "a/s"),
        ("network.audit", json!({"session_id": "s"}), "s"),
        ("network.audit", json!({}), ""),
        ("fs.stat", file("session"), "a/s:d/f"),
        ("fs.stat", file("shared"), "a/s:shared:d/f"),
        ("fs.list", file("session"), "a/s:d/f"),
        ("fs.read", file("shared"), "a/s:shared:d/f"),
        ("fs.write", file("session"), "a/s:d/f"),
        ("fs.mkdir", file("shared"), "a/s:shared:d/f"),
        ("fs.remove", file("session"), "a/s:d/f"),
        (
            "fs.move",
            json!({"agent_id": "a", "session_id": "s", "scope": "shared", "path": "d/f", "to": "g"}),
            "a/s:shared:d/f",
        ),
        ("fs.watch", file("session"), "a/s:d/f"),
        (
            "process.resize",
            json!({"agent_id": "a", "session_id": "s", "run_id": "r", "rows": 24, "cols": 80}),
            "a/s/r",
        ),
        ("process.attach", r.clone(), "a/s/r"),
        ("share.list", a.clone(), "a"),
        ("share.list", json!({}), ""),
        ("share.agent.set", a.clone(), "a"),
        (
            "share.session.set",
            json!({"agent_id": "a", "session_id": "s", "enabled": true, "scope": "out"}),
            "a/s",
        ),
        ("session.stats", s.clone(), "a/s"),
        ("session.update", s.clone(), "a/s"),
        (
            "monitor.ingest",
            json!({"agent_id": "a", "session_id": "s", "spans": []}),
            "a/s",
        ),
        ("monitor.records", s.clone(), "a/s"),
        ("monitor.records", a.clone(), "a"),
        ("monitor.records", json!({}), ""),
        ("monitor.summary", json!({"session_id": "s"}), "s"),
        ("monitor.summary", s.clone(), "a/s"),
        ("monitor.timeline", s.clone(), "a/s"),
        ("process.logs", r.clone(), "a/s/r"),
        ("effects.get", r.clone(), "a/s/r"),
        ("effects.list", s.clone(), "a/s"),
        ("effects.history", r.clone(), "a/s/r"),
        ("effects.status", json!({}), ""),
        ("effects.status", a.clone(), "a"),
        (
            "effects.unfence",
            json!({"agent_id": "a", "session_id": "s", "run_id": "r", "evidence_root": "e"}),
            "a/s/r",
        ),
        ("effects.verify", r.clone(), "a/s/r"),
        ("effects.export", r.clone(), "a/s/r"),
        ("system.metrics", json!({}), ""),
        ("session.export", s.clone(), "a/s"),
        (
            "session.import",
            json!({"agent_id": "a", "session_id": "t", "import_id": "i"}),
            "a/t",
        ),
        (
            "session.import",
            json!({"agent_id": "a", "import_id": "i"}),
            "a/-",
        ),
        (
            "fs.upload_local",
            json!({"agent_id": "a", "session_id": "s", "path": "d/f"}),
            "a/s:d/f",
        ),
        (
            "fs.download_local",
            json!({"agent_id": "a", "session_id": "s", "scope": "shared", "path": "f"}),
            "a/s:shared:f",
        ),
        (
            "session.fork",
            json!({"agent_id": "a", "session_id": "s", "from": "c", "new_agent_id": "b", "new_session_id": "t"}),
            "a/s/c->b/t",
        ),
        (
            "session.fork",
            json!({"agent_id": "a", "session_id": "s", "from": "current", "new_session_id": "t"}),
            "a/s/current->a/t",
        ),
        (
            "session.pause",
            json!({"agent_id": "a", "session_id": "s", "hold": true}),
            "a/s",
        ),
        ("session.resume", s.clone(), "a/s"),
        ("session.info", s.clone(), "a/s"),
        (
            "secret.set",
            json!({"agent_id": "a", "session_id": "s", "name": "K", "value": "never-in-a-target", "hosts": ["api.test"]}),
            "a/s/K",
        ),
        (
            "secret.set",
            json!({"agent_id": "a", "name": "K", "value": "v", "hosts": ["api.test"]}),
            "a/K",
        ),
        ("secret.list", a.clone(), "a"),
        (
            "secret.delete",
            json!({"agent_id": "a", "session_id": "s", "name": "K"}),
            "a/s/K",
        ),
        (
            "port.expose",
            json!({"agent_id": "a", "session_id": "s", "port": 8000}),
            "a/s/port-8000",
        ),
        (
            "port.unexpose",
            json!({"agent_id": "a", "session_id": "s", "port": 8000}),
            "a/s/port-8000",
        ),
        ("port.list", s.clone(), "a/s"),
        (
            "port.connect",
            json!({"agent_id": "a", "session_id": "s", "port": 8000, "token": "t"}),
            "a/s/port-8000",
        ),
        ("system.resumed", json!({"realtime_ns": 1}), ""),
    ]
}

#[test]
fn every_action_names_its_target_as_the_audit_log_shows_it() {
    for (action, params, want) in table() {
        assert_eq!(target(action, params.clone()), want, "{action} {params}");
    }
}

#[test]
fn the_target_table_covers_every_action() {
    let table = table();
    for action in Request::ACTIONS {
        assert!(
            table.iter().any(|(a, _, _)| a == action),
            "{action} has no row in the target table"
        );
    }
}
