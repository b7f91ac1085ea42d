#!/usr/bin/env python3
"""The Python client's cost per call against raw httpx, through a running
gateway:

    PYTHONPATH=clients/python python3 clients/python/bench_sdk.py --url http://127.0.0.1:PORT --token TOKEN --n 3000

Makes agent ``bench-sdk`` and its session ``s`` with 10 checkpoints (what is
there already is kept), then times each call of ``system.ping`` and
``checkpoint.list`` made three ways, each on a keep-alive connection of its
own: raw ``httpx.Client.post(url + "/v1/rpc", json=...)`` and ``.json()``
(the baseline), the SDK's typed methods (``client.ping()``,
``client.checkpoint_list(...)``: dataclasses) and its ``client.call(...)``
(dicts). The clients take turns in blocks of 100 calls so that they share the
machine's noise, after 100 calls each to warm up. Prints only a Markdown
section (a heading, a sentence, a table of p50 and p99 in µs); exits non-zero
with a message on stderr if anything fails. The goal: the SDK at most 1.2×
raw httpx.
"""

from __future__ import annotations

import argparse
import gc
import platform
import socket
import sys
import time
from typing import Any, Callable

AGENT, SESSION, CHECKPOINTS = "bench-sdk", "s", 10
BLOCK, WARM = 100, 100
GOAL = 1.2


def percentile(sorted_ns: list[int], p: float) -> float:
    """Nearest-rank percentile, in µs."""
    k = max(0, min(len(sorted_ns) - 1, int(round(p / 100 * len(sorted_ns) + 0.5)) - 1))
    return sorted_ns[k] / 1000


