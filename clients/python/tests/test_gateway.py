"""Against the real daemon and gateway (the ``gateway`` fixture): the seed's
calls, turns with automatic checkpoints, rollback, diff, files, processes,
error classes, keep-alive, the session helper."""

from __future__ import annotations

import hashlib
import os
import uuid

import httpx
import pytest

import allox
from allox import models

pytestmark = pytest.mark.gateway


def new_id(prefix: str = "agent") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def test_the_seeds_four_calls(client: allox.Client):
    a = new_id()
    agent = client.call("agent.create", {"agent_id": a})
    assert agent["agent_id"] == a and agent["sessions"] == 0
    session = client.call("session.create", agent_id=a, session_id="session-1")
    assert session["session_id"] == "session-1" and session["current"].endswith("/current")
    cp = client.call("checkpoint.create", agent_id=a, session_id="session-1", checkpoint_id="clean")
    assert cp["checkpoint_id"] == "clean" and cp["origin"] == "manual"
    rb = client.call("session.rollback", agent_id=a, session_id="session-1", checkpoint_id="clean")
    assert rb["checkpoint_id"] == "clean" and rb["previous_head"] == "clean"
    client.agent_delete(a, force=True)


def test_ping_and_info(client: allox.Client):
    pong = client.ping()
    assert isinstance(pong, models.Pong) and pong.version >= 1 and pong.build
    info = client.info()
    assert isinstance(info, models.SystemInfo) and info.supervisor_pid > 0 and info.under_init is False


def test_a_turn_takes_an_automatic_checkpoint(client: allox.Client, agent: str):
    client.session_create(agent, "s1")
    policy = client.policy_set(agent, "s1", auto_checkpoint=True, keep_last=5)
    assert isinstance(policy, models.PolicyInfo) and policy.auto_checkpoint is True and policy.session_id == "s1"
    turn = client.turn_begin(agent, "s1")
    assert isinstance(turn, models.TurnInfo) and turn.turn_id == "turn-1" and turn.number == 1 and turn.ended_ms is None
    run = client.exec(agent, "s1", ["sh", "-c", "echo parsed > parser.txt"])
    assert run.exit_code == 0
    with pytest.raises(allox.Conflict):  # one open turn at a time
        client.turn_begin(agent, "s1")
    ended = client.turn_end(agent, "s1", turn.turn_id, "ok", label="wrote the parser")
    assert ended.status == "ok" and ended.checkpoint_id == "turn-1" and ended.checkpoint_error is None
    listing = client.checkpoint_list(agent, "s1")
    cps = {c.checkpoint_id: c for c in listing.checkpoints}
    assert "turn-1" in cps, listing
    assert cps["turn-1"].origin == "turn" and cps["turn-1"].turn_id == "turn-1" and cps["turn-1"].label == "wrote the parser"
    assert listing.head == "turn-1"
    assert client.read_file(agent, "s1", "parser.txt", checkpoint="turn-1") == b"parsed\n"
    with pytest.raises(allox.Conflict):  # ending it twice
        client.turn_end(agent, "s1", "turn-1", "ok")
    with pytest.raises(allox.NotFound):
        client.turn_end(agent, "s1", "turn-99", "ok")


def test_the_turn_context_manager(client: allox.Client, agent: str):
    with client.session(agent, "s1", auto_checkpoint=True) as s:
        assert s.info.head == "baseline"
        with s.turn(label="first") as t:
            s.write_file("notes.md", b"# notes\n")
        assert t.result.status == "ok" and t.checkpoint_id == "turn-1"
        with pytest.raises(RuntimeError):
            with s.turn() as t2:
                s.write_file("notes.md", b"broken\n")
                raise RuntimeError("the agent failed")
        assert t2.result.status == "failed" and t2.checkpoint_id is None
        ids = [c.checkpoint_id for c in s.checkpoints().checkpoints]
        assert ids == ["baseline", "turn-1"]


def test_rollback_restores_a_file(client: allox.Client, agent: str):
    client.session_create(agent, "s1")
    client.write_file(agent, "s1", "src/main.py", b"print('v1')\n", parents=True)
    client.write_file(agent, "s1", "keep.txt", b"keep")
    client.checkpoint_create(agent, "s1", "clean", label="before the risky edit")
    client.write_file(agent, "s1", "src/main.py", b"rm -rf everything\n")
    client.fs_remove(agent, "s1", "keep.txt")
    client.exec(agent, "s1", ["sh", "-c", "mkdir build && head -c 100000 /dev/zero > build/blob"])
    assert client.read_file(agent, "s1", "src/main.py") == b"rm -rf everything\n"
    done = client.rollback(agent, "s1", "clean")
    assert isinstance(done, models.RollbackDone) and done.checkpoint_id == "clean" and done.killed_processes == 0
    assert client.read_file(agent, "s1", "src/main.py") == b"print('v1')\n"
    assert client.read_file(agent, "s1", "keep.txt") == b"keep"
    with pytest.raises(allox.NotFound):
        client.read_file(agent, "s1", "build/blob")


