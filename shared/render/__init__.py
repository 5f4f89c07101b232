"""The NodeSpec renderer: a pool policy as one host's ordered configuration units (N6).

``render`` is pure and deterministic: the same policy, sharing mode, GPU model,
inventory and booked GPUs give byte-identical units, and the version is the
SHA-256 of their canonical JSON (with the booked GPUs), so it moves exactly when
what the host must do moves, or when the bookings that hold some of it back do.
A policy this host cannot take raises ``RenderRefused`` with the policy field
and the reason; the control plane renders against
``representative_inventories`` to refuse such a policy at the API (P6).

What each policy field becomes (modules: host, gpus, miglayout, cluster):

| field           | units                                                                   |
| --------------- | ----------------------------------------------------------------------- |
| `kernelModules` | modprobe.d (blacklist, options; reboot), modules-load.d, a load each    |
| `hugepages`     | 2Mi: sysctl.d drop-in + `vm.nr_hugepages`; 1Gi: kernel arguments        |
| `cpu`           | governor: a oneshot systemd unit + service; isolate: kernel arguments   |
| `iommu`         | `intel_iommu=`/`amd_iommu=` by CPU vendor, `iommu=pt`: kernel arguments |
| `gpu`           | `nvidia-smi -pm`, `-c`, `-i UUID -pl` commands                           |
| `migLayout`     | mig-parted config + `nvidia-mig-parted apply` (drain); booked GPUs kept |
| `replicas`      | device-plugin sharing config; mps: the MPS control daemon (drain)       |
| `kubernetes`    | kubeadm JoinConfiguration (0600) + `kubeadm join`                       |
| `prewarmImages` | `crictl pull` per image                                                 |

Units are ordered so that each finds what it needs in place: module options
before the modules load, files before the services and commands that read
them, GPU settings before MIG, the device plugin's config before the join.

Drain-gated units (H4) need ``"drain"`` and name in ``gpus`` the GPUs they
repartition or reconfigure; the spec's ``booked_gpus`` are the node's GPUs with
a live booking. The agent holds back a drain unit touching a booked GPU (it
reports it ``waiting-drain``); a new spec once the GPUs are idle lets it through.

| unit id                        | gpus                                                    |
| ------------------------------ | ------------------------------------------------------- |
| `mig/apply`                    | the idle GPUs whose MIG mode or instances it changes    |
| `sharing/device-plugin-config` | timeslice, mps: every GPU of the host (mig: not gated)  |
| `sharing/mps-unit-file`        | every GPU of the host                                   |
| `sharing/mps-service`          | every GPU of the host                                   |
"""

import hashlib
from collections.abc import Sequence

import msgspec

from shared.inventory import Inventory
from shared.nodespec import NodeSpecUnits, RenderRefused, Unit
from shared.policy.model import Policy
from shared.render import cluster, gpus, host, miglayout
from shared.render.representative import representative_inventories

__all__ = ["RenderRefused", "render", "representative_inventories", "spec_version"]


def spec_version(units: list[Unit], booked_gpus: Sequence[str] = ()) -> str:
    """SHA-256 (hex) of the units' canonical JSON, and of the booked GPUs when there are any.

    Without booked GPUs the hash is the units' alone (defaults are left out, as a unit's
    are), so a spec that holds nothing back keeps the version it had before H4.
    """
    content: object = units
    if booked_gpus:
        content = {"bookedGpus": sorted(booked_gpus), "units": units}
    return hashlib.sha256(msgspec.json.encode(content, order="deterministic")).hexdigest()


def render(
    policy: Policy,
    *,
    sharing: str,
    gpu_model: str | None,
    inventory: Inventory,
    booked_gpus: frozenset[str] = frozenset(),
    host_size_checks: bool = True,
) -> NodeSpecUnits:
    """The NodeSpec of ``policy`` for the host of ``inventory`` in a pool of ``sharing``.

    ``booked_gpus`` are UUIDs of GPUs with a booked atom: their MIG layout stays (U3), and
    the spec lists them (sorted) so the agent holds back drain units touching them (H4).
    ``host_size_checks=False`` skips what depends on the host's size, not its GPU model
    (huge pages fitting in memory beside ``hostReserve``, isolated CPUs it has): the API
    renders on representative hosts whose size is a guess; each node checks its own.
    Raises ``RenderRefused`` when this host cannot take the policy.
    """
    host.check_hugepages(policy, inventory, host_size_checks=host_size_checks)
    kernel_args = [
        *host.iommu_args(policy, inventory),
        *host.hugepages_args(policy),
        *host.isolation_args(policy, inventory, host_size_checks=host_size_checks),
    ]
    units = [
        *host.kernel_module_units(policy),
        *host.hugepages_units(policy),
        *host.governor_units(policy),
        *host.kernel_args_units(kernel_args),
        *gpus.gpu_setting_units(policy, inventory),
        *miglayout.mig_units(policy, sharing, gpu_model, inventory, booked_gpus),
        *gpus.sharing_units(policy, sharing, inventory),
        *cluster.kubernetes_units(policy, inventory),
        *cluster.prewarm_units(policy),
    ]
    booked = sorted(booked_gpus)
    return NodeSpecUnits(
        version=spec_version(units, booked),
        units=units,
        reboot=any(unit.needs == "reboot" for unit in units),
        booked_gpus=booked,
    )
