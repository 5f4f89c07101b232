"""Numbered migrations, applied in order at start, on either backend (B3): written once in
SQLite's DDL and turned into PostgreSQL's by the dialect. The schema version is SQLite's
``PRAGMA user_version`` and a one-row ``schema_version`` table on PostgreSQL."""

from collections.abc import Callable
from typing import Literal

from controlplane.storage.sql import Database, Dialect

# F8: what a cached answer may depend on, each with its own generation (storage/db.py reads
# them). ``catalog``: tenants, credentials, sites, pools, offers, quota maxima, the authz
# projection, budgets; ``usage``: what quota rows say is in use (moved by bookings, and only
# when a figure changes); ``fleet``: nodes, their rows and atoms, join tokens, reservations,
# bookings. The event log and the cursor key are in no scope: no cached read shows them.
Scope = Literal["catalog", "usage", "fleet"]
EVERY_SCOPE: tuple[Scope, ...] = ("catalog", "usage", "fleet")

# A migration is a script in SQLite's DDL (the dialect makes PostgreSQL's), or a function that
# writes it for either backend (triggers, whose bodies the two write apart).
Migration = str | Callable[[Dialect], str]

MIGRATIONS: tuple[Migration, ...] = (
    # 1: tenants, credentials, sites, pools, offers, quotas, authz projection, nodes, events.
    """
    CREATE TABLE tenants (
        id TEXT PRIMARY KEY,
        parent_id TEXT REFERENCES tenants(id),
        name TEXT,
        created_at TEXT NOT NULL,
        deleted_at TEXT
    );
    CREATE TABLE credentials (
        id TEXT PRIMARY KEY,
        tenant_id TEXT NOT NULL REFERENCES tenants(id),
        name TEXT,
        token_hash BLOB NOT NULL UNIQUE,
        statements TEXT,
        created_at TEXT NOT NULL,
        revoked_at TEXT
    );
    CREATE INDEX credentials_tenant ON credentials(tenant_id);
    CREATE TABLE sites (
        id TEXT PRIMARY KEY,
        owner_tenant_id TEXT NOT NULL REFERENCES tenants(id),
        name TEXT NOT NULL,
        region TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('shared', 'dedicated', 'custom')),
        created_at TEXT NOT NULL,
        UNIQUE (owner_tenant_id, name)
    );
    CREATE TABLE pools (
        id TEXT PRIMARY KEY,
        owner_tenant_id TEXT NOT NULL REFERENCES tenants(id),
        site_id TEXT NOT NULL REFERENCES sites(id),
        class TEXT NOT NULL,
        gpu_model TEXT,
        sharing TEXT NOT NULL,
        agent TEXT NOT NULL,
        policy TEXT NOT NULL,
        provider_account_id TEXT,
        version INTEGER NOT NULL,
        archived_at TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    );
    CREATE INDEX pools_owner ON pools(owner_tenant_id);
    CREATE TABLE pool_offers (
        pool_id TEXT NOT NULL REFERENCES pools(id),
        to_tenant_id TEXT NOT NULL REFERENCES tenants(id),
        include_descendants INTEGER NOT NULL,
        priority INTEGER NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (pool_id, to_tenant_id)
    ) WITHOUT ROWID;
    CREATE INDEX pool_offers_tenant ON pool_offers(to_tenant_id);
    CREATE TABLE quotas (
        pool_id TEXT NOT NULL REFERENCES pools(id),
        tenant_id TEXT NOT NULL REFERENCES tenants(id),
        resource TEXT NOT NULL,
        max INTEGER NOT NULL CHECK (max >= 0),
        used INTEGER NOT NULL DEFAULT 0 CHECK (used >= 0),
        updated_at TEXT NOT NULL,
        PRIMARY KEY (pool_id, tenant_id, resource)
    ) WITHOUT ROWID;
    CREATE INDEX quotas_tenant ON quotas(tenant_id, pool_id);
    CREATE TABLE pool_authz (
        tenant_id TEXT NOT NULL REFERENCES tenants(id),
        pool_id TEXT NOT NULL REFERENCES pools(id),
        gpu_model TEXT,
        class TEXT NOT NULL,
        sharing TEXT NOT NULL,
        region TEXT NOT NULL,
        owned INTEGER NOT NULL,
        PRIMARY KEY (tenant_id, pool_id)
    ) WITHOUT ROWID;
    CREATE TABLE nodes (
        id TEXT PRIMARY KEY,
        pool_id TEXT NOT NULL REFERENCES pools(id),
        hostname TEXT NOT NULL,
        tenant_owned INTEGER NOT NULL DEFAULT 0,
        state TEXT NOT NULL,
        created_at TEXT NOT NULL
    );
    CREATE INDEX nodes_pool ON nodes(pool_id);
    CREATE TABLE node_resources (
        node_id TEXT NOT NULL REFERENCES nodes(id),
        resource TEXT NOT NULL,
        capacity INTEGER NOT NULL CHECK (capacity >= 0),
        allocated INTEGER NOT NULL DEFAULT 0 CHECK (allocated >= 0),
        ratio REAL NOT NULL DEFAULT 1,
        PRIMARY KEY (node_id, resource)
    ) WITHOUT ROWID;
    CREATE TABLE events (
        seq INTEGER PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        type TEXT NOT NULL,
        at TEXT NOT NULL,
        pool_id TEXT,
        data TEXT NOT NULL
    );
    CREATE TABLE event_audience (
        tenant_id TEXT NOT NULL,
        seq INTEGER NOT NULL REFERENCES events(seq),
        PRIMARY KEY (tenant_id, seq)
    ) WITHOUT ROWID;
    """,
    # 2: join tokens, node identity, credentials, inventory and its facts, GPU atoms.
    """
    CREATE TABLE join_tokens (
        id TEXT PRIMARY KEY,
        pool_id TEXT NOT NULL REFERENCES pools(id),
        token_hash BLOB NOT NULL UNIQUE,
        expires_at TEXT NOT NULL,
        max_uses INTEGER NOT NULL,
        uses INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL
    );
    ALTER TABLE nodes ADD COLUMN identity TEXT;
    ALTER TABLE nodes ADD COLUMN machine_id TEXT;
    ALTER TABLE nodes ADD COLUMN token_hash BLOB;
    ALTER TABLE nodes ADD COLUMN inventory TEXT;
    ALTER TABLE nodes ADD COLUMN inventory_hash TEXT;
    ALTER TABLE nodes ADD COLUMN inventory_rev INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE nodes ADD COLUMN rows_inventory_rev INTEGER NOT NULL DEFAULT -1;
    ALTER TABLE nodes ADD COLUMN rows_pool_version INTEGER NOT NULL DEFAULT -1;
    ALTER TABLE nodes ADD COLUMN logical_cpus INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE nodes ADD COLUMN memory_total_bytes INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE nodes ADD COLUMN hugepages_2mi INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE nodes ADD COLUMN hugepages_1gi INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE nodes ADD COLUMN disk_total_bytes INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE nodes ADD COLUMN applied TEXT;
    ALTER TABLE nodes ADD COLUMN last_seen_at TEXT;
    ALTER TABLE nodes ADD COLUMN updated_at TEXT;
    CREATE UNIQUE INDEX nodes_identity ON nodes(identity);
    CREATE UNIQUE INDEX nodes_token ON nodes(token_hash);
    CREATE INDEX nodes_state_seen ON nodes(state, last_seen_at);
    CREATE TABLE node_devices (
        node_id TEXT NOT NULL REFERENCES nodes(id),
        device_id TEXT NOT NULL,
        resource TEXT NOT NULL,
        gpu_uuid TEXT NOT NULL,
        profile TEXT,
        allocated INTEGER NOT NULL DEFAULT 0 CHECK (allocated IN (0, 1)),
        PRIMARY KEY (node_id, device_id)
    ) WITHOUT ROWID;
    """,
    # 3: why a node is quarantined.
    """
    ALTER TABLE nodes ADD COLUMN state_reason TEXT;
    """,
    # 4: each node's rendered NodeSpec and its content hash.
    """
    ALTER TABLE nodes ADD COLUMN spec TEXT;
    ALTER TABLE nodes ADD COLUMN spec_version TEXT;
    """,
    # 5: reservations, their bookings on nodes, and GPU-hour budgets.
    """
    CREATE TABLE reservations (
        id TEXT PRIMARY KEY,
        tenant_id TEXT NOT NULL REFERENCES tenants(id),
        pool_id TEXT NOT NULL REFERENCES pools(id),
        resources TEXT NOT NULL,
        mig_profile TEXT,
        state TEXT NOT NULL,
        reason TEXT,
        node_id TEXT REFERENCES nodes(id),
        expires_at TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        placed_at TEXT,
        ended_at TEXT
    );
    CREATE INDEX reservations_queue ON reservations(state, pool_id, created_at);
    CREATE INDEX reservations_tenant ON reservations(tenant_id, state);
    CREATE TABLE bookings (
        reservation_id TEXT NOT NULL REFERENCES reservations(id),
        node_id TEXT NOT NULL REFERENCES nodes(id),
        resource TEXT NOT NULL,
        amount INTEGER NOT NULL CHECK (amount > 0),
        PRIMARY KEY (reservation_id, resource)
    ) WITHOUT ROWID;
    ALTER TABLE node_devices ADD COLUMN reservation_id TEXT;
    CREATE INDEX node_devices_free ON node_devices(resource, allocated, node_id);
    CREATE TABLE budgets (
        tenant_id TEXT NOT NULL REFERENCES tenants(id),
        meter TEXT NOT NULL,
        limit_hours REAL,
        spent_hours REAL NOT NULL DEFAULT 0,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (tenant_id, meter)
    ) WITHOUT ROWID;
    """,
    # 6: node lifecycle (H1-H8): the spec applied cleanly, cordon, drain, removal; atoms out of
    # placement for an unhealthy GPU (H5) or a drain-gated unit (H4).
    """
    ALTER TABLE nodes ADD COLUMN applied_version TEXT;
    ALTER TABLE nodes ADD COLUMN pending_reboot INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE nodes ADD COLUMN cordon_reason TEXT;
    ALTER TABLE nodes ADD COLUMN cordoned_at TEXT;
    ALTER TABLE nodes ADD COLUMN drain_reason TEXT;
    ALTER TABLE nodes ADD COLUMN drain_state TEXT CHECK (drain_state IN ('draining', 'drained'));
    ALTER TABLE nodes ADD COLUMN drain_started_at TEXT;
    ALTER TABLE nodes ADD COLUMN drain_deadline TEXT;
    ALTER TABLE nodes ADD COLUMN removed_at TEXT;
    ALTER TABLE nodes ADD COLUMN applied_units TEXT;
    UPDATE nodes SET applied_version = spec_version WHERE state = 'ready';
    CREATE INDEX nodes_draining ON nodes(drain_state) WHERE drain_state = 'draining';
    CREATE INDEX reservations_node ON reservations(node_id, state);
    ALTER TABLE node_devices ADD COLUMN unhealthy INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE node_devices ADD COLUMN held INTEGER NOT NULL DEFAULT 0;
    """,
    # 7: a counter every committed mutation moves (B6): a cached read answer is good while the
    # counter it was made at is still the counter, on this process or any replica's.
    """
    CREATE TABLE generation (id INTEGER PRIMARY KEY CHECK (id = 1), n INTEGER NOT NULL);
    INSERT INTO generation (id, n) VALUES (1, 0);
    """,
    # 8: keyset pages of every list (B1), O(page) from any cursor: a tenant's reservations in id
    # order by state (and pool), its quota rows by pool and resource, its sites by id. The new
    # reservation and quota indexes extend the ones they replace.
    """
    DROP INDEX reservations_tenant;
    CREATE INDEX reservations_tenant_page ON reservations(tenant_id, state, id);
    CREATE INDEX reservations_tenant_pool_page ON reservations(tenant_id, pool_id, state, id);
    DROP INDEX quotas_tenant;
    CREATE INDEX quotas_tenant_page ON quotas(tenant_id, pool_id, resource);
    CREATE INDEX sites_owner_page ON sites(owner_tenant_id, id);
    """,
    # 9: the lost-node check, off the writer (storage/liveness.py), reads this index alone
    # (covering): 100,000 nodes in ~25 ms instead of ~55 (SQLite), ~90 (PostgreSQL). It
    # extends the one it replaces. The liveness stamps themselves are in no migration: see
    # storage/liveness.py.
    """
    DROP INDEX nodes_state_seen;
    CREATE INDEX nodes_watch ON nodes(state, last_seen_at, removed_at, id);
    """,
    # 10: B1, R1: the secret list cursors are sealed with, one row made by the first store to
    # start (storage/paging.py: SQLite and PostgreSQL alike, which has no random bytes without
    # pgcrypto), so every replica reads the same; nodes/list's page, an arm a pool merged in
    # id order, reads a pool's live nodes from the cursor on.
    """
    CREATE TABLE cursor_key (id INTEGER PRIMARY KEY CHECK (id = 1), key BLOB NOT NULL);
    CREATE INDEX nodes_pool_page ON nodes(pool_id, id) WHERE removed_at IS NULL;
    """,
    # 11: F8, one generation per scope (storage/db.py), each moved by triggers on the tables
    # of its scope in the writing transaction itself, on any replica.
    lambda dialect: scope_generations(dialect),
    # 12: D1-D8, what a reservation holds and where: its placement (devices, CPUs, memory,
    # topology) and delivery state; a node's topology (index-based, for the placer), the
    # bookings its NodeSpec carries, the agent's last delivery report and how many atoms are
    # free to place (the bin-packing order); bookings releasing until the host confirms;
    # pinned CPUs, one booking each (the primary key is D8's exclusivity).
    lambda dialect: delivery_schema(dialect),
    # 13: F2, leadership as a lease with a fencing term (storage/leader.py): one row.
    """
    CREATE TABLE leader_lease (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        holder TEXT NOT NULL,
        term INTEGER NOT NULL,
        expires_at REAL NOT NULL
    );
    INSERT INTO leader_lease (id, holder, term, expires_at) VALUES (1, '', 0, 0);
    """,
    # C3, C4: capacity sold for a term. An offer's end (null: until unoffered) and a
    # reservation's (null: until ended); the reconciler's pass finds what has passed its end
    # through these partial indexes. Older rows keep null: they run on as before.
    """
    ALTER TABLE pool_offers ADD COLUMN not_after TEXT;
    ALTER TABLE reservations ADD COLUMN ends_at TEXT;
    CREATE INDEX pool_offers_ending ON pool_offers(not_after) WHERE not_after IS NOT NULL;
    CREATE INDEX reservations_ending ON reservations(ends_at)
        WHERE ends_at IS NOT NULL AND state IN ('pending', 'placed', 'active');
    """,
    # B5, F10: PostgreSQL's generations in shards (one per writing session, by its backend pid),
    # so that mutations side by side (a node's report, a first join) do not all wait on one
    # scope's row; a generation is the sum over its shards, as before. SQLite has one writer.
    lambda dialect: generation_shards(dialect),
    # B5, F10: PostgreSQL moves a scope's generation once per transaction, on a shard no other
    # transaction holds: a row written after the first costs a setting's read, and two
    # sessions whose backend pids share a shard no longer wait on each other's commits.
    lambda dialect: free_generation_shards(dialect),
)


