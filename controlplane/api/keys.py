"""Typed state of the app and of a request (aiohttp's AppKey and RequestKey: no singletons)."""

from typing import Any

from aiohttp import web

from controlplane.metrics import Metrics
from controlplane.runtime import Runtime

RUNTIME = web.AppKey("runtime", Runtime)
METRICS = web.AppKey("metrics", Metrics)
METHODS = web.AppKey("methods", tuple)
OPENAPI = web.AppKey("openapi", bytes)
CALLER: web.RequestKey[dict[str, Any]] = web.RequestKey("caller", dict)  # who calls, logged
