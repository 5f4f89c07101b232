"""The agent's loop against a stand-in control plane: applying while it is away, surviving bad specs."""

import threading
from pathlib import Path
from typing import Any

from agent.apply import Applier, RecordingRunner
from agent.client import Unreachable
from agent.loop import Agent, Settings
from agent.state import NodeCredential, State
from tests.nodes import recorded

SPEC = {
    "version": "s1",
    "reboot": False,
    "units": [{"id": "f", "kind": "file", "path": "/etc/bc.conf", "content": "x\n"}],
}


class AwayControlPlane:
    """A control plane that does not answer."""

    def report(self, *args: Any) -> Any:
        raise Unreachable("away")

    def spec(self, *args: Any) -> Any:
        raise Unreachable("away")


class OddControlPlane:
    """A control plane whose spec has a unit kind this agent does not know."""

    def report(self, *args: Any) -> Any:
        return {"specVersion": "s2"}

    def spec(self, *args: Any) -> Any:
        return {"version": "s2", "reboot": False, "units": [{"id": "u", "kind": "teleport"}]}


def agent(tmp_path: Path, client: Any) -> tuple[Agent, State]:
    state = State(tmp_path / "state")
    state.save_credential(NodeCredential("node_x", "bcn_x", "pool_x", "http://127.0.0.1:9"))
    root = tmp_path / "root"
    settings = Settings(
        controlplane="http://127.0.0.1:9",
        join_token_file=tmp_path / "t",
        interval=0.01,
        backoff_cap=0.01,
    )
    applier = Applier(root, tmp_path / "state", RecordingRunner(root))
    return Agent(settings, state, lambda: recorded("dgx-h100-01"), client, applier), state


def test_the_last_spec_is_applied_while_the_control_plane_is_away(tmp_path: Path) -> None:
    """DESIGN §6: while the control plane is away the agent keeps applying the last NodeSpec it has."""
    loop, state = agent(tmp_path, AwayControlPlane())
    state.save_spec(SPEC)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    loop.run(stop)
    assert (tmp_path / "root/etc/bc.conf").read_text() == "x\n"


def test_a_spec_it_cannot_read_does_not_stop_the_agent(tmp_path: Path) -> None:
    """A unit kind this agent does not know is logged and retried; the loop goes on until stopped."""
    loop, _ = agent(tmp_path, OddControlPlane())
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    loop.run(stop)  # returns when stopped: nothing escaped
    assert stop.is_set()
