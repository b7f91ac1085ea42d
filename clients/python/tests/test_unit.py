"""The client without a daemon: error mapping, models, the generator, NDJSON
streams (from httpx's MockTransport and from a real HTTP server on
127.0.0.1 that streams with pauses and cuts connections)."""

from __future__ import annotations

import asyncio
import base64
import http.server
import importlib.util
import json
import socketserver
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

import allox
from allox import _core, models
from allox._model import decode

HERE = Path(__file__).resolve().parent
TOOLS = HERE.parent / "tools"
SEED = HERE.parent / "openapi.json"


def line(obj) -> bytes:
    return (json.dumps(obj) + "\n").encode()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# -- errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code,cls,status",
    [
        ("invalid_request", allox.InvalidRequest, 400),
        ("not_found", allox.NotFound, 404),
        ("conflict", allox.Conflict, 409),
        ("unauthorized", allox.Unauthorized, 401),
        ("unauthorized", allox.Unauthorized, 403),
        ("version_mismatch", allox.VersionMismatch, 400),
        ("unsupported", allox.Unsupported, 501),
        ("unavailable", allox.Unavailable, 503),
        ("unavailable", allox.Unavailable, 504),
        ("internal", allox.Internal, 500),
    ],
)
def test_each_error_code_is_its_class(code, cls, status):
    def handler(request):
        return httpx.Response(status, json={"error": {"code": code, "message": "nope"}})

    with allox.Client("http://gw.test", token="t", transport=httpx.MockTransport(handler)) as c:
        with pytest.raises(cls) as e:
            c.call("agent.list")
    assert (e.value.code, e.value.message, e.value.status) == (code, "nope", status)
    assert isinstance(e.value, allox.AlloxError)
    assert code in str(e.value) and str(status) in str(e.value)


def test_unknown_codes_and_bodies_without_json_still_raise():
    answers = iter(
        [
            httpx.Response(418, json={"error": {"code": "teapot", "message": "short and stout"}}),
            httpx.Response(502, text="<html>bad gateway</html>"),
            httpx.Response(200, json={"neither": 1}),
        ]
    )
    with allox.Client("http://gw.test", token="t", transport=httpx.MockTransport(lambda r: next(answers))) as c:
        with pytest.raises(allox.AlloxError) as e:
            c.call("x")
        assert type(e.value) is allox.AlloxError and e.value.code == "teapot"
        with pytest.raises(allox.Unavailable) as e:
            c.call("x")
        assert e.value.status == 502 and "bad gateway" in e.value.message
        with pytest.raises(allox.Internal):
            c.call("x")


def test_an_unreachable_gateway_is_a_transport_error():
    with allox.Client("http://127.0.0.1:9", token="t", timeout=2) as c:
        with pytest.raises(allox.TransportError) as e:
            c.ping()
    assert isinstance(e.value, allox.Unavailable)
    assert isinstance(e.value.__cause__, httpx.HTTPError)


# -- requests -----------------------------------------------------------------------------


def test_requests_carry_the_token_the_json_form_and_omit_none():
    seen = []

    def handler(request: httpx.Request):
        seen.append(request)
        return httpx.Response(200, json={"result": {"from": "a", "to": "b", "changes": [], "truncated": False,
                                                    "added": 0, "modified": 0, "deleted": 0, "type_changed": 0}})

    with allox.Client("http://127.0.0.1:8092/", token="abc", transport=httpx.MockTransport(handler)) as c:
        d = c.diff("ag", "s", "a", "b")
        c.call("session.rollback", {"agent_id": "ag"}, session_id="s", checkpoint_id="c", kill_processes=None)
        c.call("checkpoint.diff", agent_id="ag", session_id="s", from_="x", to="current")
        c.process_stdin("ag", "s", "r1", b"\x00\xff")
    assert isinstance(d, models.DiffListing) and d.from_ == "a"
    for r in seen:
        assert r.method == "POST" and r.url.path == "/v1/rpc"
        assert r.headers["Authorization"] == "Bearer abc"
        assert r.headers["Content-Type"] == "application/json"
        assert r.headers["Host"] == "127.0.0.1:8092"
    bodies = [json.loads(r.content) for r in seen]
    assert bodies[0] == {"action": "checkpoint.diff", "params": {"agent_id": "ag", "session_id": "s", "from": "a", "to": "b"}}
    assert bodies[1] == {"action": "session.rollback", "params": {"agent_id": "ag", "session_id": "s", "checkpoint_id": "c"}}
    assert bodies[2]["params"]["from"] == "x"
    assert bodies[3]["params"] == {"agent_id": "ag", "session_id": "s", "run_id": "r1", "data": b64(b"\x00\xff")}


