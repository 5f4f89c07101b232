"""Delivering a node's bookings on the host (D5), releasing them (D7), only ever its own (D8).

A ``live`` booking gets, under ``root``, the runtime slice
``/run/systemd/system/better-compute-<reservation id>.slice`` (systemd reads each
``-`` of a slice name as a level, so it is a child of ``better-compute.slice``; a
reservation id, ``res_`` and the id alphabet of shared/ids.py, has none of its own)
and the environment file ``/run/better-compute/reservations/<reservation id>.env``,
then ``systemctl daemon-reload`` and ``systemctl start`` the slice. A file is written
only when it differs, so a second cycle writes and runs nothing; one that drifted (a
reboot empties /run) is put back and the slice started again. Before the first
delivery, a compute process NVML lists on one of its devices (a GPU, a MIG instance
or that instance's parent GPU) that no delivered live booking accounts for fails the
booking: ``gpu busy: pid 4242, 4243 on GPU-…``. What was delivered stays delivered,
its own tenant's processes on its GPUs included.

A ``release`` booking's slice is stopped (systemd stops every process in it), both
files are removed and systemd reloaded; it is ``released`` once NVML lists no compute
process on its GPUs or MIG instances. A release still under way is tried again every
cycle and left out of the report; once it has gone on longer than ``release_timeout``
seconds from its first attempt (kept across restarts), it is ``release-blocked`` with
the pids (``pids 4242, 4243 still on GPU-…``), reported every cycle until it is released.

Outcomes stick: a booking reported ``failed`` is never delivered late (the control
plane ends it, D6) and one ``released`` is never delivered again. The report lists
every booking of the spec with its outcome: ``delivered``, ``failed``, ``released``
or ``release-blocked``.

D8: ``bookings.json`` in the state directory records the bookings this agent
delivered. Files are written or removed only for bookings of the spec (its own files
of a ``release`` booking are removed even when the record was lost, R9), and for
recorded ones that have since left the spec: those are released, then forgotten,
without a report. A file the agent did not write for a booking of its spec is never
touched.

``Deliverer.plan`` runs the same cycle with nothing written or run: the steps of
``run --dry-run`` (agent/plan.py).
"""

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from agent.apply import CommandFailed, Runner, error_text
from agent.state import set_aside
from shared import cpulist
from shared.files import atomic_write
from shared.ids import ID_BODY
from shared.inventory import Gpu, Inventory
from shared.nodespec import Booking
from shared.schemas.nodes import BookingReport

log = structlog.get_logger("agent.delivery")

SLICE_DIR = "/run/systemd/system"
ENV_DIR = "/run/better-compute/reservations"
RECORD = "bookings.json"
FILE_MODE = 0o644  # nothing secret in either file
CAPABILITIES = "proc/driver/nvidia/capabilities"
GPU_COMMON_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
NOT_LOADED = 5  # systemctl stop's exit status for a unit systemd does not know: nothing runs
REASON_LENGTH = 500  # BookingReport.reason's limit
RELOAD = ("systemctl", "daemon-reload")
RESERVATION_ID = re.compile(rf"res_{ID_BODY}{{26,52}}")
# A process's /proc/<pid>/cgroup line inside a reservation's slice names the reservation.
SLICE_OF_CGROUP = re.compile(rf"/better-compute-(res_{ID_BODY}{{26,52}})\.slice(/|$)", re.M)

ComputeProcesses = Callable[[], Mapping[str, Sequence[int]]]
Entry = dict[str, Any]  # what the record keeps of one booking


def slice_name(reservation_id: str) -> str:
    return f"better-compute-{reservation_id}.slice"


def paths_of(reservation_id: str) -> tuple[str, str]:
    """The slice and environment files of a booking, as host paths."""
    return f"{SLICE_DIR}/{slice_name(reservation_id)}", f"{ENV_DIR}/{reservation_id}.env"


def booked_devices(booking: Booking) -> list[str]:
    """The GPU and MIG instance UUIDs a booking holds, in placement order."""
    return [*booking.gpus, *booking.mig_instances]


class Undeliverable(ValueError):
    """A booking this host cannot deliver as it stands; the message is the reason reported."""


def cap_minor(root: Path, capability: str) -> int | None:
    """N of /dev/nvidia-caps/nvidia-cap<N> for a capability such as ``gpu0/mig/gi2/ci0``, from
    its ``access`` file (``DeviceFileMinor: N``) under root's /proc; None where there is none."""
    try:
        text = (root / CAPABILITIES / capability / "access").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "DeviceFileMinor" and value.strip().isdigit():
            return int(value)
    return None


