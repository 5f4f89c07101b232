"""F10: overload sheds early and never makes a healthy node lost.

Admission: at most ``--max-inflight`` API requests are handled at once; one more is answered
503 ``UNAVAILABLE`` with ``Retry-After`` at once, before its body is read, instead of queuing
until its client times out. ``/healthz``, ``/readyz``, ``/metrics`` and the other GET paths
are never shed, nor counted; a long-poll is counted only until its body is read (then it
waits, holding no work). A mutation is shed as well while the oldest one waiting for this
replica's writer has waited longer than ``--max-write-wait``: the count alone lets hundreds
queue on a writer that several replicas share, each past its client's patience.

Behind: a replica is behind while it sheds, answers 503 for any other reason (its database
away, F1), lags (its reconcile loop woke late, a pass took longer than its interval, a flush
of its liveness stamps failed), and at its start. Each replica records the last time it was
behind in the database (storage/liveness.py ``replica_behind``), so the leader's lost-node
check marks nothing lost until a whole grace period has passed with no replica behind: the
silence a node's reports met at a shedding follower is the control plane's, not the node's.
"""

import time

DEFAULT_MAX_INFLIGHT = 256  # requests handled at once per replica before it sheds
SHED_RETRY_AFTER_S = 2  # Retry-After of a shed request: agents add their jitter to it
# A mutation is shed while the oldest one waiting for the writer has waited longer than this:
# well under the 10 s an agent waits for an answer, so a storm meets 503s, not timeouts.
MAX_WRITE_WAIT_S = 2.0


class Overload:
    """One replica's admission count and the last time it was behind (epoch seconds)."""

    def __init__(
        self, max_inflight: int = DEFAULT_MAX_INFLIGHT, max_write_wait: float = MAX_WRITE_WAIT_S
    ) -> None:
        self.max_inflight = max_inflight
        self.max_write_wait = max_write_wait
        self.inflight = 0
        self.shed = 0  # requests shed since the start
        self.behind_at = time.time()  # a start: every node gets a whole grace period after it

    def admit(self, write_wait: float | None = None) -> bool:
        """Whether one more request is handled now (then ``leave`` once it is done); when
        not, the replica is behind. ``write_wait``, for a mutation: how long the oldest
        mutation waiting for this replica's writer has waited; past ``max_write_wait`` one
        more would only wait longer, so it is shed too."""
        waits_too_long = write_wait is not None and write_wait > self.max_write_wait
        if self.inflight >= self.max_inflight or waits_too_long:
            self.shed += 1
            self.behind()
            return False
        self.inflight += 1
        return True

    def leave(self) -> None:
        self.inflight -= 1

    def behind(self) -> None:
        """The replica is behind now: the lost-node check waits a grace period after this."""
        self.behind_at = time.time()