def test_the_token_comes_from_the_file_or_the_environment(tmp_path, monkeypatch):
    f = tmp_path / "gateway.token"
    f.write_text("f" * 64 + "\n")
    assert _core.resolve_token(None, f)[0] == "f" * 64
    monkeypatch.setenv("ALLOX_TOKEN", "e" * 64)
    assert _core.resolve_token(None, None)[0] == "e" * 64
    monkeypatch.delenv("ALLOX_TOKEN")
    monkeypatch.setenv("ALLOX_TOKEN_FILE", str(f))
    assert _core.resolve_token(None, None)[0] == "f" * 64
    assert _core.resolve_token("given", f)[0] == "given"


def test_a_wait_for_a_run_has_no_read_timeout_and_other_calls_keep_theirs():
    seen = []

    def handler(request: httpx.Request):
        seen.append((json.loads(request.content)["action"], request.extensions["timeout"]["read"]))
        return httpx.Response(200, json={"result": {"run_id": "r", "exit_code": 0, "signal": None, "stdout": "", "stderr": "",
                                                    "truncated": False, "timed_out": False}})

    with allox.Client("http://gw.test", token="t", timeout=5.0, transport=httpx.MockTransport(handler)) as c:
        c.exec("a", "s", ["true"], timeout_ms=120_000)
        c.process_wait("a", "s", "r")
        c.call("system.ping")
    # A run longer than the client's timeout was cut with no result.
    assert seen == [("process.start", None), ("process.wait", None), ("system.ping", 5.0)]


def test_a_failed_download_leaves_the_local_file_as_it_was(tmp_path):
    answers = iter([
        httpx.Response(404, json={"error": {"code": "not_found", "message": "session a/typo does not exist"}}),
        httpx.Response(200, content=b"new content", headers={"Content-Length": "11"}),
    ])
    dest = tmp_path / "local.txt"
    dest.write_bytes(b"precious")
    dest.chmod(0o640)
    with allox.Client("http://gw.test", token="t", transport=httpx.MockTransport(lambda r: next(answers))) as c:
        with pytest.raises(allox.NotFound):
            c.download("a", "typo", "f", dest)
        # It was emptied before the answer was known.
        assert dest.read_bytes() == b"precious"
        assert c.download("a", "s", "f", dest) == 11
    assert dest.read_bytes() == b"new content"
    assert dest.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local.txt"]


def test_process_start_params():
    seen = []

    def handler(request):
        seen.append(json.loads(request.content)["params"])
        return httpx.Response(200, json={"result": {"run_id": "r", "pid": 7}})

    with allox.Client("http://gw.test", token="t", transport=httpx.MockTransport(handler)) as c:
        started = c.start("a", "s", ["sleep", "9"], env={"K": "v"}, timeout_ms=5)
        c.exec("a", "s", ["true"])
        c.exec("a", "s", ["cat"], stdin="hi", cwd="sub")
        with pytest.raises(TypeError):
            c.exec("a", "s", "echo hi")
    assert isinstance(started, models.RunStarted) and started.pid == 7
    assert seen[0] == {"agent_id": "a", "session_id": "s", "argv": ["sleep", "9"], "env": {"K": "v"}, "timeout_ms": 5}
    assert seen[1] == {"agent_id": "a", "session_id": "s", "argv": ["true"], "stdin": "", "wait": True}
    assert seen[2]["stdin"] == b64(b"hi") and seen[2]["cwd"] == "sub"


def test_file_urls_are_percent_encoded_per_segment():
    assert _core.file_url("a", "s", "d e/f+g%.txt") == "/v1/files/a/s/d%20e/f%2Bg%25.txt"
    assert _core.file_url("a", "s", "x?y#z") == "/v1/files/a/s/x%3Fy%23z"
    seen = []

    def handler(request: httpx.Request):
        seen.append(request)
        if request.method == "GET":
            return httpx.Response(200, content=b"\x00\x01data", headers={"Content-Type": "application/octet-stream"})
        return httpx.Response(200, json={"path": "p", "size": len(request.content)})

    with allox.Client("http://gw.test", token="t", transport=httpx.MockTransport(handler)) as c:
        assert c.read_file("a", "s", "dir/f", checkpoint="c1") == b"\x00\x01data"
        assert c.write_file("a", "s", "dir/f", b"xyz", scope="shared") == {"path": "p", "size": 3}
    assert seen[0].url.path == "/v1/files/a/s/dir/f" and seen[0].url.params["checkpoint"] == "c1"
    assert seen[1].method == "PUT" and seen[1].url.params["scope"] == "shared" and seen[1].headers["Content-Length"] == "3"