# Migration 11's scopes: the tables whose every written row moves a scope's generation.
# ``quotas`` is split: its maxima are the catalog's, what is in use is ``usage``.
SCOPED_TABLES: dict[Scope, tuple[str, ...]] = {
    "catalog": (
        "tenants",
        "credentials",
        "sites",
        "pools",
        "pool_offers",
        "pool_authz",
        "budgets",
    ),
    "fleet": (
        "nodes",
        "node_resources",
        "node_devices",
        "join_tokens",
        "reservations",
        "bookings",
        "node_cpus",
    ),
}
# Tables made after migration 11, by the migration that makes them (and their triggers).
SCOPED_LATER = {"node_cpus": 12}
QUOTA_KEY = ("pool_id", "tenant_id", "resource", "max")  # a change of one: the catalog's


def delivery_schema(dialect: Dialect) -> str:
    """Migration 12 in ``dialect``: its tables and columns, and ``node_cpus`` in the fleet
    scope's generation as every fleet table is (migration 11)."""
    script = """
    ALTER TABLE reservations ADD COLUMN placement TEXT;
    ALTER TABLE reservations ADD COLUMN delivery_state TEXT;
    ALTER TABLE reservations ADD COLUMN delivery_reason TEXT;
    ALTER TABLE reservations ADD COLUMN delivery_at TEXT;
    UPDATE reservations SET delivery_state = 'pending', delivery_at = {now}
        WHERE state = 'placed';
    UPDATE reservations SET delivery_state = 'delivered', delivery_at = updated_at
        WHERE state = 'active';
    CREATE INDEX reservations_delivery ON reservations(node_id, delivery_state);
    ALTER TABLE nodes ADD COLUMN topology TEXT;
    ALTER TABLE nodes ADD COLUMN bookings TEXT;
    ALTER TABLE nodes ADD COLUMN deliveries TEXT;
    ALTER TABLE nodes ADD COLUMN free_atoms INTEGER NOT NULL DEFAULT 0;
    UPDATE nodes SET free_atoms = (SELECT count(*) FROM node_devices d WHERE d.node_id = nodes.id
        AND d.allocated = 0 AND d.unhealthy = 0 AND d.held = 0);
    CREATE INDEX nodes_free_atoms ON nodes(pool_id, free_atoms, id) WHERE removed_at IS NULL;
    ALTER TABLE bookings ADD COLUMN releasing INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX bookings_releasing ON bookings(node_id) WHERE releasing = 1;
    CREATE TABLE node_cpus (
        node_id TEXT NOT NULL REFERENCES nodes(id),
        cpu INTEGER NOT NULL,
        reservation_id TEXT NOT NULL REFERENCES reservations(id),
        PRIMARY KEY (node_id, cpu)
    ) WITHOUT ROWID;
    CREATE INDEX node_cpus_reservation ON node_cpus(reservation_id);
    UPDATE nodes SET rows_pool_version = -1 WHERE id IN
        (SELECT node_id FROM reservations WHERE state IN ('placed', 'active'));
    """
    # What was placed before has until deliverWithinSeconds from the upgrade to be delivered;
    # its node's bookings reach its NodeSpec at the first pass (a stale node's reconcile).
    script = script.replace(
        "{now}",
        "to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"
        if dialect.name == "postgresql"
        else "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
    )
    if dialect.name == "postgresql":
        return dialect.ddl(script) + (
            "\nCREATE TRIGGER node_cpus_written AFTER INSERT OR UPDATE OR DELETE ON node_cpus "
            "FOR EACH ROW EXECUTE FUNCTION bc_scope_written('fleet');"
        )
    return script + "\n".join(
        f"CREATE TRIGGER node_cpus_written_{event.lower()} AFTER {event} ON node_cpus BEGIN "
        "UPDATE generations SET n = n + 1 WHERE scope = 'fleet'; END;"
        for event in ("INSERT", "UPDATE", "DELETE")
    )


