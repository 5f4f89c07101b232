"""What a reservation holds, end to end (D1-D8): the real daemon, real agents on recorded
hosts applying into a temporary root, and the API as a tenant and an owner use it.

Each agent runs ``--once`` per cycle (join, report, fetch the spec, apply, deliver, report
again), so a test says exactly when the host acts. The expected GPU sets and CPUs are
computed here from the recorded host's own facts, not written down.
"""

import asyncio
import itertools
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from shared import cpulist
from tests.daemons import Daemon, call, root_pool
from tests.nodes import FIXTURES
from tests.test_agent_e2e import AGENT

LEVEL_RANK = {0: 0, 10: 1, 20: 2, 30: 3, 40: 4, 50: 5}


def fixture_host(name: str) -> dict[str, Any]:
    hosts = json.loads(FIXTURES.read_text())["hosts"]
    return dict(next(h for h in hosts if h["id"] == name))


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Daemon]:
    """The control plane with a quick reconciler: passes place what was released."""
    running = Daemon(tmp_path, "--reconcile-interval", "0.2")
    running.start()
    yield running
    running.kill()


class Host:
    """A recorded host's agent, run one cycle at a time, applying under its own root."""

    def __init__(self, plane: Daemon, token_file: Path, name: str, fixture: Path = FIXTURES):
        self.plane, self.name = plane, name
        self.dir = plane.workdir / f"host-{name}"
        self.root = self.dir / "root"
        self.fixture = fixture
        self.token_file = token_file
        self.root.mkdir(parents=True)

    def cycle(self, *extra: str) -> None:
        done = subprocess.run(
            [
                str(AGENT),
                "run",
                "--once",
                "--controlplane",
                self.plane.url,
                "--join-token-file",
                str(self.token_file),
                "--state-dir",
                str(self.dir / "state"),
                "--root",
                str(self.root),
                "--fixture",
                str(self.fixture),
                "--fixture-host",
                self.name,
                "--log-format",
                "json",
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr[-3000:]

    def slice_file(self, reservation: str) -> Path:
        return self.root / f"run/systemd/system/better-compute-{reservation}.slice"

    def env_file(self, reservation: str) -> Path:
        return self.root / f"run/better-compute/reservations/{reservation}.env"

    def commands(self) -> list[list[str]]:
        """What the agent ran, as the recording runner under a directory root writes it down."""
        log = self.root / "var/lib/better-compute/commands.log"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


class Api:
    def __init__(self, plane: Daemon, session: aiohttp.ClientSession) -> None:
        self.plane, self.session = plane, session

    async def ok(self, path: str, body: dict[str, Any]) -> Any:
        return await call(self.session, self.plane.url, path, self.plane.token, body)

    async def status(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        async with self.session.post(
            f"{self.plane.url}/api/{path}",
            json=body,
            headers={"Authorization": f"Bearer {self.plane.token}"},
        ) as response:
            return response.status, await response.json()

    async def pool(self, gpu_model: str, policy: dict[str, Any], quota: dict[str, int]) -> str:
        made = await root_pool(
            self.session, self.plane, gpuModel=gpu_model, policy=policy, ownerQuota=quota
        )
        return str(made["id"])

    async def token_file(self, pool: str, name: str = "join.token") -> Path:
        token = await self.ok(
            "compute/joinTokens/create", {"tenantId": "root", "poolId": pool, "maxUses": 5}
        )
        path = self.plane.workdir / name
        path.write_text(token["token"])
        path.chmod(0o600)
        return path

    async def reserve(self, pool: str, **resources: int) -> Any:
        return await self.ok(
            "compute/reservations/create",
            {"tenantId": "root", "poolId": pool, "resources": resources},
        )

    async def get(self, reservation: str) -> Any:
        return await self.ok(
            "compute/reservations/get", {"tenantId": "root", "reservationId": reservation}
        )

    async def end(self, reservation: str) -> Any:
        return await self.ok(
            "compute/reservations/end", {"tenantId": "root", "reservationId": reservation}
        )

    async def node(self, pool: str) -> Any:
        (node,) = (await self.ok("compute/nodes/list", {"tenantId": "root", "poolId": pool}))[
            "items"
        ]
        return node

    async def until(self, reservation: str, state: str) -> Any:
        for _ in range(100):  # bounded: the reconciler runs every 0.2 s
            got = await self.get(reservation)
            if got["state"] == state:
                return got
            await asyncio.sleep(0.05)
        raise AssertionError(f"{reservation} never {state}: {got}")


def best_set(host: dict[str, Any], free: list[int], count: int) -> tuple[int, ...]:
    """D2's choice on the recorded host's own facts: all NVLink, best worst level, fewest
    NUMA nodes, lowest indices."""
    links = {(x["a"], x["b"]): x for x in host["gpu_links"]}
    numa = {g["index"]: g["numa_node"] for g in host["gpus"]}

    def rank(chosen: tuple[int, ...]) -> tuple[bool, int, int, tuple[int, ...]]:
        pairs = [links[p] for p in itertools.combinations(chosen, 2)]
        return (
            not all(p["p2p_nvlink_status"] == 0 for p in pairs),
            max((LEVEL_RANK[p["level"]] for p in pairs), default=0),
            len({numa[i] for i in chosen}),
            chosen,
        )

    return min(itertools.combinations(sorted(free), count), key=rank)


async def test_d1_the_inventory_carries_the_recorded_topology(plane: Daemon) -> None:
    """D1: minor numbers, NUMA nodes and CPU affinity per GPU, every pair's level and NVLink,
    NUMA nodes with CPUs and memory, thread siblings: as the recorded host has them."""
    recorded = fixture_host("dgx-h100-01")
    async with aiohttp.ClientSession() as session:
        api = Api(plane, session)
        pool = await api.pool("H100", {}, {"gpu": 8})
        host = Host(plane, await api.token_file(pool), "dgx-h100-01")
        host.cycle()
        inventory = (await api.node(pool))["inventory"]
    names = ["internal", "single", "multiple", "hostbridge", "node", "system"]
    assert [(g["minorNumber"], g["numaNode"], g["cpuAffinity"]) for g in inventory["gpus"]] == [
        (g["minor_number"], g["numa_node"], g["cpu_affinity"]) for g in recorded["gpus"]
    ]
    assert [(x["a"], x["b"], x["level"], x["nvlink"]) for x in inventory["gpuLinks"]] == [
        (x["a"], x["b"], names[LEVEL_RANK[x["level"]]], x["p2p_nvlink_status"] == 0)
        for x in recorded["gpu_links"]
    ]
    assert [(n["id"], n["cpus"], n["memoryBytes"]) for n in inventory["cpu"]["numaNodes"]] == [
        (n["id"], n["cpus"], n["memory_total_bytes"]) for n in recorded["numa_nodes"]
    ]
    assert inventory["cpu"]["threadSiblings"] == recorded["cpu"]["thread_siblings"]


async def test_d2_to_d7_a_booking_is_chosen_delivered_and_released_on_the_host(
    plane: Daemon,
) -> None:
    """D2: the best-ranked GPU set; D3: pinned whole cores on its NUMA node, never the
    host's reserved ones, memory from that node; D4: the answer says so; D5: the agent
    writes the slice and the environment file and starts the slice; D6: placed until the
    host delivers it, then active; D7: ended, it stays releasing (its GPUs out of placement)
    until the host confirms the release."""
    recorded = fixture_host("l40s-node-03")
    policy = {"hostReserve": {"vcpu": 2, "memoryGiB": 16}}
    async with aiohttp.ClientSession() as session:
        api = Api(plane, session)
        pool = await api.pool("L40S", policy, {"gpu": 8, "vcpu": 64, "memoryGiB": 256})
        host = Host(plane, await api.token_file(pool), "l40s-node-03")
        host.cycle()
        placed = await api.reserve(pool, gpu=2, vcpu=6, memoryGiB=32)
        assert placed["state"] == "placed" and placed["delivery"]["state"] == "pending"
        where = placed["placement"]
        chosen = best_set(recorded, [g["index"] for g in recorded["gpus"]], 2)
        assert tuple(g["index"] for g in where["gpus"]) == chosen
        by_index = {g["index"]: g for g in recorded["gpus"]}
        assert [(g["uuid"], g["minorNumber"], g["numaNode"]) for g in where["gpus"]] == [
            (by_index[i]["uuid"], by_index[i]["minor_number"], by_index[i]["numa_node"])
            for i in chosen
        ]
        numa = {by_index[i]["numa_node"] for i in chosen}
        near = {
            c for n in recorded["numa_nodes"] if n["id"] in numa for c in cpulist.parse(n["cpus"])
        }
        cores = [set(cpulist.parse(c)) for c in recorded["cpu"]["thread_siblings"]]
        reserved: set[int] = set()
        for core in sorted(cores, key=min):  # hostReserve.vcpu 2: CPU 0 and its sibling
            if len(reserved) < 2:
                reserved |= core
        assert reserved == {0, 64}
        pinned = set(cpulist.parse(where["cpus"]))
        assert len(pinned) == 6 and pinned <= near and not pinned & reserved
        assert all(core <= pinned for core in cores if core & pinned)  # whole cores
        assert where["cpuQuota"] is None and where["memoryBytes"] == 32 << 30
        assert where["memoryNodes"] == cpulist.format(numa)
        assert where["topology"]["numaNodes"] == sorted(numa)

        rid = placed["id"]
        await api.until(rid, "placed")  # passes and reports alone deliver nothing
        host.cycle()
        active = await api.get(rid)
        assert (active["state"], active["delivery"]["state"]) == ("active", "delivered")
        unit = host.slice_file(rid).read_text()
        assert f"AllowedCPUs={where['cpus']}" in unit
        assert f"AllowedMemoryNodes={where['memoryNodes']}" in unit
        assert f"MemoryMax={32 << 30}" in unit and "DevicePolicy=closed" in unit
        for gpu in where["gpus"]:
            assert f"DeviceAllow=/dev/nvidia{gpu['minorNumber']} rw" in unit
        assert "DeviceAllow=/dev/nvidiactl rw" in unit
        env = dict(
            line.split("=", 1) for line in host.env_file(rid).read_text().splitlines() if line
        )
        uuids = ",".join(g["uuid"] for g in where["gpus"])
        assert env["CUDA_VISIBLE_DEVICES"] == uuids == env["NVIDIA_VISIBLE_DEVICES"]
        assert (
            env["BETTER_COMPUTE_RESERVATION"] == rid and env["BETTER_COMPUTE_CPUS"] == where["cpus"]
        )
        assert ["systemctl", "start", f"better-compute-{rid}.slice"] in host.commands()
        owner_view = (await api.node(pool))["bookings"]
        assert [(b["reservationId"], b["gpus"], b["delivery"]) for b in owner_view] == [
            (rid, [g["uuid"] for g in where["gpus"]], "delivered")
        ]

        ended = await api.end(rid)
        assert ended["delivery"]["state"] == "releasing"
        whole = await api.reserve(pool, gpu=4)
        await asyncio.sleep(0.5)  # passes run: the released GPUs are not back yet
        assert (await api.get(whole["id"]))["state"] == "pending"
        host.cycle()  # the agent stops the slice, removes its files, finds no process
        assert not host.slice_file(rid).exists() and not host.env_file(rid).exists()
        assert ["systemctl", "stop", f"better-compute-{rid}.slice"] in host.commands()
        assert (await api.get(rid))["delivery"]["state"] == "released"
        await api.until(whole["id"], "placed")


async def test_d2_strict_leaves_what_no_topology_fits_pending_with_the_reason(
    plane: Daemon,
) -> None:
    """D2 strict: on the PCIe L40S host (two GPUs per NUMA node, no NVLink) three GPUs have
    no set on one NUMA node: pending, with the reason; two do."""
    policy = {"placement": {"topology": "strict"}}
    async with aiohttp.ClientSession() as session:
        api = Api(plane, session)
        pool = await api.pool("L40S", policy, {"gpu": 8})
        Host(plane, await api.token_file(pool), "l40s-node-03").cycle()
        three = await api.reserve(pool, gpu=3)
        assert (three["state"], three["reason"]) == ("pending", "no node fits its topology")
        two = await api.reserve(pool, gpu=2)
        assert two["state"] == "placed" and len(two["placement"]["topology"]["numaNodes"]) == 1


@pytest.mark.parametrize(("topology", "third_on"), [("preferred", 1), ("none", 0)])
async def test_d2_bin_packing_keeps_whole_hosts_free(
    plane: Daemon, topology: str, third_on: int
) -> None:
    """D2: across nodes the one with the fewest free GPUs that still fit wins (a 1-GPU request
    goes to the host with one left, keeping two free together on the other); ``none`` is
    first fit."""
    async with aiohttp.ClientSession() as session:
        api = Api(plane, session)
        pool = await api.pool("L40S", {"placement": {"topology": topology}}, {"gpu": 16})
        token = await api.token_file(pool)
        first, second = Host(plane, token, "l40s-node-03"), None
        first.cycle()
        twin = fixture_host("l40s-node-03")
        twin["id"] = twin["hostname"] = "l40s-node-04"
        for gpu in twin["gpus"]:
            gpu["uuid"] = gpu["uuid"][:-4] + "beef"
        copy = plane.workdir / "twin.json"
        copy.write_text(json.dumps({**json.loads(FIXTURES.read_text()), "hosts": [twin]}))
        second = Host(plane, token, "l40s-node-04", copy)
        second.cycle()
        nodes = sorted(
            (await api.ok("compute/nodes/list", {"tenantId": "root", "poolId": pool}))["items"],
            key=lambda n: n["id"],
        )
        ids = [n["id"] for n in nodes]
        two = await api.reserve(pool, gpu=2)
        three = await api.reserve(pool, gpu=3)
        assert (two["nodeId"], three["nodeId"]) == (ids[0], ids[1])  # 2 and 1 left
        third = await api.reserve(pool, gpu=1)
        assert third["nodeId"] == ids[third_on]


async def test_d5_a_gpu_busy_with_a_process_fails_delivery(plane: Daemon) -> None:
    """D5, D6: a GPU on which NVML lists a process no booking accounts for is not delivered:
    the reservation fails DeliveryFailed with the pid, and its quota comes back."""
    busy = fixture_host("l40s-node-03")
    busy["gpus"][0]["compute_processes"] = [{"pid": 4242, "used_gpu_memory_bytes": 1 << 30}]
    copy = plane.workdir / "busy.json"
    copy.write_text(json.dumps({**json.loads(FIXTURES.read_text()), "hosts": [busy]}))
    async with aiohttp.ClientSession() as session:
        api = Api(plane, session)
        pool = await api.pool("L40S", {}, {"gpu": 4})
        host = Host(plane, await api.token_file(pool), "l40s-node-03", copy)
        host.cycle()
        placed = await api.reserve(pool, gpu=1)
        assert placed["placement"]["gpus"][0]["index"] == 0
        host.cycle()
        failed = await api.get(placed["id"])
        assert failed["state"] == "failed"
        assert failed["reason"].startswith("DeliveryFailed: gpu busy: pid 4242")
        assert not host.slice_file(placed["id"]).exists()
        got = await api.ok("compute/pools/get", {"tenantId": "root", "poolId": pool})
        assert {q["resource"]: q["used"] for q in got["quotas"]} == {"gpu": 0}


async def test_d7_a_release_blocked_by_a_process_holds_the_gpu_until_forced(
    plane: Daemon,
) -> None:
    """D7: a process left on the GPU past --release-timeout reports the release blocked with
    its pid: the GPU stays out of placement, the node says why (node.releaseBlocked);
    nodes/remove is INVALID_STATE without force, and force frees it."""
    recorded = fixture_host("l40s-node-03")
    copy = plane.workdir / "hosts.json"
    copy.write_text(json.dumps({**json.loads(FIXTURES.read_text()), "hosts": [recorded]}))
    async with aiohttp.ClientSession() as session:
        api = Api(plane, session)
        pool = await api.pool("L40S", {}, {"gpu": 8})
        host = Host(plane, await api.token_file(pool), "l40s-node-03", copy)
        host.cycle()
        placed = await api.reserve(pool, gpu=1)
        host.cycle()
        assert (await api.get(placed["id"]))["state"] == "active"
        recorded["gpus"][0]["compute_processes"] = [{"pid": 777, "used_gpu_memory_bytes": 1}]
        copy.write_text(json.dumps({**json.loads(FIXTURES.read_text()), "hosts": [recorded]}))
        await api.end(placed["id"])
        host.cycle("--release-timeout", "1")
        await asyncio.sleep(1.1)
        host.cycle("--release-timeout", "1")
        blocked = await api.get(placed["id"])
        assert blocked["delivery"]["state"] == "release-blocked"
        assert "777" in blocked["delivery"]["reason"]
        whole = await api.reserve(pool, gpu=4)
        assert whole["state"] == "pending"
        node = await api.node(pool)
        assert "release blocked" in (node["stateReason"] or "")
        events = await api.ok(
            "compute/events/list", {"tenantId": "root", "types": ["node.releaseBlocked"]}
        )
        assert [e["data"]["reservationId"] for e in events["items"]] == [placed["id"]]
        at = {"tenantId": "root", "nodeId": node["id"]}
        status, refused = await api.status("compute/nodes/remove", at)
        assert (status, refused["error"]["code"]) == (409, "INVALID_STATE")
        assert (await api.ok("compute/nodes/remove", {**at, "force": True}))["removed"] is True
        assert (await api.get(placed["id"]))["delivery"]["state"] == "released"
