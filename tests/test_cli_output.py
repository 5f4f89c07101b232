"""M4: the CLI's output (`-o table|wide|json|yaml`), `--watch`, `BETTER_COMPUTE_TENANT`,
`whoami`, lists read through `next`, and distinct exit statuses, as a subprocess against one
real daemon holding what `make run` sets up (the demo's three pools on recorded hosts)."""

import os
import re
import selectors
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from controlplane.demo import _set_up
from shared.client import ControlPlane
from tests.daemons import Daemon, free_port
from tests.nodes import recorded
from tests.test_cli import CLI, Cli, root_cli, table_id


@dataclass(frozen=True)
class World:
    cli: Cli  # root's CLI
    client: ControlPlane  # root's client, for changes made beside the CLI
    acme_token: str  # acme's admin credential
    h100: str  # the demo's H100 pool
    reservation: str  # acme's reservation on it


def demo_world(daemon: Daemon, home: Path) -> World:
    """The demo's data, made by the demo's own set-up (controlplane/demo.py): a shared site,
    its three pools each with its recorded host joined and the NodeSpec applied, tenant acme
    offered two of them; and a reservation of acme's on the H100 node."""
    made = _set_up(daemon.url, daemon.token, home)
    root = ControlPlane(daemon.url, token=daemon.token)
    for spec, _ in made:
        join = (home / "agents" / spec.key / "join.token").read_text().strip()
        node = root.join(join, spec.host, recorded(spec.host))
        unit_spec = root.spec(node["token"], node["nodeId"])
        units = [{"id": u["id"], "status": "applied"} for u in unit_spec["units"]]
        applied = {"version": unit_spec["version"], "units": units}
        root.report(node["token"], node["nodeId"], recorded(spec.host), applied)
    acme = (home / "acme.token").read_text().strip()
    h100 = next(pool for spec, pool in made if spec.key == "demo-h100")
    reservation = root.call(
        "compute/reservations/create",
        {"tenantId": "acme", "poolId": h100, "resources": {"gpu": 2, "vcpu": 16}},
        token=acme,
    )
    assert reservation["state"] == "placed", reservation
    return World(root_cli(daemon, home), root, acme, h100, reservation["id"])


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """One daemon for the module, with the demo's data in it."""
    home = tmp_path_factory.mktemp("cli-output")
    running = Daemon(home)
    running.start()
    built = demo_world(running, home)
    yield built
    built.client.close()
    running.kill()


def test_m4_output_formats_on_a_list_and_a_get(world: World) -> None:
    """M4: -o json is the API's answer (--json the same, before or after the command), -o yaml
    the same document, -o table the people's table with each row's own id whole and the ids
    it refers to cut to their tails, and -o wide that table with every id whole; a get's
    `key: value` lines have the ids whole."""
    cli, h100 = world.cli, world.h100
    listed = cli("-o", "json", "reservations", "list", "--tenant", "acme").json()
    assert [r["id"] for r in listed["items"]] == [world.reservation] and listed["next"] is None
    assert cli("reservations", "list", "--tenant", "acme", "--json").json() == listed
    assert cli("reservations", "list", "--tenant", "acme", "-o", "json").json() == listed
    as_yaml = cli("-o", "yaml", "reservations", "list", "--tenant", "acme").out
    assert msgspec.yaml.decode(as_yaml) == listed

    table = cli("reservations", "list", "--tenant", "acme").out.splitlines()
    wide = cli("-o", "wide", "reservations", "list", "--tenant", "acme").out.splitlines()
    assert table[0].split() == ["ID", "POOL", "STATE", "DELIVERY", "RESOURCES", "NODE", "REASON"]
    (row,), (wide_row,) = table[1:], wide[1:]
    node = listed["items"][0]["nodeId"]
    assert row.split()[:4] == [world.reservation, table_id(h100), "placed", "pending"]
    assert table_id(node) in row and node not in row
    assert wide_row.split()[:4] == [world.reservation, h100, "placed", "pending"]
    assert node in wide_row

    got = cli("-o", "json", "pools", "get", h100, "--tenant", "root").json()
    assert got["id"] == h100 and got["gpuModel"] == "H100"
    as_yaml = cli("pools", "get", h100, "--tenant", "root", "-o", "yaml").out
    assert msgspec.yaml.decode(as_yaml) == got
    assert f"id:             {h100}" in cli("pools", "get", h100, "--tenant", "root").out
    cli("--json", "-o", "yaml", "pools", "list", "--tenant", "root", code=2)  # two answers


OWN_ID = re.compile(r"[a-z]+_[0-9a-z]{26,52}")  # a row's own id, whole in the first column
RANDOM_BODY = 26  # a random id's body (a ULID); a derived id's is 52


def width(out: str) -> int:
    """M4: the columns a table may take: 100, plus what the longest of its rows' own ids is
    longer than a random id (a derived id, as `make run` makes for its pools, is whole too)."""
    own = [line.split()[0] for line in out.splitlines()[1:] if line.strip()]
    extra = [len(i) - i.index("_") - 1 - RANDOM_BODY for i in own if OWN_ID.fullmatch(i)]
    return 100 + max([0, *extra])


