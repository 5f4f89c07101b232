"""R7 under kill -9: the crash harness (bench/crash.py) in a short, bounded run.

R7 (DESIGN.md §8), the crash rule: an acknowledged mutation survives a crash of the process; the
database commits durably before the answer. Here the real daemon is killed with SIGKILL twice
under three concurrent writing clients and restarted on the same database; after each kill, each
restart and at the end the SQLite file, opened read-only, must pass every audit: integrity, quota
``used`` equal to live reservations, ``allocated`` equal to bookings and within capacity, each GPU
atom booked by exactly one live reservation, gapless event ``seq``, and every acknowledged write
present with its event. A second test shows the audit is not blind: it flags a damaged copy.
"""

import importlib.util
import sqlite3
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest

CRASH = Path(__file__).resolve().parent.parent / "bench" / "crash.py"


def load_crash() -> ModuleType:
    name = "bench_crash"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, CRASH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, Any, Path]:
    """One short run for the module: 2 kills, 3 clients, bounded to well under 20 s."""
    crash = load_crash()
    workdir = tmp_path_factory.mktemp("crash")
    options = crash.Options(
        rounds=2,
        clients=3,
        seed=7,
        min_up_s=0.3,
        max_up_s=0.8,
        max_seconds=18.0,
        max_ops=20_000,
        workdir=workdir,
    )
    return crash, crash.run(options), workdir


def test_r7_kill_9_loses_no_acknowledged_write(crashed: tuple[ModuleType, Any, Path]) -> None:
    crash, result, _ = crashed
    assert result.violations == [], "\n".join(crash.summary(result))
    assert result.rounds == 2
    assert len(result.audits) == 5  # after each kill, after each restart, at the end
    ledger = result.ledger
    assert ledger.writes["reservations/create"] > 0 and ledger.writes["reservations/end"] > 0
    assert ledger.writes["pools/create"] > 0 and ledger.writes["quotas/set"] > 0
    assert ledger.created_states["placed"] > 0  # the joined hosts took bookings
    assert result.checks > 1000


def test_r7_the_audit_flags_a_damaged_database(
    crashed: tuple[ModuleType, Any, Path], tmp_path: Path
) -> None:
    crash, result, workdir = crashed
    damaged = tmp_path / "damaged.db"
    rid = next(iter(result.ledger.ended))  # acknowledged as ended
    source = sqlite3.connect(f"file:{workdir / 'bc.db'}?mode=ro", uri=True)
    db = sqlite3.connect(damaged)
    try:
        source.backup(db)  # the database with its WAL, whatever the daemon left
        db.execute("DELETE FROM events WHERE seq = 2")
        db.execute("UPDATE quotas SET used = used + 1 WHERE resource = 'gpu'")
        db.execute("UPDATE reservations SET state = 'pending' WHERE id = ?", [rid])
        db.commit()
    finally:
        db.close()
        source.close()
    found = "\n".join(crash.audit(damaged, result.ledger, "damaged").violations)
    assert "events seq not gapless" in found
    assert "used" in found
    assert f"acknowledged end of {rid}" in found


@pytest.fixture(scope="module")
def crashed_postgres(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, Any, list[str]]:
    """F6: one short --postgres run, 1 round of each fault kind, 2 replicas, 3 clients; at its
    end a copy of the database is damaged and audited (what that audit found is returned)."""
    crash = load_crash()
    found: list[str] = []

    def damage(server: Any, url: str, ledger: Any) -> None:
        name = url.rsplit("/", 1)[-1]
        copy = f"{name}_damaged"
        server.admin().execute(f'CREATE DATABASE "{copy}" TEMPLATE "{name}"')
        rid = next(iter(ledger.ended))  # acknowledged as ended
        with psycopg.connect(server.url(copy)) as db:
            db.execute("SET session_replication_role = replica")  # no foreign-key triggers
            db.execute("DELETE FROM events WHERE seq = 2")  # its audience rows now dangle
            db.execute("UPDATE quotas SET used = used + 1 WHERE resource = 'gpu'")
            db.execute("UPDATE reservations SET state = 'pending' WHERE id = %s", [rid])
        found.extend(crash.audit_postgres(server.url(copy), ledger, "damaged").violations)
        found.append(f"ended {rid}")

    options = crash.Options(
        rounds=1,
        clients=3,
        seed=7,
        min_up_s=0.3,
        max_up_s=0.8,
        max_seconds=50.0,
        max_ops=20_000,
        workdir=tmp_path_factory.mktemp("crash-pg"),
        postgres=True,
        replicas=2,
        at_end=damage,
    )
    return crash, crash.run(options), found


def test_f6_faults_on_postgres_lose_no_acknowledged_write(
    crashed_postgres: tuple[ModuleType, Any, list[str]],
) -> None:
    crash, result, _ = crashed_postgres
    assert result.violations == [], "\n".join(crash.summary(result))
    assert {kind: stats.count for kind, stats in result.faults.items()} == dict.fromkeys(
        crash.FAULTS, 1
    )
    assert len(result.audits) == len(crash.FAULTS) + 1  # after each fault, at the end
    ledger = result.ledger
    assert ledger.writes["reservations/create"] > 0 and ledger.writes["reservations/end"] > 0
    assert ledger.writes["pools/create"] > 0 and ledger.writes["quotas/set"] > 0
    assert result.checks > 1000


def test_f6_the_postgres_audit_flags_a_damaged_database(
    crashed_postgres: tuple[ModuleType, Any, list[str]],
) -> None:
    _, _, found = crashed_postgres
    rid = found.pop().removeprefix("ended ")
    text = "\n".join(found)
    assert "events seq not gapless" in text
    assert "event_audience rows whose seq is not in events" in text
    assert "used" in text
    assert f"acknowledged end of {rid}" in text
