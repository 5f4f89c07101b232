"""The reviewable plan (DESIGN §6): units in apply order with every file and command, and the
diff against the host (files, kernel arguments against /proc/cmdline, MIG layouts)."""

import json
import os
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

import agent.main
from agent.apply import Applier, RecordingRunner
from agent.plan import Host, describe, for_people, read_host, write_tree
from agent.state import State
from tests.nodes import dry_run
from tests.specs import served
from tests.test_render import A100_GPU4, A100_GPU5, FIXTURES, FULL, host, spec_of

DROP_IN = "/etc/default/grub.d/90-better-compute.cfg"
HUGEPAGES_FILE = "/etc/sysctl.d/90-better-compute-hugepages.conf"


def test_the_plan_is_what_an_apply_runs_in_its_order(tmp_path: Path) -> None:
    """N6, §6: the plan lists the units in apply order, and its commands (update-grub, modprobe,
    sysctl -w, systemctl daemon-reload and enable, the units' own) and files (the GRUB drop-in
    too, modes as "0644") are exactly those an apply into a fresh root runs and writes."""
    spec = spec_of(FULL, host("dgx-h100-01"))
    plan = describe(spec)
    root = tmp_path / "root"
    Applier(root, tmp_path / "state", RecordingRunner(root)).apply(spec)
    ran = (root / "var/lib/better-compute/commands.log").read_text().splitlines()
    assert [command["argv"] for command in plan["commands"]] == [json.loads(c) for c in ran]
    assert [step["id"] for step in plan["units"]] == [unit.id for unit in spec.units]
    own = (root / "var", root / "proc")  # the recorded commands, what /proc would show
    written = {
        "/" + str(path.relative_to(root)): f"{path.stat().st_mode & 0o7777:04o}"
        for path in root.rglob("*")
        if path.is_file() and not any(path.is_relative_to(top) for top in own)
    }
    assert {f["path"]: f["mode"] for f in plan["files"]} == written
    kernel = next(step for step in plan["units"] if step["id"] == "kernel/cmdline")
    assert (kernel["files"], kernel["commands"]) == (
        [{"path": DROP_IN, "mode": "0644"}],
        [["update-grub"]],
    )
    assert written["/etc/kubernetes/better-compute-join.yaml"] == "0600"
    assert "0o" not in msgspec.json.encode(plan).decode()


def test_the_plan_diffs_files_and_kernel_arguments_against_the_root(tmp_path: Path) -> None:
    """§6: under --root, a changed file shows as a unified diff (and its mode change), a
    missing one as new; kernel arguments the spec adds are those /proc/cmdline lacks, and those
    the drop-in set, the kernel runs with and the spec drops are to remove."""
    inventory = host("dgx-h100-01")
    before = spec_of({"cpu": {"isolate": "2-3"}, "hugepages": {"2Mi": 512}}, inventory)
    root = tmp_path / "root"
    write_tree(before, root)  # the host as an earlier spec left it
    (root / HUGEPAGES_FILE.lstrip("/")).chmod(0o600)
    (root / "proc").mkdir()
    (root / "proc/cmdline").write_text("BOOT_IMAGE=/vmlinuz ro isolcpus=2-3 nohz_full=2-3 quiet\n")
    policy = {"hugepages": {"2Mi": 1024, "1Gi": 4}, "kernelModules": {"load": ["vfio_pci"]}}
    spec = spec_of(policy, inventory)
    plan = describe(spec, read_host(spec, root, inventory))
    changes = {change["path"]: change for change in plan["diff"]["files"]}
    pages = changes[HUGEPAGES_FILE]
    assert (pages["change"], pages["was"], pages["mode"]) == ("changed", "0600", "0644")
    assert "-vm.nr_hugepages = 512\n" in pages["diff"]
    assert "+vm.nr_hugepages = 1024\n" in pages["diff"]
    assert changes["/etc/modules-load.d/better-compute.conf"]["change"] == "new"
    assert changes[DROP_IN]["change"] == "changed"
    assert plan["diff"]["kernelArgs"] == {
        "add": ["hugepagesz=1G", "hugepages=4"],
        "remove": ["isolcpus=2-3", "nohz_full=2-3"],  # rcu_nocbs=2-3 is not running
    }
    text = for_people(plan)
    assert f"{HUGEPAGES_FILE}: changed (mode 0600 → 0644)" in text
    assert "kernel arguments to add (not in /proc/cmdline): hugepagesz=1G hugepages=4" in text
    assert (
        "kernel arguments to remove (in /proc/cmdline, dropped by the spec): isolcpus=2-3" in text
    )