def test_diff(client: allox.Client, agent: str):
    client.session_create(agent, "s1", auto_checkpoint=True)  # takes `baseline`
    client.write_file(agent, "s1", "a.txt", b"a")
    client.write_file(agent, "s1", "b.txt", b"b")
    client.checkpoint_create(agent, "s1", "two")
    client.write_file(agent, "s1", "a.txt", b"changed")
    client.fs_remove(agent, "s1", "b.txt")
    client.write_file(agent, "s1", "c.txt", b"new file")
    d = client.diff(agent, "s1", "two", "current")
    assert isinstance(d, models.DiffListing) and (d.from_, d.to) == ("two", "current")
    kinds = {c.path: c.kind for c in d.changes}
    assert kinds == {"a.txt": "modified", "b.txt": "deleted", "c.txt": "added"}, d
    assert (d.added, d.modified, d.deleted, d.truncated) == (1, 1, 1, False)
    a = next(c for c in d.changes if c.path == "a.txt")
    assert (a.size_before, a.size_after) == (1, 7)
    d0 = client.diff(agent, "s1", "baseline")
    assert {c.path for c in d0.changes} == {"a.txt", "c.txt"}
    assert all(c.patch is None for c in d0.changes)
    p = client.diff(agent, "s1", "two", "current", patch=True)
    patches = {c.path: c.patch for c in p.changes}
    assert patches["a.txt"] == (
        "diff --git a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n"
        "-a\n\\ No newline at end of file\n+changed\n\\ No newline at end of file\n"
    ), p
    assert patches["b.txt"].startswith("diff --git a/b.txt b/b.txt\ndeleted file mode 100"), p
    assert not p.patch_truncated


def test_files_round_trip_every_byte(client: allox.Client, agent: str, tmp_path):
    client.session_create(agent, "s1")
    every = bytes(range(256)) * 17
    assert client.write_file(agent, "s1", "deep/dir/all bytes+%.bin", every, parents=True)["size"] == len(every)
    assert client.read_file(agent, "s1", "deep/dir/all bytes+%.bin") == every
    entry = client.fs_stat(agent, "s1", "deep/dir/all bytes+%.bin")
    assert entry.kind == "file" and entry.size == len(every)
    # A file of several chunks from disk, streamed both ways.
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(3 * 1024 * 1024 + 17))
    assert client.upload(agent, "s1", "big.bin", big)["size"] == big.stat().st_size
    out = tmp_path / "back.bin"
    assert client.download(agent, "s1", "big.bin", out) == big.stat().st_size
    assert hashlib.sha256(out.read_bytes()).digest() == hashlib.sha256(big.read_bytes()).digest()
    # A chunked body (an iterable) and the agent's shared/.
    client.write_file(agent, "s1", "shared-note.txt", (b"part %d\n" % i for i in range(1000)), scope="shared")
    shared = client.read_file(agent, "s1", "shared-note.txt", scope="shared")
    assert shared.count(b"\n") == 1000
    run = client.exec(agent, "s1", ["cat", "/allox/shared/shared-note.txt"])
    assert run.stdout.count("\n") == 1000
    # fs.read/fs.write as actions.
    client.fs_write(agent, "s1", "small.txt", "héllo")
    data = client.fs_read(agent, "s1", "small.txt")
    assert data.data == "héllo".encode() and data.eof
    assert [e.path for e in client.fs_list(agent, "s1", "deep", depth=2).entries] == ["deep/dir", "deep/dir/all bytes+%.bin"]


