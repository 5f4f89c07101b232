"""The `better-compute` CLI as a subprocess against the real control plane."""

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shared.client import ControlPlane
from tests.daemons import Daemon, free_port
from tests.nodes import recorded

CLI = Path(sys.executable).parent / "better-compute"


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


class Cli:
    """Runs the CLI with a connection taken from the environment, as a person's shell would."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def __call__(self, *args: str, code: int = 0, **env: Any) -> Run:
        done = subprocess.run(
            [str(CLI), *args],
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=30,
        )
        run = Run(done.returncode, done.stdout, done.stderr)
        assert run.code == code, (args, run)
        assert "Traceback" not in run.err, run.err
        return run

    def ok_json(self, *args: str) -> Any:
        return self("--json", *args).json()


def table_id(object_id: str) -> str:
    """Another object's id as a table shows it (M4: its last 8 characters; `-o wide` has it
    whole; a row's own id is whole in both)."""
    return f"…{object_id[-8:]}"


@pytest.fixture(scope="module")
def daemon_once(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One control plane for the module: each CLI call is a fresh process anyway."""
    running = Daemon(tmp_path_factory.mktemp("cli"))
    running.start()
    yield running
    running.kill()


def root_cli(daemon: Daemon, tmp_path: Path) -> Cli:
    """The CLI as root against `daemon`, with nothing from the caller's environment."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("BETTER_COMPUTE_") and key != "XDG_CONFIG_HOME"
    }
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")  # no stray profile from the real home
    env["BETTER_COMPUTE_URL"] = daemon.url
    env["BETTER_COMPUTE_TOKEN_FILE"] = str(daemon.workdir / "data" / "root.token")
    return Cli(env)


@pytest.fixture
def cli(daemon_once: Daemon, tmp_path: Path) -> Cli:
    return root_cli(daemon_once, tmp_path)


