"""Running the pool-policy validators (P6).

Each module registers pure validators that take a ``PolicyContext``. They raise
``PolicyViolation`` for a policy nodes cannot take; the runner turns that into
``INVALID_INPUT`` reading ``policy: ...`` with ``details.field`` the JSON path.
A validator may also raise a compute error (``ApiError``), which passes through
unchanged. The NodeSpec renderer plugs in as one more provision validator.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from shared.errors import InvalidInput
from shared.policy.model import Policy
from shared.validation import field_of


class PolicyViolation(ValueError):
    """A policy value nodes cannot take; ``field`` is the path inside the policy."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class PolicyContext:
    """What a validator may look at: the typed policy, the raw one, and the pool it is for."""

    policy: Policy
    raw: Mapping[str, Any]
    pool_class: str
    sharing: str
    gpu_model: str | None
    site_kind: str
    attestors: frozenset[str]


PolicyValidator = Callable[[PolicyContext], None]


def parse_policy(raw: Mapping[str, Any]) -> Policy:
    """The typed view of a policy, or INVALID_INPUT naming the bad field."""
    try:
        return msgspec.convert(raw, Policy)
    except msgspec.ValidationError as exc:
        field, message = field_of(exc, prefix="policy")
        raise InvalidInput(f"policy: {message}", field=field) from None


def validate_policy(
    raw: Mapping[str, Any],
    validators: Sequence[PolicyValidator],
    *,
    pool_class: str,
    sharing: str,
    gpu_model: str | None,
    site_kind: str,
    attestors: frozenset[str],
) -> Policy:
    """Parse the policy and run every module's validator on it, in order."""
    ctx = PolicyContext(
        policy=parse_policy(raw),
        raw=raw,
        pool_class=pool_class,
        sharing=sharing,
        gpu_model=gpu_model,
        site_kind=site_kind,
        attestors=attestors,
    )
    for validator in validators:
        try:
            validator(ctx)
        except PolicyViolation as exc:
            field = f"policy.{exc.field}" if exc.field else "policy"
            raise InvalidInput(f"policy: {exc.message}", field=field) from None
    return ctx.policy