def scope_generations(dialect: Dialect) -> str:
    """Migration 11 in ``dialect``: the ``generations`` rows (from the one counter before)
    and their triggers. SQLite moves a generation at every row written; PostgreSQL once per
    transaction and scope (the row keeps the xid that last moved it)."""
    changed = " OR ".join(f"OLD.{c} IS DISTINCT FROM NEW.{c}" for c in QUOTA_KEY)
    if dialect.name == "postgresql":
        script = [
            "CREATE TABLE generations (scope TEXT PRIMARY KEY, n BIGINT NOT NULL, xact xid8);",
            "CREATE FUNCTION bc_scope_written() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "UPDATE generations SET n = n + 1, xact = pg_current_xact_id() "
            "WHERE scope = TG_ARGV[0] AND xact IS DISTINCT FROM pg_current_xact_id(); "
            "RETURN NULL; END $$;",
        ]

        def trigger(name: str, table: str, events: str, scope: str, when: str = "") -> str:
            return (
                f"CREATE TRIGGER {name} AFTER {events} ON {table} FOR EACH ROW "
                f"{f'WHEN ({when}) ' if when else ''}EXECUTE FUNCTION bc_scope_written('{scope}');"
            )

    else:
        script = [
            "CREATE TABLE generations (scope TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID;"
        ]

        def trigger(name: str, table: str, events: str, scope: str, when: str = "") -> str:
            when = when.replace("IS DISTINCT FROM", "IS NOT")  # SQLite's spelling before 3.39
            return "\n".join(
                f"CREATE TRIGGER {name}_{event.lower()} AFTER {event} ON {table} "
                f"{f'WHEN {when} ' if when else ''}BEGIN "
                f"UPDATE generations SET n = n + 1 WHERE scope = '{scope}'; END;"
                for event in events.split(" OR ")
            )

    for scope, tables in SCOPED_TABLES.items():
        script += [
            trigger(f"{t}_written", t, "INSERT OR UPDATE OR DELETE", scope)
            for t in tables
            if t not in SCOPED_LATER
        ]
    script += [
        trigger("quotas_added", "quotas", "INSERT OR DELETE", "catalog"),
        trigger("quotas_changed", "quotas", "UPDATE", "catalog", changed),
        trigger("quotas_used", "quotas", "UPDATE", "usage", "OLD.used IS DISTINCT FROM NEW.used"),
        "INSERT INTO generations (scope, n) "
        + " UNION ALL ".join(f"SELECT '{s}', n FROM generation" for s in EVERY_SCOPE)
        + ";",
        "DROP TABLE generation;",
    ]
    return "\n".join(script)


