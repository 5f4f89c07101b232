"""P6 through the API and through `render`: a policy no node could take is refused with its field."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Api, snapshot
from tests.nodes import FIXTURES

AGENT = Path(sys.executable).parent / "better-compute-agent"

REFUSED: list[tuple[str, str, dict[str, Any], str]] = [
    # (gpuModel, sharing, policy, field)
    ("H100", "exclusive", {"gpu": {"powerLimitW": 2000}}, "policy.gpu.powerLimitW"),
    ("H100", "exclusive", {"cpu": {"isolate": "8-4"}}, "policy.cpu.isolate"),
    ("V100", "mps", {"replicas": 20}, "policy.replicas"),
    ("A100", "mig", {"migLayout": {"default": ["1g.12gb"]}}, "policy.migLayout.default"),
    (
        "L40S",
        "timeslice",
        {"replicas": 4, "gpu": {"computeMode": "exclusive-process"}},
        "policy.gpu.computeMode",
    ),
    ("H100", "exclusive", {"gpu": {"powerLimitW": 1}}, "policy.gpu.powerLimitW"),
]
TAKEN: list[tuple[str, str, dict[str, Any]]] = [
    (
        "H100",
        "mig",
        {"migLayout": {"default": ["1g.12gb"] * 7}},
    ),  # only the NVL 94 GB variant has it
    (
        "H100",
        "exclusive",
        {"gpu": {"powerLimitW": 650}},
    ),  # the 400 W NVL would refuse, the SXM takes it
    ("V100", "mps", {"replicas": 16}),
    # A host's size is its own (a node that cannot take these is quarantined), not the model's:
    ("B200", "exclusive", {"cpu": {"isolate": "8-383"}}),
    ("L40S", "exclusive", {"hugepages": {"1Gi": 600}}),
]


@pytest.mark.parametrize(("model", "sharing", "policy", "field"), REFUSED)
async def test_p6_policies_no_node_can_take_are_refused(
    api: Api, db: Path, model: str, sharing: str, policy: dict[str, Any], field: str
) -> None:
    """P6: the provision validator renders on representative hosts and refuses with the field."""
    site = await api.site()
    before = snapshot(db)
    body = {
        "tenantId": "root",
        "siteId": site,
        "class": "metal-host",
        "gpuModel": model,
        "sharing": sharing,
        "policy": policy,
    }
    error = await api.err("compute/pools/create", body, "INVALID_INPUT")
    assert error["details"]["field"].startswith(field), error
    assert error["message"].startswith("policy: ")
    assert snapshot(db) == before


@pytest.mark.parametrize(("model", "sharing", "policy"), TAKEN)
async def test_p6_policies_some_node_can_take_pass(
    api: Api, model: str, sharing: str, policy: dict[str, Any]
) -> None:
    """P6: a policy one variant of the model can take is accepted; hosts that cannot are quarantined."""
    site = await api.site()
    pool = await api.pool(site, gpuModel=model, sharing=sharing, policy=policy)
    assert pool["policy"] == policy


async def test_p6_update_is_rendered_too(api: Api, db: Path) -> None:
    """P6, U1: a policy update is rendered as on create."""
    site = await api.site()
    pool = await api.pool(site)
    before = snapshot(db)
    await api.err(
        "compute/pools/update",
        {"tenantId": "root", "poolId": pool["id"], "policy": {"gpu": {"powerLimitW": 5000}}},
        "INVALID_INPUT",
        "policy.gpu.powerLimitW",
    )
    assert snapshot(db) == before


def test_render_writes_the_tree_and_prints_the_plan(tmp_path: Path) -> None:
    """The local dry-run: files under --out as if it were /, a plan for people and --json for scripts."""
    policy = tmp_path / "policy.json"
    policy.write_text(
        json.dumps(
            {
                "hugepages": {"2Mi": 1024},
                "iommu": {"mode": "passthrough"},
                "kernelModules": {"load": ["vfio_pci"]},
            }
        )
    )
    out = tmp_path / "out"
    done = subprocess.run(
        [
            str(AGENT),
            "render",
            "--policy",
            str(policy),
            "--fixture",
            str(FIXTURES),
            "--fixture-host",
            "dgx-h100-01",
            "--out",
            str(out),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert (
        plan["reboot"] is True
        and "intel_iommu=on" in plan["kernelArgs"]
        and "iommu=pt" in plan["kernelArgs"]
    )
    assert plan["modules"] == ["vfio_pci"] and plan["sysctls"] == ["vm.nr_hugepages=1024"]
    assert (
        "vm.nr_hugepages = 1024"
        in (out / "etc/sysctl.d/90-better-compute-hugepages.conf").read_text()
    )
    loads = (out / "etc/modules-load.d/better-compute.conf").read_text().splitlines()
    assert [line for line in loads if line and not line.startswith("#")] == ["vfio_pci"]
    assert "intel_iommu=on" in (out / "etc/default/grub.d/90-better-compute.cfg").read_text()


@pytest.mark.parametrize(
    ("host", "policy", "field"),
    [
        ("dgx-h100-01", {"gpu": {"powerLimitW": 900}}, "policy.gpu.powerLimitW"),
        ("vps-cpu-01", {"gpu": {"persistenceMode": True}}, "policy.gpu"),
        ("vps-cpu-01", {"hugepages": {"1Gi": 2}}, "policy.hugepages"),
        ("dgx-h100-01", {"cpu": {"isolate": "0-3"}}, "policy.cpu.isolate"),
        (
            "dgx-h100-01",
            {"kernelModules": {"load": ["nouveau"], "blacklist": ["nouveau"]}},
            "policy.kernelModules",
        ),
        ("dgx-h100-01", {"replicas": 4}, "policy.replicas"),
    ],
)
def test_render_exits_2_with_the_field_when_the_host_cannot_take_it(
    tmp_path: Path, host: str, policy: dict[str, Any], field: str
) -> None:
    """`render` refuses, for that host, what it cannot take: exit 2 with the field and reason, no files."""
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(json.dumps(policy))
    out = tmp_path / "out"
    done = subprocess.run(
        [
            str(AGENT),
            "render",
            "--policy",
            str(policy_file),
            "--fixture",
            str(FIXTURES),
            "--fixture-host",
            host,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and field in done.stderr, done.stderr
    assert not out.exists()
