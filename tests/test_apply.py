"""Applying a NodeSpec into a temporary root: idempotence, statuses, atomic files under a crash."""

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from agent.apply import Applier, Outcome, RecordingRunner
from shared.nodespec import NodeSpecUnits, Unit

SPEC = NodeSpecUnits(
    version="v1",
    reboot=False,
    units=[
        Unit(
            id="modules/file",
            kind="file",
            path="/etc/modules-load.d/better-compute.conf",
            content="vfio_pci\n",
        ),
        Unit(id="modules/vfio_pci", kind="module", content="vfio_pci"),
        Unit(
            id="hugepages/file",
            kind="file",
            path="/etc/sysctl.d/90-better-compute-hugepages.conf",
            content="vm.nr_hugepages = 512\n",
        ),
        Unit(id="hugepages/sysctl", kind="sysctl", content="vm.nr_hugepages=512"),
        Unit(
            id="k8s/join-config",
            kind="file",
            path="/etc/kubernetes/join.yaml",
            content="token: x\n",
            mode=0o600,
        ),
        Unit(
            id="mps/unit-file",
            kind="file",
            path="/etc/systemd/system/mps.service",
            content="[Service]\n",
            restarts=["mps.service"],
        ),
        Unit(id="mps/service", kind="service", content="mps.service"),
        Unit(id="gpu/persistence", kind="command", argv=["nvidia-smi", "-pm", "1"]),
    ],
)


