"""The real app on a real SQLite file in tmp_path, and helpers to drive it over HTTP."""

import io
import os
import sqlite3
import subprocess
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from controlplane.app import make_app
from controlplane.config import Config
from controlplane.storage.db import connect, is_postgres
from shared.log import reset_logging
from tests.daemons import Daemon
from tests.postgres import PostgresServer, PostgresUnavailable

TABLES = (
    "tenants",
    "credentials",
    "sites",
    "pools",
    "pool_offers",
    "quotas",
    "pool_authz",
    "events",
    "event_audience",
)


class Api:
    """An HTTP caller of the control plane with a default token."""

    def __init__(self, client: TestClient, token: str) -> None:
        self.client = client
        self.token = token

    async def call(
        self, path: str, body: Any, token: str | None = None, raw: bytes | io.BytesIO | None = None
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token or self.token}"}
        if raw is not None:
            response = await self.client.post(f"/api/{path}", data=raw, headers=headers)
        else:
            response = await self.client.post(f"/api/{path}", json=body, headers=headers)
        return response.status, await response.json()

    async def ok(self, path: str, body: Any, token: str | None = None) -> Any:
        status, answer = await self.call(path, body, token)
        assert status == 200, (status, answer)
        return answer

    async def err(
        self,
        path: str,
        body: Any,
        code: str,
        field: str | None = None,
        token: str | None = None,
        status: int | None = None,
    ) -> dict[str, Any]:
        got_status, answer = await self.call(path, body, token)
        assert "error" in answer, (got_status, answer)
        error = answer["error"]
        assert error["code"] == code, answer
        if field is not None:
            assert error["details"].get("field") == field, answer
        if status is not None:
            assert got_status == status
        return error

    # --- factories ---------------------------------------------------------

    async def tenant(self, tenant_id: str, **extra: Any) -> str:
        await self.ok("iam/tenants/create", {"tenantId": tenant_id, **extra})
        return tenant_id

    async def token_for(self, tenant_id: str, statements: list[Any] | None = None) -> str:
        body: dict[str, Any] = {"tenantId": tenant_id}
        if statements is not None:
            body["statements"] = statements
        answer = await self.ok("iam/credentials/create", body)
        return str(answer["token"])

    async def site(
        self,
        tenant_id: str = "root",
        kind: str = "shared",
        name: str = "fra1",
        token: str | None = None,
    ) -> str:
        body = {"tenantId": tenant_id, "name": name, "region": "eu-central", "kind": kind}
        answer = await self.ok("compute/sites/create", body, token)
        return str(answer["id"])

    async def pool(
        self, site_id: str, tenant_id: str = "root", token: str | None = None, **fields: Any
    ) -> dict[str, Any]:
        body = {"tenantId": tenant_id, "siteId": site_id, "class": "metal-host", "gpuModel": "H100"}
        body.update(fields)
        body = {k: v for k, v in body.items() if v is not None}  # gpuModel=None: a CPU pool
        return dict(await self.ok("compute/pools/create", body, token))

    async def offer(
        self, pool_id: str, to: str, quota: dict[str, int] | None = None, **extra: Any
    ) -> dict[str, Any]:
        body = {
            "tenantId": "root",
            "poolId": pool_id,
            "toTenantId": to,
            "quota": quota or {"gpu": 8},
        }
        body.update(extra)
        return dict(await self.ok("compute/pools/offer", body))


# B3: the suite runs on either backend; `make test` runs it on both.
BACKEND = os.environ.get("BC_TEST_BACKEND", "sqlite")
# The fixtures through which a test reaches the backend under test. A test that takes none of
# them runs on SQLite (or on no database) whatever BC_TEST_BACKEND says: the PostgreSQL pass
# leaves it to the SQLite pass rather than run the same thing twice.
BACKEND_FIXTURES = frozenset({"config", "db", "api", "postgres_url", "postgres_server"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if BACKEND != "postgresql":
        return
    kept, same = [], []
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        (kept if fixtures & BACKEND_FIXTURES else same).append(item)
    if same:
        config.hook.pytest_deselected(items=same)
        items[:] = kept


def all_tables(db_path: Path | str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of the database, by table, sorted."""
    listing = (
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        if is_postgres(db_path)
        else "SELECT name FROM sqlite_master WHERE type = 'table'"
    )
    tables = [t for (t,) in execute(db_path, listing)]
    return {t: sorted(execute(db_path, f"SELECT * FROM {t}"), key=repr) for t in tables}


def stored_bytes(db_path: Path | str) -> bytes:
    """What the database keeps, to show a secret is not in it: SQLite's file and its WAL
    byte for byte; on PostgreSQL every row of every table."""
    if is_postgres(db_path):
        return repr(all_tables(db_path)).encode()
    return Path(db_path).read_bytes() + Path(f"{db_path}-wal").read_bytes()


def snapshot(db_path: Path | str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, to show a refused request changed nothing."""
    return {t: sorted(execute(db_path, f"SELECT * FROM {t}"), key=repr) for t in TABLES}


def execute(db_path: Path | str, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run one statement on the database directly (a SQLite file or a PostgreSQL URL): to read
    rows, or to stand in for a later feature."""
    if is_postgres(db_path):
        pg = connect(db_path)
        try:
            cursor = pg.execute(sql, params)
            return [tuple(row) for row in cursor.fetchall()] if cursor.description else []
        finally:
            pg.close()
    conn = sqlite3.connect(db_path)
    try:
        rows = conn.execute(sql, params).fetchall()
        conn.commit()
        return rows
    finally:
        conn.close()


@pytest.fixture(autouse=True)
def log_defaults() -> Iterator[None]:
    """A test that runs a command as a daemon starts (its logging configured, loggers cached
    on first use) leaves the next one structlog's defaults, so a logger first used later is
    not bound to that configuration and ``capture_logs`` still sees it."""
    yield
    reset_logging()


@pytest.fixture
def config(tmp_path: Path, request: pytest.FixtureRequest) -> Config:
    """The app's settings on this run's backend: a SQLite file, or a fresh PostgreSQL
    database (BC_TEST_BACKEND=postgresql)."""
    if BACKEND == "postgresql":
        url = request.getfixturevalue("postgres_url")
        return Config(db_path=url, root_token_file=tmp_path / "root.token")
    return Config(db_path=tmp_path / "bc.db", root_token_file=tmp_path / "root.token")


@pytest.fixture
async def api(config: Config, aiohttp_client: Any) -> AsyncIterator[Api]:
    client = await aiohttp_client(make_app(config))
    yield Api(client, config.root_token_file.read_text().strip())


@pytest.fixture
def db(config: Config) -> Any:
    """The database the app runs on: a SQLite file's path, or a PostgreSQL URL."""
    return config.db_path


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    """The real control plane as a subprocess on a free loopback port."""
    running = Daemon(tmp_path)
    running.start()
    yield running
    running.kill()


# --- PostgreSQL (DESIGN §10, B3) ---------------------------------------------


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One real PostgreSQL server for the session (tests/postgres.py); never skipped.

    `make test` installs the binaries when absent, so a server that cannot start is a failure.
    """
    try:
        server = PostgresServer()
        server.start()
    except (PostgresUnavailable, OSError, subprocess.SubprocessError) as error:
        pytest.fail(f"PostgreSQL test server could not start: {error}", pytrace=False)
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh empty database (a copy of template0) on the session's server, dropped after."""
    url = postgres_server.new_database()
    yield url
    postgres_server.drop_database(url)
