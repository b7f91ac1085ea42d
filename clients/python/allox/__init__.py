"""Python client for Allox OS's HTTP gateway (``alloxctl gateway``).

    import allox

    with allox.Client("http://127.0.0.1:8092", token_file="/run/allox/gateway.token") as c:
        c.agent_create("agent-a")
        with c.session("agent-a", "s1", auto_checkpoint=True) as s:
            with s.turn() as turn:
                for ev in s.exec_stream(["sh", "-c", "echo hi > out.txt; cat out.txt"]):
                    if isinstance(ev, allox.Output):
                        print(ev.text, end="")
            print(s.diff("baseline", turn.checkpoint_id))

``AsyncClient`` is the same on asyncio. Errors are raised as subclasses of
:class:`AlloxError`, one per protocol error code.
"""

from . import models
from .aio import AsyncClient, AsyncStream
from .client import Client, Stream
from .errors import (
    AlloxError,
    Conflict,
    Internal,
    InvalidRequest,
    NotFound,
    StreamBroken,
    StreamUnsupported,
    TransportError,
    Unauthorized,
    Unavailable,
    Unsupported,
    VersionMismatch,
)
from .events import Archive, Event, Output, Progress, Record, Started
from .session import Session, Turn

__version__ = "0.1.0"

__all__ = [
    "AlloxError",
    "AsyncClient",
    "AsyncStream",
    "Client",
    "Conflict",
    "Event",
    "Internal",
    "InvalidRequest",
    "NotFound",
    "Output",
    "Progress",
    "Record",
    "Session",
    "Started",
    "Stream",
    "StreamBroken",
    "StreamUnsupported",
    "TransportError",
    "Turn",
    "Unauthorized",
    "Unavailable",
    "Unsupported",
    "VersionMismatch",
    "models",
]
