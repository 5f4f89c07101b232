"""Sites: only root creates shared and dedicated sites; any tenant may create its own custom one."""

import msgspec

from controlplane.iam.decide import ROOT_TENANT
from controlplane.services.call import Call
from controlplane.services.paging import page, position, scope
from controlplane.storage import events
from controlplane.storage import sites as site_sql
from controlplane.storage.db import Store, now
from controlplane.storage.ledger_types import SiteRow
from controlplane.storage.sql import Database
from shared.errors import Conflict, PermissionDenied
from shared.ids import new_id
from shared.schemas import SiteList, SitesCreate, SitesList, SiteView

PLATFORM_KINDS = ("shared", "dedicated")


def site_view(row: SiteRow) -> SiteView:
    """A site as answers show it: its row's fields, named alike."""
    return SiteView(**msgspec.structs.asdict(row))


async def create_site(store: Store, call: Call[SitesCreate]) -> SiteView:
    req = call.body
    if req.kind in PLATFORM_KINDS and req.tenant_id != ROOT_TENANT:
        raise PermissionDenied(f"only the root tenant creates {req.kind} sites", field="kind")

    def txn(db: Database) -> SiteView:
        if site_sql.site_name_taken(db, req.tenant_id, req.name):
            raise Conflict("the tenant already has a site with that name", field="name")
        row = SiteRow(
            id=new_id("site"),
            owner_tenant_id=req.tenant_id,
            name=req.name,
            region=req.region,
            kind=req.kind,
            created_at=now(),
        )
        site_sql.insert_site(db, msgspec.structs.asdict(row))
        events.append(
            db,
            "site.created",
            pool_id=None,
            data={"siteId": row.id, "kind": req.kind, "region": req.region},
            audience=[req.tenant_id],
        )
        return site_view(row)

    return await store.write(txn)


def list_sites(db: Database, call: Call[SitesList]) -> SiteList:
    """B1: the tenant's sites in id order, a page at a time."""
    req = call.body
    after = position(db, scope("sites", req), req.cursor)
    found, cursor = page(
        db,
        scope("sites", req),
        site_sql.list_sites(db, req.tenant_id, after, req.limit + 1),
        req.limit,
        lambda row: row.id,
    )
    return SiteList(items=[site_view(row) for row in found], next=cursor)
