"""The NodeSpec renderer: golden renders of recorded hosts, determinism, refusals, U3.

Golden files in tests/golden/ are the reviewable text of each render, and of the
plan `better-compute-agent render` prints for it (units in apply order, with the
files and commands each runs) against a host that has none of the files yet. When
a render or the plan changes on purpose, regenerate them and review the diff:

    python -m tests.test_render

(``python -m tests.test_render --golden-only`` leaves the shipped recorded-hosts.json
alone and rewrites only the golden files.)
"""

import difflib
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agent.inventory import collect_inventory
from agent.plan import Host, describe, for_people
from shared.inventory import Cpu, Inventory
from shared.mig import VARIANTS
from shared.nodespec import NodeSpecUnits, RenderRefused
from shared.policy import parse_policy
from shared.render import render, representative, representative_inventories
from shared.render.representative import MODELS

FIXTURES = Path(__file__).resolve().parent.parent / "agent" / "fixtures" / "host-fixtures.json"
GOLDEN = Path(__file__).resolve().parent / "golden"
RECORDED = ("dgx-h100-01", "hgx-h200-01", "dgx-a100-02", "l40s-node-03", "ws-rtx4090", "vps-cpu-01")
A100_GPU4 = "GPU-d81497cc-a8c5-4a09-6bba-c647d8788415"  # MIG on: 3g.40gb, 2g.20gb, 1g.10gb ×2
A100_GPU5 = "GPU-62bda8cc-919d-7ce3-272e-7b8aa5da5524"  # MIG on: 1g.10gb ×7
BOOTED = ("BOOT_IMAGE=/vmlinuz", "ro", "quiet")  # the golden plans' /proc/cmdline
KUBERNETES = {
    "apiServer": "https://k8s.gpu.example.net/",
    "token": "abcdef.0123456789abcdef",
    "caCertHash": "sha256:" + "7c" * 32,
}


def host(name: str) -> Inventory:
    return collect_inventory(fixture=FIXTURES, fixture_host=name)


def spec_of(
    policy: dict[str, Any],
    inventory: Inventory,
    sharing: str = "exclusive",
    booked: frozenset[str] = frozenset(),
    host_size_checks: bool = True,
) -> NodeSpecUnits:
    families = sorted({g.family for g in inventory.gpus if g.family})
    return render(
        parse_policy(policy),
        sharing=sharing,
        gpu_model=families[0] if families else None,
        inventory=inventory,
        booked_gpus=booked,
        host_size_checks=host_size_checks,
    )


# --- golden renders ----------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    host: str
    name: str
    sharing: str
    policy: dict[str, Any]
    booked: frozenset[str] = frozenset()

    @property
    def path(self) -> Path:
        return GOLDEN / f"{self.host}--{self.name}.txt"


CASES = (
    Case(
        "dgx-h100-01",
        "full-host",
        "exclusive",
        {
            "hostReserve": {"vcpu": 8, "memoryGiB": 64},
            "hugepages": {"2Mi": 8192},
            "kernelModules": {
                "load": ["vfio_pci", "nvidia_peermem"],
                "blacklist": ["nouveau"],
                "options": {"nouveau": "modeset=0", "nvidia": "NVreg_EnableStreamMemOPs=1"},
            },
            "cpu": {"governor": "performance", "isolate": "8-111,120-223"},
            "iommu": {"mode": "passthrough"},
            "gpu": {
                "persistenceMode": True,
                "computeMode": "exclusive-process",
                "powerLimitW": 650,
            },
            "kubernetes": KUBERNETES,
            "platformOperated": True,
            "prewarmImages": ["nvcr.io/nvidia/pytorch:24.08-py3"],
            "maxPending": "6h",
            "team": "research",  # unknown fields are stored (P9) and render nothing
        },
    ),
    Case("hgx-h200-01", "hugepages-1gi", "exclusive", {"hugepages": {"1Gi": 512}}),
    Case(
        "dgx-a100-02",
        "mig-layout-booked",
        "mig",
        {"migLayout": {"default": ["3g.40gb", "3g.40gb"], A100_GPU5: ["7g.80gb"]}},
        booked=frozenset({A100_GPU4}),
    ),
    Case("l40s-node-03", "timeslice-4", "timeslice", {"replicas": 4}),
    Case("l40s-node-03", "mps-8", "mps", {"replicas": 8, "gpu": {"persistenceMode": True}}),
    Case(
        "vps-cpu-01",
        "iommu-hugepages-2mi",
        "exclusive",
        {"iommu": {"mode": "passthrough"}, "hugepages": {"2Mi": 1024}},
    ),
)


