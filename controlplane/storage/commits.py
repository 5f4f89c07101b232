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
from collections.abc import Iterable
from typing import Any

import structlog

from controlplane.storage.db import EVENTS_CHANNEL, Store, postgres_pool

log = structlog.get_logger("controlplane.commits")

LISTEN_TIMEOUT_S = 1.0  # how often the listener looks up from the socket to see it should stop


class CommitSignal:
    """The highest event seq known committed, for everyone and per tenant that may see it.

    A waiter for one tenant's events (``tenant``) is woken only by a commit with an event in
    that tenant's audience, or one whose audience is not known (``None``: another replica's
    notice too long to name them); a waiter for the fleet (``tenant=None``) by any commit.
    ``close`` (the server is stopping) ends every wait at once.
    """

    def __init__(self, latest: int = 0) -> None:
        self.latest = latest
        self.closed = False
        self._for_tenant: dict[str, int] = {}
        self._for_everyone = latest  # the last commit whose audience is not known
        self._changed = asyncio.Event()

    def position(self, tenant: str | None) -> int:
        """The last seq that is news to ``tenant`` (None: to the fleet)."""
        if tenant is None:
            return self.latest
        return max(self._for_tenant.get(tenant, 0), self._for_everyone)

    def advance(self, seq: int, tenants: Iterable[str] | None) -> None:
        """A commit of events up to ``seq`` visible to ``tenants`` (None: not known)."""
        if tenants is None:
            self._for_everyone = max(self._for_everyone, seq)
        else:
            for tenant in tenants:
                self._for_tenant[tenant] = max(self._for_tenant.get(tenant, 0), seq)
        if seq > self.latest:
            self.latest = seq
        self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_beyond(self, seen: int, seconds: float, tenant: str | None = None) -> bool:
        """Whether an event after ``seen`` that is news to ``tenant`` was committed within
        ``seconds``; a commit that is not wakes this coroutine, which reads nothing and waits
        on."""
        try:
            async with asyncio.timeout(seconds):
                while self.position(tenant) <= seen and not self.closed:
                    await self._changed.wait()
        except TimeoutError:
            pass
        return self.position(tenant) > seen


def parse_notice(payload: str) -> tuple[int, frozenset[str] | None]:
    """A commit's NOTIFY payload (``storage.db.notice``): its seq and its audience, None
    when it names none (too many tenants, or a replica of an older version) or is not a
    notice at all (someone's ``NOTIFY bc_events 'x'``: the listener must not stop on it)."""
    seq, named, tenants = payload.partition(":")
    try:
        return int(seq), frozenset(tenants.split(",")) - {""} if named else None
    except ValueError:  # not one of ours: news to everyone, at no seq
        return 0, None


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
        # Its own pool of one (a LISTEN holds its session), checked on borrow like the store's.
        pool = postgres_pool(self._location, self._store.durability, 1, self._store.db_timeout)
        try:
            self._listen(loop, pool)
        finally:
            pool.close()

    def _listen(self, loop: asyncio.AbstractEventLoop, pool: Any) -> None:
        while not self._stop.is_set():
            try:
                with pool.connection() as conn:
                    conn.execute(f"LISTEN {EVENTS_CHANNEL}")
                    while not self._stop.is_set():
                        for notice in conn.notifies(timeout=LISTEN_TIMEOUT_S):
                            if self._stop.is_set():
                                return
                            loop.call_soon_threadsafe(
                                self._signal.advance, *parse_notice(notice.payload)
                            )
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
            self._store.reader.execute("SELECT pg_notify(?, '0:')", [EVENTS_CHANNEL])
        if self._thread is not None:
            self._thread.join(timeout=LISTEN_TIMEOUT_S * 3)
