"""Restart: stop and start the app on the same file; everything is still there."""

from typing import Any

from controlplane.app import make_app
from controlplane.config import Config
from tests.conftest import Api


async def test_restart_keeps_everything(aiohttp_client: Any, config: Config) -> None:
    """Tenants, sites, pools, offers, quotas, credentials and events survive a restart."""
    first = await aiohttp_client(make_app(config))
    token = config.root_token_file.read_text().strip()
    api = Api(first, token)
    await api.tenant("acme")
    acme = await api.token_for("acme")
    site = await api.site()
    pool = (await api.pool(site, policy={"maxPending": "6h", "x": [1]}))["id"]
    await api.offer(pool, "acme", {"gpu": 7})
    seen_before = await api.ok("compute/pools/list", {"tenantId": "acme"}, acme)
    events_before = await api.ok("compute/events/list", {"tenantId": "root"})
    await first.close()

    second = await aiohttp_client(make_app(config))
    assert config.root_token_file.read_text().strip() == token  # not re-bootstrapped
    api = Api(second, token)
    assert await api.ok("compute/pools/list", {"tenantId": "acme"}, acme) == seen_before
    assert await api.ok("compute/events/list", {"tenantId": "root"}) == events_before
    await api.offer(pool, "acme", {"gpu": 8})
    after = await api.ok(
        "compute/events/list", {"tenantId": "root", "after": events_before["next"]}
    )
    assert [e["seq"] for e in after["items"]] == [events_before["next"] + 1]
