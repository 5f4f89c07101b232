"""The systemd units: `systemd-analyze verify` is clean, the flags exist, the command lines parse.

Their exposure scores and the agent's confinement: tests/test_systemd_hardening.py.

`systemd-analyze` runs here without a running systemd (as in a container):
`verify` and `security --offline=yes` read unit files only. The units name
/usr/bin/…; the copies under test name this virtual environment's scripts, so
that verify's check that ExecStart= is executable looks at a real program.
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent.main import applier, run
from controlplane.main import serve

UNITS = Path(__file__).resolve().parent.parent / "systemd"
SCRIPTS = Path(sys.executable).parent
CONTROLPLANE = "better-compute-controlplane.service"
AGENT = "better-compute-agent.service"  # the network process, unprivileged
APPLIER = "better-compute-agent-apply.service"  # the root applier
APPLIER_SOCKET = "better-compute-agent-apply.socket"
SYSUSERS = "better-compute-agent.sysusers"


def systemd_analyze(*args: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("systemd-analyze")
    assert tool is not None, (
        "systemd-analyze is needed for these tests (Debian: apt-get install systemd)"
    )
    return subprocess.run(
        [tool, *args], capture_output=True, text=True, errors="replace", check=False, timeout=60
    )


def installed_copy(tmp_path: Path, unit: str) -> Path:
    """The unit with /usr/bin/better-compute-* pointing at this venv's scripts."""
    text = (UNITS / unit).read_text()
    for script in ("better-compute-controlplane", "better-compute-agent"):
        assert (SCRIPTS / script).exists(), f"{script} is not installed in {SCRIPTS}"
        text = text.replace(f"/usr/bin/{script}", str(SCRIPTS / script))
    copy = tmp_path / unit
    copy.write_text(text)
    return copy


def directives(unit: str) -> dict[str, list[str]]:
    """Each `Key=` of the unit (any section) with its values in order."""
    found: dict[str, list[str]] = {}
    for line in (UNITS / unit).read_text().splitlines():
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def exec_start_args(unit: str, environment: dict[str, str]) -> list[str]:
    """ExecStart='s arguments after the program, with ${X} and $X expanded as systemd does."""
    words = directives(unit)["ExecStart"][0].split()[1:]
    args: list[str] = []
    for word in words:
        if match := re.fullmatch(r"\$\{(\w+)\}", word):
            args.append(environment.get(match[1], ""))  # braced: always one argument
        elif match := re.fullmatch(r"\$(\w+)", word):
            args.extend(environment.get(match[1], "").split())  # unbraced: split, maybe none
        else:
            args.append(word)
    return args


@pytest.mark.parametrize("unit", [CONTROLPLANE, AGENT, APPLIER, APPLIER_SOCKET])
def test_verify_is_clean(tmp_path: Path, unit: str) -> None:
    """systemd-analyze verify accepts the unit without a single warning (the applier's socket
    and service beside each other, as installed)."""
    for other in (APPLIER, APPLIER_SOCKET):
        installed_copy(tmp_path, other)
    done = systemd_analyze(
        "verify", "--man=no", "--recursive-errors=no", str(installed_copy(tmp_path, unit))
    )
    output = done.stdout + done.stderr
    ours = [line for line in output.splitlines() if "better-compute" in line]
    assert done.returncode == 0 and not ours, output


def test_verify_catches_a_mistake(tmp_path: Path) -> None:
    """The check above can fail: a misspelled directive is reported."""
    copy = installed_copy(tmp_path, CONTROLPLANE)
    copy.write_text(copy.read_text().replace("ProtectHome=yes", "ProtectHomes=yes"))
    done = systemd_analyze("verify", "--man=no", "--recursive-errors=no", str(copy))
    assert "ProtectHomes" in done.stdout + done.stderr


@pytest.mark.parametrize("unit", [CONTROLPLANE, AGENT, APPLIER])
def test_notify_watchdog_restart(unit: str) -> None:
    """The daemons are Type=notify with a watchdog, restart on failure and keep state."""
    found = directives(unit)
    assert found["Type"] == ["notify"]
    assert found["NotifyAccess"] == ["main"]
    assert int(found["WatchdogSec"][0]) > 0
    assert found["Restart"] == ["on-failure"]
    assert found["StateDirectory"]
    assert found["EnvironmentFile"]


def test_controlplane_hardening() -> None:
    """The control plane runs unprivileged in the full sandbox."""
    found = directives(CONTROLPLANE)
    expected = {
        "DynamicUser": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "NoNewPrivileges": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectKernelLogs": "yes",
        "ProtectControlGroups": "yes",
        "ProtectClock": "yes",
        "ProtectHostname": "yes",
        "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
        "RestrictNamespaces": "yes",
        "LockPersonality": "yes",
        "MemoryDenyWriteExecute": "yes",
        "RestrictRealtime": "yes",
        "RestrictSUIDSGID": "yes",
        "SystemCallArchitectures": "native",
        "CapabilityBoundingSet": "",
        "UMask": "0077",
    }
    assert {key: found.get(key, [None])[-1] for key in expected} == expected
    assert "@system-service" in found["SystemCallFilter"]


