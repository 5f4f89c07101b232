"""The route table: every API method, and the paths the app serves."""

from aiohttp import web

from controlplane.api import iam, nodes, ops, pools, quotas, reservations, sites
from controlplane.api.dispatch import method_handler
from controlplane.api.method import Method
from controlplane.console import add_console_routes

ALL_METHODS: tuple[Method, ...] = (
    *iam.METHODS,
    *sites.METHODS,
    *pools.METHODS,
    *quotas.METHODS,
    *nodes.METHODS,
    *reservations.METHODS,
)


def add_routes(app: web.Application, methods: tuple[Method, ...], *, metrics: bool) -> None:
    """Every method as ``POST`` on its path, the operations endpoints, the console (M2);
    ``/metrics`` unless it has a listener of its own (F4: then it is no path here)."""
    for method in methods:
        app.router.add_post(method.path, method_handler(method))
    app.router.add_get("/healthz", ops.healthz)
    app.router.add_get("/readyz", ops.readyz)
    if metrics:
        app.router.add_get("/metrics", ops.metrics)
    app.router.add_get("/api/openapi.json", ops.openapi)
    add_console_routes(app)


def add_metrics_listener_routes(app: web.Application) -> None:
    """F4: ``--metrics-listen`` serves ``/metrics`` alone, without a token."""
    app.router.add_get("/metrics", ops.open_metrics)