def _device_node(gpu: Gpu) -> str:
    if gpu.minor_number is None:
        raise Undeliverable(f"the device node of {gpu.uuid} is not known (no minorNumber)")
    return f"/dev/nvidia{gpu.minor_number}"


def device_nodes(
    booking: Booking, inventory: Inventory, caps: Callable[[str], int | None]
) -> list[str]:
    """The device nodes the slice allows: each booked GPU's ``/dev/nvidia<minor>``, a MIG
    instance's parent's and its capabilities where the host has them (CUDA opens both the GPU
    instance's and the compute instance's), then nvidiactl and the UVM devices; none without
    a GPU. Undeliverable for a device this host does not have or whose minor is unknown."""
    gpus = {gpu.uuid: gpu for gpu in inventory.gpus}
    instances = {mig.uuid: (gpu, mig) for gpu in inventory.gpus for mig in gpu.mig_instances}
    nodes: dict[str, None] = {}  # ordered, each once: MIG instances may share a parent
    for uuid in booking.gpus:
        if uuid not in gpus:
            raise Undeliverable(f"{uuid} is not on this host")
        nodes[_device_node(gpus[uuid])] = None
    for uuid in booking.mig_instances:
        if uuid not in instances:
            raise Undeliverable(f"{uuid} is not on this host")
        gpu, mig = instances[uuid]
        nodes[_device_node(gpu)] = None
        instance = f"gpu{gpu.minor_number}/mig/gi{mig.gpu_instance_id}"
        for capability in (instance, f"{instance}/ci{mig.compute_instance_id}"):
            minor = caps(capability)
            if minor is not None:
                nodes[f"/dev/nvidia-caps/nvidia-cap{minor}"] = None
    if nodes:
        nodes.update(dict.fromkeys(GPU_COMMON_DEVICES))
    return list(nodes)


def _cpulist(field: str, text: str) -> str:
    try:
        return cpulist.format(cpulist.parse(text))
    except ValueError:
        raise Undeliverable(f"{field} is not a cpulist: {text[:64]!r}") from None


def slice_unit(booking: Booking, nodes: Sequence[str]) -> str:
    """The slice file: CPUs (pinned, or the affine CPUs a shared quota runs on), memory, and
    only the given devices."""
    cpus = _cpulist("cpus", booking.cpus)
    memory_nodes = _cpulist("memoryNodes", booking.memory_nodes)
    lines = [
        "[Unit]",
        f"Description=Better Compute reservation {booking.reservation_id}",
        "",
        "[Slice]",
    ]
    if cpus:
        lines.append(f"AllowedCPUs={cpus}")
    if booking.cpu_quota is not None:
        if booking.cpu_quota < 1:
            raise Undeliverable(f"cpuQuota {booking.cpu_quota} is not a positive percent")
        lines.append(f"CPUQuota={booking.cpu_quota}%")
    if memory_nodes:
        lines.append(f"AllowedMemoryNodes={memory_nodes}")
    if booking.memory_bytes is not None:
        if booking.memory_bytes < 1:
            raise Undeliverable(f"memoryBytes {booking.memory_bytes} is not a size")
        lines.append(f"MemoryMax={booking.memory_bytes}")
    lines.append("DevicePolicy=closed")
    lines += [f"DeviceAllow={node} rw" for node in nodes]
    return "\n".join(lines) + "\n"


def environment(booking: Booking) -> str:
    """The environment file a runtime starts the tenant's work with."""
    visible = ",".join(booked_devices(booking))
    return (
        f"CUDA_VISIBLE_DEVICES={visible}\n"
        f"NVIDIA_VISIBLE_DEVICES={visible}\n"
        f"BETTER_COMPUTE_RESERVATION={booking.reservation_id}\n"
        f"BETTER_COMPUTE_CPUS={_cpulist('cpus', booking.cpus)}\n"
    )


def files_of(
    booking: Booking, inventory: Inventory, caps: Callable[[str], int | None]
) -> list[tuple[str, str]]:
    """(host path, content) of the slice and environment files; Undeliverable when the host
    cannot take the booking (its devices are checked first, so the environment names only
    devices of this host)."""
    slice_path, env_path = paths_of(booking.reservation_id)
    unit = slice_unit(booking, device_nodes(booking, inventory, caps))
    return [(slice_path, unit), (env_path, environment(booking))]


