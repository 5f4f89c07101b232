"""`make run` in a test: the demo comes up, its three agents join, acme sees its offered pools."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil  # type: ignore[import-untyped]

from tests.daemons import free_port

CONTROLPLANE = Path(sys.executable).parent / "better-compute-controlplane"
CLI = Path(sys.executable).parent / "better-compute"


def api(url: str, token: str, path: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        f"{url}/api/{path}",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return dict(json.loads(response.read()))


def test_the_demo_shows_the_whole_product(tmp_path: Path) -> None:
    """Three agents on recorded hosts join three pools; acme sees two offered pools and its
    reservation delivered on the H100 (D5); Ctrl-C stops all."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "demo.log").open("w")
    demo = subprocess.Popen(
        [
            str(CONTROLPLANE),
            "demo",
            "--data",
            str(tmp_path / "var"),
            "--listen",
            f"127.0.0.1:{port}",
            "--interval",
            "0.5",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        joined = 0
        text = ""
        while time.monotonic() < deadline and (joined < 3 or "Ctrl-C stops" not in text):
            time.sleep(0.2)
            text = (tmp_path / "demo.log").read_text()
            joined = text.count("joined ")
            assert demo.poll() is None, text
        assert joined == 3, (tmp_path / "demo.log").read_text()
        hint = (tmp_path / "demo.log").read_text()
        assert "better-compute pools list --tenant acme" in hint
        assert "Nodes: " in hint and hint.count(" ready") >= 3, hint
        acme = (tmp_path / "var" / "acme.token").read_text().strip()
        assert oct(os.stat(tmp_path / "var" / "acme.token").st_mode & 0o777) == "0o600"
        pools = api(url, acme, "compute/pools/list", {"tenantId": "acme"})["items"]
        assert sorted((p["gpuModel"], p["sharing"]) for p in pools) == [
            ("A100", "mig"),
            ("H100", "exclusive"),
        ]  # type: ignore[index]
        root = (tmp_path / "var" / "root.token").read_text().strip()
        h100 = next(p["id"] for p in pools if p["gpuModel"] == "H100")  # type: ignore[index]
        capacity = {
            r["resource"]: r["total"]
            for r in api(url, root, "compute/pools/capacity", {"tenantId": "root", "poolId": h100})[
                "items"
            ]
        }  # type: ignore[union-attr, index]
        assert capacity["gpu"] == 8 and capacity["vcpu"] == 432
        # H1: the demo agents apply into their directory roots, so each node becomes ready.
        states: list[str] = []
        for _ in range(150):  # bounded: 30 s
            fleet = api(url, root, "compute/nodes/list", {"tenantId": "root"})["items"]
            states = sorted(n["state"] for n in fleet)  # type: ignore[index]
            if states == ["ready"] * 3:
                break
            time.sleep(0.2)
        assert states == ["ready"] * 3, states
        placed = api(
            url,
            acme,
            "compute/reservations/create",
            {"tenantId": "acme", "poolId": h100, "resources": {"gpu": 1}},
        )
        assert placed["state"] == "placed", placed  # type: ignore[index]
        # D5, D6: the demo's own reservation of acme's was delivered by the H100's agent.
        (demo_reservation,) = re.findall(r"Acme's reservation (res_\w+) is active", hint)
        got = api(
            url,
            acme,
            "compute/reservations/get",
            {"tenantId": "acme", "reservationId": demo_reservation},
        )
        assert got["delivery"]["state"] == "delivered", got  # type: ignore[index]
        root_dir = tmp_path / "var" / "agents" / "demo-h100" / "root"
        unit = root_dir / f"run/systemd/system/better-compute-{demo_reservation}.slice"
        assert "DevicePolicy=closed" in unit.read_text()
        env_file = root_dir / f"run/better-compute/reservations/{demo_reservation}.env"
        assert f"BETTER_COMPUTE_RESERVATION={demo_reservation}" in env_file.read_text()
        # The printed hint works as printed: the CLI with acme's token, a table, and --json at the end.
        env = {
            **os.environ,
            "BETTER_COMPUTE_URL": url,
            "BETTER_COMPUTE_TOKEN_FILE": str(tmp_path / "var" / "acme.token"),
        }
        table = subprocess.run(
            [str(CLI), "pools", "list", "--tenant", "acme"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        # M4: the table shows the pool's own id whole, and its lines fit 100 columns but for
        # what the demo's derived pool ids are longer than a random id (26 characters).
        assert table.returncode == 0 and h100 in table.stdout, table.stderr
        assert "gpu 3/4" in table.stdout and all(
            len(line) <= 100 + len(h100) - len("pool_") - 26 for line in table.stdout.splitlines()
        )
        as_json = subprocess.run(
            [str(CLI), "pools", "list", "--tenant", "acme", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert {p["id"] for p in json.loads(as_json.stdout)["items"]} == {p["id"] for p in pools}  # type: ignore[index]
        children = psutil.Process(demo.pid).children(recursive=True)
        assert len(children) == 4  # the control plane and three agents
    finally:
        demo.send_signal(signal.SIGINT)  # Ctrl-C
        demo.wait(timeout=30)
        log.close()
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
