"""GPU model families: the pool key derived from an NVML device name (DESIGN N1).

``family_of("NVIDIA H100 80GB HBM3") == "H100"``. The rule is the team
reference's (nvml-names.md §5):

1. strip and collapse whitespace; a MIG handle's name is cut at ``" MIG "``;
2. the DGX Station display GPU is no pool member (``None``);
3. leading brand words ``NVIDIA``, ``Tesla``, ``GeForce`` go, repeatedly and in
   any case; ``Quadro`` stays, so ``Quadro RTX 6000`` is not ``RTX 6000``;
4. workstation names (first word ``RTX``, ``TITAN``, ``Quadro``, ``GTX``) keep
   every word, joined with ``-`` and upper-cased, less a trailing
   ``Generation`` / ``[Server|Workstation] Edition`` / ``Max-Q …``;
5. any other name is its first token (split on space, ``-``, ``_``), upper-cased,
   except that a vGPU guest's name (``vGPU-48GB``, ``GRID T4-16Q``, ``A40-48Q``)
   is ``VGPU``, never the physical model it is carved from;
6. a PCI device id classifies what the name cannot (engineering boards such as
   ``NVIDIA PG506-232``).

Families compare with ``==`` only: ``H20`` is not ``H200``, ``L4`` is not
``L40``, ``B200`` is not ``GB200``. No caller may use prefixes or substrings.
"""

import functools
import re
from typing import Final

import msgspec

from shared.inventory import Inventory

NVIDIA_VENDOR_ID: Final = 0x10DE

# Device names (after whitespace collapsing, compared case-insensitively) that
# are never pool members: go-nvlib's skip list.
_SKIP: Final = frozenset({"dgx display", "nvidia dgx display"})

_BRANDS: Final = frozenset({"nvidia", "tesla", "geforce"})
_WORKSTATION_LINES: Final = frozenset({"rtx", "titan", "quadro", "gtx"})

# A vGPU guest sees a virtual device, never the physical model: "NVIDIA vGPU-48GB",
# or a vGPU type such as "GRID T4-16Q" / "NVIDIA A40-48Q" / "NVIDIA A100-4C"
# (<board>-<framebuffer GB><series letter>). Pooling one with real GPUs of that
# model would sell a slice as a whole card.
VGPU: Final = "VGPU"
_VGPU_TYPE: Final = re.compile(r"^[A-Z0-9]+-\d+[ABCQ]$", re.IGNORECASE)

_SPLIT_TOKEN: Final = re.compile(r"[ _-]")

# pciDeviceId >> 16 → family, from the pciDeviceId column of nvml-names.md §1.
# None marks a device that is never a pool member (the DGX Station display GPU).
_BY_DEVICE_ID: Final[dict[int, str | None]] = {
    0x20B0: "A100",  # A100-SXM4-40GB
    0x20B1: "A100",  # A100-PCIE-40GB (older tables)
    0x20F1: "A100",  # A100-PCIE-40GB
    0x20B2: "A100",  # A100-SXM4-80GB
    0x20B5: "A100",  # A100 80GB PCIe
    0x20B3: "A100",  # A100-SXM-64GB
    0x20F3: "A800",  # A800-SXM4-80GB
    0x20F5: "A800",  # A800 80GB PCIe
    0x20BD: "A800",  # A800-SXM4-40GB
    0x20F6: "A800",  # A800 40GB Active
    0x20B7: "A30",
    0x2235: "A40",
    0x2236: "A10",
    0x2237: "A10G",
    0x1EB8: "T4",
    0x1DB1: "V100",  # V100-SXM2-16GB
    0x1DB5: "V100",  # V100-SXM2-32GB
    0x2330: "H100",  # H100 80GB HBM3 (SXM5)
    0x2331: "H100",  # H100 PCIe
    0x2321: "H100",  # H100 NVL
    0x2339: "H100",  # H100 (94 GB SXM5?)
    0x233D: "H100",  # H100-96GB (mig-parted)
    0x2324: "H800",
    0x2322: "H800",  # H800 PCIe
    0x233A: "H800",  # H800 NVL
    0x2335: "H200",
    0x233B: "H200",  # H200 NVL
    0x2329: "H20",
    0x232C: "H20",  # H20-3e
    0x230E: "H20",  # H20 NVL16
    0x2342: "GH200",  # GH200 480GB / 120GB
    0x2348: "GH200",  # GH200 144G HBM3e
    0x2901: "B200",
    0x2909: "B200",
    0x2941: "GB200",
    0x3182: "B300",  # B300 SXM6 AC
    0x31C2: "GB300",
    0x31C3: "GB300",
    0x26B9: "L40S",
    0x26B5: "L40",
    0x27B8: "L4",
    0x26BA: "L20",
    0x2684: "RTX-4090",
    0x2685: "RTX-4090-D",
    0x26B1: "RTX-6000-ADA",
    0x2230: "RTX-A6000",
    0x2BB5: "RTX-PRO-6000-BLACKWELL",  # Server Edition
    0x2BB1: "RTX-PRO-6000-BLACKWELL",  # Workstation Edition
    0x2BB4: "RTX-PRO-6000-BLACKWELL",  # Max-Q Workstation Edition
    0x1FB0: None,  # DGX Display
}

