"""Stream events, as a streaming call yields them.

On the wire each is one NDJSON line ``{"event": E}`` with ``E`` externally
tagged: ``{"started": {...}}``, ``{"output": {...}}``, ``{"progress":
{...}}``, and the records of followed listings, ``{"process": {...}}``,
``{"network": {...}}``, ``{"fs": {...}}``, ``{"monitor": {...}}``, and the
pieces of a session's archive, ``{"archive": {"data": ...}}``.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any, Union

from . import models

#: The model each record kind is read as (``Record.model()``).
RECORD_MODELS: dict[str, str] = {
    "process": "ProcessEvent",
    "network": "NetworkAuditRecord",
    "fs": "FsEvent",
    "monitor": "MonitorRecord",
}


@dataclass
class Started:
    """A run started (before any of its output)."""

    run_id: str
    pid: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Output:
    """A piece of a run's output, in order per stream."""

    run_id: str
    #: ``"stdout"`` or ``"stderr"``.
    stream: str
    data: bytes

    @property
    def text(self) -> str:
        """``data`` as UTF-8 (invalid bytes replaced; a chunk may end inside a
        character)."""
        return self.data.decode("utf-8", errors="replace")


@dataclass
class Progress:
    """A free-form progress note."""

    message: str


@dataclass
class Record:
    """A record of a followed listing or a watch: ``kind`` is ``"process"``
    (``process.events``), ``"network"`` (``network.audit``), ``"fs"``
    (``fs.watch``), ``"monitor"`` (``monitor.records``), or a kind this client
    does not know yet; ``data`` is the record as it came."""

    kind: str
    data: Any

    def model(self) -> Any:
        """The record as its model (``models.ProcessEvent``, ...), or ``data``
        when there is none for its kind."""
        cls = getattr(models, RECORD_MODELS.get(self.kind, ""), None)
        if cls is not None and isinstance(self.data, dict):
            return cls.from_dict(self.data)
        return self.data


@dataclass
class Archive:
    """The next bytes of a ``session.export``'s archive."""

    data: bytes


Event = Union[Started, Output, Progress, Record, Archive]


def _b64(data: Any) -> bytes:
    if isinstance(data, str):
        try:
            return base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            return data.encode("utf-8")
    if isinstance(data, list):
        return bytes(data)
    return b""


def parse_event(e: Any) -> Event:
    """The event for the ``E`` of one ``{"event": E}`` line."""
    if isinstance(e, str):  # a unit variant
        return Record(e, None)
    if not isinstance(e, dict) or len(e) != 1:
        return Record("unknown", e)
    (kind, body), = e.items()
    if kind == "output" and isinstance(body, dict):
        return Output(
            run_id=str(body.get("run_id", "")),
            stream=str(body.get("stream", "stdout")),
            data=_b64(body.get("data", "")),
        )
    if kind == "started" and isinstance(body, dict):
        pid = body.get("pid")
        return Started(run_id=str(body.get("run_id", "")), pid=pid if isinstance(pid, int) else None, raw=body)
    if kind == "archive" and isinstance(body, dict):
        return Archive(data=_b64(body.get("data", "")))
    if kind == "progress":
        message = body.get("message", "") if isinstance(body, dict) else body
        return Progress(message=str(message))
    return Record(kind, body)