def golden_text(case: Case) -> str:
    """The render of a case as a person reviews it: the plan, then each unit in full."""
    spec = spec_of(case.policy, host(case.host), case.sharing, case.booked)
    lines = [
        f"# {case.host} × {case.name} (sharing: {case.sharing})",
        f"# policy: {json.dumps(case.policy, sort_keys=True)}",
    ]
    if case.booked:
        lines.append(f"# booked GPUs: {', '.join(sorted(case.booked))}")
    lines += [
        "# regenerate with: python -m tests.test_render",
        f"version: {spec.version}",
        f"reboot: {str(spec.reboot).lower()}",
    ]
    if spec.booked_gpus:
        lines.append(f"booked gpus: {', '.join(spec.booked_gpus)}")
    lines.append(f"units: {len(spec.units)}")
    for number, unit in enumerate(spec.units, 1):
        lines += ["", f"== {number}. {unit.id} ==", f"kind: {unit.kind}", f"needs: {unit.needs}"]
        if unit.path is not None:
            lines += [f"path: {unit.path}", f"mode: {unit.mode:04o}"]
        if unit.argv:
            lines.append(f"argv: {shlex.join(unit.argv)}")
        if unit.every_boot:
            lines.append("every boot: yes")
        if unit.restarts:
            lines.append(f"restarts: {', '.join(unit.restarts)}")
        if unit.needs == "drain":  # H4: the GPUs it waits for, one a line
            lines.append(f"gpus: {len(unit.gpus)}")
            lines += [f"  - {uuid}" for uuid in unit.gpus]
        if unit.kind == "file":
            lines.append("content:")
            lines += [f"  | {line}".rstrip() for line in unit.content.splitlines()]
        elif unit.content:
            lines.append(f"content: {unit.content}")
    plan = describe(spec, Host(root="/", cmdline=BOOTED, inventory=host(case.host)))
    lines += ["", f"== the plan, on a host without these files booted with: {' '.join(BOOTED)} =="]
    lines += for_people(plan).splitlines()
    return "\n".join(lines) + "\n"


def regenerate(recorded_hosts: bool = True) -> None:
    if recorded_hosts:
        hosts = [msgspec.to_builtins(host(name)) for name in RECORDED]
        path = Path(representative.__file__).with_name(representative.RECORDED_HOSTS)
        path.write_text(json.dumps(hosts, indent=1) + "\n")
        print(f"wrote {path}")
    GOLDEN.mkdir(exist_ok=True)
    for case in CASES:
        case.path.write_text(golden_text(case))
        print(f"wrote {case.path}")


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.host}--{c.name}")
def test_golden_render(case: Case) -> None:
    """N6: each recorded host × policy renders exactly its reviewed golden file."""
    got = golden_text(case)
    want = case.path.read_text() if case.path.exists() else ""
    if got != want:
        diff = "".join(
            difflib.unified_diff(
                want.splitlines(keepends=True),
                got.splitlines(keepends=True),
                str(case.path),
                "rendered now",
            )
        )
        pytest.fail(
            f"{case.path.name} differs from the render; if the change is intended, run "
            f"`python -m tests.test_render` and review the diff:\n{diff}",
            pytrace=False,
        )


# --- determinism and the version -------------------------------------------------------


FULL = CASES[0].policy


def test_rendering_twice_gives_byte_identical_specs() -> None:
    """N6: the same input renders the same units and the same version."""
    first = spec_of(FULL, host("dgx-h100-01"))
    second = spec_of(json.loads(json.dumps(FULL)), host("dgx-h100-01"))
    assert msgspec.json.encode(first) == msgspec.json.encode(second)


def test_the_version_moves_with_what_a_host_must_do() -> None:
    """N6: a changed host field moves the version; fields that render no unit do not."""
    inventory = host("dgx-h100-01")
    base = spec_of(FULL, inventory).version
    assert spec_of({**FULL, "hugepages": {"2Mi": 4096}}, inventory).version != base
    assert spec_of({**FULL, "prewarmImages": ["busybox:1.36"]}, inventory).version != base
    for unrendered in (
        {"maxPending": "1h"},
        {"singleTenant": True},
        {"overcommit": {"vcpu": 2}},
        {"team": "platform"},
    ):
        assert spec_of({**FULL, **unrendered}, inventory).version == base, unrendered


