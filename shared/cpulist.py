"""Linux cpulists ("0-3,8,10-11"): the form sysfs, systemd's ``AllowedCPUs=`` and the
inventory use for sets of CPUs or NUMA nodes."""

from collections.abc import Iterable


def parse(text: str | None) -> list[int]:
    """The sorted, distinct numbers of a cpulist; "" or None is the empty set.

    Raises ``ValueError`` for anything that is not a cpulist.
    """
    found: set[int] = set()
    for part in (text or "").strip().split(","):
        if not part:
            continue
        low, dash, high = part.partition("-")
        first, last = int(low), int(high) if dash else int(low)
        if first < 0 or last < first:
            raise ValueError(f"not a cpulist range: {part!r}")
        found.update(range(first, last + 1))
    return sorted(found)


def format(numbers: Iterable[int]) -> str:
    """The cpulist of ``numbers``: sorted, runs as ``a-b``; "" for none."""
    runs: list[list[int]] = []
    for n in sorted(set(numbers)):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)
