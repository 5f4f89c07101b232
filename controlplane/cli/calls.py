"""The CLI's calls of the HTTP API: one call, a list read to its end (B1), the event log read
to its end or long-polled (B2). A refusal or an unreachable control plane becomes one line on
stderr and its exit status (1 refused, 3 not reached), never a traceback. A plain-HTTP control
plane off loopback is warned of on stderr, once per invocation (F3)."""

import ssl
from collections.abc import Iterator
from typing import Any

import click

from agent.trust import plain_http_off_loopback
from controlplane.cli.exits import REFUSED, UNREACHABLE, USAGE, fail
from controlplane.cli.settings import settings
from shared.client import ControlPlane, Refused, Unreachable

TIMEOUT = 10.0  # seconds an answer may take (plus the wait of a long-poll)
WAIT_SECONDS = 30  # how long one long-poll of the event log waits for an event (B2: 0…60)
WARNED = "better-compute.plain-http-warned"  # in the invocation's root context's meta


def call(path: str, body: dict[str, Any], nulls: tuple[str, ...] = (), wait: float = 0) -> Any:
    """One API call; an error becomes one line on stderr and its exit status (1 refused, 3 not
    reached), never a traceback. `wait`: the seconds a long-poll may wait for its answer."""
    given = settings()
    if not given.url:
        fail("no control plane URL: pass --url, set BETTER_COMPUTE_URL or use --profile", USAGE)
    try:
        client = ControlPlane(
            given.url, timeout=TIMEOUT + wait, token=given.token, ca_file=given.ca_file
        )
    except ValueError as exc:
        fail(str(exc), USAGE)
    except OSError as exc:  # the CA file: missing, unreadable or not PEM certificates
        fail(f"cannot load the CA file {given.ca_file}: {exc}", USAGE)
    warn_of_plain_http(given.url)
    # Options not given are left out rather than sent as null or empty, except `nulls`
    # (fields where null means something, such as a budget with no limit).
    body = {k: v for k, v in body.items() if k in nulls or (v is not None and v not in ((), []))}
    try:
        with client:
            return client.call(path, body)
    except Refused as exc:
        fail(str(exc), REFUSED)
    except Unreachable as exc:
        hint = (
            " (give the CA that signed its certificate with --ca-file)"
            if isinstance(exc.__cause__, ssl.SSLCertVerificationError)
            else ""
        )
        fail(f"cannot reach the control plane: {exc}{hint}", UNREACHABLE)


def warn_of_plain_http(url: str) -> None:
    """The first call of an invocation to a plain-HTTP control plane off loopback says that its
    token and answers cross the network unencrypted."""
    meta = click.get_current_context().find_root().meta
    if plain_http_off_loopback(url) and not meta.get(WARNED):
        meta[WARNED] = True
        click.echo(
            f"warning: {url} is plain HTTP off loopback: the token and every answer cross the "
            "network unencrypted; use https://",
            err=True,
        )


def every(path: str, body: dict[str, Any], page_size: int | None) -> dict[str, Any]:
    """A list method's items from every page (B1): `limit` is `page_size` (None: the control
    plane's own page) and `cursor` the `next` of the page before, until `next` is null or
    absent. The answer has the list's shape: every item, and `next` null."""
    found: list[Any] = []
    cursor = None
    while True:
        answer = call(path, {**body, "limit": page_size, "cursor": cursor})
        found += answer["items"]
        cursor = answer.get("next")
        if cursor is None:
            return {"items": found, "next": None}


def log_pages(tenant_id: str, types: tuple[str, ...] = (), limit: int = 1000) -> Iterator[Any]:
    """The event log's pages from its start to its end as it is now. The end is where a read
    gets past nothing (`next` == `after`), not where a page is merely empty: the cursor also
    moves past events the credential may not see (B1)."""
    after = 0
    while True:
        body = {"tenantId": tenant_id, "after": after, "limit": limit, "types": list(types)}
        answer = call("compute/events/list", body)
        yield answer
        if int(answer["next"]) == after:
            return
        after = int(answer["next"])


def end_of_log(tenant_id: str, types: tuple[str, ...] = (), limit: int = 1000) -> int:
    """The position of the event log's end as it is now: following starts there, as `tail -f`
    does."""
    after = 0
    for answer in log_pages(tenant_id, types, limit):
        after = int(answer["next"])
    return after


def next_events(tenant_id: str, after: int, limit: int, types: tuple[str, ...] = ()) -> Any:
    """events/list after `after`, waiting up to WAIT_SECONDS for one to land (B2's long-poll):
    the answer comes as soon as there is an event, or empty, its `next` moved past events the
    credential may not see or (the wait over) not moved: either way, ask again from `next`."""
    body = {
        "tenantId": tenant_id,
        "after": after,
        "limit": limit,
        "types": list(types),
        "waitSeconds": WAIT_SECONDS,
    }
    return call("compute/events/list", body, wait=WAIT_SECONDS)