def test_the_plan_shows_each_gpu_whose_mig_layout_changes() -> None:
    """U3, H4: the GPUs whose MIG mode or instances the layout changes, from the inventory to the
    render, are exactly mig/apply's drain-gated GPUs; a booked GPU keeps its instances."""
    a100 = host("dgx-a100-02")
    policy = {"migLayout": {"default": ["3g.40gb", "3g.40gb"], A100_GPU5: ["7g.80gb"]}}
    spec = spec_of(policy, a100, "mig", frozenset({A100_GPU4}))
    changes = describe(spec, Host(root="/", inventory=a100))["diff"]["mig"]
    apply = next(unit for unit in spec.units if unit.id == "mig/apply")
    assert {change["uuid"] for change in changes} == set(apply.gpus)
    assert A100_GPU4 not in apply.gpus
    gpu5 = next(change for change in changes if change["uuid"] == A100_GPU5)
    assert (gpu5["from"], gpu5["to"]) == (
        {"enabled": True, "instances": {"1g.10gb": 7}},
        {"enabled": True, "instances": {"7g.80gb": 1}},
    )
    assert f"MIG on GPU 5 ({A100_GPU5}): MIG on, 1g.10gb ×7 → MIG on, 7g.80gb" in for_people(
        describe(spec, Host(root="/", inventory=a100))
    )


def test_run_dry_run_prints_the_plan_of_the_kept_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """H1, §6: `run --dry-run --once --json` applies nothing and prints, on stdout alone, the
    plan of the NodeSpec it keeps against --root, with what undoing a unit an earlier apply
    recorded runs (a service disabled first)."""

    policy = {"hugepages": {"2Mi": 512}}
    spec = spec_of(policy, host("dgx-h100-01"))
    state = State(tmp_path / "state")
    state.save_spec(served(spec.version, policy, host("dgx-h100-01")))
    gone = {"kind": "service", "key": "k", "service": "old.service"}
    (state.directory / "applied.json").write_text(json.dumps({"old/service": gone}))
    root = tmp_path / "root"
    _, invoke = dry_run(monkeypatch, state.directory, root)
    result = invoke("--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert [step["id"] for step in plan["units"]] == [
        *(unit.id for unit in spec.units),
        "old/service",
    ]
    assert plan["units"][-1]["commands"] == [["systemctl", "disable", "--now", "old.service"]]
    assert plan["diff"]["root"] == str(root)
    assert os.listdir(root) == []


def test_f3_run_dry_run_refuses_a_kept_spec_its_policy_does_not_render(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """F3: the dry run checks the kept spec as the applier would: a unit that is not what the
    agent renders of the spec's policy is the plan's refusal, exit 1, nothing printed."""
    kept = served("v1", {"hugepages": {"2Mi": 512}}, host("dgx-h100-01"))
    kept["policy"] = {"hugepages": {"2Mi": 1024}}  # the units no longer match the policy
    state = State(tmp_path / "state")
    state.save_spec(kept)
    _, invoke = dry_run(monkeypatch, state.directory, tmp_path / "root")
    result = invoke("--json")
    assert result.exit_code == 1, result.output
    assert "spec refused" in result.stderr and "not what this agent renders" in result.stderr
    assert result.stdout == ""


def test_d5_render_shows_and_writes_a_bookings_delivery(tmp_path: Path) -> None:
    """D5: `render --bookings` plans each live booking's slice and environment file and the
    systemctl steps like every unit's, writes both files under --out and touches no host."""
    rid = "res_01k0000000000000000000000a"
    dgx = host("dgx-h100-01")
    gpu = dgx.gpus[2]
    bookings = tmp_path / "bookings.json"
    bookings.write_text(
        json.dumps([{"reservationId": rid, "gpus": [gpu.uuid], "cpus": "8-11,120-123"}])
    )
    policy = tmp_path / "policy.json"
    policy.write_text("{}")
    out, root = tmp_path / "out", tmp_path / "root"
    root.mkdir()
    result = CliRunner().invoke(
        agent.main.cli,
        [
            "render",
            "--policy",
            str(policy),
            "--fixture",
            str(FIXTURES),
            "--fixture-host",
            "dgx-h100-01",
            "--out",
            str(out),
            "--root",
            str(root),
            "--bookings",
            str(bookings),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    (step,) = json.loads(result.stdout)["bookings"]
    slice_path = f"/run/systemd/system/better-compute-{rid}.slice"
    assert [f["path"] for f in step["files"]] == [
        slice_path,
        f"/run/better-compute/reservations/{rid}.env",
    ]
    assert step["commands"][-1] == ["systemctl", "start", f"better-compute-{rid}.slice"]
    unit = (out / slice_path.lstrip("/")).read_text()
    assert f"DeviceAllow=/dev/nvidia{gpu.minor_number} rw" in unit
    assert "AllowedCPUs=8-11,120-123" in unit
    assert os.listdir(root) == []
