"""R3: optimistic concurrency on pool mutations: a stale version is CONFLICT and changes nothing."""

import asyncio
from pathlib import Path

from tests.conftest import Api, snapshot


async def test_r3_concurrent_updates_with_one_version_one_wins(api: Api, db: Path) -> None:
    """R3: two concurrent pools/update calls that read version 1: one applies, the other is
    CONFLICT with details.field = version; the pool holds the winner's policy."""
    site = await api.site()
    pool = await api.pool(site)
    bodies = [
        {"tenantId": "root", "poolId": pool["id"], "policy": {"maxPending": m}, "version": 1}
        for m in ("1h", "2h")
    ]
    answers = await asyncio.gather(*(api.call("compute/pools/update", b) for b in bodies))
    statuses = sorted(status for status, _ in answers)
    assert statuses == [200, 409], answers
    loser = next(a for s, a in answers if s == 409)["error"]
    assert (loser["code"], loser["details"]["field"]) == ("CONFLICT", "version")
    winner = next(a for s, a in answers if s == 200)
    got = await api.ok("compute/pools/get", {"tenantId": "root", "poolId": pool["id"]})
    assert got["version"] == 2 and got["policy"] == winner["policy"]


async def test_r3_every_versioned_method_refuses_a_stale_version(api: Api, db: Path) -> None:
    """R3: update, offer, unoffer, archive and quotas/set with a version that is no longer the
    pool's are CONFLICT (field version) and write nothing; with the current one they apply."""
    await api.tenant("acme")
    site = await api.site()
    pool = (await api.pool(site))["id"]
    await api.offer(pool, "acme")
    await api.ok("compute/pools/update", {"tenantId": "root", "poolId": pool, "policy": {}})
    at = {"tenantId": "root", "poolId": pool}
    calls = [
        ("compute/pools/update", {**at, "policy": {"maxPending": "1h"}}),
        ("compute/pools/offer", {**at, "toTenantId": "acme", "quota": {"gpu": 2}}),
        ("compute/quotas/set", {**at, "forTenantId": "acme", "quota": {"gpu": 3}}),
        ("compute/pools/unoffer", {**at, "toTenantId": "acme"}),
        ("compute/pools/archive", at),
    ]
    for path, body in calls:
        before = snapshot(db)
        error = await api.err(path, {**body, "version": 1}, "CONFLICT", "version", status=409)
        assert error["details"]["current"] >= 2
        assert snapshot(db) == before, path
        current = (await api.ok("compute/pools/get", at))["version"]
        await api.ok(path, {**body, "version": current})
    await api.err("compute/pools/get", {**at, "version": 1}, "INVALID_INPUT", "version")
