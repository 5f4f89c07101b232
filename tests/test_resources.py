"""The resource math as pure functions, with property tests (N3–N5)."""

import math

from hypothesis import given
from hypothesis import strategies as st

from controlplane.capacity.resources import GIB, HostFacts, clamp_ratio, desired_rows, settled
from shared.policy import parse_policy

facts = st.builds(
    HostFacts,
    logical_cpus=st.integers(0, 1024),
    memory_total_bytes=st.integers(0, 16 * 2**40),
    hugepages_2mi=st.integers(0, 100_000),
    hugepages_1gi=st.integers(0, 4096),
    disk_total_bytes=st.integers(0, 2**50),
)
ratios = st.floats(0.1, 100, allow_nan=False).map(lambda r: round(r, 2))
policies = st.fixed_dictionaries(
    {},
    optional={
        "hostReserve": st.fixed_dictionaries(
            {"vcpu": st.integers(0, 2048), "memoryGiB": st.integers(0, 20_000)}
        ),
        "overcommit": st.fixed_dictionaries(
            {}, optional={"vcpu": ratios, "memoryGiB": ratios, "diskGiB": ratios}
        ),
    },
)
classes = st.sampled_from(["metal-host", "vps-host", "metal-dedicated", "provider"])


@given(facts, classes, policies)
def test_rows_are_whole_never_negative_and_clamped(
    host: HostFacts, pool_class: str, raw: dict
) -> None:
    """N4: capacities are whole units ≥ 0; every ratio lies in 0.1…100."""
    rows = desired_rows(host, pool_class, parse_policy(raw))
    for row in rows.values():
        assert isinstance(row.capacity, int) and row.capacity >= 0
        assert 0.1 <= row.ratio <= 100


@given(facts, policies)
def test_vcpu_is_reserve_less_cpus_times_ratio_rounded_down(host: HostFacts, raw: dict) -> None:
    """N3: vcpu = floor((logical CPUs − hostReserve.vcpu) × ratio), floored at 0."""
    rows = desired_rows(host, "metal-host", parse_policy(raw))
    reserve = raw.get("hostReserve", {}).get("vcpu", 0)
    ratio = raw.get("overcommit", {}).get("vcpu", 1.0)
    expected = max(0, math.floor(round((host.logical_cpus - reserve) * ratio, 6)))
    assert rows["vcpu"].capacity == expected


@given(facts, policies)
def test_huge_pages_are_never_overcommitted_and_leave_memory(host: HostFacts, raw: dict) -> None:
    """N3: hugepages rows are the configured pages (ratio 1); memoryGiB excludes their pools."""
    rows = desired_rows(host, "metal-host", parse_policy(raw))
    assert (rows["hugepages2Mi"].capacity, rows["hugepages2Mi"].ratio) == (host.hugepages_2mi, 1.0)
    assert (rows["hugepages1Gi"].capacity, rows["hugepages1Gi"].ratio) == (host.hugepages_1gi, 1.0)
    pages = host.hugepages_2mi * 2 * 2**20 + host.hugepages_1gi * GIB
    ratio = rows["memoryGiB"].ratio
    assert (
        rows["memoryGiB"].capacity <= max(0, (host.memory_total_bytes - pages) / GIB * ratio) + 1e-6
    )


@given(st.integers(0, 10_000), st.integers(0, 10_000))
def test_a_row_never_shrinks_below_allocated(desired: int, allocated: int) -> None:
    """N5: the settled capacity is at least what is allocated, and the desired value otherwise."""
    capacity = settled(desired, allocated)
    assert capacity >= allocated
    assert capacity in (desired, allocated)


@given(st.floats(allow_nan=False, allow_infinity=False) | st.none())
def test_ratio_defaults_to_one_and_is_clamped(ratio: float | None) -> None:
    """N4: no ratio is 1; any other is clamped to 0.1…100."""
    clamped = clamp_ratio(ratio)
    assert 0.1 <= clamped <= 100
    if ratio is None:
        assert clamped == 1.0


def test_exact_arithmetic_where_floats_would_round_down() -> None:
    """N4: 100 CPUs × 2.3 is 230, not the 229 that binary floating point floors to."""
    host = HostFacts(100, 0, 0, 0, 0)
    assert math.floor(100 * 2.3) == 229
    rows = desired_rows(host, "metal-host", parse_policy({"overcommit": {"vcpu": 2.3}}))
    assert rows["vcpu"].capacity == 230


def test_tenant_controlled_classes_get_no_rows() -> None:
    """N2: metal-dedicated and provider nodes add no schedulable capacity."""
    host = HostFacts(64, 2**40, 0, 0, 2**40)
    for pool_class in ("metal-dedicated", "provider"):
        assert desired_rows(host, pool_class, parse_policy({})) == {}
