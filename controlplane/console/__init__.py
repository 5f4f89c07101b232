"""M2: the read-only web console, plain static files at ``/ui/`` that call the same HTTP API.

The files are read once from the package (``static/``) when the routes are added and served
from memory with a strict Content-Security-Policy: no inline script or style, nothing from
another origin, no framing. The browser keeps the token in its session storage only.
"""

import hashlib
from importlib.resources import files
from pathlib import PurePath

from aiohttp import web
from aiohttp.typedefs import Handler

# What each file is sent as; a file of any other kind in static/ stops the daemon at start.
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
# On every console answer, redirects included. no-cache: revalidated (ETag) on each load, so a
# new release's files are seen at once.
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
ROOT = "/ui/"


def static_handler(body: bytes, content_type: str) -> Handler:
    """GET one file: 200 with its bytes, or 304 when the browser already has this version."""
    etag = hashlib.sha256(body).hexdigest()[:32]

    async def serve(request: web.Request) -> web.StreamResponse:
        if any(given.value == etag for given in request.if_none_match or ()):
            response = web.Response(status=304, headers=HEADERS)
        else:
            response = web.Response(body=body, headers={**HEADERS, "Content-Type": content_type})
        response.etag = etag
        return response

    return serve


async def to_console(request: web.Request) -> web.Response:
    """``/`` and ``/ui`` lead to the console (a response, not a raised HTTPFound: the app's
    middleware maps raised HTTP exceptions to API errors)."""
    return web.Response(status=302, headers={**HEADERS, "Location": ROOT})


def add_console_routes(app: web.Application) -> None:
    """``GET /ui/`` (index.html), ``GET /ui/<file>`` for each static file, and the redirects."""
    for item in (files(__name__) / "static").iterdir():
        handler = static_handler(item.read_bytes(), CONTENT_TYPES[PurePath(item.name).suffix])
        app.router.add_get(ROOT if item.name == "index.html" else ROOT + item.name, handler)
    app.router.add_get("/ui", to_console)
    app.router.add_get("/", to_console)
