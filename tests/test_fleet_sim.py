"""F7, F10: the fleet simulator (bench/fleet_sim.py) end to end at a tiny size.

It runs as a subprocess against the real daemon on this run's backend (SQLite, or two
replicas on the session's PostgreSQL database): 20 agents join with the pool's join token,
storm the daemon with their first reports, report for 3 s at a 1 s interval (30 x
compressed) with digest heartbeats (F9) while a tenant creates and ends reservations, and the
audit finds every node reported and ready and none wrongly lost.
"""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from controlplane.storage.db import is_postgres

SIM = Path(__file__).resolve().parent.parent / "bench" / "fleet_sim.py"
NODES = 20


def test_f7_every_simulated_agent_reports_and_none_is_wrongly_lost(db: Any) -> None:
    backend = (
        ["--backend", "postgresql", "--replicas", "2", "--postgres-url", str(db)]
        if is_postgres(db)
        else ["--backend", "sqlite"]
    )
    argv = [sys.executable, str(SIM), "--nodes", str(NODES), "--seconds", "3", "--interval", "1"]
    done = subprocess.run(
        [*argv, *backend, "--reservations-per-s", "4", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for phase in ("1. joins", "2. first-report storm", "3. steady state", "4. audit"):
        assert any(line.startswith(phase) for line in lines), done.stdout
    assert any(line.startswith("mode") and "reports/s" in line for line in lines)
    (run,) = json.loads(lines[-1])["runs"]
    assert run["nodes"] == NODES and run["backend"] in {"sqlite", "postgresql"}

    # Every agent joined with its own credential and its first report was answered.
    assert run["joins"]["ok"] == NODES and run["joins"]["perSecond"] > 0
    assert run["storm"]["drained"] and run["storm"]["reported"] == NODES
    assert run["storm"]["drainSeconds"] > 0
    # F9: each first report carries the digest its join answered, as the agent's does.
    assert run["storm"]["wholeInventories"] == 0

    # The steady state: heartbeats only (the digest the answers gave), at about N / interval.
    steady = run["steady"]
    assert steady["ok"] >= NODES and steady["reportsPerSecond"] > 0
    assert steady["wholeInventories"] == 0
    assert steady["p50Ms"] > 0 and steady["p99Ms"] >= steady["p50Ms"]
    assert steady["reservations"]["create"]["ok"] > 0
    assert set(steady["reservations"]["created"]) <= {"pending", "placed", "active"}
    assert steady["cpu"]["daemonSeconds"] > 0 and steady["cpu"]["serverPerThousandReports"] > 0
    assert steady["leaderPass"]["found"] and steady["leaderPass"]["passes"] >= 1

    # The audit: every node reported and is ready; none wrongly lost.
    audit = run["audit"]
    assert audit["nodes"] == NODES and audit["reported"] == NODES
    assert audit["states"] == {"ready": NODES}
    assert audit["wronglyLost"] == 0 and audit["lostAtEnd"] == 0
    assert sum(audit["reservations"].values()) == steady["reservations"]["create"]["ok"]
    assert set(audit["reservations"]) <= {"pending", "placed", "active", "ended"}
    assert run["projection"]["hosts"] == 100_000 and run["projection"]["cores"] > 0
