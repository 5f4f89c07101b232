"""F3: the agent's root applier is confined to the agent's own allowlist; every unit's
exposure holds.

`systemd-analyze security --offline=yes` rates each unit from its file alone (no running
systemd needed). The agent is two processes: the network one (better-compute-agent.service)
runs unprivileged and scores low; the applier (better-compute-agent-apply.service) runs as
root with module loading, /proc/sys writes, devices and CAP_SYS_ADMIN, because the commands of
its NodeSpecs need them: what is left of its exposure is that (its unit says why, option by
option). Its writable paths are the list agent/trust.py checks every NodeSpec against: one
source, compared here.
"""

import re
from pathlib import Path

import pytest

from agent.trust import (
    APPLIER_STATE_DIR,
    COMMAND_WRITES,
    COMMAND_WRITES_IF_PRESENT,
    STATE_DIR,
    WRITE_DIRS,
)
from tests.test_systemd_units import (
    AGENT,
    APPLIER,
    CONTROLPLANE,
    directives,
    exec_start_args,
    installed_copy,
    systemd_analyze,
)

# Measured with systemd 252; a unit that loses hardening scores higher and fails. The network
# process's target is 2.5 at most; it measures 1.3.
EXPOSURE = {CONTROLPLANE: 1.1, AGENT: 1.3, APPLIER: 3.6}


def exposure(unit: Path) -> float:
    done = systemd_analyze("security", "--offline=yes", str(unit))
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", done.stdout)
    assert match is not None, done.stdout + done.stderr
    return float(match[1])


@pytest.mark.parametrize("unit", [CONTROLPLANE, AGENT, APPLIER])
def test_the_exposure_is_no_worse_than_measured(tmp_path: Path, unit: str) -> None:
    assert exposure(installed_copy(tmp_path, unit)) <= EXPOSURE[unit]


@pytest.mark.parametrize(("unit", "line"), [(APPLIER, "CapabilityBoundingSet"), (AGENT, "User")])
def test_the_exposure_check_can_fail(tmp_path: Path, unit: str, line: str) -> None:
    """Without its capability bounding set the applier scores worse than its limit; as root,
    the network process does."""
    copy = installed_copy(tmp_path, unit)
    text = copy.read_text()
    copy.write_text(re.sub(rf"^{line}=.*$", "", text, flags=re.M))
    assert exposure(copy) > EXPOSURE[unit]


def test_writable_paths_are_the_agents_allowlist() -> None:
    """The applier's ReadWritePaths= is the agent's WRITE_DIRS, its state directory, what its
    commands write and (``-``: where the host has them) what they may write."""
    entries = [path for line in directives(APPLIER)["ReadWritePaths"] for path in line.split()]
    optional = [f"-{path}" for path in COMMAND_WRITES_IF_PRESENT]
    assert entries == [*WRITE_DIRS, APPLIER_STATE_DIR, *COMMAND_WRITES, *optional]


def test_the_writable_directories_exist_before_the_sandbox_is_set_up() -> None:
    """A directory a fresh host lacks cannot be made under ProtectSystem=strict: the unit makes
    each one (outside the sandbox) before starting the applier."""
    assert directives(APPLIER)["ExecStartPre"] == [
        " ".join(["+/bin/mkdir", "-p", *WRITE_DIRS, *COMMAND_WRITES])
    ]


@pytest.mark.parametrize(("unit", "state"), [(AGENT, STATE_DIR), (APPLIER, APPLIER_STATE_DIR)])
def test_the_state_directory_is_the_units_own(unit: str, state: str) -> None:
    """StateDirectory= and --state-dir name the unit's own: the two processes share none."""
    found = directives(unit)
    assert [f"/var/lib/{name}" for name in found["StateDirectory"]] == [state]
    args = exec_start_args(unit, {"CONTROLPLANE": "https://x", "JOIN_TOKEN_FILE": "t"})
    assert args[args.index("--state-dir") + 1] == state


def test_the_applier_keeps_only_the_capabilities_and_calls_its_commands_need() -> None:
    found = directives(APPLIER)
    assert found["CapabilityBoundingSet"] == ["CAP_SYS_MODULE CAP_SYS_ADMIN CAP_MKNOD"]
    assert found["SystemCallFilter"] == ["@system-service @module @swap", "~@resources"]
    expected = {
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateIPC": "yes",
        "PrivateMounts": "yes",
        "ProtectKernelLogs": "yes",
        "ProtectControlGroups": "yes",
        "NoNewPrivileges": "yes",
        "RestrictSUIDSGID": "yes",
        "RestrictNamespaces": "yes",
        "RestrictRealtime": "yes",
        "LockPersonality": "yes",
        "MemoryDenyWriteExecute": "yes",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6 AF_NETLINK",
        "SystemCallArchitectures": "native",
        "SystemCallErrorNumber": "EPERM",
    }
    assert {key: found.get(key, [None])[-1] for key in expected} == expected
