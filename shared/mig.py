"""MIG GPU-instance profiles per GPU family, and whether a layout fits one GPU.

Facts from the team's reference (mig-profiles.md §2–§3). Policy keys on profile
*names*, never on MiB. A family can have several memory variants (H100 80 GB
and 94 GB); a layout must fit one variant, since one GPU is one variant.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    """How a GPU-instance profile sits on a GPU: compute slices and memory-slice placement."""

    compute: int
    size: int  # memory slices
    starts: tuple[int, ...]
    unique: bool = False  # "+me" profiles: one per GPU


# 7 compute / 8 memory slices (A100, A800, H100, H800, H200, H20, GH200, B200, GB200, B300).
_SEVEN = {
    "1g": Shape(1, 1, (0, 1, 2, 3, 4, 5, 6)),
    "1g+me": Shape(1, 1, (0, 1, 2, 3, 4, 5, 6), unique=True),
    "1g2": Shape(1, 2, (0, 2, 4, 6)),
    "2g": Shape(2, 2, (0, 2, 4)),
    "3g": Shape(3, 4, (0, 4)),
    "4g": Shape(4, 4, (0,)),
    "7g": Shape(7, 8, (0,)),
}
# A30: 4 compute / 4 memory slices.
_FOUR = {
    "1g": Shape(1, 1, (0, 1, 2, 3)),
    "1g+me": Shape(1, 1, (0, 1, 2, 3), unique=True),
    "2g": Shape(2, 2, (0, 2)),
    "2g+me": Shape(2, 2, (0, 2), unique=True),
    "4g": Shape(4, 4, (0,)),
}


@dataclass(frozen=True)
class Variant:
    """One memory variant of a family: its slice counts and profile name → shape."""

    name: str
    compute_slices: int
    memory_slices: int
    profiles: dict[str, Shape]
    placements_known: bool = True


def _seven(name: str, small: int, double: int, half: int, whole: int) -> Variant:
    """A 7-slice variant from its 1g, 1g-double, 3g/4g and 7g memory sizes in GB."""
    return Variant(
        name,
        7,
        8,
        {
            f"1g.{small}gb": _SEVEN["1g"],
            f"1g.{small}gb+me": _SEVEN["1g+me"],
            f"1g.{double}gb": _SEVEN["1g2"],
            f"2g.{double}gb": _SEVEN["2g"],
            f"3g.{half}gb": _SEVEN["3g"],
            f"4g.{half}gb": _SEVEN["4g"],
            f"7g.{whole}gb": _SEVEN["7g"],
        },
    )


_A100_40 = _seven("A100-40GB", 5, 10, 20, 40)
_A100_80 = _seven("A100-80GB", 10, 20, 40, 80)
_H100_80 = _seven("H100-80GB", 10, 20, 40, 80)
_H100_NVL = _seven("H100-NVL-94GB", 12, 24, 47, 94)
_H100_96 = _seven("H100-96GB", 12, 24, 48, 96)
_GH200_144 = _seven("GH200-144GB", 18, 36, 72, 144)
_GB200 = _seven("GB200", 23, 47, 93, 186)
# nvidia-smi names the GB200 1g profile 1g.24gb where mig-parted says 1g.23gb.
_GB200_SMI = Variant(
    "GB200-driver-names",
    7,
    8,
    {**_GB200.profiles, "1g.24gb": _SEVEN["1g"], "1g.24gb+me": _SEVEN["1g+me"]},
)
_B300 = Variant(
    "B300",
    7,
    8,
    {
        "1g.34gb": _SEVEN["1g"],
        "1g.67gb": _SEVEN["1g2"],
        "2g.67gb": _SEVEN["2g"],
        "3g.135gb": _SEVEN["3g"],
        "4g.135gb": _SEVEN["4g"],
        "7g.269gb": _SEVEN["7g"],
        "7g.278gb": _SEVEN["7g"],
    },
)
_GB300 = Variant(
    "GB300",
    7,
    8,
    {"1g.35gb": _SEVEN["1g"], "2g.70gb": _SEVEN["2g"], "3g.139gb": _SEVEN["3g"]},
)
_A30 = Variant(
    "A30-24GB",
    4,
    4,
    {
        "1g.6gb": _FOUR["1g"],
        "1g.6gb+me": _FOUR["1g+me"],
        "2g.12gb": _FOUR["2g"],
        "2g.12gb+me": _FOUR["2g+me"],
        "4g.24gb": _FOUR["4g"],
    },
)


def _rtx_pro_6000() -> Variant:
    """RTX PRO 6000 Blackwell: 4 compute slices; no placement table is known, so only slices count."""
    profiles: dict[str, Shape] = {}
    for gpcs, gb, sizes in ((1, 24, (0, 1, 2, 3)), (2, 48, (0, 2)), (4, 96, (0,))):
        base = f"{gpcs}g.{gb}gb"
        suffixes = ("", "+gfx") if gpcs == 4 else ("", "+gfx", "-me", "+me.all")
        for suffix in suffixes:
            profiles[base + suffix] = Shape(gpcs, gpcs, sizes, unique=suffix == "+me.all")
    profiles["1g.24gb+me"] = Shape(1, 1, (0, 1, 2, 3), unique=True)
    return Variant("RTX-PRO-6000-BLACKWELL", 4, 4, profiles, placements_known=False)


VARIANTS: dict[str, tuple[Variant, ...]] = {
    "A100": (_A100_40, _A100_80),
    "A800": (_A100_40, _A100_80),
    "A30": (_A30,),
    "H100": (_H100_80, _H100_NVL, _H100_96),
    "H800": (_H100_80, _H100_NVL),
    "H20": (_H100_96,),
    "GH200": (_H100_96, _GH200_144),
    "H200": (_seven("H200-141GB", 18, 35, 71, 141),),
    "B200": (_seven("B200", 23, 45, 90, 180),),
    "GB200": (_GB200, _GB200_SMI),
    "B300": (_B300,),
    "GB300": (_GB300,),
    "RTX-PRO-6000-BLACKWELL": (_rtx_pro_6000(),),
}


def profiles_for(family: str) -> frozenset[str]:
    """Every MIG profile name some GPU of the family offers (empty: not MIG-capable).

    Families compare exactly (N1): ``h100`` is not ``H100``.
    """
    return frozenset(p for v in VARIANTS.get(family, ()) for p in v.profiles)


def _places(variant: Variant, shapes: Sequence[Shape]) -> bool:
    """Whether the instances can all be placed on one GPU without overlapping memory slices."""
    if sum(s.compute for s in shapes) > variant.compute_slices:
        return False
    if not variant.placements_known:
        return sum(s.size for s in shapes) <= variant.memory_slices
    order = sorted(shapes, key=lambda s: -s.size)

    def place(i: int, used: frozenset[int]) -> bool:
        if i == len(order):
            return True
        shape = order[i]
        for start in shape.starts:
            cells = frozenset(range(start, start + shape.size))
            if not cells & used and place(i + 1, used | cells):
                return True
        return False

    return place(0, frozenset())


def layout_fits(family: str, profiles: Iterable[str]) -> bool:
    """Whether one GPU of some variant of the family can hold exactly these instances."""
    wanted = list(profiles)
    for variant in VARIANTS.get(family, ()):
        if not all(p in variant.profiles for p in wanted):
            continue
        shapes = [variant.profiles[p] for p in wanted]
        uniques = [p for p in wanted if variant.profiles[p].unique]
        if len(uniques) == len(set(uniques)) and _places(variant, shapes):
            return True
    return False
