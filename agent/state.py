"""The agent's state directory (0700): its node credential and the last NodeSpec it fetched (0600).

Both files hold secrets (the node token; the spec embeds the pool policy, which
may carry a kubeadm token), so the directory is 0700 and each file 0600
whatever the umask (R7). A file here that cannot be read back (torn by a disk
error, edited by hand, written by something else) is moved aside as
``<name>.damaged-<unix time>`` with one log line and the agent carries on
without it (R9): without a credential it joins again with its join token
file; without a kept spec it has none to apply until it fetches one.
"""

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import structlog

from shared.files import atomic_write, write_secret
from shared.nodespec import Booking, NodeSpecUnits

log = structlog.get_logger("agent")

NODE_FILE = "node.json"
SPEC_FILE = "spec.json"
DIRECTORY_MODE = 0o700
SECRET_MODE = 0o600


@dataclass(frozen=True)
class NodeCredential:
    node_id: str
    token: str
    pool_id: str
    controlplane: str


class _CredentialFile(msgspec.Struct, rename="camel"):
    """node.json as written by save_credential: every field a string."""

    node_id: str
    token: str
    pool_id: str
    controlplane: str


def set_aside(path: Path, error: str) -> Path:
    """Move a damaged state file out of the way, keep it private, say so once; its new path."""
    aside = path.with_name(f"{path.name}.damaged-{int(time.time())}")
    os.replace(path, aside)
    os.chmod(aside, SECRET_MODE)  # it may hold a token
    log.error("damaged state file moved aside", path=str(path), moved_to=str(aside), error=error)
    return aside


def units_of(spec: dict[str, Any]) -> NodeSpecUnits:
    """The units a NodeSpec carries, as the applier takes them; ValidationError if unreadable."""
    return msgspec.convert(
        {
            "version": spec["version"],
            "units": spec.get("units", []),
            "reboot": spec.get("reboot", False),
            "booked_gpus": spec.get("bookedGpus", []),
        },
        NodeSpecUnits,
        strict=False,
    )


def bookings_of(spec: dict[str, Any]) -> list[Booking]:
    """The bookings a NodeSpec carries for the agent to deliver (D5); ValidationError if unreadable."""
    return msgspec.convert(spec.get("bookings", []), list[Booking], strict=False)


def check(spec: dict[str, Any]) -> None:
    """Raise ValidationError for a spec whose units or bookings this agent cannot read."""
    units_of(spec)
    bookings_of(spec)


class State:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def prepare(self) -> None:
        """Create the directory 0700, or tighten one that exists to 0700 (R7)."""
        self.directory.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
        # mkdir's mode is narrowed by the umask, and an existing directory keeps its own.
        os.chmod(self.directory, DIRECTORY_MODE)

    def credential(self) -> NodeCredential | None:
        """The node credential; None when there is none or it was damaged (and is now set aside)."""
        path = self.directory / NODE_FILE
        try:
            found = msgspec.json.decode(path.read_bytes(), type=_CredentialFile)
        except FileNotFoundError:
            return None
        except msgspec.DecodeError as exc:  # not JSON, not an object, a field missing or not text
            set_aside(path, str(exc))
            return None
        return NodeCredential(found.node_id, found.token, found.pool_id, found.controlplane)

    def had_credential(self) -> bool:
        """Whether this host joined before: a credential here, or one set aside as damaged.

        A host that had joined and is refused a join again retries (H8); only the
        very first join of a fresh state directory is final when refused.
        """
        return (self.directory / NODE_FILE).exists() or any(
            self.directory.glob(f"{NODE_FILE}.damaged-*")
        )

    def save_credential(self, credential: NodeCredential) -> None:
        body = {
            "nodeId": credential.node_id,
            "token": credential.token,
            "poolId": credential.pool_id,
            "controlplane": credential.controlplane,
        }
        self.prepare()
        write_secret(self.directory / NODE_FILE, json.dumps(body))

    def spec(self) -> dict[str, Any] | None:
        """The kept NodeSpec; None when there is none or it was damaged (and is now set aside)."""
        path = self.directory / SPEC_FILE
        try:
            found = msgspec.json.decode(path.read_bytes())
        except FileNotFoundError:
            return None
        except msgspec.DecodeError as exc:
            set_aside(path, str(exc))
            return None
        if not isinstance(found, dict) or not isinstance(found.get("version"), str):
            set_aside(path, "not a NodeSpec: an object with a string version")
            return None
        try:
            check(found)
        except msgspec.ValidationError as exc:
            # A spec whose units or bookings cannot be read would fail every cycle, and with its
            # version still current it would never be fetched again (R9): set it aside, fetch anew.
            set_aside(path, f"not a NodeSpec: {exc}")
            return None
        return found

    def save_spec(self, spec: dict[str, Any]) -> None:
        self.prepare()
        atomic_write(self.directory / SPEC_FILE, json.dumps(spec, indent=2).encode(), SECRET_MODE)