def test_the_version_ignores_inventory_facts_no_unit_reads() -> None:
    """N6: a GPU warming up or a page being used is not a new spec."""
    inventory = host("dgx-h100-01")
    warmer = msgspec.structs.replace(
        inventory,
        gpus=[msgspec.structs.replace(g, temperature_c=80) for g in inventory.gpus],
    )
    assert spec_of(FULL, warmer).version == spec_of(FULL, inventory).version


def test_option_order_in_the_policy_does_not_move_the_version() -> None:
    """N6: module options are a set: their order in the policy is not a change."""
    options = {"nouveau": "modeset=0", "nvidia": "NVreg_EnableStreamMemOPs=1"}
    flipped = dict(reversed(options.items()))
    inventory = host("vps-cpu-01")
    assert (
        spec_of({"kernelModules": {"options": options}}, inventory).version
        == spec_of({"kernelModules": {"options": flipped}}, inventory).version
    )


def test_an_empty_policy_renders_nothing() -> None:
    """N6: no host fields, no units, no reboot."""
    spec = spec_of({}, host("dgx-h100-01"))
    assert spec.units == [] and spec.reboot is False


# --- refusals --------------------------------------------------------------------


def unknown_cpu(inventory: Inventory) -> Inventory:
    cpu = Cpu(sockets=1, logical_cpus=inventory.cpu.logical_cpus, model="Neoverse-V2")
    return msgspec.structs.replace(inventory, cpu=cpu)


# (id, host, sharing, policy, field, words in the reason)
REFUSALS: tuple[tuple[str, str, str, dict[str, Any], str, str], ...] = (
    (
        "hugepages-beyond-memory",
        "vps-cpu-01",
        "exclusive",
        {"hugepages": {"2Mi": 3584}},
        "hugepages",
        "do not fit",
    ),
    (
        "hugepages-beside-reserve",
        "l40s-node-03",
        "exclusive",
        {"hostReserve": {"memoryGiB": 64}, "hugepages": {"1Gi": 448}},
        "hugepages",
        "kept for the host",
    ),
    (
        "1gi-pages-without-pdpe1gb",
        "vps-cpu-01",
        "exclusive",
        {"hugepages": {"1Gi": 1}},
        "hugepages.1Gi",
        "pdpe1gb",
    ),
    (
        "isolate-beyond-cpus",
        "vps-cpu-01",
        "exclusive",
        {"cpu": {"isolate": "1-7"}},
        "cpu.isolate",
        "CPUs 0-3",
    ),
    (
        "isolate-every-cpu",
        "vps-cpu-01",
        "exclusive",
        {"cpu": {"isolate": "0-3"}},
        "cpu.isolate",
        "none",
    ),
    (
        "iommu-unknown-vendor",
        "unknown-cpu",
        "exclusive",
        {"iommu": {"mode": "on"}},
        "iommu.mode",
        "Neoverse-V2",
    ),
    (
        "power-over-gpu-limit",
        "dgx-h100-01",
        "exclusive",
        {"gpu": {"powerLimitW": 800}},
        "gpu.powerLimitW",
        "700 W",
    ),
    (
        "gpu-on-cpu-only-host",
        "vps-cpu-01",
        "exclusive",
        {"gpu": {"persistenceMode": True}},
        "gpu",
        "no GPUs",
    ),
    (
        "mig-profile-of-another-memory-class",
        "dgx-a100-02",
        "mig",
        {"migLayout": {"default": ["1g.5gb"]}},
        "migLayout.default",
        "1g.5gb does not exist",
    ),
    (
        "mig-layout-not-fitting",
        "dgx-a100-02",
        "mig",
        {"migLayout": {"default": ["3g.40gb", "3g.40gb", "1g.10gb"]}},
        "migLayout.default",
        "does not fit",
    ),
    (
        "mig-on-a-gpu-without-mig",
        "l40s-node-03",
        "mig",
        {"migLayout": {"default": ["1g.12gb"]}},
        "migLayout.default",
        "does not support MIG",
    ),
    (
        "mps-replicas-over-client-limit",
        "synthetic-v100",
        "mps",
        {"replicas": 20},
        "replicas",
        "at most 16",
    ),
    ("timeslice-without-replicas", "l40s-node-03", "timeslice", {}, "replicas", "needs replicas"),
    (
        "partial-kubernetes-set",
        "dgx-h100-01",
        "exclusive",
        {"kubernetes": {"apiServer": KUBERNETES["apiServer"]}},
        "kubernetes.token",
        "together",
    ),
)


