"""better-compute-agent: the per-host agent (DESIGN §6)."""

import contextlib
import signal
import ssl
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import msgspec
import structlog

from agent.applier import RemoteApply, Server, listener
from agent.apply import RECORD, Applier, RecordingRunner, runner_for
from agent.client import ControlPlane, ControlPlaneError
from agent.delivery import Deliverer
from agent.gate import Host, HostApply, refusal
from agent.inventory import (
    FixtureError,
    InventoryCollector,
    collect_inventory,
    compute_processes,
)
from agent.inventory.nvml.api import load_pynvml
from agent.loop import Agent, JoinRefused, Settings, SpecRefused
from agent.plan import describe, for_people, read_host, write_tree
from agent.state import State, bookings_of, units_of
from agent.trust import plain_http_off_loopback
from shared.errors import InvalidInput
from shared.files import atomic_write
from shared.gpu import with_families
from shared.inventory import Inventory
from shared.log import configure_logging
from shared.nodespec import Booking, RenderRefused
from shared.policy import FIELD_VALIDATORS, validate_policy
from shared.policy.model import policy_warnings
from shared.render import render as render_spec
from shared.sdnotify import Notifier

log = structlog.get_logger("agent")

fixture_option = click.option(
    "--fixture",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A recorded host (host-fixtures.json format) served by a fake NVML instead of this machine.",
)
fixture_host_option = click.option(
    "--fixture-host", help="Which host of a fixture file holding several."
)
sysfs_option = click.option(
    "--sysfs-root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/"),
    show_default=True,
    help="Root under which /sys, /proc and /etc are read.",
)
release_timeout_option = click.option(
    "--release-timeout",
    type=click.FloatRange(min=1),
    default=120.0,
    show_default=True,
    help="Seconds a booking's release may take (its slice stopped, no compute process left on "
    "its GPUs) before it is reported release-blocked with the pids still there (D7).",
)


@click.group()
@click.version_option(package_name="better-compute")
def cli() -> None:
    """The Better Compute host agent."""


@cli.command()
@fixture_option
@fixture_host_option
@sysfs_option
def inventory(fixture: Path | None, fixture_host: str | None, sysfs_root: Path) -> None:
    """Print this host's inventory as JSON (or a recorded host's, with --fixture)."""
    configure_logging(stream=sys.stderr)  # stdout is the JSON alone
    try:
        found = collect_inventory(fixture=fixture, fixture_host=fixture_host, sysfs_root=sysfs_root)
    except FixtureError as exc:
        raise click.BadParameter(str(exc), param_hint="--fixture/--fixture-host") from exc
    click.echo(msgspec.json.format(msgspec.json.encode(found), indent=2).decode())


