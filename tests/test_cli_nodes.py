"""`better-compute nodes …` and the capacity ledger as a subprocess against the real daemon:
the owner's verbs (H3), the fleet view (H7), node state and GPU health (H1, H5) and the
ledger's columns (H6)."""

import itertools
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from shared.client import ControlPlane
from shared.inventory import Inventory
from tests.daemons import Daemon
from tests.nodes import twin
from tests.test_cli import Cli, root_cli, table_id

MACHINES = itertools.count(10)  # each joined host its own machine id, hostname and GPU UUIDs


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    """A fresh control plane per test, so root's fleet is what the test built; the reconciler
    runs twice a second so a drain moves on without waiting 30 s."""
    (tmp_path / "daemon").mkdir()
    running = Daemon(tmp_path / "daemon", "--reconcile-interval", "0.5")
    running.start()
    yield root_cli(running, tmp_path)
    running.kill()


def site(cli: Cli) -> str:
    answer = cli.ok_json(
        "sites", "create", "--tenant", "root", "--name", "fra1", "--region", "eu", "--kind", "shared",
    )  # fmt: skip
    return str(answer["id"])


def pool(cli: Cli, site_id: str) -> str:
    answer = cli.ok_json(
        "pools", "create", "--tenant", "root", "--site", site_id, "--class", "metal-host",
        "--gpu-model", "H100",
    )  # fmt: skip
    return str(answer["id"])


def host(unhealthy: int = 0) -> Inventory:
    """A recorded DGX H100 twin; the first `unhealthy` GPUs report a critical XID (H5)."""
    base = twin("dgx-h100-01", next(MACHINES))
    gpus = [
        msgspec.structs.replace(g, health="unhealthy", health_reasons=["xid:79"])
        if g.index < unhealthy
        else g
        for g in base.gpus
    ]
    return msgspec.structs.replace(base, gpus=gpus)


# What each node joined here answered and reported: its credential and inventory.
JOINED: dict[str, tuple[dict[str, Any], Inventory]] = {}


def host_reports(cli: Cli, node_id: str, state: str) -> None:
    """The node's agent, with its own credential, reports every booking of its spec that
    ``state`` is the outcome of: live ones ``delivered`` (D6), ended ones ``released`` (D7)."""
    of = {"delivered": "live", "released": "release"}[state]
    node, inventory = JOINED[node_id]
    with ControlPlane(cli.env["BETTER_COMPUTE_URL"]) as plane:
        spec = plane.spec(node["token"], node["nodeId"])
        done = [
            {"reservationId": b["reservationId"], "state": state}
            for b in spec["bookings"]
            if b["state"] == of
        ]
        plane.report(node["token"], node["nodeId"], inventory, bookings=done)


def join(cli: Cli, pool_id: str, inventory: Inventory, apply: bool = True) -> str:
    """Join through the shared client as the agent does; with `apply`, report the NodeSpec
    applied as the agent's first cycle does, so the node is ready (H1)."""
    token = cli.ok_json("join-tokens", "create", pool_id, "--tenant", "root")["token"]
    with ControlPlane(cli.env["BETTER_COMPUTE_URL"]) as plane:
        node = plane.join(token, inventory.hostname, inventory)
        JOINED[node["nodeId"]] = (node, inventory)
        if apply:
            spec = plane.spec(node["token"], node["nodeId"])
            units = [{"id": u["id"], "status": "applied"} for u in spec["units"]]
            applied = {"version": spec["version"], "units": units}
            plane.report(node["token"], node["nodeId"], inventory, applied)
    return str(node["nodeId"])


def ready_node(cli: Cli, unhealthy: int = 0) -> tuple[str, str]:
    """A pool of root's with one ready DGX in it: (poolId, nodeId)."""
    pool_id = pool(cli, site(cli))
    return pool_id, join(cli, pool_id, host(unhealthy))


def node_lines(out: str, node: str) -> list[str]:
    """The table's lines for the node (M4: a table shows a row's own id whole)."""
    return [line for line in out.splitlines() if line.startswith(f"{node}  ")]


def events(cli: Cli, kind: str) -> list[Any]:
    return list(cli.ok_json("events", "list", "--tenant", "root", "--type", kind)["items"])


