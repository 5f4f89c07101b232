"""F3: the agent trusts only what it must.

Its allowlist (agent/trust.py) is checked against the renderer: every recorded host rendered
under policies that between them use every policy field the renderer reads, applied (and
undone) by the real applier into a temporary root, and bookings delivered and released there;
every file written and every command run passes the check, and every directory and command
shape of the lists is used. Then what it refuses, whole: paths that leave the allowed
directories (``..``, symlinks), commands and services it does not run, a booking that is no
reservation, and a real control plane behind a proxy that adds a malicious unit. Then the
plain-HTTP refusal of `run` and the CLI's warning.
"""

import asyncio
import json
import os
import shutil
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
import msgspec
import pytest
from aiohttp import web
from click.testing import CliRunner

import controlplane.cli.calls
from agent.apply import Applier, RecordingRunner
from agent.delivery import Deliverer
from agent.loop import Agent, Settings, SpecRefused
from agent.state import NodeCredential, State
from agent.trust import (
    COMMANDS,
    KERNEL_ARGS,
    SYSCTL_KEYS,
    WRITE_DIRS,
    Word,
    check_spec,
    command_shape,
    plain_http_off_loopback,
    write_dir_of,
)
from controlplane.capacity.admission import CONFIGURING, READY, configured
from controlplane.cli import cli as better_compute
from shared.inventory import Inventory
from shared.nodespec import Booking, NodeSpecUnits, RenderRefused, Unit
from shared.policy import parse_policy
from shared.render import render
from shared.sdnotify import Notifier
from tests.daemons import Daemon, call, root_pool, serving
from tests.nodes import FIXTURES, recorded
from tests.specs import HUGEPAGES_FILE, HUGEPAGES_TEXT, host_apply, served
from tests.test_agent_e2e import AGENT, agent_command, nodes_of
from tests.test_agent_loop import listening_systemd, run_for

HOSTS = tuple(host["id"] for host in json.loads(FIXTURES.read_text())["hosts"])
RES_A = "res_01jz8x4f7c9d2e3g5h6k7m8n9p"
RES_B = "res_01jz8x4f7c9d2e3g5h6k7m8n9q"
KUBERNETES = {
    "apiServer": "https://k8s.gpu.example.net/",
    "token": "abcdef.0123456789abcdef",
    "caCertHash": "sha256:" + "7c" * 32,
}
# Between them, every field the renderer reads, each of its choices and both page sizes; a
# host that cannot take a field renders the rest (render_for).
POLICIES: tuple[tuple[str, dict[str, Any]], ...] = (
    (
        "exclusive",
        {
            "hostReserve": {"vcpu": 2, "memoryGiB": 4},
            "hugepages": {"2Mi": 64, "1Gi": 1},
            "kernelModules": {
                "load": ["vfio_pci", "nvidia_peermem"],
                "blacklist": ["nouveau"],
                "options": {"nouveau": "modeset=0"},
            },
            "cpu": {"governor": "performance", "isolate": "2-3"},
            "iommu": {"mode": "passthrough"},
            "gpu": {
                "persistenceMode": True,
                "computeMode": "exclusive-process",
                "powerLimitW": 300,
            },
            "kubernetes": KUBERNETES,
            "platformOperated": True,
            "prewarmImages": [
                "nvcr.io/nvidia/pytorch:24.08-py3",
                "registry.example:5000/team/job@sha256:" + "ab" * 32,
            ],
        },
    ),
    (
        "exclusive",  # the governor changes: its service restarts
        {
            "iommu": {"mode": "on"},
            "cpu": {"governor": "powersave"},
            "gpu": {"persistenceMode": False, "computeMode": "default"},
        },
    ),
    ("exclusive", {"iommu": {"mode": "off"}, "gpu": {"computeMode": "prohibited"}}),
    ("mig", {"migLayout": {"default": ["3g.40gb", "3g.40gb"]}}),
    ("timeslice", {"replicas": 4}),
    ("mps", {"replicas": 8}),
)
FIELDS = {
    "hugepages",
    "kernelModules",
    "cpu",
    "iommu",
    "gpu",
    "migLayout",
    "replicas",
    "kubernetes",
    "prewarmImages",
}
SPEC_REFUSED = "spec refused: "