@cli.command()
@click.option("--controlplane", required=True, help="The control plane's URL.")
@click.option(
    "--insecure-http",
    is_flag=True,
    help="Take a plain-HTTP control plane that is not on loopback: the node token and every "
    "NodeSpec then cross the network unencrypted and unauthenticated.",
)
@click.option(
    "--ca-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="CA certificates (PEM) an https control plane's certificate is verified against "
    "(default: the system's).",
)
@click.option(
    "--join-token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The pool's join token, used on the first start (and to join again if forgotten).",
)
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), required=True)
@fixture_option
@fixture_host_option
@sysfs_option
@click.option("--interval", type=click.FloatRange(min=0.1), default=30.0, show_default=True)
@click.option(
    "--backoff-max",
    type=click.FloatRange(min=0.1),
    default=60.0,
    show_default=True,
    help="Longest wait between retries while the control plane is away.",
)
@click.option(
    "--rejoin-backoff-max",
    type=click.FloatRange(min=0.1),
    default=300.0,
    show_default=True,
    help="Longest wait between joins again after the control plane refused this host's "
    "credential and then its join token (a removed node, a used-up token).",
)
@click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/"),
    show_default=True,
    help="Where the NodeSpec is applied. Any root but / is a directory: files are written "
    "under it and commands are recorded in it, not run.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Fetch and keep the NodeSpec; apply nothing. At exit (with --once: after its cycle) "
    "print the plan of the kept NodeSpec against the host under --root; logs go to stderr.",
)
@release_timeout_option
@click.option(
    "--once",
    is_flag=True,
    help="One cycle, then exit; non-zero when the control plane is away or refuses this host, "
    "or its NodeSpec asks for what this agent does not do (nothing of it applied).",
)
@click.option(
    "--applier-socket",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Hand each NodeSpec it trusts to the root applier (`better-compute-agent applier`) "
    "listening there, instead of applying it in this process: this process then needs no "
    "privilege (--root is where it checks the spec's paths).",
)
@click.option("--log-format", type=click.Choice(["auto", "json", "console"]), default="auto")
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: the plan as JSON.")
def run(
    controlplane: str,
    insecure_http: bool,
    ca_file: Path | None,
    join_token_file: Path,
    state_dir: Path,
    fixture: Path | None,
    fixture_host: str | None,
    sysfs_root: Path,
    interval: float,
    backoff_max: float,
    rejoin_backoff_max: float,
    root: Path,
    dry_run: bool,
    release_timeout: float,
    once: bool,
    applier_socket: Path | None,
    log_format: str,
    as_json: bool,
) -> None:
    """Join the pool once, then report inventory, apply the NodeSpec and deliver its bookings
    every interval. A NodeSpec asking for a file or a command this agent does not write or
    run is refused whole, and reported so (F3)."""
    off_loopback = plain_http_off_loopback(controlplane)
    if off_loopback and not insecure_http:  # F3: before anything, the join token included
        click.echo(
            f"better-compute-agent: refusing the plain-HTTP control plane {controlplane}: it is "
            "not on loopback, so the node token and every NodeSpec would cross the network "
            "unprotected; use https:// (with --ca-file for a private CA) or pass --insecure-http",
            err=True,
        )
        sys.exit(2)
    configure_logging(
        json=None if log_format == "auto" else log_format == "json",
        stream=sys.stderr if dry_run else sys.stdout,  # a dry run's stdout is its plan
    )
    if off_loopback:
        log.warning("plain HTTP off loopback, as --insecure-http allows", controlplane=controlplane)
    settings = Settings(
        controlplane=controlplane,
        join_token_file=join_token_file,
        interval=interval,
        backoff_cap=backoff_max,
        rejoin_backoff_cap=rejoin_backoff_max,
        dry_run=dry_run,
    )
    try:
        client = ControlPlane(controlplane, ca_file=ca_file)  # no connection until the first call
    except ssl.SSLError as exc:  # a --ca-file that holds no PEM certificate
        raise click.BadParameter(f"{ca_file}: {exc}", param_hint="--ca-file") from exc
    # Import the NVML bindings now (importing initialises nothing), so that the first
    # cycle is as quick as the rest and a missing module shows at start.
    with contextlib.suppress(ImportError):
        load_pynvml()
    try:
        # One collector for the agent's life: one NVML init and one XID event set, kept
        # across cycles so each XID is read once and its verdict sticks (H5); closed at exit.
        collector = InventoryCollector(
            fixture=fixture, fixture_host=fixture_host, sysfs_root=sysfs_root, state_dir=state_dir
        )
    except ValueError as exc:  # FixtureError, or --fixture-host alone: refused before any join
        raise click.BadParameter(str(exc), param_hint="--fixture/--fixture-host") from exc
    notifier = Notifier.from_environment()
    runner = runner_for(root, notifier)  # units and bookings alike: recorded under a directory
    deliverer = Deliverer(root, state_dir, runner, collector.compute_processes, release_timeout)
    host: Host | None = None  # --dry-run: applied nowhere
    if applier_socket is not None and not dry_run:
        host = RemoteApply(applier_socket, root, notifier)
    elif not dry_run:
        host = HostApply(Applier(root, state_dir, runner), deliverer)
    agent = Agent(settings, State(state_dir), collector.collect, client, host, notifier)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        # Stop between requests and exit 0, as systemd expects of a stop.
        signal.signal(signum, lambda *_: stop.set())
    try:
        agent.run(stop, once=once)
        if dry_run:
            _plan_kept_spec(State(state_dir), root, collector.collect, deliverer, as_json)
    except JoinRefused as exc:
        click.echo(f"better-compute-agent: the control plane refused this host: {exc}", err=True)
        sys.exit(2)
    except SpecRefused as exc:
        click.echo(f"better-compute-agent: spec refused: {exc}", err=True)
        sys.exit(1)
    except ControlPlaneError as exc:
        click.echo(f"better-compute-agent: {exc}", err=True)
        sys.exit(1)
    except OSError as exc:  # the join token file or the state directory
        click.echo(f"better-compute-agent: {exc.strerror}: {exc.filename}", err=True)
        sys.exit(2)
    finally:
        client.close()
        collector.close()


