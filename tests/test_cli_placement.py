"""D4, D6, D7 in the CLI, as a subprocess against the real daemon: `reservations get` prints
what a placed reservation holds (node, GPUs with their device files, MIG instances, slots,
CPUs, memory, topology) and how far the host has got delivering it; `reservations list` has
its delivery state; `nodes get` shows the owner every booking on the node, whoever's it is;
the ledger's RELEASING column counts what ended bookings hold until the host releases it."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.daemons import Daemon
from tests.nodes import twin
from tests.test_cli import Cli, root_cli, table_id
from tests.test_cli_nodes import MACHINES, host, host_reports, join, site


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    """A fresh control plane per test, so the nodes and bookings are what the test made."""
    (tmp_path / "daemon").mkdir()
    running = Daemon(tmp_path / "daemon")
    running.start()
    yield root_cli(running, tmp_path)
    running.kill()


def pool(cli: Cli, site_id: str, *options: str) -> str:
    """A root metal-host pool offered to acme; `options` add to `pools create`."""
    created = cli.ok_json(
        "pools", "create", "--tenant", "root", "--site", site_id, "--class", "metal-host", *options
    )
    return str(created["id"])


def offer(cli: Cli, pool_id: str, *quota: str) -> None:
    quotas = [arg for q in quota for arg in ("--quota", q)]
    cli("pools", "offer", pool_id, "--tenant", "root", "--to", "acme", *quotas)


def reserve(cli: Cli, pool_id: str, *resources: str, mig: str | None = None) -> Any:
    asked = [arg for r in resources for arg in ("--resource", r)]
    profile = ["--mig-profile", mig] if mig else []
    res = cli.ok_json("reservations", "create", pool_id, "--tenant", "acme", *asked, *profile)
    assert res["state"] == "placed", res
    return res


def key_values(out: str) -> dict[str, str]:
    """The `key: value` lines of a get, by key."""
    found = {}
    for line in out.splitlines():
        key, _, value = line.partition(":  ")
        if value and " " not in key:
            found[key] = value.strip()
    return found


def rows(out: str, first: str) -> list[list[str]]:
    """The table lines whose first cell is `first`, split into cells."""
    return [line.split() for line in out.splitlines() if line.split()[:1] == [first]]


def test_d4_reservations_get_shows_the_placement_and_its_delivery(cli: Cli) -> None:
    """D4, D6: placed, the reservation says where it is and that the host has yet to deliver
    it; once the host reports it delivered, `reservations get` shows it active with each
    GPU's UUID, /dev/nvidia<minor> and NUMA node, its pinned CPUs, its memory and NUMA
    nodes, the topology and `delivered`; -o yaml and -o json are the whole answer."""
    cli("tenants", "create", "--tenant", "acme")
    pool_id = pool(cli, site(cli), "--gpu-model", "H100")
    offer(cli, pool_id, "gpu=4", "vcpu=16", "memoryGiB=128")
    node = join(cli, pool_id, host())
    res = reserve(cli, pool_id, "gpu=2", "vcpu=8", "memoryGiB=64")
    get = ("reservations", "get", res["id"], "--tenant", "acme")
    assert key_values(cli(*get).out)["delivery"].startswith("pending (since ")

    host_reports(cli, node, "delivered")
    answer = cli.ok_json(*get)
    placement = answer["placement"]
    assert answer["state"] == "active" and answer["delivery"]["state"] == "delivered"
    assert len(placement["gpus"]) == 2 and placement["cpuQuota"] is None  # ratio 1: pinned
    shown = cli(*get).out
    lines = key_values(shown)
    assert lines["state"] == "active"
    assert lines["node"] == f"{placement['hostname']} ({node})"
    assert lines["delivery"] == f"delivered (since {answer['delivery']['at']})"
    assert lines["cpus"] == f"{placement['cpus']} pinned"
    assert lines["memory"] == f"64 GiB on NUMA nodes {placement['memoryNodes']}"
    numa = ",".join(str(n) for n in placement["topology"]["numaNodes"])
    assert lines["topology"] == (
        f"NVLink yes, worst level {placement['topology']['worstLevel']}, NUMA nodes {numa}"
    )
    assert rows(shown, "GPU") == [["GPU", "UUID", "DEVICE", "NUMA"]]
    for gpu in placement["gpus"]:
        (row,) = [cells for cells in map(str.split, shown.splitlines()) if gpu["uuid"] in cells]
        assert row == [
            str(gpu["index"]), gpu["uuid"], f"/dev/nvidia{gpu['minorNumber']}", str(gpu["numaNode"]),
        ]  # fmt: skip
    assert all(len(line) <= 100 for line in shown.splitlines())

    assert msgspec.yaml.decode(cli("-o", "yaml", *get).out) == answer
    assert cli("-o", "json", *get).json() == answer
    assert cli("-o", "wide", *get).out == shown  # a get's ids are whole in the table already

    listed = cli("reservations", "list", "--tenant", "acme").out.splitlines()
    assert listed[0].split() == [
        "ID", "POOL", "STATE", "DELIVERY", "RESOURCES", "NODE", "REASON",
    ]  # fmt: skip
    assert rows("\n".join(listed), res["id"])[0][:4] == [
        res["id"], table_id(pool_id), "active", "delivered",
    ]  # fmt: skip
    wide = cli("-o", "wide", "reservations", "list", "--tenant", "acme").out
    assert rows(wide, res["id"])[0][:4] == [res["id"], pool_id, "active", "delivered"]


def test_d4_nodes_get_shows_the_owner_every_booking_and_d7_releasing(cli: Cli) -> None:
    """D4: the pool's owner sees acme's booking on its node in `nodes get`: the reservation id
    whole, the tenant, the GPUs by index, the CPUs, the memory and the delivery. D7: ended,
    the booking is `releasing` and counted in the ledger's RELEASING (within ALLOCATED) until
    the host reports it released."""
    cli("tenants", "create", "--tenant", "acme")
    pool_id = pool(cli, site(cli), "--gpu-model", "H100")
    offer(cli, pool_id, "gpu=4", "vcpu=16", "memoryGiB=128")
    node = join(cli, pool_id, host())
    res = reserve(cli, pool_id, "gpu=2", "vcpu=8", "memoryGiB=64")
    host_reports(cli, node, "delivered")
    placement = cli.ok_json("reservations", "get", res["id"], "--tenant", "acme")["placement"]
    indices = ",".join(str(g["index"]) for g in placement["gpus"])

    shown = cli("nodes", "get", node, "--tenant", "root").out
    assert rows(shown, "RESERVATION") == [
        ["RESERVATION", "TENANT", "DEVICES", "CPUS", "MEMORY", "DELIVERY"]
    ]
    assert rows(shown, res["id"]) == [
        [res["id"], "acme", "gpu", indices, placement["cpus"], "pinned", "64", "GiB", "delivered"]
    ]
    (booking,) = cli.ok_json("nodes", "get", node, "--tenant", "root")["bookings"]
    assert booking["reservationId"] == res["id"] and booking["tenantId"] == "acme"

    def gpu_row() -> list[str]:
        out = cli("pools", "capacity", pool_id, "--tenant", "root").out
        assert out.splitlines()[0].split() == [
            "RESOURCE", "TOTAL", "SCHEDULABLE", "ALLOCATED", "AVAILABLE", "RELEASING", "OFFERED",
            "COVERAGE",
        ]  # fmt: skip
        (row,) = rows(out, "gpu")
        return row

    assert gpu_row() == ["gpu", "8", "8", "2", "6", "0", "4", "2.00"]
    cli("reservations", "end", res["id"], "--tenant", "acme")
    assert gpu_row() == ["gpu", "8", "8", "2", "6", "2", "4", "2.00"]  # held until the host says
    assert rows(cli("nodes", "get", node, "--tenant", "root").out, res["id"])[0][-1] == (
        "releasing"
    )
    got = cli("reservations", "get", res["id"], "--tenant", "acme").out
    assert key_values(got)["delivery"].startswith("releasing (since ")

    host_reports(cli, node, "released")
    assert gpu_row() == ["gpu", "8", "8", "0", "8", "0", "4", "2.00"]
    assert rows(cli("nodes", "get", node, "--tenant", "root").out, res["id"]) == []
    assert "bookings" not in cli.ok_json("nodes", "get", node, "--tenant", "root")
    got = cli("reservations", "get", res["id"], "--tenant", "acme").out
    assert key_values(got)["delivery"].startswith("released (since ")


def test_d3_d4_shared_cpus_mig_instances_and_slots(cli: Cli) -> None:
    """D3: where the vCPUs are overcommitted they are a share: `share 800%` beside the CPUs
    near the GPUs. D4: a MIG booking lists its instances (GPU, UUID, profile) and a timeslice
    booking its slots (GPU, slot), in `reservations get` and in the owner's `nodes get`."""
    cli("tenants", "create", "--tenant", "acme")
    site_id = site(cli)
    policy = '{"overcommit": {"vcpu": 2}}'
    shared = pool(cli, site_id, "--gpu-model", "H100", "--policy", policy)
    offer(cli, shared, "gpu=4", "vcpu=16")
    join(cli, shared, host())
    res = reserve(cli, shared, "gpu=1", "vcpu=8")
    placement = res["placement"]
    assert placement["cpuQuota"] == 800 and placement["memoryNodes"] is None
    lines = key_values(cli("reservations", "get", res["id"], "--tenant", "acme").out)
    assert lines["cpus"] == f"{placement['cpus']} share 800%"
    assert lines["memory"] == "-" and lines["topology"].startswith("NUMA nodes ")  # one GPU

    mig = pool(
        cli, site_id, "--gpu-model", "A100", "--sharing", "mig", "--owner-quota", "gpu.mig=28"
    )
    offer(cli, mig, "gpu.mig=8")
    mig_node = join(cli, mig, twin("dgx-a100-02", next(MACHINES)))
    res = reserve(cli, mig, "gpu.mig=2", mig="1g.10gb")
    instances = res["placement"]["migInstances"]
    assert len(instances) == 2
    shown = cli("reservations", "get", res["id"], "--tenant", "acme").out
    assert rows(shown, "GPU") == [["GPU", "MIG", "PROFILE"]]
    for instance in instances:
        assert [str(instance["gpuIndex"]), instance["uuid"], "1g.10gb"] in [
            line.split() for line in shown.splitlines()
        ]
    (parent,) = {i["gpuIndex"] for i in instances}  # packed on one GPU (D2)
    (booking,) = rows(cli("nodes", "get", mig_node, "--tenant", "root").out, res["id"])
    assert booking == [
        res["id"], "acme", "2x", "1g.10gb", "on", "gpu", str(parent), "-", "-", "pending",
    ]  # fmt: skip

    slots = pool(
        cli, site_id, "--gpu-model", "L40S", "--sharing", "timeslice",
        "--policy", '{"replicas": 4}', "--owner-quota", "gpu.slot=16",
    )  # fmt: skip
    slot_node = join(cli, slots, twin("l40s-node-03", next(MACHINES)))
    # Timeslice pools are single-tenant (O4): the owner books its own slots.
    body = ("--tenant", "root", "--resource", "gpu.slot=2")
    res = cli.ok_json("reservations", "create", slots, *body)
    booked = res["placement"]["slots"]
    assert len(booked) == 2 and len({s["gpuIndex"] for s in booked}) == 1  # packed on one GPU
    shown = cli("reservations", "get", res["id"], "--tenant", "root").out
    assert rows(shown, "GPU") == [["GPU", "SLOT"]]
    assert [[str(s["gpuIndex"]), str(s["slot"])] for s in booked] == [
        line.split() for line in shown.splitlines()[-2:]
    ]
    numbers = ",".join(str(s["slot"]) for s in booked)
    (booking,) = rows(cli("nodes", "get", slot_node, "--tenant", "root").out, res["id"])
    assert booking[:2] == [res["id"], "root"]
    assert f"slots {numbers} on gpu {booked[0]['gpuIndex']}" in " ".join(booking)