def render_for(
    inventory: Inventory, sharing: str, policy: dict[str, Any]
) -> tuple[NodeSpecUnits, set[str]] | None:
    """The policy rendered for the host, less each field the host cannot take, and the fields
    that rendered; None when the host cannot share its GPUs so (MPS on MIG GPUs)."""
    policy = dict(policy)
    families = sorted({gpu.family for gpu in inventory.gpus if gpu.family})
    while True:
        try:
            spec = render(
                parse_policy(policy),
                sharing=sharing,
                gpu_model=families[0] if families else None,
                inventory=inventory,
            )
        except RenderRefused as exc:
            field = exc.field.split(".")[0]
            if field not in policy:
                return None
            del policy[field]
            continue
        return spec, FIELDS & set(policy)


def files_under(root: Path) -> set[str]:
    """Every file under root as a host path, the recording runner's own (/proc, its log) aside."""
    if not root.exists():
        return set()
    found = {"/" + str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir()}
    return {p for p in found if not p.startswith(("/proc/", "/var/lib/better-compute/"))}


def commands_run(root: Path) -> list[list[str]]:
    log = root / "var/lib/better-compute/commands.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


class Coverage:
    """What the renders and deliveries used of the lists."""

    def __init__(self) -> None:
        self.dirs: set[str] = set()
        self.shapes: set[tuple[Word, ...]] = set()
        self.fields: set[str] = set()
        self.kernel_args: set[str] = set()
        self.sysctls: set[str] = set()

    def spec(self, root: Path, spec: NodeSpecUnits, fields: set[str]) -> None:
        check_spec(root, spec, [])
        self.fields |= fields
        self.kernel_args |= {
            arg.partition("=")[0]
            for unit in spec.units
            if unit.kind == "kernel-args"
            for arg in unit.content.split()
        }

    def files(self, root: Path) -> None:
        for path in files_under(root):
            allowed = write_dir_of(root, path)
            assert allowed is not None, path
            self.dirs.add(allowed)

    def commands(self, root: Path) -> None:
        for argv in commands_run(root):
            shape = command_shape(argv)
            assert shape is not None, argv
            self.shapes.add(shape)
            if argv[0] == "sysctl":
                self.sysctls.add(argv[2].partition("=")[0])

    def booking(self, tmp_path: Path, inventory: Inventory, booking: Booking) -> None:
        """The booking delivered, then released, into a root of its own."""
        root = tmp_path / "bookings" / booking.reservation_id
        devices = [d for g in inventory.gpus for d in (g.uuid, *(m.uuid for m in g.mig_instances))]
        processes: dict[str, list[int]] = {device: [] for device in devices}
        runner = RecordingRunner(root)
        deliverer = Deliverer(root, root.with_suffix(".state"), runner, lambda: processes)
        check_spec(root, NodeSpecUnits(version="v", units=[], reboot=False), [booking])
        assert deliverer.deliver([booking], inventory)[0].state == "delivered"
        self.files(root)
        released = msgspec.structs.replace(booking, state="release")
        assert deliverer.deliver([released], inventory)[0].state == "released"
        assert files_under(root) == set()
        self.commands(root)


