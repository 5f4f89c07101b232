"""F3: the agent as systemd runs it, split in two real processes: the root applier
(`better-compute-agent applier`, here on a socket of its own under a temporary root) and the
unprivileged network process (`run --applier-socket`), against the real control plane on
this run's backend, on a recorded host served by the fake NVML.

The network process joins, reports and fetches; the applier applies the spec's units and
delivers its booking; the network process reports what the applier answered. The applier is
the real gate: a spec handed to its socket directly (as a compromised network process could)
is checked again and refused whole, and anything but one apply request is answered with an
error and changes nothing.
"""

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from agent.applier import MAX_MESSAGE, ApplyRequest, Reply
from tests.daemons import Daemon
from tests.nodes import FIXTURES, recorded
from tests.specs import HUGEPAGES_FILE, HUGEPAGES_TEXT, served
from tests.test_agent_e2e import AGENT
from tests.test_agent_trust import EVIL_SERVICE, files_under
from tests.test_reservation_delivery import Api

HOST = "l40s-node-03"


def on_host(tmp_path: Path) -> list[str]:
    """What both processes take: the root applied under, the recorded host, JSON logs."""
    return [
        "--root",
        str(tmp_path / "root"),
        "--fixture",
        str(FIXTURES),
        "--fixture-host",
        HOST,
        "--log-format",
        "json",
    ]


@pytest.fixture
def plane(tmp_path: Path, db: Any) -> Iterator[Daemon]:
    """The control plane on this run's backend, with a quick reconciler."""
    running = Daemon(
        tmp_path, "--reconcile-interval", "0.2", db=db if isinstance(db, str) else None
    )
    running.start()
    yield running
    running.kill()


@pytest.fixture
def applier(tmp_path: Path) -> Iterator[Path]:
    """The root applier as a subprocess, applying under tmp_path/root; its socket."""
    path = tmp_path / "apply.sock"
    log = (tmp_path / "applier.log").open("wb")
    process = subprocess.Popen(
        [
            str(AGENT),
            "applier",
            "--socket",
            str(path),
            "--state-dir",
            str(tmp_path / "apply-state"),
            *on_host(tmp_path),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 20
    while not path.exists():
        assert process.poll() is None and time.monotonic() < deadline, (
            tmp_path / "applier.log"
        ).read_text()
        time.sleep(0.05)
    try:
        yield path
    finally:
        process.terminate()
        assert process.wait(timeout=20) == 0  # a stop is a clean exit
        log.close()


def cycle(plane: Daemon, tmp_path: Path, token_file: Path, applier: Path) -> None:
    """One cycle of the network process (--once), handing its spec to the applier."""
    done = subprocess.run(
        [
            str(AGENT),
            "run",
            "--once",
            "--controlplane",
            plane.url,
            "--join-token-file",
            str(token_file),
            "--state-dir",
            str(tmp_path / "state"),
            "--applier-socket",
            str(applier),
            *on_host(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]


def ask(path: Path, payload: bytes) -> Reply:
    """One connection to the applier: ``payload``, then its answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(30)
        connection.connect(str(path))
        try:
            connection.sendall(payload)
            connection.shutdown(socket.SHUT_WR)
        except BrokenPipeError:  # it stopped reading past its limit: its answer still came
            pass
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return msgspec.json.decode(answer, type=Reply)


async def test_f3_the_split_agent_applies_and_delivers_through_the_applier(
    plane: Daemon, tmp_path: Path, applier: Path
) -> None:
    """The network process writes only its state (credential, kept spec); the applier writes
    the spec's file under the root and the booking's slice and environment file, keeps its
    own records, and its outcomes reach the control plane: the node ready, the booking
    active. Its socket is 0600."""
    assert applier.stat().st_mode & 0o777 == 0o600
    root = tmp_path / "root"
    async with aiohttp.ClientSession() as session:
        api = Api(plane, session)
        pool = await api.pool("L40S", {"hugepages": {"2Mi": 64}}, {"gpu": 8, "vcpu": 64})
        token_file = await api.token_file(pool)
        cycle(plane, tmp_path, token_file, applier)
        assert (root / HUGEPAGES_FILE).read_text() == HUGEPAGES_TEXT
        assert {"node.json", "spec.json"} <= set(os.listdir(tmp_path / "state"))
        assert "applied.json" not in os.listdir(tmp_path / "state")
        assert "applied.json" in os.listdir(tmp_path / "apply-state")
        node = await api.node(pool)
        assert (node["state"], node["appliedVersion"]) == ("ready", node["specVersion"])

        placed = await api.reserve(pool, gpu=1, vcpu=2)
        rid = placed["id"]
        await api.until(rid, "placed")
        cycle(plane, tmp_path, token_file, applier)
        active = await api.get(rid)
        assert (active["state"], active["delivery"]["state"]) == ("active", "delivered")
        [gpu] = active["placement"]["gpus"]
        slice_file = root / f"run/systemd/system/better-compute-{rid}.slice"
        assert f"DeviceAllow=/dev/nvidia{gpu['minorNumber']} rw" in slice_file.read_text()
        env = (root / f"run/better-compute/reservations/{rid}.env").read_text()
        assert f"CUDA_VISIBLE_DEVICES={gpu['uuid']}\n" in env
        assert rid in json.loads((tmp_path / "apply-state/bookings.json").read_text())
        assert "bookings.json" not in os.listdir(tmp_path / "state")
        log = root / "var/lib/better-compute/commands.log"
        assert ["systemctl", "start", f"better-compute-{rid}.slice"] in [
            json.loads(line) for line in log.read_text().splitlines()
        ]


def test_f3_the_applier_is_the_gate_and_takes_one_request_kind(
    tmp_path: Path, applier: Path
) -> None:
    """Handed to its socket directly, a spec with a service unit file its renderer never makes
    is refused whole (its trusted units unapplied too); a field more, a body past the limit,
    and what is not JSON get an error; none of them changes anything. A spec it trusts is then
    applied."""
    root = tmp_path / "root"
    good = served("s1", gpu_model="L40S", inventory=recorded(HOST))
    evil_unit = {
        "id": "evil/file",
        "kind": "file",
        "path": "/etc/systemd/system/better-compute-evil.service",
        "content": EVIL_SERVICE,
    }
    evil = {**good, "units": [*good["units"], evil_unit]}
    reply = ask(applier, msgspec.json.encode(ApplyRequest(evil)))
    assert reply.outcomes is not None and reply.outcomes.bookings is None
    assert reply.outcomes.applied["refused"].startswith("unit 'evil/file': the file is not what")
    for payload, said in (
        (msgspec.json.encode({"spec": good, "also": "run this"}), "not an apply request"),
        (b"{" + b" " * MAX_MESSAGE + b"}", f"a message over {MAX_MESSAGE} bytes"),
        (b"\x00not json", "not an apply request"),
        (msgspec.json.encode({"spec": {"units": []}}), "not an apply request"),
    ):
        reply = ask(applier, payload)
        assert reply.outcomes is None and reply.error is not None and said in reply.error, reply
    assert files_under(root) == set()
    assert not (tmp_path / "apply-state" / "applied.json").exists()
    reply = ask(applier, msgspec.json.encode(ApplyRequest(good)))
    assert reply.outcomes is not None
    assert {u["status"] for u in reply.outcomes.applied["units"]} == {"applied"}
    assert (root / HUGEPAGES_FILE).read_text() == HUGEPAGES_TEXT
