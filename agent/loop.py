"""The agent's loop: join once, then every interval take inventory, report, fetch a new spec.

While the control plane is away the agent backs off exponentially with full
jitter and keeps the last NodeSpec it has. The first join of a fresh state
directory, when refused, is final: the agent exits non-zero with the control
plane's reason. A host that had joined and whose credential is refused (401, a
removed node) joins again with its join token file; when that is refused too,
it says so and retries with backoff up to ``rejoin_backoff_cap`` (H8). A damaged
state file is set aside by ``State`` and the loop carries on (R9). The loop is
synchronous (one request at a time needs no event loop) and stops promptly when
``stop`` is set.

Each apply (also of the kept spec while the control plane is away) goes through the host's
gate (agent/gate.py: in-process, or the root applier of agent/applier.py): it applies the
units, then delivers and releases the spec's bookings (agent/delivery.py: D5, D7); their
outcomes go with every report, and a cycle whose units' or bookings' outcomes moved
reports again at once, so a placed booking is active within two cycles (D9).

A spec that asks for a file or a command this agent does not write or run, or whose units are
not what its renderer makes of the policy the spec carries (agent/trust.py, F3), is refused
whole before anything of it is applied: the refusal is logged and reported as ``applied:
{version, refused, units: []}`` (the node's ``stateReason`` reads ``spec refused: …``), and the
agent applies nothing until a spec it trusts comes; ``run(once=True)`` raises
``SpecRefused``. A refusal is no fault of the agent: the watchdog is pinged as after any cycle
that reported.

Small heartbeats (F9): a report carries the whole inventory at the first report after a start
(after a join, the join carried it and its answer's digest is sent), whenever the inventory differs from the one last sent in an accepted
report, and at once again in the same cycle when the answer says ``inventoryWanted``;
otherwise it carries ``inventoryDigest``, the digest the last answer gave (the agent computes
none). An answer without a digest (an older control plane) keeps the inventory coming whole.

Shedding (F10): a 503 with ``Retry-After`` is the control plane shedding load; the agent waits
that long plus a uniform jitter of up to as long again before it tries again, and keeps
applying the kept spec as while the control plane is away.

Watchdog pings (R9): only a cycle that did its work is followed by pings, so a
loop that keeps failing is restarted by systemd's watchdog rather than reported
healthy.
"""

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from agent.client import ControlPlane, Refused, Unreachable
from agent.gate import Host
from agent.state import NodeCredential, State, check
from shared.inventory import Inventory, settled
from shared.sdnotify import Notifier

log = structlog.get_logger("agent")


class JoinRefused(Exception):
    """The control plane refused this host's first join; retrying will not change that."""


class RejoinRefused(JoinRefused):
    """A host that had joined was refused a join again (or has no join token to try): retried."""


class SpecRefused(Exception):
    """The NodeSpec asks for what this agent does not do (F3); nothing of it was applied."""


@dataclass(frozen=True)
class Settings:
    controlplane: str
    join_token_file: Path
    interval: float = 30.0
    backoff_base: float = 1.0
    backoff_cap: float = 60.0
    rejoin_backoff_cap: float = 300.0  # H8: at most 5 minutes between refused joins again
    dry_run: bool = False


