"""What the sync and the async client share: the token, the shape of a
request, reading answers and NDJSON streams, the files' URLs."""

from __future__ import annotations

import json
import keyword
import os
import secrets
import socket
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from . import models
from ._model import Model, encode
from .errors import (
    AlloxError,
    Internal,
    StreamBroken,
    StreamUnsupported,
    Unauthorized,
    code_for_status,
    error_from,
    error_from_body,
)
from .events import Event, parse_event

DEFAULT_URL = "http://127.0.0.1:8092"
DEFAULT_TOKEN_FILE = "/run/allox/gateway.token"
RPC_PATH = "/v1/rpc"
FILES_PATH = "/v1/files"
JSON = "application/json"
NDJSON = "application/x-ndjson"
USER_AGENT = "allox-python/0.1"
#: Bytes of a file read or sent at a time.
CHUNK = 512 * 1024


def resolve_url(base_url: str | None) -> str:
    url = base_url or os.environ.get("ALLOX_GATEWAY_URL") or DEFAULT_URL
    return url.rstrip("/")


def resolve_token(token: str | None, token_file: str | os.PathLike[str] | None) -> tuple[str | None, str]:
    """The bearer token and where it came from: ``token``, else the file
    ``token_file``, else ``$ALLOX_TOKEN``, else the file ``$ALLOX_TOKEN_FILE``,
    else ``/run/allox/gateway.token`` if it can be read."""
    if token is not None:
        return token.strip(), "token="
    if token_file is not None:
        return Path(token_file).read_text().strip(), f"token_file={os.fspath(token_file)}"
    env = os.environ.get("ALLOX_TOKEN")
    if env:
        return env.strip(), "$ALLOX_TOKEN"
    env_file = os.environ.get("ALLOX_TOKEN_FILE")
    if env_file:
        return Path(env_file).read_text().strip(), f"$ALLOX_TOKEN_FILE={env_file}"
    try:
        return Path(DEFAULT_TOKEN_FILE).read_text().strip(), DEFAULT_TOKEN_FILE
    except OSError:
        return None, "none (pass token= or token_file=, or set ALLOX_TOKEN_FILE)"


def rpc_url(http: httpx.Client | httpx.AsyncClient) -> httpx.URL:
    """``/v1/rpc`` below the client's ``base_url``, made once: what
    ``build_request`` would make of the relative path on every call."""
    base = http.base_url
    return base.copy_with(raw_path=base.raw_path + RPC_PATH.lstrip("/").encode("ascii"))


def no_delay(response: httpx.Response) -> None:
    """Turns Nagle's algorithm off (``TCP_NODELAY``) on the connection
    ``response`` came on, once per connection. httpcore before 0.17 leaves
    it on for sync sockets, and it writes a request's headers and its body
    apart: on a kept-alive connection the body then waits for the ACK of the
    headers, which Linux delays by 40 ms. (asyncio sets it itself.)"""
    stream = response.extensions.get("network_stream")
    if stream is None or getattr(stream, "_allox_no_delay", False):
        return
    try:
        sock = stream.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except (OSError, AttributeError, TypeError, ValueError):
        pass
    try:
        stream._allox_no_delay = True
    except AttributeError:
        pass


def shutdown(response: httpx.Response) -> None:
    """Shuts the connection of ``response`` down (both ways), so that a
    read blocked on it returns."""
    stream = response.extensions.get("network_stream")
    try:
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
    except (OSError, AttributeError, TypeError, ValueError):
        pass


def headers(token: str | None) -> dict[str, str]:
    h = {"User-Agent": USER_AGENT}
    if token:
        h["Authorization"] = f"Bearer {token}"
    return h


def _json_key(k: str) -> str:
    # `from_` for `from`: Python keywords cannot be keyword arguments.
    if k.endswith("_") and keyword.iskeyword(k[:-1]):
        return k[:-1]
    return k


