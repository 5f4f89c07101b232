"""F3: the agent's unit is confined to the agent's own allowlist; both units' exposure holds.

`systemd-analyze security --offline=yes` rates each unit from its file alone (no running
systemd needed). The agent runs as root with module loading, /proc/sys writes, devices and
CAP_SYS_ADMIN, because the commands of its NodeSpecs need them: what is left of its exposure is
that (systemd/better-compute-agent.service says why, option by option). Its writable paths
are the list agent/trust.py checks every NodeSpec against: one source, compared here.
"""

import re
from pathlib import Path

import pytest

from agent.trust import COMMAND_WRITES, COMMAND_WRITES_IF_PRESENT, STATE_DIR, WRITE_DIRS
from tests.test_systemd_units import (
    AGENT,
    CONTROLPLANE,
    directives,
    exec_start_args,
    installed_copy,
    systemd_analyze,
)

# Measured with systemd 252; a unit that loses hardening scores higher and fails.
EXPOSURE = {CONTROLPLANE: 1.1, AGENT: 3.6}


def exposure(unit: Path) -> float:
    done = systemd_analyze("security", "--offline=yes", str(unit))
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", done.stdout)
    assert match is not None, done.stdout + done.stderr
    return float(match[1])


@pytest.mark.parametrize("unit", [CONTROLPLANE, AGENT])
def test_the_exposure_is_no_worse_than_measured(tmp_path: Path, unit: str) -> None:
    assert exposure(installed_copy(tmp_path, unit)) <= EXPOSURE[unit]


def test_the_exposure_check_can_fail(tmp_path: Path) -> None:
    """Without its capability bounding set the agent scores worse than its limit."""
    copy = installed_copy(tmp_path, AGENT)
    text = copy.read_text()
    copy.write_text(re.sub(r"^CapabilityBoundingSet=.*$", "", text, flags=re.M))
    assert exposure(copy) > EXPOSURE[AGENT]


def test_writable_paths_are_the_agents_allowlist() -> None:
    """ReadWritePaths= is the agent's WRITE_DIRS, its state directory, what its commands write
    and (``-``: where the host has them) what they may write."""
    entries = [path for line in directives(AGENT)["ReadWritePaths"] for path in line.split()]
    optional = [f"-{path}" for path in COMMAND_WRITES_IF_PRESENT]
    assert entries == [*WRITE_DIRS, STATE_DIR, *COMMAND_WRITES, *optional]


def test_the_writable_directories_exist_before_the_sandbox_is_set_up() -> None:
    """A directory a fresh host lacks cannot be made under ProtectSystem=strict: the unit makes
    each one (outside the sandbox) before starting the agent."""
    assert directives(AGENT)["ExecStartPre"] == [
        " ".join(["+/bin/mkdir", "-p", *WRITE_DIRS, *COMMAND_WRITES])
    ]


def test_the_state_directory_is_the_units_own() -> None:
    """StateDirectory= and --state-dir name STATE_DIR."""
    found = directives(AGENT)
    assert [f"/var/lib/{name}" for name in found["StateDirectory"]] == [STATE_DIR]
    args = exec_start_args(AGENT, {"CONTROLPLANE": "https://x", "JOIN_TOKEN_FILE": "t"})
    assert args[args.index("--state-dir") + 1] == STATE_DIR


def test_the_agent_keeps_only_the_capabilities_and_calls_its_commands_need() -> None:
    found = directives(AGENT)
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
