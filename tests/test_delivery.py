"""Bookings delivered and released by the real agent into a temporary root (D5, D7, D8).

The agent loop and agent/delivery.py run as on a host, with a RecordingRunner (the
commands land in the root's commands.log), a fake of NVML's compute processes and,
for the release timeout, a clock the test moves.
"""

import json
import os
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

import agent.main
from agent.client import Unreachable
from agent.gate import HostApply
from agent.loop import Agent, Settings
from agent.state import NodeCredential, State, bookings_of
from shared.inventory import Inventory
from shared.nodespec import Booking
from tests.nodes import dry_run, recorded
from tests.specs import host_apply

RES_A = "res_01jz8x4f7c9d2e3g5h6k7m8n9p"
RES_B = "res_01jz8x4f7c9d2e3g5h6k7m8n9q"
RES_STRAY = "res_01jz8x4f7c9d2e3g5h6k7m8n9r"
H100 = recorded("dgx-h100-01")
A100 = recorded("dgx-a100-02")
GPU0, GPU1, GPU2 = (gpu.uuid for gpu in H100.gpus[:3])
A100_GPU4 = A100.gpus[4]
MIG_2, MIG_3, MIG_9 = (mig.uuid for mig in A100_GPU4.mig_instances[:3])  # gi 2, 3, 9; ci 0
SLICES = "run/systemd/system"
ENVS = "run/better-compute/reservations"
COMMANDS = "var/lib/better-compute/commands.log"
CAPS = "proc/driver/nvidia/capabilities"


def with_minors(inventory: Inventory, offset: int) -> Inventory:
    """The host with /dev/nvidia<N> numbered apart from the GPU indices."""
    gpus = [msgspec.structs.replace(g, minor_number=g.index + offset) for g in inventory.gpus]
    return msgspec.structs.replace(inventory, gpus=gpus)


def spec(version: str, *bookings: dict[str, Any]) -> dict[str, Any]:
    return {"version": version, "reboot": False, "units": [], "bookings": list(bookings)}


def booking(reservation_id: str = RES_A, **fields: Any) -> dict[str, Any]:
    return {"reservationId": reservation_id, "state": "live", **fields}


class ControlPlane:
    """Serves whatever spec the test sets and keeps the bookings part of every report."""

    def __init__(self, served: dict[str, Any]) -> None:
        self.served = served
        self.reported: list[Any] = []

    def report(self, token: str, node: str, inventory: Any, applied: Any, bookings: Any) -> Any:
        self.reported.append(bookings)
        return {"specVersion": self.served["version"]}

    def spec(self, *args: Any) -> Any:
        return self.served


class Host:
    """A temporary root, the agent's state, NVML's compute processes and a clock, all the
    test's to change; ``agent`` is the real loop with the real applier and deliverer."""

    def __init__(self, tmp_path: Path, served: dict[str, Any], inventory: Inventory = H100) -> None:
        self.root = tmp_path / "root"
        self.state_dir = tmp_path / "state"
        self.now = 1000.0
        self.inventory = inventory
        # NVML's word on every device: none runs a process (a device left out: it cannot say)
        self.processes: dict[str, list[int]] = {
            device: []
            for gpu in inventory.gpus
            for device in (gpu.uuid, *(m.uuid for m in gpu.mig_instances))
        }
        self.client = ControlPlane(served)
        self.state = State(self.state_dir)
        self.state.save_credential(NodeCredential("node_x", "bcn_x", "pool_x", "http://x"))
        self.agent = self.start()

    def start(self) -> Agent:
        """The agent as a (re)start makes it: nothing kept but the state directory."""
        gate = host_apply(
            self.root,
            self.state_dir,
            lambda: self.processes,
            release_timeout=10,
            clock=lambda: self.now,
        )
        return Agent(
            Settings("http://x", self.state_dir / "t", interval=0.01),
            self.state,
            lambda: self.inventory,
            self.client,
            gate,
        )

    def cycle(self) -> list[Any]:
        """One agent cycle; the bookings it reported last."""
        self.agent.run(threading.Event(), once=True)
        return self.client.reported[-1]

    def serve(self, served: dict[str, Any]) -> None:
        self.client.served = served

    def commands(self) -> list[list[str]]:
        log = self.root / COMMANDS
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def slice(self, reservation_id: str = RES_A) -> Path:
        return self.root / SLICES / f"better-compute-{reservation_id}.slice"

    def env(self, reservation_id: str = RES_A) -> Path:
        return self.root / ENVS / f"{reservation_id}.env"


