"""The typed methods, shared by :class:`allox.Client` and
:class:`allox.AsyncClient`.

Each builds an action's params and hands them to ``self._invoke(action,
params, parse)`` (a value for the sync client, an awaitable for the async
one) or ``self._open_stream(action, params, parse)`` (a stream either way).
Keyword arguments left ``None`` are not sent: the daemon's default applies.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from . import _core
from ._core import build_params

if TYPE_CHECKING:
    from . import models


@functools.lru_cache(maxsize=None)
def _model(name: str) -> Callable[[Any], Any]:
    return functools.partial(_core.parse, name)


def _stdin(v: bytes | str | None) -> bytes | None:
    return v.encode() if isinstance(v, str) else v


class Actions:
    """Typed methods over ``_invoke`` and ``_open_stream``."""

    def _invoke(self, action: str, params: dict[str, Any], parse: Callable[[Any], Any]) -> Any:
        raise NotImplementedError

    def _open_stream(self, action: str, params: dict[str, Any], parse: Callable[[Any], Any]) -> Any:
        raise NotImplementedError

    # -- the system --------------------------------------------------------------

    def ping(self) -> models.Pong:
        """``system.ping``: the protocol version and the daemon's build."""
        return self._invoke("system.ping", {}, _model("Pong"))

    def info(self) -> models.SystemInfo:
        """``system.info``: uptime, memory, processes, plugins."""
        return self._invoke("system.info", {}, _model("SystemInfo"))

    def audit_list(
        self, *, after_seq: int | None = None, before_seq: int | None = None, limit: int | None = None
    ) -> models.AuditListing:
        """``audit.list``: the daemon's audit records (every mutating request),
        oldest first: the newest ones (before ``before_seq``), or the oldest
        after ``after_seq``; ``earlier``/``later`` are the cursors to what was
        left out."""
        return self._invoke(
            "audit.list",
            build_params(None, dict(after_seq=after_seq, before_seq=before_seq, limit=limit)),
            _model("AuditListing"),
        )

    def call_typed(self, action: str, params: Mapping[str, Any] | None = None, /, **kwargs: Any) -> Any:
        """Like ``call``, with the result read as the type ``models.ACTIONS``
        gives the action (the dict for an action it does not list)."""
        return self._invoke(action, build_params(params, kwargs), functools.partial(_core.typed_result, action))

    # -- agents and sessions -------------------------------------------------------

    def agent_create(
        self,
        agent_id: str,
        *,
        auto_checkpoint: bool | None = None,
        keep_last: int | None = None,
        network: str | None = None,
        egress: Mapping[str, Any] | models.Egress | None = None,
        idle_timeout_ms: int | None = None,
        max_lifetime_ms: int | None = None,
    ) -> models.AgentInfo:
        """``agent.create``; ``auto_checkpoint``/``keep_last`` are the default
        policy of its sessions, ``idle_timeout_ms``/``max_lifetime_ms`` their
        default limits over time."""
        p = build_params(
            None,
            dict(
                agent_id=agent_id, auto_checkpoint=auto_checkpoint, keep_last=keep_last, network=network,
                egress=egress, idle_timeout_ms=idle_timeout_ms, max_lifetime_ms=max_lifetime_ms,
            ),
        )
        return self._invoke("agent.create", p, _model("AgentInfo"))

    def agent_list(self) -> models.AgentListing:
        return self._invoke("agent.list", {}, _model("AgentListing"))

    def agent_delete(self, agent_id: str, *, force: bool = False) -> models.Deleted:
        """``agent.delete``: the agent and its ``shared/`` (its processes are
        killed first); refused (:class:`allox.errors.Conflict`) while it has
        sessions, unless ``force``, which deletes them too."""
        return self._invoke("agent.delete", {"agent_id": agent_id, "force": force}, _model("Deleted"))

    def session_create(
        self,
        agent_id: str,
        session_id: str,
        *,
        auto_checkpoint: bool | None = None,
        keep_last: int | None = None,
        pids_max: int | None = None,
        memory_max: int | None = None,
        cpu_max: str | None = None,
        network: str | None = None,
        egress: Mapping[str, Any] | models.Egress | None = None,
        idle_timeout_ms: int | None = None,
        max_lifetime_ms: int | None = None,
    ) -> models.SessionInfo:
        """``session.create``: its ``current/`` is the sandbox's HOME; with
        automatic checkpoints on, it takes the ``baseline`` checkpoint.
        ``idle_timeout_ms`` pauses it when idle; ``max_lifetime_ms``
        expires it (processes killed, changes refused until
        :meth:`session_update` gives it more time)."""
        p = build_params(
            None,
            dict(
                agent_id=agent_id, session_id=session_id, auto_checkpoint=auto_checkpoint, keep_last=keep_last,
                pids_max=pids_max, memory_max=memory_max, cpu_max=cpu_max, network=network, egress=egress,
                idle_timeout_ms=idle_timeout_ms, max_lifetime_ms=max_lifetime_ms,
            ),
        )
        return self._invoke("session.create", p, _model("SessionInfo"))

    def session_update(
        self,
        agent_id: str,
        session_id: str,
        *,
        pids_max: int | None = None,
        memory_max: int | None = None,
        cpu_max: str | None = None,
        idle_timeout_ms: int | None = None,
        max_lifetime_ms: int | None = None,
    ) -> models.SessionStats:
        """``session.update``: new limits, idle timeout or lifetime (counted
        from now; an expired session takes changes again); those left out
        stay."""
        p = build_params(
            None,
            dict(
                agent_id=agent_id, session_id=session_id, pids_max=pids_max, memory_max=memory_max,
                cpu_max=cpu_max, idle_timeout_ms=idle_timeout_ms, max_lifetime_ms=max_lifetime_ms,
            ),
        )
        return self._invoke("session.update", p, _model("SessionStats"))

    def session_info(self, agent_id: str, session_id: str) -> models.SessionInfo:
        """``session.info``: one session, with whether it is paused, its idle
        timeout and when it expires."""
        return self._invoke("session.info", {"agent_id": agent_id, "session_id": session_id}, _model("SessionInfo"))

    def session_list(self, agent_id: str) -> models.SessionListing:
        return self._invoke("session.list", {"agent_id": agent_id}, _model("SessionListing"))

    def session_delete(self, agent_id: str, session_id: str, *, force: bool = False) -> models.Deleted:
        """``session.delete``: the session and its checkpoints; refused
        (:class:`allox.errors.Conflict`) while it holds pinned checkpoints,
        unless ``force``."""
        return self._invoke(
            "session.delete",
            {"agent_id": agent_id, "session_id": session_id, "force": force},
            _model("Deleted"),
        )

    def session_fork(
        self,
        agent_id: str,
        session_id: str,
        new_session_id: str,
        *,
        from_: str = "current",
        new_agent_id: str | None = None,
        label: str | None = None,
    ) -> models.SessionInfo:
        """``session.fork``: a new session whose ``current/`` is a writable
        snapshot of checkpoint ``from_`` of the source (or of its
        ``current/`` as it is now), with its own history starting at the
        baseline ``fork``; network, checkpoint policy and limits copied,
        runs not. ``new_agent_id`` makes it another agent's session."""
        p = build_params(
            None,
            dict(
                agent_id=agent_id,
                session_id=session_id,
                new_session_id=new_session_id,
                new_agent_id=new_agent_id,
                label=label,
            ),
        )
        p["from"] = from_
        return self._invoke("session.fork", p, _model("SessionInfo"))

    def session_pause(self, agent_id: str, session_id: str, *, hold: bool = False) -> models.SessionInfo:
        """``session.pause``: every process of the session frozen (no CPU,
        state kept); the next request that needs it to run resumes it,
        unless ``hold`` (then such requests raise
        :class:`allox.errors.Conflict` until :meth:`session_resume`)."""
        p = {"agent_id": agent_id, "session_id": session_id, "hold": hold}
        return self._invoke("session.pause", p, _model("SessionInfo"))

    def session_resume(self, agent_id: str, session_id: str) -> models.SessionInfo:
        """``session.resume``: a paused session's processes run again."""
        p = {"agent_id": agent_id, "session_id": session_id}
        return self._invoke("session.resume", p, _model("SessionInfo"))

    # -- checkpoints ---------------------------------------------------------------

    def checkpoint_create(
        self, agent_id: str, session_id: str, checkpoint_id: str, *, pinned: bool = False, label: str | None = None
    ) -> models.CheckpointInfo:
        p = build_params(None, dict(agent_id=agent_id, session_id=session_id, checkpoint_id=checkpoint_id, pinned=pinned or None, label=label))
        return self._invoke("checkpoint.create", p, _model("CheckpointInfo"))

    def checkpoint_list(self, agent_id: str, session_id: str) -> models.CheckpointListing:
        """``checkpoint.list``: oldest first, with the ``head``."""
        return self._invoke("checkpoint.list", {"agent_id": agent_id, "session_id": session_id}, _model("CheckpointListing"))

    def checkpoint_delete(self, agent_id: str, session_id: str, checkpoint_id: str) -> models.Deleted:
        p = {"agent_id": agent_id, "session_id": session_id, "checkpoint_id": checkpoint_id}
        return self._invoke("checkpoint.delete", p, _model("Deleted"))

    def checkpoint_pin(self, agent_id: str, session_id: str, checkpoint_id: str, pinned: bool = True) -> models.CheckpointInfo:
        p = {"agent_id": agent_id, "session_id": session_id, "checkpoint_id": checkpoint_id, "pinned": pinned}
        return self._invoke("checkpoint.pin", p, _model("CheckpointInfo"))

    def rollback(
        self, agent_id: str, session_id: str, checkpoint_id: str, *, kill_processes: bool | None = None
    ) -> models.RollbackDone:
        """``session.rollback``: ``current/`` becomes the checkpoint's tree
        (``conflict`` while the session has live processes, unless
        ``kill_processes``)."""
        p = build_params(None, dict(agent_id=agent_id, session_id=session_id, checkpoint_id=checkpoint_id, kill_processes=kill_processes))
        return self._invoke("session.rollback", p, _model("RollbackDone"))

    def diff(
        self, agent_id: str, session_id: str, from_: str, to: str = "current", *, patch: bool = False
    ) -> models.DiffListing:
        """``checkpoint.diff`` between two checkpoints (``current`` is the
        session's ``current/``); with ``patch``, each changed file's
        ``patch`` as ``git diff`` shows it (within the answer's bounds:
        ``patch_truncated``)."""
        p = {"agent_id": agent_id, "session_id": session_id, "from": from_, "to": to}
        if patch:
            p["patch"] = True
        return self._invoke("checkpoint.diff", p, _model("DiffListing"))

    # -- turns and policy ------------------------------------------------------------

    def turn_begin(self, agent_id: str, session_id: str, turn_id: str | None = None) -> models.TurnInfo:
        """``turn.begin`` (one open turn per session; the id is made up,
        ``turn-<n>``, unless given)."""
        p = build_params(None, dict(agent_id=agent_id, session_id=session_id, turn_id=turn_id))
        return self._invoke("turn.begin", p, _model("TurnInfo"))

    def turn_end(
        self, agent_id: str, session_id: str, turn_id: str, status: str = "ok", *, label: str | None = None
    ) -> models.TurnInfo:
        """``turn.end`` with ``status`` ``ok``, ``failed`` or ``cancelled``; an
        ``ok`` turn under automatic checkpoints answers with the checkpoint
        it took (``checkpoint_id``, or ``checkpoint_error``)."""
        p = build_params(None, dict(agent_id=agent_id, session_id=session_id, turn_id=turn_id, status=status, label=label))
        return self._invoke("turn.end", p, _model("TurnInfo"))

    def policy_set(
        self,
        agent_id: str,
        session_id: str | None = None,
        *,
        auto_checkpoint: bool | None = None,
        keep_last: int | None = None,
    ) -> models.PolicyInfo:
        """``policy.set``: automatic checkpoints for an agent (the default of
        its sessions) or one session."""
        p = build_params(None, dict(agent_id=agent_id, session_id=session_id, auto_checkpoint=auto_checkpoint, keep_last=keep_last))
        return self._invoke("policy.set", p, _model("PolicyInfo"))

    # -- processes ---------------------------------------------------------------------

    def _start_params(
        self,
        agent_id: str,
        session_id: str,
        argv: Sequence[str],
        *,
        wait: bool,
        stream: bool,
        env: Mapping[str, str] | None,
        cwd: str | None,
        stdin: bytes | str | None,
        timeout_ms: int | None,
        pty: Mapping[str, Any] | models.PtySize | None,
        trace: Mapping[str, Any] | models.TraceContext | None,
    ) -> dict[str, Any]:
        if isinstance(argv, str):
            raise TypeError("argv is a list of strings, e.g. ['sh', '-c', 'echo hi']")
        return build_params(
            None,
            dict(
                agent_id=agent_id, session_id=session_id, argv=list(argv), env=dict(env) if env else None, cwd=cwd,
                stdin=_stdin(stdin), timeout_ms=timeout_ms, wait=wait or None, stream=stream or None, pty=pty, trace=trace,
            ),
        )

    def process_start(
        self,
        agent_id: str,
        session_id: str,
        argv: Sequence[str],
        *,
        wait: bool = False,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = None,
        timeout_ms: int | None = None,
        pty: Mapping[str, Any] | models.PtySize | None = None,
        trace: Mapping[str, Any] | models.TraceContext | None = None,
    ) -> models.RunStarted | models.RunResult:
        """``process.start``: ``RunStarted`` at once, or with ``wait`` the
        ``RunResult`` when the run ends. Without ``stdin`` the program's
        standard input stays open (``process_stdin``)."""
        p = self._start_params(
            agent_id, session_id, argv, wait=wait, stream=False, env=env, cwd=cwd, stdin=stdin, timeout_ms=timeout_ms, pty=pty, trace=trace
        )
        return self._invoke("process.start", p, _core.parse_run)

    def start(
        self,
        agent_id: str,
        session_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = None,
        timeout_ms: int | None = None,
        pty: Mapping[str, Any] | models.PtySize | None = None,
        trace: Mapping[str, Any] | models.TraceContext | None = None,
    ) -> models.RunStarted:
        """Starts a run in the background: its ``run_id`` (``process_wait``,
        ``process_kill``)."""
        p = self._start_params(
            agent_id, session_id, argv, wait=False, stream=False, env=env, cwd=cwd, stdin=stdin, timeout_ms=timeout_ms, pty=pty, trace=trace
        )
        return self._invoke("process.start", p, _model("RunStarted"))

    def exec(
        self,
        agent_id: str,
        session_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = b"",
        timeout_ms: int | None = None,
        pty: Mapping[str, Any] | models.PtySize | None = None,
        trace: Mapping[str, Any] | models.TraceContext | None = None,
    ) -> models.RunResult:
        """Runs ``argv`` to its end: exit code or signal, and the output
        captured (up to 256 KiB a stream). Standard input is empty unless
        ``stdin`` is given (``None`` leaves it open)."""
        p = self._start_params(
            agent_id, session_id, argv, wait=True, stream=False, env=env, cwd=cwd, stdin=stdin, timeout_ms=timeout_ms, pty=pty, trace=trace
        )
        return self._invoke("process.start", p, _model("RunResult"))

    def exec_stream(
        self,
        agent_id: str,
        session_id: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = b"",
        timeout_ms: int | None = None,
        pty: Mapping[str, Any] | models.PtySize | None = None,
        trace: Mapping[str, Any] | models.TraceContext | None = None,
        on_disconnect: str = "kill",
    ) -> Any:
        """Runs ``argv`` with its output streamed: a stream of ``Started``,
        then ``Output`` events (``data`` as bytes) as the run writes; its
        ``result`` is the ``RunResult`` (its ``stdout``/``stderr`` empty: the
        output came as events).

        As a foreground command, the run dies with its stream: leaving the
        stream before its end (``break``, an exception, closing it, the
        process exiting) kills it. ``on_disconnect="keep"`` leaves it going
        instead (``process_wait`` or ``process_attach`` find it again by the
        ``Started`` event's ``run_id``)."""
        if on_disconnect not in ("kill", "keep"):
            raise ValueError(f"on_disconnect is 'kill' or 'keep', not {on_disconnect!r}")
        p = self._start_params(
            agent_id, session_id, argv, wait=True, stream=True, env=env, cwd=cwd, stdin=stdin, timeout_ms=timeout_ms, pty=pty, trace=trace
        )
        p["on_disconnect"] = on_disconnect
        return self._open_stream("process.start", p, _model("RunResult"))

    def process_logs(self, agent_id: str, session_id: str, run_id: str) -> models.RunLogs:
        """``process.logs``: what is kept of a run's output (any run, running
        or ended, with or without a terminal); ``result`` once it ended."""
        p = dict(agent_id=agent_id, session_id=session_id, run_id=run_id)
        return self._invoke("process.logs", p, _model("RunLogs"))

    def process_logs_stream(self, agent_id: str, session_id: str, run_id: str) -> Any:
        """``process.logs`` with ``follow``: a stream of ``Output`` events, what
        is kept and then what the run writes until it ends, each byte once;
        its ``result`` is the ``RunLogs`` (with the run's ``result``)."""
        p = dict(agent_id=agent_id, session_id=session_id, run_id=run_id, follow=True)
        return self._open_stream("process.logs", p, _model("RunLogs"))

    def process_wait(self, agent_id: str, session_id: str, run_id: str, *, timeout_ms: int | None = None) -> models.RunResult:
        p = build_params(None, dict(agent_id=agent_id, session_id=session_id, run_id=run_id, timeout_ms=timeout_ms))
        return self._invoke("process.wait", p, _model("RunResult"))

    def process_kill(
        self, agent_id: str, session_id: str, run_id: str | None = None, *, signal: int | None = None
    ) -> models.Killed:
        """``process.kill``: one run's process tree, or (no ``run_id``) the
        whole session's; SIGKILL unless ``signal``."""
        p = build_params(None, dict(agent_id=agent_id, session_id=session_id, run_id=run_id, signal=signal))
        return self._invoke("process.kill", p, _model("Killed"))

    def process_list(self, agent_id: str, session_id: str) -> models.ProcessListing:
        return self._invoke("process.list", {"agent_id": agent_id, "session_id": session_id}, _model("ProcessListing"))

    def process_stdin(
        self, agent_id: str, session_id: str, run_id: str, data: bytes | str = b"", *, close: bool = False
    ) -> models.StdinWritten:
        p = build_params(None, dict(agent_id=agent_id, session_id=session_id, run_id=run_id, data=_stdin(data), close=close or None))
        return self._invoke("process.stdin", p, _model("StdinWritten"))

    # -- followed listings ----------------------------------------------------------------

    def process_events(
        self,
        agent_id: str | None = None,
        session_id: str | None = None,
        run_id: str | None = None,
        *,
        cursor: int | None = None,
        limit: int | None = None,
    ) -> models.ProcessEventListing:
        """``process.events``: what the process tracker recorded (needs the
        daemon's ``--process-tracker ebpf``)."""
        p = build_params(None, dict(agent_id=agent_id, session_id=session_id, run_id=run_id, cursor=cursor, limit=limit))
        return self._invoke("process.events", p, _model("ProcessEventListing"))

    def follow_events(
        self,
        agent_id: str | None = None,
        session_id: str | None = None,
        run_id: str | None = None,
        *,
        cursor: int | None = None,
        limit: int | None = None,
    ) -> Any:
        """``process.events`` with ``follow``: a stream of ``Record("process",
        ...)`` events as they happen, until closed."""
        p = build_params(None, dict(agent_id=agent_id, session_id=session_id, run_id=run_id, cursor=cursor, limit=limit, follow=True))
        return self._open_stream("process.events", p, _model("ProcessEventListing"))

    def network_audit(
        self, agent_id: str | None = None, session_id: str | None = None, *, cursor: int | None = None, limit: int | None = None
    ) -> models.NetworkAuditListing:
        """``network.audit``: the session network's connection attempts."""
        p = build_params(None, dict(agent_id=agent_id, session_id=session_id, cursor=cursor, limit=limit))
        return self._invoke("network.audit", p, _model("NetworkAuditListing"))

    def secret_set(
        self,
        agent_id: str,
        name: str,
        value: str,
        hosts: Sequence[str],
        *,
        session_id: str | None = None,
        header: str | None = None,
        query: str | None = None,
        intercept: bool | None = None,
    ) -> models.SecretInfo:
        """``secret.set``: a credential the runs of the agent's proxy sessions
        (or of ``session_id``) use through the proxy but never read: they see
        a placeholder, which the broker replaces with ``value`` in requests to
        ``hosts`` only. The answer never holds the value."""
        p = build_params(
            None,
            dict(agent_id=agent_id, session_id=session_id, name=name, value=value, hosts=list(hosts),
                 header=header, query=query, intercept=intercept),
        )
        return self._invoke("secret.set", p, _model("SecretInfo"))

    def secret_list(self, agent_id: str, session_id: str | None = None) -> models.SecretListing:
        """``secret.list``: names, hosts and placeholders, never values."""
        p = build_params(None, dict(agent_id=agent_id, session_id=session_id))
        return self._invoke("secret.list", p, _model("SecretListing"))

    def secret_delete(self, agent_id: str, name: str, session_id: str | None = None) -> models.Deleted:
        """``secret.delete``."""
        p = build_params(None, dict(agent_id=agent_id, session_id=session_id, name=name))
        return self._invoke("secret.delete", p, _model("Deleted"))

    def port_expose(self, agent_id: str, session_id: str, port: int, *, public: bool | None = None) -> models.PortInfo:
        """``port.expose``: serve ``port`` of the session's own loopback
        through the gateway: at the port's own host
        (``http://{host}.localhost:8092/``, an origin of its own, for a
        browser with the port's token) and at
        ``/v1/ports/{agent}/{session}/{port}/`` with the gateway's token
        (``public``: no token)."""
        p = build_params(None, dict(agent_id=agent_id, session_id=session_id, port=port, public=public))
        return self._invoke("port.expose", p, _model("PortInfo"))

    def port_list(self, agent_id: str, session_id: str | None = None) -> models.PortListing:
        """``port.list``: the exposed ports, with their hosts, paths and tokens."""
        p = build_params(None, dict(agent_id=agent_id, session_id=session_id))
        return self._invoke("port.list", p, _model("PortListing"))

    def port_unexpose(self, agent_id: str, session_id: str, port: int) -> models.Deleted:
        """``port.unexpose``."""
        p = build_params(None, dict(agent_id=agent_id, session_id=session_id, port=port))
        return self._invoke("port.unexpose", p, _model("Deleted"))

    def follow_network_audit(
        self, agent_id: str | None = None, session_id: str | None = None, *, cursor: int | None = None, limit: int | None = None
    ) -> Any:
        """``network.audit`` with ``follow``: ``Record("network", ...)`` events."""
        p = build_params(None, dict(agent_id=agent_id, session_id=session_id, cursor=cursor, limit=limit, follow=True))
        return self._open_stream("network.audit", p, _model("NetworkAuditListing"))

    def monitor_records(
        self,
        agent_id: str | None = None,
        session_id: str | None = None,
        *,
        trace_id: str | None = None,
        cursor: int | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """``monitor.records`` (``--monitor-root``): spans and runs."""
        p = build_params(None, dict(agent_id=agent_id, session_id=session_id, trace_id=trace_id, cursor=cursor, limit=limit))
        return self._invoke("monitor.records", p, _model("MonitorListing"))

    def follow_monitor(
        self,
        agent_id: str | None = None,
        session_id: str | None = None,
        *,
        trace_id: str | None = None,
        cursor: int | None = None,
        limit: int | None = None,
    ) -> Any:
        """``monitor.records`` with ``follow``: ``Record("monitor", ...)`` events."""
        p = build_params(None, dict(agent_id=agent_id, session_id=session_id, trace_id=trace_id, cursor=cursor, limit=limit, follow=True))
        return self._open_stream("monitor.records", p, _model("MonitorListing"))

    # -- files (actions) -----------------------------------------------------------------------

    def fs_stat(
        self, agent_id: str, session_id: str, path: str, *, checkpoint_id: str | None = None, scope: str | None = None
    ) -> models.FsEntry:
        p = build_params(None, dict(agent_id=agent_id, session_id=session_id, path=path, checkpoint_id=checkpoint_id, scope=scope))
        return self._invoke("fs.stat", p, _model("FsEntry"))

    def fs_list(
        self,
        agent_id: str,
        session_id: str,
        path: str = "",
        *,
        depth: int | None = None,
        checkpoint_id: str | None = None,
        scope: str | None = None,
    ) -> models.FsListing:
        p = build_params(
            None, dict(agent_id=agent_id, session_id=session_id, path=path, depth=depth, checkpoint_id=checkpoint_id, scope=scope)
        )
        return self._invoke("fs.list", p, _model("FsListing"))

    def fs_read(
        self,
        agent_id: str,
        session_id: str,
        path: str,
        *,
        offset: int | None = None,
        length: int | None = None,
        checkpoint_id: str | None = None,
        scope: str | None = None,
    ) -> models.FsData:
        """``fs.read``: at most 512 KiB of a file (``data`` as bytes; read on
        from ``offset + len(data)`` until ``eof``). ``read_file`` reads a
        whole file through ``/v1/files``."""
        p = build_params(
            None,
            dict(agent_id=agent_id, session_id=session_id, path=path, offset=offset, length=length, checkpoint_id=checkpoint_id, scope=scope),
        )
        return self._invoke("fs.read", p, _model("FsData"))

    def fs_write(
        self,
        agent_id: str,
        session_id: str,
        path: str,
        data: bytes | str,
        *,
        offset: int | None = None,
        create: bool | None = None,
        truncate: bool | None = None,
        scope: str | None = None,
    ) -> models.FsWritten:
        """``fs.write`` of one request (at most about 512 KiB): the whole file
        replaced at once, or ``data`` at ``offset``. ``write_file`` sends any
        size through ``/v1/files``."""
        p = build_params(
            None,
            dict(
                agent_id=agent_id, session_id=session_id, path=path, data=_stdin(data), offset=offset, create=create,
                truncate=truncate, scope=scope,
            ),
        )
        return self._invoke("fs.write", p, _model("FsWritten"))

    def fs_mkdir(self, agent_id: str, session_id: str, path: str, *, parents: bool = False, scope: str | None = None) -> models.FsEntry:
        p = build_params(None, dict(agent_id=agent_id, session_id=session_id, path=path, parents=parents or None, scope=scope))
        return self._invoke("fs.mkdir", p, _model("FsEntry"))

    def fs_remove(self, agent_id: str, session_id: str, path: str, *, recursive: bool = False, scope: str | None = None) -> models.Deleted:
        p = build_params(None, dict(agent_id=agent_id, session_id=session_id, path=path, recursive=recursive or None, scope=scope))
        return self._invoke("fs.remove", p, _model("Deleted"))

    def fs_move(self, agent_id: str, session_id: str, path: str, to: str, *, scope: str | None = None) -> models.FsEntry:
        p = build_params(None, dict(agent_id=agent_id, session_id=session_id, path=path, to=to, scope=scope))
        return self._invoke("fs.move", p, _model("FsEntry"))

    def fs_watch(
        self, agent_id: str, session_id: str, path: str = "", *, recursive: bool = False, scope: str | None = None
    ) -> Any:
        """``fs.watch``: a stream of ``Record("fs", ...)`` events (``ready``
        first, then each change), until closed."""
        p = build_params(None, dict(agent_id=agent_id, session_id=session_id, path=path, recursive=recursive or None, scope=scope))
        return self._open_stream("fs.watch", p, _model("FsEvent"))
