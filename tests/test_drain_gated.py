"""H4: drain-gated units, rendered with the GPUs they touch and held back by the agent while booked.

The renderer marks the units that repartition or reconfigure GPUs (the MIG apply, a
timeslice/mps sharing config, the MPS control daemon) ``needs: drain`` with their GPUs,
and lists the node's booked GPUs in the spec; the applier holds back such a unit while
one of its GPUs is booked ("waiting-drain", nothing recorded) and applies the rest.
"""

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agent.apply import Applier, Outcome
from agent.plan import describe, for_people
from shared.inventory import Inventory, MigInstance
from shared.nodespec import NodeSpecUnits, Unit
from shared.render import spec_version
from tests.test_render import host, spec_of

FIXTURES = Path(__file__).resolve().parent.parent / "agent" / "fixtures" / "host-fixtures.json"
A100_GPU4 = "GPU-d81497cc-a8c5-4a09-6bba-c647d8788415"  # MIG on: 3g.40gb, 2g.20gb, 1g.10gb ×2
A100_GPU5 = "GPU-62bda8cc-919d-7ce3-272e-7b8aa5da5524"  # MIG on: 1g.10gb ×7
A100_GPU6 = "GPU-a303c05c-1214-20c8-e0ed-a883f5566e76"  # MIG on: 4g.40gb + 3g.40gb
MIG_POLICY = {"migLayout": {"default": ["3g.40gb", "3g.40gb"], A100_GPU5: ["7g.80gb"]}}
DRAIN_IDS = {
    "mig": ["mig/apply"],
    "timeslice": ["sharing/device-plugin-config"],
    "mps": ["sharing/device-plugin-config", "sharing/mps-unit-file", "sharing/mps-service"],
}


def drain_units(spec: NodeSpecUnits) -> dict[str, list[str]]:
    return {unit.id: unit.gpus for unit in spec.units if unit.needs == "drain"}


def uuids(inventory: Inventory) -> list[str]:
    return sorted(gpu.uuid for gpu in inventory.gpus)


# --- the renderer ------------------------------------------------------------------------


def test_the_mig_apply_is_drain_gated_on_the_gpus_it_repartitions() -> None:
    """H4: on the recorded DGX A100 every GPU changes layout, so mig/apply names all eight."""
    a100 = host("dgx-a100-02")
    spec = spec_of(MIG_POLICY, a100, "mig")
    assert drain_units(spec) == {"mig/apply": uuids(a100)}
    assert spec.booked_gpus == []
    units = {unit.id: unit for unit in spec.units}
    # The layout file and the mixed-strategy plugin config touch no GPU: not gated.
    assert units["mig/layout-file"].needs == "nothing" and units["mig/layout-file"].gpus == []
    assert units["sharing/device-plugin-config"].needs == "restart"


def test_booked_gpus_are_not_in_the_mig_apply_and_are_listed_in_the_spec() -> None:
    """H4, U3: a booked GPU keeps its instances, so it is not among the GPUs mig/apply drains."""
    a100 = host("dgx-a100-02")
    spec = spec_of(MIG_POLICY, a100, "mig", frozenset([A100_GPU4]))
    assert spec.booked_gpus == [A100_GPU4]
    assert drain_units(spec) == {"mig/apply": [u for u in uuids(a100) if u != A100_GPU4]}
    two = spec_of(MIG_POLICY, a100, "mig", frozenset([A100_GPU5, A100_GPU4]))
    assert two.booked_gpus == sorted([A100_GPU4, A100_GPU5])  # sorted, whatever the order given
    assert A100_GPU4 not in two.units[1].gpus and A100_GPU5 not in two.units[1].gpus


def test_a_gpu_already_in_its_layout_is_not_drained() -> None:
    """H4: a GPU whose instances already are the layout's is not repartitioned: it stays placeable."""
    a100 = host("dgx-a100-02")
    spec = spec_of({"migLayout": {"default": ["4g.40gb", "3g.40gb"]}}, a100, "mig")
    assert drain_units(spec) == {"mig/apply": [u for u in uuids(a100) if u != A100_GPU6]}
    # Once the agent has applied it, the GPUs report the layout and nothing is held back.
    instances = [
        MigInstance(uuid=f"MIG-{n}", profile=p, gpu_instance_id=n, compute_instance_id=0)
        for n, p in enumerate(["4g.40gb", "3g.40gb"])
    ]
    done = msgspec.structs.replace(
        a100,
        gpus=[
            msgspec.structs.replace(g, mig_current=True, mig_pending=True, mig_instances=instances)
            for g in a100.gpus
        ],
    )
    after = spec_of({"migLayout": {"default": ["4g.40gb", "3g.40gb"]}}, done, "mig")
    assert drain_units(after) == {"mig/apply": []}
    # The same command with the same layout: the agent has nothing to run again.
    assert [u.argv for u in after.units] == [u.argv for u in spec.units]
    assert [u.content for u in after.units] == [u.content for u in spec.units]


