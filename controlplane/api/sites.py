"""Site methods."""

from controlplane.api.method import Method, Read, Write
from controlplane.services import sites
from controlplane.services.access import Access
from shared import schemas as s

METHODS = (
    Method(
        "/api/compute/sites/create",
        s.SitesCreate,
        s.SiteView,
        Write(sites.create_site),
        "Create a site; only root creates shared and dedicated sites.",
        Access("compute:sites:create", "tenant"),
    ),
    Method(
        "/api/compute/sites/list",
        s.SitesList,
        s.SiteList,
        Read(sites.list_sites, offload=True, cached=True, scopes=("catalog",)),
        "The tenant's sites by id, a page at a time (B1: limit, default 100, and cursor; next "
        "is null at the end).",
        Access("compute:sites:read", "tenant"),
    ),
)
