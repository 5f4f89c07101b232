"""`make run`: the control plane and one agent on this machine, joined to a demo pool.

The agent reports this host's real inventory when it has an NVIDIA GPU, and
the recorded DGX H100 (agent/fixtures/host-fixtures.json) otherwise, so a new
user sees capacity rows either way.
"""

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import click

from shared.files import write_secret

FIXTURES = Path(__file__).resolve().parent.parent / "agent" / "fixtures" / "host-fixtures.json"
DEMO_HOST = "dgx-h100-01"
DEMO_POLICY = {
    "acceptance": [{"kind": "diag.nvml"}],
    "hostReserve": {"vcpu": 8, "memoryGiB": 64},
    "overcommit": {"vcpu": 2},
}


def _bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


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
            raise click.ClickException("the control plane exited; see its log above")
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=1):
                return
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.1)
    raise click.ClickException("the control plane did not become ready")


def _host_source() -> tuple[list[str], str]:
    """Agent flags for the inventory to report, and the GPU family it has."""
    found = subprocess.run(
        [_bin("better-compute-agent"), "inventory"], capture_output=True, check=True
    )
    inventory = json.loads(found.stdout)
    families = [gpu["family"] for gpu in inventory["gpus"] if gpu["family"]]
    if families:
        return [], families[0]
    return ["--fixture", str(FIXTURES), "--fixture-host", DEMO_HOST], "H100"


@click.command()
@click.option(
    "--data", "data_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("var")
)
@click.option("--listen", default="127.0.0.1:8080", show_default=True)
@click.option(
    "--interval", type=float, default=30.0, show_default=True, help="Agent report interval."
)
def demo(data_dir: Path, listen: str, interval: float) -> None:
    """Serve the control plane and run one agent joined to a demo pool, until Ctrl-C."""
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
            "--log-format",
            "console",
        ]
    )
    agent: subprocess.Popen[bytes] | None = None
    try:
        _wait_ready(url, server)
        root = token_file.read_text().strip()
        agent_flags, family = _host_source()
        sites = _call(url, root, "compute/sites/list", {"tenantId": "root"})["items"]
        site = (
            next((s["id"] for s in sites if s["name"] == "local"), None)
            or _call(
                url,
                root,
                "compute/sites/create",
                {"tenantId": "root", "name": "local", "region": "local", "kind": "shared"},
            )["id"]
        )
        pool = _call(
            url,
            root,
            "compute/pools/create",
            {
                "tenantId": "root",
                "siteId": site,
                "class": "metal-host",
                "gpuModel": family,
                "policy": DEMO_POLICY,
                "idempotencyKey": f"demo-{family}",
            },
        )
        state_dir = data_dir / "agent"
        join_file = data_dir / "join.token"
        if not (state_dir / "node.json").exists():
            join = _call(
                url,
                root,
                "compute/joinTokens/create",
                {"tenantId": "root", "poolId": pool["id"], "ttlSeconds": 3600},
            )
            write_secret(join_file, join["token"])
        agent = subprocess.Popen(
            [
                _bin("better-compute-agent"),
                "run",
                "--controlplane",
                url,
                "--join-token-file",
                str(join_file),
                "--state-dir",
                str(state_dir),
                "--interval",
                str(interval),
                # A demo never changes the machine it runs on: the NodeSpec is applied into a
                # directory (commands are recorded there, not run).
                "--root",
                str(data_dir / "host-root"),
                "--log-format",
                "console",
                *agent_flags,
            ]
        )
        source = "this host" if not agent_flags else f"the recorded host {DEMO_HOST} (no GPU here)"
        click.echo(
            f"\nbetter-compute is serving on {url}\n"
            f"  root token: {token_file} (mode 0600)\n"
            f"  demo pool:  {pool['id']} ({family}), one agent reporting {source}\n"
            f"  NodeSpec:   applied under {data_dir / 'host-root'}, not to this machine\n"
            f"  capacity:   curl -s -X POST {url}/api/compute/pools/capacity "
            f'-H "Authorization: Bearer $(cat {token_file})" '
            f'-d \'{{"tenantId": "root", "poolId": "{pool["id"]}"}}\'\n'
            "Ctrl-C stops both.\n"
        )
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        for process in (agent, server):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=15)
