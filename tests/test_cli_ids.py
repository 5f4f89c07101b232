"""M4, R1: the ids the CLI shows and takes, as a subprocess against one real daemon holding
what `make run` sets up. A table shows each row's own id whole and the ids it refers to by
their tails; every command that takes an id takes its whole id (sent as it is) or an
unambiguous end of one the caller sees, resolved through the caller's own lists."""

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.daemons import Daemon
from tests.test_cli import table_id
from tests.test_cli_output import World, demo_world


@dataclass(frozen=True)
class Demo:
    world: World
    daemon: Daemon

    def acme(self, *args: str, code: int = 0) -> Any:
        """The CLI as acme's admin credential."""
        return self.world.cli(*args, code=code, BETTER_COMPUTE_TOKEN=self.world.acme_token)

    def requests(self, path: str) -> int:
        """How many requests to `path` the daemon has logged so far."""
        lines = [json.loads(line) for line in self.daemon.log.read_text().splitlines()]
        return sum(1 for line in lines if line.get("event") == "request" and line["path"] == path)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """One daemon for the module, with the demo's data in it."""
    home = tmp_path_factory.mktemp("cli-ids")
    running = Daemon(home)
    running.start()
    built = demo_world(running, home)
    yield Demo(built, running)
    built.client.close()
    running.kill()


def ids(answer: Any) -> list[str]:
    return [item["id"] for item in answer["items"]]


def test_m4_a_table_shows_its_rows_own_ids_whole(demo: Demo) -> None:
    """M4: the default table's ID column holds each listed object's id whole, as kubectl's
    NAME does; an id a row refers to (a node's pool) is cut to its tail."""
    cli = demo.world.cli
    for noun in ("pools", "sites", "nodes", "reservations"):
        tenant = "acme" if noun == "reservations" else "root"
        whole = ids(cli.ok_json(noun, "list", "--tenant", tenant))
        rows = cli(noun, "list", "--tenant", tenant).out.splitlines()[1:]
        assert [row.split()[0] for row in rows] == whole, noun
    fleet = cli("nodes", "list", "--tenant", "root").out.splitlines()
    pools = {
        n["id"]: n["poolId"] for n in cli.ok_json("nodes", "list", "--tenant", "root")["items"]
    }
    assert all(line.split()[1] == table_id(pools[line.split()[0]]) for line in fleet[1:])


def test_m4_commands_take_the_end_of_an_id(demo: Demo, tmp_path: Path) -> None:
    """M4: the tail a table shows (with its `…` or without) stands for the whole id in every
    kind of id a command takes: a pool, a node, a reservation, a site, a credential."""
    cli, h100 = demo.world.cli, demo.world.h100
    node = cli.ok_json("nodes", "list", h100, "--tenant", "root")["items"][0]["id"]
    fleet = cli("nodes", "list", "--tenant", "root").out.splitlines()
    (cut,) = [line.split()[1] for line in fleet if line.startswith(f"{node}  ")]
    assert cut == table_id(h100)  # copied from the table, `…` and all
    assert cli.ok_json("pools", "get", cut, "--tenant", "root")["id"] == h100
    assert cli.ok_json("pools", "get", h100[-8:], "--tenant", "root")["id"] == h100
    assert cli.ok_json("pools", "capacity", h100[-6:], "--tenant", "root")["items"]
    assert cli.ok_json("nodes", "get", node[-8:], "--tenant", "root")["id"] == node
    assert ids(cli.ok_json("nodes", "list", h100[-8:], "--tenant", "root")) == [node]
    reservation = demo.world.reservation
    got = demo.acme("--json", "reservations", "get", f"…{reservation[-8:]}", "--tenant", "acme")
    assert got.json()["id"] == reservation
    listed = cli.ok_json("reservations", "list", "--tenant", "acme", "--pool", h100[-8:])
    assert ids(listed) == [reservation]

    site = ids(cli.ok_json("sites", "list", "--tenant", "root"))[0]
    made = cli.ok_json(
        "pools", "create", "--tenant", "root", "--site", site[-8:], "--class", "metal-host",
    )  # fmt: skip
    assert made["siteId"] == site
    credential = demo.acme("--json", "credentials", "create", "--tenant", "acme").json()
    tail = credential["credentialId"][-8:]
    revoked = demo.acme("--json", "credentials", "revoke", tail, "--tenant", "acme").json()
    assert revoked == {"credentialId": credential["credentialId"], "revoked": True}
    gone = demo.acme("credentials", "revoke", tail, "--tenant", "acme", code=1)
    assert "no visible credential id ends with" in gone.err  # revoked: no longer a candidate