def test_walkthrough(cli: Cli, tmp_path: Path) -> None:
    """Every command's happy path, as an operator and then a tenant would run them."""
    assert "acme" in cli("tenants", "create", "--tenant", "acme", "--name", "Acme").out
    cli("tenants", "create", "--tenant", "gone")
    assert cli.ok_json("tenants", "delete", "--tenant", "gone")["tenantId"] == "gone"
    cred = cli.ok_json("credentials", "create", "--tenant", "acme", "--name", "ci")
    assert cred["token"]
    revoked = cli.ok_json("credentials", "revoke", "--tenant", "acme", cred["credentialId"])
    assert revoked["revoked"] is True

    site = cli.ok_json(
        "sites", "create", "--tenant", "root", "--name", "fra1", "--region", "eu", "--kind", "shared",
    )  # fmt: skip
    listed = cli("sites", "list", "--tenant", "root").out
    assert listed.splitlines()[0].split() == ["ID", "NAME", "REGION", "KIND", "OWNER"]
    assert [line.split()[0] for line in listed.splitlines()[1:]] == [site["id"]]  # whole
    assert site["id"] in cli("-o", "wide", "sites", "list", "--tenant", "root").out

    policy = tmp_path / "policy.json"
    policy.write_text("{}")
    pool = cli.ok_json(
        "pools", "create", "--tenant", "root", "--site", site["id"], "--class", "metal-host",
        "--gpu-model", "H100", "--policy", f"@{policy}", "--owner-quota", "gpu=16",
    )  # fmt: skip
    pool_id = pool["id"]
    offered = cli.ok_json(
        "pools", "offer", pool_id, "--tenant", "root", "--to", "acme",
        "--quota", "gpu=8", "--quota", "vcpu=64",
    )  # fmt: skip
    # The answer is the pool as the offered tenant sees it: its own quota rows.
    assert {r["resource"]: r["max"] for r in offered["quotas"]} == {"gpu": 8, "vcpu": 64}

    # The seed's example: the tenant's view, quota shown as used/max.
    table = cli("pools", "list", "--tenant", "acme").out.splitlines()
    assert table[0].split() == ["ID", "MODEL", "CLASS", "SHARING", "OWNED", "ARCHIVED", "QUOTA"]
    assert table[1].startswith(f"{pool_id}  ") and "gpu 0/8" in table[1] and "vcpu 0/64" in table[1]
    assert table[0].index("MODEL") == table[1].index("H100")  # aligned columns
    assert [p["id"] for p in cli.ok_json("pools", "list", "--tenant", "acme")["items"]] == [pool_id]
    assert "offered to acme: gpu 8" in cli("pools", "get", pool_id, "--tenant", "root").out

    updated = cli.ok_json("pools", "update", pool_id, "--tenant", "root", "--policy", "{}")
    assert updated["version"] > pool["version"]
    capacity = cli("pools", "capacity", pool_id, "--tenant", "root").out
    assert capacity.split()[:7] == [
        "RESOURCE", "TOTAL", "SCHEDULABLE", "ALLOCATED", "AVAILABLE", "RELEASING", "OFFERED",
    ]  # fmt: skip
    assert "items" in cli.ok_json("capacity", pool_id, "--tenant", "root")

    rows = cli.ok_json(
        "quotas", "set", pool_id, "--tenant", "root", "--for", "acme", "--quota", "gpu=4"
    )
    assert rows is not None
    quotas = cli("quotas", "list", "--tenant", "acme", "--pool", pool_id).out
    assert "USED/MAX" in quotas and "0/4" in quotas

    events = cli.ok_json("events", "list", "--tenant", "root", "--type", "pool.created")
    assert [e["type"] for e in events["items"]] == ["pool.created"]
    assert "pool.created" in cli("events", "list", "--tenant", "root").out
    tail = cli(
        "--json", "events", "tail", "--tenant", "root", "--after", "0", "--follow", "--max", "1"
    )
    assert len(tail.out.splitlines()) == 1 and json.loads(tail.out)["seq"] >= 1

    join = cli.ok_json("join-tokens", "create", pool_id, "--tenant", "root", "--max-uses", "2")
    assert join["token"] and join["maxUses"] == 2
    assert cli("nodes", "list", pool_id, "--tenant", "root").out.split() == [
        "ID", "HOSTNAME", "STATE", "GPUS", "REASON",
    ]  # fmt: skip
    # A recorded DGX joins through the shared client, as the agent does.
    with ControlPlane(cli.env["BETTER_COMPUTE_URL"]) as plane:
        node = plane.join(join["token"], "dgx-h100-01", recorded("dgx-h100-01"))
        # ...and reports its NodeSpec applied, as the agent's first cycle does (H1: ready).
        spec = plane.spec(node["token"], node["nodeId"])
        units = [{"id": u["id"], "status": "applied"} for u in spec["units"]]
        plane.report(
            node["token"],
            node["nodeId"],
            recorded("dgx-h100-01"),
            {"version": spec["version"], "units": units},
        )
    nodes = cli("nodes", "list", pool_id, "--tenant", "root").out
    assert node["nodeId"] in nodes and "8x H100" in nodes and "ready" in nodes
    shown = cli("nodes", "get", node["nodeId"], "--tenant", "root").out
    assert "dgx-h100-01" in shown and "RESOURCE" in shown and "80 GiB" in shown
    assert any(line.split()[:2] == ["gpu", "8"] for line in shown.splitlines())  # GPU atoms

    # A reservation that cannot be placed is a failure: exit 1 and the reason on stderr.
    failed = cli(
        "reservations", "create", pool_id, "--tenant", "acme", "--resource", "gpu=100", code=1
    )
    assert failed.err.startswith("error: reservation failed: ")

    res = cli.ok_json("reservations", "create", pool_id, "--tenant", "acme", "--resource", "gpu=1")
    assert res["state"] == "placed"  # on the DGX that joined above
    res_table = cli("reservations", "list", "--tenant", "acme").out.splitlines()
    assert [res["id"], table_id(pool_id)] in [row.split()[:2] for row in res_table[1:]]
    assert cli.ok_json("reservations", "get", res["id"], "--tenant", "acme")["id"] == res["id"]
    ended = cli.ok_json("reservations", "end", res["id"], "--tenant", "acme")
    assert ended["state"] == "ended"

    budget = cli.ok_json("budgets", "set", "gpu.h100.hours", "--tenant", "acme", "--limit", "10")
    assert budget["limit"] == 10
    assert "spent" in cli("budgets", "get", "gpu.h100.hours", "--tenant", "acme").out
    assert cli.ok_json("budgets", "set", "gpu.h100.hours", "--tenant", "acme")["limit"] is None

    assert cli.ok_json("pools", "unoffer", pool_id, "--tenant", "root", "--to", "acme")["removed"]
    assert cli.ok_json("pools", "archive", pool_id, "--tenant", "root")["archived"] is True