def delivered(reservation_id: str = RES_A) -> dict[str, Any]:
    return {"reservationId": reservation_id, "state": "delivered", "reason": None}


def test_a_pinned_booking_gets_its_slice_environment_and_start(tmp_path: Path) -> None:
    """D5: pinned CPUs and memory nodes, the memory limit, only the booked GPUs' device nodes
    (by minor number, not index) with nvidiactl and UVM, written as files under the root;
    then daemon-reload and start; the next report says delivered, within the same cycle."""
    host = Host(
        tmp_path,
        spec(
            "s1",
            booking(
                gpus=[GPU1, GPU0], cpus="8-15,120-127", memoryBytes=68719476736, memoryNodes="0"
            ),
        ),
        with_minors(H100, 10),
    )
    assert host.cycle() == [delivered()]
    assert len(host.client.reported) == 2  # the outcome moved: reported again at once (D9)
    assert host.slice().read_text() == (
        "[Unit]\n"
        f"Description=Better Compute reservation {RES_A}\n"
        "\n"
        "[Slice]\n"
        "AllowedCPUs=8-15,120-127\n"
        "AllowedMemoryNodes=0\n"
        "MemoryMax=68719476736\n"
        "DevicePolicy=closed\n"
        "DeviceAllow=/dev/nvidia11 rw\n"
        "DeviceAllow=/dev/nvidia10 rw\n"
        "DeviceAllow=/dev/nvidiactl rw\n"
        "DeviceAllow=/dev/nvidia-uvm rw\n"
        "DeviceAllow=/dev/nvidia-uvm-tools rw\n"
    )
    assert host.env().read_text() == (
        f"CUDA_VISIBLE_DEVICES={GPU1},{GPU0}\n"
        f"NVIDIA_VISIBLE_DEVICES={GPU1},{GPU0}\n"
        f"BETTER_COMPUTE_RESERVATION={RES_A}\n"
        "BETTER_COMPUTE_CPUS=8-15,120-127\n"
    )
    assert host.slice().stat().st_mode & 0o777 == 0o644
    assert host.commands() == [
        ["systemctl", "daemon-reload"],
        ["systemctl", "start", f"better-compute-{RES_A}.slice"],
    ]


def test_a_second_cycle_writes_and_runs_nothing(tmp_path: Path) -> None:
    """D5: delivering is idempotent: an unchanged booking is neither written nor started again,
    and the report stays the same (one report a cycle); a file that drifted is put back."""
    host = Host(tmp_path, spec("s1", booking(gpus=[GPU0], cpus="8-15")))
    host.cycle()
    written = {path: path.stat().st_mtime_ns for path in (host.slice(), host.env())}
    record = (host.state_dir / "bookings.json").stat().st_mtime_ns
    reports = len(host.client.reported)
    assert host.cycle() == [delivered()]
    assert len(host.client.reported) == reports + 1
    assert {path: path.stat().st_mtime_ns for path in written} == written
    assert (host.state_dir / "bookings.json").stat().st_mtime_ns == record
    assert len(host.commands()) == 2
    host.env().unlink()  # /run is emptied by a reboot
    host.cycle()
    assert host.env().exists()
    assert host.commands()[2:] == host.commands()[:2]


