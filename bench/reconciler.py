"""The capacity reconciler over many nodes: a pass with nothing changed, and with 1% changed.

Run: ``.venv/bin/python bench/reconciler.py [--nodes 100000] [--changed 0.01]``

It builds a real SQLite database in a temporary directory with one pool
(hostReserve {8, 64}, overcommit {vcpu: 2}) and N nodes carrying the recorded
DGX H100's inventory (8 GPUs each), then times, on the real writer code path
(``Store.transact`` + ``reconcile_pass``):

1. the first pass, computing every node's rows and GPU atoms from scratch;
2. a pass with nothing changed (target: under 1 s, 0 rows written);
3. a pass after 1% of the nodes reported a changed inventory.

Writes are counted with SQLite's ``total_changes``, so "0 rows written" is
what the database saw, not what the code meant to do. The baseline printed
beside them is a bare ``SELECT count(*)`` over the nodes table on the same
file, the least any pass that looks at every node must cost.
"""

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec

from agent.inventory import collect_inventory
from controlplane.capacity.liveness import Liveness
from controlplane.capacity.resources import HostFacts
from controlplane.reconciler import reconcile_pass
from controlplane.storage.db import Store, now
from controlplane.storage.sql import Database
from shared.inventory import Inventory, stable_digest

FIXTURES = Path(__file__).resolve().parent.parent / "agent" / "fixtures" / "host-fixtures.json"
POLICY = b'{"hostReserve": {"vcpu": 8, "memoryGiB": 64}, "overcommit": {"vcpu": 2}}'


def insert_ready_nodes(db: Database, pool_id: str, hosts: Sequence[Inventory], at: str) -> None:
    """Ready nodes of ``pool_id``, one per inventory (its hostname, its facts), written straight
    into the table: over HTTP thousands would take far too long."""
    rows = []
    for n, own in enumerate(hosts):
        facts = HostFacts.of(own)
        rows.append(
            (
                f"node_{n:026d}",
                pool_id,
                own.hostname,
                "ready",
                at,
                f"id{n}",
                msgspec.json.encode(own).decode(),
                stable_digest(own),
                1,
                facts.logical_cpus,
                facts.memory_total_bytes,
                facts.hugepages_2mi,
                facts.hugepages_1gi,
                facts.disk_total_bytes,
                at,
            )
        )
    db.executemany(
        "INSERT INTO nodes (id, pool_id, hostname, state, created_at, identity, inventory, "
        "inventory_hash, inventory_rev, logical_cpus, memory_total_bytes, hugepages_2mi, "
        "hugepages_1gi, disk_total_bytes, last_seen_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )


def populate(store: Store, count: int) -> None:
    inventory = collect_inventory(fixture=FIXTURES, fixture_host="dgx-h100-01")
    at = now()

    def build(db):  # type: ignore[no-untyped-def]
        db.execute("INSERT INTO tenants (id, created_at) VALUES ('root', ?)", [at])
        db.execute("INSERT INTO sites VALUES ('site_1', 'root', 'fra1', 'eu', 'shared', ?)", [at])
        db.execute(
            "INSERT INTO pools (id, owner_tenant_id, site_id, class, gpu_model, sharing, agent, "
            "policy, version, created_at, updated_at) VALUES ('pool_1', 'root', 'site_1', "
            "'metal-host', 'H100', 'exclusive', 'bcd', ?, 1, ?, ?)",
            [POLICY.decode(), at, at],
        )
        hosts = []
        for n in range(count):
            gpus = [
                msgspec.structs.replace(gpu, uuid=f"GPU-{n:08x}-0000-0000-0000-{i:012x}")
                for i, gpu in enumerate(inventory.gpus)
            ]
            hosts.append(
                msgspec.structs.replace(inventory, machine_id=f"m{n}", hostname=f"h{n}", gpus=gpus)
            )
        insert_ready_nodes(db, "pool_1", hosts, at)

    store.transact(build)


def timed_pass(store: Store, liveness: Liveness) -> tuple[float, int, int]:
    """Seconds, nodes recomputed, rows the database saw written."""
    conn = store._writer_db.conn  # total_changes is per connection: the writer's
    before = conn.total_changes
    started = time.perf_counter()
    stats = store.transact(lambda db: reconcile_pass(db, liveness, 3600, True))
    elapsed = time.perf_counter() - started
    return elapsed, stats.nodes_recomputed, conn.total_changes - before


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--changed", type=float, default=0.01)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-reconciler-") as tmp:
        store = Store(Path(tmp) / "bc.db")
        liveness = Liveness()  # no node reported since start: no stamp to refresh
        started = time.perf_counter()
        populate(store, args.nodes)
        print(f"populated {args.nodes} nodes in {time.perf_counter() - started:.1f} s")
        started = time.perf_counter()
        store.reader.execute("SELECT count(*) FROM nodes").fetchone()
        baseline = time.perf_counter() - started
        first = timed_pass(store, liveness)
        unchanged = timed_pass(store, liveness)
        changed = max(1, int(args.nodes * args.changed))
        store.transact(
            lambda db: db.execute(
                "UPDATE nodes SET hugepages_1gi = 16, inventory_rev = inventory_rev + 1 "
                "WHERE rowid <= ?",
                [changed],
            )
        )
        one_percent = timed_pass(store, liveness)
        store.close()
    print(f"{'pass':<28} {'seconds':>8} {'nodes':>8} {'rows written':>13}")
    for name, (seconds, nodes, written) in (
        ("first (every node)", first),
        ("nothing changed", unchanged),
        (f"{changed} nodes changed", one_percent),
    ):
        print(f"{name:<28} {seconds:>8.3f} {nodes:>8} {written:>13}")
    print(f"baseline: SELECT count(*) over the nodes: {baseline:.3f} s")
    ok = unchanged[0] < 1.0 and unchanged[2] == 0
    print(f"nothing-changed pass < 1 s and 0 rows written: {'PASS' if ok else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
