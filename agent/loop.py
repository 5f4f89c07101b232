"""The agent's loop: join once, then every interval take inventory, report, fetch a new spec.

While the control plane is away the agent backs off exponentially with full
jitter and keeps the last NodeSpec it has. A refused join is final: the agent
exits non-zero with the control plane's reason. The loop is synchronous (one
request at a time needs no event loop) and stops promptly when ``stop`` is set.
"""

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import structlog

from agent.apply import Applier
from agent.client import ControlPlane, Refused, Unreachable
from agent.state import NodeCredential, State
from shared.inventory import Inventory
from shared.nodespec import NodeSpecUnits
from shared.sdnotify import Notifier

log = structlog.get_logger("agent")


class JoinRefused(Exception):
    """The control plane refused to let this host join; retrying will not change that."""


@dataclass(frozen=True)
class Settings:
    controlplane: str
    join_token_file: Path
    interval: float = 30.0
    backoff_base: float = 1.0
    backoff_cap: float = 60.0
    dry_run: bool = False


class Agent:
    def __init__(
        self,
        settings: Settings,
        state: State,
        take_inventory: Callable[[], Inventory],
        client: ControlPlane,
        applier: Applier | None,
        notifier: Notifier | None = None,
    ) -> None:
        self.settings = settings
        self.state = state
        self.take_inventory = take_inventory
        self.client = client
        self.applier = applier  # None with --dry-run: the spec is fetched and kept, not applied
        self.notifier = notifier or Notifier()  # a no-op outside systemd
        self.announced = False
        self.failures = 0
        self.applied: Any | None = None  # the last apply's report, sent with every report

    def backoff(self) -> float:
        """Full jitter: a random wait up to base × 2^failures, capped."""
        ceiling = min(self.settings.backoff_cap, self.settings.backoff_base * 2**self.failures)
        return random.uniform(0, ceiling)

    def join(self, inventory: Inventory) -> NodeCredential:
        join_token = self.settings.join_token_file.read_text().strip()
        try:
            answer = self.client.join(join_token, inventory.hostname, inventory)
        except Refused as exc:
            raise JoinRefused(str(exc)) from exc
        credential = NodeCredential(
            answer["nodeId"], answer["token"], answer["poolId"], self.settings.controlplane
        )
        self.state.save_credential(credential)
        log.info(
            "joined", node=credential.node_id, pool=credential.pool_id, rejoined=answer["rejoined"]
        )
        return credential

    def report(
        self, credential: NodeCredential, inventory: Inventory
    ) -> tuple[NodeCredential, Any]:
        try:
            answer = self.client.report(
                credential.token, credential.node_id, inventory, self.applied
            )
        except Refused as exc:
            if exc.status != 401:
                raise
            # The control plane no longer knows this credential: join again with the token file.
            log.warning("node credential refused; joining again", node=credential.node_id)
            self.state.forget_credential()
            credential = self.join(inventory)
            answer = self.client.report(
                credential.token, credential.node_id, inventory, self.applied
            )
        return credential, answer

    def cycle(self) -> None:
        """One inventory → (join) → report → spec → apply cycle."""
        inventory = self.take_inventory()
        credential = self.state.credential()
        if credential is None:
            credential = self.join(inventory)
        credential, answer = self.report(credential, inventory)
        spec = self.state.spec()
        if spec is None or spec.get("version") != answer["specVersion"]:
            spec = self.client.spec(credential.token, credential.node_id)
            self.state.save_spec(spec)
            log.info("new spec", version=spec["version"], dry_run=self.settings.dry_run)
        if self.apply(spec):
            self.report(credential, inventory)  # the control plane hears the outcome now

    def apply(self, spec: dict[str, Any] | None) -> bool:
        """Apply a spec (the kept one when the control plane is away); True if the outcome moved.

        Every cycle, not only on a new spec: what drifted on the host is put back.
        """
        if self.applier is None or spec is None:
            return False
        units = msgspec.convert(
            {
                "version": spec["version"],
                "units": spec.get("units", []),
                "reboot": spec.get("reboot", False),
            },
            NodeSpecUnits,
            strict=False,
        )
        applied = msgspec.to_builtins(self.applier.apply(units))
        if applied == self.applied:
            return False
        self.applied = applied
        return True

    def pause(self, stop: threading.Event, seconds: float) -> None:
        """Wait between cycles, pinging systemd's watchdog; READY=1 after the first cycle."""
        if not self.announced:
            self.notifier.ready(status=f"reporting to {self.settings.controlplane}")
            self.announced = True
        self.notifier.wait(stop, seconds)

    def run(self, stop: threading.Event, once: bool = False) -> None:
        """Cycle until ``stop`` is set (or once); JoinRefused and, with ``once``, errors escape."""
        while not stop.is_set():
            try:
                self.cycle()
            except Unreachable as exc:
                if once:
                    raise
                self.apply(self.state.spec())  # DESIGN §6: keep applying the last spec
                wait = self.backoff()
                self.failures += 1
                log.warning("control plane unreachable", error=str(exc), retry_in=round(wait, 2))
                self.pause(stop, wait)
                continue
            except Refused as exc:
                # A report refused (e.g. the GPUs changed family): say why, keep the last spec.
                if once:
                    raise
                log.error("report refused", error=str(exc))
                self.pause(stop, self.settings.interval)
                continue
            except JoinRefused:
                raise
            except Exception:
                # A bug or a spec this agent cannot read must not stop it for good: log, retry.
                if once:
                    raise
                log.exception("cycle failed")
                self.pause(stop, self.settings.interval)
                continue
            self.failures = 0
            if once:
                return
            self.pause(stop, self.settings.interval)
        self.notifier.stopping()