# -- models --------------------------------------------------------------------------------------


def test_models_read_and_write_the_json_form():
    r = models.RunResult.from_dict(
        {"run_id": "r", "exit_code": None, "signal": 9, "stdout": "", "stderr": "", "truncated": False,
         "timed_out": True, "usage": {"cpu_user_us": 5}, "a_field_from_a_newer_daemon": 1}
    )
    assert r.signal == 9 and r.usage.cpu_user_us == 5 and r.output_dropped is False
    assert r.raw["a_field_from_a_newer_daemon"] == 1
    data = models.FsData.from_dict({"path": "p", "offset": 0, "data": b64(bytes(range(256))), "size": 256, "eof": True})
    assert data.data == bytes(range(256))
    assert models.FsWrite(agent_id="a", session_id="s", path="p", data=b"\xff").to_dict()["data"] == "/w=="
    listing = models.CheckpointListing.from_dict(
        {"agent_id": "a", "session_id": "s", "head": "c",
         "checkpoints": [{"agent_id": "a", "session_id": "s", "checkpoint_id": "c", "parent": None, "created_ms": 1,
                          "origin": "turn", "pinned": False, "label": None, "turn_id": "turn-1"}]}
    )
    assert isinstance(listing.checkpoints[0], models.CheckpointInfo) and listing.checkpoints[0].origin == "turn"


def test_unions_pick_the_variant_by_its_keys():
    ev = decode(models.Event, {"output": {"run_id": "r", "stream": "stderr", "data": b64(b"x")}})
    assert isinstance(ev, models.EventOutput) and ev.output.data == b"x"
    ev = decode(models.Event, {"progress": {"message": "m"}})
    assert isinstance(ev, models.EventProgress) and ev.progress.message == "m"
    started = decode(models.ACTIONS["process.start"][1], {"run_id": "r", "pid": 3})
    assert isinstance(started, models.RunStarted)
    done = decode(models.ACTIONS["process.start"][1], {"run_id": "r", "exit_code": 0, "signal": None, "stdout": "",
                                                       "stderr": "", "truncated": False, "timed_out": False})
    assert isinstance(done, models.RunResult)


def test_every_model_the_client_names_exists():
    # The typed methods name their result models; after regenerating
    # models.py from the gateway's document these must still be there.
    import inspect
    import re

    src = inspect.getsource(sys.modules["allox._actions"]) + inspect.getsource(sys.modules["allox._core"])
    names = set(re.findall(r'_model\("(\w+)"\)', src)) | set(re.findall(r'parse\("(\w+)"', src))
    missing = sorted(n for n in names if not hasattr(models, n) and n != "MonitorListing")
    assert not missing, f"models.py lacks {missing}"


# -- the generator ----------------------------------------------------------------------------------


