"""IAM decisions as pure functions, with property tests: deny wins, no allow is deny."""

import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from controlplane.iam.decide import Principal, decide
from shared.ids import derived_id, new_id, request_id

ACTIONS = [
    "compute:pools:read",
    "compute:pools:share",
    "compute:pools:manage",
    "compute:capacity:read",
]
PATTERNS = [*ACTIONS, "compute:pools:*", "compute:*", "*", "iam:*"]
RESOURCES = ["compute-fleet", "compute-tenant", "compute-pool", "*"]
ATTRS = {
    "gpuModel": "H100",
    "class": "metal-host",
    "sharing": "exclusive",
    "region": "eu",
    "owned": False,
}

conditions = st.dictionaries(
    st.sampled_from(["gpuModel", "class", "sharing", "region", "owned"]),
    st.lists(
        st.sampled_from(["H100", "A100", "metal-host", "exclusive", "eu", "us", True, False]),
        min_size=1,
    ),
    max_size=2,
)
statements = st.lists(
    st.fixed_dictionaries(
        {
            "effect": st.sampled_from(["allow", "deny"]),
            "actions": st.lists(st.sampled_from(PATTERNS), min_size=1, max_size=3),
            "resources": st.lists(st.sampled_from(RESOURCES), min_size=1, max_size=2),
        },
        optional={"conditions": conditions},
    ),
    max_size=5,
)


@given(statements, st.sampled_from(ACTIONS))
def test_a_matching_deny_always_wins(found: list[dict[str, Any]], action: str) -> None:
    """Deny wins: adding a matching deny statement to any set of statements denies."""
    deny = {"effect": "deny", "actions": [action], "resources": ["compute-pool"]}
    principal = Principal("cred", "acme", [*found, deny])
    assert decide(principal, action, "compute-pool", ATTRS) is False


@given(statements, st.sampled_from(ACTIONS))
def test_no_allow_means_deny(found: list[dict[str, Any]], action: str) -> None:
    """Without any allow statement nothing is allowed."""
    denies = [s for s in found if s["effect"] == "deny"]
    assert decide(Principal("cred", "acme", denies), action, "compute-pool", ATTRS) is False


def test_action_patterns_match_whole_segments() -> None:
    """compute:pools:* covers compute:pools:read, never compute:poolsx or iam actions."""
    allow = [{"effect": "allow", "actions": ["compute:pools:*"], "resources": ["*"]}]
    principal = Principal("cred", "acme", allow)
    assert decide(principal, "compute:pools:read", "compute-pool", ATTRS)
    assert not decide(principal, "compute:capacity:read", "compute-pool", ATTRS)
    assert not decide(principal, "iam:credentials:create", "compute-tenant")
    assert decide(Principal("cred", "acme", None), "compute:pools:read", "compute-pool", ATTRS)


@given(st.text(max_size=40), st.text(max_size=40), st.text(min_size=1, max_size=128))
def test_derived_ids_are_stable_and_in_the_seed_alphabet(
    tenant: str, caller: str, key: str
) -> None:
    """P4: a derived id is deterministic, 52 characters of the seed's alphabet."""
    pool_id = derived_id("pool", tenant, caller, key)
    assert pool_id == derived_id("pool", tenant, caller, key)
    assert re.fullmatch(r"pool_[0-9a-hjkmnp-tv-z]{52}", pool_id)


def test_random_ids_match_the_seed_patterns() -> None:
    """Random ids are ULIDs in the seed's alphabet; request ids use the same alphabet."""
    assert re.fullmatch(r"pool_[0-9a-hjkmnp-tv-z]{26}", new_id("pool"))
    assert re.fullmatch(r"req_[0-9a-hjkmnp-tv-z]{16}", request_id())