def test_a_shared_booking_gets_a_cpu_quota_on_its_affine_cpus(tmp_path: Path) -> None:
    """D3, D5: a shared booking's slice has CPUQuota and AllowedCPUs (the affine CPUs, not
    exclusive), no memory nodes; without memoryBytes no MemoryMax."""
    host = Host(tmp_path, spec("s1", booking(gpus=[GPU2], cpus="0-55,112-167", cpuQuota=400)))
    assert host.cycle() == [delivered()]
    text = host.slice().read_text()
    assert "AllowedCPUs=0-55,112-167\nCPUQuota=400%\nDevicePolicy=closed\n" in text
    assert "AllowedMemoryNodes" not in text and "MemoryMax" not in text
    assert "DeviceAllow=/dev/nvidia2 rw\n" in text
    assert "BETTER_COMPUTE_CPUS=0-55,112-167\n" in host.env().read_text()


def test_a_mig_booking_allows_its_parent_and_its_capabilities(tmp_path: Path) -> None:
    """D5: MIG instances allow their parent GPU's device once and each instance's GPU- and
    compute-instance capability devices the host has (DeviceFileMinor from /proc); one
    without capability files gets none; the environment lists the MIG UUIDs in order."""
    host = Host(tmp_path, spec("s1", booking(migInstances=[MIG_3, MIG_2])), A100)
    caps = host.root / CAPS / f"gpu{A100_GPU4.minor_number}/mig/gi2"
    (caps / "ci0").mkdir(parents=True)
    (caps / "access").write_text("DeviceFileMinor: 39\nDeviceFileMode: 292\n")
    (caps / "ci0/access").write_text("DeviceFileMinor: 40\nDeviceFileMode: 292\n")
    assert host.cycle() == [delivered()]
    allowed = [
        line.removeprefix("DeviceAllow=")
        for line in host.slice().read_text().splitlines()
        if line.startswith("DeviceAllow=")
    ]
    assert allowed == [
        f"/dev/nvidia{A100_GPU4.minor_number} rw",
        "/dev/nvidia-caps/nvidia-cap39 rw",
        "/dev/nvidia-caps/nvidia-cap40 rw",
        "/dev/nvidiactl rw",
        "/dev/nvidia-uvm rw",
        "/dev/nvidia-uvm-tools rw",
    ]
    assert f"CUDA_VISIBLE_DEVICES={MIG_3},{MIG_2}\n" in host.env().read_text()


def test_a_busy_gpu_fails_delivery_with_its_pids(tmp_path: Path) -> None:
    """D5: a compute process on a booked GPU that no live booking accounts for: failed with
    ``gpu busy: pid …`` naming the GPU, nothing written or run; it stays failed (never
    delivered late) once the process is gone."""
    host = Host(tmp_path, spec("s1", booking(gpus=[GPU0, GPU1])))
    host.processes = {GPU0: [], GPU1: [4243, 4242]}
    assert host.cycle() == [
        {"reservationId": RES_A, "state": "failed", "reason": f"gpu busy: pid 4242, 4243 on {GPU1}"}
    ]
    assert not host.slice().exists() and not host.env().exists()
    assert host.commands() == []
    host.processes = {}
    assert host.cycle()[0]["state"] == "failed"
    assert not host.slice().exists() and host.commands() == []


def test_a_delivered_booking_accounts_for_its_own_processes(tmp_path: Path) -> None:
    """D5: a booking delivered stays delivered with its tenant's processes on its GPUs; on a
    MIG GPU, a process a delivered neighbour runs (listed on its instance and on the parent)
    does not fail a new booking, a stray one on the parent does."""
    host = Host(tmp_path, spec("s1", booking(migInstances=[MIG_2])), A100)
    host.cycle()
    host.processes = {MIG_2: [700], A100_GPU4.uuid: [700]}
    host.env().unlink()  # /run emptied under it: put back, still delivered
    assert host.cycle() == [delivered()]
    assert host.env().exists()
    host.serve(spec("s2", booking(migInstances=[MIG_2]), booking(RES_B, migInstances=[MIG_3])))
    assert host.cycle() == [delivered(), delivered(RES_B)]
    host.processes = {MIG_2: [700], A100_GPU4.uuid: [700, 800]}
    res_c = "res_01jz8x4f7c9d2e3g5h6k7m8n9s"
    host.serve(spec("s3", booking(migInstances=[MIG_2]), booking(res_c, migInstances=[MIG_9])))
    assert host.cycle()[1] == {
        "reservationId": res_c,
        "state": "failed",
        "reason": f"gpu busy: pid 800 on {A100_GPU4.uuid}",
    }


