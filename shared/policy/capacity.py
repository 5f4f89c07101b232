"""The capacity module's pool-policy validator: `overcommit` and `hostReserve`.

Shapes and ranges are the model's; what is left are rules across fields.
"""

from msgspec import UNSET

from shared.policy.validate import PolicyContext, PolicyViolation


def validate_capacity(ctx: PolicyContext) -> None:
    """diskGiB is only a resource of vps-host pools, so a ratio for it elsewhere is a mistake."""
    overcommit = ctx.policy.overcommit
    if overcommit is not UNSET and overcommit.diskGiB is not UNSET and ctx.pool_class != "vps-host":
        raise PolicyViolation(
            "overcommit.diskGiB", "diskGiB is overcommitted only in vps-host pools"
        )