# Families the rule is known to produce for real products. A name whose family
# is not one of these (an engineering board's "PG506") defers to the PCI table.
KNOWN_FAMILIES: Final = frozenset(
    {f for f in _BY_DEVICE_ID.values() if f is not None}
    | {"B100", "V100S", "QUADRO-RTX-6000"}  # no PCI id in the table
)


def family_of(name: str, pci_device_id: int | None = None) -> str | None:
    """The model family of a GPU from its NVML name, or None when it is no pool member.

    ``pci_device_id`` is ``nvmlPciInfo_t.pciDeviceId`` (``(device << 16) | 0x10DE``)
    or a bare 16-bit device id; it decides only when the name gives no known family.
    """
    text = " ".join(name.split()).partition(" MIG ")[0]
    if text.casefold() in _SKIP:
        return None
    words = text.split(" ")
    while words and words[0].casefold() in _BRANDS:
        words.pop(0)
    family = _family_from_words(words)
    if family == VGPU or family in KNOWN_FAMILIES:
        return family
    # Step 6: an engineering or unknown name defers to a PCI id the table knows.
    device = _device_id(pci_device_id) if pci_device_id is not None else None
    if device is not None and device in _BY_DEVICE_ID:
        return _BY_DEVICE_ID[device]
    return family


def _family_from_words(words: list[str]) -> str | None:
    """Steps 4–5 of the rule, on the name's words without the brand words."""
    if not words or not words[0]:
        return None
    if words[0].casefold() in _WORKSTATION_LINES:
        return "-".join(_drop_edition(words)).upper()
    if _is_vgpu(words):
        return VGPU
    return _SPLIT_TOKEN.split(words[0], maxsplit=1)[0].upper() or None


def _is_vgpu(words: list[str]) -> bool:
    """Whether the name is a vGPU guest's: ``vGPU-48GB``, ``GRID T4-16Q``, ``A40-48Q``."""
    if words[0].casefold() == "grid" and len(words) > 1:
        words = words[1:]
    token = words[0]
    return _SPLIT_TOKEN.split(token, maxsplit=1)[0].casefold() == "vgpu" or bool(
        _VGPU_TYPE.match(token)
    )


def _drop_edition(words: list[str]) -> list[str]:
    """Drop the marketing tail: ``Max-Q …``, ``[Server|Workstation] Edition``, ``Generation``."""
    folded = [w.casefold() for w in words]
    if "max-q" in folded:
        words = words[: folded.index("max-q")]
        folded = folded[: len(words)]
    if folded and folded[-1] == "edition":
        words, folded = words[:-1], folded[:-1]
        if folded and folded[-1] in ("server", "workstation"):
            words = words[:-1]
    elif folded and folded[-1] == "generation":
        words = words[:-1]
    return words


def _device_id(pci_device_id: int) -> int | None:
    """The 16-bit device id of a full ``pciDeviceId`` (or of a bare device id)."""
    if pci_device_id <= 0xFFFF:
        return pci_device_id
    if pci_device_id & 0xFFFF != NVIDIA_VENDOR_ID:
        return None
    return pci_device_id >> 16


# A fleet has few distinct GPU names; every report asks again for the same ones.
_family = functools.lru_cache(maxsize=4096)(family_of)


def with_families(inventory: Inventory) -> Inventory:
    """The inventory with each GPU's family derived from its NVML name and PCI id (N1).

    The control plane calls this on every inventory it receives: a host's word for
    its family is never trusted.
    """
    families = [_family(gpu.name, gpu.pci_device_id) for gpu in inventory.gpus]
    if all(gpu.family == family for gpu, family in zip(inventory.gpus, families, strict=True)):
        return inventory  # the agent said the same: nothing to rewrite
    gpus = [
        msgspec.structs.replace(gpu, family=family)
        for gpu, family in zip(inventory.gpus, families, strict=True)
    ]
    return msgspec.structs.replace(inventory, gpus=gpus)