def test_every_render_and_delivery_stays_inside_the_allowlist(tmp_path: Path) -> None:
    """Every recorded host under every policy: each spec passes the check; applying them in turn
    (a service restarted on the way) and then undoing everything writes only under WRITE_DIRS
    and runs only COMMANDS; bookings (a GPU, a MIG instance) likewise. Every directory, command
    shape, kernel argument and sysctl key of the lists is used, and every policy field."""
    seen = Coverage()
    for name in HOSTS:
        inventory = recorded(name)
        root = tmp_path / "roots" / name
        applier = Applier(root, tmp_path / "states" / name, RecordingRunner(root))
        for sharing, policy in POLICIES:
            rendered = render_for(inventory, sharing, policy)
            if rendered is None:
                continue
            spec, fields = rendered
            seen.spec(root, spec, fields)
            report = applier.apply(spec)
            assert all(u.status != "failed" for u in report.units), report
            seen.files(root)
        applier.apply(NodeSpecUnits(version="none", units=[], reboot=False))  # undo it all
        assert files_under(root) == set()
        seen.commands(root)
    h100, a100 = recorded("dgx-h100-01"), recorded("dgx-a100-02")
    mig = a100.gpus[4].mig_instances[0].uuid
    seen.booking(tmp_path, h100, Booking(reservation_id=RES_A, gpus=[h100.gpus[0].uuid], cpus="8"))
    seen.booking(tmp_path, a100, Booking(reservation_id=RES_B, mig_instances=[mig], memory_bytes=1))
    assert seen.fields == FIELDS
    assert seen.dirs == set(WRITE_DIRS)
    assert seen.shapes == set(COMMANDS)
    assert seen.kernel_args == set(KERNEL_ARGS)
    assert seen.sysctls == set(SYSCTL_KEYS)


def file_unit(path: str, **fields: Any) -> dict[str, Any]:
    return {"id": f"file{path}", "kind": "file", "path": path, "content": "x\n", **fields}


# The spec's own (rendered) units: the hugepages sysctl file, then its sysctl.
GOOD, GOOD_SYSCTL = served("s1")["units"]
EVIL_COMMAND = {"id": "evil", "kind": "command", "argv": ["/bin/sh", "-c", "touch /tmp/pwned"]}


class Serving:
    """A control plane that serves one spec and keeps every report's ``applied``."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.served = spec
        self.applied: list[Any] = []

    def report(self, token: str, node: str, inventory: Any, applied: Any, bookings: Any) -> Any:
        self.applied.append(applied)
        return {"specVersion": self.served["version"]}

    def spec(self, *args: Any) -> Any:
        return self.served


def refused(tmp_path: Path, *units: dict[str, Any], bookings: Any = ()) -> tuple[str, Serving]:
    """One cycle of the real agent on a spec with these units and bookings: the refusal it
    raised (with --once) and the control plane that heard it. The state starts afresh."""
    shutil.rmtree(tmp_path / "state", ignore_errors=True)
    state = State(tmp_path / "state")
    state.save_credential(NodeCredential("node_x", "bcn_x", "pool_x", "http://127.0.0.1:9"))
    root = tmp_path / "root"
    serving = Serving({**served("s1", bookings=bookings), "units": list(units)})
    host = recorded("dgx-h100-01")
    agent = Agent(
        Settings("http://127.0.0.1:9", tmp_path / "t"),
        state,
        lambda: host,
        serving,
        host_apply(root, state.directory),
    )
    with pytest.raises(SpecRefused) as caught:
        agent.run(threading.Event(), once=True)
    assert serving.applied[-1] == {"version": "s1", "refused": str(caught.value), "units": []}
    return str(caught.value), serving


def written(tmp_path: Path) -> set[str]:
    """Every file under tmp_path but the agent's own state."""
    return {
        str(p.relative_to(tmp_path))
        for p in tmp_path.rglob("*")
        if not p.is_dir() and not p.is_relative_to(tmp_path / "state")
    }


def test_a_path_that_climbs_out_of_its_directory_is_refused_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    """``..`` from inside /etc/modules-load.d, to beside --root and to the real /tmp: the whole
    spec is refused (its good unit unwritten too), nothing is written anywhere."""
    outside = f"/etc/modules-load.d/{'../' * 40}tmp/bc-escape-{os.getpid()}.conf"
    for path, where in (
        ("/etc/modules-load.d/../../../escape.conf", tmp_path / "escape.conf"),
        (outside, Path(f"/tmp/bc-escape-{os.getpid()}.conf")),
    ):
        reason, _ = refused(tmp_path, GOOD, file_unit(path))
        assert "outside the directories this agent writes under" in reason
        assert not where.exists()
        assert written(tmp_path) == set()
        assert sorted(os.listdir(tmp_path / "state")) == ["node.json", "spec.json"]