def test_a_releasing_neighbour_accounts_for_nothing(tmp_path: Path) -> None:
    """D5, D7: only live bookings account for processes: a neighbour being released whose
    process is still on the parent GPU fails a new booking on that GPU."""
    host = Host(tmp_path, spec("s1", booking(migInstances=[MIG_2])), A100)
    host.cycle()
    host.processes = {MIG_2: [700], A100_GPU4.uuid: [700]}
    host.serve(
        spec(
            "s2",
            booking(migInstances=[MIG_2], state="release"),
            booking(RES_B, migInstances=[MIG_3]),
        )
    )
    assert host.cycle() == [
        {
            "reservationId": RES_B,
            "state": "failed",
            "reason": f"gpu busy: pid 700 on {A100_GPU4.uuid}",
        }
    ]


def test_a_booking_this_host_cannot_take_fails_with_why(tmp_path: Path) -> None:
    """D5, D8: a device the host does not have is never allowed: failed, nothing written."""
    host = Host(tmp_path, spec("s1", booking(gpus=["GPU-not-here"])))
    assert host.cycle() == [
        {"reservationId": RES_A, "state": "failed", "reason": "GPU-not-here is not on this host"}
    ]
    assert not (host.root / SLICES).exists()


def test_a_release_stops_the_slice_removes_its_files_and_reports_released(tmp_path: Path) -> None:
    """D7: release: systemctl stop, both files removed, daemon-reload; no compute process
    left: released. Once it leaves the spec it is forgotten, with nothing run."""
    host = Host(tmp_path, spec("s1", booking(gpus=[GPU0])))
    host.cycle()
    host.serve(spec("s2", booking(gpus=[GPU0], state="release")))
    assert host.cycle() == [{"reservationId": RES_A, "state": "released", "reason": None}]
    assert host.commands()[2:] == [
        ["systemctl", "stop", f"better-compute-{RES_A}.slice"],
        ["systemctl", "daemon-reload"],
    ]
    assert not host.slice().exists() and not host.env().exists()
    assert host.cycle() == [{"reservationId": RES_A, "state": "released", "reason": None}]
    host.serve(spec("s3"))
    assert host.cycle() == []
    assert json.loads((host.state_dir / "bookings.json").read_text()) == {}
    assert len(host.commands()) == 4


def test_a_process_left_past_the_timeout_is_release_blocked_until_it_goes(
    tmp_path: Path,
) -> None:
    """D7: a process still on the GPU after the stop: tried every cycle and not reported until
    --release-timeout has passed since the first attempt (kept across a restart), then
    release-blocked with the pids; released once NVML shows none."""
    host = Host(tmp_path, spec("s1", booking(gpus=[GPU0, GPU1])))
    host.cycle()
    host.processes = {GPU0: [4243, 4242], GPU1: []}
    host.serve(spec("s2", booking(gpus=[GPU0, GPU1], state="release")))
    assert host.cycle() == []
    assert not host.slice().exists()
    host.now += 10
    assert host.cycle() == []
    host.agent = host.start()  # the agent restarts
    host.now += 1
    blocked = {
        "reservationId": RES_A,
        "state": "release-blocked",
        "reason": f"pids 4242, 4243 still on {GPU0}",
    }
    assert host.cycle() == [blocked]
    assert host.cycle() == [blocked]
    assert len(host.commands()) == 4  # stopped and reloaded once
    host.processes = {GPU0: [], GPU1: []}
    assert host.cycle() == [{"reservationId": RES_A, "state": "released", "reason": None}]


