"""The root applier and the network process's end of it: one request kind over a Unix socket.

Under systemd the agent is two processes. The network process (``run --applier-socket``,
unprivileged) joins, reports, fetches and checks the NodeSpec; the applier (``applier``, root,
socket-activated by better-compute-agent-apply.socket, whose socket only the agent's user may
open) applies it. A connection carries one request, ``{"spec": <the NodeSpec as fetched>}``
(at most ``MAX_MESSAGE`` bytes, the writer's end shut after it), and gets one answer:
``{"outcomes": {applied, bookings}}`` (agent/gate.py) or ``{"error": why}``. Anything else (a
field more, a body too long, a spec it cannot read) is answered with an error and changes
nothing. The applier checks every spec again itself (agent/trust.py, on its own inventory: it
is the real gate), applies its units and delivers its bookings; one request at a time.
"""

import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec
import structlog

from agent.gate import HostApply, Outcomes, refusal
from agent.state import check
from shared.inventory import Inventory
from shared.sdnotify import Notifier

log = structlog.get_logger("agent.applier")

MAX_MESSAGE = 4 * 1024 * 1024  # a NodeSpec with its bookings is a few hundred KiB at most
SOCKET_MODE = 0o600  # the agent's user alone (and root) may connect
READ_TIMEOUT = 30.0  # for a request to arrive whole
# The longest apply: a unit's command may take the HostRunner's 600 s; a few units more.
APPLY_TIMEOUT = 900.0
SD_LISTEN_FDS_START = 3


class ApplyRequest(msgspec.Struct, forbid_unknown_fields=True):
    spec: dict[str, Any]


class Reply(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    outcomes: Outcomes | None = None
    error: str | None = None


class ApplierError(Exception):
    """The applier cannot be reached, or answered an error: nothing is known applied."""


class TooLong(ValueError):
    pass


def read_message(
    connection: socket.socket, waited: Callable[[], None] | None = None, limit: int = MAX_MESSAGE
) -> bytes:
    """Everything up to the peer's end of writing; TooLong past ``limit`` bytes. A read that
    times out raises TimeoutError, or calls ``waited`` (which may raise) and reads on."""
    message = bytearray()
    while True:
        try:
            chunk = connection.recv(65536)
        except TimeoutError:
            if waited is None:
                raise
            waited()
            continue
        if not chunk:
            return bytes(message)
        message += chunk
        if len(message) > limit:
            raise TooLong(f"a message over {limit} bytes")


def listener(path: Path | None, environ: Mapping[str, str] = os.environ) -> socket.socket:
    """The socket systemd passed (socket activation), else one bound at ``path`` (0600)."""
    if environ.get("LISTEN_PID") == str(os.getpid()) and environ.get("LISTEN_FDS") == "1":
        return socket.socket(fileno=SD_LISTEN_FDS_START)
    if path is None:
        raise ValueError("no socket from systemd (LISTEN_FDS): give --socket")
    path.unlink(missing_ok=True)  # one left by an applier that stopped
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    umask = os.umask(0o177)  # 0600 from the start: no moment where another user may connect
    try:
        bound.bind(str(path))
    finally:
        os.umask(umask)
    bound.listen(4)
    return bound


class Server:
    """Answers one request per connection, one connection at a time, until ``stop``."""

    def __init__(self, host: HostApply, take_inventory: Callable[[], Inventory]) -> None:
        self.host = host
        self.take_inventory = take_inventory

    def answer(self, raw: bytes) -> Reply:
        try:
            request = msgspec.json.decode(raw, type=ApplyRequest)
            check(request.spec)  # units and bookings this agent can read
        except (msgspec.DecodeError, msgspec.ValidationError, KeyError) as exc:
            return Reply(error=f"not an apply request: {str(exc)[:200]}")
        outcomes = self.host.apply(request.spec, self.take_inventory())
        if "refused" in outcomes.applied:
            log.error("spec refused: nothing of it is applied", **outcomes.applied)
        return Reply(outcomes=outcomes)

    def handle(self, connection: socket.socket) -> None:
        connection.settimeout(READ_TIMEOUT)
        try:
            reply = self.answer(read_message(connection))
        except (TooLong, TimeoutError) as exc:
            reply = Reply(error=str(exc) or "the request did not arrive in time")
        except Exception:
            log.exception("cannot apply the spec")
            reply = Reply(error="the applier failed (see its journal)")
        try:
            connection.sendall(msgspec.json.encode(reply))
        except OSError as exc:  # the network process gave up: the next cycle asks again
            log.warning("cannot answer", error=str(exc))

    def serve(self, bound: socket.socket, stop: threading.Event, notifier: Notifier) -> None:
        """Until ``stop``; the watchdog is pinged while it waits and after each answer, so an
        applier stuck in NVML or a hung command is restarted."""
        bound.settimeout(0.5)  # to see ``stop``
        while not stop.is_set():
            notifier.watchdog()
            try:
                connection, _ = bound.accept()
            except TimeoutError:
                continue
            with connection:
                self.handle(connection)


class RemoteApply:
    """The network process's Host: checks a spec itself (as it would apply it under ``root``)
    and hands the specs it trusts to the applier at ``path``."""

    def __init__(self, path: Path, root: Path, notifier: Notifier) -> None:
        self.path = path
        self.root = root
        self.notifier = notifier

    def apply(self, spec: Mapping[str, Any], inventory: Inventory) -> Outcomes:
        refused = refusal(self.root, spec, inventory)
        if refused is not None:  # not even handed over
            return refused
        payload = msgspec.json.encode(ApplyRequest(dict(spec)))
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
                connection.settimeout(READ_TIMEOUT)
                connection.connect(str(self.path))
                connection.sendall(payload)
                connection.shutdown(socket.SHUT_WR)
                raw = read_message(connection, self.waited(time.monotonic() + APPLY_TIMEOUT))
        except OSError as exc:
            raise ApplierError(f"the applier at {self.path}: {exc}") from exc
        except TooLong as exc:
            raise ApplierError(f"the applier's answer: {exc}") from None
        try:
            reply = msgspec.json.decode(raw, type=Reply)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ApplierError(f"the applier's answer: {exc}") from None
        if reply.outcomes is None:
            raise ApplierError(f"the applier: {reply.error}")
        return reply.outcomes

    def waited(self, deadline: float) -> Callable[[], None]:
        """While the applier works (a kubeadm join, a MIG change), up to ``deadline``: the
        watchdog is pinged, since the agent is not stuck but waiting on work in hand."""

        def waited() -> None:
            if time.monotonic() > deadline:
                raise TimeoutError("the applier did not answer in time")
            self.notifier.watchdog()

        return waited