def inventory_for(name: str) -> Inventory:
    if name == "unknown-cpu":
        return unknown_cpu(host("dgx-h100-01"))
    if name.startswith("synthetic-"):
        (inventory,) = representative_inventories(name.removeprefix("synthetic-").upper())
        return inventory
    return host(name)


@pytest.mark.parametrize(
    ("host_name", "sharing", "policy", "field", "words"),
    [case[1:] for case in REFUSALS],
    ids=[case[0] for case in REFUSALS],
)
def test_a_host_that_cannot_take_the_policy_is_refused(
    host_name: str, sharing: str, policy: dict[str, Any], field: str, words: str
) -> None:
    """P6: what this host cannot take is refused with the policy field and a reason."""
    with pytest.raises(RenderRefused) as refused:
        spec_of(policy, inventory_for(host_name), sharing)
    assert refused.value.field == field
    assert words in refused.value.message


def test_the_host_size_checks_can_be_skipped_for_a_guessed_host() -> None:
    """P6: host_size_checks=False drops what depends on the host's size: memory and CPU count."""
    policy = {
        "hostReserve": {"memoryGiB": 64},
        "hugepages": {"1Gi": 448},
        "cpu": {"isolate": "8-383"},
    }
    spec = spec_of(policy, host("l40s-node-03"), host_size_checks=False)
    assert "hugepages=448" in spec.units[0].content and "isolcpus=8-383" in spec.units[0].content


def test_one_gi_pages_leave_the_default_page_size_alone() -> None:
    """1 GiB pages never set default_hugepagesz: vm.nr_hugepages must keep meaning 2 MiB pages."""
    spec = spec_of({"hugepages": {"1Gi": 16}}, host("hgx-h200-01"))
    assert "default_hugepagesz" not in spec.units[0].content


def test_a_reserve_larger_than_the_host_is_no_refusal_without_pages() -> None:
    """P6: hostReserve alone asks nothing of the host's units; only pages must fit beside it."""
    policy = {"hostReserve": {"memoryGiB": 64}, "hugepages": {"2Mi": 0}}
    assert spec_of(policy, host("vps-cpu-01")).units == []


def test_a_power_limit_at_the_gpus_limit_is_taken() -> None:
    """P6: the GPU's own limit is the highest a policy may set."""
    spec = spec_of({"gpu": {"powerLimitW": 700}}, host("dgx-h100-01"))
    assert [u.argv[-1] for u in spec.units] == ["700"] * 8


def test_mps_on_newer_gpus_takes_48_clients() -> None:
    """S1: MPS allows 48 clients from compute capability 7.5, so replicas 48 renders."""
    spec = spec_of({"replicas": 48}, host("l40s-node-03"), "mps")
    assert "set_default_active_thread_percentage 2 " in spec.units[1].content


# --- booked GPUs keep their MIG layout (U3) --------------------------------------------


def mig_config(spec: NodeSpecUnits) -> str:
    return next(u.content for u in spec.units if u.id == "mig/layout-file")


def test_booked_gpus_keep_their_mig_layout() -> None:
    """U3: a booked GPU's current instances are rendered in place of the new layout."""
    a100 = host("dgx-a100-02")
    policy = {"migLayout": {"default": ["7g.80gb"]}}
    idle = mig_config(spec_of(policy, a100, "mig"))
    assert idle.count('"7g.80gb": 1') == 1 and "devices: [0, 1, 2, 3, 4, 5, 6, 7]" in idle
    booked = mig_config(spec_of(policy, a100, "mig", frozenset({A100_GPU4})))
    assert "devices: [0, 1, 2, 3, 5, 6, 7]" in booked
    assert "devices: [4]" in booked
    assert '"1g.10gb": 2' in booked and '"2g.20gb": 1' in booked and '"3g.40gb": 1' in booked


def test_a_gpu_taking_the_new_layout_moves_the_version() -> None:
    """U3: once a booked GPU is idle, its node gets a new spec that repartitions it."""
    a100 = host("dgx-a100-02")
    policy = {"migLayout": {"default": ["7g.80gb"]}}
    busy = spec_of(policy, a100, "mig", frozenset({A100_GPU4}))
    idle = spec_of(policy, a100, "mig")
    assert busy.version != idle.version
    apply_note = {u.id: u.content for u in idle.units}["mig/apply"]
    assert apply_note != {u.id: u.content for u in busy.units}["mig/apply"]


