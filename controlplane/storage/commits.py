"""Committed events as a signal long-polls wait on (B2), on one process and across replicas.

This process's own mutations advance the signal as they commit (``Store.on_commit``).
On PostgreSQL every mutation that appended events also sends ``NOTIFY bc_events``
with its last seq (delivered at commit, to every replica); one listener thread per
process, on its own connection, advances the signal on the event loop. Waiters are
woken by commits, never by a polling loop; a waiter re-reads what it may see, since
an event committed is not necessarily one visible to its tenant.
"""

import asyncio
import contextlib
import threading

import structlog

from controlplane.storage.db import EVENTS_CHANNEL, Store

log = structlog.get_logger("controlplane.commits")

LISTEN_TIMEOUT_S = 1.0  # how often the listener looks up from the socket to see it should stop


class CommitSignal:
    """The highest event seq known committed; ``wait_beyond`` returns once a higher one is,
    or at once for good after ``close`` (the server is stopping)."""

    def __init__(self, latest: int = 0) -> None:
        self.latest = latest
        self.closed = False
        self._changed = asyncio.Event()

    def advance(self, seq: int) -> None:
        if seq > self.latest:
            self.latest = seq
            self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_beyond(self, seen: int, seconds: float) -> bool:
        """Whether an event after ``seen`` was committed within ``seconds``."""
        try:
            async with asyncio.timeout(seconds):
                while self.latest <= seen and not self.closed:
                    await self._changed.wait()
        except TimeoutError:
            pass
        return self.latest > seen


class CommitListener:
    """On PostgreSQL, a thread that LISTENs for every replica's commits (this one's too)."""

    def __init__(self, store: Store, signal: CommitSignal) -> None:
        self._store = store
        self._location = str(store.location)
        self._signal = signal
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(loop,), name="commit-listener", daemon=True
        )
        self._thread.start()

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        import psycopg  # only a PostgreSQL control plane listens

        while not self._stop.is_set():
            try:
                with psycopg.connect(self._location, autocommit=True) as conn:
                    conn.execute(f"LISTEN {EVENTS_CHANNEL}")
                    while not self._stop.is_set():
                        for notice in conn.notifies(timeout=LISTEN_TIMEOUT_S):
                            if self._stop.is_set():
                                return
                            loop.call_soon_threadsafe(self._signal.advance, int(notice.payload))
            except Exception:
                if self._stop.is_set():
                    return
                # Long-polls still answer at their deadline meanwhile; then listen again.
                log.exception("commit listener lost its connection; listening again")
                self._stop.wait(LISTEN_TIMEOUT_S)

    def stop(self) -> None:
        """Stop listening; a notice of seq 0 (news to no one) wakes the thread at once."""
        self._stop.set()
        with contextlib.suppress(Exception):
            self._store.reader.execute("SELECT pg_notify(?, '0')", [EVENTS_CHANNEL])
        if self._thread is not None:
            self._thread.join(timeout=LISTEN_TIMEOUT_S * 3)