def _echo_plan(plan: dict[str, Any], as_json: bool) -> None:
    click.echo(msgspec.json.encode(plan).decode() if as_json else for_people(plan))


def _plan_kept_spec(
    state: State,
    root: Path,
    take_inventory: Callable[[], Inventory],
    deliverer: Deliverer,
    as_json: bool,
) -> None:
    """--dry-run: the plan of the NodeSpec the agent keeps, its bookings' delivery steps
    included (D5), against the host under root."""
    kept = state.spec()
    if kept is None:
        click.echo("better-compute-agent: no NodeSpec fetched yet: nothing to plan", err=True)
        return
    spec = units_of(kept)
    inventory = take_inventory()
    # The very check the applier runs first: a plan of a spec it would not apply is its refusal.
    refused = refusal(root, kept, inventory)
    if refused is not None:
        click.echo(f"better-compute-agent: spec refused: {refused.applied['refused']}", err=True)
        sys.exit(1)
    bookings = deliverer.plan(bookings_of(kept), inventory)
    host = read_host(spec, root, inventory, state.directory / RECORD, bookings)
    _echo_plan(describe(spec, host, bookings), as_json)


@cli.command()
@click.option(
    "--socket",
    "socket_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Listen here when systemd passes no socket (socket activation): a socket of this "
    "process's user, 0600, so the network process must run as the same user.",
)
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), required=True)
@fixture_option
@fixture_host_option
@sysfs_option
@click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/"),
    show_default=True,
    help="Where NodeSpecs are applied; any root but / is a directory (commands recorded).",
)
@release_timeout_option
@click.option("--log-format", type=click.Choice(["auto", "json", "console"]), default="auto")
def applier(
    socket_path: Path | None,
    state_dir: Path,
    fixture: Path | None,
    fixture_host: str | None,
    sysfs_root: Path,
    root: Path,
    release_timeout: float,
    log_format: str,
) -> None:
    """The root applier: for each NodeSpec `run --applier-socket` hands it, check it again
    (F3, on this host's own inventory), apply its units, deliver its bookings, and answer the
    outcomes. One request kind, one at a time; anything else is answered with an error."""
    configure_logging(json=None if log_format == "auto" else log_format == "json")
    try:
        bound = listener(socket_path)
    except (ValueError, OSError) as exc:
        raise click.BadParameter(str(exc), param_hint="--socket") from exc
    with contextlib.suppress(ImportError):
        load_pynvml()
    try:
        collector = InventoryCollector(
            fixture=fixture, fixture_host=fixture_host, sysfs_root=sysfs_root, state_dir=None
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--fixture/--fixture-host") from exc
    state = State(state_dir)
    state.prepare()
    notifier = Notifier.from_environment()
    runner = runner_for(root, notifier)
    host = HostApply(
        Applier(root, state_dir, runner),
        Deliverer(root, state_dir, runner, collector.compute_processes, release_timeout),
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    log.info("applier listening", socket=str(socket_path or "from systemd"), root=str(root))
    notifier.ready(status="waiting for NodeSpecs")
    try:
        Server(host, collector.collect).serve(bound, stop, notifier)
    finally:
        bound.close()
        collector.close()
        notifier.stopping()


@cli.command()
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="The pool policy, as JSON.",
)
@click.option(
    "--sharing",
    type=click.Choice(["exclusive", "mig", "timeslice", "mps"]),
    default="exclusive",
    show_default=True,
)
@click.option(
    "--inventory",
    "inventory_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="An inventory as `better-compute-agent inventory` prints it.",
)
@fixture_option
@fixture_host_option
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/"),
    show_default=True,
    help="The host the plan is compared with (its files, /proc/cmdline); read, never written.",
)
@click.option(
    "--bookings",
    "bookings_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Bookings as a NodeSpec carries them (a JSON list): the plan shows their delivery "
    "steps too (D5).",
)
@click.option("--json", "as_json", is_flag=True, help="The plan as JSON, for scripts.")
def render(
    policy_file: Path,
    sharing: str,
    inventory_file: Path | None,
    fixture: Path | None,
    fixture_host: str | None,
    out: Path,
    root: Path,
    bookings_file: Path | None,
    as_json: bool,
) -> None:
    """The local dry-run: write the files the NodeSpec would install under --out, print the plan.

    The host is an inventory file or a recorded host (its MIG layouts are compared with the
    render); files and kernel arguments are compared with the host under --root, which is
    read and never touched. Policy fields the code does not read are warned of on stderr.
    Exits 2 with the policy field and the reason when that host cannot take the policy.
    """
    configure_logging(stream=sys.stderr)
    if (inventory_file is None) == (fixture is None):
        raise click.UsageError("give --inventory or --fixture")
    if inventory_file is not None:
        host = msgspec.json.decode(inventory_file.read_bytes(), type=Inventory)
    else:
        try:
            host = collect_inventory(fixture=fixture, fixture_host=fixture_host)
        except FixtureError as exc:
            raise click.BadParameter(str(exc), param_hint="--fixture/--fixture-host") from exc
    host = with_families(host)
    families = sorted({gpu.family for gpu in host.gpus if gpu.family})
    try:
        raw = msgspec.json.decode(policy_file.read_bytes())
        if not isinstance(raw, dict):
            raise InvalidInput("the policy must be a JSON object", field="policy")
        for warning in policy_warnings(raw):  # P9: a pool would store them, nothing reads them
            click.echo(f"warning: {warning}", err=True)
        # The same field rules the API applies, for a pool of this host's model and --sharing.
        policy = validate_policy(
            raw,
            FIELD_VALIDATORS,
            pool_class="metal-host",
            sharing=sharing,
            gpu_model=families[0] if families else None,
            site_kind="custom",
            attestors=frozenset({"join-token"}),
        )
        spec = render_spec(
            policy, sharing=sharing, gpu_model=families[0] if families else None, inventory=host
        )
    except InvalidInput as exc:
        click.echo(f"better-compute-agent: {exc.details.get('field')}: {exc.message}", err=True)
        sys.exit(2)
    except msgspec.DecodeError as exc:
        click.echo(f"better-compute-agent: {policy_file}: not JSON: {exc}", err=True)
        sys.exit(2)
    except RenderRefused as exc:
        click.echo(f"better-compute-agent: policy.{exc.field}: {exc.message}", err=True)
        sys.exit(2)
    write_tree(spec, out)
    steps: list[dict[str, Any]] = []
    if bookings_file is not None:
        try:
            bookings = msgspec.json.decode(bookings_file.read_bytes(), type=list[Booking])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            click.echo(f"better-compute-agent: {bookings_file}: {exc}", err=True)
            sys.exit(2)
        with tempfile.TemporaryDirectory() as nothing_delivered:  # as on a fresh host
            busy = compute_processes(fixture, fixture_host) if fixture is not None else {}
            scratch = Path(nothing_delivered)  # the plan runs nothing: a runner that records
            planner = Deliverer(root, scratch, RecordingRunner(scratch), lambda: busy)
            steps = planner.plan(bookings, host)
        for step in steps:  # --out holds the bookings' files too, as if it were /
            for written in step["files"]:
                target = out / written["path"].lstrip("/")
                atomic_write(target, written["content"].encode(), int(written["mode"], 8))
    _echo_plan(describe(spec, read_host(spec, root, host, bookings=steps), steps), as_json)