def seconds(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def test_cordon_and_uncordon_are_idempotent(cli: Cli) -> None:
    """H3: cordon makes the node unschedulable with its reason; again changes nothing; uncordon
    undoes it, once."""
    _, node = ready_node(cli)
    shown = cli("nodes", "cordon", node, "--tenant", "root", "--reason", "swap PSU").out
    assert "schedulable:     no" in shown and "cordon:          swap PSU (since " in shown
    first = cli.ok_json("nodes", "cordon", node, "--tenant", "root", "--reason", "swap PSU")
    assert first["schedulable"] is False and first["cordon"]["reason"] == "swap PSU"
    again = cli.ok_json("nodes", "cordon", node, "--tenant", "root", "--reason", "swap PSU")
    assert again["cordon"] == first["cordon"]  # unchanged, down to `at`
    assert len(events(cli, "node.cordoned")) == 1
    (row,) = node_lines(cli("nodes", "list", "--tenant", "root").out, node)
    assert row.split()[-3:] == ["cordoned:", "swap", "PSU"] and " ready " in row

    shown = cli("nodes", "uncordon", node, "--tenant", "root").out
    assert "schedulable:     yes" in shown and "cordon:          -" in shown
    view = cli.ok_json("nodes", "uncordon", node, "--tenant", "root")
    assert view["schedulable"] is True and view["cordon"] is None
    assert len(events(cli, "node.uncordoned")) == 1
    (row,) = node_lines(cli("nodes", "list", "--tenant", "root").out, node)
    assert row.split()[-1] == "-"  # no reason left


def test_drain_waits_for_bookings_then_is_drained(cli: Cli) -> None:
    """H3: drain cordons and waits while a booking is placed (the deadline as given), drained
    once it ends and its host releases it (D7); draining again changes nothing; uncordon undoes the drain."""
    pool_id, node = ready_node(cli)
    res = cli.ok_json("reservations", "create", pool_id, "--tenant", "root", "--resource", "gpu=1")
    assert res["state"] == "placed" and res["nodeId"] == node
    drain = ("nodes", "drain", node, "--tenant", "root", "--reason", "firmware")
    view = cli.ok_json(*drain, "--deadline", "2h")
    assert view["drain"]["state"] == "draining" and view["schedulable"] is False
    assert seconds(view["drain"]["startedAt"], view["drain"]["deadline"]) == 7200
    assert cli.ok_json(*drain, "--deadline", "90s")["drain"] == view["drain"]  # idempotent
    assert len(events(cli, "node.draining")) == 1
    (row,) = node_lines(cli("nodes", "list", pool_id, "--tenant", "root").out, node)
    assert row.split()[-2:] == ["draining:", "firmware"]
    assert "drain:           draining: firmware (since " in cli(*drain).out

    cli("reservations", "end", res["id"], "--tenant", "root")
    host_reports(cli, node, "released")
    for _ in range(100):  # the reconciler's next pass sees nothing booked
        shown = cli.ok_json("nodes", "get", node, "--tenant", "root")
        if shown["drain"]["state"] == "drained":
            break
        time.sleep(0.1)
    assert shown["drain"]["state"] == "drained" and len(events(cli, "node.drained")) == 1
    (row,) = node_lines(cli("nodes", "list", "--tenant", "root").out, node)
    assert row.split()[-2:] == ["drained:", "firmware"]
    assert cli.ok_json("nodes", "uncordon", node, "--tenant", "root")["drain"] is None


def test_drain_deadline_forms(cli: Cli) -> None:
    """H3: --deadline takes seconds or 90s/30m/2h/1d; anything else, or over 30 days, is a
    usage error (exit 2) before any request; an idle node is drained at once."""
    _, node = ready_node(cli)
    drain = ("nodes", "drain", node, "--tenant", "root", "--reason", "r")
    for bad in ("soon", "30x", "-5", "31d"):
        assert "--deadline" in cli(*drain, "--deadline", bad, code=2).err
    view = cli.ok_json(*drain, "--deadline", "1h30m")
    assert view["drain"]["state"] == "drained"  # nothing was booked on it
    assert seconds(view["drain"]["startedAt"], view["drain"]["deadline"]) == 5400
    cli("nodes", "uncordon", node, "--tenant", "root")
    plain = cli.ok_json(*drain, "--deadline", "45")
    assert seconds(plain["drain"]["startedAt"], plain["drain"]["deadline"]) == 45
    cli("nodes", "uncordon", node, "--tenant", "root")
    assert cli.ok_json(*drain)["drain"]["deadline"] is None


def test_remove_is_refused_while_booked_unless_forced(cli: Cli) -> None:
    """H3: remove is INVALID_STATE (exit 1) while a reservation is placed on the node; --force
    ends it with NodeRemoved and removes the node; removing again answers the same."""
    pool_id, node = ready_node(cli)
    res = cli.ok_json("reservations", "create", pool_id, "--tenant", "root", "--resource", "gpu=2")
    assert res["nodeId"] == node
    refused = cli("nodes", "remove", node, "--tenant", "root", code=1)
    assert refused.err.startswith("error: INVALID_STATE: ") and "force" in refused.err
    assert refused.out == ""
    assert cli.ok_json("reservations", "get", res["id"], "--tenant", "root")["state"] == "placed"

    assert cli("nodes", "remove", node, "--tenant", "root", "--force").out.split() == [
        "removed:", "True",
    ]  # fmt: skip
    ended = cli.ok_json("reservations", "get", res["id"], "--tenant", "root")
    assert ended["state"] == "ended" and ended["reason"] == "NodeRemoved"
    assert cli.ok_json("nodes", "remove", node, "--tenant", "root") == {"removed": True}
    assert cli("nodes", "get", node, "--tenant", "root", code=1).err.startswith("error: NOT_FOUND")
    assert node not in cli("nodes", "list", pool_id, "--tenant", "root").out
    assert [e["data"]["nodeId"] for e in events(cli, "node.removed")] == [node]


def test_remove_an_idle_node(cli: Cli) -> None:
    """H3: a node with nothing booked is removed without --force."""
    pool_id, node = ready_node(cli)
    assert cli.ok_json("nodes", "remove", node, "--tenant", "root")["removed"] is True
    assert cli.ok_json("nodes", "list", pool_id, "--tenant", "root")["items"] == []


def test_fleet_list_across_two_pools(cli: Cli) -> None:
    """H7: without POOL_ID every node of every pool the tenant owns, with a POOL column; the
    CLI follows `next` to the end; --state filters; POOL_ID lists one pool."""
    site_id = site(cli)
    first, second = pool(cli, site_id), pool(cli, site_id)
    a = join(cli, first, host())
    b = join(cli, second, host(unhealthy=1))
    c = join(cli, second, host(), apply=False)  # joined, spec not applied yet: configuring

    out = cli("nodes", "list", "--tenant", "root", "--page-size", "1").out.splitlines()
    assert out[0].split() == ["ID", "POOL", "HOSTNAME", "STATE", "GPUS", "REASON"]
    assert sorted(line.split()[0] for line in out[1:]) == sorted([a, b, c])  # whole
    row = {node: line.split() for node in (a, b, c) for line in node_lines("\n".join(out), node)}
    assert row[a][1:5] == [table_id(first), row[a][2], "ready", "8x"]  # the pool's tail
    assert row[a][2] != row[b][2] and row[a][5:] == ["H100", "-"]
    assert row[b][1] == table_id(second) and row[b][3:] == [
        "ready", "8x", "H100", "(1", "unhealthy)", "-",
    ]  # fmt: skip
    assert row[c][3] == "configuring" and row[c][-1].endswith("…")  # H1's reason, cut

    every = cli.ok_json("nodes", "list", "--tenant", "root", "--page-size", "2")
    assert sorted(n["id"] for n in every["items"]) == sorted([a, b, c]) and every["next"] is None
    ready = cli.ok_json("nodes", "list", "--tenant", "root", "--state", "ready")["items"]
    assert sorted(n["id"] for n in ready) == sorted([a, b])
    both = ("--state", "configuring", "--state", "lost")
    waiting = cli.ok_json("nodes", "list", "--tenant", "root", *both)["items"]
    assert [n["id"] for n in waiting] == [c]

    one = cli("nodes", "list", second, "--tenant", "root").out.splitlines()
    assert one[0].split() == ["ID", "HOSTNAME", "STATE", "GPUS", "REASON"]
    assert sorted(line.split()[0] for line in one[1:]) == sorted([b, c])
    cli("nodes", "list", "--tenant", "root", "--state", "gone", code=2)


def test_long_reasons_are_cut_to_fit(cli: Cli) -> None:
    """H3: a long cordon reason is cut with … in the list so the table stays within 100
    columns; `nodes get` and --json carry it whole."""
    pool_id, node = ready_node(cli)
    reason = "swap the PSU in rack 12 before the weekend maintenance window closes"
    cli("nodes", "cordon", node, "--tenant", "root", "--reason", reason)
    out = cli("nodes", "list", pool_id, "--tenant", "root").out.splitlines()
    assert all(len(line) <= 100 for line in out) and out[1].endswith("…")
    assert out[1].split("cordoned: ")[1][:-1] in reason
    assert f"cordon:          {reason} (since " in cli("nodes", "get", node, "--tenant", "root").out


def test_get_shows_lifecycle_and_gpu_health(cli: Cli) -> None:
    """H1, H5: `nodes get` shows state, reason, schedulable, cordon, drain, pending reboot,
    applied against spec version, and each GPU's health with its reason."""
    pool_id, node = ready_node(cli, unhealthy=1)
    shown = cli("nodes", "get", node, "--tenant", "root").out
    view = cli.ok_json("nodes", "get", node, "--tenant", "root")
    for line in (
        "state:           ready",
        "reason:          -",
        "schedulable:     yes",
        "cordon:          -",
        "drain:           -",
        "pending reboot:  no",
        f"spec version:    {view['specVersion'][:12]} (applied)",
    ):
        assert line in shown.splitlines(), (line, shown)
    lines = shown.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("GPU ")))
    gpus = {line.split()[0]: line.split() for line in lines[start : start + 9]}
    assert gpus["GPU"] == ["GPU", "NAME", "MEMORY", "HEALTH", "REASON"]
    assert gpus["0"][-2:] == ["unhealthy", "xid:79"] and gpus["1"][-2:] == ["healthy", "-"]
    (atoms,) = [line.split() for line in shown.splitlines() if line.startswith("gpu ")]
    assert atoms == ["gpu", "8", "0", "-", "1", "0"]  # 8 atoms, 1 on the unhealthy GPU

    waiting = join(cli, pool_id, host(), apply=False)
    shown = cli("nodes", "get", waiting, "--tenant", "root").out
    assert "state:           configuring" in shown and "(applied: none yet)" in shown
    assert "schedulable:     no" in shown


