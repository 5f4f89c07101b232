"""The server's pool-policy validator: `joinAttestors` may name only attestors it runs (P8)."""

from msgspec import UNSET

from shared.policy.validate import PolicyContext, PolicyViolation


def validate_join_attestors(ctx: PolicyContext) -> None:
    attestors = ctx.policy.joinAttestors
    if attestors is UNSET:
        return
    for index, name in enumerate(attestors):
        if name not in ctx.attestors:
            known = ", ".join(sorted(ctx.attestors))
            raise PolicyViolation(
                f"joinAttestors.{index}", f"attestor {name} is not registered (known: {known})"
            )
