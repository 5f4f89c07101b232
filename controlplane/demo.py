"""`make run`: the whole product on this machine, from an empty directory.

The control plane on its SQLite file; three pools on a shared site, each with an agent
reporting a recorded host (agent/fixtures/host-fixtures.json): the DGX H100 (exclusive),
the DGX A100 with MIG on half its GPUs (mig), the L40S server (time-sliced, 4 slots a GPU);
tenant `acme` with the H100 and A100 pools offered to it, and a reservation of acme's on the
H100 delivered by its agent (a slice and an environment file under its root). Agents apply their NodeSpec under
the data directory, never to this machine. It prints ready-to-paste commands (kept in
`try-this.txt` in the data directory), and Ctrl-C stops everything it started. The logs go
to `controlplane.log` and `agents/*/agent.log` there; the terminal shows their warnings and
errors only. Running it again reuses what the data directory holds.
"""

import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from shared.files import write_secret

FIXTURES = Path(__file__).resolve().parent.parent / "agent" / "fixtures" / "host-fixtures.json"


@dataclass(frozen=True)
class DemoPool:
    key: str  # idempotency key and directory name
    host: str  # the recorded host its agent reports
    gpu_model: str
    sharing: str
    policy: dict[str, Any]
    owner_quota: dict[str, int]
    offer: (
        dict[str, int] | None
    )  # acme's quota, or None: not offered (time-sliced pools are single-tenant)


POOLS = (
    DemoPool(
        "demo-h100",
        "dgx-h100-01",
        "H100",
        "exclusive",
        {
            "acceptance": [{"kind": "diag.nvml"}],
            "hostReserve": {"vcpu": 8, "memoryGiB": 64},
            "overcommit": {"vcpu": 2},
            "maxPending": "6h",
        },
        {"gpu": 8, "vcpu": 432},
        {"gpu": 4, "vcpu": 64},
    ),
    DemoPool(
        "demo-a100-mig",
        "dgx-a100-02",
        "A100",
        "mig",
        {"hostReserve": {"vcpu": 8, "memoryGiB": 64}, "maxPending": "6h"},
        {"gpu.mig": 28},
        {"gpu.mig": 8},
    ),
    DemoPool(
        "demo-l40s-slots",
        "l40s-node-03",
        "L40S",
        "timeslice",
        {"replicas": 4, "hugepages": {"2Mi": 1024}},
        {"gpu.slot": 16},
        None,
    ),
)


# A console-format log line at info or below: it goes to the log file only.
QUIET = re.compile(rb"^\S+ \[(?:debug|info) *\] ")


def _bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def _copy_log(child: subprocess.Popen[bytes], path: Path, name: str) -> threading.Thread:
    """A thread copying the child's output into the log file at ``path``; lines at warning or
    above, and what is not a log record (a traceback, a usage error), go to the terminal's
    stderr too, after ``name``."""
    source = child.stdout
    assert source is not None

    def copy() -> None:
        with path.open("ab", buffering=0) as log:
            for line in source:
                log.write(line)
                if not QUIET.match(line):
                    sys.stderr.buffer.write(f"{name}: ".encode() + line)
                    sys.stderr.flush()

    thread = threading.Thread(target=copy, name=f"log {name}", daemon=True)
    thread.start()
    return thread


def _call(url: str, token: str, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        f"{url}/api/{path}",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _wait_ready(url: str, server: subprocess.Popen[bytes]) -> None:
    for _ in range(200):
        if server.poll() is not None:
            raise click.ClickException("the control plane exited; see its errors above")
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=1):
                return
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.1)
    raise click.ClickException("the control plane did not become ready")


