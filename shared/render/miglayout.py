"""MIG units: the pool's ``migLayout`` as a mig-parted config per GPU, and its apply (U3).

A layout is checked against the host's own GPUs: profile names are per memory
class (mig-profiles.md §3), so a GPU offers the profiles of its family's variant
of its memory size, and the instances must fit one GPU (``shared.mig``). GPUs
with a booked atom keep the instances they have.

``mig/apply`` is drain-gated (H4): its ``gpus`` are the GPUs it repartitions,
the idle ones whose MIG mode or instances are not yet the layout's. A booked GPU
is never among them (its instances are described as they are), and a GPU already
in its layout is not either, so it stays placeable while the others change.
"""

import hashlib
import math
from collections import Counter
from collections.abc import Mapping, Sequence

from msgspec import UNSET

from shared import mig
from shared.gpu import family_of
from shared.inventory import Gpu, Inventory
from shared.nodespec import RenderRefused, Unit
from shared.policy.model import Policy
from shared.render.text import Yaml, command_unit, file_unit, yaml_document

# Our own file beside nvidia-mig-manager's config.yaml, whose named configs its boot service uses.
MIG_PARTED_CONF = "/etc/nvidia-mig-manager/better-compute.yaml"
MIG_CONFIG_NAME = "better-compute"


def _label(gpu: Gpu) -> str:
    return f"GPU {gpu.index} ({gpu.name})"


def _family(gpu: Gpu, gpu_model: str | None) -> str | None:
    return gpu.family or family_of(gpu.name, gpu.pci_device_id) or gpu_model


def _full_size_gb(variant: mig.Variant) -> set[int]:
    """The memory class of a variant: the GB of its whole-GPU profile (7g.80gb → 80)."""
    prefix = f"{variant.compute_slices}g."
    return {
        int(name.removeprefix(prefix).split("gb")[0])
        for name in variant.profiles
        if name.startswith(prefix)
    }


def profiles_of(gpu: Gpu, family: str | None) -> frozenset[str]:
    """The MIG profiles this GPU offers: its family's variant of its memory class.

    Names are per memory size (1g.5gb on a 40 GB A100, 1g.10gb on an 80 GB one), and
    the class is go-nvlib's: total memory rounded up to whole GiB. Empty: no MIG.
    """
    variants = mig.VARIANTS.get(family or "", ())
    if not gpu.mig_supported or not variants:
        return frozenset()
    if len(variants) == 1 or not gpu.memory_bytes:
        return frozenset(p for v in variants for p in v.profiles)
    size = math.ceil(gpu.memory_bytes / 2**30)
    exact = [v for v in variants if size in _full_size_gb(v)]

    def distance(variant: mig.Variant) -> float:
        return min((abs(gb - size) for gb in _full_size_gb(variant)), default=math.inf)

    # Off-table totals (older drivers report a little less) take the nearest class.
    chosen = exact or [min(variants, key=distance)]
    return frozenset(p for v in chosen for p in v.profiles)


def _layout_for(gpu: Gpu, layout: Mapping[str, Sequence[str]]) -> tuple[str, Sequence[str]] | None:
    """The layout key and profiles a GPU takes: its own UUID's, else "default"."""
    for key in (gpu.uuid, "default"):
        if key in layout:
            return key, layout[key]
    return None


def _check_layout(key: str, profiles: Sequence[str], gpu: Gpu, family: str | None) -> None:
    field = f"migLayout.{key}"
    offered = profiles_of(gpu, family)
    if not offered:
        raise RenderRefused(field, f"{_label(gpu)} does not support MIG")
    for profile in profiles:
        if profile not in offered:
            raise RenderRefused(
                field,
                f"profile {profile} does not exist on {_label(gpu)}, "
                f"which offers {', '.join(sorted(offered))}",
            )
    # Every variant of a family places instances alike (mig.py), so the family's
    # answer is this GPU's once its profiles are known to be this GPU's own.
    if family is None or not mig.layout_fits(family, profiles):
        raise RenderRefused(field, f"{' + '.join(profiles)} does not fit on {_label(gpu)}")


def mig_units(
    policy: Policy,
    sharing: str,
    gpu_model: str | None,
    inventory: Inventory,
    booked_gpus: frozenset[str],
) -> list[Unit]:
    """The mig-parted layout per GPU and its apply; booked GPUs keep what they have (U3)."""
    layout = policy.migLayout
    if sharing != "mig" or layout is UNSET:
        return []
    if not inventory.gpus:
        raise RenderRefused("migLayout", "this host has no GPUs to partition")
    wanted: list[tuple[Gpu, bool, dict[str, int]]] = []  # (gpu, MIG on, profile → count)
    changing: list[str] = []  # the GPUs mig-parted repartitions: H4's drain-gated GPUs
    for gpu in inventory.gpus:
        chosen = _layout_for(gpu, layout)
        if chosen is None:
            continue  # a GPU no key names is left as it is: mig-parted skips unlisted ones
        if gpu.uuid in booked_gpus:
            # Its instances hold bookings: describe them as they are, so mig-parted
            # finds this GPU already configured and does not touch it.
            current = Counter(instance.profile for instance in gpu.mig_instances)
            wanted.append((gpu, gpu.mig_current, dict(sorted(current.items()))))
            continue
        key, profiles = chosen
        _check_layout(key, profiles, gpu, _family(gpu, gpu_model))
        devices = dict(sorted(Counter(profiles).items()))
        wanted.append((gpu, True, devices))
        if not _in_layout(gpu, devices):
            changing.append(gpu.uuid)
    if not wanted:
        return []
    text = yaml_document({"version": "v1", "mig-configs": {MIG_CONFIG_NAME: _mig_entries(wanted)}})
    digest = hashlib.sha256(text.encode()).hexdigest()
    return [
        file_unit("mig/layout-file", MIG_PARTED_CONF, text),
        # The argv never changes, so the note carries the layout's digest: a new layout
        # is a new unit, and the agent runs the apply again. Repartitioning destroys the
        # instances of the GPUs it changes: drain them first (H4: they are its gpus).
        command_unit(
            "mig/apply",
            ["nvidia-mig-parted", "apply", "-f", MIG_PARTED_CONF, "-c", MIG_CONFIG_NAME],
            note=f"layout sha256:{digest}",
            needs="drain",
            every_boot=True,  # GPU instances are gone after a reboot; MIG mode is not
            gpus=changing,
            gpus_from_inventory=True,  # the GPUs not yet in their layout, by the inventory
        ),
    ]


def _in_layout(gpu: Gpu, devices: Mapping[str, int]) -> bool:
    """Whether the GPU already is what mig-parted would make it: MIG on (and staying on),
    with exactly these instances. Such a GPU is not repartitioned, so it is not drained."""
    current = Counter(instance.profile for instance in gpu.mig_instances)
    return gpu.mig_current and gpu.mig_pending and current == Counter(devices)


def _mig_entries(wanted: Sequence[tuple[Gpu, bool, dict[str, int]]]) -> list[Yaml]:
    """One mig-parted entry per distinct layout, listing the GPU indices that take it."""
    groups: dict[tuple[bool, tuple[tuple[str, int], ...]], list[int]] = {}
    for gpu, enabled, devices in wanted:
        groups.setdefault((enabled, tuple(devices.items())), []).append(gpu.index)
    entries: list[Yaml] = []
    for (enabled, profiles), indices in groups.items():
        entry: dict[str, Yaml] = {"devices": indices, "mig-enabled": enabled}
        if enabled:  # mig-parted refuses mig-devices on a GPU with MIG off
            entry["mig-devices"] = dict(profiles)
        entries.append(entry)
    return entries
