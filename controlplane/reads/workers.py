"""Long reads in worker processes, once the fleet makes them long (B6).

A reader thread takes a list's SQL off the event loop, but its Python (rows to
views to JSON) still holds the interpreter, so the loop waits for it at every
switch: with a 10,000-pool list computing, a one-row ``pools/get`` went from a
0.5 ms p99 to 5 ms and more. Reads that depend on nothing but the database, the
credential and the body (the ``cached`` ones) can run anywhere with a
connection: in a small pool of worker processes, each with its own reader
connection and credential cache, they use another core and leave the loop's
interpreter alone.

The pool is started only when a read was seen to be slow (a fleet where lists
take milliseconds), so a small control plane never pays for the processes; its
reads stay on the reader threads until the workers are up. A worker answers
with the encoded answer and the generation it read at (the parent caches it),
or with the error to send; it decides IAM exactly as the parent would (the
same identify and authorize on its own snapshot).
"""

import asyncio
import multiprocessing
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import structlog

from controlplane.config import Config

log = structlog.get_logger("controlplane.workers")

SLOW_READ_S = 0.05  # a cached list this long (on a reader thread) starts the worker processes


# ("ok", generation, encoded answer, who called) or ("error", status, code, message, details)
Outcome = tuple[Any, ...]


@dataclass(frozen=True)
class WorkerEntry:
    """What a worker process runs, given by the layer that owns the method table: ``start``
    (its initializer, with the config) and ``answer`` (one read: path, token, raw body).
    Both are module-level functions, so spawn pickles them by name."""

    start: Callable[[Config], None]
    answer: Callable[[str, str | None, bytes], Outcome]
    ready: Callable[[], bool]


class ReadWorkers:
    """The worker processes of one control plane, started on the first slow read."""

    def __init__(self, config: Config | None, processes: int, entry: WorkerEntry | None) -> None:
        """No ``config`` or ``entry``: no worker processes (reads stay on reader threads)."""
        self._config = config
        self._entry = entry
        self._processes = processes if config is not None and entry is not None else 0
        self._pool: ProcessPoolExecutor | None = None
        self._starting = False
        self._closed = False
        # Starting the pool and closing it take turns: a close never lands between the
        # start's look at ``_closed`` and its first tasks (the pool would refuse them).
        self._turn = threading.Lock()
        self.ready = False
        self.answered = 0  # reads the workers answered

    @classmethod
    def disabled(cls) -> "ReadWorkers":
        return cls(None, 0, None)

    def saw(self, seconds: float) -> None:
        """A read took ``seconds`` on a reader thread: the first slow one starts the pool (on a
        thread of its own: starting processes is milliseconds the loop need not wait)."""
        if seconds >= SLOW_READ_S and not self._starting and self._processes > 0:
            self._starting = True
            threading.Thread(target=self._start, name="read-workers", daemon=True).start()

    def _start(self) -> None:
        entry, config = self._entry, self._config
        assert entry is not None and config is not None
        started = time.monotonic()
        with self._turn:
            if self._closed:  # the control plane stopped before this thread got to start it
                return
            pool = self._pool = ProcessPoolExecutor(
                max_workers=self._processes,
                mp_context=multiprocessing.get_context("spawn"),  # never fork a threaded process
                initializer=entry.start,
                initargs=(config,),
            )
            futures = [pool.submit(entry.ready) for _ in range(self._processes)]

        def up(_: object) -> None:
            if all(f.done() and not f.cancelled() and f.exception() is None for f in futures):
                self.ready = True
                log.info(
                    "read workers up",
                    processes=self._processes,
                    seconds=round(time.monotonic() - started, 3),
                )

        for future in futures:
            future.add_done_callback(up)

    async def answer(self, path: str, token: str | None, raw: bytes) -> Outcome | None:
        """The worker's outcome; None when the pool broke (a worker died: out of memory,
        killed): the caller reads on a thread, and the next slow read starts a new pool."""
        pool, entry = self._pool, self._entry
        assert pool is not None and entry is not None
        loop = asyncio.get_running_loop()
        try:
            outcome = await loop.run_in_executor(pool, entry.answer, path, token, raw)
        except BrokenProcessPool:
            log.warning("a read worker died; lists go to reader threads until a new pool is up")
            if self._pool is pool:  # not a late failure of a pool already replaced
                self.ready, self._starting, self._pool = False, False, None
            pool.shutdown(wait=False, cancel_futures=True)
            return None
        self.answered += 1
        return outcome

    def close(self) -> None:
        with self._turn:
            self._closed = True
            pool = self._pool
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
