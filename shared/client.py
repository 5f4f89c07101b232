"""The control-plane client: one keep-alive HTTP connection, typed errors by kind.

    ControlPlaneError
    ├── Unreachable   the control plane did not answer (connection, timeout, 5xx): retry;
    │                 ``retry_after``: the seconds a 503 said to wait (it sheds load, F10)
    └── Refused       it answered with an error: retrying the same request will not help

The agent and the `better-compute` CLI share this one client. The standard
library's http.client keeps the agent small (aiohttp alone would add about
20 MB of resident memory to a daemon that sends three requests a cycle).
"""

import http.client
import ssl
import urllib.parse
from pathlib import Path
from typing import Any

import msgspec

from shared.inventory import Inventory


class ControlPlaneError(Exception):
    pass


class Unreachable(ControlPlaneError):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # seconds, from a 503's Retry-After; None without one


def retry_after(value: str | None) -> float | None:
    """A Retry-After header's delay in seconds (F10); None when absent or not a number of
    seconds (the HTTP-date form is not one the control plane sends)."""
    if value is None or not value.strip().isdigit():
        return None
    return float(value.strip())


class Refused(ControlPlaneError):
    def __init__(self, status: int, code: str, message: str, details: dict[str, Any]) -> None:
        field = f" (field {details['field']})" if "field" in details else ""
        super().__init__(f"{code}: {message}{field}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details


class ControlPlane:
    """Calls `POST {url}/api/{path}`; not thread-safe (one connection, reused)."""

    def __init__(
        self,
        url: str,
        timeout: float = 10.0,
        token: str | None = None,
        ca_file: str | Path | None = None,
    ) -> None:
        """``ca_file``: the CA certificates (PEM) an https control plane's certificate is
        verified against, instead of the system's (M3); OSError when it cannot be loaded."""
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"not an http(s) URL: {url}")
        self._tls = ssl.create_default_context(cafile=ca_file) if parsed.scheme == "https" else None
        self.url = url.rstrip("/")
        self.token = token  # the default for call(); the agent passes its node token per call
        self._netloc = parsed.netloc
        self._prefix = parsed.path.rstrip("/")
        self._timeout = timeout
        self._connection: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        if self._connection is None:
            self._connection = (
                http.client.HTTPSConnection(self._netloc, timeout=self._timeout, context=self._tls)
                if self._tls is not None
                else http.client.HTTPConnection(self._netloc, timeout=self._timeout)
            )
        return self._connection

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def __enter__(self) -> "ControlPlane":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, path: str, body: dict[str, Any], token: str | None = None) -> Any:
        """One method, e.g. call("compute/pools/list", {"tenantId": "acme"})."""
        headers = {"Content-Type": "application/json"}
        token = token if token is not None else self.token
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        payload = msgspec.json.encode(body)
        try:
            connection = self._connect()
            connection.request("POST", f"{self._prefix}/api/{path}", payload, headers)
            response = connection.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()  # a broken keep-alive connection is not reused
            raise Unreachable(f"{self.url}: {exc.__class__.__name__}: {exc}") from exc
        try:
            answer = msgspec.json.decode(raw) if raw else {}
        except msgspec.DecodeError:
            # Not the control plane (a proxy's HTML page, a captive portal): try again later.
            raise Unreachable(
                f"{self.url} answered {response.status} with a body that is not JSON"
            ) from None
        error = answer.get("error", {}) if isinstance(answer, dict) else {}
        if response.status >= 500:
            # Retryable for the agent; the code, when there is one, helps a person reading it.
            code = f": {error['code']}" if "code" in error else ""
            wait = (
                retry_after(response.getheader("Retry-After")) if response.status == 503 else None
            )
            raise Unreachable(f"{self.url} answered {response.status}{code}", wait)
        if response.status != 200:
            raise Refused(
                response.status,
                error.get("code", str(response.status)),
                error.get("message", ""),
                error.get("details", {}),
            )
        return answer

    def join(self, join_token: str, hostname: str, inventory: Inventory) -> Any:
        body = {
            "joinToken": join_token,
            "attestor": "join-token",
            "hostname": hostname,
            "inventory": msgspec.to_builtins(inventory),
        }
        return self.call("compute/nodes/join", body)

    def report(
        self,
        token: str,
        node_id: str,
        inventory: Inventory | None,
        applied: Any | None = None,
        bookings: list[Any] | None = None,
        inventory_digest: str | None = None,
    ) -> Any:
        """nodes/report with the whole ``inventory``, or (None) the ``inventory_digest`` the
        control plane answered last (F9); ``bookings``: each booking's delivery outcome
        (D5-D7), when given."""
        body: dict[str, Any] = {"nodeId": node_id}
        if inventory is not None:
            body["inventory"] = msgspec.to_builtins(inventory)
        else:
            body["inventoryDigest"] = inventory_digest
        if applied is not None:
            body["applied"] = applied
        if bookings is not None:
            body["bookings"] = bookings
        return self.call("compute/nodes/report", body, token)

    def spec(self, token: str, node_id: str) -> Any:
        return self.call("compute/nodes/spec", {"nodeId": node_id}, token)
