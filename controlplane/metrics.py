"""What /metrics serves (M1): HTTP requests, reconciler passes, placer tries, failed host
configuration units, and the fleet's gauges (nodes, the capacity ledger, live reservations)."""

import asyncio
import bisect
import itertools
import math
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.metrics_core import Metric

from controlplane.capacity.admission import CONFIGURING, LOST, QUARANTINED, READY
from controlplane.capacity.bookings import Placement
from controlplane.storage import fleet
from controlplane.storage import pools as pool_sql
from controlplane.storage import quotas as quota_sql
from controlplane.storage.db import Store
from controlplane.storage.ledger_types import LedgerRow
from controlplane.storage.reservations import LIVE
from controlplane.storage.sql import Database

# Counted where the domain decides (a node's report) or from what the placer returns (the
# reconciler, reservations/create), with no app at hand: one per process, as client libraries
# keep counters, and registered in every app's registry. A try is counted in its transaction:
# a pass that fails whole (rare, logged) keeps its tries.
PLACEMENTS = Counter(
    "bc_placements",
    "Placer tries by result: placed, pending (nothing fits yet), failed (PoolGone, Expired)",
    ["result"],
    registry=None,
)
# Made at import, so each result's series is there (at 0) before its first try.
PLACEMENT_COUNTS = {tried: PLACEMENTS.labels(tried.value) for tried in Placement}


def count_placement(tried: Placement) -> None:
    """Count one try of the placer by what it came to."""
    PLACEMENT_COUNTS[tried].inc()


UNIT_FAILURES = Counter(
    "bc_unit_failures",
    "Host configuration units an agent reported failed, once each time a unit turns failed",
    ["pool", "unit"],
    registry=None,
)

NODE_STATES = (CONFIGURING, READY, QUARANTINED, LOST)
# offered comes beside (H6)
LEDGER_KINDS = ("total", "schedulable", "allocated", "available", "releasing")

Count = tuple[str, str, int]  # (pool, state, how many)


class Counted:
    """The services' counters (services/call.py's Counters) on this module's metrics."""

    def placement(self, tried: Placement) -> None:
        count_placement(tried)

    def unit_failed(self, pool_id: str, unit: str) -> None:
        UNIT_FAILURES.labels(pool_id, unit).inc()


COUNTED = Counted()


@dataclass(frozen=True)
class FleetSnapshot:
    nodes: list[Count]
    reservations: list[Count]
    capacity: list[tuple[str, str, str, int]]  # (pool, resource, kind, amount)


def _zero_filled(pools: Iterable[str], states: Sequence[str], found: list[Count]) -> list[Count]:
    """Every pool in every state, 0 where none: a series that empties reads 0, not a gap."""
    counts = {(pool, state): n for pool, state, n in found}
    for pool in pools:
        for state in states:
            counts.setdefault((pool, state), 0)
    return [(pool, state, n) for (pool, state), n in sorted(counts.items())]


def fleet_snapshot(db: Database) -> FleetSnapshot:
    """The gauges from grouped queries: nodes and live reservations by (pool, state), and each
    pool's ledger with the very queries pools/capacity answers its owner with (H6)."""
    pools = fleet.gauged_pools(db)
    capacity: list[tuple[str, str, str, int]] = []
    for pool_id, owner in pools:
        ledger = {row.resource: row for row in pool_sql.capacity_ledger(db, pool_id)}
        offered = quota_sql.offered_maxima(db, pool_id, owner)
        for resource in sorted(ledger.keys() | offered.keys()):
            row = ledger.get(resource) or LedgerRow(resource=resource)
            capacity += [(pool_id, resource, kind, getattr(row, kind)) for kind in LEDGER_KINDS]
            capacity.append((pool_id, resource, "offered", offered.get(resource, 0)))
    ids = [pool_id for pool_id, _ in pools]
    return FleetSnapshot(
        nodes=_zero_filled(ids, NODE_STATES, fleet.nodes_by_state(db)),
        reservations=_zero_filled(ids, LIVE, fleet.live_reservations_by_state(db)),
        capacity=capacity,
    )


