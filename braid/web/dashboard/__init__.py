"""The web dashboard (issue 20): ``GET /`` and ``GET /dashboard/{asset}``, behind the same HTTP
Basic login as the management API (:mod:`braid.web.auth`).

A small single-page app in plain JavaScript modules (``assets/``, shipped in the wheel as
package data): the server renders nothing; the page reads and changes the broker only through
the management API (``/api/...``, ``/api/braid/...``) and ``/metrics``, with the logged-in
user's credentials, so what a user sees and may do is decided by the API's own tag and vhost
checks, once, for the page, ``rabbitmqadmin`` and ``braid queue ...`` alike. Why not
server-rendered pages: they would need a second, server-side path to the same data, and the
live charts poll the API anyway (docs/management.md, "Dashboard").

No network at install or run time: no chart library (the charts are plain SVG drawn by
``chart.js``), no fonts or scripts from elsewhere, and a Content-Security-Policy that lets the
page load nothing but its own files and talk to nothing but its own origin.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Final

from aiohttp import web

log = logging.getLogger(__name__)

# The files of assets/ served, by suffix. Anything else (a stray editor backup) is not.
CONTENT_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
ASSET_NAME: Final = re.compile(r"[a-z0-9][a-z0-9-]*\.(?:html|js|css|svg)")
INDEX: Final = "index.html"
ASSET_PREFIX: Final = "/dashboard/"
# Only the page's own files and its own origin: an injected script or a pasted link cannot
# load code or send data elsewhere, and no other site may frame the page (clickjacking on
# the purge buttons). 'self' for styles: the charts set no inline style attributes.
CONTENT_SECURITY_POLICY: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Revalidate on each load: an upgraded broker serves its own page, never a cached old one.
    "Cache-Control": "no-cache",
}


# Methods that change nothing: a cross-site page may make a browser send them (an <img>), but
# cannot read the answer (CORS).
SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
# Sec-Fetch-Site values of a request the page itself made, or the user typed.
OWN_SITES: Final = frozenset({"same-origin", "none"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def cross_site_refusal(request: web.BaseRequest) -> str | None:
    """Why a request is a cross-site one a browser sent on another page's behalf, or None.

    A browser that has logged in to the dashboard remembers the Basic credentials and sends them
    with every request to this origin, also one that another site's form or script makes (a
    form POST with ``text/plain`` needs no CORS preflight): without this check such a page could
    re-drive, publish, get (consume) or import definitions as the logged-in user. Browsers say
    where a request comes from (``Origin``, ``Sec-Fetch-Site``); clients that are not browsers
    (``rabbitmqadmin``, curl, scripts) send neither and are not affected.
    """
    if request.method in SAFE_METHODS:
        return None
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in OWN_SITES:
        return f"Sec-Fetch-Site {site}"
    origin = request.headers.get("Origin")
    if origin is not None and origin != f"{request.scheme}://{request.host}":
        return f"Origin {origin}"
    return None


def cross_site_guard() -> Callable[..., Awaitable[web.StreamResponse]]:
    """Middleware: a browser's cross-site request that would change something is answered
    403 ``{"error": "forbidden", ...}`` before any login is tried, with a log line."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        why = cross_site_refusal(request)
        if why is None:
            return await handler(request)
        log.warning(
            "http: refused a cross-site %s %s from %s (%s)",
            request.method,
            request.path,
            request.remote,
            why,
        )
        raise web.HTTPForbidden(
            text=json.dumps({"error": "forbidden", "reason": "cross-site request refused"}),
            content_type="application/json",
        )

    return guard


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    content_type: str


def load_assets() -> dict[str, Asset]:
    """Every servable file of ``assets/``, read once (a few tens of kilobytes)."""
    found: dict[str, Asset] = {}
    for entry in resources.files(__package__).joinpath("assets").iterdir():
        name = entry.name
        if not entry.is_file() or not ASSET_NAME.fullmatch(name):
            continue
        suffix = name[name.rindex(".") :]
        found[name] = Asset(entry.read_bytes(), CONTENT_TYPES[suffix])
    if INDEX not in found:
        raise RuntimeError(f"the dashboard's {INDEX} is missing from the package")
    return found


def _response(asset: Asset) -> web.Response:
    return web.Response(
        body=asset.body,
        content_type=None,
        headers={
            "Content-Type": asset.content_type,
            **SECURITY_HEADERS,
        },
    )


def add_dashboard_routes(app: web.Application) -> None:
    """``/`` (the page) and ``/dashboard/{name}`` (its modules, style sheet and icon)."""
    assets = load_assets()

    async def index(_request: web.Request) -> web.Response:
        return _response(assets[INDEX])

    async def asset(request: web.Request) -> web.Response:
        found = assets.get(request.match_info["name"])
        if found is None:
            raise web.HTTPNotFound()
        return _response(found)

    app.router.add_get("/", index)
    app.router.add_get(ASSET_PREFIX + "{name}", asset)
