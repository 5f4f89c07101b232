"""Pool policies: the typed model, each module's validators, and the runner (P6, P9)."""

from shared.policy.capacity import validate_capacity
from shared.policy.model import Policy
from shared.policy.provision import PROVISION_VALIDATORS, validate_as_rendered
from shared.policy.server import validate_join_attestors
from shared.policy.validate import PolicyContext, PolicyViolation, parse_policy, validate_policy

# Module order: capacity, provision, server.
POOL_POLICY_VALIDATORS = (validate_capacity, *PROVISION_VALIDATORS, validate_join_attestors)
# The field rules without rendering on representative hosts: what `render` checks before it
# renders for the one host it is given.
FIELD_VALIDATORS = tuple(v for v in POOL_POLICY_VALIDATORS if v is not validate_as_rendered)

__all__ = [
    "FIELD_VALIDATORS",
    "POOL_POLICY_VALIDATORS",
    "Policy",
    "PolicyContext",
    "PolicyViolation",
    "parse_policy",
    "validate_policy",
]
