"""Typed state of the app and of a request (aiohttp's AppKey and RequestKey: no singletons)."""

from typing import Any

from aiohttp import web

from controlplane.metrics import Metrics
from controlplane.runtime import Runtime

RUNTIME = web.AppKey("runtime", Runtime)
METRICS = web.AppKey("metrics", Metrics)
METHODS = web.AppKey("methods", tuple)
OPENAPI = web.AppKey("openapi", bytes)
# What admission and the screen need of each method, by its path (screen.Screened): one
# lookup a request.
SCREENED = web.AppKey("screened", dict)
# What the screen made of the body: the decoded request, the schema's ValidationError (raised
# after authentication), or None when the path is no method's.
BODY: web.RequestKey[object] = web.RequestKey("body", object)
# F4: seconds a request's whole body has to arrive in (--body-timeout).
BODY_TIMEOUT = web.AppKey("body_timeout", float)
CALLER: web.RequestKey[dict[str, Any]] = web.RequestKey("caller", dict)  # who calls, logged
