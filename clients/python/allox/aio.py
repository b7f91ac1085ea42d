"""The async client, on one ``httpx.AsyncClient``: the same methods as
:class:`allox.Client`, awaited; streams are iterated with ``async for``."""

from __future__ import annotations

import collections
import os
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping
from typing import IO, Any, Callable

import httpx

from . import _core
from ._actions import Actions
from ._core import build_params
from ._model import Model
from .client import DEFAULT_TIMEOUT, _timeout
from .errors import StreamBroken, TransportError
from .events import Event
from .session import Session


class AsyncStream:
    """The events of one streaming call (``async for event in stream``), then
    ``await stream.wait()`` for its result (``stream.result`` once it
    ended). The request is sent on first use: ``async with``, ``async for``,
    or ``await stream``. ``await stream.aclose()`` ends a followed listing."""

    def __init__(self, client: AsyncClient, action: str, params: dict[str, Any], parse: Callable[[Any], Any]) -> None:
        self.client = client
        self.action = action
        self.params = params
        self._parse = parse
        self.response: httpx.Response | None = None
        self._decoder = _core.StreamDecoder(action)
        self._pending: collections.deque[Event] = collections.deque()
        self._chunks: AsyncIterator[bytes] | None = None
        self._raised = False
        self._result: Any = None
        self._closed = False

    def __repr__(self) -> str:
        state = "done" if self._decoder.done else ("open" if self.response is not None else "not sent")
        return f"<AsyncStream {self.action} {state}>"

    async def open(self) -> AsyncStream:
        """Sends the request (once) and checks that a stream came back."""
        if self.response is None:
            self.response = await self.client._start_stream(self.action, self.params)
            self._chunks = self.response.aiter_bytes().__aiter__()
        return self

    def __await__(self) -> Any:
        return self.open().__await__()

    def __aiter__(self) -> AsyncStream:
        return self

    async def __anext__(self) -> Event:
        await self.open()
        assert self._chunks is not None
        while True:
            if self._pending:
                return self._pending.popleft()
            d = self._decoder
            if d.done:
                await self.aclose()
                if d.error is not None and not self._raised:
                    self._raised = True
                    raise d.error
                raise StopAsyncIteration
            if self._closed:
                d.fail(StreamBroken(f"{self.action}: the stream was closed before its end"))
                continue
            try:
                chunk = await self._chunks.__anext__()
            except StopAsyncIteration:
                self._pending.extend(d.finish())
                continue
            except (httpx.HTTPError, httpx.StreamError) as e:
                d.fail(StreamBroken(_core.transport_message(e, f"{self.action}: the stream broke")))
                d.error.__cause__ = e  # type: ignore[union-attr]
                continue
            self._pending.extend(d.feed(chunk))

    @property
    def done(self) -> bool:
        return self._decoder.done

    @property
    def result(self) -> Any:
        """The final result, once the stream ended (``await wait()`` reads
        the rest first)."""
        d = self._decoder
        if not d.done:
            raise RuntimeError(f"{self.action}: the stream has not ended: `await stream.wait()` for its result")
        if d.error is not None:
            raise d.error
        if self._result is None and d.result is not None:
            self._result = self._parse(d.result)
        return self._result

    async def wait(self) -> Any:
        """Reads the rest of the stream and returns its result."""
        async for _ in self:
            pass
        return self.result

    async def aclose(self) -> None:
        if not self._closed and self.response is not None:
            self._closed = True
            await self.response.aclose()

    async def __aenter__(self) -> AsyncStream:
        return await self.open()

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class AsyncClient(Actions):
    """:class:`allox.Client` for asyncio: ``async with AsyncClient(url,
    token_file=...) as c: await c.agent_create("a")``."""

    is_async = True

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
        self.http = httpx.AsyncClient(
            base_url=self.base_url,
            headers={**_core.headers(self.token), **dict(httpx_options.pop("headers", None) or {})},
            timeout=self.timeout,
            **httpx_options,
        )
        self._rpc_url = _core.rpc_url(self.http)

    def __repr__(self) -> str:
        return f"AsyncClient({self.base_url!r})"

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    # -- transport -----------------------------------------------------------------

    async def _send(self, request: httpx.Request, stream: bool = False) -> httpx.Response:
        try:
            return await self.http.send(request, stream=stream)
        except httpx.HTTPError as e:
            raise TransportError(_core.transport_message(e, f"{request.method} {request.url}")) from e

    def _rpc_request(self, action: str, params: dict[str, Any], accept: str, timeout: Any = httpx.USE_CLIENT_DEFAULT) -> httpx.Request:
        return self.http.build_request(
            "POST", self._rpc_url, content=_core.rpc_body(action, params), headers=_core.RPC_HEADERS[accept], timeout=timeout
        )

    async def _invoke(self, action: str, params: dict[str, Any], parse: Callable[[Any], Any]) -> Any:
        timeout = _core.without_read_timeout(self.timeout) if _core.waits_for_a_run(action, params) else httpx.USE_CLIENT_DEFAULT
        r = await self._send(self._rpc_request(action, params, _core.JSON, timeout))
        return parse(_core.result_of(r.status_code, r.content, self.token_source))

    def _open_stream(self, action: str, params: dict[str, Any], parse: Callable[[Any], Any]) -> AsyncStream:
        return AsyncStream(self, action, params, parse)

    async def _start_stream(self, action: str, params: dict[str, Any]) -> httpx.Response:
        t = self.timeout
        timeout = httpx.Timeout(t.connect, connect=t.connect, read=None, write=t.write, pool=t.pool)
        r = await self._send(self._rpc_request(action, params, _core.NDJSON, timeout), stream=True)
        if r.status_code == 200 and _core.is_ndjson(r):
            return r
        try:
            content = await r.aread()
        except httpx.HTTPError as e:
            raise StreamBroken(_core.transport_message(e, f"{action}: the answer broke"), r.status_code) from e
        finally:
            await r.aclose()
        if r.status_code != 200:
            _core.raise_for_answer(r.status_code, content, self.token_source)
        raise _core.unstreamed(action, r.status_code, content, self.token_source)

    # -- generic calls ---------------------------------------------------------------

    async def call(self, action: str, params: Mapping[str, Any] | Model | None = None, /, **kwargs: Any) -> Any:
        """One action -> its result as a dict (see :meth:`allox.Client.call`)."""
        return await self._invoke(action, build_params(params, kwargs), lambda r: r)

    def stream(self, action: str, params: Mapping[str, Any] | Model | None = None, /, **kwargs: Any) -> AsyncStream:
        """One action answered as a stream: ``async for`` its events, then
        ``stream.result`` (a dict)."""
        return self._open_stream(action, build_params(params, kwargs), lambda r: r)

    def session(self, agent_id: str, session_id: str, **options: Any) -> Session:
        """A :class:`~allox.session.Session` for ``async with``."""
        return Session(self, agent_id, session_id, **options)

    # -- files over /v1/files ------------------------------------------------------------

    def _file_request(self, method: str, agent_id: str, session_id: str, path: str, query: dict[str, str], **kw: Any) -> httpx.Request:
        return self.http.build_request(method, _core.file_url(agent_id, session_id, path), params=query, **kw)

    async def read_file(
        self, agent_id: str, session_id: str, path: str, *, checkpoint: str | None = None, scope: str | None = None
    ) -> bytes:
        out = bytearray()
        async for chunk in self.iter_file(agent_id, session_id, path, checkpoint=checkpoint, scope=scope):
            out += chunk
        return bytes(out)

    async def iter_file(
        self, agent_id: str, session_id: str, path: str, *, checkpoint: str | None = None, scope: str | None = None
    ) -> AsyncIterator[bytes]:
        req = self._file_request("GET", agent_id, session_id, path, _core.file_query(checkpoint, scope))
        r = await self._send(req, stream=True)
        try:
            if r.status_code != 200:
                _core.raise_for_answer(r.status_code, await r.aread(), self.token_source)
            got = 0
            try:
                async for chunk in r.aiter_bytes():
                    got += len(chunk)
                    yield chunk
            except httpx.HTTPError as e:
                raise StreamBroken(_core.transport_message(e, f"GET {path}: the body was cut"), r.status_code) from e
            _core.check_length(r, got)
        finally:
            await r.aclose()

    async def download(
        self,
        agent_id: str,
        session_id: str,
        path: str,
        dest: str | os.PathLike[str] | IO[bytes],
        *,
        checkpoint: str | None = None,
        scope: str | None = None,
    ) -> int:
        out = _core.LocalOut(dest)
        n = 0
        try:
            async for chunk in self.iter_file(agent_id, session_id, path, checkpoint=checkpoint, scope=scope):
                out.write(chunk)
                n += len(chunk)
        except BaseException:
            out.failed()
            raise
        out.done()
        return n

    async def write_file(
        self,
        agent_id: str,
        session_id: str,
        path: str,
        data: bytes | str | IO[bytes] | Iterable[bytes] | AsyncIterable[bytes],
        *,
        scope: str | None = None,
        parents: bool = False,
    ) -> dict[str, Any]:
        if parents and "/" in path.strip("/"):
            await self.fs_mkdir(agent_id, session_id, path.rsplit("/", 1)[0], parents=True, scope=scope)
        if isinstance(data, str):
            data = data.encode()
        length: int | None = None
        content: Any
        if isinstance(data, (bytes, bytearray, memoryview)):
            content, length = bytes(data), len(data)
        elif hasattr(data, "__aiter__"):
            content = data
        else:
            from .client import _body

            sync_content, length = _body(data)

            async def agen() -> AsyncIterator[bytes]:
                for piece in sync_content:
                    yield piece

            content = agen()
        hdrs = {"Content-Type": "application/octet-stream"}
        if length is not None:
            hdrs["Content-Length"] = str(length)
        req = self._file_request("PUT", agent_id, session_id, path, _core.file_query(None, scope), content=content, headers=hdrs)
        r = await self._send(req)
        return _core.result_of_file(r.status_code, r.content, self.token_source)

    async def upload(
        self,
        agent_id: str,
        session_id: str,
        path: str,
        src: str | os.PathLike[str],
        *,
        scope: str | None = None,
        parents: bool = False,
    ) -> dict[str, Any]:
        with open(src, "rb") as f:
            return await self.write_file(agent_id, session_id, path, f, scope=scope, parents=parents)
