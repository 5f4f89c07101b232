"""Pool policies: the typed model, each module's validators, and the runner (P6, P9)."""

from shared.policy.capacity import validate_capacity
from shared.policy.model import Policy
from shared.policy.provision import PROVISION_VALIDATORS
from shared.policy.server import validate_join_attestors
from shared.policy.validate import PolicyContext, PolicyViolation, parse_policy, validate_policy

# Module order: capacity, provision, server.
POOL_POLICY_VALIDATORS = (validate_capacity, *PROVISION_VALIDATORS, validate_join_attestors)

__all__ = [
    "POOL_POLICY_VALIDATORS",
    "Policy",
    "PolicyContext",
    "PolicyViolation",
    "parse_policy",
    "validate_policy",
]