def _reason(head: str, pids: Sequence[int], where: str, devices: Sequence[str]) -> str:
    """``<head> 4242, 4243 <where> GPU-…``, without the devices when that is too long."""
    text = f"{head} {', '.join(map(str, pids))}"
    full = f"{text} {where} {', '.join(devices)}"
    return full if len(full) <= REASON_LENGTH else text[:REASON_LENGTH]


def read_record(path: Path) -> dict[str, Entry]:
    """The bookings this agent delivered (empty when none); ValueError if unreadable."""
    try:
        found = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    if not isinstance(found, dict) or not all(
        isinstance(e, dict) and "state" in e and isinstance(e.get("devices"), list)
        for e in found.values()
    ):
        raise ValueError("not a record of delivered bookings")
    return found


class _Effects:
    """What a cycle does to the host under ``root``: done, as delivering does."""

    def __init__(self, root: Path, runner: Runner | None, record: Path) -> None:
        self.root = root
        self.runner = runner
        self.record_path = record

    def on_host(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def record(self) -> dict[str, Entry]:
        """What earlier cycles delivered; a damaged record is set aside (R9)."""
        try:
            return read_record(self.record_path)
        except ValueError as exc:
            set_aside(self.record_path, str(exc))
            return {}

    def save(self, record: Mapping[str, Entry]) -> None:
        body = json.dumps(record, indent=1, sort_keys=True).encode()
        atomic_write(self.record_path, body, 0o600)

    def write(self, reservation_id: str, path: str, content: str) -> None:
        atomic_write(self.on_host(path), content.encode(), FILE_MODE)

    def delete(self, reservation_id: str, path: str) -> None:
        self.on_host(path).unlink(missing_ok=True)

    def run(self, reservation_id: str, argv: Sequence[str], ok: Sequence[int] = (0,)) -> None:
        assert self.runner is not None
        outcome = self.runner.run(argv)
        log.info("ran", argv=list(argv), code=outcome.returncode, reservation=reservation_id)
        if outcome.returncode not in ok:
            raise CommandFailed(f"{' '.join(argv)} exited {outcome.returncode}: {outcome.output}")


class _Planned(_Effects):
    """The same cycle written down, per booking, with nothing written or run (--dry-run)."""

    def __init__(self, root: Path, record: Path) -> None:
        super().__init__(root, None, record)
        self.steps: dict[str, dict[str, list[Any]]] = {}

    def step(self, reservation_id: str) -> dict[str, list[Any]]:
        return self.steps.setdefault(reservation_id, {"files": [], "delete": [], "commands": []})

    def record(self) -> dict[str, Entry]:
        try:
            return read_record(self.record_path)
        except (OSError, ValueError):  # a damaged record is the delivery's to set aside
            return {}

    def save(self, record: Mapping[str, Entry]) -> None:
        pass

    def write(self, reservation_id: str, path: str, content: str) -> None:
        file = {"path": path, "mode": f"{FILE_MODE:04o}", "content": content}
        self.step(reservation_id)["files"].append(file)

    def delete(self, reservation_id: str, path: str) -> None:
        self.step(reservation_id)["delete"].append(path)

    def run(self, reservation_id: str, argv: Sequence[str], ok: Sequence[int] = (0,)) -> None:
        self.step(reservation_id)["commands"].append(list(argv))


class _Cycle:
    """One pass over the spec's bookings and the record; ``run`` gives each booking's entry
    (None: forgotten)."""

    def __init__(
        self,
        deliverer: "Deliverer",
        effects: _Effects,
        bookings: Sequence[Booking],
        inventory: Inventory,
    ) -> None:
        self.deliverer = deliverer
        self.fx = effects
        self.inventory = inventory
        self.spec: dict[str, Booking] = {}
        for booking in bookings:
            if RESERVATION_ID.fullmatch(booking.reservation_id):
                self.spec[booking.reservation_id] = booking
            else:  # it would name a path: never used, nor reported
                log.error("booking refused: not a reservation id", id=booking.reservation_id[:80])
        self.live = {rid for rid, b in self.spec.items() if b.state == "live"}
        self.found: dict[str, list[int]] | None = None

    def processes(self) -> dict[str, list[int]]:
        """NVML's compute processes per GPU and MIG instance UUID, read once a cycle, when asked."""
        if self.found is None:
            self.found = {d: sorted(set(p)) for d, p in self.deliverer.processes().items()}
        return self.found

    def run(self) -> dict[str, Entry | None]:
        record = self.fx.record()
        before = json.dumps(record, sort_keys=True)
        outcomes: dict[str, Entry | None] = {}
        for rid, booking in self.spec.items():
            entry = record.get(rid)
            state = None if entry is None else entry["state"]
            if booking.state == "live" and state in (None, "delivered"):
                entry = self.deliver(booking, entry, record)
            elif entry is None or not (booking.state == "live" and state == "failed"):
                entry = self.release(booking, entry, record)
            # else reported failed: the control plane ends it (D6), never delivered late
            record[rid] = outcomes[rid] = entry
        for rid in [rid for rid in record if rid not in self.spec]:
            if self.forget(rid, record[rid]):
                del record[rid]
                outcomes[rid] = None
        if json.dumps(record, sort_keys=True) != before:  # an idle cycle writes nothing
            self.fx.save(record)
        return outcomes

    def in_place(self, path: str, content: str) -> bool:
        target = self.fx.on_host(path)
        return (
            target.is_file()
            and target.read_bytes() == content.encode()
            and target.stat().st_mode & 0o7777 == FILE_MODE
        )

    def deliver(self, booking: Booking, entry: Entry | None, record: dict[str, Entry]) -> Entry:
        rid = booking.reservation_id
        devices = booked_devices(booking)
        try:
            files = files_of(booking, self.inventory, self.deliverer.cap_minor)
        except Undeliverable as exc:
            if entry is None:
                return {"state": "failed", "devices": devices, "reason": str(exc)}
            log.error(
                "a delivered booking no longer fits the host", reservation=rid, error=str(exc)
            )
            return entry
        drifted = [(path, content) for path, content in files if not self.in_place(path, content)]
        if entry is None and drifted:
            busy = self.busy(booking, record)
            if busy is not None:
                return {"state": "failed", "devices": devices, "reason": busy}
            # Recorded before anything is written: a crash in between leaves files of its own.
            record[rid] = {"state": "delivered", "devices": devices, "installed": True}
            self.fx.save(record)
        elif entry is None:
            log.info("delivered before its record was kept", reservation=rid)  # R9: a lost record
        elif not drifted and entry.get("started"):
            return entry
        delivered = {"state": "delivered", "devices": devices, "installed": True}
        try:
            for path, content in drifted:
                self.fx.write(rid, path, content)
            self.fx.run(rid, RELOAD)
            self.fx.run(rid, ["systemctl", "start", slice_name(rid)])
        except (OSError, CommandFailed) as exc:
            if entry is None:
                return {**delivered, "state": "failed", "reason": error_text(exc)}
            # Delivered once, its tenant may run in it: put back next cycle, still delivered.
            log.error("cannot put a delivered booking back", reservation=rid, error=str(exc))
            return {**delivered, "started": False}
        return {**delivered, "started": True}

    def busy(self, booking: Booking, record: Mapping[str, Entry]) -> str | None:
        """``gpu busy: …`` when a device of the booking (a MIG instance's parent too) runs a
        compute process that no other delivered live booking accounts for (D5)."""
        parents = [
            gpu.uuid
            for gpu in self.inventory.gpus
            for mig in gpu.mig_instances
            if mig.uuid in booking.mig_instances
        ]
        devices = list(dict.fromkeys([*booked_devices(booking), *parents]))
        found = self.processes()
        accounted = {
            pid
            for rid, entry in record.items()
            if rid in self.live and rid != booking.reservation_id and entry["state"] == "delivered"
            for device in entry["devices"]
            for pid in found.get(device, [])
        }
        busy = {d: [p for p in found.get(d, []) if p not in accounted] for d in devices}
        busy = {d: pids for d, pids in busy.items() if pids}
        if not busy:
            return None
        pids = sorted({pid for pids in busy.values() for pid in pids})
        return _reason("gpu busy: pid", pids, "on", list(busy))

    def owner(self, pid: int) -> str | None:
        """The reservation whose slice the process runs in (its cgroup), if the host says."""
        try:
            cgroup = self.fx.on_host(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return None
        found = SLICE_OF_CGROUP.search(cgroup)
        return found[1] if found else None

    def release(self, booking: Booking, entry: Entry | None, record: Mapping[str, Entry]) -> Entry:
        if entry is not None and entry["state"] == "released":
            return entry
        if entry is None or "since" not in entry:  # the first attempt: the timeout counts from it
            devices = booked_devices(booking) if entry is None else entry["devices"]
            entry = {**(entry or {}), "state": "releasing", "devices": devices}
            entry["since"] = self.deliverer.clock()
        try:
            entry = self.uninstall(booking.reservation_id, entry)
        except (OSError, CommandFailed) as exc:
            return self.waited(entry, error_text(exc))
        found = self.processes()
        rid = booking.reservation_id
        # A slot's GPU is shared with other live bookings: a process there is this booking's
        # only when its cgroup says so; on a device of its own, any process is.
        shared = {
            device
            for other, held in record.items()
            if other in self.live and other != rid and held["state"] == "delivered"
            for device in held["devices"]
        }
        unknown = [d for d in entry["devices"] if d not in found]
        if unknown:  # NVML cannot say what runs there: not released on no evidence (D7)
            reason = f"cannot list compute processes on {', '.join(unknown)}"
            return self.waited(entry, reason[:REASON_LENGTH])
        left = {
            d: mine
            for d in entry["devices"]
            if (
                mine := [
                    p
                    for p in found[d]
                    if self.owner(p) == rid or (d not in shared and self.owner(p) is None)
                ]
            )
        }
        if not left:
            return {"state": "released", "devices": entry["devices"]}
        pids = sorted({pid for pids in left.values() for pid in pids})
        return self.waited(
            entry, _reason("pid" if len(pids) == 1 else "pids", pids, "still on", list(left))
        )

    def waited(self, entry: Entry, reason: str) -> Entry:
        """A release not done yet: release-blocked once it has taken longer than the timeout."""
        if self.deliverer.clock() - entry["since"] > self.deliverer.release_timeout:
            return {**entry, "state": "release-blocked", "reason": reason}
        return {**entry, "reason": reason}

    def uninstall(self, rid: str, entry: Entry) -> Entry:
        """Stop the slice, remove its files, reload: once, where they may be on the host."""
        present = [path for path in paths_of(rid) if self.fx.on_host(path).exists()]
        if not entry.get("installed") and not present:
            return entry
        self.fx.run(rid, ["systemctl", "stop", slice_name(rid)], ok=(0, NOT_LOADED))
        for path in present:
            self.fx.delete(rid, path)
        self.fx.run(rid, RELOAD)
        return {**entry, "installed": False}

    def forget(self, rid: str, entry: Entry) -> bool:
        """A recorded booking that left the spec: released (files and slice) without a report."""
        try:
            self.uninstall(rid, entry)
        except (OSError, CommandFailed) as exc:
            log.error(
                "cannot release a booking that left the spec", reservation=rid, error=str(exc)
            )
            return False
        return True


class Deliverer:
    """Delivers and releases the bookings of a NodeSpec under ``root`` (``/`` on a host) with
    the Applier's runner; ``processes`` gives NVML's compute processes per device UUID."""

    def __init__(
        self,
        root: Path,
        state_dir: Path,
        runner: Runner,
        processes: ComputeProcesses,
        release_timeout: float = 120.0,
        clock: Callable[[], float] = time.time,  # wall time: the timeout survives restarts
    ) -> None:
        self.root = root
        self.record_path = state_dir / RECORD
        self.runner = runner
        self.processes = processes
        self.release_timeout = release_timeout
        self.clock = clock

    def cap_minor(self, capability: str) -> int | None:
        return cap_minor(self.root, capability)

    def deliver(self, bookings: Sequence[Booking], inventory: Inventory) -> list[BookingReport]:
        """One cycle; the outcome of every booking of the spec that has one, in its order."""
        effects = _Effects(self.root, self.runner, self.record_path)
        outcomes = _Cycle(self, effects, bookings, inventory).run()
        reports = []
        for rid, entry in outcomes.items():
            if entry is not None and entry["state"] != "releasing":
                reason = entry.get("reason")
                # A longer reason (a command's output) would have the whole report refused.
                reason = None if reason is None else reason[:REASON_LENGTH]
                reports.append(
                    BookingReport(reservation_id=rid, state=entry["state"], reason=reason)
                )
        return reports

    def plan(self, bookings: Sequence[Booking], inventory: Inventory) -> list[dict[str, Any]]:
        """What a cycle would do now, one step per booking (``booking/<reservation id>``): the
        files it writes (with their content), deletes and the commands it runs, in order, and
        the outcome (``releasing``: a release that waits for processes; ``forgotten``)."""
        effects = _Planned(self.root, self.record_path)
        cycle = _Cycle(self, effects, bookings, inventory)
        outcomes = cycle.run()
        steps = []
        for rid, entry in outcomes.items():
            booking = cycle.spec.get(rid)
            steps.append(
                {
                    "id": f"booking/{rid}",
                    "reservationId": rid,
                    "state": "gone" if booking is None else booking.state,
                    **effects.step(rid),
                    "outcome": "forgotten" if entry is None else entry["state"],
                    "reason": None if entry is None else entry.get("reason"),
                }
            )
        return steps
