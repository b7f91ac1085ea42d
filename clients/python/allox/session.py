"""A session bound to a client (``client.session(agent, session)``), and a
turn of it (``session.turn()``): the same objects for the sync and the async
client (``with`` for one, ``async with`` for the other)."""

from __future__ import annotations

import asyncio
from typing import Any

from .errors import Conflict, NotFound

# Client methods that take (agent_id, session_id, ...) first; a Session has
# each of them with those two bound.
_BOUND = (
    "session_delete",
    "checkpoint_create",
    "checkpoint_list",
    "checkpoint_delete",
    "checkpoint_pin",
    "rollback",
    "diff",
    "turn_begin",
    "turn_end",
    "policy_set",
    "process_start",
    "start",
    "exec",
    "exec_stream",
    "process_wait",
    "process_kill",
    "process_list",
    "process_stdin",
    "fs_stat",
    "fs_list",
    "fs_read",
    "fs_write",
    "fs_mkdir",
    "fs_remove",
    "fs_move",
    "fs_watch",
    "read_file",
    "write_file",
    "download",
    "upload",
)


def _bound(name: str) -> Any:
    def method(self: Session, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.client, name)(self.agent_id, self.session_id, *args, **kwargs)

    method.__name__ = name
    method.__qualname__ = f"Session.{name}"
    method.__doc__ = f"``client.{name}(agent_id, session_id, ...)`` for this session."
    return method


class Session:
    """One agent's session on a client.

    ``with client.session("agent-a", "s1") as s:`` creates the session on
    entry (unless ``create=False``; with ``create_agent`` the agent too if it
    is missing; with ``exist_ok`` a session already there is taken as it is)
    and deletes it on exit if ``delete=True``. Every method of the client
    that takes ``(agent_id, session_id, ...)`` is here with them bound:
    ``s.exec([...])``, ``s.rollback("clean")``, ``s.diff("baseline")``, ...
    """

    def __init__(
        self,
        client: Any,
        agent_id: str,
        session_id: str,
        *,
        create: bool = True,
        delete: bool = False,
        create_agent: bool = False,
        exist_ok: bool = False,
        **create_params: Any,
    ) -> None:
        self.client = client
        self.agent_id = agent_id
        self.session_id = session_id
        self.create = create
        self.delete = delete
        self.create_agent = create_agent
        self.exist_ok = exist_ok
        self.create_params = create_params
        #: The ``SessionInfo`` answered by ``session.create`` (if it was made).
        self.info: Any = None

    def __repr__(self) -> str:
        return f"Session({self.agent_id!r}, {self.session_id!r})"

    @property
    def _async(self) -> bool:
        return bool(getattr(self.client, "is_async", False))

    # -- sync ------------------------------------------------------------------

    def __enter__(self) -> Session:
        if self._async:
            raise TypeError("an AsyncClient's session is entered with `async with`")
        if self.create_agent:
            try:
                self.client.agent_create(self.agent_id)
            except Conflict:
                pass
        if self.create:
            try:
                self.info = self.client.session_create(self.agent_id, self.session_id, **self.create_params)
            except Conflict:
                if not self.exist_ok:
                    raise
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.delete:
            try:
                self.client.session_delete(self.agent_id, self.session_id)
            except NotFound:
                pass

    # -- async -----------------------------------------------------------------

    async def __aenter__(self) -> Session:
        if not self._async:
            raise TypeError("a Client's session is entered with `with`")
        if self.create_agent:
            try:
                await self.client.agent_create(self.agent_id)
            except Conflict:
                pass
        if self.create:
            try:
                self.info = await self.client.session_create(self.agent_id, self.session_id, **self.create_params)
            except Conflict:
                if not self.exist_ok:
                    raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self.delete:
            try:
                await self.client.session_delete(self.agent_id, self.session_id)
            except NotFound:
                pass

    # -- turns -----------------------------------------------------------------

    def turn(self, turn_id: str | None = None, *, label: str | None = None) -> Turn:
        """A turn as a context manager: ``turn.begin`` on entry, ``turn.end``
        on exit with ``ok`` (``failed`` if an exception left the block,
        ``cancelled`` for KeyboardInterrupt or task cancellation; set
        ``turn.status`` to choose)."""
        return Turn(self, turn_id, label)

    def checkpoint(self, checkpoint_id: str, **kwargs: Any) -> Any:
        """``checkpoint_create`` for this session."""
        return self.client.checkpoint_create(self.agent_id, self.session_id, checkpoint_id, **kwargs)

    def checkpoints(self) -> Any:
        """``checkpoint_list`` for this session."""
        return self.client.checkpoint_list(self.agent_id, self.session_id)


for _name in _BOUND:
    setattr(Session, _name, _bound(_name))


def _status(exc_type: Any) -> str:
    if exc_type is None:
        return "ok"
    if issubclass(exc_type, (KeyboardInterrupt, asyncio.CancelledError, GeneratorExit)):
        return "cancelled"
    return "failed"


class Turn:
    """A turn of a session (``session.turn()``). After the block, ``result``
    is the ``TurnInfo`` ``turn.end`` answered, with ``checkpoint_id`` when an
    automatic checkpoint was taken."""

    def __init__(self, session: Session, turn_id: str | None, label: str | None) -> None:
        self.session = session
        self.requested_id = turn_id
        self.label = label
        #: Overrides how the turn ends (``ok``, ``failed``, ``cancelled``).
        self.status: str | None = None
        #: ``turn.begin``'s answer.
        self.info: Any = None
        #: ``turn.end``'s answer.
        self.result: Any = None

    @property
    def turn_id(self) -> str | None:
        return getattr(self.info, "turn_id", None) if self.info is not None else self.requested_id

    @property
    def checkpoint_id(self) -> str | None:
        return getattr(self.result, "checkpoint_id", None) if self.result is not None else None

    def __enter__(self) -> Turn:
        s = self.session
        self.info = s.client.turn_begin(s.agent_id, s.session_id, self.requested_id)
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        s = self.session
        status = self.status or _status(exc_type)
        self.result = s.client.turn_end(s.agent_id, s.session_id, self.turn_id, status, label=self.label)

    async def __aenter__(self) -> Turn:
        s = self.session
        self.info = await s.client.turn_begin(s.agent_id, s.session_id, self.requested_id)
        return self

    async def __aexit__(self, exc_type: Any, *rest: Any) -> None:
        s = self.session
        status = self.status or _status(exc_type)
        self.result = await s.client.turn_end(s.agent_id, s.session_id, self.turn_id, status, label=self.label)