def test_a_timeslice_sharing_config_is_drain_gated_on_every_gpu() -> None:
    """H4: the L40S time-slice config cuts every GPU into replicas slots: all four are its GPUs."""
    l40s = host("l40s-node-03")
    spec = spec_of({"replicas": 4}, l40s, "timeslice")
    assert drain_units(spec) == {"sharing/device-plugin-config": uuids(l40s)}
    booked = spec_of({"replicas": 4}, l40s, "timeslice", [uuids(l40s)[2]])
    assert booked.booked_gpus == [uuids(l40s)[2]]
    assert drain_units(booked) == drain_units(spec)  # sharing covers booked GPUs too
    assert booked.units == spec.units


def test_the_mps_daemon_and_its_sharing_config_are_drain_gated() -> None:
    """H4: MPS's plugin config, the control daemon's unit file and its service name every GPU."""
    l40s = host("l40s-node-03")
    spec = spec_of({"replicas": 8, "gpu": {"persistenceMode": True}}, l40s, "mps")
    assert drain_units(spec) == {unit: uuids(l40s) for unit in DRAIN_IDS["mps"]}
    assert {u.id: u.needs for u in spec.units}["gpu/persistence-mode"] == "nothing"


@pytest.mark.parametrize(
    ("host_name", "sharing", "policy"),
    [
        ("dgx-a100-02", "mig", MIG_POLICY),
        ("l40s-node-03", "timeslice", {"replicas": 4}),
        ("l40s-node-03", "mps", {"replicas": 8}),
        ("dgx-h100-01", "exclusive", {"gpu": {"persistenceMode": True, "powerLimitW": 650}}),
    ],
)
def test_only_gpu_sharing_units_are_drain_gated(
    host_name: str, sharing: str, policy: dict[str, Any]
) -> None:
    """H4: host units that are not about GPU sharing or MIG keep their needs and name no GPUs."""
    policy = {**policy, "hugepages": {"2Mi": 512}, "kernelModules": {"load": ["vfio_pci"]}}
    spec = spec_of(policy, host(host_name), sharing)
    assert sorted(drain_units(spec)) == sorted(DRAIN_IDS.get(sharing, []))
    assert all(unit.gpus == [] for unit in spec.units if unit.needs != "drain")


def test_the_version_moves_when_the_booked_gpus_move() -> None:
    """H4: the served spec moves when bookings move, though its units do not."""
    l40s = host("l40s-node-03")
    gpus = uuids(l40s)
    idle = spec_of({"replicas": 4}, l40s, "timeslice")
    one = spec_of({"replicas": 4}, l40s, "timeslice", gpus[:1])
    two = spec_of({"replicas": 4}, l40s, "timeslice", gpus[:2])
    assert idle.units == one.units == two.units
    assert len({idle.version, one.version, two.version}) == 3
    assert spec_of({"replicas": 4}, l40s, "timeslice", gpus[1::-1]).version == two.version
    assert one == spec_of({"replicas": 4}, l40s, "timeslice", gpus[:1])  # still deterministic
    # Without bookings the version is the units' hash alone, as before H4.
    assert idle.version == spec_version(idle.units)


# --- the applier -------------------------------------------------------------------------


class Tools:
    """The host's tools over a temporary root: every command succeeds and is written down."""

    def __init__(self) -> None:
        self.ran: list[list[str]] = []

    def run(self, argv: Sequence[str]) -> Outcome:
        self.ran.append(list(argv))
        return Outcome(0, "")


def applier(tmp_path: Path) -> tuple[Applier, Tools]:
    tools = Tools()
    return Applier(tmp_path / "root", tmp_path / "state", tools), tools


def recorded(tmp_path: Path) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((tmp_path / "state/applied.json").read_text())
    return found


def statuses(spec: NodeSpecUnits, apply: Applier) -> dict[str, str]:
    return {result.id: result.status for result in apply.apply(spec).units}


TIMESLICE = {"replicas": 4, "gpu": {"persistenceMode": True}, "hugepages": {"2Mi": 512}}


