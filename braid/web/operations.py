"""``GET /health`` and ``GET /metrics``: open without credentials (RabbitMQ's Prometheus
endpoint is), as they were on the hand-written server.

``/health``: 200 ``{"status": "ok", ...}`` or 503 ``{"status": "unavailable", ...}``;
``/metrics``: the registry in the Prometheus text format. Handlers run on the event loop's
thread and only read counters, so they are quick.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from aiohttp import web

from braid import metrics

HealthCheck = Callable[[], tuple[bool, dict[str, object]]]
OPEN_PATHS: Final = frozenset({"/health", "/metrics", "/metrics/per-object"})
# Families built per scrape (the dashboards' names: braid/web/prometheus.py), or none.
ExtraFamilies = Callable[[], list[metrics.Family]]


def add_operations_routes(
    app: web.Application,
    health: HealthCheck,
    registry: metrics.MetricsRegistry,
    aggregated: ExtraFamilies | None = None,
    per_object: ExtraFamilies | None = None,
) -> None:
    started = time.monotonic()

    async def get_health(_request: web.Request) -> web.Response:
        ok, details = health()
        payload: dict[str, object] = {"status": "ok" if ok else "unavailable"}
        payload["uptime_seconds"] = round(time.monotonic() - started, 3)
        payload.update(details)
        return web.json_response(
            payload, status=200 if ok else 503, headers={"Cache-Control": "no-store"}
        )

    async def get_metrics(_request: web.Request) -> web.Response:
        extra = aggregated() if aggregated is not None else []
        return web.Response(
            body=registry.render(extra).encode(),
            headers={"Content-Type": metrics.CONTENT_TYPE, "Cache-Control": "no-store"},
        )

    async def get_per_object(_request: web.Request) -> web.Response:
        # As RabbitMQ's /metrics/per-object: the per-queue samples (no braid_* families).
        families = per_object() if per_object is not None else []
        return web.Response(
            body=metrics.render_families(families).encode(),
            headers={"Content-Type": metrics.CONTENT_TYPE, "Cache-Control": "no-store"},
        )

    app.router.add_get("/health", get_health)
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/metrics/per-object", get_per_object)
