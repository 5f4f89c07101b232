"""Frozen settings of one control plane, built from the command line."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from controlplane.overload import DEFAULT_MAX_INFLIGHT, MAX_WRITE_WAIT_S

# R7: "full" syncs every commit before the answer; "relaxed" trades power-loss safety away.
Durability = Literal["full", "relaxed"]

MAX_BODY_BYTES = 1024 * 1024  # request bodies over 1 MiB are refused
READ_WORKERS = 2  # processes for long cached lists, started on the first slow one (B6)
DB_TIMEOUT_S = 5.0  # F1: the longest a request waits on the database in all
BODY_TIMEOUT_S = 30.0  # F4: a request's whole body must arrive within this long of its head


@dataclass(frozen=True)
class Config:
    db_path: Path | str  # a SQLite file, or a postgresql:// URL (B3)
    root_token_file: Path
    host: str = "127.0.0.1"
    port: int = 8080
    reconcile_interval: float = 30.0
    # A ready node not seen for this long is lost (three missed 30 s reports by default).
    node_lost_after: float = 90.0
    # P8: the attestors the join service runs; joinAttestors may name only these.
    attestors: frozenset[str] = field(default_factory=lambda: frozenset({"join-token"}))
    # R7: commits synced before the answer ("full"); "relaxed" trades power-loss safety away.
    durability: Durability = "full"
    read_workers: int = READ_WORKERS
    body_timeout: float = BODY_TIMEOUT_S
    # F1: the longest a request waits on the database in all before it answers 503.
    db_timeout: float = DB_TIMEOUT_S
    # F4: where /metrics is served without a token (an internal address); None: on the API
    # port, to root credentials only.
    metrics_listen: tuple[str, int] | None = None
    # F10: API requests handled at once; one more is shed (503 UNAVAILABLE, Retry-After).
    max_inflight: int = DEFAULT_MAX_INFLIGHT
    # F10: a mutation is shed while the oldest one waiting for the writer waited this long.
    max_write_wait: float = MAX_WRITE_WAIT_S