def no_delay(response: Any) -> None:
    """TCP_NODELAY on the connection ``response`` came on."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is None:
        raise RuntimeError("httpx gives no socket (network_stream) to set TCP_NODELAY on")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def has_no_delay(response: Any) -> bool:
    sock = response.extensions["network_stream"].get_extra_info("socket")
    return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


def httpcore_version() -> str:
    try:
        import httpcore

        return httpcore.__version__
    except (ImportError, AttributeError):
        return "?"


def setup(allox: Any, client: Any) -> None:
    try:
        client.agent_create(AGENT)
    except allox.Conflict:
        pass
    try:
        client.session_create(AGENT, SESSION)
    except allox.Conflict:
        pass
    have = {c.checkpoint_id for c in client.checkpoint_list(AGENT, SESSION).checkpoints}
    for i in range(CHECKPOINTS):
        if f"c{i}" not in have:
            try:
                client.checkpoint_create(AGENT, SESSION, f"c{i}")
            except allox.Conflict:
                pass
    n = len(client.checkpoint_list(AGENT, SESSION).checkpoints)
    if n < CHECKPOINTS:
        raise RuntimeError(f"session {AGENT}/{SESSION} has {n} checkpoints, not {CHECKPOINTS}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="the gateway, e.g. http://127.0.0.1:8092")
    ap.add_argument("--token", required=True, help="its bearer token")
    ap.add_argument("--n", type=int, default=3000, help="timed calls per request and client (default 3000)")
    args = ap.parse_args(argv)
    if args.n < BLOCK:
        ap.error(f"--n is at least {BLOCK}")

    import httpx

    import allox
    from allox import models

    url = args.url.rstrip("/")
    raw = httpx.Client(headers={"Authorization": f"Bearer {args.token}"}, timeout=30)
    typed = allox.Client(url, token=args.token, timeout=30)
    dicts = allox.Client(url, token=args.token, timeout=30)
    try:
        setup(allox, typed)
        rpc = url + "/v1/rpc"
        ping_body = {"action": "system.ping", "params": {}}
        list_body = {"action": "checkpoint.list", "params": {"agent_id": AGENT, "session_id": SESSION}}

        # What each answers, checked once before anything is timed. The raw
        # client's connection gets TCP_NODELAY, as the SDK's have (httpcore
        # before 0.17 leaves Nagle's algorithm on: a POST's body then waits
        # for the ACK of its headers, 40 ms of delayed ACK on Linux).
        r = raw.post(rpc, json=ping_body)
        if r.status_code != 200 or "result" not in r.json():
            raise RuntimeError(f"raw system.ping: HTTP {r.status_code} {r.text[:300]}")
        no_delay(r)
        r = raw.post(rpc, json=list_body)
        if r.status_code != 200 or len(r.json()["result"]["checkpoints"]) < CHECKPOINTS:
            raise RuntimeError(f"raw checkpoint.list: HTTP {r.status_code} {r.text[:300]}")
        if not isinstance(typed.ping(), models.Pong):
            raise RuntimeError("client.ping() is not a models.Pong")
        listing = typed.checkpoint_list(AGENT, SESSION)
        if not isinstance(listing, models.CheckpointListing) or not all(
            isinstance(c, models.CheckpointInfo) for c in listing.checkpoints
        ):
            raise RuntimeError("client.checkpoint_list() is not a models.CheckpointListing of CheckpointInfo")
        if dicts.call("checkpoint.list", agent_id=AGENT, session_id=SESSION)["checkpoints"][0]["checkpoint_id"] is None:
            raise RuntimeError("client.call('checkpoint.list') has no checkpoints")

        runs: list[tuple[str, str, Callable[[], Any]]] = [
            ("system.ping", "raw httpx", lambda: raw.post(rpc, json=ping_body).json()),
            ("system.ping", "SDK typed: `client.ping()`", typed.ping),
            ("system.ping", "SDK dicts: `client.call(...)`", lambda: dicts.call("system.ping")),
            ("checkpoint.list", "raw httpx", lambda: raw.post(rpc, json=list_body).json()),
            ("checkpoint.list", "SDK typed: `client.checkpoint_list(...)`", lambda: typed.checkpoint_list(AGENT, SESSION)),
            ("checkpoint.list", "SDK dicts: `client.call(...)`", lambda: dicts.call("checkpoint.list", agent_id=AGENT, session_id=SESSION)),
        ]
        samples: list[list[int]] = [[] for _ in runs]
        clock = time.perf_counter_ns
        for fn in (f for _, _, f in runs):
            for _ in range(WARM):
                fn()
        blocks = (args.n + BLOCK - 1) // BLOCK
        for b in range(blocks):
            gc.collect()
            # A different client first each round.
            order = list(range(len(runs)))
            order = order[b % len(order):] + order[: b % len(order)]
            for i in order:
                fn, out = runs[i][2], samples[i]
                for _ in range(min(BLOCK, args.n - b * BLOCK)):
                    t0 = clock()
                    fn()
                    out.append(clock() - t0)
        for name, c in (("raw httpx", raw), ("SDK typed", typed.http), ("SDK dicts", dicts.http)):
            r = c.post(rpc, json=ping_body)
            if not has_no_delay(r):
                raise RuntimeError(f"{name}: its connection has Nagle's algorithm on (no TCP_NODELAY): a new connection was made?")
    finally:
        raw.close()
        typed.close()
        dicts.close()

    rows = []
    base: dict[str, float] = {}
    for (request, who, _), s in zip(runs, samples):
        s.sort()
        p50, p99 = percentile(s, 50), percentile(s, 99)
        if who == "raw httpx":
            base[request] = p50
        rows.append((request, who, p50, p99, p50 / base[request]))
    print("### The Python client against raw httpx")
    print()
    print(
        f"Per call through the gateway at {url}: {args.n} calls per request and client, each client on a keep-alive "
        f"connection of its own with TCP_NODELAY (the SDK sets it itself, the raw client gets it by hand: httpcore "
        f"before 0.17 leaves it off and each POST then waits 40 ms for a delayed ACK), interleaved in blocks of "
        f"{BLOCK} after {WARM} to warm up, on Python {platform.python_version()}, httpx {httpx.__version__} and "
        f"httpcore {httpcore_version()}; "
        f"the goal is the SDK at most {GOAL}× raw httpx."
    )
    print()
    print("| request | client | p50 | p99 | p50 / raw httpx |")
    print("|---|---|---:|---:|---:|")
    for request, who, p50, p99, ratio in rows:
        print(f"| `{request}` | {who} | {p50:.0f} µs | {p99:.0f} µs | {ratio:.2f}× |")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - the harness wants a message and a status
        print(f"bench_sdk.py: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
