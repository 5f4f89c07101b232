"""The control-plane client: one aiohttp session, typed answers, errors by kind.

ControlPlaneError
├── Unreachable   the control plane did not answer (connection, timeout, 5xx): retry
└── Refused       it answered with an error: retrying the same request will not help
"""

from typing import Any

import aiohttp
import msgspec

from shared.inventory import Inventory


class ControlPlaneError(Exception):
    pass


class Unreachable(ControlPlaneError):
    pass


class Refused(ControlPlaneError):
    def __init__(self, status: int, code: str, message: str, details: dict[str, Any]) -> None:
        super().__init__(
            f"{code}: {message}" + (f" (field {details['field']})" if "field" in details else "")
        )
        self.status = status
        self.code = code
        self.details = details


class ControlPlane:
    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url = url.rstrip("/")
        self.session = session

    async def call(self, path: str, body: dict[str, Any], token: str | None = None) -> Any:
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        try:
            async with self.session.post(
                f"{self.url}/api/{path}", data=msgspec.json.encode(body), headers=headers
            ) as response:
                raw = await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise Unreachable(f"{self.url}: {exc.__class__.__name__}: {exc}") from exc
        if response.status >= 500:
            raise Unreachable(f"{self.url} answered {response.status}")
        answer = msgspec.json.decode(raw) if raw else {}
        if response.status != 200:
            error = answer.get("error", {})
            raise Refused(
                response.status,
                error.get("code", str(response.status)),
                error.get("message", ""),
                error.get("details", {}),
            )
        return answer

    async def join(self, join_token: str, hostname: str, inventory: Inventory) -> Any:
        body = {
            "joinToken": join_token,
            "attestor": "join-token",
            "hostname": hostname,
            "inventory": msgspec.to_builtins(inventory),
        }
        return await self.call("compute/nodes/join", body)

    async def report(self, token: str, node_id: str, inventory: Inventory) -> Any:
        body = {"nodeId": node_id, "inventory": msgspec.to_builtins(inventory)}
        return await self.call("compute/nodes/report", body, token)

    async def spec(self, token: str, node_id: str) -> Any:
        return await self.call("compute/nodes/spec", {"nodeId": node_id}, token)
