"""Node rows read into typed structs: a JSON column that no longer decodes fails only the step
that reads it, never the reader that loads the row (R5)."""

from pathlib import Path

import msgspec
import pytest

from controlplane.iam.tokens import token_hash
from controlplane.storage import nodes as node_sql
from controlplane.storage.db import Store
from controlplane.storage.node_types import NODE_COLUMNS, node_row
from tests.conftest import Api, execute
from tests.nodes import joined, one_pass, pool_with_token, recorded, twin


async def test_r5_a_damaged_inventory_fails_its_node_s_reconcile_not_the_readers(
    api: Api, db: Path
) -> None:
    """R5: a node whose stored inventory no longer decodes still loads in every reader of
    nodes; the pass quarantines it with the reason and reconciles the other node as usual."""
    pool, token = await pool_with_token(api)
    damaged = await joined(api, token, recorded("dgx-h100-01"))
    other = await joined(api, token, twin("dgx-h100-01", 2))
    execute(db, "UPDATE nodes SET rows_pool_version = -1")  # both are reconciled again
    execute(db, "UPDATE nodes SET inventory = '{\"gpus\": [' WHERE id = ?", (damaged["nodeId"],))
    store = Store(db)
    try:
        with store.snapshot() as reader:
            row = node_sql.node_for_token(reader, token_hash(damaged["token"]))
            assert row is not None and row.id == damaged["nodeId"]
            assert node_sql.get_node(reader, damaged["nodeId"]) == row
            listed = node_sql.nodes_of_pools(reader, [pool], None, "", 10)
            assert {n.id for n in listed} == {damaged["nodeId"], other["nodeId"]}
            assert {r.node.id for r in node_sql.stale_nodes(reader)} == {n.id for n in listed}
            with pytest.raises(msgspec.DecodeError):
                _ = row.inventory
    finally:
        store.close()
    stats = one_pass(db)
    assert (stats.failures, stats.nodes_recomputed) == (1, 1)
    states = dict(execute(db, "SELECT id, state || ': ' || coalesce(state_reason, '') FROM nodes"))
    assert states[damaged["nodeId"]].startswith("quarantined: cannot be reconciled:")
    assert states[other["nodeId"]] == "ready: "


def test_f8_a_row_updated_with_what_a_report_wrote_decodes_nothing_again() -> None:
    """F8: the row a report reconciles is its node's row with the columns it wrote: the
    inventory it parsed is carried as parsed, what the row had decoded of its other JSON
    columns comes along, and a column it wrote anew is decoded from the new text."""
    stored = {name: None for name in NODE_COLUMNS} | {
        "id": "node_a",
        "pool_id": "pool_a",
        "hostname": "h",
        "tenant_owned": 0,
        "state": "ready",
        "created_at": "x",
        "inventory_rev": 1,
        "rows_inventory_rev": 1,
        "rows_pool_version": 1,
        "pending_reboot": 1,
        "applied_units": '{"u": "k"}',
        "applied": '{"version": "v1"}',
        **{name: 0 for name in node_sql.FACTS},
    }
    row = node_row([stored[name] for name in NODE_COLUMNS])
    assert (row.tenant_owned, row.pending_reboot) == (False, True)
    units = row.applied_units
    inventory = recorded("dgx-h100-01")
    text = msgspec.json.encode(inventory).decode()
    after = row.updated({"inventory": text, "applied": '{"version": "v2"}'}, inventory)
    assert after.inventory is inventory and after.inventory_json == text
    assert after.applied_units is units
    assert after.applied == {"version": "v2"} and row.applied == {"version": "v1"}