def test_only_its_own_bookings_files_are_ever_touched(tmp_path: Path) -> None:
    """D8: a slice and environment file the agent did not write, for a reservation not in its
    bookings, are left alone; a booking it delivered that left the spec is released (stopped,
    files removed) without a report; no slice is written for anything outside the spec; an id
    that is no reservation id names no file (the agent refuses such a spec whole before it
    comes here: the deliverer drops the booking all the same)."""
    host = Host(tmp_path, spec("s1", booking(gpus=[GPU0]), booking(RES_B, gpus=[GPU1])))
    stray_slice, stray_env = host.slice(RES_STRAY), host.env(RES_STRAY)
    other = host.root / SLICES / "tenant-own.slice"
    for path in (stray_slice, stray_env, other):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("not the agent's\n")
    host.cycle()
    host.serve(spec("s2", booking(gpus=[GPU0])))
    assert host.cycle() == [delivered()]
    elsewhere = Host(tmp_path / "elsewhere", spec("s1"))
    gate = elsewhere.agent.host
    assert isinstance(gate, HostApply)
    odd = Booking(reservation_id="../../etc/passwd", gpus=[GPU1])
    assert gate.deliverer.deliver([odd], H100) == []
    assert not elsewhere.root.exists()
    assert not host.slice(RES_B).exists() and not host.env(RES_B).exists()
    assert ["systemctl", "stop", f"better-compute-{RES_B}.slice"] in host.commands()
    assert sorted(p.name for p in (host.root / SLICES).iterdir()) == sorted(
        [host.slice().name, stray_slice.name, other.name]
    )
    assert all(p.read_text() == "not the agent's\n" for p in (stray_slice, stray_env, other))
    assert not any(RES_STRAY in " ".join(argv) for argv in host.commands())
    assert not (host.root / "etc").exists()


def test_a_release_of_a_booking_whose_record_was_lost_still_removes_its_files(
    tmp_path: Path,
) -> None:
    """R9, D7: with bookings.json damaged (set aside), a delivered booking is known by its
    files (not failed as busy by its own processes), and a release in the spec still stops
    its slice and removes them."""
    host = Host(tmp_path, spec("s1", booking(gpus=[GPU0])))
    host.cycle()
    (host.state_dir / "bookings.json").write_text('{"res_')
    host.processes = {GPU0: [900]}
    assert host.cycle() == [delivered()]
    assert len(list(host.state_dir.glob("bookings.json.damaged-*"))) == 1
    (host.state_dir / "bookings.json").unlink()
    host.processes = {GPU0: []}
    host.serve(spec("s2", booking(gpus=[GPU0], state="release")))
    assert host.cycle()[0]["state"] == "released"
    assert not host.slice().exists() and not host.env().exists()


def test_bookings_are_delivered_from_the_kept_spec_while_the_control_plane_is_away(
    tmp_path: Path,
) -> None:
    """§6, D5: the kept spec's bookings are delivered as its units are applied."""

    class Away(ControlPlane):
        def report(self, *args: Any) -> Any:
            raise Unreachable("away")

    host = Host(tmp_path, spec("s1"))
    host.client = Away(spec("s1"))
    host.agent = host.start()
    host.state.save_spec(spec("s1", booking(gpus=[GPU0])))
    assert host.agent.apply_kept()
    assert host.slice().exists()
    assert host.agent.bookings == [delivered()]


