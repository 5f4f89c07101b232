"""Ids as people give them: whole, or an unambiguous end of one, as a table shows another
object's id (`…x7k2m9qa`, the leading `…` optional).

An id is its kind's prefix, `_`, and a body without `_` (shared/ids.py), so only a whole id
starts with the prefix: such a value is sent as it is, with no extra call (the API says what is
wrong with one that is not an id). Any other value is the end of an id, resolved here against
what the caller sees: the kind's list read to its end (B1). One match is that id; none, or
several (named on stderr), stop with exit 1. Only what the caller's own lists answer is matched,
so the end of an id it may not see is never resolved, nor the id told.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import overload

from controlplane.cli.calls import every, log_pages
from controlplane.cli.exits import REFUSED, USAGE, fail

PAGE = 1000  # the largest page a list answers: the fewest calls to read it to its end
ELLIPSIS = "…"  # how a table marks an id cut to its tail


@dataclass(frozen=True)
class Kind:
    noun: str  # as messages name it: "pool"
    prefix: str  # a whole id starts with it and `_`: "pool"
    visible: Callable[[str], Iterable[str]]  # every id of the kind the caller sees in a tenant


def listed(path: str) -> Callable[[str], list[str]]:
    """The ids a list method answers for a tenant, every page of it."""
    return lambda tenant_id: [i["id"] for i in every(path, {"tenantId": tenant_id}, PAGE)["items"]]


CREDENTIAL_EVENTS = ("tenant.created", "credential.created", "credential.revoked")


def live_credentials(tenant_id: str) -> list[str]:
    """The credentials the tenant's event log tells of (there is no list of credentials): those
    made, the bootstrap's with root, less those revoked. Root acting as itself reads the fleet's
    log, so it sees every tenant's."""
    made: dict[str, bool] = {}
    for answer in log_pages(tenant_id, CREDENTIAL_EVENTS, PAGE):
        for event in answer["items"]:
            if "credentialId" in event["data"]:
                made[event["data"]["credentialId"]] = event["type"] != "credential.revoked"
    return [credential for credential, live in made.items() if live]


POOL = Kind("pool", "pool", listed("compute/pools/list"))
NODE = Kind("node", "node", listed("compute/nodes/list"))  # the fleet: pools the tenant owns
RESERVATION = Kind("reservation", "res", listed("compute/reservations/list"))
SITE = Kind("site", "site", listed("compute/sites/list"))
CREDENTIAL = Kind("credential", "cred", live_credentials)


@overload
def whole(kind: Kind, given: str, tenant_id: str) -> str: ...
@overload
def whole(kind: Kind, given: None, tenant_id: str) -> None: ...
def whole(kind: Kind, given: str | None, tenant_id: str) -> str | None:
    """The whole id that `given` is, or is the end of, among the ids of `kind` the caller sees
    in `tenant_id`; None stays None (an option not given)."""
    if given is None:
        return None
    tail = given.removeprefix(ELLIPSIS)
    if tail.startswith(f"{kind.prefix}_"):
        return tail
    if not tail:
        fail(f"{given!r} is neither a {kind.noun} id nor the end of one", USAGE)
    found = sorted({i for i in kind.visible(tenant_id) if i.endswith(tail)})
    if not found:
        fail(f"no visible {kind.noun} id ends with {tail!r}", REFUSED)
    if len(found) > 1:
        named = "".join(f"\n  {candidate}" for candidate in found)
        fail(
            f"{len(found)} visible {kind.noun} ids end with {tail!r}; give more of one:{named}",
            REFUSED,
        )
    return found[0]
