"""What a read worker process runs (B6): its own reader connection, credential cache and
method table, and one cached read at a time through the same ``run_read`` as the parent, so
IAM is decided there exactly as here."""

from dataclasses import dataclass
from typing import Any

import msgspec

from controlplane.api.dispatch import run_read
from controlplane.api.keys import CALLER
from controlplane.api.method import Method, Read
from controlplane.config import Config
from controlplane.reads.workers import Outcome, WorkerEntry
from controlplane.runtime import Runtime
from controlplane.storage.db import connect, snapshot_of
from controlplane.storage.sql import Database
from shared.errors import ApiError


@dataclass
class _Worker:
    """What one worker process holds: its connection, its methods, its credential cache."""

    db: Database
    methods: dict[str, Method]
    runtime: Runtime  # without a store: the cached reads use only config and credentials


_worker: _Worker | None = None


def start(config: Config) -> None:
    """The worker's initializer: one reader connection and the method table."""
    global _worker
    from controlplane.api.routes import ALL_METHODS  # routes' handlers import this module's peers

    _worker = _Worker(
        db=connect(config.db_path, config.durability, timeout=config.db_timeout),
        methods={method.path: method for method in ALL_METHODS},
        runtime=Runtime(config),  # its own credential cache (0.5 s entries, B5)
    )


def ready() -> bool:
    return _worker is not None


def answer(path: str, token: str | None, raw: bytes) -> Outcome:
    """Run one read in this worker: ``run_read`` on the worker's snapshot."""
    assert _worker is not None
    method = _worker.methods[path]
    assert isinstance(method.call, Read)
    try:
        # The parent decoded this body already (it is valid): decoding again is this
        # process's copy of it.
        body = msgspec.json.decode(raw, type=method.request)
        stand_in: dict[Any, Any] = {}  # identify() says who called here, for the log line
        run = run_read(method, method.call, token, stand_in, _worker.runtime, body)
        with snapshot_of(_worker.db) as db:
            made_at, _, encoded = run(db)
        return ("ok", made_at, encoded, stand_in.get(CALLER, {}))
    except ApiError as exc:
        return ("error", exc.status, exc.code, exc.message, exc.details)


ENTRY = WorkerEntry(start=start, answer=answer, ready=ready)