def test_a_booked_gpu_keeps_an_invalid_layout_unchecked() -> None:
    """U3: a booked GPU is not repartitioned, so the new layout is not checked against it."""
    a100 = host("dgx-a100-02")
    layout = {"migLayout": {A100_GPU5: ["1g.5gb"]}}
    with pytest.raises(RenderRefused):
        spec_of(layout, a100, "mig")
    assert spec_of(layout, a100, "mig", frozenset({A100_GPU5})).units


# --- what fields render to -----------------------------------------------------------


def units_by_id(spec: NodeSpecUnits) -> dict[str, Any]:
    return {unit.id: unit for unit in spec.units}


def test_iommu_follows_the_cpu_vendor() -> None:
    """N6: AMD hosts get amd_iommu, Intel hosts intel_iommu; off turns it off."""
    amd = spec_of({"iommu": {"mode": "on"}}, host("dgx-a100-02"))
    assert units_by_id(amd)["kernel/cmdline"].content == "amd_iommu=on"
    intel = spec_of({"iommu": {"mode": "off"}}, host("dgx-h100-01"))
    assert units_by_id(intel)["kernel/cmdline"].content == "intel_iommu=off"
    vendor = msgspec.structs.replace(
        host("dgx-h100-01"), cpu=Cpu(sockets=1, logical_cpus=4, vendor="AuthenticAMD")
    )
    assert units_by_id(spec_of({"iommu": {"mode": "on"}}, vendor))["kernel/cmdline"].content == (
        "amd_iommu=on"
    )


def test_both_page_sizes_keep_2mi_as_the_default_size() -> None:
    """N6: with 2Mi pages too, 1Gi pages do not become the default size vm.nr_hugepages sets."""
    spec = spec_of({"hugepages": {"2Mi": 1024, "1Gi": 16}}, host("hgx-h200-01"))
    units = units_by_id(spec)
    assert units["kernel/cmdline"].content == "hugepagesz=1G hugepages=16"
    assert units["hugepages/sysctl"].content == "vm.nr_hugepages=1024"


def test_kernel_arguments_are_one_unit() -> None:
    """N6: the host has one command line, so IOMMU, pages and isolation share one unit."""
    policy = {"iommu": {"mode": "on"}, "hugepages": {"1Gi": 8}, "cpu": {"isolate": "2-3"}}
    spec = spec_of(policy, host("ws-rtx4090"))
    assert [u.kind for u in spec.units] == ["kernel-args"]
    assert spec.units[0].content == (
        "amd_iommu=on hugepagesz=1G hugepages=8 isolcpus=2-3 nohz_full=2-3 rcu_nocbs=2-3"
    )
    assert spec.reboot


def test_the_join_configuration_is_private_and_names_the_host() -> None:
    """P7: the kubeadm file holds a token (0600) and registers the node by its hostname."""
    policy = {"kubernetes": {**KUBERNETES, "apiServer": "https://10.0.0.1:8443"}}
    units = units_by_id(spec_of(policy, host("l40s-node-03")))
    join = units["kubernetes/join-config"]
    assert join.mode == 0o600
    assert 'apiServerEndpoint: "10.0.0.1:8443"' in join.content
    assert 'name: "l40s-node-03"' in join.content
    assert units["kubernetes/join"].argv == [
        "kubeadm",
        "join",
        "--config",
        "/etc/kubernetes/better-compute-join.yaml",
    ]


def test_a_rotated_join_token_does_not_join_again() -> None:
    """P7: kubeadm join runs once per cluster; a new token rewrites only the file."""
    inventory = host("l40s-node-03")
    old = units_by_id(spec_of({"kubernetes": KUBERNETES}, inventory))
    new = units_by_id(
        spec_of({"kubernetes": {**KUBERNETES, "token": "ghijkl.0123456789abcdef"}}, inventory)
    )
    assert old["kubernetes/join"] == new["kubernetes/join"]
    assert old["kubernetes/join-config"] != new["kubernetes/join-config"]


def test_duplicate_images_and_modules_render_once() -> None:
    """N6: unit ids stay unique when the policy repeats itself."""
    policy = {
        "prewarmImages": ["busybox:1.36", "busybox:1.36"],
        "kernelModules": {"load": ["vfio", "vfio"]},
    }
    ids = [u.id for u in spec_of(policy, host("vps-cpu-01")).units]
    assert len(ids) == len(set(ids))


# --- representative inventories --------------------------------------------------------