def load_gen():
    spec = importlib.util.spec_from_file_location("gen_models", TOOLS / "gen_models.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def import_text(text: str, name: str):
    """The generated module ``text`` imported as allox.<name>."""
    spec = importlib.util.spec_from_loader(f"allox.{name}", loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "allox"
    sys.modules[mod.__name__] = mod
    exec(compile(text, f"<{name}>", "exec"), mod.__dict__)
    return mod


def test_models_py_is_what_the_generator_makes_of_the_seed_document():
    gen = load_gen()
    text = gen.generate(json.loads(SEED.read_text()), "openapi.json")
    assert text == (HERE.parent / "allox" / "models.py").read_text(), (
        "allox/models.py is not the generator's output: run python3 tools/gen_models.py openapi.json --name openapi.json"
    )


def test_the_generator_handles_schemars_shapes():
    doc = {
        "openapi": "3.1.0",
        "paths": {
            "/v1/rpc/thing.make": {
                "post": {
                    "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Make"}}}},
                    "responses": {"200": {"content": {"application/json": {"schema": {
                        "type": "object", "properties": {"result": {"$ref": "#/components/schemas/Thing"}}}}}}},
                }
            }
        },
        "components": {"schemas": {
            "Make": {"type": "object", "additionalProperties": False, "required": ["name", "class"], "properties": {
                "name": {"type": "string", "description": "Its name.\nTwo lines."},
                "class": {"type": "string"},
                "size": {"type": ["integer", "null"], "format": "uint64", "minimum": 0, "default": None},
                "tags": {"type": "array", "items": {"type": "string"}, "default": []},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "blob": {"type": "string", "contentEncoding": "base64", "default": ""},
                "color": {"anyOf": [{"$ref": "#/components/schemas/Color"}, {"type": "null"}]},
                "inline": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]},
                "shape": {"$ref": "#/components/schemas/Shape"},
                "raw": {},
            }},
            "Color": {"oneOf": [{"type": "string", "const": "red", "description": "Red."}, {"type": "string", "const": "blue"}]},
            "Kind": {"type": "string", "enum": ["a", "b"]},
            "Shape": {"oneOf": [
                {"type": "string", "enum": ["point"]},
                {"type": "object", "properties": {"circle": {"type": "object", "properties": {"r": {"type": "number"}}, "required": ["r"]}},
                 "required": ["circle"], "additionalProperties": False},
                {"type": "object", "properties": {"square": {"$ref": "#/components/schemas/Thing"}}, "required": ["square"]},
            ]},
            "Tagged": {"oneOf": [
                {"type": "object", "properties": {"type": {"type": "string", "const": "one"}, "a": {"type": "integer"}}, "required": ["type", "a"]},
                {"type": "object", "properties": {"type": {"type": "string", "const": "two"}, "a": {"type": "string"}}, "required": ["type", "a"]},
            ]},
            "Thing": {"type": "object", "properties": {
                "name": {"type": "string"}, "kind": {"$ref": "#/components/schemas/Kind"},
                "children": {"type": "array", "items": {"$ref": "#/components/schemas/Thing"}}},
                "required": ["name", "kind", "children"]},
            "Empty": {"type": "object", "additionalProperties": False},
            "Alias": {"$ref": "#/components/schemas/Shape"},
        }},
    }
    gen = load_gen()
    m = import_text(gen.generate(doc, "test"), "models_gen_test")
    try:
        mk = m.Make.from_dict({"name": "n", "class": "c", "color": "red", "inline": {"x": 1}, "blob": b64(b"\x01"),
                               "shape": {"circle": {"r": 2}}, "raw": [1]})
        assert mk.class_ == "c" and mk.size is None and mk.tags == [] and mk.blob == b"\x01"
        assert mk.inline.x == 1.0 and isinstance(mk.inline, m.MakeInline)
        assert isinstance(mk.shape, m.ShapeCircle) and mk.shape.circle.r == 2
        assert mk.raw_ == [1]
        assert m.Make(name="n", class_="c").to_dict() == {"name": "n", "class": "c", "tags": [], "blob": ""}
        assert m.Make(name="n", class_="c").blob == b""
        assert m.Shape.__args__[0] == m.Literal["point"] or "point" in str(m.Shape)
        assert decode(m.Shape, "point") == "point"
        assert isinstance(decode(m.Shape, {"square": {"name": "s", "kind": "a", "children": []}}), m.ShapeSquare)
        t = decode(m.Tagged, {"type": "two", "a": "x"})
        assert type(t).__name__ == "TaggedTwo"
        tree = m.Thing.from_dict({"name": "r", "kind": "a", "children": [{"name": "c", "kind": "b", "children": []}]})
        assert isinstance(tree.children[0], m.Thing)
        assert m.Empty.from_dict({}) == m.Empty()
        assert m.Alias is m.Shape
        assert m.ACTIONS["thing.make"] == (m.Make, m.Thing)
        assert "Its name." in gen.generate(doc, "test")
    finally:
        sys.modules.pop("allox.models_gen_test", None)


def test_the_generator_writes_a_file(tmp_path):
    gen = load_gen()
    out = tmp_path / "models.py"
    assert gen.main([str(SEED), "-o", str(out)]) == 0
    assert "class RunResult(Model):" in out.read_text()


# -- streams from a mock transport -------------------------------------------------------------------------


