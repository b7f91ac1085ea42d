"""Every action of the OpenAPI document, answered by a real daemon.

The daemon is this test's own (``make_gateway``), started with every
plugin so that their actions give real results: the process tracker
(``--process-tracker ebpf``, needs BTF), the session network (``--plugin
network``), sharing (``--share-tools``) and the monitor (``--monitor-root``).
It is its own because the test rolls back, deletes, and ends with
``system.shutdown``.

Each answer is checked against the document by the conftest's
``OpenAPICheck`` (the response hook on every client); this test counts, per
action, the answers that hook checked, and asserts that the actions called
are exactly the document's ``/v1/rpc/{action}`` paths and that each got a
result that fits (for ``fs.watch``, which only streams, an event). The
actions that could only get an error on this host are listed, with why,
at the end of the run (``openapi: only errors from ...``); the list is as
short as the host allows.
"""

from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import allox

pytestmark = pytest.mark.gateway

A, S = "every-agent", "s1"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
#: Not mutating the store, but not to be done twice either.
NOT_TWICE = {"process.stdin", "process.resize", "monitor.ingest"}


def cgroup_controllers(env) -> set[str]:
    """What the sessions' cgroups can have: the controllers of the cgroup2
    directory the daemon was given (``--cgroup-root``)."""
    try:
        return set((env.cgroup / "cgroup.controllers").read_text().split())
    except OSError:
        return set()


class Calls:
    """The calls of this test and, from the conftest's checker, what came of
    them: per action the answers it checked, and of them the results."""

    def __init__(self, check, client: allox.Client, raw: httpx.Client, make_gateway=None) -> None:
        self.make_gateway = make_gateway
        self.check = check
        self.client = client
        self.raw = raw
        self._base = {k: collections.Counter(getattr(check, k)) for k in ("answers", "results", "errors", "lines")}
        #: action -> why it could only get an error here.
        self.error_only: dict[str, str] = {}

    def delta(self, counter: str) -> collections.Counter:
        return collections.Counter(getattr(self.check, counter)) - self._base[counter]

    def __call__(self, action: str, **params: Any) -> Any:
        """``action`` through the SDK (``POST /v1/rpc``); one that changes
        nothing a second time through its own path (``POST
        /v1/rpc/{action}``, the params alone as the body)."""
        result = self.client.call(action, **params)
        op = self.check.doc["paths"][f"/v1/rpc/{action}"]["post"]
        if not op.get("x-allox-audited", True) and action not in NOT_TWICE:
            r = self.raw.post(f"/v1/rpc/{action}", json=params)
            assert r.status_code == 200, f"POST /v1/rpc/{action}: HTTP {r.status_code} {r.text[:300]}"
            assert set(r.json()["result"]) == set(result), (action, r.json(), result)
        return result


@pytest.fixture
def every(make_gateway, openapi_check, tmp_path: Path):
    monitor = tmp_path / "monitor"
    args = ["--process-tracker", "ebpf", "--plugin", "network", "--share-tools", "--monitor-root", str(monitor),
            "--secrets-key-file", str(tmp_path / "secrets.key")]
    try:
        env = make_gateway(args, label="every-action")
    except pytest.fail.Exception as e:
        hint = ""
        text = str(e)
        if any(w in text.lower() for w in ("ebpf", "bpf", "btf", "process-tree", "tracker")):
            hint = "the process tracker (--process-tracker ebpf) did not load on this host; "
        pytest.fail(f"{hint}the daemon did not start with {' '.join(args)}:\n{text}", pytrace=False)
    with allox.Client(env.base_url, token=env.token) as c, httpx.Client(
        base_url=env.base_url, headers={"Authorization": f"Bearer {env.token}"}, timeout=60
    ) as raw:
        yield env, Calls(openapi_check, c, raw, make_gateway)


