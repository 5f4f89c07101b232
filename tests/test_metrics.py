"""M1: /metrics serves the fleet's gauges with the numbers the API answers, the reconciler's
and placer's counters, and failed host configuration units; the Grafana dashboard in docs/
queries only what the daemon exposes."""

import asyncio
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from controlplane.app import make_app
from controlplane.config import Config
from tests.conftest import Api
from tests.nodes import apply_spec, joined, pool_with_token, recorded, twin

DASHBOARD = Path(__file__).resolve().parent.parent / "docs" / "grafana-dashboard.json"
M1 = (
    "bc_nodes",
    "bc_capacity",
    "bc_reservations",
    "bc_reconcile_seconds",
    "bc_reconcile_rows_written",
    "bc_placements",
    "bc_unit_failures",
)
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


class Scrape:
    """One /metrics answer, parsed by prometheus_client's own parser."""

    def __init__(self, text: str) -> None:
        self.families = list(text_string_to_metric_families(text))

    def __call__(self, name: str, **labels: str) -> float:
        """The one sample of that name with exactly these labels; 0 if none (a counter)."""
        found = [
            s.value
            for f in self.families
            for s in f.samples
            if s.name == name and s.labels == labels
        ]
        assert len(found) <= 1, (name, labels, found)
        return found[0] if found else 0.0

    def exposed(self) -> set[str]:
        """Every sample name the families can carry, by their types."""
        return {f.name + suffix for f in self.families for suffix in SUFFIXES.get(f.type, ("",))}


async def scrape(api: Api) -> Scrape:
    """/metrics as a scraper with the root token reads it (F4)."""
    response = await api.client.get("/metrics", headers={"Authorization": f"Bearer {api.token}"})
    assert response.status == 200
    return Scrape(await response.text())


async def test_m1_gauges_and_counters_follow_the_fleet(config: Config, aiohttp_client: Any) -> None:
    """M1: bc_nodes counts nodes by state, bc_capacity is the pools/capacity ledger kind by kind
    (H6), bc_reservations counts placed and pending, bc_placements_total, bc_reconcile_seconds
    and bc_reconcile_rows_written_total move with passes, and bc_unit_failures_total counts a
    unit once each time it turns failed, not on every report repeating it."""
    config = dataclasses.replace(config, reconcile_interval=0.05)
    api = Api(await aiohttp_client(make_app(config)), config.root_token_file.read_text().strip())
    pool, token = await pool_with_token(api, policy={"hugepages": {"2Mi": 512}})
    await api.tenant("acme")
    await api.offer(pool, "acme", {"gpu": 4})
    host = recorded("dgx-h100-01")
    ready = await joined(api, token, host)
    await joined(api, token, twin("dgx-h100-01", 7), applied=False)  # configuring
    before = await scrape(api)
    reserve = {"tenantId": "root", "poolId": pool}
    placed = await api.ok("compute/reservations/create", {**reserve, "resources": {"gpu": 8}})
    waiting = await api.ok("compute/reservations/create", {**reserve, "resources": {"gpu": 1}})
    assert (placed["state"], waiting["state"]) == ("placed", "pending")
    # A new policy makes both nodes stale: the next pass rewrites their vcpu rows.
    policy = {"hugepages": {"2Mi": 512}, "overcommit": {"vcpu": 2}}
    await api.ok("compute/pools/update", {**reserve, "policy": policy})
    for _ in range(100):  # bounded: up to 5 s
        after = await scrape(api)
        if after("bc_reconcile_rows_written_total") >= 2:
            break
        await asyncio.sleep(0.05)
    ledger = await api.ok("compute/pools/capacity", reserve)
    after = await scrape(api)

    states = {s: after("bc_nodes", pool=pool, state=s) for s in ("ready", "configuring", "lost")}
    assert states == {"ready": 1, "configuring": 1, "lost": 0}
    kinds = ("total", "schedulable", "allocated", "available", "offered")
    assert {
        (row["resource"], kind): after(
            "bc_capacity", pool=pool, resource=row["resource"], kind=kind
        )
        for row in ledger["items"]
        for kind in kinds
    } == {(row["resource"], kind): row[kind] for row in ledger["items"] for kind in kinds}
    assert [after("bc_capacity", pool=pool, resource="gpu", kind=k) for k in kinds] == [
        16,
        8,
        8,
        0,
        4,
    ]
    live = {s: after("bc_reservations", pool=pool, state=s) for s in ("placed", "pending")}
    assert live == {"placed": 1, "pending": 1}
    moved = {
        r: after("bc_placements_total", result=r) - before("bc_placements_total", result=r)
        for r in ("placed", "pending")
    }
    assert moved["placed"] == 1 and moved["pending"] >= 2, moved  # at create, then each pass
    assert after("bc_reconcile_seconds_count") >= 1
    assert after("bc_reconcile_seconds_sum") > 0

    spec = await apply_spec(api, ready, host)  # the new spec applied cleanly
    broken, other = (unit["id"] for unit in spec["units"])
    failures = {"pool": pool, "unit": broken}
    await apply_spec(api, ready, host, **{broken: "failed"})
    assert (await scrape(api))("bc_unit_failures_total", **failures) == 1
    # Reported failed again (the other unit moved, so the report is written): no new count.
    await apply_spec(api, ready, host, **{broken: "failed", other: "unchanged"})
    assert (await scrape(api))("bc_unit_failures_total", **failures) == 1
    await apply_spec(api, ready, host)
    await apply_spec(api, ready, host, **{broken: "failed"})
    end = await scrape(api)
    assert end("bc_unit_failures_total", **failures) == 2
    assert end("bc_unit_failures_total", pool=pool, unit=other) == 0


async def test_m1_the_grafana_dashboard_queries_what_the_daemon_exposes(api: Api) -> None:
    """M1: docs/grafana-dashboard.json is a dashboard with a Prometheus datasource variable;
    every metric its panels and variables query is one /metrics exposes (on an empty fleet
    too), and it queries each M1 metric."""
    dashboard = json.loads(DASHBOARD.read_text())
    variables = dashboard["templating"]["list"]
    assert {"type": "datasource", "query": "prometheus"}.items() <= variables[0].items()
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queries += [v["definition"] for v in variables if v["type"] == "query"]
    assert all(
        t["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"] for t in p["targets"]
    )
    queried = {name for q in queries for name in re.findall(r"\bbc_[a-z_]+", q)}
    exposed = (await scrape(api)).exposed()
    assert queried <= exposed, queried - exposed
    assert all(any(name.startswith(m) for name in queried) for m in M1)
