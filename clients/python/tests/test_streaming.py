"""Streaming through the real gateway (``Accept: application/x-ndjson``).

Every test here is marked ``gateway_streaming``: output comes as the run
writes it (the first chunk before the run ends), every byte value
survives, a plain action is a stream of its answer, ``fs.watch`` streams
its changes and ends when the stream is closed; sync and async.
``test_openapi_document_generates_the_models`` (``gateway_openapi``)
regenerates the models from the document the gateway serves.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

import allox
from allox import models

pytestmark = [pytest.mark.gateway]


@pytest.mark.gateway_streaming
def test_exec_stream_delivers_output_as_it_is_written(client: allox.Client, agent: str):
    client.session_create(agent, "s1")
    t0 = time.monotonic()
    s = client.exec_stream(agent, "s1", ["sh", "-c", "echo a; sleep 1; echo b; echo e >&2; exit 3"])
    seen = []
    for ev in s:
        seen.append((time.monotonic() - t0, ev))
    end = time.monotonic() - t0
    started = [ev for _, ev in seen if isinstance(ev, allox.Started)]
    outputs = [(t, ev) for t, ev in seen if isinstance(ev, allox.Output)]
    assert len(started) == 1 and started[0].run_id
    assert seen[0][1] is started[0], "Started comes before any output"
    stdout = b"".join(ev.data for _, ev in outputs if ev.stream == "stdout")
    stderr = b"".join(ev.data for _, ev in outputs if ev.stream == "stderr")
    assert (stdout, stderr) == (b"a\nb\n", b"e\n")
    first = outputs[0][0]
    assert first < end - 0.5, f"the first chunk came at {first:.2f} s, the end at {end:.2f} s: not streamed"
    result = s.result
    assert isinstance(result, models.RunResult) and result.exit_code == 3 and result.run_id == started[0].run_id


@pytest.mark.gateway_streaming
def test_exec_stream_carries_every_byte_value(client: allox.Client, agent: str):
    client.session_create(agent, "s1")
    client.write_file(agent, "s1", "all.bin", bytes(range(256)) * 64)
    s = client.exec_stream(agent, "s1", ["cat", "all.bin"])
    data = b"".join(ev.data for ev in s if isinstance(ev, allox.Output))
    assert data == bytes(range(256)) * 64
    assert s.result.exit_code == 0


def _alive(client: allox.Client, agent: str, run_id: str) -> bool:
    return any(p.run_id == run_id for p in client.process_list(agent, "s1").processes)


def _until(what: str, cond) -> None:
    deadline = time.monotonic() + 20
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.gateway_streaming
def test_leaving_an_exec_stream_ends_its_run_unless_it_is_kept(client: allox.Client, agent: str):
    client.session_create(agent, "s1")
    runs = {}
    for keep in (False, True):
        s = client.exec_stream(agent, "s1", ["sh", "-c", "echo up; exec sleep 600"],
                               on_disconnect="keep" if keep else "kill")
        for ev in s:
            if isinstance(ev, allox.Started):
                runs[keep] = ev.run_id
            if isinstance(ev, allox.Output):
                break  # the caller is done with it: leaves the stream
        s.close()
        assert _alive(client, agent, runs[keep]) or not keep
    # Left without keeping: the run is killed, as a foreground command.
    _until("the left run to be killed", lambda: not _alive(client, agent, runs[False]))
    assert client.process_wait(agent, "s1", runs[False]).signal == 9
    # Kept: it goes on until killed (its stream was left after the other's).
    assert _alive(client, agent, runs[True])
    client.process_kill(agent, "s1", runs[True])
    with pytest.raises(ValueError):
        client.exec_stream(agent, "s1", ["true"], on_disconnect="later")


@pytest.mark.gateway_streaming
def test_logs_of_a_run_without_a_terminal_kept_then_followed(client: allox.Client, agent: str):
    client.session_create(agent, "s1")
    run = client.start(agent, "s1", ["sh", "-c", "echo one; read x; echo two"]).run_id
    _until("the first line to be kept", lambda: client.process_logs(agent, "s1", run).stdout == b"one\n")
    assert client.process_logs(agent, "s1", run).result is None
    s = client.process_logs_stream(agent, "s1", run)
    got = b""
    for ev in s:
        if isinstance(ev, allox.Output):
            got += ev.data
            if got == b"one\n":
                client.process_stdin(agent, "s1", run, "go\n", close=True)
    assert got == b"one\ntwo\n"
    assert s.result.result.exit_code == 0
    ended = client.process_logs(agent, "s1", run)
    assert (ended.stdout, ended.result.exit_code) == (b"one\ntwo\n", 0)


@pytest.mark.gateway_streaming
def test_a_stream_of_a_failing_call_raises_its_class(client: allox.Client, agent: str):
    client.session_create(agent, "s1")
    with pytest.raises(allox.InvalidRequest):
        # No such program: refused before anything starts.
        client.exec_stream(agent, "s1", ["no-such-program-here"]).wait()


@pytest.mark.gateway_streaming
def test_generic_stream_of_a_plain_action(client: allox.Client, agent: str):
    s = client.stream("session.list", agent_id=agent)
    assert list(s) == []
    assert s.result == {"agent_id": agent, "sessions": []}


@pytest.mark.gateway_streaming
def test_fs_watch_streams_changes(client: allox.Client, agent: str):
    client.session_create(agent, "s1")
    events: list[allox.Record] = []
    ready = threading.Event()
    stop = threading.Event()
    with client.fs_watch(agent, "s1", recursive=True) as w:

        def reader():
            try:
                for ev in w:
                    if isinstance(ev, allox.Record) and ev.kind == "fs":
                        events.append(ev)
                        if ev.model().change == "ready":
                            ready.set()
                    if stop.is_set():
                        return
            except allox.AlloxError:
                pass  # closed under it

        t = threading.Thread(target=reader, daemon=True)
        t.start()
        assert ready.wait(20), "no `ready` event"
        with allox.Client(client.base_url, token=client.token) as other:
            other.write_file(agent, "s1", "watched.txt", b"x")
        deadline = time.monotonic() + 20
        # The write lands as its new file's rename into place: a change
        # whose path (or, for a move, its `to`) is the file.
        def names_it(e: allox.Record) -> bool:
            m = e.model()
            return "watched.txt" in (m.path, m.to)

        while time.monotonic() < deadline and not any(names_it(e) for e in events):
            time.sleep(0.05)
        stop.set()
    t.join(10)
    assert not t.is_alive(), "the reader still blocks on the stream after it was closed"
    changes = [(e.model().change, e.model().path, e.model().to) for e in events]
    assert ("ready", ".", None) in changes
    assert any("watched.txt" in (p, to) for _, p, to in changes), changes


@pytest.mark.gateway_streaming
def test_async_exec_stream(gateway, agent: str):
    async def main():
        async with allox.AsyncClient(gateway.base_url, token=gateway.token) as c:
            await c.session_create(agent, "s1")
            t0 = time.monotonic()
            first = None
            out = b""
            async with c.exec_stream(agent, "s1", ["sh", "-c", "echo a; sleep 1; echo b"]) as s:
                async for ev in s:
                    if isinstance(ev, allox.Output):
                        first = first if first is not None else time.monotonic() - t0
                        out += ev.data
                result = await s.wait()
            return first, time.monotonic() - t0, out, result

    first, end, out, result = asyncio.run(main())
    assert out == b"a\nb\n" and result.exit_code == 0
    assert first < end - 0.5, f"first chunk at {first:.2f} s, end at {end:.2f} s"


@pytest.mark.gateway_openapi
def test_openapi_document_generates_the_models(gateway, tmp_path):
    import importlib.util
    import sys
    from pathlib import Path

    r = httpx.get(f"{gateway.base_url}/v1/openapi.json", headers={"Authorization": f"Bearer {gateway.token}"})
    assert r.status_code == 200, f"GET /v1/openapi.json: HTTP {r.status_code} {r.text[:200]}"
    doc = r.json()
    assert doc["openapi"].startswith("3.1")
    tools = Path(__file__).resolve().parent.parent / "tools"
    spec = importlib.util.spec_from_file_location("gen_models", tools / "gen_models.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    text = gen.generate(doc, "/v1/openapi.json")
    mspec = importlib.util.spec_from_loader("allox.models_from_gateway", loader=None)
    m = importlib.util.module_from_spec(mspec)
    m.__package__ = "allox"
    sys.modules[m.__name__] = m
    try:
        exec(compile(text, "<models>", "exec"), m.__dict__)
        # What the client reads its answers as must be there under the same names.
        for name in ("AgentInfo", "SessionInfo", "CheckpointInfo", "CheckpointListing", "RollbackDone", "TurnInfo",
                     "PolicyInfo", "DiffListing", "Change", "RunResult", "RunStarted", "ProcessListing", "Pong",
                     "SystemInfo", "FsEntry", "FsData", "FsEvent"):
            assert hasattr(m, name), f"the gateway's document has no schema {name}"
        assert "agent.create" in m.ACTIONS
        info = m.RunResult.from_dict({"run_id": "r", "exit_code": 0, "stdout": "", "stderr": "", "truncated": False, "timed_out": False})
        assert info.exit_code == 0
        (tmp_path / "models.py").write_text(text)
    finally:
        sys.modules.pop("allox.models_from_gateway", None)