def ndjson(chunks, status=200):
    return httpx.Response(status, headers={"Content-Type": "application/x-ndjson"}, content=iter(chunks))


def test_a_stream_yields_typed_events_then_its_result():
    log = []

    def body():
        yield line({"event": {"started": {"run_id": "r1", "pid": 42}}})
        log.append("after started")
        yield line({"event": {"output": {"run_id": "r1", "stream": "stdout", "data": b64(b"a\n")}}})
        # One event split over two chunks, and two in one.
        half = line({"event": {"output": {"run_id": "r1", "stream": "stderr", "data": b64(bytes(range(256)))}}})
        yield half[:10]
        yield half[10:] + line({"event": {"progress": {"message": "m"}}}) + line({"event": {"fs": {"change": "ready", "path": ".", "to": None, "dir": True}}})
        yield line({"event": {"monitor": {"seq": 1}}}) + b"\n"
        yield line({"result": {"run_id": "r1", "exit_code": 3, "signal": None, "stdout": "", "stderr": "",
                               "truncated": False, "timed_out": False}})

    seen = []

    def handler(request):
        seen.append(request)
        return ndjson(body())

    with allox.Client("http://gw.test", token="t", transport=httpx.MockTransport(handler)) as c:
        s = c.exec_stream("a", "s", ["sh", "-c", "x"])
        it = iter(s)
        first = next(it)
        assert first == allox.Started("r1", 42, first.raw)
        assert log == []  # nothing read ahead of what was asked for
        rest = list(it)
        assert s.result.exit_code == 3 and isinstance(s.result, models.RunResult)
    assert seen[0].headers["Accept"] == "application/x-ndjson"
    assert json.loads(seen[0].content)["params"] == {"agent_id": "a", "session_id": "s", "argv": ["sh", "-c", "x"],
                                                     "stdin": "", "wait": True, "stream": True,
                                                     "on_disconnect": "kill"}
    assert rest[0] == allox.Output("r1", "stdout", b"a\n")
    assert rest[1] == allox.Output("r1", "stderr", bytes(range(256)))
    assert rest[2] == allox.Progress("m")
    assert rest[3].kind == "fs" and isinstance(rest[3].model(), models.FsEvent) and rest[3].model().change == "ready"
    assert rest[4] == allox.Record("monitor", {"seq": 1})


def test_a_stream_without_its_last_line_is_broken():
    cases = [
        [line({"event": {"progress": {"message": "m"}}})],
        [line({"event": {"progress": {"message": "m"}}}), b'{"result": {"x"'],
        [],
    ]
    for chunks in cases:
        with allox.Client("http://gw.test", token="t", transport=httpx.MockTransport(lambda r, c=chunks: ndjson(list(c)))) as c:
            s = c.stream("process.events", follow=True)
            got = []
            with pytest.raises(allox.StreamBroken):
                for ev in s:
                    got.append(ev)
            assert got == ([allox.Progress("m")] if chunks else [])
            with pytest.raises(allox.StreamBroken):
                s.result


def test_a_last_line_without_newline_counts():
    with allox.Client("http://gw.test", token="t", transport=httpx.MockTransport(lambda r: ndjson([b'{"result": {"ok": 1}}']))) as c:
        assert c.stream("x").result == {"ok": 1}


def test_an_error_line_ends_the_stream_after_the_events_before_it():
    chunks = [line({"event": {"progress": {"message": "m"}}}) + line({"error": {"code": "conflict", "message": "busy"}})]
    with allox.Client("http://gw.test", token="t", transport=httpx.MockTransport(lambda r: ndjson(chunks))) as c:
        s = c.stream("x")
        assert next(s) == allox.Progress("m")
        with pytest.raises(allox.Conflict) as e:
            next(s)
        assert e.value.status == 200
        with pytest.raises(StopIteration):
            next(s)


def test_a_refusal_before_the_stream_is_a_plain_error():
    def handler(request):
        return httpx.Response(401, json={"error": {"code": "unauthorized", "message": "no token"}})

    with allox.Client("http://gw.test", token="t", transport=httpx.MockTransport(handler)) as c:
        with pytest.raises(allox.Unauthorized):
            c.exec_stream("a", "s", ["true"])