def test_a_symlink_out_of_an_allowed_directory_is_refused(tmp_path: Path) -> None:
    """A link inside /etc/modprobe.d to a directory outside, a file that is a link outside, and
    an allowed directory that is itself a link: refused, the link's target untouched."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    outside.mkdir()
    (root / "etc/modprobe.d").mkdir(parents=True)
    (root / "etc/modprobe.d/out").symlink_to(outside)
    (root / "etc/modprobe.d/bc.conf").symlink_to(outside / "bc.conf")
    (root / "etc/sysctl.d").symlink_to(outside)
    for path in ("/etc/modprobe.d/out/x.conf", "/etc/modprobe.d/bc.conf", "/etc/sysctl.d/x.conf"):
        reason, _ = refused(tmp_path, file_unit(path))
        assert f"{path!r} is outside" in reason
        assert os.listdir(outside) == []


@pytest.mark.parametrize(
    ("unit", "said"),
    [
        (EVIL_COMMAND, "the command ['/bin/sh', '-c', 'touch /tmp/pwned'] is not one"),
        ({"id": "s", "kind": "service", "content": "ssh.service"}, "'ssh.service'] is not one"),
        ({"id": "m", "kind": "module", "content": "-r"}, "['modprobe', '-r'] is not one"),
        ({"id": "k", "kind": "sysctl", "content": "kernel.core_pattern=|/x"}, "is not one"),
        ({"id": "c", "kind": "command", "argv": ["crictl", "pull", "--creds=x"]}, "is not one"),
        ({"id": "g", "kind": "kernel-args", "content": 'quiet" ; touch /x ; "'}, "kernel argument"),
        ({"id": "g", "kind": "kernel-args", "content": "init=/bin/sh"}, "kernel argument"),
        (file_unit("/etc/sysctl.d/x", mode=0o4755), "file mode 4755"),
        (file_unit("/etc/sysctl.d/x", mode=0o666), "file mode 0666"),
        (file_unit("etc/sysctl.d/x"), "is not an absolute path"),
        (file_unit("/etc/sysctl.d/x\0y"), "is not a path"),
        (file_unit("/etc/passwd"), "is outside"),
        (file_unit("/var/lib/better-compute-agent/node.json"), "is outside"),
        (file_unit("/etc/sysctl.d"), "is outside"),
    ],
)
def test_what_no_unit_of_the_renderer_asks_is_refused_whole(
    tmp_path: Path, unit: dict[str, Any], said: str
) -> None:
    """A command, service, module, sysctl, image or kernel argument the renderer never makes, a
    mode it never writes, a path it never writes under: the spec refused, nothing of it done."""
    reason, _ = refused(tmp_path, GOOD, unit)
    assert reason.startswith(f"unit {unit['id']!r}: ") and said in reason, reason
    assert written(tmp_path) == set()


EVIL_SERVICE = "[Service]\nExecStart=/bin/sh -c 'touch /tmp/pwned'\n"


@pytest.mark.parametrize(
    ("unit", "said"),
    [
        (
            file_unit("/etc/systemd/system/better-compute-evil.service", content=EVIL_SERVICE),
            "the file is not what this agent renders of the spec's policy",
        ),
        (
            {"id": "evil/enable", "kind": "service", "content": "better-compute-evil.service"},
            "the service is not what",
        ),
        (
            file_unit("/etc/modprobe.d/90-better-compute.conf", content="install nvidia /x\n"),
            "the file is not what",
        ),
        ({**GOOD, "content": GOOD["content"] + "kernel.modprobe = /x\n"}, "the file is not"),
        ({**GOOD, "mode": 0o600}, "the file is not"),
        ({**GOOD_SYSCTL, "content": "vm.nr_hugepages=99999"}, "the sysctl is not"),
    ],
)
def test_f3_units_the_renderer_does_not_make_of_the_policy_are_refused_whole(
    tmp_path: Path, unit: dict[str, Any], said: str
) -> None:
    """Paths and command shapes the allowlist takes, but not what the agent's own renderer makes
    of the policy the spec carries (a service unit file, enabling it, an ``install`` line in
    modprobe.d, a rendered file or sysctl changed): refused whole, nothing written."""
    others = [good for good in (GOOD, GOOD_SYSCTL) if good["id"] != unit["id"]]
    reason, _ = refused(tmp_path, *others, unit)
    assert reason.startswith(f"unit {unit['id']!r}: ") and said in reason, reason
    assert written(tmp_path) == set()


def test_f3_units_with_no_policy_to_render_them_from_are_refused(tmp_path: Path) -> None:
    """A spec whose units come without the policy they were rendered from cannot be checked:
    refused; a spec of bookings alone has nothing to check and is delivered."""
    state = State(tmp_path / "state")
    gate = host_apply(tmp_path / "root", state.directory)
    bare = {"version": "s1", "reboot": False, "units": [GOOD, GOOD_SYSCTL]}
    done = gate.apply(bare, recorded("dgx-h100-01"))
    assert done.bookings is None and done.applied["units"] == []
    assert done.applied["refused"] == (
        "the spec carries no policy and sharing mode to render its units from"
    )
    assert written(tmp_path) == set()
    gpu = recorded("dgx-h100-01").gpus[0].uuid
    alone = {"version": "s2", "bookings": [{"reservationId": RES_A, "gpus": [gpu]}]}
    done = gate.apply(alone, recorded("dgx-h100-01"))
    assert done.bookings == [{"reservationId": RES_A, "state": "delivered", "reason": None}]


def test_a_booking_that_is_no_reservation_is_refused_whole(tmp_path: Path) -> None:
    """D8, F3: a booking id that would name a path: the spec refused, its units and its other
    bookings neither applied nor delivered."""
    gpu = recorded("dgx-h100-01").gpus[0].uuid
    bookings = [
        {"reservationId": RES_A, "gpus": [gpu]},
        {"reservationId": "../../etc/passwd", "gpus": [gpu]},
    ]
    reason, _ = refused(tmp_path, GOOD, bookings=bookings)
    assert reason == "booking '../../etc/passwd': not a reservation id"
    assert written(tmp_path) == set()


def test_the_refusal_is_reported_when_news_and_a_trusted_spec_applies_again(
    tmp_path: Path,
) -> None:
    """A cycle that refuses the spec in hand again reports nothing new; the loop (not --once)
    says why in STATUS and pings the watchdog (the agent works); the next spec it trusts is
    applied."""
    _, serving = refused(tmp_path, EVIL_COMMAND)
    assert len(serving.applied) == 2  # the cycle's report, then the refusal at once
    state = State(tmp_path / "state")
    root = tmp_path / "root"
    with listening_systemd() as (messages, address):
        loop = Agent(
            Settings("http://127.0.0.1:9", tmp_path / "t", interval=0.01),
            state,
            lambda: recorded("dgx-h100-01"),
            serving,
            host_apply(root, state.directory),
            Notifier(address, watchdog_usec=20_000),
        )
        run_for(loop)
    refusals = [a for a in serving.applied[2:] if a is not None]
    assert refusals and all(a == serving.applied[1] for a in refusals)
    assert messages[0].startswith("READY=1\nSTATUS=spec refused: unit 'evil': ")
    assert "WATCHDOG=1" in messages
    serving.served = served("s2")
    loop.run(threading.Event(), once=True)
    assert serving.applied[-1]["version"] == "s2" and "refused" not in serving.applied[-1]
    assert (root / HUGEPAGES_FILE).read_text() == HUGEPAGES_TEXT


def test_the_node_is_configuring_while_its_current_spec_is_refused() -> None:
    """H1, F3: a refusal of the current spec makes even a ready node configuring with the
    agent's reason; one of an older spec does not."""
    refusal = {"version": "v2", "refused": "unit 'evil': no", "units": []}
    done = configured("v2", refusal, "v1", was_ready=True, pending_reboot=False)
    assert (done.state, done.reason) == (CONFIGURING, "spec refused: unit 'evil': no")
    assert done.applied_version == "v1"
    older = configured("v3", refusal, "v1", was_ready=True, pending_reboot=False)
    assert (older.state, older.reason) == (READY, None)
    long = configured("v2", {**refusal, "refused": "x" * 900}, None, False, False)
    assert long.reason is not None and len(long.reason) == 500


