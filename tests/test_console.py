"""M2: the web console at /ui/, in Debian's headless Chromium driven by Playwright, against the
real daemon with two recorded hosts joined: sign-in, the ledger bars, nodes with their
bookings, reservations with their placement and delivery, and an event that appears in the
log through long-poll without a reload."""

import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from playwright.sync_api import ConsoleMessage, Page, Route, expect, sync_playwright

from shared.inventory import Inventory
from tests.daemons import Daemon
from tests.nodes import DGX_POLICY, recorded, twin, wire

REPO = Path(__file__).resolve().parent.parent
# As root, on a closed network: no sandbox, and none of Chromium's own calls home.
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
CORDON = "ECC errors on GPUs 3 and 5: RMA ticket 4711"
# A credential of acme's that reads pools, their capacity and events, and nothing else.
READER = {
    "tenantId": "acme",
    "statements": [
        {
            "effect": "allow",
            "actions": [
                "iam:credentials:read",
                "compute:pools:read",
                "compute:capacity:read",
                "compute:events:read",
            ],
            "resources": ["compute-tenant", "compute-pool"],
        }
    ],
}
# A credential of root's that reads the pools of region us only (R1).
US_ONLY = {
    "tenantId": "root",
    "statements": [
        {
            "effect": "allow",
            "actions": ["iam:credentials:read", "compute:*"],
            "resources": ["compute-tenant"],
        },
        {
            "effect": "allow",
            "actions": ["compute:*"],
            "resources": ["compute-pool"],
            "conditions": {"region": ["us"]},
        },
    ],
}
# Chromium logs each refused fetch as a console error.
FORBIDDEN = "Failed to load resource: the server responded with a status of 403 (Forbidden)"
# M2: nothing inline, nothing from another origin, no framing, no form posts.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def api(daemon: Daemon, path: str, body: dict[str, Any], token: str | None = None) -> Any:
    request = urllib.request.Request(
        f"{daemon.url}/api/{path}",
        data=json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {token or daemon.token}",
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def ready_node(daemon: Daemon, join_token: str, inventory: Inventory) -> dict[str, Any]:
    """A host joined, its NodeSpec reported applied as an agent's first cycle does (H1:
    ready). Returns what the join answered: its node id and credential."""
    node = api(
        daemon,
        "compute/nodes/join",
        {
            "joinToken": join_token,
            "attestor": "join-token",
            "hostname": inventory.hostname,
            "inventory": wire(inventory),
        },
    )
    spec = api(daemon, "compute/nodes/spec", {"nodeId": node["nodeId"]}, node["token"])
    units = [{"id": unit["id"], "status": "applied"} for unit in spec["units"]]
    api(
        daemon,
        "compute/nodes/report",
        {
            "nodeId": node["nodeId"],
            "inventory": wire(inventory),
            "applied": {"version": spec["version"], "units": units},
        },
        node["token"],
    )
    return dict(node)


def host_delivers(daemon: Daemon, node: dict[str, Any], inventory: Inventory) -> None:
    """The node's agent reports every live booking of its spec delivered (D6)."""
    spec = api(daemon, "compute/nodes/spec", {"nodeId": node["nodeId"]}, node["token"])
    done = [
        {"reservationId": b["reservationId"], "state": "delivered"}
        for b in spec["bookings"]
        if b["state"] == "live"
    ]
    report = {"nodeId": node["nodeId"], "inventory": wire(inventory), "bookings": done}
    api(daemon, "compute/nodes/report", report, node["token"])


def h100_pool(daemon: Daemon, site_name: str, region: str) -> str:
    """A root H100 pool with the DGX policy on a new shared site: its id."""
    site = api(
        daemon,
        "compute/sites/create",
        {"tenantId": "root", "name": site_name, "region": region, "kind": "shared"},
    )
    pool = {
        "tenantId": "root",
        "siteId": site["id"],
        "class": "metal-host",
        "gpuModel": "H100",
        "policy": DGX_POLICY,
        "ownerQuota": {"gpu": 16, "vcpu": 64},
    }
    return str(api(daemon, "compute/pools/create", pool)["id"])


def fleet(daemon: Daemon) -> tuple[str, str, str, str]:
    """Root's H100 pool offered to acme (gpu 4) with dgx-h100-01 and dgx-h100-sick ready, the
    sick one cordoned, and a reservation of root's (gpu 2, vcpu 16) placed and delivered:
    (pool, healthy node, sick node, res)."""
    pool = h100_pool(daemon, "fra1", "eu")
    api(daemon, "iam/tenants/create", {"tenantId": "acme"})
    offer = {"tenantId": "root", "poolId": pool, "toTenantId": "acme", "quota": {"gpu": 4}}
    api(daemon, "compute/pools/offer", offer)
    join = api(
        daemon, "compute/joinTokens/create", {"tenantId": "root", "poolId": pool, "maxUses": 2}
    )["token"]
    healthy = ready_node(daemon, join, recorded("dgx-h100-01"))
    sick = ready_node(daemon, join, recorded("dgx-h100-sick"))["nodeId"]
    api(daemon, "compute/nodes/cordon", {"tenantId": "root", "nodeId": sick, "reason": CORDON})
    reservation = reserve(daemon, pool, 2, vcpu=16)
    assert reservation["nodeId"] == healthy["nodeId"], reservation
    host_delivers(daemon, healthy, recorded("dgx-h100-01"))
    return pool, healthy["nodeId"], sick, reservation["id"]


def reserve(daemon: Daemon, pool: str, gpus: int, tenant: str = "root", **rows: int) -> Any:
    """A reservation of `tenant`'s (made with root's token, which acts for any), placed."""
    body = {"tenantId": tenant, "poolId": pool, "resources": {"gpu": gpus, **rows}}
    reservation = api(daemon, "compute/reservations/create", body)
    assert reservation["state"] == "placed", reservation
    return reservation


def pool_in_us(daemon: Daemon) -> tuple[str, str]:
    """A second pool of root's, on a site in region us, with a twin of dgx-h100-01 ready and a
    gpu: 1 reservation placed on it: (pool, reservation)."""
    pool = h100_pool(daemon, "iad1", "us")
    join = api(daemon, "compute/joinTokens/create", {"tenantId": "root", "poolId": pool})
    ready_node(daemon, join["token"], twin("dgx-h100-01", 1))
    return pool, reserve(daemon, pool, 1)["id"]


def get(url: str, **headers: str) -> tuple[int, Any]:
    """A GET that follows no redirect: (status, headers)."""

    class Keep(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(Keep)
    try:
        with opener.open(urllib.request.Request(url, headers=headers), timeout=5) as response:
            return response.status, response.headers
    except urllib.error.HTTPError as error:
        return error.code, error.headers


def figures(page: Page, pool: str, resource: str) -> str:
    row = page.locator(f'[data-pool-id="{pool}"] tr[data-resource="{resource}"]')
    return row.locator("td.figures").inner_text()


def test_m2_console_signs_in_draws_the_ledger_nodes_and_follows_events(
    daemon: Daemon, tmp_path: Path
) -> None:
    """M2, H6, H5, H3, H7, B2, R1, D4, D7: the console's files come with a strict CSP; a bad
    token is refused at sign-in; the root token (kept in sessionStorage only) shows the pool's
    ledger as bars (gpu: total 16, schedulable 8, allocated 2, available 6, releasing 0,
    offered 4, as pools/capacity answers), the nodes by state with unhealthy GPUs, the cordon
    reason and the booking on the healthy one, root's reservation active with its placement
    (host, GPUs with UUID and device file, shared CPUs) and `delivered`; acme's reservation
    made through the API appears in the event log, the ledger and among the bookings on root's
    nodes (which root's own reservations/list never shows) without a reload, and once ended it
    is `releasing` there and in the ledger's bar; acme's token shows acme's view, and a token
    of acme's that may not read nodes or reservations (R1) sees those panels refused, and one
    that may read only a pool in another region, its reservations read one a page (B1), still
    sees the one there behind pages of hidden ones, and of the bookings only the one on its
    node there. No request leaves 127.0.0.1 and the page logs no error but the refusals it
    was shown."""
    pool, healthy, sick, reservation = fleet(daemon)
    # Plain HTTP first: the redirects and the revalidation of a file the browser already has.
    assert get(f"{daemon.url}/")[0] == 302 and get(f"{daemon.url}/")[1]["Location"] == "/ui/"
    assert get(f"{daemon.url}/ui")[1]["Location"] == "/ui/"
    status, headers = get(f"{daemon.url}/ui/app.js")
    assert status == 200 and headers["Content-Type"] == "text/javascript; charset=utf-8"
    assert get(f"{daemon.url}/ui/app.js", **{"If-None-Match": headers["ETag"]})[0] == 304

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "make test installs Debian's chromium (the browser target)"
    inside: list[str] = []  # what the page asked of the daemon, seen by the route
    outside: list[str] = []
    errors: list[str] = []
    one_a_page: set[str] = set()  # list paths the route asks one item a page of (B1)

    def loopback_only(route: Route) -> None:
        if urlsplit(route.request.url).hostname == "127.0.0.1":
            path = urlsplit(route.request.url).path
            inside.append(path)
            if path in one_a_page:
                body = {**json.loads(route.request.post_data or "{}"), "limit": 1}
                route.continue_(post_data=json.dumps(body))
            else:
                route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            errors.append(message.text)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        context = browser.new_context(viewport={"width": 1440, "height": 1000})
        context.set_default_timeout(10_000)
        context.route("**/*", loopback_only)
        page = context.new_page()
        page.on("console", on_console)
        page.on("pageerror", lambda error: errors.append(str(error)))

        response = page.goto(f"{daemon.url}/")
        assert response is not None and page.url == f"{daemon.url}/ui/"
        assert response.headers["content-security-policy"] == CSP
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "no-referrer"
        assert response.headers["cache-control"] == "no-cache"

        page.fill("#token", "not-a-token")
        page.click("#sign-in-form button[type=submit]")
        expect(page.locator("#sign-in-error")).to_have_text("Unknown, revoked or expired token.")
        # Chromium logs a refused fetch as an error: this one, and no other, is expected.
        assert errors == [
            "Failed to load resource: the server responded with a status of 401 (Unauthorized)"
        ]
        errors.clear()
        page.fill("#token", daemon.token)
        page.click("#sign-in-form button[type=submit]")

        # H6: the ledger as pools/capacity answers it, drawn as bars.
        ledger = api(daemon, "compute/pools/capacity", {"tenantId": "root", "poolId": pool})
        gpu = "total 16 · schedulable 8 · allocated 2 · available 6 · releasing 0 · offered 4 · coverage 2.00"
        expect(
            page.locator(f'[data-pool-id="{pool}"] tr[data-resource="gpu"] td.figures')
        ).to_have_text(gpu)
        for row in ledger["items"]:
            shown = [f"{name} {row[name]}" for name in ("total", "schedulable", "allocated")]
            assert figures(page, pool, row["resource"]).startswith(" · ".join(shown)), row
        bar = page.locator(f'[data-pool-id="{pool}"] tr[data-resource="gpu"] svg.ledger-bar')
        widths = {
            kind: float(bar.locator(f"rect.{kind}").get_attribute("width") or "nan")
            for kind in ("allocated", "available", "unschedulable")
        }
        assert widths == {"allocated": 12.5, "available": 37.5, "unschedulable": 50.0}
        assert bar.locator("rect.offered").get_attribute("x") == "25"
        expect(bar.locator("rect.releasing")).to_have_count(0)  # nothing ended yet

        # H5, H3: both nodes ready; the sick one's GPUs 3 and 5 unhealthy, and why it is cordoned.
        ready = page.locator('#nodes section[data-state="ready"]')
        expect(ready.locator("tbody tr[data-node-id]")).to_have_count(2)
        sick_row = ready.locator(f'tr[data-node-id="{sick}"]')
        expect(sick_row.locator('.gpu[data-health="unhealthy"]')).to_have_text(["3", "5"])
        expect(sick_row.locator("td.reasons")).to_contain_text(f"cordoned: {CORDON}")
        expect(sick_row.locator("td.reasons")).to_contain_text("GPU 3 unhealthy: xid:79")
        expect(sick_row.locator("td").nth(3)).to_have_text("no")
        expect(page.locator(f'tr[data-node-id="{healthy}"] td').nth(3)).to_have_text("yes")

        # D4, D6: root's reservation, delivered by its host: active, where it is and what it
        # holds, as reservations/get answers.
        got = api(
            daemon, "compute/reservations/get", {"tenantId": "root", "reservationId": reservation}
        )
        placement = got["placement"]
        placed = page.locator(f'#reservations tr[data-reservation-id="{reservation}"]')
        expect(placed.locator("td.state")).to_have_text("active")
        cell = placed.locator("td.placement")
        expect(cell.locator(".host")).to_have_text("dgx-h100-01")
        expect(cell.locator(".device")).to_have_text(
            [
                f"GPU {g['index']} · /dev/nvidia{g['minorNumber']} · NUMA {g['numaNode']} {g['uuid']}"
                for g in placement["gpus"]
            ]
        )
        expect(cell.locator(".resources")).to_have_text(
            [f"CPUs {placement['cpus']} share 1600%"]  # DGX_POLICY overcommits vCPUs
        )
        expect(cell.locator(".topology")).to_contain_text("NVLink")
        expect(placed.locator("td.delivery")).to_have_text("delivered")
        expect(page.locator("#reservations-count")).to_have_text("(1)")
        # D4: the booking on its node, GPUs by index, chips outlined.
        indices = ", ".join(str(g["index"]) for g in placement["gpus"])
        booking = page.locator(f'#nodes .booking[data-reservation-id="{reservation}"]')
        expect(booking).to_contain_text(f"root · GPU {indices} · CPUs {placement['cpus']}")
        expect(booking.locator(".delivery")).to_have_text("delivered")
        booked = page.locator(f'tr[data-node-id="{healthy}"] .gpu.booked')
        expect(booked).to_have_text([str(g["index"]) for g in placement["gpus"]])
        expect(page.locator('#events li[data-type="pool.created"]')).to_have_count(1)
        expect(page.locator("#live")).to_have_text("live")

        # C1, C2: a policy pasted into the pool's card is planned (a dry run: nothing changes)
        # and the plan drawn: every node, capacity before → after as the API's plan says, the
        # version to apply it at; it stays drawn as events redraw the card.
        reserved = {**DGX_POLICY, "hostReserve": {"vcpu": 16, "memoryGiB": 64}}
        body = {"tenantId": "root", "poolId": pool, "policy": reserved, "dryRun": True}
        planned = api(daemon, "compute/pools/update", body)["plan"]
        box = page.locator(f'[data-pool-id="{pool}"] details.plan')
        box.locator("summary").click()
        box.locator("textarea").fill(json.dumps(reserved))
        box.locator("button.plan-button").click()
        vcpu = next(row for row in planned["capacity"] if row["resource"] == "vcpu")
        shown_vcpu = box.locator('tr.plan-capacity[data-resource="vcpu"]')
        expect(shown_vcpu.locator("td.after")).to_have_text(str(vcpu["after"]))
        expect(shown_vcpu).to_have_class("plan-capacity less")
        expect(box.locator("tr.plan-node")).to_have_count(2)
        expect(box.locator(".apply")).to_have_text("Apply it at version 1.")
        pool_now = api(daemon, "compute/pools/get", {"tenantId": "root", "poolId": pool})
        assert pool_now["version"] == 1 and pool_now["policy"] == DGX_POLICY

        # The token lives in this tab's sessionStorage only: no localStorage, no cookie.
        saved = json.loads(page.evaluate("sessionStorage.getItem('better-compute.console')"))
        assert (saved["token"], saved["tenant"]) == (daemon.token, "root")
        assert page.evaluate("localStorage.length") == 0 and context.cookies() == []

        # B2, D4: acme's reservation made through the API reaches the open page by long-poll,
        # no reload: root's own reservations stay one, and the bookings on root's nodes (the
        # owner's view) show acme's, not yet delivered.
        page.evaluate("window.stayed = true")
        newest = int(page.locator("#events li").first.get_attribute("data-seq") or "0")
        second = reserve(daemon, pool, 1, tenant="acme")
        on_nodes = page.locator(f'#bookings tr[data-reservation-id="{second["id"]}"]')
        expect(on_nodes).to_be_visible()
        expect(on_nodes.locator("td.tenant")).to_have_text("acme")
        expect(on_nodes.locator("td.host")).to_have_text("dgx-h100-01")
        expect(on_nodes.locator("td.delivery")).to_have_text("pending")
        expect(page.locator("#bookings-count")).to_have_text("(2)")
        expect(page.locator("#reservations-count")).to_have_text("(1)")
        acme_booking = page.locator(f'#nodes .booking[data-reservation-id="{second["id"]}"]')
        expect(acme_booking.locator(".tenant")).to_have_text("acme")
        after = page.locator("#events li").first
        assert int(after.get_attribute("data-seq") or "0") > newest
        expect(page.locator("#events")).to_contain_text(second["id"])
        expect(
            page.locator(f'[data-pool-id="{pool}"] tr[data-resource="gpu"] td.figures')
        ).to_have_text(
            "total 16 · schedulable 8 · allocated 3 · available 5 · releasing 0 · offered 4 · coverage 2.00"
        )

        # D7: ended, acme's booking holds its GPU until the host releases it: releasing, within
        # allocated, drawn over the allocated segment's end.
        end = {"tenantId": "acme", "reservationId": second["id"]}
        api(daemon, "compute/reservations/end", end)
        expect(on_nodes.locator("td.delivery")).to_have_text("releasing")
        expect(on_nodes.locator("td.state")).to_have_text("ended")
        expect(
            page.locator(f'[data-pool-id="{pool}"] tr[data-resource="gpu"] td.figures')
        ).to_have_text(
            "total 16 · schedulable 8 · allocated 3 · available 5 · releasing 1 · offered 4 · coverage 2.00"
        )
        expect(box.locator(".apply")).to_have_text("Apply it at version 1.")  # kept, redrawn
        releasing = bar.locator("rect.releasing")
        assert (releasing.get_attribute("x"), releasing.get_attribute("width")) == ("12.5", "6.25")
        assert page.evaluate("window.stayed") is True

        shot = tmp_path / "console.png"
        page.screenshot(path=str(shot), full_page=True)
        stable = REPO / "test-output" / "console.png"
        stable.parent.mkdir(exist_ok=True)
        shutil.copyfile(shot, stable)
        print(f"console screenshot: {shot} (copied to {stable})")

        # A reload keeps the session; signing out forgets the token.
        page.reload()
        expect(page.locator(f'[data-pool-id="{pool}"]')).to_be_visible()
        page.click("#sign-out")
        expect(page.locator("#sign-in")).to_be_visible()
        assert page.evaluate("sessionStorage.length") == 0

        # Signed in with acme's own token the console acts for acme (whoami): the offered pool
        # without `offered` (H6: the owner's figure), and no nodes (H7: the owner's view).
        acme = api(daemon, "iam/credentials/create", {"tenantId": "acme"})["token"]
        page.fill("#token", acme)
        page.press("#token", "Enter")
        expect(page.locator("#who")).to_have_text("tenant acme")
        card = page.locator(f'[data-pool-id="{pool}"]')
        expect(card.locator(".badge")).to_have_text("offered by root")
        expect(card.locator('tr[data-resource="gpu"] td.figures')).to_have_text(
            "total 16 · schedulable 8 · allocated 3 · available 5 · releasing 1"
        )
        expect(card.locator("rect.offered")).to_have_count(0)
        expect(page.locator("#nodes")).to_have_text("No nodes in the pools this tenant owns.")
        expect(page.locator("#bookings-panel")).to_be_hidden()  # no nodes: no bookings on them
        expect(page.locator("#reservations")).to_have_text("None pending, placed or active.")

        assert errors == []

        # R1: a token whose statements allow no nodes or reservations reads still sees its pools;
        # those two panels say they are refused (and Chromium logs each refusal, to the end).
        page.click("#sign-out")
        page.fill("#token", api(daemon, "iam/credentials/create", READER)["token"])
        page.press("#token", "Enter")
        expect(card.locator('tr[data-resource="gpu"] td.figures')).to_be_visible()
        expect(page.locator("#nodes")).to_have_text("This token may not read nodes.")
        expect(page.locator("#reservations")).to_have_text("This token may not read reservations.")
        expect(page.locator("#bookings-panel")).to_be_hidden()

        # B1, R1: a token that may read only the pool in us, its reservations read one a page:
        # the first pages (root's reservations in fra1) come back empty with `next` moved past
        # them, and the one in us, on a later page, is still shown.
        us_pool, us_reservation = pool_in_us(daemon)
        one_a_page.add("/api/compute/reservations/list")
        page.click("#sign-out")
        page.fill("#token", api(daemon, "iam/credentials/create", US_ONLY)["token"])
        page.press("#token", "Enter")
        expect(page.locator(f'[data-pool-id="{us_pool}"]')).to_be_visible()
        expect(page.locator("#reservations tbody tr")).to_have_count(1)
        expect(
            page.locator(f'#reservations tr[data-reservation-id="{us_reservation}"]')
        ).to_be_visible()
        # ...and of the bookings on root's nodes, only the one on the node in us (R1, D4).
        expect(page.locator("#bookings tbody tr")).to_have_count(1)
        expect(
            page.locator(f'#bookings tr[data-reservation-id="{us_reservation}"]')
        ).to_be_visible()
        expect(page.locator(f'[data-pool-id="{pool}"]')).to_have_count(0)
        browser.close()

    assert {"/ui/", "/ui/app.js", "/ui/api.js", "/ui/app.css"} <= set(inside)
    assert "/api/compute/events/list" in inside and outside == []
    assert set(errors) == {FORBIDDEN}