def test_api_error_prints_code_and_field(cli: Cli) -> None:
    """An API refusal: exit 1, `error: CODE: message (field X)` on stderr, nothing on stdout."""
    run = cli("pools", "get", "pool_nope", "--tenant", "root", code=1)
    assert run.err.startswith("error: INVALID_INPUT: ") and "(field poolId)" in run.err
    assert run.out == ""
    missing = cli("pools", "list", "--tenant", "nobody-here", code=1)
    assert missing.err.startswith("error: ")


def test_bad_token_is_unauthenticated(cli: Cli) -> None:
    """A wrong token from BETTER_COMPUTE_TOKEN wins over the file and is refused."""
    run = cli("pools", "list", "--tenant", "root", code=1, BETTER_COMPUTE_TOKEN="nope")
    assert run.err.startswith("error: UNAUTHENTICATED")


def test_refused_connection_is_one_clear_line(cli: Cli) -> None:
    """M4: nothing listening is exit 3 (not reached) and one line that says so."""
    url = f"http://127.0.0.1:{free_port()}"
    run = cli("--url", url, "pools", "list", "--tenant", "root", code=3)
    assert run.err.startswith("error: cannot reach the control plane") and url in run.err
    assert len(run.err.strip().splitlines()) == 1


def test_usage_errors_exit_2(cli: Cli) -> None:
    """A bad --quota or a bad --policy is click's usage error: exit 2 before any request."""
    bad = cli("pools", "offer", "pool_x", "--tenant", "root", "--to", "a", "--quota", "gpu", code=2)
    assert "KEY=INT" in bad.err
    cli("pools", "update", "pool_x", "--tenant", "root", "--policy", "[1]", code=2)
    cli("pools", "list", code=2)  # no --tenant and no profile default


def test_profile_from_config_toml(cli: Cli, daemon_once: Daemon, tmp_path: Path) -> None:
    """--profile reads url, token_file and a default tenant from $XDG_CONFIG_HOME; a missing
    or bad profile is a usage error (exit 2, M4)."""
    config = tmp_path / "config" / "better-compute" / "config.toml"
    config.parent.mkdir(parents=True)
    token_file = daemon_once.workdir / "data" / "root.token"
    config.write_text(
        f'[profiles.lab]\nurl = "{daemon_once.url}"\ntoken_file = "{token_file}"\ntenant = "root"\n'
    )
    # Empty variables count as unset, so the profile supplies the connection.
    unset = {"BETTER_COMPUTE_URL": "", "BETTER_COMPUTE_TOKEN_FILE": ""}
    lab = Cli({**cli.env, **unset})
    assert "items" in lab("--json", "--profile", "lab", "sites", "list").json()  # tenant from it
    run = lab("--profile", "missing", "sites", "list", code=2)
    assert "no profile 'missing'" in run.err
    config.write_text("[profiles.lab]\nurl = 5\n")
    bad = lab("--profile", "lab", "sites", "list", code=2)
    assert bad.err.startswith("error: ") and "Traceback" not in bad.err


def test_help_mentions_completion(cli: Cli) -> None:
    """--help lists the groups and says how to turn on shell completion."""
    out = cli("--help").out
    assert "_BETTER_COMPUTE_COMPLETE=bash_source" in out
    for group in ("pools", "quotas", "events", "join-tokens", "reservations", "budgets"):
        assert group in out
    assert "complete -o" in cli(_BETTER_COMPUTE_COMPLETE="bash_source").out


def test_events_tail_follow_prints_only_what_comes_next(cli: Cli) -> None:
    """`events tail --follow` starts at the end of the log and prints the next event as it lands
    (B2: its long-poll answers as soon as there is one)."""
    before = cli.ok_json("events", "list", "--tenant", "root", "--limit", "1000")["next"]
    follow = ("--follow", "--max", "1")
    tail = subprocess.Popen(
        [str(CLI), "--json", "events", "tail", "--tenant", "root", *follow],
        env=cli.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The tail reads the end of the log when it starts; events keep landing until it prints.
        for attempt in range(50):
            cli("sites", "create", "--tenant", "root", "--name", f"tail{attempt}", "--region", "eu")
            time.sleep(0.2)
            if tail.poll() is not None:
                break
        out, err = tail.communicate(timeout=10)
    finally:
        tail.kill()
    assert tail.returncode == 0, err
    (line,) = out.splitlines()
    event = json.loads(line)
    assert event["seq"] > before and event["type"] == "site.created"