def _wait_nodes(url: str, root: str, pool_ids: set[str], seconds: float = 30) -> list[Any]:
    """The nodes of the demo's pools once each pool has a ready one (H1: its agent applied
    its NodeSpec), or as they are after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        fleet = _call(url, root, "compute/nodes/list", {"tenantId": "root"})["items"]
        nodes = [n for n in fleet if n["poolId"] in pool_ids]
        ready = {n["poolId"] for n in nodes if n["state"] == "ready"}
        if ready == pool_ids or time.monotonic() > deadline:
            return nodes
        time.sleep(0.2)


def _set_up(url: str, root: str, data_dir: Path) -> list[tuple[DemoPool, str]]:
    """Site, pools, tenant acme and its offers, join tokens: idempotent, so a rerun reuses them."""
    sites = _call(url, root, "compute/sites/list", {"tenantId": "root"})["items"]
    site = (
        next((s["id"] for s in sites if s["name"] == "demo"), None)
        or _call(
            url,
            root,
            "compute/sites/create",
            {"tenantId": "root", "name": "demo", "region": "local", "kind": "shared"},
        )["id"]
    )
    tenants_made = (data_dir / "acme.token").exists()
    if not tenants_made:
        _call(url, root, "iam/tenants/create", {"tenantId": "acme", "name": "Acme Corp"})
        acme = _call(url, root, "iam/credentials/create", {"tenantId": "acme", "name": "demo"})
        write_secret(data_dir / "acme.token", acme["token"])
    made = []
    for spec in POOLS:
        pool = _call(
            url,
            root,
            "compute/pools/create",
            {
                "tenantId": "root",
                "siteId": site,
                "class": "metal-host",
                "gpuModel": spec.gpu_model,
                "sharing": spec.sharing,
                "policy": spec.policy,
                "ownerQuota": spec.owner_quota,
                "idempotencyKey": spec.key,
            },
        )
        if spec.offer is not None:
            _call(
                url,
                root,
                "compute/pools/offer",
                {
                    "tenantId": "root",
                    "poolId": pool["id"],
                    "toTenantId": "acme",
                    "quota": spec.offer,
                },
            )
        state = data_dir / "agents" / spec.key / "state"
        if not (state / "node.json").exists():
            join = _call(
                url,
                root,
                "compute/joinTokens/create",
                {"tenantId": "root", "poolId": pool["id"], "ttlSeconds": 3600},
            )
            write_secret(data_dir / "agents" / spec.key / "join.token", join["token"])
        made.append((spec, pool["id"]))
    return made


def _agent(url: str, data_dir: Path, spec: DemoPool, interval: float) -> subprocess.Popen[bytes]:
    home = data_dir / "agents" / spec.key
    return subprocess.Popen(
        [
            _bin("better-compute-agent"),
            "run",
            "--controlplane",
            url,
            "--join-token-file",
            str(home / "join.token"),
            "--state-dir",
            str(home / "state"),
            "--fixture",
            str(FIXTURES),
            "--fixture-host",
            spec.host,
            # A demo never changes the machine it runs on: NodeSpecs go under the data directory.
            "--root",
            str(home / "root"),
            "--interval",
            str(interval),
            "--log-format",
            "console",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _delivered(url: str, acme: str, pool_id: str, seconds: float) -> Any:
    """Acme's demo reservation on the H100 pool (made once: an idempotency key), once its host
    has delivered it (D5, D6) or ``seconds`` have passed; the reservation as it then is."""
    made = _call(
        url,
        acme,
        "compute/reservations/create",
        {
            "tenantId": "acme",
            "poolId": pool_id,
            "resources": {"gpu": 2, "vcpu": 16},
            "idempotencyKey": "demo-acme-h100",
        },
    )
    deadline = time.monotonic() + seconds
    while made["state"] == "placed" and time.monotonic() < deadline:
        time.sleep(0.2)
        made = _call(
            url, acme, "compute/reservations/get", {"tenantId": "acme", "reservationId": made["id"]}
        )
    return made


def _booking_lines(data_dir: Path, reservation: Any) -> str:
    """Where the demo reservation is delivered: its slice and environment file."""
    rid, state = reservation["id"], reservation["state"]
    placement = reservation.get("placement") or {}
    gpus = ", ".join(f"GPU {g['index']}" for g in placement.get("gpus", []))
    root = data_dir / "agents" / "demo-h100" / "root"
    if state != "active":
        return f"Acme's reservation {rid} is {state} ({reservation.get('reason') or 'waiting'}).\n"
    return (
        f"Acme's reservation {rid} is active on {placement.get('hostname')} ({gpus}, CPUs "
        f"{placement.get('cpus')}), delivered as\n"
        f"  {root / 'run/systemd/system' / f'better-compute-{rid}.slice'}\n"
        f"  {root / 'run/better-compute/reservations' / f'{rid}.env'}\n"
    )


def _banner(
    url: str,
    data_dir: Path,
    pools: list[tuple[DemoPool, str]],
    nodes: list[Any],
    reservation: Any,
) -> str:
    """What the demo serves, and commands to paste into another terminal (absolute paths, so
    they work from any directory)."""
    found = {(n["poolId"], n["hostname"]): n for n in nodes}
    lines = []
    for spec, pool_id in pools:
        node = found.get((pool_id, spec.host))
        joined = (
            f"joined as {node['id']}"
            if node
            else f"has no node yet: see {data_dir / 'agents' / spec.key / 'agent.log'}"
        )
        lines += [
            f"  {spec.gpu_model} {spec.sharing:<9}  {pool_id}",
            f"{'':18}{spec.host} {joined}",
        ]
    states = ", ".join(f"{n['hostname']} {n['state']}" for n in nodes)
    h100 = next(pool_id for spec, pool_id in pools if spec.key == "demo-h100")
    root, acme = (data_dir / "root.token").resolve(), (data_dir / "acme.token").resolve()
    pools_text = "\n".join(lines)
    return (
        f"better-compute is serving on {url} with three agents on recorded hosts:\n{pools_text}\n"
        f"Nodes: {states}.\n"
        f"{_booking_lines(data_dir, reservation)}"
        f"Tokens: {root} (root), {acme} (tenant acme), mode 0600.\n"
        f"NodeSpecs are applied under {data_dir / 'agents'}/*/root, never to this machine.\n"
        f"Logs: {data_dir / 'controlplane.log'}, {data_dir / 'agents'}/*/agent.log "
        "(their warnings and errors show here too).\n\n"
        "Try, in another terminal:\n"
        f'  export PATH="{Path(sys.executable).parent}:$PATH"\n'
        f"  export BETTER_COMPUTE_URL={url} BETTER_COMPUTE_TOKEN_FILE={acme}\n"
        "  better-compute pools list --tenant acme\n"
        f"  better-compute pools capacity --tenant acme {h100}\n"
        f"  better-compute reservations get --tenant acme {reservation['id']}\n"
        f"  better-compute reservations create --tenant acme {h100} --resource gpu=2\n"
        f"  BETTER_COMPUTE_TOKEN_FILE={root} better-compute nodes list --tenant root\n"
    )


@click.command()
@click.option(
    "--data", "data_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("var")
)
@click.option("--listen", default="127.0.0.1:8080", show_default=True)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=5.0,
    show_default=True,
    help="Agent report interval (the demo's reservation is delivered at the next one).",
)
@click.option(
    "--reconcile-interval",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="Seconds between the control plane's reconciler passes.",
)
def demo(data_dir: Path, listen: str, interval: float, reconcile_interval: float) -> None:
    """Serve the control plane with three agents on recorded hosts, until Ctrl-C.

    It prints commands to try, kept in DATA/try-this.txt (`cat` it to see them again). The
    logs go to DATA/controlplane.log and DATA/agents/*/agent.log; the terminal shows their
    warnings and errors.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    url = f"http://{listen}"
    token_file = data_dir / "root.token"
    server = subprocess.Popen(
        [
            _bin("better-compute-controlplane"),
            "serve",
            "--db",
            str(data_dir / "better-compute.db"),
            "--listen",
            listen,
            "--root-token-file",
            str(token_file),
            "--reconcile-interval",
            str(reconcile_interval),
            "--log-format",
            "console",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    copies = [_copy_log(server, data_dir / "controlplane.log", "controlplane")]
    agents: list[subprocess.Popen[bytes]] = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        _wait_ready(url, server)
        pools = _set_up(url, token_file.read_text().strip(), data_dir)
        for spec, _ in pools:
            agents.append(_agent(url, data_dir, spec, interval))
            copies.append(
                _copy_log(agents[-1], data_dir / "agents" / spec.key / "agent.log", spec.host)
            )
        nodes = _wait_nodes(url, token_file.read_text().strip(), {p for _, p in pools})
        h100 = next(pool_id for spec, pool_id in pools if spec.key == "demo-h100")
        acme = (data_dir / "acme.token").read_text().strip()
        reservation = _delivered(url, acme, h100, 3 * interval + 5)
        banner = _banner(url, data_dir, pools, nodes, reservation)
        (data_dir / "try-this.txt").write_text(banner)
        click.echo(
            f"\n{banner}This again: cat {data_dir / 'try-this.txt'}. Ctrl-C stops everything.\n"
        )
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        for process in (*agents, server):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in (*agents, server):
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
        for copy in copies:
            copy.join(timeout=5)  # the last lines reach the log files