EVIL_FILE = {
    "id": "evil/file",
    "kind": "file",
    "path": "/etc/modprobe.d/../../../evil",
    "content": "",
}


@asynccontextmanager
async def lying(upstream: str, unit: dict[str, Any]) -> AsyncIterator[str]:
    """A proxy on loopback that forwards every request to ``upstream`` and adds ``unit`` to
    every NodeSpec it answers; its URL."""
    session = aiohttp.ClientSession()

    async def forward(request: web.Request) -> web.Response:
        headers = {
            k: v for k, v in request.headers.items() if k in ("Authorization", "Content-Type")
        }
        async with session.request(
            request.method, upstream + request.path_qs, data=await request.read(), headers=headers
        ) as answer:
            body = await answer.read()
            if request.path == "/api/compute/nodes/spec" and answer.status == 200:
                spec = json.loads(body)
                spec["units"].append(unit)
                body = json.dumps(spec).encode()
            return web.Response(status=answer.status, body=body, content_type=answer.content_type)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    try:
        async with serving(app) as url:
            yield url
    finally:
        await session.close()


EVIL_UNIT_FILE = {
    "id": "evil/file",
    "kind": "file",
    "path": "/etc/systemd/system/better-compute-evil.service",
    "content": EVIL_SERVICE,
}