def effects_actions(call: Calls, env) -> None:
    """``effects.*`` on a daemon with ``--plugin system-effects``: the seed's
    command observed, then a run whose history overflows a one-page ring,
    which fences its session until ``effects.unfence`` is given its root."""
    import base64
    import hashlib
    import os
    import subprocess

    init = Path(os.environ["ALLOX_INIT"])
    observer = init.with_name("allox-observe")
    sha = hashlib.sha256(observer.read_bytes()).hexdigest()
    verifier = init.with_name("allox-system-effects-verify")
    vsha = hashlib.sha256(verifier.read_bytes()).hexdigest()
    recover = init.with_name("allox-system-effects-recover")
    rsha = hashlib.sha256(recover.read_bytes()).hexdigest()
    args = ["--plugin", "system-effects", "--system-effects-observer", str(observer),
            "--system-effects-observer-sha256", sha,
            "--system-effects-verifier", str(verifier),
            "--system-effects-verifier-sha256", vsha,
            "--system-effects-recover", str(recover),
            "--system-effects-recover-sha256", rsha]
    probe = subprocess.run([str(init), "supervise", "--help"], capture_output=True, text=True)
    assert "--system-effects-without-lsm" in probe.stdout
    # The development hosts' kernel refuses BPF LSM programs.
    args.append("--system-effects-without-lsm")

    def daemon(extra: list[str], label: str):
        fx_env = call.make_gateway(args + extra, label=label)
        c2 = allox.Client(fx_env.base_url, token=fx_env.token)
        raw2 = httpx.Client(
            base_url=fx_env.base_url, headers={"Authorization": f"Bearer {fx_env.token}"}, timeout=60
        )
        c2.agent_create("fx")
        c2.session_create("fx", "s")
        return c2, raw2, Calls(call.check, c2, raw2)

    c2, raw2, fx = daemon([], "every-effects")
    with c2, raw2:
        run = c2.call("process.start", agent_id="fx", session_id="s",
                      argv=["/bin/sh", "-c", "printf changed > effect.txt"], wait=True)
        assert run["effects"]["verdict"] == "CHANGED", run["effects"]
        rid = run["run_id"]
        got = fx("effects.get", agent_id="fx", session_id="s", run_id=rid)
        assert got["evidence_root"] == run["effects"]["evidence_root"]
        assert any(r["run_id"] == rid for r in fx("effects.list", agent_id="fx", session_id="s")["runs"])
        hist = fx("effects.history", agent_id="fx", session_id="s", run_id=rid)
        assert any(r["kind"] == "exec" for r in hist["records"]), hist
        root = run["effects"]["evidence_root"]
        v = fx("effects.verify", agent_id="fx", session_id="s", run_id=rid, evidence_root=root)
        assert v["ok"] and v["first_bad"] is None, v
        assert f'"root":"{root}"' in v["report"], v
        x = fx("effects.export", agent_id="fx", session_id="s", run_id=rid)
        data = base64.b64decode(x["data"])
        assert x["offset"] == 0 and x["eof"] and x["size"] == len(data), {k: x[k] for k in ("offset", "size", "eof")}
        assert hashlib.sha256(data).hexdigest() == x["sha256"]
    # Thousands of refused calls on a one-page ring: records are lost, the
    # evidence is INCOMPLETE and the session fenced, until its root lifts it.
    c3, raw3, fx = daemon(["--system-effects-ring-bytes", "4K"], "every-effects-fence")
    with c3, raw3:
        storm = c3.call("process.start", agent_id="fx", session_id="s",
                        argv=["/bin/sh", "-c", "i=0; while [ $i -lt 3000 ]; do rmdir /nonexistent 2>/dev/null; i=$((i+1)); done"],
                        wait=True)
        fx_effects = storm["effects"]
        assert fx_effects["fenced"] and fx_effects["verdict"] == "INCOMPLETE", fx_effects
        assert fx_effects["history"]["lost"] > 0, fx_effects["history"]
        status = fx("effects.status")
        assert any(f["run_id"] == storm["run_id"] for f in status["fences"]), status
        fx("effects.unfence", agent_id="fx", session_id="s", run_id=storm["run_id"],
           evidence_root=fx_effects["evidence_root"])
        assert fx("effects.status")["fences"] == []