def test_m4_a_whole_id_is_sent_as_it_is(demo: Demo) -> None:
    """M4: a whole id costs no list call (and an id-shaped value that is no id is the API's
    INVALID_INPUT, not a failed lookup)."""
    cli, h100 = demo.world.cli, demo.world.h100
    before = demo.requests("/api/compute/pools/list")
    assert cli.ok_json("pools", "get", h100, "--tenant", "root")["id"] == h100
    assert demo.requests("/api/compute/pools/list") == before
    cli.ok_json("pools", "get", h100[-8:], "--tenant", "root")
    assert demo.requests("/api/compute/pools/list") > before  # the end of one: listed
    bad = cli("pools", "get", "pool_nope", "--tenant", "root", code=1)
    assert bad.err.startswith("error: INVALID_INPUT: ") and "(field poolId)" in bad.err


def test_m4_an_ambiguous_end_names_the_candidates(demo: Demo) -> None:
    """M4: the end of more than one visible id is exit 1 with each candidate whole on stderr,
    and nothing done."""
    world = demo.world
    site = ids(world.cli.ok_json("sites", "list", "--tenant", "root"))[0]
    body = {"tenantId": "root", "siteId": site, "class": "metal-host"}
    mine = ids(world.cli.ok_json("pools", "list", "--tenant", "root"))
    while len({pool[-1] for pool in mine}) == len(mine):  # until two end alike
        mine.append(world.client.call("compute/pools/create", body)["id"])
    last = next(pool[-1] for pool in mine if sum(p[-1] == pool[-1] for p in mine) > 1)
    candidates = sorted(pool for pool in mine if pool.endswith(last))
    run = world.cli("pools", "archive", last, "--tenant", "root", code=1)
    assert run.out == "" and run.err.startswith(f"error: {len(candidates)} visible pool ids end")
    assert [line.strip() for line in run.err.splitlines()[1:]] == candidates
    after = world.cli.ok_json("pools", "list", "--tenant", "root")["items"]
    assert not any(p["archived"] for p in after if p["id"] in candidates)


def test_m4_an_unknown_end_is_refused(demo: Demo) -> None:
    """M4: an end no visible id has is exit 1 saying so; an empty one is a usage error."""
    cli = demo.world.cli
    mine = ids(cli.ok_json("pools", "list", "--tenant", "root"))
    assert not any(pool.endswith("zzzzzzzz") for pool in mine)
    run = cli("pools", "get", "zzzzzzzz", "--tenant", "root", code=1)
    assert run.err == "error: no visible pool id ends with 'zzzzzzzz'\n" and run.out == ""
    cli("nodes", "get", "…", "--tenant", "root", code=2)


def test_r1_the_end_of_an_id_the_caller_may_not_see_is_not_resolved(demo: Demo) -> None:
    """R1: acme is not offered root's third pool and owns no node: the ends of those ids
    resolve for root but not for acme, whose error never names them."""
    world = demo.world
    offered = ids(demo.acme("--json", "pools", "list", "--tenant", "acme").json())
    mine = ids(world.cli.ok_json("pools", "list", "--tenant", "root"))
    hidden = next(pool for pool in mine if pool not in offered)
    assert world.cli.ok_json("pools", "get", hidden[-8:], "--tenant", "root")["id"] == hidden
    run = demo.acme("pools", "get", hidden[-8:], "--tenant", "acme", code=1)
    assert "no visible pool id ends with" in run.err and hidden not in run.err
    node = ids(world.cli.ok_json("nodes", "list", world.h100, "--tenant", "root"))[0]
    refused = demo.acme("nodes", "get", node[-8:], "--tenant", "acme", code=1)
    assert "no visible node id ends with" in refused.err and node not in refused.err
