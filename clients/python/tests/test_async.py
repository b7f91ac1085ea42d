"""The async client against the real gateway: the same basic flow."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

import allox
from allox import models

pytestmark = pytest.mark.gateway


def test_the_async_client_does_the_basic_flow(gateway):
    a = f"agent-{uuid.uuid4().hex[:10]}"

    async def main():
        # httpx's own pool (up to 100 connections): a burst of 20 new ones
        # at once is served as they come.
        async with allox.AsyncClient(gateway.base_url, token=gateway.token) as c:
            assert isinstance(await c.ping(), models.Pong)
            agent = await c.agent_create(a)
            assert isinstance(agent, models.AgentInfo) and agent.agent_id == a
            assert (await c.call("session.create", agent_id=a, session_id="s1"))["head"] is None
            await c.write_file(a, "s1", "f.txt", b"v1")
            cp = await c.checkpoint_create(a, "s1", "clean")
            assert cp.origin == "manual"
            await c.write_file(a, "s1", "f.txt", b"v2")
            d = await c.diff(a, "s1", "clean")
            assert [(x.path, x.kind) for x in d.changes] == [("f.txt", "modified")]
            run = await c.exec(a, "s1", ["cat", "f.txt"])
            assert run.stdout == "v2"
            await c.rollback(a, "s1", "clean")
            assert await c.read_file(a, "s1", "f.txt") == b"v1"
            # Many calls at once, on the client's pool.
            got = await asyncio.gather(*(c.checkpoint_create(a, "s1", f"c{i}") for i in range(20)))
            assert sorted(x.checkpoint_id for x in got) == sorted(f"c{i}" for i in range(20))
            with pytest.raises(allox.NotFound):
                await c.session_list(f"missing-{uuid.uuid4().hex[:8]}")
            with pytest.raises(allox.InvalidRequest):
                await c.agent_create(".bad")
            with pytest.raises(allox.Conflict):
                await c.agent_create(a)
            # The session helper and a turn, with `async with`.
            async with c.session(a, "s2", auto_checkpoint=True, delete=True) as s:
                async with s.turn() as t:
                    await s.write_file("x.txt", "x")
                assert t.checkpoint_id == "turn-1"
            assert [x.session_id for x in (await c.session_list(a)).sessions] == ["s1"]
            await c.agent_delete(a, force=True)
        async with allox.AsyncClient(gateway.base_url, token="0" * 64) as bad:
            with pytest.raises(allox.Unauthorized):
                await bad.agent_list()

    asyncio.run(main())
