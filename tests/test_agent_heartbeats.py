"""F9 and F10, the agent's side: small heartbeats, and backing off as a shedding control plane
says.

F9: the real agent loop and client behind a recording proxy in front of the real control
plane: which reports carry the whole inventory and which its digest (the one the last answer
gave), and that a report asked for the inventory sends it at once. F10: a real aiohttp server
on loopback answering 503 with Retry-After; the waits the loop chooses are observed (its
pause), never slept.
"""

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web

from agent.client import ControlPlane, Unreachable
from agent.loop import Agent, Settings
from agent.state import NodeCredential, State
from shared.inventory import Inventory
from tests.daemons import Daemon, serving
from tests.nodes import recorded
from tests.specs import HUGEPAGES, HUGEPAGES_FILE, HUGEPAGES_TEXT, host_apply, served
from tests.test_reservation_delivery import Api

REPORT = "/api/compute/nodes/report"
JOIN = "/api/compute/nodes/join"


@pytest.fixture
def plane(tmp_path: Path, db: Any) -> Iterator[Daemon]:
    """The real control plane on this run's backend."""
    running = Daemon(tmp_path, db=db if isinstance(db, str) else None)
    running.start()
    yield running
    running.kill()


class Recorder:
    """What went through the proxy: each report's body and answer, each join's answer; the
    report answers it rewrites."""

    def __init__(self) -> None:
        self.reports: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self.joins: list[dict[str, Any]] = []  # each join's answer
        self.want_once = False  # the next report's answer says inventoryWanted: true
        self.old = False  # answers without inventoryDigest, as an older control plane's

    def rewrite(self, answer: dict[str, Any]) -> dict[str, Any]:
        if self.want_once:
            self.want_once = False
            answer = {**answer, "inventoryWanted": True}
        if self.old:
            answer = {k: v for k, v in answer.items() if k not in ("inventoryDigest",)}
        return answer


@asynccontextmanager
async def recording(upstream: str, recorder: Recorder) -> AsyncIterator[str]:
    """A loopback proxy to ``upstream`` that records every report; its URL."""
    session = aiohttp.ClientSession()

    async def forward(request: web.Request) -> web.Response:
        headers = {
            k: v for k, v in request.headers.items() if k in ("Authorization", "Content-Type")
        }
        body = await request.read()
        async with session.post(upstream + request.path, data=body, headers=headers) as answer:
            raw = await answer.read()
            if request.path == REPORT and answer.status == 200:
                rewritten = recorder.rewrite(msgspec.json.decode(raw))
                recorder.reports.append((msgspec.json.decode(body), rewritten))
                raw = msgspec.json.encode(rewritten)
            if request.path == JOIN and answer.status == 200:
                recorder.joins.append(msgspec.json.decode(raw))
            return web.Response(status=answer.status, body=raw, content_type="application/json")

    app = web.Application()
    app.router.add_post("/{tail:.*}", forward)
    try:
        async with serving(app) as url:
            yield url
    finally:
        await session.close()


def a_loop(url: str, tmp_path: Path, host: Callable[[], Inventory], token: Path) -> Agent:
    """The real loop and client, applying in-process under tmp_path/root: as after a start."""
    state = State(tmp_path / "state")
    return Agent(
        Settings(url, token, interval=0.01),
        state,
        host,
        ControlPlane(url),
        host_apply(tmp_path / "root", state.directory),
    )


async def once(agent: Agent) -> None:
    await asyncio.to_thread(agent.run, threading.Event(), True)


