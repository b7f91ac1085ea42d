"""Errors: one exception class per protocol error code.

Every error answer of the gateway (``{"error": {"code": ..., "message": ...}}``)
is raised as the subclass of :class:`AlloxError` for its code, with the HTTP
status it came with (200 for an error that ends a stream, ``None`` when
nothing came back at all).
"""

from __future__ import annotations

from typing import Any


class AlloxError(Exception):
    """An error answer: ``code`` (``"not_found"``, ...), ``message``, and the
    HTTP ``status`` it came with."""

    #: The code this class stands for (``None`` for the base class).
    CODE: str | None = None

    def __init__(self, code: str, message: str, status: int | None = None) -> None:
        super().__init__(code, message, status)
        self.code = code
        self.message = message
        self.status = status

    def __str__(self) -> str:
        where = f" (HTTP {self.status})" if self.status is not None else ""
        return f"{self.code}: {self.message}{where}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code!r}, {self.message!r}, {self.status!r})"


class InvalidRequest(AlloxError):
    """Malformed request: a bad id, a bad parameter, bad JSON (400, 405,
    408, 413, 415)."""

    CODE = "invalid_request"


class NotFound(AlloxError):
    """No such agent, session, checkpoint, run, file or path (404)."""

    CODE = "not_found"


class Conflict(AlloxError):
    """Clashes with the current state: exists already, busy, pinned (409)."""

    CODE = "conflict"


class Unauthorized(AlloxError):
    """No token or the wrong one (401), or a foreign ``Host``/``Origin``
    (403)."""

    CODE = "unauthorized"


class VersionMismatch(AlloxError):
    """The gateway and the daemon speak different protocol versions."""

    CODE = "version_mismatch"


class Unsupported(AlloxError):
    """Understood, but this build or host cannot do it (501)."""

    CODE = "unsupported"


class Unavailable(AlloxError):
    """The daemon cannot be reached, is shutting down or busy (503), or did
    not answer in time (504: the request may still complete)."""

    CODE = "unavailable"


class Internal(AlloxError):
    """A bug or an unexpected failure of the host (500)."""

    CODE = "internal"


class TransportError(Unavailable):
    """The gateway itself could not be reached, or the connection failed
    before an answer came (the ``httpx`` error is the ``__cause__``)."""

    def __init__(self, message: str) -> None:
        super().__init__("unavailable", message, None)


class StreamBroken(Unavailable):
    """A stream (NDJSON answer, or a file's body) ended before its end: no
    final ``{"result"}``/``{"error"}`` line, a line cut short, or fewer bytes
    than ``Content-Length``. What the call did is unknown."""

    def __init__(self, message: str, status: int | None = 200) -> None:
        super().__init__("unavailable", message, status)


class StreamUnsupported(Unsupported):
    """A streaming call was answered with one plain JSON result, not
    ``application/x-ndjson``: the gateway does not stream. The call was
    still made; its result is in :attr:`result`."""

    def __init__(self, message: str, status: int | None, result: Any) -> None:
        super().__init__("unsupported", message, status)
        self.result = result


#: The exception class for each error code.
BY_CODE: dict[str, type[AlloxError]] = {
    cls.CODE: cls
    for cls in (
        InvalidRequest,
        NotFound,
        Conflict,
        Unauthorized,
        VersionMismatch,
        Unsupported,
        Unavailable,
        Internal,
    )
    if cls.CODE
}

#: The code an HTTP status stands for, for answers without a usable body.
_BY_STATUS = {
    400: "invalid_request",
    401: "unauthorized",
    403: "unauthorized",
    404: "not_found",
    405: "invalid_request",
    408: "invalid_request",
    409: "conflict",
    413: "invalid_request",
    415: "invalid_request",
    501: "unsupported",
    502: "unavailable",
    503: "unavailable",
    504: "unavailable",
}


def code_for_status(status: int) -> str:
    """The error code an HTTP status stands for (``internal`` for others)."""
    return _BY_STATUS.get(status, "invalid_request" if 400 <= status < 500 else "internal")


def error_from(code: str, message: str, status: int | None = None) -> AlloxError:
    """The exception for an error answer (the base class for a code this
    client does not know)."""
    cls = BY_CODE.get(code, AlloxError)
    return cls(code, message, status)


def error_from_body(body: Any, status: int | None) -> AlloxError | None:
    """The exception for a decoded ``{"error": {...}}`` body, or ``None`` if
    the body is not one."""
    if not isinstance(body, dict):
        return None
    err = body.get("error")
    if not isinstance(err, dict):
        return None
    code = err.get("code")
    message = err.get("message")
    if not isinstance(code, str):
        code = code_for_status(status) if status else "internal"
    if not isinstance(message, str):
        message = repr(err)
    return error_from(code, message, status)
