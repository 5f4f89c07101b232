"""Which replica runs the reconciler and placer passes (B4, F2): a lease with a fencing term.

On PostgreSQL one row, ``leader_lease (holder, term, expires_at)``, says who leads. A
replica takes the lease when it is free or expired (the term moves on) and its holder
renews it: every check, and inside each pass's own transaction (``fence``), where a term
that is no longer current (another replica took over while this one was cut off) makes the
pass write nothing. A replica whose renewal fails stops leading at once; the lease of one
that died expires within ``LEASE_INTERVALS`` reconcile intervals, and the others look every
half interval, so a new leader leads within two intervals. Time is the database server's,
so replicas' clocks need not agree. A SQLite file has one control plane: it always leads.
"""

import math
import secrets
import time
from pathlib import Path

import structlog

from controlplane.storage.db import DB_TIMEOUT, connect, is_postgres
from controlplane.storage.sql import Database

log = structlog.get_logger("controlplane.leader")
LEASE_INTERVALS = 1.5  # the lease lasts this many reconcile intervals past each renewal
NOW = "extract(epoch from clock_timestamp())"
TAKE = (
    "UPDATE leader_lease SET term = CASE WHEN holder = ? THEN term ELSE term + 1 END, "
    f"holder = ?, expires_at = {NOW} + ? "
    f"WHERE id = 1 AND (holder = ? OR expires_at < {NOW}) RETURNING term"
)
RENEW = (
    f"UPDATE leader_lease SET expires_at = {NOW} + ? "
    f"WHERE id = 1 AND holder = ? AND term = ? AND expires_at >= {NOW}"
)


class NotLeading(Exception):
    """This replica's term is no longer current: what it was about to write is not written."""


class Leadership:
    def __init__(
        self, location: str | Path, interval: float = 30.0, timeout: float = DB_TIMEOUT
    ) -> None:
        self.location = location
        self.timeout = timeout
        self.postgres = is_postgres(location)
        self._leading = not self.postgres
        # Until when this replica's lease is surely its own by its own clock: from before the
        # statement that renewed it, so it ends no later than the database's.
        self._valid_until = math.inf if not self.postgres else 0.0
        self.term = 0
        self.holder = secrets.token_hex(8)  # this process, as the lease names it
        self.lease = LEASE_INTERVALS * interval
        self._db: Database | None = None

    @property
    def leader(self) -> bool:
        """Leading now: the lease was taken or renewed less than its length ago (a replica
        that cannot renew, whatever it is stuck on, stops leading when it ends)."""
        return self._leading and time.monotonic() < self._valid_until

    def holds(self) -> bool:
        """Whether this replica leads now: on PostgreSQL, takes the lease if it is free or
        expired, renews it if it is this replica's. A database call: never on the loop."""
        if not self.postgres:
            return True
        started = time.monotonic()
        try:
            if self._db is None:
                self._db = connect(self.location, timeout=self.timeout)
            found = self._db.execute(
                TAKE, [self.holder, self.holder, self.lease, self.holder]
            ).fetchone()
        except Exception:
            log.exception("leadership check failed; not leading")
            self.close()
            return False
        if found is None:
            if self._leading:
                log.warning("another replica holds the lease; not leading", term=self.term)
            self._leading = False
        else:
            if not self.leader or found[0] != self.term:
                log.info("leading the reconciler", term=found[0])
            self._leading, self.term = True, int(found[0])
            self._valid_until = started + self.lease
        return self.leader

    def fence(self, db: Database) -> None:
        """F2, in the pass's own transaction: renew this replica's lease, or raise
        ``NotLeading`` (the pass then writes nothing) when its term is no longer current."""
        if not self.postgres:
            return
        started = time.monotonic()
        if not self.leader or db.execute(RENEW, [self.lease, self.holder, self.term]).rowcount != 1:
            self._leading = False
            raise NotLeading(f"term {self.term} is no longer this replica's")
        self._valid_until = started + self.lease

    def close(self) -> None:
        """Give up leadership: the lease is let go at once when the database can be told."""
        if self._db is not None:
            if self._leading:
                try:
                    self._db.execute(
                        "UPDATE leader_lease SET expires_at = 0 WHERE id = 1 AND holder = ? "
                        "AND term = ?",
                        [self.holder, self.term],
                    )
                except Exception:  # unreachable: the lease expires on its own
                    log.debug("could not let the lease go")
            try:
                self._db.close()
            except Exception:  # already broken: nothing to give back
                log.debug("leader connection was already closed")
        self._db = None
        self._leading = not self.postgres
