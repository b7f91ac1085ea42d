"""Fixtures: a real daemon on a real loop-backed Btrfs, and the gateway in
front of it.

``gateway`` (once per test run) makes a sparse image, ``mkfs.btrfs -q``,
``mount -o loop``; starts ``$ALLOX_INIT supervise --root MNT/allox --listen
unix:SOCK`` (under a cgroup of its own below the cgroup2 mount) and
``$ALLOXCTL gateway --listen 127.0.0.1:0 --token-file FILE`` with
``ALLOX_SOCKET``; waits for both and yields ``(base_url, token)``. At the
end it stops both, kills what the sessions left, unmounts and deletes
everything.

Nothing is skipped: without root, loop devices, Btrfs, a cgroup2 mount, or
with ``ALLOX_INIT``/``ALLOXCTL`` unset or wrong, every test that needs the
gateway fails with a message naming what is missing. (The unit tests in
test_unit.py need none of it.)

``ALLOX_DAEMON_ARGS`` adds arguments to the daemon (shell syntax), and
``ALLOX_TEST_KEEP=1`` keeps the work directory (logs) after the run.
``make_gateway(daemon_args)`` gives a test a daemon and a gateway of its
own (test_every_action.py: one with every plugin).

Every answer of these gateways is checked against the OpenAPI document
``clients/python/openapi.json`` (``OpenAPICheck``, a response hook of every
``httpx`` client the tests make): one that does not fit fails the test that
got it, naming the action, where in the answer and why. At the end a line
says how many were checked: ``openapi: N answers of M actions validated``
(``-v`` adds the counts per action). The check needs ``jsonschema``.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import unquote

import httpx
import pytest

HERE = Path(__file__).resolve().parent
try:
    import allox  # installed: pip install ./clients/python
except ImportError:  # or straight from this checkout
    sys.path.insert(0, str(HERE.parent))
    import allox

START_TIMEOUT = 30.0


# -- every answer of the gateway, checked against its OpenAPI document ---------------

#: The document the answers are checked against: the one checked in beside
#: the client (test_openapi.py checks that the gateway serves the same).
OPENAPI_DOC = HERE.parent / "openapi.json"
_DOC_URI = "urn:allox:openapi.json"
_JSON, _NDJSON = "application/json", "application/x-ndjson"


def _pointer(*parts: str) -> str:
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def _ctype(response: httpx.Response) -> str:
    return response.headers.get("Content-Type", "").split(";")[0].strip().lower()


class AnswerInvalid(AssertionError):
    """An answer of the gateway that its OpenAPI document does not allow."""


class OpenAPICheck:
    """Checks the answers of the gateways the fixtures started against
    ``openapi.json`` with ``jsonschema`` (Draft 2020-12; ``$ref``s resolve
    against the whole document): a 200 JSON answer of ``/v1/rpc/{action}``
    or ``/v1/rpc`` against the action's ``application/json`` schema, an
    error (any other status) against ``ErrorAnswer``, each line of an NDJSON
    stream against the action's ``application/x-ndjson`` schema.

    ``on_response``/``on_response_async`` are response hooks of every
    ``httpx.Client``/``httpx.AsyncClient`` made while the tests run
    (``httpx.Client.__init__`` is wrapped), so the SDK's clients and the raw
    ``httpx`` calls are all checked; only requests to a gateway a fixture
    started (``watch``) are looked at. An answer that does not fit raises
    :class:`AnswerInvalid` in the call that got it, and is kept so that the
    test fails even if that was swallowed (a thread, ``pytest.raises``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.origins: set[tuple[str, int]] = set()
        self._doc: dict[str, Any] | None = None
        self._make: Callable[[str], Any] | None = None
        self._validators: dict[str, Any] = {}
        self._lock = threading.Lock()
        #: Per action: answers checked (a stream is one), results, errors, stream lines.
        self.answers: collections.Counter[str] = collections.Counter()
        self.results: collections.Counter[str] = collections.Counter()
        self.errors: collections.Counter[str] = collections.Counter()
        self.lines: collections.Counter[str] = collections.Counter()
        self._failures: list[str] = []
        #: Actions that could only get an error, and why (test_every_action.py).
        self.error_only: dict[str, str] = {}

    # -- the document -------------------------------------------------------------

    @property
    def doc(self) -> dict[str, Any]:
        if self._doc is None:
            self._doc = json.loads(self.path.read_text())
        return self._doc

    @functools.cached_property
    def actions(self) -> set[str]:
        """The actions of the document (its ``/v1/rpc/{action}`` paths)."""
        return {p[len("/v1/rpc/"):] for p in self.doc["paths"] if p.startswith("/v1/rpc/")}

    def _content_pointer(self, action: str, media: str) -> str | None:
        path = f"/v1/rpc/{action}" if action in self.actions else "/v1/rpc"
        content = self.doc["paths"][path]["post"]["responses"]["200"].get("content", {})
        if media not in content:
            return None
        return _pointer("paths", path, "post", "responses", "200", "content", media, "schema")

    def _validator(self, pointer: str) -> Any:
        v = self._validators.get(pointer)
        if v is not None:
            return v
        if self._make is None:
            self._make = self._factory()
        v = self._validators[pointer] = self._make(pointer)
        return v

    def _factory(self) -> Callable[[str], Any]:
        try:
            import jsonschema
        except ImportError:
            self.fail(
                "the gateway's answers are checked against openapi.json with jsonschema, which is not installed: "
                "/var/tmp/allox-venv/bin/pip install jsonschema (or apt-get install python3-jsonschema)"
            )
        doc = self.doc
        cls = jsonschema.Draft202012Validator
        try:
            from referencing import Registry, Resource
            from referencing.jsonschema import DRAFT202012
        except ImportError:  # jsonschema < 4.18 (Debian's 4.10): a RefResolver
            resolver = jsonschema.RefResolver(_DOC_URI, doc, store={_DOC_URI: doc})
            return lambda pointer: cls({"$ref": _DOC_URI + "#" + pointer}, resolver=resolver)
        registry = Registry().with_resource(_DOC_URI, Resource.from_contents(doc, default_specification=DRAFT202012))
        return lambda pointer: cls({"$ref": _DOC_URI + "#" + pointer}, registry=registry)

    # -- checking -----------------------------------------------------------------

    def watch(self, base_url: str) -> None:
        """Checks the answers of the gateway at ``base_url`` from now on."""
        u = httpx.URL(base_url)
        self.origins.add((u.host, u.port or 80))

    def fail(self, message: str) -> None:
        with self._lock:
            self._failures.append(message)
        raise AnswerInvalid(message)

    def take_failures(self) -> list[str]:
        with self._lock:
            out, self._failures = self._failures, []
        return out

    def validate(self, action: str, pointer: str, instance: Any, what: str) -> None:
        errors = list(self._validator(pointer).iter_errors(instance))
        if not errors:
            return
        lines = []
        for e in sorted(errors, key=lambda e: list(e.absolute_path))[:3]:
            lines.append(f"  at {_where(e)}: {_short(e.message)}")
            deep = _deepest(e)
            if deep is not e:
                lines.append(f"    (deepest: at {_where(deep)}: {_short(deep.message)}, schema {'/'.join(map(str, deep.absolute_schema_path))})")
        self.fail(
            f"openapi: {action}: {what} does not fit the document (#{pointer}):\n" + "\n".join(lines)
            + f"\n  the answer: {_short(json.dumps(instance), 600)}"
        )

    def rpc_action(self, request: httpx.Request) -> str | None:
        """The action of a request to a watched gateway's ``/v1/rpc``, or
        ``None`` for any other request."""
        url = request.url
        if (url.host, url.port or 80) not in self.origins:
            return None
        path = url.path
        if path.startswith("/v1/rpc/"):
            return unquote(path[len("/v1/rpc/"):])
        if path != "/v1/rpc":
            return None
        try:
            body = json.loads(request.content)
        except (ValueError, httpx.RequestNotRead):
            return "(no action)"
        action = body.get("action") if isinstance(body, dict) else None
        return action if isinstance(action, str) else "(no action)"

    def check_answer(self, action: str, response: httpx.Response) -> None:
        """A whole (not streamed) answer."""
        status, content = response.status_code, response.content
        what = f"the HTTP {status} answer"
        try:
            body = json.loads(content)
        except ValueError:
            self.fail(f"openapi: {action}: {what} is not JSON ({_ctype(response) or 'no Content-Type'}): {content[:200]!r}")
        if _ctype(response) != _JSON:
            self.fail(f"openapi: {action}: {what} comes as {_ctype(response) or 'no Content-Type'}, not {_JSON}")
        if status == 200:
            pointer = self._content_pointer(action, _JSON)
            if pointer is None:
                self.fail(f"openapi: {action}: answered {_JSON} with 200; the document has no {_JSON} answer for it (only a stream)")
            self.validate(action, pointer, body, what)
            counter = self.results
        else:
            self.validate(action, _pointer("components", "schemas", "ErrorAnswer"), body, what)
            counter = self.errors
        with self._lock:
            self.answers[action] += 1
            counter[action] += 1

    def check_line(self, action: str, n: int, line: bytes) -> None:
        """Line ``n`` of an NDJSON answer."""
        try:
            obj = json.loads(line)
        except ValueError:
            self.fail(f"openapi: {action}: line {n} of the stream is not JSON: {line[:200]!r}")
        pointer = self._content_pointer(action, _NDJSON)
        if pointer is None:
            self.fail(f"openapi: {action}: answered {_NDJSON}; the document has no {_NDJSON} answer for it")
        self.validate(action, pointer, obj, f"line {n} of the stream")
        with self._lock:
            if n == 1:
                self.answers[action] += 1
            if isinstance(obj, dict) and "result" in obj:
                self.results[action] += 1
            elif isinstance(obj, dict) and "error" in obj:
                self.errors[action] += 1
            else:
                self.lines[action] += 1

    # -- the hooks --------------------------------------------------------------------

    def on_response(self, response: httpx.Response) -> None:
        action = self.rpc_action(response.request)
        if action is None:
            return
        if response.status_code == 200 and _ctype(response) == _NDJSON:
            response.stream = _CheckedStream(response.stream, _Lines(self, action))
            return
        response.read()
        self.check_answer(action, response)

    async def on_response_async(self, response: httpx.Response) -> None:
        action = self.rpc_action(response.request)
        if action is None:
            return
        if response.status_code == 200 and _ctype(response) == _NDJSON:
            response.stream = _ACheckedStream(response.stream, _Lines(self, action))
            return
        await response.aread()
        self.check_answer(action, response)

    def summary(self) -> str:
        n = sum(self.answers.values())
        m = len(set(self.answers) & self.actions)
        return f"openapi: {n} answers of {m} actions validated"


def _deepest(e: Any) -> Any:
    """Below a ``oneOf``/``anyOf`` that nothing fit: the error of the branch
    that fit the answer furthest (the one it was most likely meant to be)."""
    while e.context:
        e = max(e.context, key=lambda x: (len(x.absolute_path), len(x.absolute_schema_path)))
    return e


def _where(e: Any) -> str:
    return "/" + "/".join(map(str, e.absolute_path)) if e.absolute_path else "/ (the whole answer)"


def _short(text: str, n: int = 300) -> str:
    return text if len(text) <= n else text[:n] + f"... ({len(text)} characters)"


class _Lines:
    """Splits an NDJSON body into lines as it comes and checks each."""

    def __init__(self, check: OpenAPICheck, action: str) -> None:
        self.check, self.action = check, action
        self.buf = bytearray()
        self.n = 0

    def feed(self, chunk: bytes) -> None:
        self.buf += chunk
        while (nl := self.buf.find(b"\n")) >= 0:
            line = bytes(self.buf[:nl]).strip()
            del self.buf[: nl + 1]
            if line:
                self.n += 1
                self.check.check_line(self.action, self.n, line)

    def end(self) -> None:
        rest = bytes(self.buf).strip()
        self.buf.clear()
        if rest:
            self.n += 1
            self.check.check_line(self.action, self.n, rest)


class _CheckedStream(httpx.SyncByteStream):
    def __init__(self, inner: Any, lines: _Lines) -> None:
        self.inner, self.lines = inner, lines

    def __iter__(self):
        for chunk in self.inner:
            self.lines.feed(chunk)
            yield chunk
        self.lines.end()

    def close(self) -> None:
        self.inner.close()


class _ACheckedStream(httpx.AsyncByteStream):
    def __init__(self, inner: Any, lines: _Lines) -> None:
        self.inner, self.lines = inner, lines

    async def __aiter__(self):
        async for chunk in self.inner:
            self.lines.feed(chunk)
            yield chunk
        self.lines.end()

    async def aclose(self) -> None:
        await self.inner.aclose()


OPENAPI = OpenAPICheck(OPENAPI_DOC)


def _hook_every_client() -> None:
    """Every ``httpx.Client`` and ``httpx.AsyncClient`` made from now on
    (``httpx.get``/``httpx.post`` make one too) checks its answers."""
    if getattr(httpx.Client.__init__, "_allox_openapi", False):
        return
    sync_init, async_init = httpx.Client.__init__, httpx.AsyncClient.__init__

    @functools.wraps(sync_init)
    def client_init(self, *args, **kwargs):
        sync_init(self, *args, **kwargs)
        self.event_hooks["response"].append(OPENAPI.on_response)

    @functools.wraps(async_init)
    def async_client_init(self, *args, **kwargs):
        async_init(self, *args, **kwargs)
        self.event_hooks["response"].append(OPENAPI.on_response_async)

    client_init._allox_openapi = True  # type: ignore[attr-defined]
    httpx.Client.__init__ = client_init  # type: ignore[method-assign]
    httpx.AsyncClient.__init__ = async_client_init  # type: ignore[method-assign]


_hook_every_client()


@pytest.fixture(scope="session")
def openapi_check() -> OpenAPICheck:
    """The checker of every answer (its counts: ``answers``, ``results``, ...)."""
    return OPENAPI


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """An answer that did not fit the document fails the test (the phase:
    setup, call or teardown) that got it, even if the test swallowed the
    exception."""
    outcome = yield
    rep = outcome.get_result()
    failures = OPENAPI.take_failures()
    if not failures:
        return
    text = "answers of the gateway that openapi.json does not allow:\n" + "\n".join(failures)
    if rep.passed:
        rep.outcome = "failed"
        rep.longrepr = text
    else:
        rep.sections.append(("openapi", text))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [OPENAPI.summary()]
    if session.config.option.verbose > 0 and OPENAPI.answers:
        lines += [
            f"  {a}: {OPENAPI.answers[a]} answers ({OPENAPI.results[a]} results, {OPENAPI.errors[a]} errors, {OPENAPI.lines[a]} events)"
            for a in sorted(OPENAPI.answers)
        ]
    if OPENAPI.error_only:
        lines.append("openapi: only errors from " + "; ".join(f"{a} ({why})" for a, why in sorted(OPENAPI.error_only.items())))
    for line in lines:
        if tr is not None:
            tr.write_line(line)
        else:
            print(line)


class Gateway(NamedTuple):
    """What the ``gateway`` fixture yields: unpacks as ``(base_url, token)``."""

    base_url: str
    token: str


@dataclass
class Env:
    work: Path
    mnt: Path
    root: Path
    socket: Path
    token_file: Path
    cgroup: Path
    daemon: subprocess.Popen
    gateway: subprocess.Popen | None
    daemon_log: Path
    gateway_log: Path
    base_url: str = ""
    token: str = ""


def _fail(msg: str) -> None:
    pytest.fail(msg, pytrace=False)


def _binary(var: str) -> str:
    path = os.environ.get(var)
    if not path:
        _fail(
            f"{var} is not set: point it at the {var.lower().replace('_', '-')} binary to test, e.g. "
            f"{var}=/work/ci/target/x86_64-unknown-linux-gnu/debug/{'allox-init' if var == 'ALLOX_INIT' else 'alloxctl'}"
        )
    if not os.path.isfile(path):
        _fail(f"{var}={path}: no such file")
    if not os.access(path, os.X_OK):
        _fail(f"{var}={path}: not executable")
    return path


def cgroup2_mount() -> Path | None:
    for p in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        if Path(p, "cgroup.subtree_control").exists():
            return Path(p)
    return None


def _missing() -> list[str]:
    miss = []
    if os.geteuid() != 0:
        miss.append("root (the daemon mounts Btrfs and makes sandboxes; run pytest as root)")
    for tool, pkg in (("mkfs.btrfs", "btrfs-progs"), ("mount", "mount"), ("umount", "mount")):
        if shutil.which(tool) is None:
            miss.append(f"{tool} (apt-get install {pkg})")
    if not Path("/dev/loop-control").exists():
        miss.append("loop devices (/dev/loop-control)")
    fs = Path("/proc/filesystems").read_text() if Path("/proc/filesystems").exists() else ""
    if "btrfs" not in fs and not Path("/sys/module/btrfs").exists():
        subprocess.run(["modprobe", "btrfs"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        fs = Path("/proc/filesystems").read_text()
        if "btrfs" not in fs:
            miss.append("the btrfs kernel module (modprobe btrfs)")
    if cgroup2_mount() is None:
        miss.append("a cgroup2 mount (/sys/fs/cgroup or /sys/fs/cgroup/unified) for the sessions' processes")
    return miss


def _run(cmd: list[str]) -> None:
    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}")


def _tail(path: Path, n: int = 40) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no {path})"
    return "\n".join(lines[-n:])


def _stop(p: subprocess.Popen | None, timeout: float) -> None:
    if p is None or p.poll() is not None:
        return
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(5)


def _remove_cgroup(cg: Path) -> None:
    if not cg.exists():
        return
    try:
        (cg / "cgroup.kill").write_text("1")
    except OSError:
        pass
    for _ in range(100):
        try:
            if "populated 1" not in (cg / "cgroup.events").read_text():
                break
        except OSError:
            break
        time.sleep(0.05)
    for d in sorted((p for p in cg.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        try:
            d.rmdir()
        except OSError:
            pass
    try:
        cg.rmdir()
    except OSError as e:
        print(f"conftest: cannot remove cgroup {cg}: {e}", file=sys.stderr)


def _umount(mnt: Path) -> None:
    for _ in range(50):
        if subprocess.run(["umount", str(mnt)], stderr=subprocess.DEVNULL, check=False).returncode == 0:
            return
        if not os.path.ismount(mnt):
            return
        time.sleep(0.1)
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _wait_socket(path: Path, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if proc.poll() is not None:
            _fail(f"allox-init exited ({proc.returncode}) before serving {path}:\n{_tail(log)}")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(str(path))
            return
        except OSError:
            pass
        if time.monotonic() > deadline:
            _fail(f"allox-init did not listen on {path} within {START_TIMEOUT:.0f} s:\n{_tail(log)}")
        time.sleep(0.05)


def _wait_gateway(proc: subprocess.Popen, log: Path, token_file: Path) -> tuple[str, str]:
    deadline = time.monotonic() + START_TIMEOUT
    addr = None
    while addr is None:
        if proc.poll() is not None:
            _fail(f"alloxctl gateway exited ({proc.returncode}) before listening:\n{_tail(log)}")
        m = re.search(r"http://([0-9.]+:\d+)/", log.read_text(errors="replace") if log.exists() else "")
        if m:
            addr = m.group(1)
            break
        if time.monotonic() > deadline:
            _fail(f"alloxctl gateway did not say where it listens within {START_TIMEOUT:.0f} s:\n{_tail(log)}")
        time.sleep(0.05)
    base_url = f"http://{addr}"
    token = token_file.read_text().strip()
    # Served once a ping comes back.
    last = ""
    while True:
        try:
            r = httpx.post(
                f"{base_url}/v1/rpc",
                content=b'{"action":"system.ping","params":{}}',
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
                timeout=5,
            )
            if r.status_code == 200:
                return base_url, token
            last = f"HTTP {r.status_code}: {r.text[:200]}"
        except httpx.HTTPError as e:
            last = repr(e)
        if proc.poll() is not None or time.monotonic() > deadline:
            _fail(f"the gateway at {base_url} does not answer system.ping ({last}):\n{_tail(log)}")
        time.sleep(0.1)


@contextlib.contextmanager
def start_allox(daemon_args: list[str] = (), *, label: str = "pytest", show_logs: Callable[[], bool] = lambda: False):
    """A daemon (``allox-init supervise`` with ``daemon_args`` added) on a
    loop-backed Btrfs of its own, and a gateway in front of it: yields the
    :class:`Env`; stops and removes everything at the end (printing both
    logs if ``show_logs()`` says so). Its answers are checked against the
    OpenAPI document (see ``OpenAPICheck``)."""
    init = _binary("ALLOX_INIT")
    ctl = _binary("ALLOXCTL")
    miss = _missing()
    if miss:
        _fail("these tests need the real daemon on a loop-backed Btrfs; this machine lacks: " + "; ".join(miss))
    Path("/var/tmp").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"allox-{label}-", dir="/var/tmp"))
    img, mnt = work / "fs.img", work / "mnt"
    mnt.mkdir()
    cg_mount = cgroup2_mount()
    assert cg_mount is not None
    cgroup = cg_mount / f"allox-{label}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    env: Env | None = None
    mounted = False
    try:
        with open(img, "wb") as f:
            f.truncate(1 << 30)
        try:
            _run(["mkfs.btrfs", "-q", "-f", str(img)])
            _run(["mount", "-o", "loop", str(img), str(mnt)])
        except RuntimeError as e:
            _fail(f"cannot make the loop-backed Btrfs: {e}")
        mounted = True
        root = mnt / "allox"
        root.mkdir()
        cgroup.mkdir(exist_ok=True)
        sock = work / "ctl.sock"
        token_file = work / "gateway.token"
        daemon_log, gateway_log = work / "daemon.log", work / "gateway.log"
        args = [
            init, "supervise", "--root", str(root), "--listen", f"unix:{sock}",
            "--cgroup-root", str(cgroup), "--sandbox-stage", str(work / "stage"),
        ] + list(daemon_args)
        denv = dict(os.environ)
        denv.setdefault("ALLOX_LOG", "warn")
        with open(daemon_log, "wb") as out:
            daemon = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=denv)
        env = Env(work, mnt, root, sock, token_file, cgroup, daemon, None, daemon_log, gateway_log)
        _wait_socket(sock, daemon, daemon_log)
        genv = dict(os.environ, ALLOX_SOCKET=str(sock))
        genv.pop("ALLOX_TOKEN_FILE", None)
        with open(gateway_log, "wb") as out:
            env.gateway = subprocess.Popen(
                [ctl, "gateway", "--listen", "127.0.0.1:0", "--token-file", str(token_file)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=genv,
            )
        env.base_url, env.token = _wait_gateway(env.gateway, gateway_log, token_file)
        OPENAPI.watch(env.base_url)
        yield env
    finally:
        if env is not None:
            _stop(env.gateway, 10)
            _stop(env.daemon, 30)
            if show_logs():
                print(f"\n--- gateway log ({env.gateway_log}) ---\n{_tail(env.gateway_log)}", file=sys.stderr)
                print(f"--- daemon log ({env.daemon_log}) ---\n{_tail(env.daemon_log)}", file=sys.stderr)
        _remove_cgroup(cgroup)
        if mounted:
            _umount(mnt)
        if os.environ.get("ALLOX_TEST_KEEP") == "1":
            print(f"conftest: kept {work}", file=sys.stderr)
            img.unlink(missing_ok=True)
        elif not os.path.ismount(mnt):
            shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def allox_env(request: pytest.FixtureRequest):
    """The daemon and the gateway (see the module's docstring)."""
    args = shlex.split(os.environ.get("ALLOX_DAEMON_ARGS", ""))
    with start_allox(args, show_logs=lambda: bool(request.session.testsfailed)) as env:
        yield env


@pytest.fixture
def make_gateway(request: pytest.FixtureRequest):
    """``make_gateway(daemon_args, label=...)``: a daemon and a gateway of
    this test's own (on their own Btrfs), stopped and removed when the test
    ends; returns the :class:`Env`."""
    with contextlib.ExitStack() as stack:

        def make(daemon_args: list[str] = (), label: str = "own") -> Env:
            return stack.enter_context(
                start_allox(daemon_args, label=label, show_logs=lambda: bool(request.session.testsfailed))
            )

        yield make


@pytest.fixture(scope="session")
def gateway(allox_env: Env) -> Gateway:
    """``(base_url, token)`` of the running gateway."""
    return Gateway(allox_env.base_url, allox_env.token)


@pytest.fixture
def client(gateway: Gateway):
    with allox.Client(gateway.base_url, token=gateway.token) as c:
        yield c


@pytest.fixture
def agent(client) -> str:
    """A new agent of this test's own (deleted afterwards)."""
    name = f"agent-{uuid.uuid4().hex[:10]}"
    client.agent_create(name)
    yield name
    try:
        client.agent_delete(name, force=True)
    except allox.AlloxError:
        pass
