"""Typed rows: a pool's policy decoded and parsed once, a reservation's resources decoded once."""

from typing import Any

import msgspec
import pytest

from controlplane.storage.types import (
    pool_row,
    reservation_columns,
    reservation_row,
    visible_pool_of,
)


def _pool_columns(policy: str) -> dict[str, Any]:
    return {
        "id": "pool_1",
        "owner_tenant_id": "t1",
        "site_id": "site_1",
        "class": "metal-host",
        "gpu_model": None,
        "sharing": "timeslice",
        "agent": "bcd",
        "policy": policy,
        "provider_account_id": None,
        "version": 3,
        "archived_at": None,
        "created_at": "2026-01-01T00:00:00Z",
        "updated_at": "2026-01-01T00:00:00Z",
    }


def test_a_pool_row_parses_its_policy_once() -> None:
    """A pool's policy is decoded once and its typed model parsed once, then cached."""
    pool = pool_row(
        _pool_columns('{"replicas": 4, "maxPending": "1h", "singleTenant": true, "x": 1}')
    )
    assert pool.pool_class == "metal-host" and pool.version == 3
    assert pool.policy == {"replicas": 4, "maxPending": "1h", "singleTenant": True, "x": 1}
    assert pool.model is not None and pool.model is pool.model  # parsed once, then cached
    assert pool.replicas == 4 and pool.max_pending == "1h" and pool.single_tenant
    assert pool.join_attestors == ["join-token"] and pool.budget_check is None
    bare = pool_row(_pool_columns("{}"))
    assert bare.replicas == 1 and bare.max_pending is None and not bare.single_tenant


def test_a_pool_whose_policy_no_longer_parses_still_loads() -> None:
    """R5: the row loads with its raw policy; the typed model is None and readers use the raw."""
    pool = pool_row(_pool_columns('{"replicas": 99, "admission": {"budgetCheck": "meter"}}'))
    assert pool.model is None
    assert pool.policy == {"replicas": 99, "admission": {"budgetCheck": "meter"}}
    assert pool.replicas == 99 and pool.budget_check == "meter"
    changed = msgspec.structs.replace(pool, policy_json='{"replicas": 2}')
    assert changed.model is not None and changed.replicas == 2  # no stale cached model


def test_a_visible_pool_carries_the_tenants_authz_row() -> None:
    """L1, R1: a visible pool carries the tenant's authz attributes as statements match them."""
    # The visible-pool statement's row: the pool's columns in table order, then the authz row.
    row = (*_pool_columns("{}").values(), "H100", "metal-host", "exclusive", "eu", 1)
    pool = visible_pool_of(row)
    assert pool.authz.owned is True and pool.gpu_model is None
    assert pool.authz.attrs() == {
        "gpuModel": "H100",
        "class": "metal-host",
        "sharing": "exclusive",
        "region": "eu",
        "owned": True,
    }


def stored_reservation(resources: str) -> dict[str, Any]:
    """A reservations row as storage reads it, with its resources column as given."""
    return {
        "id": "res_1",
        "tenant_id": "t1",
        "pool_id": "pool_1",
        "resources": resources,
        "mig_profile": None,
        "state": "pending",
        "reason": None,
        "node_id": None,
        "expires_at": None,
        "created_at": "a",
        "updated_at": "a",
        "placed_at": None,
        "ended_at": None,
        "placement": None,
        "delivery_state": None,
        "delivery_reason": None,
        "delivery_at": None,
        "ends_at": None,
    }


def test_a_reservation_row_decodes_its_resources_once() -> None:
    """A reservation's resources are decoded once, and the row turns back into its columns."""
    columns = stored_reservation('{"gpu":2,"vcpu":8}')  # as msgspec writes it
    row = reservation_row(columns)
    assert row.resources == {"gpu": 2, "vcpu": 8} and row.resources is row.resources
    assert reservation_columns(row) == columns


def test_a_reservation_whose_resources_do_not_decode_still_loads() -> None:
    """R5: the row loads; only reading its resources fails (in that reservation's own step)."""
    row = reservation_row(stored_reservation("not json"))
    assert row.state == "pending"
    with pytest.raises(msgspec.DecodeError):
        _ = row.resources
