"""A policy update on the control plane reaches the agent's files in a temporary root (N6)."""

import asyncio
import json
import signal
import subprocess
from pathlib import Path

import aiohttp

from tests.daemons import Daemon, call
from tests.test_agent_e2e import agent_command, demo_pool, wait_for


async def test_a_policy_update_reaches_the_agents_applied_files(tmp_path: Path) -> None:
    """N6: update the pool's hugepages; on its next cycles the agent writes the new sysctl drop-in."""
    daemon = Daemon(tmp_path, "--reconcile-interval", "0.2")
    daemon.start()
    try:
        pool, token_file = await demo_pool(daemon)
        root = tmp_path / "host-root"
        log = (tmp_path / "agent.log").open("w")
        agent = subprocess.Popen(
            agent_command(
                daemon, token_file, "dgx-h100-01", "--interval", "0.3", "--root", str(root)
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            policy = {"hostReserve": {"vcpu": 8, "memoryGiB": 64}, "hugepages": {"2Mi": 2048}}
            async with aiohttp.ClientSession() as session:
                await call(
                    session,
                    daemon.url,
                    "compute/pools/update",
                    daemon.token,
                    {"tenantId": "root", "poolId": pool, "policy": policy},
                )
            drop_in = root / "etc/sysctl.d/90-better-compute-hugepages.conf"
            await wait_for(lambda: drop_in.exists() and "2048" in drop_in.read_text())
            async with aiohttp.ClientSession() as session:
                nodes = await call(
                    session,
                    daemon.url,
                    "compute/nodes/list",
                    daemon.token,
                    {"tenantId": "root", "poolId": pool},
                )
                for _ in range(100):
                    applied = nodes["items"][0]["applied"]
                    if applied and applied["version"] == nodes["items"][0]["specVersion"]:
                        break
                    await asyncio.sleep(0.1)
                    nodes = await call(
                        session,
                        daemon.url,
                        "compute/nodes/list",
                        daemon.token,
                        {"tenantId": "root", "poolId": pool},
                    )
            statuses = {u["id"]: u["status"] for u in nodes["items"][0]["applied"]["units"]}
            assert statuses and set(statuses.values()) <= {
                "applied",
                "unchanged",
                "pending-reboot",
            }, statuses
            commands = (root / "var/lib/better-compute/commands.log").read_text().splitlines()
            assert ["sysctl", "-w", "vm.nr_hugepages=2048"] in [json.loads(c) for c in commands]
        finally:
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(timeout=20) == 0
            log.close()
    finally:
        daemon.kill()


async def test_dry_run_fetches_the_spec_and_touches_nothing(tmp_path: Path) -> None:
    """--dry-run: the agent keeps the NodeSpec in its state directory and writes nothing under its root."""
    daemon = Daemon(tmp_path)
    daemon.start()
    try:
        pool, token_file = await demo_pool(daemon)
        async with aiohttp.ClientSession() as session:
            await call(
                session,
                daemon.url,
                "compute/pools/update",
                daemon.token,
                {
                    "tenantId": "root",
                    "poolId": pool,
                    "policy": {
                        "hugepages": {"2Mi": 512},
                        "hostReserve": {"vcpu": 8, "memoryGiB": 64},
                    },
                },
            )
        root = tmp_path / "host-root"
        root.mkdir()
        done = subprocess.run(
            agent_command(
                daemon, token_file, "dgx-h100-01", "--once", "--dry-run", "--root", str(root)
            ),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        spec = json.loads((daemon.workdir / "agent" / "spec.json").read_text())
        assert any(u["id"] == "hugepages/sysctl" for u in spec["units"])
        assert list(root.iterdir()) == []
    finally:
        daemon.kill()
