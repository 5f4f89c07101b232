"""Typed state of the app and of a request (aiohttp's AppKey and RequestKey: no singletons)."""

from typing import Any

from aiohttp import web

from controlplane.metrics import Metrics
from controlplane.runtime import Runtime

RUNTIME = web.AppKey("runtime", Runtime)
METRICS = web.AppKey("metrics", Metrics)
METHODS = web.AppKey("methods", tuple)
OPENAPI = web.AppKey("openapi", bytes)
# Each method's request schema by path: the screen decodes a body once, with it.
SCHEMAS = web.AppKey("schemas", dict)
# The paths of the mutations: shed too while this replica's writes wait long (F10).
WRITES = web.AppKey("writes", frozenset)
# What the screen made of the body: the decoded request, the schema's ValidationError (raised
# after authentication), or None when the path is no method's.
BODY: web.RequestKey[object] = web.RequestKey("body", object)
# F4: seconds a request's whole body has to arrive in (--body-timeout).
BODY_TIMEOUT = web.AppKey("body_timeout", float)
# F4: each method's kind of bearer token by path (nodes/join takes none).
TOKEN_PREFIXES = web.AppKey("token_prefixes", dict)
CALLER: web.RequestKey[dict[str, Any]] = web.RequestKey("caller", dict)  # who calls, logged
