"""Which replica runs the reconciler and placer passes (B4).

On PostgreSQL every replica tries a session-level advisory lock on its own
connection before each pass; the one holding it is the leader. When the
leader dies its session ends and the lock goes with it, so another replica
takes it at its next try: within two reconcile intervals. A SQLite file has
one control plane: it always leads.
"""

from pathlib import Path

import structlog

from controlplane.storage.db import connect, is_postgres
from controlplane.storage.sql import Database

log = structlog.get_logger("controlplane.leader")
LEADER_LOCK = 0x6263_6C64  # "bcld"


class Leadership:
    def __init__(self, location: str | Path) -> None:
        self.location = location
        self.postgres = is_postgres(location)
        self.leader = not self.postgres
        self._db: Database | None = None

    def holds(self) -> bool:
        """Whether this replica leads now; on PostgreSQL, tries to become the leader (or
        confirms it still is: a lost connection is lost leadership)."""
        if not self.postgres:
            return True
        try:
            if self._db is None:
                self._db = connect(self.location)
            if self.leader:
                self._db.execute("SELECT 1").fetchone()
            else:
                got = self._db.execute("SELECT pg_try_advisory_lock(?)", [LEADER_LOCK]).fetchone()
                if got[0]:
                    self.leader = True
                    log.info("leading the reconciler")
        except Exception:
            log.exception("leadership check failed; not leading")
            self.close()
        return self.leader

    def close(self) -> None:
        """Give up leadership (the session's lock goes with its connection)."""
        if self._db is not None:
            try:
                self._db.close()
            except Exception:  # already broken: nothing to give back
                log.debug("leader connection was already closed")
        self._db = None
        self.leader = not self.postgres