def kinds(reports: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[str]:
    """Each report as ``whole`` or ``digest``; never both, never neither."""
    found = []
    for body, _ in reports:
        assert ("inventory" in body) != ("inventoryDigest" in body), body
        found.append("whole" if "inventory" in body else "digest")
    return found


async def test_f9_an_unchanged_inventory_is_sent_as_the_digest_last_answered(
    plane: Daemon, tmp_path: Path
) -> None:
    """The join's digest at the first report after a join (the join carried the inventory
    whole); whole at the first report after a start; the digest the last answer gave while nothing
    moved; whole at once, in the same cycle, when the answer asks; whole when the inventory
    changed, not when only its temperatures did; whole again after a restart; always whole to a control plane that answers no
    digest. The control plane takes every digest report (the node stays ready)."""
    async with aiohttp.ClientSession() as session:
        api = Api(plane, session)
        pool = await api.pool("H100", HUGEPAGES, {"gpu": 8})
        token_file = await api.token_file(pool)
    recorder = Recorder()
    inventory = [recorded("dgx-h100-01")]
    async with recording(plane.url, recorder) as url:
        agent = a_loop(url, tmp_path, lambda: inventory[0], token_file)
        await once(agent)  # join; report; apply; report the outcome at once
        assert (tmp_path / "root" / HUGEPAGES_FILE).read_text() == HUGEPAGES_TEXT
        await once(agent)  # its units now unchanged: news, reported at once too
        await once(agent)  # an idle cycle: one report
        sent = kinds(recorder.reports)
        assert sent == ["digest"] * len(sent) and len(sent) >= 4
        assert recorder.reports[0][0]["inventoryDigest"] == recorder.joins[0]["inventoryDigest"]
        for (body, _), (_, answered) in zip(recorder.reports[1:], recorder.reports, strict=False):
            assert body["inventoryDigest"] == answered["inventoryDigest"]
        assert not any(a["inventoryWanted"] for _, a in recorder.reports)

        async def step(*loops: Agent) -> list[str]:
            before = len(recorder.reports)
            for loop in loops:
                await once(loop)
            return kinds(recorder.reports[before:])

        recorder.want_once = True
        assert await step(agent) == ["digest", "whole"]  # asked: sent within the cycle
        held = recorder.reports[-1][1]["inventoryDigest"]
        # Temperatures and free huge pages move every cycle on a real host; they are not news.
        warmer = [
            msgspec.structs.replace(gpu, temperature_c=(gpu.temperature_c or 30) + 7)
            for gpu in inventory[0].gpus
        ]
        inventory[0] = msgspec.structs.replace(inventory[0], gpus=warmer)
        assert await step(agent) == ["digest"]
        assert recorder.reports[-1][1]["inventoryDigest"] == held
        gpus = list(inventory[0].gpus)
        gpus[0] = msgspec.structs.replace(gpus[0], power_limit_w=(gpus[0].power_limit_w or 0) + 9)
        inventory[0] = msgspec.structs.replace(inventory[0], gpus=gpus)
        assert await step(agent, agent) == ["whole", "digest"]
        changed, then = recorder.reports[-2], recorder.reports[-1]
        assert changed[0]["inventory"]["gpus"][0]["powerLimitW"] == gpus[0].power_limit_w
        assert changed[1]["inventoryDigest"] != held  # the control plane holds the new one
        assert then[0]["inventoryDigest"] == changed[1]["inventoryDigest"]
        restarted = a_loop(url, tmp_path, lambda: inventory[0], token_file)
        assert await step(restarted) == ["whole", "digest"]  # then its first outcome
        recorder.old = True
        # The digest the last answer gave, then, once answers carry none, the inventory whole.
        sent = await step(restarted, restarted)
        assert sent[0] == "digest" and len(sent) >= 2 and set(sent[1:]) == {"whole"}
        for loop in (agent, restarted):
            loop.client.close()
    async with aiohttp.ClientSession() as session:
        assert (await Api(plane, session).node(pool))["state"] == "ready"


async def test_f10_a_shedding_control_plane_is_waited_out_as_it_says_with_jitter(
    tmp_path: Path,
) -> None:
    """503 with Retry-After: 7 to every request: the client's Unreachable carries 7; each wait
    the loop chooses is at least 7 and at most 14 (Retry-After plus up to as long again),
    jittered (not all the same); one request per wait (no hammering); and the kept spec is
    applied meanwhile, as while the control plane is away. A 503 without Retry-After is
    backed off as before (at most the backoff cap)."""
    asked: list[str] = []

    async def shed(request: web.Request) -> web.Response:
        asked.append(request.path)
        retry = {"Retry-After": "7"} if request.path == REPORT else {}
        return web.json_response(
            {"error": {"code": "UNAVAILABLE", "message": "shedding load", "details": {}}},
            status=503,
            headers=retry,
        )

    app = web.Application()
    app.router.add_post("/{tail:.*}", shed)
    async with serving(app) as url:
        with ControlPlane(url) as client:
            try:
                await asyncio.to_thread(client.spec, "bcn_x", "node_x")
            except Unreachable as exc:
                assert exc.retry_after is None and "503: UNAVAILABLE" in str(exc)
            try:
                await asyncio.to_thread(client.report, "bcn_x", "node_x", None, None, None, "d")
            except Unreachable as exc:
                assert exc.retry_after == 7.0
        asked.clear()
        state = State(tmp_path / "state")
        state.save_credential(NodeCredential("node_x", "bcn_x", "pool_x", url))
        state.save_spec(served("s1"))
        agent = a_loop(url, tmp_path, lambda: recorded("dgx-h100-01"), tmp_path / "t")
        waits: list[float] = []
        stop = threading.Event()

        def pause(stop_: threading.Event, seconds: float, *_: Any, **__: Any) -> None:
            waits.append(seconds)
            if len(waits) == 6:
                stop.set()

        agent.pause = pause  # type: ignore[method-assign,assignment]
        await asyncio.to_thread(agent.run, stop)
        agent.client.close()
    assert len(waits) == 6 and asked == [REPORT] * 6
    assert all(7 <= wait <= 14 for wait in waits) and len(set(waits)) > 1, waits
    assert (tmp_path / "root" / HUGEPAGES_FILE).read_text() == HUGEPAGES_TEXT
    assert agent.backoff(0, 0.5) <= 0.5  # without Retry-After: the backoff, capped
