"""A small sd_notify client: readiness, status, stopping and watchdog pings for systemd.

Both daemons run as ``Type=notify`` units with ``WatchdogSec=`` (see ``systemd/``).
systemd passes two things in the environment, read once by
:meth:`Notifier.from_environment`:

- ``NOTIFY_SOCKET``: where to send datagrams, a path or ``@name`` for an
  abstract socket. Absent when not started by systemd: every method is then a
  no-op, so the daemons run the same from a shell, from tests and from units.
- ``WATCHDOG_USEC`` (and ``WATCHDOG_PID``): the watchdog period. The usual
  practice, and what :meth:`Notifier.watchdog_interval` returns, is to ping
  every half of it.

Sending never raises: a notification that cannot be sent must not take the
daemon down (systemd would then restart a healthy service). The first failure
is logged; later ones are silent until the process restarts.

What to ping from matters more than how: a ping says "the thing that does the
work is alive". The control plane pings from an asyncio task, so a stuck event
loop stops the pings and systemd restarts it; the agent's synchronous loop
pings from :meth:`Notifier.wait`, between cycles, so a cycle stuck in NVML or
a command stops them too.
"""

import asyncio
import os
import socket
import threading
import time
from collections.abc import Mapping
from typing import Self

import structlog

log = structlog.get_logger("sdnotify")

# A datagram to systemd is queued at once unless PID 1's queue is full; never
# block the event loop (or the agent's stop) longer than this on one.
SEND_TIMEOUT_S = 1.0


class Notifier:
    """Sends sd_notify messages to one socket; does nothing without one."""

    def __init__(self, address: str | None = None, watchdog_usec: int | None = None) -> None:
        """``address`` as in NOTIFY_SOCKET (``/path`` or ``@abstract``); ``None`` disables."""
        self.address = address
        # A watchdog without a socket to ping it on cannot be honoured; report none.
        self.watchdog_usec = watchdog_usec if address is not None else None
        self._warned = False

    @classmethod
    def from_environment(
        cls, environ: Mapping[str, str] | None = None, pid: int | None = None
    ) -> Self:
        """The notifier systemd asked for, from NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID.

        The only place that reads the environment. ``environ`` and ``pid``
        default to this process's; tests pass their own.
        """
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET") or None
        if address is not None and not address.startswith(("/", "@")):
            # e.g. the vsock: addresses of newer systemd, for VMs: not ours to speak.
            log.warning("unsupported NOTIFY_SOCKET; not notifying systemd", notify_socket=address)
            address = None
        return cls(address, _watchdog_usec(env, os.getpid() if pid is None else pid))

    @property
    def enabled(self) -> bool:
        """Whether there is a service manager to notify."""
        return self.address is not None

    def watchdog_interval(self) -> float | None:
        """Seconds between watchdog pings (half the watchdog period), or None without one."""
        if self.watchdog_usec is None:
            return None
        return self.watchdog_usec / 2 / 1_000_000

    # --- messages ------------------------------------------------------------

    def ready(self, status: str | None = None) -> None:
        """Start-up is done (READY=1): a ``Type=notify`` unit counts as started from here."""
        self.notify("READY=1", *_status(status))

    def status(self, text: str) -> None:
        """A one-line status shown by ``systemctl status``."""
        self.notify(*_status(text))

    def stopping(self, status: str | None = None) -> None:
        """Shutdown has begun (STOPPING=1)."""
        self.notify("STOPPING=1", *_status(status))

    def watchdog(self) -> None:
        """A keep-alive ping (WATCHDOG=1); sent only when a watchdog is configured."""
        if self.watchdog_usec is not None:
            self.notify("WATCHDOG=1")

    def extend_timeout(self, seconds: float) -> None:
        """The next step may take up to ``seconds``: push back whichever timeout runs now.

        EXTEND_TIMEOUT_USEC (systemd ≥ 236) moves the start timeout while
        starting, the stop timeout while stopping, and the watchdog deadline
        while running, when the extension reaches past it. It is one-shot:
        after the step, ping (or extend again).
        """
        self.notify(f"EXTEND_TIMEOUT_USEC={max(0, round(seconds * 1_000_000))}")

    def notify(self, *fields: str) -> bool:
        """Send ``KEY=value`` fields in one datagram; whether it was sent. Never raises."""
        if self.address is None or not fields:
            return False
        message = "\n".join(fields).encode()
        # A leading "@" names an abstract socket, spelled with a NUL byte to the kernel.
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            # A socket per message, as libsystemd does: nothing to keep across fork or reconnect.
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.settimeout(SEND_TIMEOUT_S)
                sock.sendto(message, target)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning(
                    "cannot notify systemd; carrying on without it",
                    notify_socket=self.address,
                    error=str(exc),
                )
            return False
        return True

    # --- pinging while waiting --------------------------------------------------

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        """``stop.wait(seconds)`` that pings the watchdog on entry and every interval meanwhile.

        Returns True as soon as ``stop`` is set, False after ``seconds``. For
        the synchronous agent loop: the pings come from the loop itself, so
        they stop when the loop is stuck.
        """
        interval = self.watchdog_interval()
        if interval is None:
            return stop.wait(seconds)
        deadline = time.monotonic() + seconds
        while True:
            self.watchdog()
            left = deadline - time.monotonic()
            if left <= 0:
                return stop.is_set()
            if stop.wait(min(interval, left)):
                return True

    async def watchdog_loop(self) -> None:
        """Ping every interval for as long as the event loop runs it; returns at once without a watchdog.

        Run it as a task beside the server: if the event loop stops turning,
        the pings stop and systemd restarts the service.
        """
        interval = self.watchdog_interval()
        if interval is None:
            return
        while True:
            self.watchdog()
            await asyncio.sleep(interval)


def _status(text: str | None) -> tuple[str, ...]:
    """A STATUS field; a newline would start a new field, so it becomes a space."""
    if text is None:
        return ()
    return ("STATUS=" + " ".join(text.splitlines()),)


def _watchdog_usec(env: Mapping[str, str], pid: int) -> int | None:
    """WATCHDOG_USEC when it is meant for this process (WATCHDOG_PID unset or ours), else None."""
    watchdog_pid = env.get("WATCHDOG_PID")
    if watchdog_pid and watchdog_pid != str(pid):
        # Inherited from a parent that systemd watches; the watchdog is not ours to feed.
        return None
    value = env.get("WATCHDOG_USEC", "")
    if not value.isdigit() or int(value) == 0:
        return None
    return int(value)
