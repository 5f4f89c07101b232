"""F10: overload sheds early and never makes a healthy node lost.

Admission: at most ``--max-inflight`` API requests are handled at once; one more is answered
503 ``UNAVAILABLE`` with ``Retry-After`` at once, before its body is read, instead of queuing
until its client times out. Retry-After follows the storm (``next_retry_after``): it grows
with what the replica is asked over what it serves (its square root), up to what still lets
a node told it be heard within the lost-node grace (``longest_retry_after``), and is the
least again once it sheds nothing. ``/healthz``, ``/readyz``, ``/metrics`` and the other GET
paths are never shed, nor counted; a long-poll is counted only until its body is read (then it
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

import math
import time

DEFAULT_MAX_INFLIGHT = 256  # requests handled at once per replica before it sheds
SHED_RETRY_AFTER_S = 2  # the least Retry-After of a shed request: agents add their jitter to it
RETRY_WINDOW_S = 1.0  # how often Retry-After follows what the replica sheds and serves
# A mutation is shed while the oldest one waiting for the writer has waited longer than this:
# well under the 10 s an agent waits for an answer, so a storm meets 503s, not timeouts.
MAX_WRITE_WAIT_S = 2.0


def next_retry_after(admitted: int, shed: int, cap: float) -> float:
    """The Retry-After for the next window, after one that admitted ``admitted`` requests and
    shed ``shed``: the least, times the square root of what was asked over what was served,
    at most ``cap`` (at once when nothing was served). An agent waits Retry-After to twice
    as long, so a storm's retries thin out as it grows, and come back about as fast as the
    replica serves them instead of most of its work (and its clients') going to 503s. It
    follows the last window alone, and by the square root: compounded over windows, or in
    full, it overshot (the agents told the last value are still on their way) and left the
    replica idle while the storm's last agents waited."""
    if shed == 0:
        return float(SHED_RETRY_AFTER_S)
    if admitted == 0:
        return cap  # it served nothing: as long as it may
    return min(cap, SHED_RETRY_AFTER_S * math.sqrt((admitted + shed) / admitted))


def longest_retry_after(lost_after: float, interval: float, stamp_period: float) -> float:
    """The most Retry-After may be so that no node it sheds is marked lost: an agent told it
    reports within twice as long, and the stamp of the answered report reaches the database
    within a pass ``interval`` and a ``stamp_period`` after; all that within the grace
    (``lost_after``) that follows the replica's last shedding. Never under the least."""
    spare = lost_after - interval - stamp_period
    return max(float(SHED_RETRY_AFTER_S), spare / 2)


class Overload:
    """One replica's admission count, the Retry-After of what it sheds, and the last time it
    was behind (epoch seconds)."""

    def __init__(
        self,
        max_inflight: int = DEFAULT_MAX_INFLIGHT,
        max_write_wait: float = MAX_WRITE_WAIT_S,
        max_retry_after: float = 30.0,
    ) -> None:
        self.max_inflight = max_inflight
        self.max_write_wait = max_write_wait
        # The daemon's is ``longest_retry_after``: a node told the most is not marked lost.
        self.max_retry_after = max(float(SHED_RETRY_AFTER_S), max_retry_after)
        self.inflight = 0
        self.shed = 0  # requests shed since the start
        self.behind_at = time.time()  # a start: every node gets a whole grace period after it
        self._retry_after = float(SHED_RETRY_AFTER_S)
        self._window = (time.monotonic(), 0, 0)  # its start, requests admitted and shed

    @property
    def retry_after(self) -> int:
        """The Retry-After (whole seconds) of a request shed now."""
        return int(self._retry_after)  # rounded down: never past the cap

    def _count(self, admitted: bool) -> None:
        started, served, shed = self._window
        at = time.monotonic()
        if at - started >= RETRY_WINDOW_S:
            self._retry_after = next_retry_after(served, shed, self.max_retry_after)
            started, served, shed = at, 0, 0
        self._window = (started, served + admitted, shed + (not admitted))

    def admit(self, write_wait: float | None = None) -> bool:
        """Whether one more request is handled now (then ``leave`` once it is done); when
        not, the replica is behind. ``write_wait``, for a mutation: how long the oldest
        mutation waiting for this replica's writer has waited; past ``max_write_wait`` one
        more would only wait longer, so it is shed too."""
        waits_too_long = write_wait is not None and write_wait > self.max_write_wait
        if self.inflight >= self.max_inflight or waits_too_long:
            self.shed += 1
            self.behind()
            self._count(admitted=False)
            return False
        self.inflight += 1
        self._count(admitted=True)
        return True

    def leave(self) -> None:
        self.inflight -= 1

    def behind(self) -> None:
        """The replica is behind now: the lost-node check waits a grace period after this."""
        self.behind_at = time.time()