class Agent:
    def __init__(
        self,
        settings: Settings,
        state: State,
        take_inventory: Callable[[], Inventory],
        client: ControlPlane,
        host: Host | None,
        notifier: Notifier | None = None,
    ) -> None:
        self.settings = settings
        self.state = state
        self.take_inventory = take_inventory
        self.client = client
        # None with --dry-run: the spec is fetched and kept, neither applied nor delivered
        self.host = host
        self.notifier = notifier or Notifier()  # a no-op outside systemd
        self.announced = False
        self.shown_status = ""  # the STATUS systemd was last sent
        self.failures = 0  # cycles in a row that found the control plane away
        self.rejoin_failures = 0  # joins again in a row that were refused
        self.applied: Any | None = None  # the last apply's report, sent with every report
        self.bookings: list[Any] | None = None  # the bookings' last outcomes, sent likewise
        self.sent: Inventory | None = None  # the inventory of the last accepted whole report
        self.digest: str | None = None  # F9: the digest the last report's answer gave
        self.wanted = False  # the last answer asked for the whole inventory

    def backoff(self, failures: int, cap: float) -> float:
        """Full jitter: a random wait up to base × 2^failures, capped."""
        return random.uniform(0, min(cap, self.settings.backoff_base * 2**failures))

    def away_for(self, exc: Unreachable) -> float:
        """The wait before trying again: Retry-After plus up to as long again when the
        control plane sheds load (F10), else the backoff."""
        if exc.retry_after is not None:
            return exc.retry_after + random.uniform(0, exc.retry_after)
        return self.backoff(self.failures, self.settings.backoff_cap)

    def join(self, inventory: Inventory, again: bool = False) -> NodeCredential:
        """Join with the join token file; ``again`` for a host that had joined (H8, R9)."""
        try:
            join_token = self.settings.join_token_file.read_text().strip()
        except OSError as exc:
            if not again:
                raise  # a first start without its token file: a usage error
            # The file is often deleted once a host has joined: wait for a new one.
            raise RejoinRefused(f"cannot read the join token file: {exc.strerror}") from exc
        try:
            answer = self.client.join(join_token, inventory.hostname, inventory)
        except Refused as exc:
            raise (RejoinRefused if again else JoinRefused)(str(exc)) from exc
        credential = NodeCredential(
            answer["nodeId"], answer["token"], answer["poolId"], self.settings.controlplane
        )
        self.state.save_credential(credential)
        # F9: the join carried the inventory whole; its answer's digest is the one held, so
        # the first report is a heartbeat unless the inventory moved since.
        digest = answer.get("inventoryDigest")
        self.digest = digest if isinstance(digest, str) else None
        self.sent, self.wanted = inventory, answer.get("inventoryWanted") is True
        log.info(
            "joined", node=credential.node_id, pool=credential.pool_id, rejoined=answer["rejoined"]
        )
        return credential

    def report(
        self, credential: NodeCredential, inventory: Inventory
    ) -> tuple[NodeCredential, Any]:
        try:
            answer = self.send(credential, inventory)
        except Refused as exc:
            if exc.status != 401:
                raise
            # The control plane no longer knows this credential (H8): join again with the token
            # file. The credential stays until a new one replaces it, so a restarted agent still
            # knows that this host had joined.
            if self.rejoin_failures == 0:  # said once, not on every retry
                log.warning("node credential refused; joining again", node=credential.node_id)
            credential = self.join(inventory, again=True)
            answer = self.send(credential, inventory)
        return credential, answer

    def send(self, credential: NodeCredential, inventory: Inventory) -> Any:
        """One report: the inventory whole, or its digest when nothing moved (F9); whole again
        at once when the answer asks for it."""
        whole = (
            self.digest is None
            or self.wanted
            or self.sent is None
            or settled(inventory) != settled(self.sent)
        )
        token, node = credential.token, credential.node_id
        if whole:
            answer = self.client.report(token, node, inventory, self.applied, self.bookings)
        else:
            answer = self.client.report(
                token, node, None, self.applied, self.bookings, inventory_digest=self.digest
            )
        digest = answer.get("inventoryDigest")
        self.digest = digest if isinstance(digest, str) else None
        self.wanted = answer.get("inventoryWanted") is True
        if whole:
            self.sent = inventory
        elif self.wanted:
            return self.send(credential, inventory)  # whole this time: ``wanted`` is set
        return answer

    def cycle(self) -> None:
        """One inventory → (join) → report → spec → apply cycle."""
        inventory = self.take_inventory()
        credential = self.state.credential()
        if credential is None:
            credential = self.join(inventory, again=self.state.had_credential())
        credential, answer = self.report(credential, inventory)
        spec = self.state.spec()
        if spec is None or spec.get("version") != answer["specVersion"]:
            spec = self.client.spec(credential.token, credential.node_id)
            check(spec)  # one this agent cannot read is refused here, never kept (R9)
            self.state.save_spec(spec)
            log.info("new spec", version=spec["version"], dry_run=self.settings.dry_run)
        if self.apply(spec, inventory):
            # The control plane hears the outcome now, with the host as the apply left it (a
            # MIG repartition changed its GPUs' instances: H4 hands their atoms back on this;
            # a booking delivered becomes active: D6).
            self.report(credential, self.take_inventory())

    def apply(self, spec: dict[str, Any] | None, inventory: Inventory) -> bool:
        """Apply a spec (the kept one when the control plane is away) and deliver its bookings
        on the host ``inventory`` shows; True if either outcome moved.

        Every cycle, not only on a new spec: what drifted on the host is put back. A spec
        asking for what this agent does not do is refused whole, nothing of it applied (F3).
        """
        if self.host is None or spec is None:
            return False
        done = self.host.apply(spec, inventory)
        bookings = self.bookings if done.bookings is None else done.bookings
        if (done.applied, bookings) == (self.applied, self.bookings):
            return False
        if "refused" in done.applied:
            log.error("spec refused: nothing of it is applied", **done.applied)
        self.applied, self.bookings = done.applied, bookings
        return True

    def refusal(self) -> str | None:
        """Why the spec in hand was refused; None when it was not."""
        if isinstance(self.applied, dict) and isinstance(self.applied.get("refused"), str):
            return str(self.applied["refused"])
        return None

    def apply_kept(self) -> bool:
        """Apply the kept spec while the control plane is away; False if that failed."""
        try:
            self.apply(self.state.spec(), self.take_inventory())
        except Exception:
            log.exception("cannot apply the kept spec")
            return False
        return True

    def pause(
        self,
        stop: threading.Event,
        seconds: float,
        trouble: str | None = None,
        note: str | None = None,
    ) -> None:
        """Wait between cycles; READY=1 after the first, STATUS when it changes.

        ``trouble`` says why the cycle did not work; None when it did. ``note``: what a cycle
        that worked has to say instead of the usual status.
        """
        status = trouble or note or f"reporting to {self.settings.controlplane}"
        if not self.announced:
            self.notifier.ready(status=status)
            self.announced = True
        elif status != self.shown_status:
            self.notifier.status(status)
        self.shown_status = status
        # R9: ping only after a cycle that did its work (reported, or applied the kept spec while
        # the control plane is away), so systemd's watchdog restarts an agent that cannot work.
        if trouble is None:
            self.notifier.wait(stop, seconds)
        else:
            stop.wait(seconds)

    def run(self, stop: threading.Event, once: bool = False) -> None:
        """Cycle until ``stop`` is set (or once); a first JoinRefused and, with ``once``, errors
        and SpecRefused escape."""
        self.state.prepare()
        while not stop.is_set():
            try:
                self.cycle()
            except Unreachable as exc:
                if once:
                    raise
                applied = self.apply_kept()  # DESIGN §6: keep applying the last spec
                wait = self.away_for(exc)
                self.failures += 1
                log.warning(
                    "control plane unreachable",
                    error=str(exc),
                    retry_in=round(wait, 2),
                    retry_after=exc.retry_after,
                )
                self.pause(stop, wait, None if applied else "cannot apply the kept NodeSpec")
                continue
            except RejoinRefused as exc:
                if once:
                    raise
                wait = self.backoff(self.rejoin_failures, self.settings.rejoin_backoff_cap)
                self.rejoin_failures += 1
                log.error(
                    "cannot join this host again; retrying (a valid join token in the join "
                    "token file lets it in)",
                    error=str(exc),
                    join_token_file=str(self.settings.join_token_file),
                    retry_in=round(wait, 2),
                )
                self.pause(stop, wait, f"join refused: {exc}")
                continue
            except JoinRefused:
                raise
            except Refused as exc:
                # A report refused (e.g. the GPUs changed family): say why, keep the last spec.
                if once:
                    raise
                log.error("report refused", error=str(exc))
                self.pause(stop, self.settings.interval, f"report refused: {exc}")
                continue
            except Exception:
                # A bug or a spec this agent cannot read must not stop it for good: log, retry.
                if once:
                    raise
                log.exception("cycle failed")
                self.pause(stop, self.settings.interval, "cycle failed (see the journal)")
                continue
            self.failures = 0
            self.rejoin_failures = 0
            refusal = self.refusal()
            if once:
                if refusal is not None:
                    raise SpecRefused(refusal)
                return
            note = None if refusal is None else f"spec refused: {refusal}"
            self.pause(stop, self.settings.interval, note=note)
        self.notifier.stopping()