class FakeHost:
    """The host's tools over a temporary root: modprobe and sysctl change what /proc shows."""

    def __init__(self, root: Path, fail: set[str] | None = None) -> None:
        self.root = root
        self.ran: list[list[str]] = []
        self.fail = fail or set()

    def run(self, argv: Sequence[str]) -> Outcome:
        self.ran.append(list(argv))
        if argv[0] in self.fail:
            return Outcome(1, f"{argv[0]}: failed on purpose")
        if argv[0] == "modprobe":
            modules = self.root / "proc" / "modules"
            modules.parent.mkdir(parents=True, exist_ok=True)
            with modules.open("a") as handle:
                handle.write(f"{argv[1]} 16384 0 - Live 0x0\n")
        if argv[0] == "sysctl":
            key, _, value = argv[2].partition("=")
            target = self.root / "proc" / "sys" / key.replace(".", "/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(value + "\n")
        return Outcome(0, "")


def test_apply_twice_changes_nothing_the_second_time(tmp_path: Path) -> None:
    """N6: the first apply applies every unit; the second reports every unit unchanged and runs nothing."""
    host = FakeHost(tmp_path / "root")
    applier = Applier(tmp_path / "root", tmp_path / "state", host)
    first = applier.apply(SPEC)
    assert {r.status for r in first.units} == {"applied"}
    assert (tmp_path / "root/etc/kubernetes/join.yaml").stat().st_mode & 0o777 == 0o600
    ran = len(host.ran)
    second = applier.apply(SPEC)
    assert [(r.id, r.status) for r in second.units] == [(u.id, "unchanged") for u in SPEC.units]
    assert len(host.ran) == ran


def test_a_changed_file_restarts_its_service_and_drift_is_put_back(tmp_path: Path) -> None:
    """A unit file that changes restarts the service it names; a file changed on the host is rewritten."""
    host = FakeHost(tmp_path / "root")
    applier = Applier(tmp_path / "root", tmp_path / "state", host)
    applier.apply(SPEC)
    changed = NodeSpecUnits(
        version="v2",
        reboot=False,
        units=[
            u
            if u.id != "mps/unit-file"
            else Unit(
                **{**{f: getattr(u, f) for f in u.__struct_fields__}, "content": "[Service]\nX=1\n"}
            )
            for u in SPEC.units
        ],
    )
    host.ran.clear()
    report = {r.id: r.status for r in applier.apply(changed).units}
    assert report["mps/unit-file"] == "applied" and report["mps/service"] == "applied"
    restart = host.ran.index(["systemctl", "restart", "mps.service"])
    assert host.ran[restart - 1] == ["systemctl", "daemon-reload"]  # the new definition runs
    (tmp_path / "root/etc/modules-load.d/better-compute.conf").write_text("tampered\n")
    assert {r.id: r.status for r in applier.apply(changed).units}["modules/file"] == "applied"


def test_a_failed_command_is_reported_and_tried_again(tmp_path: Path) -> None:
    """A unit whose command fails reports failed with the error, and is retried on the next apply."""
    host = FakeHost(tmp_path / "root", fail={"nvidia-smi"})
    applier = Applier(tmp_path / "root", tmp_path / "state", host)
    result = {r.id: r for r in applier.apply(SPEC).units}
    assert result["gpu/persistence"].status == "failed"
    assert "failed on purpose" in (result["gpu/persistence"].error or "")
    host.fail.clear()
    assert {r.id: r.status for r in applier.apply(SPEC).units}["gpu/persistence"] == "applied"


def test_kernel_args_wait_for_a_reboot(tmp_path: Path) -> None:
    """Kernel arguments are written to the boot loader drop-in and pending until the host boots with them."""
    host = FakeHost(tmp_path / "root")
    applier = Applier(tmp_path / "root", tmp_path / "state", host)
    spec = NodeSpecUnits(
        version="k",
        reboot=True,
        units=[
            Unit(
                id="iommu/args",
                kind="kernel-args",
                content="intel_iommu=on iommu=pt",
                needs="reboot",
            )
        ],
    )
    assert applier.apply(spec).units[0].status == "pending-reboot"
    assert ["update-grub"] in host.ran
    drop_in = (tmp_path / "root/etc/default/grub.d/90-better-compute.cfg").read_text()
    assert "intel_iommu=on iommu=pt" in drop_in
    (tmp_path / "root/proc").mkdir(parents=True, exist_ok=True)
    (tmp_path / "root/proc/cmdline").write_text(
        "BOOT_IMAGE=/vmlinuz intel_iommu=on iommu=pt quiet\n"
    )
    assert applier.apply(spec).units[0].status == "unchanged"


CRASHER = """
import sys
from pathlib import Path
from agent.apply import Applier, Outcome, RecordingRunner
from shared.nodespec import NodeSpecUnits, Unit
root, state, round_ = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
class Host:
    def run(self, argv):
        return Outcome(0, "")
units = [Unit(id=f"f{i}", kind="file", path=f"/etc/bc/{i}.conf", content=(round_ * 200_000)) for i in range(40)]
print("go", flush=True)
while True:
    Applier(root, state, Host()).apply(NodeSpecUnits(version=round_, reboot=False, units=units))
    round_ = "B" if round_ == "A" else "A"
    units = [Unit(id=u.id, kind="file", path=u.path, content=round_ * 200_000) for u in units]
"""


def test_a_crash_mid_apply_leaves_every_file_old_or_new(tmp_path: Path) -> None:
    """Killed with SIGKILL while writing, every file holds one whole version, never a part."""
    root, state = tmp_path / "root", tmp_path / "state"
    for attempt in range(3):
        process = subprocess.Popen(
            [sys.executable, "-c", CRASHER, str(root), str(state), "A"], stdout=subprocess.PIPE
        )
        assert process.stdout is not None
        process.stdout.readline()
        time.sleep(0.3 + attempt * 0.2)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        process.stdout.close()
        for path in (root / "etc/bc").glob("*.conf"):
            data = path.read_bytes()
            assert data in (b"A" * 200_000, b"B" * 200_000), (path, len(data))
        json.loads((state / "applied.json").read_text())  # the record too is whole


def test_every_boot_commands_run_again_after_a_reboot(tmp_path: Path) -> None:
    """GPU settings do not survive a reboot: an every-boot command runs again under a new boot id."""
    root = tmp_path / "root"
    boot_id = root / "proc/sys/kernel/random/boot_id"
    boot_id.parent.mkdir(parents=True)
    boot_id.write_text("boot-1\n")
    host = FakeHost(root)
    applier = Applier(root, tmp_path / "state", host)
    spec = NodeSpecUnits(
        version="g",
        reboot=False,
        units=[
            Unit(
                id="gpu/persistence-mode",
                kind="command",
                argv=["nvidia-smi", "-pm", "1"],
                every_boot=True,
            ),
            Unit(id="images/pull", kind="command", argv=["crictl", "pull", "x"]),
        ],
    )
    applier.apply(spec)
    assert [u.status for u in applier.apply(spec).units] == ["unchanged", "unchanged"]
    boot_id.write_text("boot-2\n")
    assert [u.status for u in applier.apply(spec).units] == ["applied", "unchanged"]


def test_units_that_leave_the_spec_are_undone(tmp_path: Path) -> None:
    """A unit an earlier spec had and this one has not: its file goes, its service stops, its args leave."""
    host = FakeHost(tmp_path / "root")
    applier = Applier(tmp_path / "root", tmp_path / "state", host)
    with_args = NodeSpecUnits(
        version="a",
        reboot=True,
        units=[
            *SPEC.units,
            Unit(id="kernel/cmdline", kind="kernel-args", content="iommu=pt", needs="reboot"),
        ],
    )
    applier.apply(with_args)
    host.ran.clear()
    keep = [u for u in SPEC.units if not u.id.startswith("mps/")]
    result = {
        r.id: r.status
        for r in applier.apply(NodeSpecUnits(version="b", reboot=False, units=keep)).units
    }
    assert result["mps/service"] == "applied" and result["mps/unit-file"] == "applied"
    assert result["kernel/cmdline"] == "pending-reboot"
    assert host.ran[0] == [
        "systemctl",
        "disable",
        "--now",
        "mps.service",
    ]  # stopped before its file goes
    assert not (tmp_path / "root/etc/systemd/system/mps.service").exists()
    assert not (tmp_path / "root/etc/default/grub.d/90-better-compute.cfg").exists()
    assert {
        r.status for r in applier.apply(NodeSpecUnits(version="b", reboot=False, units=keep)).units
    } == {"unchanged"}


def test_a_failed_restart_is_tried_again(tmp_path: Path) -> None:
    """A restart that failed after its unit file changed runs again on the next apply."""
    host = FakeHost(tmp_path / "root")
    applier = Applier(tmp_path / "root", tmp_path / "state", host)
    applier.apply(SPEC)
    changed = NodeSpecUnits(
        version="v2",
        reboot=False,
        units=[
            Unit(id=u.id, kind=u.kind, path=u.path, content="[Service]\nX=2\n", restarts=u.restarts)
            if u.id == "mps/unit-file"
            else u
            for u in SPEC.units
        ],
    )
    host.fail = {"systemctl"}
    assert {r.id: r.status for r in applier.apply(changed).units}["mps/service"] == "failed"
    host.fail = set()
    host.ran.clear()
    assert {r.id: r.status for r in applier.apply(changed).units}["mps/service"] == "applied"
    assert ["systemctl", "restart", "mps.service"] in host.ran


def test_a_failed_update_grub_is_tried_again_and_dropped_args_wait_for_a_reboot(
    tmp_path: Path,
) -> None:
    """Kernel args: update-grub runs again after a failure; an argument removed stays pending until a boot without it."""
    root = tmp_path / "root"
    host = FakeHost(root, fail={"update-grub"})
    applier = Applier(root, tmp_path / "state", host)
    spec = NodeSpecUnits(
        version="k",
        reboot=True,
        units=[
            Unit(
                id="kernel/cmdline",
                kind="kernel-args",
                content="iommu=pt isolcpus=2-3",
                needs="reboot",
            )
        ],
    )
    assert applier.apply(spec).units[0].status == "failed"
    host.fail = set()
    assert applier.apply(spec).units[0].status == "pending-reboot"
    assert ["update-grub"] in host.ran
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc/cmdline").write_text("quiet iommu=pt isolcpus=2-3\n")
    assert applier.apply(spec).units[0].status == "unchanged"
    fewer = NodeSpecUnits(
        version="k2",
        reboot=True,
        units=[Unit(id="kernel/cmdline", kind="kernel-args", content="iommu=pt", needs="reboot")],
    )
    assert applier.apply(fewer).units[0].status == "pending-reboot"  # still booted with isolcpus
    (root / "proc/cmdline").write_text("quiet iommu=pt\n")
    assert applier.apply(fewer).units[0].status == "unchanged"


def test_applying_into_a_directory_twice_changes_nothing(tmp_path: Path) -> None:
    """A directory root records commands and what they would show in /proc: the second apply is all unchanged."""
    root = tmp_path / "root"
    applier = Applier(root, tmp_path / "state", RecordingRunner(root))
    applier.apply(SPEC)
    log = root / "var/lib/better-compute/commands.log"
    recorded = log.read_text()
    assert {r.status for r in applier.apply(SPEC).units} == {"unchanged"}
    assert log.read_text() == recorded
    assert json.loads(recorded.splitlines()[0]) == ["modprobe", "vfio_pci"]