def test_run_dry_run_plans_the_delivery_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """D5, §6: `run --dry-run` delivers nothing: its plan lists each booking's files (with
    their content), the commands (daemon-reload, start) after the units' and the files as new
    against the root, which stays empty; nothing is recorded in the state directory."""

    state = State(tmp_path / "state")
    state.save_spec(spec("s1", booking(gpus=[GPU0], cpus="8-15")))
    root = tmp_path / "root"
    _, invoke = dry_run(monkeypatch, state.directory, root)
    result = invoke("--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    [step] = plan["bookings"]
    slice_path = f"/run/systemd/system/better-compute-{RES_A}.slice"
    env_path = f"/run/better-compute/reservations/{RES_A}.env"
    assert (step["id"], step["state"], step["outcome"]) == (f"booking/{RES_A}", "live", "delivered")
    assert [f["path"] for f in step["files"]] == [slice_path, env_path]
    assert "AllowedCPUs=8-15\n" in step["files"][0]["content"]
    assert step["commands"] == [
        ["systemctl", "daemon-reload"],
        ["systemctl", "start", f"better-compute-{RES_A}.slice"],
    ]
    assert plan["commands"][-2:] == [
        {"unit": f"booking/{RES_A}", "argv": command, "needs": "nothing"}
        for command in step["commands"]
    ]
    assert {(c["path"], c["change"]) for c in plan["diff"]["files"]} >= {
        (slice_path, "new"),
        (env_path, "new"),
    }
    assert os.listdir(root) == []
    assert sorted(os.listdir(state.directory)) == ["spec.json"]
    text = invoke().stdout
    assert f"booking/{RES_A} (live): delivered" in text
    assert f"write {slice_path} (0644)" in text
    assert f"run systemctl start better-compute-{RES_A}.slice" in text


def test_the_release_timeout_option() -> None:
    """D7: `run --release-timeout` defaults to 120 s and takes no less than 1 s."""
    [option] = [p for p in agent.main.run.params if p.name == "release_timeout"]
    assert option.default == 120.0
    result = CliRunner().invoke(
        agent.main.cli,
        [
            *("run", "--controlplane", "http://x", "--join-token-file", "t"),
            *("--state-dir", "s", "--release-timeout", "0.5"),
        ],
    )
    assert result.exit_code == 2 and "--release-timeout" in result.output


def test_a_booking_struct_round_trips_as_the_spec_carries_it() -> None:
    """D5: the agent reads bookings in the wire form the control plane serves (camelCase)."""
    [read] = bookings_of(spec("s1", booking(gpus=[GPU0], cpuQuota=200, memoryNodes="0")))
    assert read == Booking(reservation_id=RES_A, gpus=[GPU0], cpu_quota=200, memory_nodes="0")


def test_d7_a_release_waits_while_nvml_cannot_list_the_gpus_processes(tmp_path: Path) -> None:
    """D7: a release is confirmed only on NVML's word: a GPU whose processes cannot be listed
    (NoPermission, a lost GPU) keeps the booking releasing, then release-blocked saying so."""
    host = Host(tmp_path, spec("s1", booking(gpus=[GPU0])))
    host.cycle()
    host.processes = {}
    host.serve(spec("s2", booking(gpus=[GPU0], state="release")))
    assert host.cycle() == []  # releasing: not reported before the timeout
    host.now += 11
    (blocked,) = host.cycle()
    assert blocked["state"] == "release-blocked"
    assert blocked["reason"] == f"cannot list compute processes on {GPU0}"
    host.processes = {GPU0: []}
    assert host.cycle()[0]["state"] == "released"


def test_d7_a_slot_release_waits_only_for_its_own_processes(tmp_path: Path) -> None:
    """D7, D8: two slot bookings share a GPU; the one ending waits for a process its own
    slice holds (its cgroup says so), not for the other booking's, which runs on."""
    a, b = booking(gpus=[GPU0]), booking(RES_B, gpus=[GPU0])
    host = Host(tmp_path, spec("s1", a, b))
    host.cycle()
    for pid, rid in ((4242, RES_B), (77, RES_A)):
        cgroup = host.root / f"proc/{pid}/cgroup"
        cgroup.parent.mkdir(parents=True)
        cgroup.write_text(f"0::/better-compute.slice/better-compute-{rid}.slice/job.service\n")
    host.processes = {GPU0: [77, 4242]}
    host.serve(spec("s2", booking(gpus=[GPU0], state="release"), b))
    assert [r["state"] for r in host.cycle()] == ["delivered"]  # releasing, not yet reported
    host.now += 11
    assert [r["state"] for r in host.cycle()] == ["release-blocked", "delivered"]
    host.processes = {GPU0: [4242]}  # its own process is gone; the other booking's runs on
    assert [r["state"] for r in host.cycle()] == ["released", "delivered"]