def test_a_drain_unit_touching_a_booked_gpu_waits_and_the_rest_is_applied(tmp_path: Path) -> None:
    """H4: the sharing config waits for its booked GPU, is not recorded, and the rest applies."""
    l40s = host("l40s-node-03")
    booked = uuids(l40s)[1]
    spec = spec_of(TIMESLICE, l40s, "timeslice", frozenset([booked]))
    apply, tools = applier(tmp_path)
    report = apply.apply(spec)
    result = {r.id: r for r in report.units}
    assert result["sharing/device-plugin-config"].status == "waiting-drain"
    assert result["sharing/device-plugin-config"].waiting_for == [booked]
    assert {r.id: r.status for r in report.units if r.id != "sharing/device-plugin-config"} == {
        "gpu/persistence-mode": "applied",
        "hugepages/sysctl-file": "applied",
        "hugepages/sysctl": "applied",
    }
    assert not (tmp_path / "root/etc/nvidia-device-plugin/config.yaml").exists()
    assert "sharing/device-plugin-config" not in recorded(tmp_path)
    assert ["nvidia-smi", "-pm", "1"] in tools.ran
    # What the control plane receives: the status and the booked GPUs it waits for.
    assert {
        "id": "sharing/device-plugin-config",
        "status": "waiting-drain",
        "waitingFor": [booked],
    } in (msgspec.to_builtins(report)["units"])
    # Still booked on the next cycle: still waiting.
    assert statuses(spec, apply)["sharing/device-plugin-config"] == "waiting-drain"


def test_a_waiting_unit_is_applied_on_the_next_spec_whose_gpus_are_idle(tmp_path: Path) -> None:
    """H4: once the booking ends, the new spec (booked_gpus empty) applies and records it."""
    l40s = host("l40s-node-03")
    apply, _ = applier(tmp_path)
    apply.apply(spec_of(TIMESLICE, l40s, "timeslice", uuids(l40s)[:1]))
    idle = spec_of(TIMESLICE, l40s, "timeslice")
    got = statuses(idle, apply)
    assert got["sharing/device-plugin-config"] == "applied"
    assert got["gpu/persistence-mode"] == "unchanged"
    assert "replicas: 4" in (tmp_path / "root/etc/nvidia-device-plugin/config.yaml").read_text()
    assert "sharing/device-plugin-config" in recorded(tmp_path)


def test_a_drain_unit_already_in_effect_is_unchanged_while_booked(tmp_path: Path) -> None:
    """H4: bookings never hold back what is already done: an applied config stays unchanged."""
    l40s = host("l40s-node-03")
    apply, tools = applier(tmp_path)
    mps = {"replicas": 8}
    statuses(spec_of(mps, l40s, "mps"), apply)
    tools.ran.clear()
    busy = spec_of(mps, l40s, "mps", uuids(l40s))
    assert set(statuses(busy, apply).values()) == {"unchanged"}
    assert tools.ran == []


def test_a_new_replicas_waits_and_keeps_the_mps_daemon_running(tmp_path: Path) -> None:
    """H4: a replicas change on a booked MPS host rewrites nothing and restarts no daemon."""
    l40s = host("l40s-node-03")
    apply, tools = applier(tmp_path)
    statuses(spec_of({"replicas": 8}, l40s, "mps"), apply)
    before = recorded(tmp_path)
    unit_file = tmp_path / "root/etc/systemd/system/better-compute-mps-control.service"
    old_text = unit_file.read_text()
    tools.ran.clear()
    busy = spec_of({"replicas": 4}, l40s, "mps", uuids(l40s)[3:])
    assert {k: v for k, v in statuses(busy, apply).items()} == dict.fromkeys(
        DRAIN_IDS["mps"], "waiting-drain"
    )
    assert tools.ran == [] and unit_file.read_text() == old_text
    assert recorded(tmp_path) == before  # what the host still runs stays recorded
    idle = spec_of({"replicas": 4}, l40s, "mps")
    assert set(statuses(idle, apply).values()) == {"applied"}
    assert ["systemctl", "restart", "better-compute-mps-control.service"] in tools.ran
    assert "(4 clients per GPU)" in unit_file.read_text()


MIG_UNIT = Unit(
    id="mig/apply",
    kind="command",
    argv=["nvidia-mig-parted", "apply", "-f", "/etc/x.yaml", "-c", "better-compute"],
    content="layout sha256:00",
    needs="drain",
    gpus=["GPU-a", "GPU-b"],
)
OTHER = Unit(id="images/pull", kind="command", argv=["crictl", "pull", "busybox:1.36"])