def build_params(params: Mapping[str, Any] | Model | None, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The params object: ``params`` (a dict or a model) and the keyword
    arguments over it; ``None`` values left out (an omitted ``Option``), bytes
    as base64, models as objects, ``from_`` as ``from``."""
    out: dict[str, Any] = {}
    if isinstance(params, Model):
        out.update(params.to_dict())
    elif params is not None:
        out.update({_json_key(k): v for k, v in params.items()})
    out.update({_json_key(k): v for k, v in kwargs.items()})
    return {k: encode(v) for k, v in out.items() if v is not None}


#: The headers of an action's request, by what it accepts.
RPC_HEADERS = {
    JSON: {"Content-Type": JSON, "Accept": JSON},
    NDJSON: {"Content-Type": JSON, "Accept": NDJSON},
}


class LocalOut:
    """Where a download goes. A path to a regular file (or to none yet) is
    written aside, under a fresh name beside it, and put in its place only
    once all of it came (``done``): a download that fails leaves the file
    as it was (it was emptied before the answer was known). A device or a
    FIFO is written to; a symbolic link is followed; a file object given is
    written to as it is."""

    def __init__(self, dest: Any) -> None:
        self.tmp: str | None = None
        self.mode: int | None = None
        self.own = not hasattr(dest, "write")
        if not self.own:
            self.f = dest
            return
        self.path = os.path.realpath(os.fspath(dest))
        try:
            st: os.stat_result | None = os.stat(self.path)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            self.f = open(self.path, "wb")
            return
        folder, base = os.path.split(self.path)
        self.mode = None if st is None else stat.S_IMODE(st.st_mode)
        while True:
            tmp = os.path.join(folder, f".{base}.{secrets.token_hex(6)}.partial")
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600 if st else 0o666)
                break
            except FileExistsError:
                continue
        self.tmp = tmp
        self.f = os.fdopen(fd, "wb")

    def write(self, data: bytes) -> None:
        self.f.write(data)

    def done(self) -> None:
        if not self.own:
            return
        self.f.flush()
        if self.tmp is not None:
            os.fsync(self.f.fileno())
            if self.mode is not None:
                os.fchmod(self.f.fileno(), self.mode)
        self.f.close()
        if self.tmp is not None:
            os.replace(self.tmp, self.path)

    def failed(self) -> None:
        if not self.own:
            return
        self.f.close()
        if self.tmp is not None:
            try:
                os.unlink(self.tmp)
            except FileNotFoundError:
                pass


def waits_for_a_run(action: str, params: Mapping[str, Any]) -> bool:
    """Whether a call waits for a run's end (``process.start`` with
    ``wait``, ``process.wait``): it has no read timeout of its own, as the
    gateway lets it go as long as the run may be (a run longer than the
    client's timeout was cut with no result)."""
    if action == "process.wait":
        return True
    return action == "process.start" and bool(params.get("wait")) and not params.get("stream")


def without_read_timeout(t: httpx.Timeout) -> httpx.Timeout:
    return httpx.Timeout(t.connect, connect=t.connect, read=None, write=t.write, pool=t.pool)


def rpc_body(action: str, params: dict[str, Any]) -> bytes:
    return json.dumps({"action": action, "params": params}, separators=(",", ":")).encode()


def _body_json(content: bytes) -> Any:
    try:
        return json.loads(content)
    except ValueError:
        return None


def raise_for_answer(status: int, content: bytes, token_source: str | None = None) -> None:
    """Raises the error of a non-200 answer."""
    body = _body_json(content)
    err = error_from_body(body, status)
    if err is None:
        text = content[:300].decode("utf-8", errors="replace").strip()
        err = error_from(code_for_status(status), f"HTTP {status} without an error body: {text!r}", status)
    if isinstance(err, Unauthorized) and status == 401 and token_source and token_source.startswith("none"):
        err.message += f" [this client has no token: {token_source}]"
    raise err


def result_of(status: int, content: bytes, token_source: str | None = None) -> Any:
    """The ``result`` of an ``/v1/rpc`` answer, or its error raised."""
    if status != 200:
        raise_for_answer(status, content, token_source)
    body = _body_json(content)
    if isinstance(body, dict):
        if "result" in body:
            return body["result"]
        err = error_from_body(body, status)
        if err is not None:
            raise err
    raise Internal("internal", f"the gateway's answer has neither result nor error: {content[:300]!r}", status)


def result_of_file(status: int, content: bytes, token_source: str | None = None) -> dict[str, Any]:
    """The JSON answer of a file's ``PUT`` (``{"path": ..., "size": ...}``)."""
    if status != 200:
        raise_for_answer(status, content, token_source)
    body = _body_json(content)
    return body if isinstance(body, dict) else {"answer": content.decode("utf-8", errors="replace")}


def parse(model: str | None, data: Any) -> Any:
    """``data`` as ``models.<model>`` (the dict itself when the models have no
    such class, e.g. after regenerating them from another document)."""
    if model is None:
        return data
    cls = getattr(models, model, None)
    if cls is None or not isinstance(data, dict):
        return data
    return cls.from_dict(data)


def parse_run(data: Any) -> Any:
    """A ``process.start`` answer: ``RunResult`` when it carries an exit
    status (``wait``), else ``RunStarted``."""
    if isinstance(data, dict) and ("exit_code" in data or "stdout" in data or "signal" in data):
        return parse("RunResult", data)
    return parse("RunStarted", data)


def typed_result(action: str, data: Any) -> Any:
    """``data`` as the result type ``models.ACTIONS`` gives ``action``."""
    from ._model import decode

    entry = getattr(models, "ACTIONS", {}).get(action)
    if entry is None:
        return data
    return decode(entry[1], data)


def file_url(agent_id: str, session_id: str, path: str) -> str:
    segments = [s for s in str(path).split("/")]
    # Leading and doubled slashes are the daemon's to judge; keep them as
    # empty segments rather than dropping them silently.
    return "/".join(
        [FILES_PATH, quote(agent_id, safe=""), quote(session_id, safe="")]
        + [quote(s, safe="") for s in segments]
    )


def file_query(checkpoint: str | None, scope: str | None) -> dict[str, str]:
    q: dict[str, str] = {}
    if checkpoint is not None:
        q["checkpoint"] = checkpoint
    if scope is not None:
        q["scope"] = scope
    return q


def check_length(response: httpx.Response, got: int) -> None:
    """A file's body must be as long as its ``Content-Length`` said."""
    want = response.headers.get("Content-Length")
    if response.headers.get("Content-Encoding", "identity") != "identity":
        return  # the length is the encoded body's
    if want is not None and want.isdigit() and int(want) != got:
        raise StreamBroken(f"the file's body was cut: {got} of {want} bytes came", response.status_code)


def transport_message(e: Exception, what: str) -> str:
    if isinstance(e, httpx.TimeoutException):
        return f"{what}: no answer in time ({type(e).__name__}: {e})"
    return f"{what}: {type(e).__name__}: {e}"


class StreamDecoder:
    """Reads an NDJSON answer: bytes in, events out, then the final result or
    error. After the final line (or a failure) ``done`` is true, and
    ``error`` holds the exception to raise once the events before it are
    handed out. ``finish()`` at the end of the body makes a missing last line
    a :class:`StreamBroken`."""

    def __init__(self, action: str) -> None:
        self.action = action
        self.buffer = bytearray()
        self.done = False
        self.result: Any = None
        self.error: AlloxError | None = None
        self.lines = 0

    def feed(self, data: bytes) -> list[Event]:
        """The events of the complete lines so far. After the final line the
        rest is ignored."""
        events: list[Event] = []
        if self.done:
            return events
        self.buffer += data
        while not self.done:
            nl = self.buffer.find(b"\n")
            if nl < 0:
                break
            line = bytes(self.buffer[:nl]).strip()
            del self.buffer[: nl + 1]
            if line:
                ev = self._line(line)
                if ev is not None:
                    events.append(ev)
        return events

    def _line(self, line: bytes) -> Event | None:
        self.lines += 1
        try:
            obj = json.loads(line)
        except ValueError:
            self.fail(StreamBroken(f"{self.action}: line {self.lines} of the stream is not JSON: {line[:200]!r}"))
            return None
        if not isinstance(obj, dict):
            return None
        if "event" in obj:
            return parse_event(obj["event"])
        if "result" in obj:
            self.done = True
            self.result = obj["result"]
            return None
        if "error" in obj:
            self.fail(error_from_body(obj, 200) or Internal("internal", repr(obj), 200))
            return None
        return None  # a line of a kind this client does not know

    def fail(self, error: AlloxError) -> None:
        if not self.done:
            self.done = True
            self.error = error

    def finish(self) -> list[Event]:
        """The body ended: the events of a last line without its newline, and
        :class:`StreamBroken` if the final line never came."""
        events: list[Event] = []
        if self.done:
            return events
        rest = bytes(self.buffer).strip()
        self.buffer.clear()
        if rest:
            try:
                json.loads(rest)
            except ValueError:
                self.fail(StreamBroken(f"{self.action}: the stream ended inside a line ({len(rest)} bytes of it came)"))
                return events
            ev = self._line(rest)
            if ev is not None:
                events.append(ev)
        if not self.done:
            self.fail(StreamBroken(
                f"{self.action}: the stream ended without its final result line "
                f"(after {self.lines} lines): the connection broke; what the call did is unknown"
            ))
        return events


def unstreamed(action: str, status: int, content: bytes, token_source: str | None) -> AlloxError:
    """The error for a streaming call answered with plain JSON: its own
    error, or :class:`StreamUnsupported` carrying the result."""
    result = result_of(status, content, token_source)  # raises an error answer
    return StreamUnsupported(
        f"{action}: the gateway answered {JSON}, not {NDJSON}: it does not stream "
        "(the call was made; its result is in .result, its events are lost)",
        status,
        result,
    )


def is_ndjson(response: httpx.Response) -> bool:
    ctype = response.headers.get("Content-Type", "")
    return ctype.split(";")[0].strip().lower() == NDJSON