def test_processes_start_wait_kill_list(client: allox.Client, agent: str):
    client.session_create(agent, "s1")
    run = client.exec(agent, "s1", ["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert isinstance(run, models.RunResult)
    assert (run.exit_code, run.stdout, run.stderr, run.timed_out) == (3, "out\n", "err\n", False)
    fed = client.exec(agent, "s1", ["cat"], stdin=b"fed through stdin")
    assert fed.stdout == "fed through stdin"
    started = client.start(agent, "s1", ["sleep", "300"])
    assert isinstance(started, models.RunStarted) and started.run_id
    listing = client.process_list(agent, "s1")
    assert any(p.run_id == started.run_id for p in listing.processes), listing
    client.checkpoint_create(agent, "s1", "c")
    with pytest.raises(allox.Conflict):  # live processes
        client.rollback(agent, "s1", "c")
    assert client.process_kill(agent, "s1", started.run_id).killed >= 1
    end = client.process_wait(agent, "s1", started.run_id, timeout_ms=10_000)
    assert end.signal == 9 and end.exit_code is None
    timed = client.exec(agent, "s1", ["sleep", "30"], timeout_ms=300)
    assert timed.timed_out


def test_error_codes_arrive_as_their_classes(client: allox.Client, gateway):
    missing = new_id("missing")
    with pytest.raises(allox.NotFound) as e:
        client.session_list(missing)
    assert (e.value.code, e.value.status) == ("not_found", 404) and missing in e.value.message
    with pytest.raises(allox.NotFound):
        client.session_create(missing, "s1")
    with pytest.raises(allox.InvalidRequest) as e:
        client.agent_create(".bad")
    assert (e.value.code, e.value.status) == ("invalid_request", 400) and ".bad" in e.value.message
    with pytest.raises(allox.InvalidRequest):
        client.call("agent.fly")
    with pytest.raises(allox.InvalidRequest):
        client.call("agent.create", agent_id="a", no_such_field=1)
    a = new_id()
    client.agent_create(a)
    with pytest.raises(allox.Conflict) as e:
        client.agent_create(a)
    assert (e.value.code, e.value.status) == ("conflict", 409)
    client.agent_delete(a)
    wrong = "0" * 64 if gateway.token != "0" * 64 else "1" * 64
    with allox.Client(gateway.base_url, token=wrong) as bad:
        with pytest.raises(allox.Unauthorized) as e:
            bad.agent_list()
        assert (e.value.code, e.value.status) == ("unauthorized", 401)
        with pytest.raises(allox.Unauthorized):
            bad.read_file(a, "s1", "x")
    with allox.Client(gateway.base_url, token=gateway.token, headers={"Host": "rebound.test"}) as rebound:
        with pytest.raises(allox.Unauthorized) as e:
            rebound.ping()
        assert e.value.status == 403


def test_a_streaming_call_refused_raises_its_class(client: allox.Client):
    # A refusal before the call comes as a plain JSON error with its status;
    # the daemon's refusal ends the stream as its answer line: either way the
    # error's class, raised by the time the stream is read.
    with pytest.raises(allox.InvalidRequest):
        list(client.exec_stream(".bad", "s1", ["true"]))
    with pytest.raises(allox.NotFound):
        list(client.exec_stream(new_id("missing"), "s1", ["true"]))


def test_many_calls_on_one_keep_alive_connection(client: allox.Client, agent: str):
    ports = []

    def on_response(response: httpx.Response) -> None:
        stream = response.extensions.get("network_stream")
        assert stream is not None, "httpx gives no network_stream to check the connection by"
        ports.append(stream.get_extra_info("client_addr")[1])

    client.http.event_hooks["response"].append(on_response)
    client.session_create(agent, "s1")
    for i in range(150):
        client.checkpoint_create(agent, "s1", f"c{i}")
        if i % 10 == 0:
            client.ping()
    assert len(client.checkpoint_list(agent, "s1").checkpoints) == 150
    assert len(ports) == 1 + 150 + 15 + 1
    assert len(set(ports)) == 1, f"{len(set(ports))} connections for {len(ports)} calls"


def test_the_session_helper_creates_and_deletes(client: allox.Client):
    a = new_id()
    with client.session(a, "s1", create_agent=True, delete=True) as s:
        assert s.info.session_id == "s1"
        assert [x.session_id for x in client.session_list(a).sessions] == ["s1"]
        with pytest.raises(allox.Conflict):
            with client.session(a, "s1"):
                pass
        with client.session(a, "s1", exist_ok=True) as again:
            assert again.info is None
        assert s.exec(["true"]).exit_code == 0
    assert client.session_list(a).sessions == []
    client.agent_delete(a)


def test_call_typed_reads_the_actions_result_type(client: allox.Client, agent: str):
    info = client.call_typed("session.create", agent_id=agent, session_id="s1")
    assert isinstance(info, models.SessionInfo)
    listing = client.call_typed("agent.list")
    assert isinstance(listing, models.AgentListing) and agent in [x.agent_id for x in listing.agents]
