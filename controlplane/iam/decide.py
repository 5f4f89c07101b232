"""Who may do what: principals, statements, and ``decide`` (deny wins; no allow is deny).

A credential without statements is its tenant's admin: every action on that
tenant and the pools it owns or is offered. Root's credentials also hold
``compute-fleet``: they may act for any tenant.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ROOT_TENANT = "root"


@dataclass(frozen=True)
class Principal:
    credential_id: str
    tenant_id: str
    statements: Sequence[Mapping[str, Any]] | None  # None: the tenant's admin

    @property
    def is_root(self) -> bool:
        return self.tenant_id == ROOT_TENANT

    @property
    def is_admin(self) -> bool:
        return self.statements is None

    def acts_for(self, tenant_id: str) -> bool:
        """Whether the credential may act for that tenant at all."""
        return self.is_root or self.tenant_id == tenant_id


def _action_matches(pattern: str, action: str) -> bool:
    if pattern == "*":
        return True
    want, have = pattern.split(":"), action.split(":")
    for index, part in enumerate(want):
        if part == "*":
            return True
        if index >= len(have) or part != have[index]:
            return False
    return len(want) == len(have)


def _conditions_match(conditions: Mapping[str, Any], attrs: Mapping[str, Any] | None) -> bool:
    """Each condition lists allowed values of one authz attribute; a missing attribute fails."""
    for name, allowed in conditions.items():
        if attrs is None or name not in attrs or attrs[name] not in allowed:
            return False
    return True


def decide(
    principal: Principal,
    action: str,
    resource: str,
    attrs: Mapping[str, Any] | None = None,
) -> bool:
    """Whether ``principal`` may take ``action`` on a resource of type ``resource``.

    ``attrs`` are the pool's authz row (gpuModel, class, sharing, region, owned)
    for ``compute-pool``; statements with conditions never match other resources.
    """
    if principal.statements is None:
        return True
    allowed = False
    for statement in principal.statements:
        if not any(_action_matches(p, action) for p in statement["actions"]):
            continue
        resources = statement["resources"]
        if "*" not in resources and resource not in resources:
            continue
        if not _conditions_match(statement.get("conditions") or {}, attrs):
            continue
        if statement["effect"] == "deny":
            return False
        allowed = True
    return allowed