GENERATION_SHARDS = 64


def generation_shards(dialect: Dialect) -> str:
    """The migration that puts PostgreSQL's generations in ``GENERATION_SHARDS`` rows per
    scope (the old row is shard 0); its trigger moves the writing session's shard."""
    if dialect.name != "postgresql":
        return ""
    return (
        "ALTER TABLE generations ADD COLUMN shard INTEGER NOT NULL DEFAULT 0;\n"
        "ALTER TABLE generations DROP CONSTRAINT generations_pkey;\n"
        "ALTER TABLE generations ADD PRIMARY KEY (scope, shard);\n"
        "INSERT INTO generations (scope, shard, n) SELECT g.scope, s, 0 FROM generations g "
        f"CROSS JOIN generate_series(1, {GENERATION_SHARDS - 1}) s;\n"
        "CREATE OR REPLACE FUNCTION bc_scope_written() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN UPDATE generations SET n = n + 1, xact = pg_current_xact_id() "
        f"WHERE scope = TG_ARGV[0] AND shard = pg_backend_pid() % {GENERATION_SHARDS} "
        "AND xact IS DISTINCT FROM pg_current_xact_id(); RETURN NULL; END $$;"
    )


def free_generation_shards(dialect: Dialect) -> str:
    """The migration that moves a PostgreSQL scope's generation once per transaction (a
    transaction-local setting says it moved: undone with a savepoint rolled back, as the
    move is), on the writing session's shard unless another transaction holds it, else on
    any shard that none holds (``SKIP LOCKED``); only with all of them held does it wait.
    The ``xact`` column the old trigger wrote stays, unwritten: dropping it would wait for
    the busiest table's exclusive lock while the other replicas serve."""
    if dialect.name != "postgresql":
        return ""
    return (
        "CREATE OR REPLACE FUNCTION bc_scope_written() RETURNS trigger LANGUAGE plpgsql AS $$\n"
        "DECLARE\n"
        "  moved text := 'bc.generation_moved_' || TG_ARGV[0];\n"
        f"  own integer := pg_backend_pid() % {GENERATION_SHARDS};\n"
        "  free integer;\n"
        "BEGIN\n"
        "  IF current_setting(moved, true) = 'y' THEN RETURN NULL; END IF;\n"
        "  SELECT shard INTO free FROM generations WHERE scope = TG_ARGV[0] AND shard = own\n"
        "    FOR UPDATE SKIP LOCKED;\n"
        "  IF free IS NULL THEN\n"
        "    SELECT shard INTO free FROM generations WHERE scope = TG_ARGV[0]\n"
        "      LIMIT 1 FOR UPDATE SKIP LOCKED;\n"
        "  END IF;\n"
        "  UPDATE generations SET n = n + 1 WHERE scope = TG_ARGV[0] AND shard = coalesce(free, own);\n"
        "  PERFORM set_config(moved, 'y', true);\n"
        "  RETURN NULL;\n"
        "END $$;"
    )