def test_m4_tables_fit_100_columns_on_the_demo_data(world: World) -> None:
    """M4: on what `make run` sets up, every line of every list's table is at most 100
    columns beside the rows' own ids (whole, some of them derived); -o wide leaves nothing
    cut."""
    cli, h100 = world.cli, world.h100
    tables = {
        command: cli(*command.split()).out
        for command in (
            "pools list --tenant root",
            "pools list --tenant acme",
            "sites list --tenant root",
            "quotas list --tenant acme",
            "events list --tenant root --limit 1000",
            "nodes list --tenant root",
            "reservations list --tenant acme",
            f"pools capacity {h100} --tenant root",
            f"nodes get {cli.ok_json('nodes', 'list', h100, '--tenant', 'root')['items'][0]['id']}"
            " --tenant root",
        )
    }
    for command, out in tables.items():
        assert len(out.splitlines()) > 1, command
        too_long = [line for line in out.splitlines() if len(line) > width(out)]
        assert not too_long, (command, too_long)
    events = tables["events list --tenant root --limit 1000"].splitlines()
    assert any(line.endswith("…") for line in events)  # event data cut to fit
    wide = cli("-o", "wide", "events", "list", "--tenant", "root", "--limit", "1000").out
    assert not any(line.endswith("…") for line in wide.splitlines())


def test_m4_whoami(world: World) -> None:
    """M4: whoami says who the token is: its tenant, its credential, root's or not, admin or
    not, for root's token and for a limited credential of acme's."""
    root = world.cli.ok_json("whoami")
    assert root["tenantId"] == "root" and root["root"] is True and root["admin"] is True
    assert root["credentialId"].startswith("cred_")
    shown = world.cli("whoami").out.split()
    assert shown[:4] == ["tenant:", "root", "credential:", root["credentialId"]]
    assert shown[4:] == ["root:", "yes", "admin:", "yes"]
    statements = [{"effect": "allow", "actions": ["iam:*"], "resources": ["*"]}]
    limited = world.client.call(
        "iam/credentials/create",
        {"tenantId": "acme", "statements": statements},
        token=world.acme_token,
    )
    acme = world.cli("-o", "json", "whoami", BETTER_COMPUTE_TOKEN=limited["token"]).json()
    assert acme == {
        "tenantId": "acme",
        "credentialId": limited["credentialId"],
        "root": False,
        "admin": False,
    }


def test_m4_tenant_from_the_environment(world: World) -> None:
    """M4: BETTER_COMPUTE_TENANT is the default --tenant; --tenant still wins."""
    acme = world.cli("-o", "json", "pools", "list", BETTER_COMPUTE_TENANT="acme").json()
    assert sorted(p["owned"] for p in acme["items"]) == [False, False]  # the two offered to it
    mine = world.cli(
        "-o", "json", "pools", "list", "--tenant", "root", BETTER_COMPUTE_TENANT="acme"
    )
    assert [p["owned"] for p in mine.json()["items"]] == [True, True, True]
    assert "BETTER_COMPUTE_TENANT" in world.cli("pools", "list", code=2).err


def test_m4_exit_statuses(world: World) -> None:
    """M4: 1 when the control plane refuses, 2 for a usage error, 3 when it cannot be reached;
    `better-compute --help` says so."""
    assert "Exit status: 0 done; 1 refused" in world.cli("--help").out
    refused = world.cli("pools", "get", f"pool_{'0' * 26}", "--tenant", "root", code=1)
    assert refused.err.startswith("error: NOT_FOUND: ")
    world.cli("pools", "list", "--tenant", "root", "-o", "xml", code=2)
    away = world.cli("whoami", code=3, BETTER_COMPUTE_URL=f"http://127.0.0.1:{free_port()}")
    assert away.err.startswith("error: cannot reach the control plane: ")


def test_m4_lists_read_every_page(world: World) -> None:
    """M4, B1: with a page of one item the CLI follows `next` to the end: every site, pool
    and node comes back, in the table and in -o json (whose `next` is null)."""
    cli = world.cli
    for extra in ("b", "c"):
        cli("sites", "create", "--tenant", "root", "--name", f"demo-{extra}", "--region", "eu")
    for noun in ("sites", "pools", "nodes"):
        paged = cli.ok_json(noun, "list", "--tenant", "root", "--page-size", "1")
        whole = cli.ok_json(noun, "list", "--tenant", "root")
        assert len(paged["items"]) >= 3 and paged == whole and paged["next"] is None, noun
        rows = cli(noun, "list", "--tenant", "root", "--page-size", "1").out.splitlines()[1:]
        assert sorted(r.split()[0] for r in rows) == sorted(i["id"] for i in whole["items"])