def test_capacity_ledger_columns_with_an_offer(cli: Cli) -> None:
    """H6: pools capacity and capacity show TOTAL SCHEDULABLE ALLOCATED AVAILABLE OFFERED;
    OFFERED is the quota sold to other tenants, for the owner only."""
    cli("tenants", "create", "--tenant", "acme")
    pool_id, node = ready_node(cli, unhealthy=1)
    offer = ("--tenant", "root", "--to", "acme", "--quota", "gpu=3", "--quota", "vcpu=16")
    cli("pools", "offer", pool_id, *offer)
    cli("reservations", "create", pool_id, "--tenant", "acme", "--resource", "gpu=2")

    def gpu_row(command: str, tenant: str) -> list[str]:
        out = cli(*command.split(), pool_id, "--tenant", tenant).out.splitlines()
        assert out[0].split() == [
            "RESOURCE", "TOTAL", "SCHEDULABLE", "ALLOCATED", "AVAILABLE", "RELEASING", "OFFERED",
            "COVERAGE",
        ]  # fmt: skip
        (row,) = [line.split() for line in out if line.startswith("gpu ")]
        return row

    # 8 GPUs, one unhealthy: 7 schedulable, 2 booked by acme, 5 left; acme bought 3.
    assert gpu_row("pools capacity", "root") == ["gpu", "8", "7", "2", "5", "0", "3", "2.33"]
    assert gpu_row("capacity", "root") == ["gpu", "8", "7", "2", "5", "0", "3", "2.33"]
    vcpu = cli.ok_json("capacity", pool_id, "--tenant", "root")["items"]
    assert {r["resource"]: r["offered"] for r in vcpu}["vcpu"] == 16
    # The offered tenant sees the same rows without OFFERED.
    assert gpu_row("pools capacity", "acme") == ["gpu", "8", "7", "2", "5", "0", "-", "-"]
    rows = cli.ok_json("pools", "capacity", pool_id, "--tenant", "acme")["items"]
    assert rows and all("offered" not in r for r in rows)

    cli("nodes", "cordon", node, "--tenant", "root", "--reason", "maintenance")
    assert gpu_row("capacity", "root") == ["gpu", "8", "0", "2", "0", "0", "3", "0.00"]