@pytest.mark.parametrize("evil", [EVIL_FILE, EVIL_UNIT_FILE], ids=["path", "content"])
async def test_a_control_plane_that_lies_gets_nothing_of_its_spec_applied(
    daemon: Daemon, tmp_path: Path, evil: dict[str, Any]
) -> None:
    """The real agent (--once) behind a proxy that adds a unit to the real control plane's
    NodeSpec, one writing outside its directories or a service unit file its renderer never
    makes: refused whole (the policy's own huge pages file is not written either), it exits 1
    saying why, and the node's stateReason says so."""
    async with aiohttp.ClientSession() as session:
        pool = await root_pool(session, daemon, gpuModel="H100", policy={"hugepages": {"2Mi": 64}})
        token = await call(
            session,
            daemon.url,
            "compute/joinTokens/create",
            daemon.token,
            {"tenantId": "root", "poolId": pool["id"]},
        )
    token_file = tmp_path / "join.token"
    token_file.write_text(token["token"])
    root = tmp_path / "host-root"
    async with lying(daemon.url, evil) as url:
        command = agent_command(daemon, token_file, "dgx-h100-01", "--root", str(root), "--once")
        command[command.index(daemon.url)] = url
        agent = await asyncio.create_subprocess_exec(
            *command, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = await asyncio.wait_for(agent.communicate(), 60)
    assert agent.returncode == 1, err.decode()
    assert "better-compute-agent: spec refused: unit 'evil/file'" in err.decode()
    assert '"spec refused: nothing of it is applied"' in out.decode()
    assert files_under(root) == set() and not (tmp_path / "evil").exists()
    [node] = await nodes_of(daemon, pool["id"])
    async with aiohttp.ClientSession() as session:
        got = await call(
            session,
            daemon.url,
            "compute/nodes/get",
            daemon.token,
            {"tenantId": "root", "nodeId": node["id"]},
        )
    assert got["state"] == "configuring"
    assert got["stateReason"].startswith(SPEC_REFUSED + "unit 'evil/file': "), got["stateReason"]


@pytest.mark.parametrize(
    ("url", "off"),
    [
        ("http://127.0.0.1:8080", False),
        ("http://127.8.9.10", False),
        ("http://[::1]:8080/", False),
        ("http://localhost:8080", False),
        ("http://LocalHost", False),
        ("https://10.0.0.1:1", False),
        ("http://10.0.0.1:1", True),
        ("HTTP://10.0.0.1", True),
        ("http://controlplane.example:8080", True),
        ("http://localhost.example", True),
        ("http://0.0.0.0:8080", True),
        ("http://[::1", True),
    ],
)
def test_loopback_is_127_8_and_1_and_localhost(url: str, off: bool) -> None:
    """F3's loopback: 127.0.0.0/8, ::1 and localhost; any other host over plain HTTP is off it."""
    assert plain_http_off_loopback(url) is off


def run_agent(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    token = tmp_path / "join.token"
    token.write_text("bcj_x")
    return subprocess.run(
        [
            str(AGENT),
            "run",
            "--controlplane",
            "http://10.0.0.1:1",
            "--join-token-file",
            str(token),
            "--state-dir",
            str(tmp_path / "state"),
            "--fixture",
            str(FIXTURES),
            "--fixture-host",
            "vps-cpu-01",
            "--root",
            str(tmp_path / "root"),
            "--once",
            "--log-format",
            "json",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_plain_http_control_plane_off_loopback_is_refused_unless_insecure(
    tmp_path: Path,
) -> None:
    """`run` exits 2 with one line before doing anything (no state directory); with
    --insecure-http it logs that it goes ahead, and does (its state directory made)."""
    done = run_agent(tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("better-compute-agent: refusing the plain-HTTP control plane")
    assert "--insecure-http" in line
    assert not (tmp_path / "state").exists()
    tried = run_agent(tmp_path, "--insecure-http")
    assert "refusing the plain-HTTP" not in tried.stderr
    assert "plain HTTP off loopback, as --insecure-http allows" in tried.stdout
    assert (tmp_path / "state").is_dir()


class Pages:
    """A control plane (in the CLI's place) answering a list in two pages; its calls kept."""

    calls: ClassVar[list[str]] = []

    def __init__(self, url: str, **_: Any) -> None:
        pass

    def __enter__(self) -> "Pages":
        return self

    def __exit__(self, *_: Any) -> None:
        pass

    def call(self, path: str, body: dict[str, Any]) -> Any:
        self.calls.append(path)
        return {"items": [], "next": None if body.get("cursor") else "page-2"}


@pytest.fixture
def pages(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[str]]:
    monkeypatch.setattr(controlplane.cli.calls, "ControlPlane", Pages)
    monkeypatch.setattr(Pages, "calls", [])
    for name in [n for n in os.environ if n.startswith("BETTER_COMPUTE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))  # no profile of the machine's
    yield Pages.calls


@pytest.mark.parametrize(
    ("url", "warned"),
    [("http://10.0.0.1:8080", True), ("http://127.0.0.1:8080", False), ("https://x", False)],
)
def test_the_cli_warns_once_of_plain_http_off_loopback(
    pages: list[str], url: str, warned: bool
) -> None:
    """Two calls (a list of two pages), one warning on stderr; none on loopback or over TLS."""
    args = ["--url", url, "--token", "t", "-o", "json", "reservations", "list", "--tenant", "a"]
    result = CliRunner().invoke(better_compute, args)
    assert result.exit_code == 0, result.output
    assert pages == ["compute/reservations/list"] * 2
    lines = result.stderr.splitlines()
    if warned:
        [line] = lines
        assert line.startswith(f"warning: {url} is plain HTTP off loopback")
    else:
        assert lines == []
    assert json.loads(result.stdout)["items"] == []


def test_the_allowed_directories_are_distinct_absolute_paths() -> None:
    """Each allowed directory is an absolute, normalised path, none inside another."""
    for directory in WRITE_DIRS:
        assert os.path.normpath(directory) == directory and directory.startswith("/")
        assert not any(directory.startswith(d + "/") for d in WRITE_DIRS)


def test_units_of_a_render_carry_no_field_the_check_ignores() -> None:
    """The check reads what applying acts on: a unit's path and mode (file), content
    (kernel-args, module, sysctl, service) and argv (command); the other fields say when and
    whether to apply it. A new field fails here until the check has been thought through."""
    acted_on = {"id", "kind", "content", "argv", "path", "mode"}
    bookkeeping = {"needs", "restarts", "every_boot", "gpus", "gpus_from_inventory"}
    assert set(Unit.__struct_fields__) == acted_on | bookkeeping