@pytest.mark.parametrize("name", RECORDED)
def test_recorded_hosts_read_as_their_agent_reports_them(name: str) -> None:
    """P6: a representative recorded host is the inventory its agent sends (the shipped
    recorded-hosts.json is up to date with the agent's inventory code)."""
    wanted = host(name)
    models = {g.family for g in wanted.gpus} or {None}
    (model,) = models
    assert wanted in representative_inventories(model)
    assert wanted in representative.recorded_hosts()


def test_a_model_without_a_recorded_host_gets_a_synthetic_one() -> None:
    """N1: a B200 pool renders for 8 B200s, with the reference's memory and power limit."""
    (b200,) = representative_inventories("B200")
    assert len(b200.gpus) == 8
    assert {g.family for g in b200.gpus} == {"B200"}
    assert {g.memory_bytes for g in b200.gpus} == {183359 * 2**20}
    assert {g.power_limit_w for g in b200.gpus} == {1000.0}
    assert len({g.uuid for g in b200.gpus}) == 8


def test_families_compare_exactly() -> None:
    """N1: an H20 pool is not rendered for H200 hosts."""
    (h20,) = representative_inventories("H20")
    assert h20.hostname == "synthetic-h20"


def test_cpu_pools_render_for_the_recorded_vps() -> None:
    """N1: a pool without gpuModel takes hosts without GPUs: the recorded VPS and a large CPU host."""
    hosts = representative_inventories(None)
    assert [inv.hostname for inv in hosts] == ["vps-cpu-01", "synthetic-cpu-host"]
    assert all(not inv.gpus for inv in hosts)


def test_other_memory_variants_are_representative_too() -> None:
    """P6: an H100 pool is rendered for 80 GB, NVL 94 GB and 96 GB hosts; A100 for 80 and 40 GB."""
    assert [inv.hostname for inv in representative_inventories("H100")] == [
        "dgx-h100-01",
        "synthetic-h100-95830mib",
        "synthetic-h100-97871mib",
    ]
    assert [inv.hostname for inv in representative_inventories("A100")] == [
        "dgx-a100-02",
        "synthetic-a100-40960mib",
    ]


@pytest.mark.parametrize("family", sorted(MODELS))
def test_every_synthetic_model_takes_a_plain_gpu_policy(family: str) -> None:
    """P6: representative hosts refuse nothing a real host of the model would take."""
    policy = {"gpu": {"persistenceMode": True, "powerLimitW": 60}, "iommu": {"mode": "passthrough"}}
    for inventory in representative_inventories(family):
        assert spec_of(policy, inventory).units


@pytest.mark.parametrize("family", sorted(VARIANTS))
def test_every_mig_family_takes_its_all_1g_layout_on_its_representative(family: str) -> None:
    """P6: the representative host's GPUs are of a memory class the MIG table knows."""
    for inventory in representative_inventories(family):
        gpu = inventory.gpus[0]
        sizes = [
            name
            for variant in VARIANTS[family]
            for name in variant.profiles
            if name.startswith("1g.") and "+" not in name and "-" not in name
        ]
        taken = [
            name
            for name in dict.fromkeys(sizes)
            if _renders({"migLayout": {"default": [name]}}, inventory)
        ]
        assert taken, f"no 1g profile renders on {gpu.name}"


def _renders(policy: dict[str, Any], inventory: Inventory) -> bool:
    try:
        spec_of(policy, inventory, "mig")
    except RenderRefused:
        return False
    return True


if __name__ == "__main__":
    regenerate(recorded_hosts="--golden-only" not in sys.argv[1:])
    sys.exit(0)


def test_the_boards_power_range_bounds_the_limit_not_the_limit_in_force() -> None:
    """gpu.powerLimitW: with NVML's constraints a lowered limit can be raised again, up to the board's maximum."""
    lowered = host("dgx-h100-01")
    gpus = [
        msgspec.structs.replace(
            g, power_limit_w=500.0, power_limit_min_w=200.0, power_limit_max_w=700.0
        )
        for g in lowered.gpus
    ]
    board = msgspec.structs.replace(lowered, gpus=gpus)
    assert any(u.argv[-1] == "650" for u in spec_of({"gpu": {"powerLimitW": 650}}, board).units)
    for watts in (750, 100):
        try:
            spec_of({"gpu": {"powerLimitW": watts}}, board)
        except RenderRefused as exc:
            assert exc.field == "gpu.powerLimitW"
        else:
            raise AssertionError(f"{watts} W was accepted")