def test_a_mig_apply_touching_a_booked_gpu_waits(tmp_path: Path) -> None:
    """H4, U3: a booked GPU is never repartitioned: the MIG apply waits, records nothing, then runs."""
    apply, tools = applier(tmp_path)
    busy = NodeSpecUnits(version="1", units=[MIG_UNIT, OTHER], reboot=False, booked_gpus=["GPU-b"])
    assert statuses(busy, apply) == {"mig/apply": "waiting-drain", "images/pull": "applied"}
    assert tools.ran == [OTHER.argv]
    assert set(recorded(tmp_path)) == {"images/pull"}
    idle = NodeSpecUnits(version="2", units=[MIG_UNIT, OTHER], reboot=False, booked_gpus=["GPU-c"])
    assert statuses(idle, apply) == {"mig/apply": "applied", "images/pull": "unchanged"}
    assert tools.ran[-1] == MIG_UNIT.argv
    assert set(recorded(tmp_path)) == {"images/pull", "mig/apply"}


def test_the_rendered_mig_apply_runs_beside_a_booked_gpu(tmp_path: Path) -> None:
    """H4, U3: the render keeps a booked GPU out of mig/apply, so the others are repartitioned now."""
    spec = spec_of(MIG_POLICY, host("dgx-a100-02"), "mig", [A100_GPU4])
    apply, tools = applier(tmp_path)
    assert statuses(spec, apply)["mig/apply"] == "applied"
    assert tools.ran[-1][:2] == ["nvidia-mig-parted", "apply"]


def test_a_drain_unit_whose_gpus_move_only_is_not_run_again(tmp_path: Path) -> None:
    """H4: which GPUs wait for a unit is not what it does: a MIG apply whose gpus shrink stays done."""
    apply, tools = applier(tmp_path)
    statuses(NodeSpecUnits(version="1", units=[MIG_UNIT], reboot=False), apply)
    fewer = msgspec.structs.replace(MIG_UNIT, gpus=["GPU-a"])
    assert statuses(NodeSpecUnits(version="2", units=[fewer], reboot=False), apply) == {
        "mig/apply": "unchanged"
    }
    assert tools.ran == [MIG_UNIT.argv]


def test_undoing_a_drain_unit_waits_for_its_gpus_too(tmp_path: Path) -> None:
    """H4: a drain unit that left the spec is not undone on a booked GPU; it goes once idle."""
    apply, _ = applier(tmp_path)
    config = Unit(
        id="sharing/device-plugin-config",
        kind="file",
        path="/etc/nvidia-device-plugin/config.yaml",
        content="x\n",
        needs="drain",
        gpus=["GPU-a"],
    )
    statuses(NodeSpecUnits(version="1", units=[config, OTHER], reboot=False), apply)
    busy = NodeSpecUnits(version="2", units=[OTHER], reboot=False, booked_gpus=["GPU-a"])
    assert statuses(busy, apply) == {
        "images/pull": "unchanged",
        "sharing/device-plugin-config": "waiting-drain",
    }
    assert (tmp_path / "root/etc/nvidia-device-plugin/config.yaml").exists()
    idle = NodeSpecUnits(version="3", units=[OTHER], reboot=False)
    assert statuses(idle, apply)["sharing/device-plugin-config"] == "applied"
    assert not (tmp_path / "root/etc/nvidia-device-plugin/config.yaml").exists()


# --- the local plan -----------------------------------------------------------------------


def test_the_plan_shows_drain_units_with_their_gpus() -> None:
    """H4: the local render plan lists each drain-gated unit, its GPUs, and which are booked."""
    a100 = host("dgx-a100-02")
    plan = describe(spec_of(MIG_POLICY, a100, "mig", frozenset([A100_GPU4])))
    assert plan["bookedGpus"] == [A100_GPU4]
    assert plan["drain"] == [
        {"id": "mig/apply", "gpus": [u for u in uuids(a100) if u != A100_GPU4], "booked": []}
    ]
    l40s = host("l40s-node-03")
    busy = describe(spec_of({"replicas": 4}, l40s, "timeslice", uuids(l40s)[:1]))
    assert busy["drain"][0]["booked"] == uuids(l40s)[:1]
    text = for_people(busy)
    assert "drain-gated units" in text and "sharing/device-plugin-config: 4 GPUs" in text
    assert f"{uuids(l40s)[0]}  (booked: waits)" in text


def test_a_record_from_before_drain_gating_still_reads_as_applied(tmp_path: Path) -> None:
    """H4: units without GPUs keep the key an older agent recorded, so nothing runs again."""
    apply, tools = applier(tmp_path)
    (tmp_path / "state").mkdir()
    old_key = hashlib.sha256(msgspec.json.encode(OTHER)).hexdigest()
    (tmp_path / "state/applied.json").write_text(
        json.dumps({OTHER.id: {"kind": "command", "key": old_key}})
    )
    assert statuses(NodeSpecUnits(version="1", units=[OTHER], reboot=False), apply) == {
        "images/pull": "unchanged"
    }
    assert tools.ran == []
