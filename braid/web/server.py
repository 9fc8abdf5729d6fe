"""WebServer: one aiohttp application on one address, plain or TLS.

Connections idle longer than :data:`IDLE_TIMEOUT_S` between requests are closed (aiohttp's
keep-alive timeout). Every response, including the 400 aiohttp answers to a malformed request
before any handler runs, is counted by status code through the access-log hook (the one place
aiohttp reports every response), for ``braid_http_responses_total``.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Mapping
from typing import Final

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from braid import metrics
from braid.tls import Listen
from braid.web.auth import basic_auth_middleware
from braid.web.dashboard import add_dashboard_routes, cross_site_guard
from braid.web.management import add_management_routes
from braid.web.operations import HealthCheck, add_operations_routes
from braid.web.prometheus import DashboardMetrics
from braid.web.rabbit import ManagementSources, RabbitResources
from core.security import SecurityService

log = logging.getLogger(__name__)

# Close a connection idle this long (no complete request): keeps slow or stuck clients from
# holding sockets forever (nginx's keepalive_timeout is 75 s; uvicorn's is 5 s).
IDLE_TIMEOUT_S: Final = 30.0
# Largest request body read: definitions imports are the large ones (RabbitMQ's own limit is
# 100 MB; 32 MiB holds tens of thousands of queues). Bodies are read only after the Basic auth
# check, so an anonymous client cannot make the server read one.
MAX_BODY_BYTES: Final = 32 * 1024 * 1024
SERVER_NAME: Final = "braid"
# Wait this long for handlers to finish when the listener closes.
SHUTDOWN_TIMEOUT_S: Final = 5.0


class ResponseCounter:
    """Responses by status code (``braid_http_responses_total``)."""

    def __init__(self) -> None:
        self.responses: dict[int, int] = {}

    def count(self, status: int) -> None:
        self.responses[status] = self.responses.get(status, 0) + 1

    def collect_metrics(self) -> list[metrics.Family]:
        return [
            metrics.Family(
                "braid_http_responses_total",
                metrics.COUNTER,
                "Responses of the HTTP listeners, by status code.",
                [({"code": str(code)}, count) for code, count in sorted(self.responses.items())],
            )
        ]


# The method of the stand-in request aiohttp builds for one it could not parse
# (aiohttp.web_protocol.ERROR); "UNKNOWN" is a valid token, so the status must be an error too.
MALFORMED_METHOD = "UNKNOWN"


def _counting_access_logger(counter: ResponseCounter) -> type[AbstractAccessLogger]:
    class CountingAccessLogger(AbstractAccessLogger):
        def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
            counter.count(response.status)
            if request.method == MALFORMED_METHOD and response.status >= 400:
                # A request aiohttp could not parse (a broken header, a bad request line):
                # aiohttp logs only some of them, at debug level (issue 21 item 8).
                log.warning(
                    "http %s: malformed request answered %d %s",
                    request.remote,
                    response.status,
                    getattr(response, "reason", ""),
                )

        @property
        def enabled(self) -> bool:
            return True

    return CountingAccessLogger


async def _server_header(_request: web.Request, response: web.StreamResponse) -> None:
    # Not aiohttp's default "Python/3.x aiohttp/3.y": versions tell an attacker what to try.
    response.headers["Server"] = SERVER_NAME


def build_app(
    health: HealthCheck,
    registry: metrics.MetricsRegistry,
    security: SecurityService | None,
    *,
    open_paths: Mapping[str, bool] | None = None,
    sources: ManagementSources | None = None,
) -> web.Application:
    """The application: ``/health`` and ``/metrics`` open; with a security service, the
    management API and the dashboard (``/``) behind Basic auth."""
    middlewares = []
    if security is not None:
        # First: another site's page must not act with the dashboard's remembered login.
        middlewares.append(cross_site_guard())
        middlewares.append(basic_auth_middleware(security))
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)
    app.on_response_prepare.append(_server_header)
    if security is not None and sources is not None:
        resources = RabbitResources(security, sources)
        dashboards = DashboardMetrics(resources, sources)
        add_operations_routes(app, health, registry, dashboards.aggregated, dashboards.per_object)
    else:
        add_operations_routes(app, health, registry)
    if security is not None:
        add_management_routes(app, security, sources)
        add_dashboard_routes(app)
    return app


class _ListenSite(web.BaseSite):
    """An aiohttp site whose server ``listen`` makes (braid/tls.py's TLS listener)."""

    def __init__(self, runner: web.BaseRunner, listen: Listen, host: str, port: int) -> None:
        super().__init__(runner)
        self._listen = listen
        self._host = host
        self._port = port

    @property
    def name(self) -> str:
        return f"https://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None  # runner.setup() made it
        self._server = await self._listen(server, self._host, self._port)


class WebServer:
    """``await start(host, port, ssl_context)``, ``address``, ``await close()``."""

    def __init__(
        self,
        app: web.Application,
        counter: ResponseCounter,
        *,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        self.app = app
        self.counter = counter
        self.idle_timeout_s = idle_timeout_s
        self._runner: web.AppRunner | None = None

    async def start(
        self,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None = None,
        *,
        listen: Listen | None = None,
    ) -> None:
        """Listen on ``host:port``; HTTPS through ``listen`` (braid/tls.py's, which audits a
        failed handshake) or with ``ssl_context`` given to asyncio."""
        runner = web.AppRunner(
            self.app,
            handle_signals=False,
            access_log_class=_counting_access_logger(self.counter),
            keepalive_timeout=self.idle_timeout_s,
            shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        )
        await runner.setup()
        try:
            site: web.BaseSite
            if listen is not None:
                site = _ListenSite(runner, listen, host, port)
            else:
                site = web.TCPSite(runner, host, port, ssl_context=ssl_context, reuse_address=True)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner

    @property
    def address(self) -> tuple[str, int] | None:
        if self._runner is None or not self._runner.addresses:
            return None
        sockname = self._runner.addresses[0]
        return str(sockname[0]), int(sockname[1])

    async def close(self) -> None:
        """Stop accepting and close open connections."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
