"""The typed view of a pool policy: the fields the code reads (DESIGN §5).

Unknown top-level fields are kept as given (P9): the stored policy is the raw
object, and this model is only how validators and readers see the known
fields. Inside a known field, unknown keys are refused: a typo in
`hugepages` must not be silently ignored. ``policy_warnings`` names the fields
the model does not know, with the known name closest to each, so that a typo at
the top level (``hugepage``) does not pass silently either.
"""

import difflib
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Annotated, Any, Literal

import msgspec
import msgspec.inspect as mi
from msgspec import UNSET, Meta, Struct, UnsetType

from shared.validation import whole

# N4: any positive number is stored as given; the reconciler clamps it to 0.1…100.
Ratio = Annotated[float, Meta(gt=0)]
# A module name never starts with "-": modprobe would read it as an option.
ModuleName = Annotated[str, Meta(pattern=whole(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,63}$"))]
ModuleOptions = Annotated[
    str, Meta(max_length=1024, pattern=whole(r"^[A-Za-z0-9_]+=\S+( [A-Za-z0-9_]+=\S+)*$"))
]
CpuList = Annotated[str, Meta(max_length=256, pattern=whole(r"^\d+(-\d+)?(,\d+(-\d+)?)*$"))]
Duration = Annotated[str, Meta(max_length=16, pattern=whole(r"^[1-9][0-9]{0,5}(s|m|h|d)$"))]
ImageRef = Annotated[
    str,
    Meta(
        max_length=512,
        pattern=whole(
            r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*"
            r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$"
        ),
    ),
]
MigProfile = Annotated[
    str, Meta(max_length=32, pattern=whole(r"^([1-9]c\.)?[1-9]g\.[0-9]+gb([+-][a-z.]+)?$"))
]
MigKey = Annotated[str, Meta(pattern=whole(r"^(default|GPU-[0-9a-fA-F-]{36})$"))]


def cpu_ranges(spec: CpuList) -> list[tuple[int, int]]:
    """A CpuList such as ``2-7,10`` as (low, high) ranges, in the order written."""
    ranges = []
    for part in spec.split(","):
        low, _, high = part.partition("-")
        ranges.append((int(low), int(high or low)))
    return ranges


class Section(Struct, forbid_unknown_fields=True):
    """A known policy field: unknown keys inside it are refused."""


class Acceptance(Section):
    kind: Literal["diag.nvml"]


class Overcommit(Section, omit_defaults=True):
    vcpu: Ratio | UnsetType = UNSET
    memoryGiB: Ratio | UnsetType = UNSET
    diskGiB: Ratio | UnsetType = UNSET


class HostReserve(Section):
    vcpu: Annotated[int, Meta(ge=0, le=100_000)] = 0
    memoryGiB: Annotated[float, Meta(ge=0, le=1_048_576)] = 0


class Hugepages(Section, rename={"pages_2mi": "2Mi", "pages_1gi": "1Gi"}):
    pages_2mi: Annotated[int, Meta(ge=0, le=16_777_216)] = 0
    pages_1gi: Annotated[int, Meta(ge=0, le=65_536)] = 0


class KernelModules(Section):
    load: Annotated[list[ModuleName], Meta(max_length=128)] = msgspec.field(default_factory=list)
    blacklist: Annotated[list[ModuleName], Meta(max_length=128)] = msgspec.field(
        default_factory=list
    )
    options: dict[ModuleName, ModuleOptions] = msgspec.field(default_factory=dict)


class Cpu(Section):
    governor: Literal["performance", "powersave", "schedutil", "ondemand"] | UnsetType = UNSET
    isolate: CpuList | UnsetType = UNSET


class Iommu(Section):
    mode: Literal["on", "passthrough", "off"]


class Gpu(Section):
    persistenceMode: bool | UnsetType = UNSET
    computeMode: Literal["default", "exclusive-process", "prohibited"] | UnsetType = UNSET
    powerLimitW: Annotated[int, Meta(ge=30, le=5000)] | UnsetType = UNSET  # no GPU runs below 30 W


class Kubernetes(Section):
    """A kubeadm join set. The fields are optional here so that a partial set gets a clear error."""

    apiServer: (
        Annotated[
            str,
            Meta(max_length=256, pattern=whole(r"^https://[A-Za-z0-9.:\[\]-]+(:[0-9]{1,5})?/?$")),
        ]
        | UnsetType
    ) = UNSET
    token: Annotated[str, Meta(pattern=whole(r"^[a-z0-9]{6}\.[a-z0-9]{16}$"))] | UnsetType = UNSET
    caCertHash: Annotated[str, Meta(pattern=whole(r"^sha256:[a-f0-9]{64}$"))] | UnsetType = UNSET


class Admission(Section):
    budgetCheck: Literal["meter"] | UnsetType = UNSET


class Placement(Section, kw_only=True):
    """D2, D6: how the placer weighs topology, and how long a placed booking may wait for its
    host to deliver it."""

    topology: Literal["preferred", "strict", "none"] = "preferred"
    deliverWithinSeconds: Annotated[int, Meta(ge=30, le=86400)] = 600


class Policy(Struct, kw_only=True):
    """The known fields of a policy; anything else is ignored here and stored as given (P9)."""

    acceptance: Annotated[list[Acceptance], Meta(max_length=16)] | UnsetType = UNSET
    maxPending: Duration | UnsetType = UNSET
    overcommit: Overcommit | UnsetType = UNSET
    hostReserve: HostReserve | UnsetType = UNSET
    hugepages: Hugepages | UnsetType = UNSET
    kernelModules: KernelModules | UnsetType = UNSET
    cpu: Cpu | UnsetType = UNSET
    iommu: Iommu | UnsetType = UNSET
    gpu: Gpu | UnsetType = UNSET
    kubernetes: Kubernetes | UnsetType = UNSET
    platformOperated: bool | UnsetType = UNSET
    replicas: Annotated[int, Meta(ge=2, le=48)] | UnsetType = UNSET
    migLayout: (
        dict[MigKey, Annotated[list[MigProfile], Meta(min_length=1, max_length=8)]] | UnsetType
    ) = UNSET
    prewarmImages: Annotated[list[ImageRef], Meta(max_length=64)] | UnsetType = UNSET
    singleTenant: bool | UnsetType = UNSET
    joinAttestors: (
        Annotated[
            list[Annotated[str, Meta(pattern=whole(r"^[a-z0-9][a-z0-9.-]{0,63}$"))]],
            Meta(min_length=1, max_length=16),
        ]
        | UnsetType
    ) = UNSET
    admission: Admission | UnsetType = UNSET
    placement: Placement | UnsetType = UNSET


@cache
def _policy_type() -> mi.Type:
    return mi.type_info(Policy)


def policy_warnings(policy: Mapping[str, Any]) -> list[str]:
    """P9: each field of ``policy`` the code does not read, as ``policy.a.b: …; did you mean …?``.

    The known names are the typed model's at each level (as written in JSON: ``2Mi``),
    walking into known fields that hold objects, lists of objects and maps of them; the
    suggestion is the closest known name at that level (difflib), when one is close.
    """
    return list(_unknown(policy, _policy_type(), "policy"))


def _unknown(value: Any, kind: mi.Type, path: str) -> Iterator[str]:
    if isinstance(kind, mi.Metadata):
        yield from _unknown(value, kind.type, path)
    elif isinstance(kind, mi.UnionType):  # X | UNSET: only X has fields
        for member in kind.types:
            yield from _unknown(value, member, path)
    elif isinstance(kind, mi.StructType) and isinstance(value, Mapping):
        known = {field.encode_name: field.type for field in kind.fields}
        for name, item in value.items():
            if name in known:
                yield from _unknown(item, known[name], f"{path}.{name}")
                continue
            close = difflib.get_close_matches(str(name), known, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            yield f"{path}.{name}: not a field the code reads{hint}"
    elif isinstance(kind, mi.ListType) and isinstance(value, list):
        for index, item in enumerate(value):
            yield from _unknown(item, kind.item_type, f"{path}.{index}")
    elif isinstance(kind, mi.DictType) and isinstance(value, Mapping):
        for key, item in value.items():
            yield from _unknown(item, kind.value_type, f"{path}.{key}")