def test_a_gateway_that_does_not_stream_says_so():
    def handler(request):
        return httpx.Response(200, json={"result": {"run_id": "r", "exit_code": 0}})

    with allox.Client("http://gw.test", token="t", transport=httpx.MockTransport(handler)) as c:
        with pytest.raises(allox.StreamUnsupported) as e:
            c.exec_stream("a", "s", ["true"])
    assert e.value.result == {"run_id": "r", "exit_code": 0}
    assert isinstance(e.value, allox.Unsupported)


def test_async_streams_and_calls():
    async def body():
        yield line({"event": {"output": {"run_id": "r", "stream": "stdout", "data": b64(b"hi")}}})
        yield line({"result": {"run_id": "r", "exit_code": 0, "signal": None, "stdout": "", "stderr": "",
                               "truncated": False, "timed_out": False}})

    async def handler(request: httpx.Request):
        if request.headers.get("Accept") == "application/x-ndjson":
            return httpx.Response(200, headers={"Content-Type": "application/x-ndjson"}, content=body())
        if json.loads(request.content)["action"] == "agent.create":
            return httpx.Response(409, json={"error": {"code": "conflict", "message": "exists"}})
        return httpx.Response(200, json={"result": {"version": 1, "build": "b"}})

    async def main():
        async with allox.AsyncClient("http://gw.test", token="t", transport=httpx.MockTransport(handler)) as c:
            pong = await c.ping()
            assert isinstance(pong, models.Pong) and pong.version == 1
            with pytest.raises(allox.Conflict):
                await c.agent_create("a")
            s = c.exec_stream("a", "s", ["echo", "hi"])
            events = [ev async for ev in s]
            assert events == [allox.Output("r", "stdout", b"hi")]
            assert s.result.exit_code == 0
            s2 = c.exec_stream("a", "s", ["echo", "hi"])
            assert (await s2.wait()).exit_code == 0

    asyncio.run(main())


# -- streams over a real socket ----------------------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        mode = self.server.mode  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(data: bytes):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        chunk(line({"event": {"output": {"run_id": "r", "stream": "stdout", "data": b64(b"a\n")}}}))
        time.sleep(1.0)
        chunk(line({"event": {"output": {"run_id": "r", "stream": "stdout", "data": b64(b"b\n")}}}))
        if mode == "cut":
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        chunk(line({"result": {"run_id": "r", "exit_code": 0, "signal": None, "stdout": "", "stderr": "",
                               "truncated": False, "timed_out": False}}))
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


@pytest.fixture
def slow_server():
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.mode = "whole"  # type: ignore[attr-defined]
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_events_arrive_as_they_are_sent_over_http(slow_server):
    url = "http://%s:%d" % slow_server.server_address
    with allox.Client(url, token="t") as c:
        t0 = time.monotonic()
        s = c.exec_stream("a", "s", ["x"])
        times = []
        for ev in s:
            times.append((time.monotonic() - t0, ev.data))
        end = time.monotonic() - t0
    assert [d for _, d in times] == [b"a\n", b"b\n"]
    assert times[0][0] < 0.7 <= end, (times, end)
    assert s.result.exit_code == 0


def test_a_connection_cut_mid_stream_is_broken(slow_server):
    slow_server.mode = "cut"
    url = "http://%s:%d" % slow_server.server_address
    got = []
    with allox.Client(url, token="t") as c:
        with pytest.raises(allox.StreamBroken):
            for ev in c.exec_stream("a", "s", ["x"]):
                got.append(ev.data)
    assert got == [b"a\n", b"b\n"]


def test_async_events_arrive_as_they_are_sent(slow_server):
    url = "http://%s:%d" % slow_server.server_address

    async def main():
        async with allox.AsyncClient(url, token="t") as c:
            t0 = time.monotonic()
            first = None
            async with c.exec_stream("a", "s", ["x"]) as s:
                async for ev in s:
                    if first is None:
                        first = time.monotonic() - t0
                result = await s.wait()
            return first, time.monotonic() - t0, result

    first, end, result = asyncio.run(main())
    assert first < 0.7 <= end and result.exit_code == 0


def test_closing_a_stream_ends_it():
    def body():
        yield line({"event": {"progress": {"message": "1"}}})
        yield line({"event": {"progress": {"message": "2"}}})
        yield line({"result": {}})

    with allox.Client("http://gw.test", token="t", transport=httpx.MockTransport(lambda r: ndjson(body()))) as c:
        with c.stream("process.events", follow=True) as s:
            assert next(s) == allox.Progress("1")
        with pytest.raises(allox.StreamBroken):
            next(s)
