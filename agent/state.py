"""The agent's state directory: its node credential (0600) and the last NodeSpec it fetched."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.files import atomic_write, write_secret

NODE_FILE = "node.json"
SPEC_FILE = "spec.json"


@dataclass(frozen=True)
class NodeCredential:
    node_id: str
    token: str
    pool_id: str
    controlplane: str


class State:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def credential(self) -> NodeCredential | None:
        path = self.directory / NODE_FILE
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        return NodeCredential(data["nodeId"], data["token"], data["poolId"], data["controlplane"])

    def save_credential(self, credential: NodeCredential) -> None:
        body = {
            "nodeId": credential.node_id,
            "token": credential.token,
            "poolId": credential.pool_id,
            "controlplane": credential.controlplane,
        }
        write_secret(self.directory / NODE_FILE, json.dumps(body))

    def forget_credential(self) -> None:
        (self.directory / NODE_FILE).unlink(missing_ok=True)

    def spec(self) -> dict[str, Any] | None:
        path = self.directory / SPEC_FILE
        return json.loads(path.read_text()) if path.exists() else None

    def save_spec(self, spec: dict[str, Any]) -> None:
        # The spec embeds the pool policy, which may carry a kubeadm token: keep it private.
        atomic_write(self.directory / SPEC_FILE, json.dumps(spec, indent=2).encode(), 0o600)