class FleetGauges:
    """A custom collector: bc_nodes, bc_capacity and bc_reservations from the last snapshot.

    The snapshot is taken when /metrics is scraped, at most once per reconcile interval (the
    period capacity rows are recomputed at anyway), in one read transaction. So any number of
    scrapers costs one round of grouped queries per interval, nothing when none scrapes, and
    no table is scanned per scrape. Every replica (B4) takes its own from the one shared
    database: a follower's gauges are as right as the leader's, though only the leader runs
    passes, and no replica depends on another being up.
    """

    def __init__(self) -> None:
        self._snapshot = FleetSnapshot([], [], [])
        self._taken = -math.inf
        self._refreshing = asyncio.Lock()  # scrapes at once share one refresh

    async def refresh(self, store: Store, max_age: float) -> None:
        """A new snapshot when the last one is older than ``max_age`` seconds, read on a
        reader thread (B6: a big fleet's queries never hold the event loop)."""
        async with self._refreshing:
            started = time.monotonic()
            if started - self._taken < max_age:
                return
            self._snapshot = await store.read(fleet_snapshot)
            self._taken = started

    def _families(self, snapshot: FleetSnapshot) -> list[GaugeMetricFamily]:
        nodes = GaugeMetricFamily("bc_nodes", "Nodes by pool and state", labels=["pool", "state"])
        for pool, state, n in snapshot.nodes:
            nodes.add_metric([pool, state], n)
        capacity = GaugeMetricFamily(
            "bc_capacity",
            "The capacity ledger (H6, D7) by pool, resource and kind: total, schedulable, "
            "allocated, available, releasing, offered",
            labels=["pool", "resource", "kind"],
        )
        for pool, resource, kind, amount in snapshot.capacity:
            capacity.add_metric([pool, resource, kind], amount)
        reservations = GaugeMetricFamily(
            "bc_reservations", "Live reservations by pool and state", labels=["pool", "state"]
        )
        for pool, state, n in snapshot.reservations:
            reservations.add_metric([pool, state], n)
        return [nodes, capacity, reservations]

    def describe(self) -> Iterator[Metric]:
        """The names, without a snapshot: the registry refuses a clash at registration."""
        yield from self._families(FleetSnapshot([], [], []))

    def collect(self) -> Iterator[Metric]:
        yield from self._families(self._snapshot)


HTTP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class HttpRequests:
    """``bc_http_requests_total{method,status}`` and ``bc_http_request_seconds{method}``,
    counted in plain dicts and lists by the event loop's thread (the only one that serves
    requests or scrapes), exposed as the Counter and Histogram client libraries write.
    prometheus_client's own take a lock and walk the buckets in Python: ~1.8 µs a request,
    2% of a pools/get; this is a bisect and two adds."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, int], int] = {}
        self._latency: dict[str, tuple[list[int], list[float]]] = {}  # (buckets, [sum])

    def observe(self, route: str, status: int, seconds: float) -> None:
        key = (route, status)
        self._counts[key] = self._counts.get(key, 0) + 1
        found = self._latency.get(route)
        if found is None:
            found = self._latency[route] = ([0] * (len(HTTP_BUCKETS) + 1), [0.0])
        found[0][bisect.bisect_left(HTTP_BUCKETS, seconds)] += 1
        found[1][0] += seconds

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "bc_http_requests", "HTTP requests by method and status", labels=["method", "status"]
        )
        for (route, status), count in sorted(self._counts.items()):
            requests.add_metric([route, str(status)], count)
        yield requests
        latency = HistogramMetricFamily(
            "bc_http_request_seconds", "HTTP request latency by method", labels=["method"]
        )
        for route, (buckets, total) in sorted(self._latency.items()):
            cumulative = list(itertools.accumulate(buckets))
            bounds = [*(str(b) for b in HTTP_BUCKETS), "+Inf"]
            latency.add_metric([route], list(zip(bounds, cumulative, strict=True)), total[0])
        yield latency


@dataclass
class Metrics:
    registry: CollectorRegistry
    http: HttpRequests
    reconcile_failures: Counter  # R5: nodes and reservations a pass could not reconcile
    reconcile_seconds: Histogram  # each pass on the leader, from the writer's queue to commit
    rows_written: Counter  # what the passes wrote (PassStats.written)
    fleet: FleetGauges

    def observe(self, route: str, status: int, seconds: float) -> None:
        self.http.observe(route, status, seconds)

    @classmethod
    def create(cls) -> "Metrics":
        registry = CollectorRegistry()
        gauges, http = FleetGauges(), HttpRequests()
        for collector in (PLACEMENTS, UNIT_FAILURES, gauges, http):
            registry.register(collector)
        return cls(
            registry=registry,
            http=http,
            reconcile_failures=Counter(
                "bc_reconcile_failures",
                "Nodes and reservations a reconciler pass could not reconcile (each isolated, R5)",
                registry=registry,
            ),
            reconcile_seconds=Histogram(
                "bc_reconcile_seconds",
                "Reconciler passes on the leader: writer queue, the pass and its commit",
                registry=registry,
                buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            ),
            rows_written=Counter(
                "bc_reconcile_rows_written",
                "What reconciler passes wrote: capacity rows and GPU atoms, liveness stamps, "
                "nodes marked lost, reservations and drains moved",
                registry=registry,
            ),
            fleet=gauges,
        )
