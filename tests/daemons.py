"""Real daemons as subprocesses on loopback, for end-to-end tests."""

import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

DAEMON = Path(sys.executable).parent / "better-compute-controlplane"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """``app`` served in this process on a free loopback port; its URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


class Daemon:
    """One `better-compute-controlplane serve` process with its log in a file."""

    def __init__(self, workdir: Path, *extra: str, db: str | None = None) -> None:
        """``db``: a postgresql:// URL instead of a SQLite file in ``workdir`` (a replica)."""
        self.workdir = workdir
        self.db = db
        self.extra = extra
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "daemon.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    str(DAEMON),
                    "serve",
                    "--db",
                    self.db or str(self.workdir / "data" / "bc.db"),
                    "--root-token-file",
                    str(self.workdir / "data" / "root.token"),
                    "--listen",
                    f"127.0.0.1:{self.port}",
                    "--log-format",
                    "json",
                    *self.extra,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("the daemon did not start listening")

    def stop(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=20)
        self.process = None
        return code

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()

    @property
    def token(self) -> str:
        return (self.workdir / "data" / "root.token").read_text().strip()


async def call(session: aiohttp.ClientSession, url: str, path: str, token: str, body: Any) -> Any:
    """One API call that must succeed."""
    async with session.post(
        f"{url}/api/{path}", json=body, headers={"Authorization": f"Bearer {token}"}
    ) as response:
        answer = await response.json()
        assert response.status == 200, answer
        return answer


async def root_pool(session: aiohttp.ClientSession, daemon: Daemon, **pool: Any) -> Any:
    """A shared site and a metal-host pool on it owned by root, two calls; `pool` adds fields."""
    site = await call(
        session,
        daemon.url,
        "compute/sites/create",
        daemon.token,
        {"tenantId": "root", "name": "fra1", "region": "eu", "kind": "shared"},
    )
    body = {"tenantId": "root", "siteId": site["id"], "class": "metal-host", **pool}
    return await call(session, daemon.url, "compute/pools/create", daemon.token, body)
