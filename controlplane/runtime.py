"""What exists while the control plane runs: settings, the database, node liveness."""

import time
from dataclasses import dataclass, field

from controlplane.capacity.liveness import STAMPS_PER_GRACE, Liveness
from controlplane.config import Config
from controlplane.iam.cache import CredentialCache
from controlplane.overload import Overload, longest_retry_after
from controlplane.reads.answers import AnswerCache
from controlplane.reads.workers import ReadWorkers
from controlplane.services.call import Counters, Env, Uncounted
from controlplane.storage.commits import CommitSignal
from controlplane.storage.db import Store
from controlplane.storage.leader import Leadership


@dataclass
class Runtime:
    """Handed to every method; the store is opened and closed by the app's cleanup_ctx."""

    config: Config
    store: Store | None = None
    liveness: Liveness = field(default_factory=Liveness)
    credentials: CredentialCache = field(default_factory=CredentialCache)
    started: float = field(default_factory=time.monotonic)
    answers: AnswerCache = field(default_factory=AnswerCache)  # cached reads' answers (B6)
    commits: CommitSignal = field(default_factory=CommitSignal)  # long-polls wait on it (B2)
    leadership: Leadership = field(init=False)
    overload: Overload = field(init=False)  # F10: admission, and when it was last behind
    env: Env = field(init=False)  # what services use of this runtime
    counters: Counters = field(default_factory=Uncounted)  # the app's metrics (M1)
    # Long cached lists in other processes (B6); none unless the app gives them.
    workers: ReadWorkers = field(default_factory=ReadWorkers.disabled)

    def __post_init__(self) -> None:
        self.leadership = Leadership(
            self.config.db_path, self.config.reconcile_interval, self.config.db_timeout
        )
        self.overload = Overload(
            self.config.max_inflight,
            self.config.max_write_wait,
            longest_retry_after(
                self.config.node_lost_after,
                self.config.reconcile_interval,
                self.config.node_lost_after / STAMPS_PER_GRACE,
            ),
        )
        self.env = Env(self.liveness, self.credentials, self.config.attestors, self.counters)

    @property
    def db(self) -> Store:
        assert self.store is not None, "the app is not running"
        return self.store