def test_the_applier_keeps_what_applying_needs() -> None:
    """The root applier may load modules, write /proc/sys and /sys, and open /dev/nvidia*."""
    found = directives(APPLIER)
    assert "User" not in found and "DynamicUser" not in found  # root
    for needed in ("PrivateDevices", "ProtectKernelTunables", "ProtectKernelModules"):
        assert needed not in found, needed
    # ProtectClock= would close every device but the RTC on older systemd.
    assert "ProtectClock" not in found and "DevicePolicy" not in found
    assert "@module" in found["SystemCallFilter"][0]
    assert "CAP_SYS_MODULE" in found["CapabilityBoundingSet"][0].split()
    assert "/etc/modprobe.d" in found["ReadWritePaths"][0].split()


def test_the_network_process_is_unprivileged_and_reaches_only_the_nvidia_devices() -> None:
    """The network unit: the agent's own user (the one sysusers makes and the applier's socket
    belongs to, 0600), no capability, no writable path but its state, the kernel's tunables,
    modules and logs read-only, and of the devices only NVML's (PrivateDevices= would hide
    them)."""
    found = directives(AGENT)
    [user] = found["User"]
    assert user != "root" and found["Group"] == [user]
    assert (UNITS / SYSUSERS).read_text().splitlines()[-1].split()[:2] == ["u", user]
    socket = directives(APPLIER_SOCKET)
    assert (socket["SocketUser"], socket["SocketMode"]) == ([user], ["0600"])
    args = exec_start_args(AGENT, {"CONTROLPLANE": "https://x", "JOIN_TOKEN_FILE": "t"})
    assert [args[args.index("--applier-socket") + 1]] == socket["ListenStream"]
    assert found["CapabilityBoundingSet"] == [""] and found["AmbientCapabilities"] == [""]
    assert "ReadWritePaths" not in found and "PrivateDevices" not in found
    assert found["DevicePolicy"] == ["closed"]
    assert found["DeviceAllow"] == ["char-nvidia-frontend rw", "char-nvidia-caps r"]
    expected = {
        "ProtectSystem": "strict",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectKernelLogs": "yes",
        "ProtectControlGroups": "yes",
        "ProtectClock": "yes",
        "ProtectProc": "invisible",
        "PrivateUsers": "yes",
        "NoNewPrivileges": "yes",
        "UMask": "0077",
    }
    assert {key: found.get(key, [None])[-1] for key in expected} == expected
    assert found["SystemCallFilter"] == ["@system-service", "~@privileged @resources"]


def test_controlplane_command_line_parses() -> None:
    """ExecStart='s arguments, as systemd expands them, are ones `serve` accepts."""
    environment = dict(value.split("=", 1) for value in directives(CONTROLPLANE)["Environment"])
    command, *args = exec_start_args(CONTROLPLANE, environment)
    assert command == "serve"
    context = serve.make_context("serve", args)
    assert context.params["db_path"] == "/var/lib/better-compute/controlplane.db"  # or a URL
    assert context.params["listen"] == "127.0.0.1:8080"
    extra = {**environment, "CONTROLPLANE_ARGS": "--reconcile-interval 10 --node-lost-after 60"}
    context = serve.make_context("serve", exec_start_args(CONTROLPLANE, extra)[1:])
    assert context.params["reconcile_interval"] == 10.0


def test_agent_command_line_parses() -> None:
    """ExecStart='s arguments, with agent.env's variables, are ones `run` accepts."""
    environment = dict(value.split("=", 1) for value in directives(AGENT)["Environment"])
    environment["CONTROLPLANE"] = "https://controlplane.example:8080"
    command, *args = exec_start_args(AGENT, environment)
    assert command == "run"
    context = run.make_context("run", args)
    assert context.params["state_dir"] == Path("/var/lib/better-compute-agent")
    assert context.params["join_token_file"] == Path("/etc/better-compute/join.token")
    assert context.params["controlplane"] == "https://controlplane.example:8080"
    assert context.params["applier_socket"] == Path("/run/better-compute-agent-apply.sock")
    command, *args = exec_start_args(APPLIER, {"APPLIER_ARGS": "--release-timeout 300"})
    assert command == "applier"
    context = applier.make_context("applier", args)
    assert context.params["state_dir"] == Path("/var/lib/better-compute-agent-apply")
    assert context.params["release_timeout"] == 300.0