def read_until(process: subprocess.Popen[bytes], text: str, seconds: float = 10) -> str:
    """What the process printed until `text` shows (or the process ends, or time is up)."""
    assert process.stdout is not None
    out, deadline = b"", time.monotonic() + seconds
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while text.encode() not in out and time.monotonic() < deadline:
            if selector.select(timeout=deadline - time.monotonic()):
                chunk = os.read(process.stdout.fileno(), 65536)
                if not chunk:
                    break
                out += chunk
    return out.decode()


def test_b1_a_narrowed_credential_reads_past_pages_it_may_not_see(world: World) -> None:
    """B1, R1, B2: a credential of acme's that may read only the second of its two pools in id
    order gets an empty first page with `next` moved past the other: `pools list --page-size 1`
    still gives the pool it sees; `events tail --page-size 1` every event it sees, past pages
    of hidden ones, to the end of the log; and `events tail --follow` starts at the log's end
    (not at the first hidden page) and prints the next event it sees, landing after one it
    may not see."""
    client, acme = world.client, world.acme_token
    hidden, seen = client.call("compute/pools/list", {"tenantId": "acme"}, token=acme)["items"]
    assert hidden["id"] < seen["id"]  # pools/list is in id order
    statements = [
        {"effect": "allow", "actions": ["compute:*"], "resources": ["compute-tenant"]},
        {
            "effect": "allow",
            "actions": ["compute:*"],
            "resources": ["compute-pool"],
            "conditions": {"gpuModel": [seen["gpuModel"]]},
        },
    ]
    narrow = {"tenantId": "acme", "statements": statements}
    env = {
        **world.cli.env,
        "BETTER_COMPUTE_TOKEN": client.call("iam/credentials/create", narrow, token=acme)["token"],
    }

    def as_narrow(*args: str) -> str:
        return world.cli("-o", "json", *args, "--tenant", "acme", **env).out

    pools = msgspec.json.decode(as_narrow("pools", "list", "--page-size", "1"))
    assert [p["id"] for p in pools["items"]] == [seen["id"]] and pools["next"] is None

    log = client.call("compute/events/list", {"tenantId": "acme", "limit": 1000}, token=acme)
    visible = [e for e in log["items"] if e["poolId"] in (None, seen["id"])]
    first_hidden = next(e["seq"] for e in log["items"] if e["poolId"] == hidden["id"])
    assert visible[-1]["seq"] > first_hidden  # a page of one hidden event comes before the end
    tailed = as_narrow("events", "tail", "--page-size", "1").splitlines()
    assert [msgspec.json.decode(line) for line in tailed] == visible

    follow = ["events", "tail", "--tenant", "acme", "--follow", "--page-size", "1", "--max", "1"]
    tail = subprocess.Popen(
        [str(CLI), "-o", "json", *follow], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )

    def offer_again(pool: dict[str, Any]) -> None:  # the same offer: one more pool.offered
        quota = {row["resource"]: row["max"] for row in pool["quotas"]}
        body = {"tenantId": "root", "poolId": pool["id"], "toTenantId": "acme", "quota": quota}
        client.call("compute/pools/offer", body)

    try:
        printed = ""
        # Until the tail is waiting at the log's end (it prints nothing before), and then once:
        # a hidden event, then one it sees.
        while not printed and tail.poll() is None:
            offer_again(hidden)
            offer_again(seen)
            printed = read_until(tail, "\n", seconds=0.3)
        _, err = tail.communicate(timeout=10)
    finally:
        tail.kill()
        tail.wait()
    assert tail.returncode == 0 and b"Traceback" not in err, err
    event = msgspec.json.decode(printed)
    assert (event["type"], event["poolId"]) == ("pool.offered", seen["id"])
    assert event["seq"] > log["next"]  # new: the tail started at the end, not mid-log


def test_m4_watch_prints_again_when_something_changes(world: World) -> None:
    """M4: `sites list --watch` prints the list, then again as soon as a change lands (the
    event log's long-poll, B2), and Ctrl-C stops it cleanly (exit 0, no traceback)."""
    watch = subprocess.Popen(
        [str(CLI), "sites", "list", "--tenant", "root", "--watch"],
        env=world.cli.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        printed = read_until(watch, "ID ")  # the first print: the watch is waiting for events
        started = time.monotonic()
        site = world.client.call(
            "compute/sites/create",
            {"tenantId": "root", "name": "watched", "region": "eu", "kind": "custom"},
        )
        printed += read_until(watch, site["id"])
        assert time.monotonic() - started < 5  # answered as the event landed, not by a timer
        first, again = printed.split("\n\n")  # into a pipe, a blank line between prints
        assert first.startswith("ID ") and site["id"] not in first
        assert again.startswith("ID ") and site["id"] in again
        assert len(again.splitlines()) == len(first.splitlines()) + 1  # the whole list, again
        watch.send_signal(signal.SIGINT)
        _, err = watch.communicate(timeout=10)
    finally:
        watch.kill()
        watch.wait()
    assert watch.returncode == 0 and b"Traceback" not in err, err