def test_every_action_is_answered_and_fits_the_document(every, openapi_check):
    env, call = every
    c = call.client

    # -- the system and its plugins --------------------------------------------------------
    assert call("system.ping")["version"] >= 1
    info = call("system.info")
    assert {"process-tree", "network", "share", "monitor"} <= set(info["plugins"]), info["plugins"]
    plugins = call("plugin.list")
    assert {p["name"] for p in plugins["loaded"]} >= {"process-tree", "network", "share", "monitor"}, plugins
    check = call("store.check")
    assert check["missing_on_disk"] == [] and check["missing_in_index"] == [], check
    metrics = call("system.metrics")["text"]
    assert metrics.endswith("# EOF\n") and "allox_requests_total{" in metrics, metrics[-300:]

    # -- agents, sessions, policy ------------------------------------------------------------
    call("agent.create", agent_id=A)
    call("agent.create", agent_id="every-doomed")
    assert A in {a["agent_id"] for a in call("agent.list")["agents"]}
    call("session.create", agent_id=A, session_id=S, network="proxy", egress={"allow": ["pypi.test:80"]}, auto_checkpoint=True)
    call("session.create", agent_id=A, session_id="s2")
    assert {s["session_id"] for s in call("session.list", agent_id=A)["sessions"]} == {S, "s2"}
    stats = call("session.stats", agent_id=A, session_id=S)
    assert stats["session_id"] == S
    have = cgroup_controllers(env)
    limits = [("pids", {"pids_max": 512}), ("memory", {"memory_max": 1 << 30}), ("cpu", {"cpu_max": "max 100000"})]
    usable = [(ctl, p) for ctl, p in limits if ctl in have]
    if usable:
        ctl, p = usable[0]
        updated = call("session.update", agent_id=A, session_id=S, **p)
        assert updated["session_id"] == S
    else:
        # Without a controller, limits are refused as such.
        with pytest.raises(allox.Unsupported):
            c.call("session.update", agent_id=A, session_id=S, pids_max=512)
    # An idle timeout and a lifetime need no controller.
    timed = call("session.update", agent_id=A, session_id="s2", idle_timeout_ms=3_600_000, max_lifetime_ms=86_400_000)
    assert timed["session_id"] == "s2"
    s2 = call("session.info", agent_id=A, session_id="s2")
    assert s2["idle_timeout_ms"] == 3_600_000 and s2["expires_ms"] and s2["expired_ms"] is None, s2
    pol = call("policy.set", agent_id=A, session_id=S, auto_checkpoint=True, keep_last=10)
    assert pol["auto_checkpoint"] is True

    # -- a turn: files, processes, the network ------------------------------------------------
    turn = call("turn.begin", agent_id=A, session_id=S)
    assert turn["turn_id"] == "turn-1"
    call("fs.mkdir", agent_id=A, session_id=S, path="src/pkg", parents=True)
    call("fs.write", agent_id=A, session_id=S, path="src/pkg/main.py", data="cHJpbnQoNiAqIDcpCg==")  # print(6 * 7)
    assert call("fs.stat", agent_id=A, session_id=S, path="src/pkg/main.py")["size"] == 13
    assert [e["path"] for e in call("fs.list", agent_id=A, session_id=S, path="src", depth=2)["entries"]] == ["src/pkg", "src/pkg/main.py"]
    assert call("fs.read", agent_id=A, session_id=S, path="src/pkg/main.py")["eof"] is True
    call("fs.move", agent_id=A, session_id=S, path="src/pkg/main.py", to="src/main.py")
    call("fs.write", agent_id=A, session_id=S, path="scratch.txt", data="eA==")
    call("fs.remove", agent_id=A, session_id=S, path="scratch.txt")

    # fs.watch only streams: its first event is `ready`; then a change.
    with c.stream("fs.watch", agent_id=A, session_id=S, recursive=True) as w:
        first = next(w)
        assert isinstance(first, allox.Record) and first.kind == "fs" and first.data["change"] == "ready", first
        c.fs_write(A, S, "watched.txt", b"x")  # a file beside it, renamed into place
        seen = []
        for ev in w:
            seen.append(ev)
            if ev.kind == "fs" and "watched.txt" in (ev.data["path"], ev.data.get("to")) or len(seen) > 20:
                break
        assert any("watched.txt" in (e.data["path"], e.data.get("to")) for e in seen), seen

    # A streamed run under a trace, through the session's proxy: one denied
    # connection attempt for network.audit, its processes for process.events.
    script = (
        "import urllib.request as u\n"
        "try:\n    u.urlopen('http://denied.test/', timeout=10)\n"
        "except Exception as e:\n    print('refused:', e)\n"
    )
    s = c.stream(
        "process.start", agent_id=A, session_id=S, argv=["python3", "-c", script], wait=True, stream=True, stdin="",
        trace={"trace_id": TRACE, "span_id": "00f067aa0ba902b9"},
    )
    out = b"".join(ev.data for ev in s if isinstance(ev, allox.Output))
    run = s.result
    assert run["exit_code"] == 0 and b"refused" in out, (run, out)
    traced_run = run["run_id"]

    # A run on a terminal: resized, typed into, attached to, its input closed.
    tty = call("process.start", agent_id=A, session_id=S, argv=["cat"], pty={"rows": 24, "cols": 80})
    rid = tty["run_id"]
    assert call("process.resize", agent_id=A, session_id=S, run_id=rid, rows=30, cols=100) == {"run_id": rid, "rows": 30, "cols": 100}
    assert call("process.stdin", agent_id=A, session_id=S, run_id=rid, data="aGVsbG8K")["written"] == 6  # hello\n
    assert any(p["run_id"] == rid for p in call("process.list", agent_id=A, session_id=S)["processes"])
    # The tracker drains the kernel's ring buffer on a short timer: the
    # run's processes come into the tree within a moment, not at once.
    deadline = time.monotonic() + 10
    while not (tree := call("process.tree", agent_id=A, session_id=S, run_id=rid))["roots"]:
        assert time.monotonic() < deadline, tree
        time.sleep(0.05)
    with c.stream("process.attach", agent_id=A, session_id=S, run_id=rid) as att:
        got = b""
        for ev in att:
            if isinstance(ev, allox.Output):
                got += ev.data
                if b"hello" in got:
                    break
        call("process.stdin", agent_id=A, session_id=S, run_id=rid, close=True)
        ended = att.result
    assert ended["exit_code"] == 0 and ended["run_id"] == rid, ended
    assert call("process.wait", agent_id=A, session_id=S, run_id=rid, timeout_ms=10_000)["exit_code"] == 0
    logs = call("process.logs", agent_id=A, session_id=S, run_id=rid)
    assert logs["result"]["exit_code"] == 0 and logs["run_id"] == rid, logs

    sleeper = call("process.start", agent_id=A, session_id=S, argv=["sleep", "300"])
    assert call("process.kill", agent_id=A, session_id=S, run_id=sleeper["run_id"])["killed"] >= 1
    assert call("process.wait", agent_id=A, session_id=S, run_id=sleeper["run_id"], timeout_ms=10_000)["signal"] == 9

    events = call("process.events", agent_id=A, session_id=S, run_id=traced_run)
    assert events["events"], f"the process tracker recorded nothing of run {traced_run}: {events}"
    assert any(e["kind"] == "exec" for e in events["events"]), events
    audit = call("network.audit", agent_id=A, session_id=S)
    assert any(r["host"] == "denied.test" and r["allowed"] is False for r in audit["records"]), audit
    got_policy = call("network.policy.get", agent_id=A, session_id=S)
    assert got_policy["mode"] == "proxy", got_policy
    call("network.policy.set", agent_id=A, session_id=S, egress={"allow": ["pypi.test:80", "*.mirror.test:443"], "deny": ["evil.test"]})
    secret = call("secret.set", agent_id=A, session_id=S, name="API_KEY", value="every-action-secret-value",
                  hosts=["api.test"], header="Authorization: Bearer {}")
    assert secret["placeholder"].startswith("allox-secret-placeholder-"), secret
    assert "every-action-secret-value" not in str(secret), secret
    listed = call("secret.list", agent_id=A, session_id=S)["secrets"]
    assert [(x["name"], x["session_id"]) for x in listed] == [("API_KEY", S)], listed
    assert call("secret.delete", agent_id=A, session_id=S, name="API_KEY")["deleted"] == f"{A}/{S}/API_KEY"

    ended_turn = call("turn.end", agent_id=A, session_id=S, turn_id="turn-1", status="ok", label="every action")
    assert ended_turn["checkpoint_id"] == "turn-1", ended_turn

    # -- checkpoints ---------------------------------------------------------------------------
    call("checkpoint.create", agent_id=A, session_id=S, checkpoint_id="clean", label="before the mess")
    assert [x["checkpoint_id"] for x in call("checkpoint.list", agent_id=A, session_id=S)["checkpoints"]] == ["baseline", "turn-1", "clean"]
    assert call("checkpoint.pin", agent_id=A, session_id=S, checkpoint_id="clean", pinned=True)["pinned"] is True
    c.fs_write(A, S, "mess.txt", b"mess")
    diff = call("checkpoint.diff", agent_id=A, session_id=S, **{"from": "baseline", "to": "current"})
    assert {ch["path"] for ch in diff["changes"]} >= {"src", "src/main.py", "mess.txt"}, diff
    call("checkpoint.create", agent_id=A, session_id=S, checkpoint_id="doomed")
    call("checkpoint.delete", agent_id=A, session_id=S, checkpoint_id="doomed")
    rolled = call("session.rollback", agent_id=A, session_id=S, checkpoint_id="clean")
    assert rolled["checkpoint_id"] == "clean", rolled
    with pytest.raises(allox.NotFound):
        c.fs_stat(A, S, "mess.txt")
    forked = call("session.fork", agent_id=A, session_id=S, new_session_id="forked", **{"from": "clean"})
    assert forked["head"] == "fork", forked
    listed = call("checkpoint.list", agent_id=A, session_id="forked")["checkpoints"]
    assert listed[0]["forked_from"]["checkpoint_id"] == "clean", listed
    # A session's archive through the gateway (NDJSON events), back in as
    # another session: by hand in two pieces, the last one committing, and
    # by the client's helper.
    import base64
    import io

    buf = io.BytesIO()
    exported = c.export_session(A, "forked", buf)
    archive = buf.getvalue()
    assert exported["bytes"] == len(archive) and archive[:8] == b"ALLOXSES", exported
    half = len(archive) // 2
    first = call("session.import", agent_id=A, session_id="moved", import_id="every-1",
                 data=base64.b64encode(archive[:half]).decode())
    assert first["received"] == half and first["session"] is None, first
    moved = call("session.import", agent_id=A, session_id="moved", import_id="every-1", offset=half,
                 data=base64.b64encode(archive[half:]).decode(), commit=True)
    assert moved["session"]["session_id"] == "moved" and moved["checkpoints"] == 1, moved
    again = c.import_session(A, archive, session_id="moved2", piece=4096)
    assert again.session.session_id == "moved2" and again.received == len(archive), again
    # Files passed as open descriptors go only over the daemon's own
    # socket: the gateway has none to pass, and is told so.
    for action, params in (("fs.upload_local", {}), ("fs.download_local", {})):
        with pytest.raises(allox.Unsupported) as refused:
            c.call(action, agent_id=A, session_id=S, path="up.bin", **params)
        assert "SCM_RIGHTS" in str(refused.value), refused.value
        call.error_only[action] = "a descriptor passes only over the daemon's Unix socket"
    # A session's ports: exposed, listed, and unexposed; a connection to
    # one is for clients on the daemon's socket (the gateway serves it at
    # /v1/ports/...).
    port = call("port.expose", agent_id=A, session_id=S, port=8000)
    assert port["path"] == f"/v1/ports/{A}/{S}/8000/" and len(port["token"]) == 48, port
    assert [p["port"] for p in call("port.list", agent_id=A, session_id=S)["ports"]] == [8000]
    with pytest.raises(allox.Unsupported) as refused:
        c.call("port.connect", agent_id=A, session_id=S, port=8000, authorized=True)
    assert "SCM_RIGHTS" in str(refused.value), refused.value
    call.error_only["port.connect"] = "a descriptor passes only over the daemon's Unix socket"
    assert call("port.unexpose", agent_id=A, session_id=S, port=8000)["deleted"] == f"{A}/{S}/port-8000"
    # The VM manager's word to a guest it resumed: a daemon on a host
    # refuses it (it would set the host's clock).
    with pytest.raises(allox.Unsupported) as refused:
        c.call("system.resumed", realtime_ns=time.time_ns())
    assert "only the guest's supervisor" in str(refused.value), refused.value
    call.error_only["system.resumed"] = "only the guest's supervisor accepts it"
    paused = call("session.pause", agent_id=A, session_id="forked", hold=True)
    assert paused["paused"]["hold"] is True, paused
    assert call("session.resume", agent_id=A, session_id="forked")["session_id"] == "forked"

    # -- the monitor -------------------------------------------------------------------------------
    now = time.time_ns()
    spans = [
        {"trace_id": TRACE, "span_id": "00f067aa0ba902b7", "name": "agent", "operation": "invoke_agent",
         "start_unix_nano": now - 2_000_000_000, "end_unix_nano": now},
        {"trace_id": TRACE, "span_id": "00f067aa0ba902b8", "parent_span_id": "00f067aa0ba902b7", "name": "chat",
         "operation": "chat", "model": "model-1", "input_tokens": 10, "output_tokens": 5,
         "start_unix_nano": now - 2_000_000_000, "end_unix_nano": now - 1_000_000_000},
        {"trace_id": TRACE, "span_id": "00f067aa0ba902b9", "parent_span_id": "00f067aa0ba902b7", "name": "python",
         "operation": "execute_tool", "tool": "python", "start_unix_nano": now - 1_000_000_000, "end_unix_nano": now},
    ]
    assert call("monitor.ingest", agent_id=A, session_id=S, spans=spans)["accepted"] == 3
    records = call("monitor.records", agent_id=A, session_id=S)
    assert any("span" in r["body"] for r in records["records"]) and any("run" in r["body"] for r in records["records"]), records
    summary = call("monitor.summary", agent_id=A, group_by="model")
    assert any(r["key"] == "model-1" for r in summary["rows"]), summary
    timeline = call("monitor.timeline", agent_id=A, session_id=S)
    assert timeline["session_id"] == S

    # -- sharing ---------------------------------------------------------------------------------------
    call("share.agent.set", agent_id=A, allowed=True, default_permission="read")
    call("share.session.set", agent_id=A, session_id=S, enabled=True, permission="read", scope=".")
    shares = call("share.list", agent_id=A)
    assert any(s["session_id"] == S and s["enabled"] for s in shares["shares"]), shares

    # -- system effects: a daemon of its own (it and the process tracker exclude each other) ---------
    effects_actions(call, env)

    # -- the audit, deletes, and the end ------------------------------------------------------------
    audit_log = call("audit.list", limit=1000)
    assert any(r["action"] == "session.rollback" for r in audit_log["records"]), audit_log
    call("session.delete", agent_id=A, session_id="s2")
    call("session.delete", agent_id=A, session_id="forked")
    call("session.delete", agent_id=A, session_id="moved")
    call("session.delete", agent_id=A, session_id="moved2")
    call("agent.delete", agent_id="every-doomed")
    stopping = call("system.shutdown")
    assert env.daemon.wait(60) == 0, f"the daemon exited {env.daemon.returncode} after system.shutdown"
    assert isinstance(stopping, dict)

    # -- what came of it --------------------------------------------------------------------------------
    doc_actions = openapi_check.actions
    answered = {a for a, n in call.delta("answers").items() if n}
    results = {a for a, n in call.delta("results").items() if n}
    lines = {a for a, n in call.delta("lines").items() if n}
    stream_only = {
        a for a in doc_actions
        if "application/json" not in openapi_check.doc["paths"][f"/v1/rpc/{a}"]["post"]["responses"]["200"]["content"]
    }
    ok = results | (stream_only & lines)
    assert answered == doc_actions, (
        f"called but not in the document: {sorted(answered - doc_actions)}; "
        f"in the document but not called: {sorted(doc_actions - answered)}"
    )
    error_only = doc_actions - ok
    assert error_only == set(call.error_only), (
        f"only errors from {sorted(error_only)}; expected only from {call.error_only}"
    )
    openapi_check.error_only.update(call.error_only)
    print(f"every action: {len(ok)} of {len(doc_actions)} with a schema-valid result; only errors from: {call.error_only or 'none'}")