# Replicas starting together on one PostgreSQL database migrate one at a time.
MIGRATION_LOCK = 0x6263_6D69  # "bcmi"


def schema_version(db: Database) -> int:
    """The number of the last migration applied (0 on an empty database)."""
    if db.dialect.name == "sqlite":
        return int(db.execute("PRAGMA user_version").fetchone()[0])
    found = db.execute(
        "SELECT version FROM schema_version"
        if db.execute("SELECT to_regclass('schema_version')").fetchone()[0]
        else "SELECT 0"
    ).fetchone()
    return int(found[0]) if found else 0


def migrate(db: Database) -> int:
    """Apply every migration newer than the database, each in its own transaction."""
    if db.dialect.name == "sqlite":
        for number, script in enumerate(MIGRATIONS, start=1):
            if number > schema_version(db):
                text = script(db.dialect) if callable(script) else script
                db.script(f"BEGIN IMMEDIATE;\n{text}\nPRAGMA user_version = {number};\nCOMMIT;")
        return len(MIGRATIONS)
    db.execute("SELECT pg_advisory_lock(?)", [MIGRATION_LOCK])
    try:
        db.script("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        for number, script in enumerate(MIGRATIONS, start=1):
            if number > schema_version(db):
                text = script(db.dialect) if callable(script) else db.dialect.ddl(script)
                db.script(
                    f"BEGIN;\n{text}\nDELETE FROM schema_version;\n"
                    f"INSERT INTO schema_version VALUES ({number});\nCOMMIT;"
                )
    finally:
        db.execute("SELECT pg_advisory_unlock(?)", [MIGRATION_LOCK])
    return len(MIGRATIONS)
