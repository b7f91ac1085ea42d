"""The sync client, on one ``httpx.Client`` (one keep-alive connection
pool for every call)."""

from __future__ import annotations

import collections
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import IO, Any, Callable

import httpx

from . import _core, models
from ._actions import Actions
from ._core import build_params
from ._model import Model
from .errors import AlloxError, StreamBroken, TransportError
from .events import Event
from .session import Session

DEFAULT_TIMEOUT = 60.0


def _timeout(timeout: float | httpx.Timeout | None) -> httpx.Timeout:
    if isinstance(timeout, httpx.Timeout):
        return timeout
    return httpx.Timeout(timeout, connect=None if timeout is None else min(timeout, 10.0))


class Stream:
    """The events of one streaming call, as they come, then its result.

    ``for event in stream: ...`` yields :class:`~allox.events.Started`,
    :class:`~allox.events.Output`, :class:`~allox.events.Progress` and
    :class:`~allox.events.Record` events; it ends when the final line comes
    (its error is raised then). ``stream.result`` is the final result
    (reading, and dropping, the events not yet read). A stream that ends
    without its final line raises :class:`~allox.errors.StreamBroken`.
    ``close()`` (or leaving ``with stream:``) ends a followed listing.
    """

    def __init__(self, client: Client, action: str, response: httpx.Response, parse: Callable[[Any], Any]) -> None:
        self.client = client
        self.action = action
        self.response = response
        self._parse = parse
        self._decoder = _core.StreamDecoder(action)
        self._pending: collections.deque[Event] = collections.deque()
        self._chunks: Iterator[bytes] = response.iter_bytes()
        self._raised = False
        self._result: Any = None
        self._closed = False

    def __repr__(self) -> str:
        state = "done" if self._decoder.done else "open"
        return f"<Stream {self.action} {state}>"

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> Event:
        while True:
            if self._pending:
                return self._pending.popleft()
            d = self._decoder
            if d.done:
                self.close()
                if d.error is not None and not self._raised:
                    self._raised = True
                    raise d.error
                raise StopIteration
            if self._closed:
                d.fail(StreamBroken(f"{self.action}: the stream was closed before its end"))
                continue
            try:
                chunk = next(self._chunks)
            except StopIteration:
                self._pending.extend(d.finish())
                continue
            except (httpx.HTTPError, httpx.StreamError) as e:
                what = "the stream was closed before its end" if self._closed else "the stream broke"
                d.fail(StreamBroken(_core.transport_message(e, f"{self.action}: {what}")))
                d.error.__cause__ = e  # type: ignore[union-attr]
                continue
            self._pending.extend(d.feed(chunk))

    @property
    def done(self) -> bool:
        """Whether the final line (or a failure) came."""
        return self._decoder.done

    @property
    def result(self) -> Any:
        """The final result (the events not yet read are read and dropped);
        the stream's error is raised instead if it ended with one."""
        return self.wait()

    def wait(self) -> Any:
        """Reads the rest of the stream and returns its result."""
        for _ in self:
            pass
        d = self._decoder
        if d.error is not None:
            raise d.error
        if self._result is None and d.result is not None:
            self._result = self._parse(d.result)
        return self._result

    def close(self) -> None:
        """Ends the stream (its connection is not reused). A thread blocked
        reading it wakes up: its iteration raises
        :class:`~allox.errors.StreamBroken`."""
        if not self._closed:
            self._closed = True
            if not self._decoder.done:
                # Closing a socket does not wake a recv() blocked on it in
                # another thread; shutting it down does.
                _core.shutdown(self.response)
            self.response.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Client(Actions):
    """A client of ``alloxctl gateway``.

    ``Client("http://127.0.0.1:8092", token_file="/run/allox/gateway.token")``;
    without ``token``/``token_file`` the token comes from ``$ALLOX_TOKEN``,
    the file ``$ALLOX_TOKEN_FILE``, or ``/run/allox/gateway.token``; without
    a URL, from ``$ALLOX_GATEWAY_URL`` or ``http://127.0.0.1:8092``.
    ``timeout`` (seconds, or an ``httpx.Timeout``) bounds each call; streams
    have no read timeout (they wait for events as long as it takes).
    Other keyword arguments go to ``httpx.Client`` (``transport=``, ...).
    """

    is_async = False

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        token_file: str | os.PathLike[str] | None = None,
        timeout: float | httpx.Timeout | None = DEFAULT_TIMEOUT,
        **httpx_options: Any,
    ) -> None:
        self.base_url = _core.resolve_url(base_url)
        self.token, self.token_source = _core.resolve_token(token, token_file)
        self.timeout = _timeout(timeout)
        self.http = httpx.Client(
            base_url=self.base_url,
            headers={**_core.headers(self.token), **dict(httpx_options.pop("headers", None) or {})},
            timeout=self.timeout,
            **httpx_options,
        )
        self._rpc_url = _core.rpc_url(self.http)

    def __repr__(self) -> str:
        return f"Client({self.base_url!r})"

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- transport -----------------------------------------------------------------

    def _send(self, request: httpx.Request, stream: bool = False) -> httpx.Response:
        try:
            r = self.http.send(request, stream=stream)
        except httpx.HTTPError as e:
            raise TransportError(_core.transport_message(e, f"{request.method} {request.url}")) from e
        _core.no_delay(r)
        return r

    def _rpc_request(self, action: str, params: dict[str, Any], accept: str, timeout: Any = httpx.USE_CLIENT_DEFAULT) -> httpx.Request:
        return self.http.build_request(
            "POST", self._rpc_url, content=_core.rpc_body(action, params), headers=_core.RPC_HEADERS[accept], timeout=timeout
        )

    def _invoke(self, action: str, params: dict[str, Any], parse: Callable[[Any], Any]) -> Any:
        timeout = _core.without_read_timeout(self.timeout) if _core.waits_for_a_run(action, params) else httpx.USE_CLIENT_DEFAULT
        r = self._send(self._rpc_request(action, params, _core.JSON, timeout))
        return parse(_core.result_of(r.status_code, r.content, self.token_source))

    def _open_stream(self, action: str, params: dict[str, Any], parse: Callable[[Any], Any]) -> Stream:
        timeout = httpx.Timeout(self.timeout.connect, connect=self.timeout.connect, read=None, write=self.timeout.write, pool=self.timeout.pool)
        r = self._send(self._rpc_request(action, params, _core.NDJSON, timeout), stream=True)
        if r.status_code != 200 or not _core.is_ndjson(r):
            try:
                content = r.read()
            except httpx.HTTPError as e:
                raise StreamBroken(_core.transport_message(e, f"{action}: the answer broke"), r.status_code) from e
            finally:
                r.close()
            if r.status_code != 200:
                _core.raise_for_answer(r.status_code, content, self.token_source)
            raise _core.unstreamed(action, r.status_code, content, self.token_source)
        return Stream(self, action, r, parse)

    # -- generic calls ---------------------------------------------------------------

    def call(self, action: str, params: Mapping[str, Any] | Model | None = None, /, **kwargs: Any) -> Any:
        """One action: ``call("agent.create", agent_id="agent-a")`` (or a
        params dict or model) -> the result as a dict. Errors are raised as
        :class:`~allox.errors.AlloxError` subclasses."""
        return self._invoke(action, build_params(params, kwargs), lambda r: r)

    def stream(self, action: str, params: Mapping[str, Any] | Model | None = None, /, **kwargs: Any) -> Stream:
        """One action answered as a stream (``Accept: application/x-ndjson``):
        its events, then ``stream.result`` (a dict)."""
        return self._open_stream(action, build_params(params, kwargs), lambda r: r)

    def export_session(
        self, agent_id: str, session_id: str, out: IO[bytes], *, since: str | None = None
    ) -> dict[str, Any]:
        """``session.export``: the session with its whole checkpoint history
        as an archive, written to ``out`` as it comes; returns the answer
        (``bytes``, ``checkpoints``). With ``since``, only what came after
        that checkpoint."""
        from .events import Archive

        p = build_params(None, dict(agent_id=agent_id, session_id=session_id, since=since))
        s = self.stream("session.export", p)
        got = 0
        for ev in s:
            if isinstance(ev, Archive):
                out.write(ev.data)
                got += len(ev.data)
        result = s.result
        if result.get("bytes") != got:
            raise StreamBroken(f"session.export: the daemon sent {result.get('bytes')} bytes, {got} came")
        return result

    def import_session(
        self, agent_id: str, source: bytes | IO[bytes], *, session_id: str | None = None, piece: int = 512 * 1024
    ) -> models.SessionImported:
        """``session.import``: a session made from an archive of
        :meth:`export_session` (bytes, or a file open for reading), sent in
        pieces; it appears whole when the last piece is in, or not at all.
        The agent must exist."""
        import base64
        import secrets

        if isinstance(source, (bytes, bytearray)):
            data = memoryview(source)
            chunks: Iterator[bytes] = (bytes(data[i : i + piece]) for i in range(0, len(data), piece))
        else:
            chunks = iter(lambda: source.read(piece), b"")
        import_id = f"py-{secrets.token_hex(8)}"
        offset = 0
        pending = next(chunks, b"")
        while True:
            following = next(chunks, None)
            p = build_params(
                None,
                dict(
                    agent_id=agent_id,
                    session_id=session_id,
                    import_id=import_id,
                    offset=offset,
                    data=base64.b64encode(pending).decode("ascii"),
                    commit=following is None,
                ),
            )
            answer = self._invoke("session.import", p, lambda r: r)
            offset += len(pending)
            if following is None:
                return models.SessionImported.from_dict(answer)
            pending = following

    def session(self, agent_id: str, session_id: str, **options: Any) -> Session:
        """A :class:`~allox.session.Session` for ``with``: created on entry
        (``create=False`` not to), deleted on exit with ``delete=True``;
        ``create_agent``, ``exist_ok``, and ``session_create``'s keyword
        arguments."""
        return Session(self, agent_id, session_id, **options)

    # -- files over /v1/files ------------------------------------------------------------

    def _file_request(self, method: str, agent_id: str, session_id: str, path: str, query: dict[str, str], **kw: Any) -> httpx.Request:
        return self.http.build_request(method, _core.file_url(agent_id, session_id, path), params=query, **kw)

    def read_file(
        self, agent_id: str, session_id: str, path: str, *, checkpoint: str | None = None, scope: str | None = None
    ) -> bytes:
        """A file's bytes (``GET /v1/files/...``), from ``checkpoint`` if
        given, from the agent's ``shared/`` with ``scope="shared"``."""
        chunks = bytearray()
        for chunk in self.iter_file(agent_id, session_id, path, checkpoint=checkpoint, scope=scope):
            chunks += chunk
        return bytes(chunks)

    def iter_file(
        self, agent_id: str, session_id: str, path: str, *, checkpoint: str | None = None, scope: str | None = None
    ) -> Iterator[bytes]:
        """A file's bytes, piece by piece as they come; a body cut short
        raises :class:`~allox.errors.StreamBroken`."""
        req = self._file_request("GET", agent_id, session_id, path, _core.file_query(checkpoint, scope))
        r = self._send(req, stream=True)
        try:
            if r.status_code != 200:
                _core.raise_for_answer(r.status_code, r.read(), self.token_source)
            got = 0
            try:
                for chunk in r.iter_bytes():
                    got += len(chunk)
                    yield chunk
            except httpx.HTTPError as e:
                raise StreamBroken(_core.transport_message(e, f"GET {path}: the body was cut"), r.status_code) from e
            _core.check_length(r, got)
        finally:
            r.close()

    def download(
        self,
        agent_id: str,
        session_id: str,
        path: str,
        dest: str | os.PathLike[str] | IO[bytes],
        *,
        checkpoint: str | None = None,
        scope: str | None = None,
    ) -> int:
        """Writes a file to ``dest`` (a path or a binary file); the number
        of bytes. A path is written aside and put in place only once all of
        the file came: a download that fails leaves it as it was."""
        out = _core.LocalOut(dest)
        n = 0
        try:
            for chunk in self.iter_file(agent_id, session_id, path, checkpoint=checkpoint, scope=scope):
                out.write(chunk)
                n += len(chunk)
        except BaseException:
            out.failed()
            raise
        out.done()
        return n

    def write_file(
        self,
        agent_id: str,
        session_id: str,
        path: str,
        data: bytes | str | IO[bytes] | Iterable[bytes],
        *,
        scope: str | None = None,
        parents: bool = False,
    ) -> dict[str, Any]:
        """Writes a file (``PUT /v1/files/...``): bytes, text (UTF-8), a
        binary file or an iterable of bytes (sent chunked). The file changes
        only once all of it came. With ``parents`` its directory is made first.
        Answers ``{"path": ..., "size": ...}``."""
        if parents and "/" in path.strip("/"):
            self.fs_mkdir(agent_id, session_id, path.rsplit("/", 1)[0], parents=True, scope=scope)
        content, length = _body(data)
        hdrs = {"Content-Type": "application/octet-stream"}
        if length is not None:
            hdrs["Content-Length"] = str(length)
        req = self._file_request("PUT", agent_id, session_id, path, _core.file_query(None, scope), content=content, headers=hdrs)
        r = self._send(req)
        return _core.result_of_file(r.status_code, r.content, self.token_source)

    def upload(
        self,
        agent_id: str,
        session_id: str,
        path: str,
        src: str | os.PathLike[str],
        *,
        scope: str | None = None,
        parents: bool = False,
    ) -> dict[str, Any]:
        """Sends the local file ``src`` to ``path``, streamed."""
        with open(src, "rb") as f:
            return self.write_file(agent_id, session_id, path, f, scope=scope, parents=parents)


def _body(data: Any) -> tuple[Any, int | None]:
    """The request content for a file body and its length when known."""
    if isinstance(data, str):
        data = data.encode()
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data), len(data)
    if hasattr(data, "read"):
        length = None
        try:
            st = os.fstat(data.fileno())
            import stat

            if stat.S_ISREG(st.st_mode):
                length = st.st_size - data.tell()
        except (OSError, AttributeError, ValueError):
            pass
        return iter(lambda: data.read(_core.CHUNK), b""), length
    if isinstance(data, Iterable):
        return data, None
    raise TypeError(f"a file's content is bytes, str, a binary file or an iterable of bytes, not {type(data).__name__}")


__all__ = ["Client", "Stream", "AlloxError"]
