"""A tiny HTTP/1.1 server for operations: ``GET /health`` and ``GET /metrics``.

No framework: a sans-IO request parser (:func:`parse_request`: bytes in, one request or
"need more data" out), a response encoder (:func:`encode_response`), and a thin
``asyncio.Protocol`` that only moves bytes (the split h11 and uvicorn make).

Supported: GET and HEAD, keep-alive (HTTP/1.1 default, HTTP/1.0 with ``Connection: keep-alive``),
pipelined requests answered in order, a request body given by ``Content-Length`` (read and
ignored). Not supported: ``Transfer-Encoding`` on requests (answered 501 and closed). A malformed
request is answered 400 and its connection closed; the server keeps serving everyone else.

Handlers are synchronous and run on the event-loop thread, so they must be quick.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import cast
from urllib.parse import urlsplit

from braid import metrics

log = logging.getLogger(__name__)

# Largest request head (request line + headers) accepted: h11's DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
# is 16 KiB; a longer head is answered 431.
MAX_HEAD_BYTES = 16 * 1024
# Largest request body read (and ignored); operations endpoints take none. Larger: 413.
MAX_BODY_BYTES = 64 * 1024
# Close a connection idle this long (no complete request): keeps slow or stuck clients from
# holding sockets forever (nginx's keepalive_timeout is 75 s; uvicorn's is 5 s).
IDLE_TIMEOUT_S = 30.0
# Stop reading from a client that does not read its responses above this many buffered bytes.
WRITE_HIGH_WATER = 256 * 1024

ALLOWED_METHODS = ("GET", "HEAD")
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 section 5.6.2
_VERSION = re.compile(rb"HTTP/(\d)\.(\d)")
_HEAD_END = b"\r\n\r\n"


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    target: str
    path: str
    version: tuple[int, int]
    headers: tuple[tuple[str, str], ...]  # names lower-cased, order kept

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    @property
    def keep_alive(self) -> bool:
        tokens = {t.strip().lower() for t in (self.header("connection") or "").split(",")}
        if self.version >= (1, 1):
            return "close" not in tokens
        return "keep-alive" in tokens


class RemoteProtocolError(Exception):
    """The client sent something we cannot serve; ``status`` is the answer (then close)."""

    def __init__(self, status: HTTPStatus, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def parse_request(buffer: bytes | bytearray) -> tuple[Request, int] | None:
    """Parse the request at the start of ``buffer``.

    Returns ``(request, bytes consumed)`` (head and body), or ``None`` when more bytes are
    needed. Raises :class:`RemoteProtocolError` for a request that can never be served.
    """
    end = buffer.find(_HEAD_END, 0, MAX_HEAD_BYTES + len(_HEAD_END))
    if end < 0:
        if len(buffer) > MAX_HEAD_BYTES:
            raise RemoteProtocolError(
                HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large"
            )
        return None
    lines = bytes(buffer[:end]).split(b"\r\n")
    # RFC 9112 section 2.2: ignore at least one empty line before the request line.
    while lines and not lines[0]:
        lines.pop(0)
    if not lines:
        raise RemoteProtocolError(HTTPStatus.BAD_REQUEST, "empty request")
    parts = lines[0].split(b" ")
    if len(parts) != 3:
        raise RemoteProtocolError(HTTPStatus.BAD_REQUEST, "malformed request line")
    raw_method, raw_target, raw_version = parts
    if not _TOKEN.fullmatch(raw_method):
        raise RemoteProtocolError(HTTPStatus.BAD_REQUEST, "malformed method")
    version_match = _VERSION.fullmatch(raw_version)
    if version_match is None:
        raise RemoteProtocolError(HTTPStatus.BAD_REQUEST, "malformed HTTP version")
    version = (int(version_match[1]), int(version_match[2]))
    if version[0] != 1:
        raise RemoteProtocolError(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, "only HTTP/1.x")
    if not raw_target or any(byte <= 0x20 or byte >= 0x7F for byte in raw_target):
        raise RemoteProtocolError(HTTPStatus.BAD_REQUEST, "malformed request target")
    target = raw_target.decode("ascii")
    if target.startswith("/"):
        path = target.split("?", 1)[0]
    elif target.startswith(("http://", "https://")):  # absolute-form, RFC 9112 section 3.2.2
        path = urlsplit(target).path or "/"
    elif target == "*":
        path = "*"
    else:
        raise RemoteProtocolError(HTTPStatus.BAD_REQUEST, "malformed request target")

    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t"):
            # [RFC 9112 section 5.2] obsolete line folding: a server may reject it with 400.
            raise RemoteProtocolError(HTTPStatus.BAD_REQUEST, "obsolete header line folding")
        name, colon, value = line.partition(b":")
        # [RFC 9112 section 5.1] no whitespace between a field name and the colon.
        if not colon or not _TOKEN.fullmatch(name):
            raise RemoteProtocolError(HTTPStatus.BAD_REQUEST, "malformed header line")
        headers.append((name.decode("ascii").lower(), value.strip(b" \t").decode("latin-1")))
    request = Request(raw_method.decode("ascii"), target, path, version, tuple(headers))

    consumed = end + len(_HEAD_END)
    if request.header("transfer-encoding") is not None:
        raise RemoteProtocolError(HTTPStatus.NOT_IMPLEMENTED, "request Transfer-Encoding")
    lengths = {value for key, value in headers if key == "content-length"}
    if lengths:
        if len(lengths) != 1 or not next(iter(lengths)).isdigit():
            raise RemoteProtocolError(HTTPStatus.BAD_REQUEST, "malformed Content-Length")
        body_length = int(next(iter(lengths)))
        if body_length > MAX_BODY_BYTES:
            raise RemoteProtocolError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "request body too large")
        if len(buffer) < consumed + body_length:
            return None
        consumed += body_length
    return request, consumed


@dataclass(frozen=True, slots=True)
class Response:
    status: HTTPStatus
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


def text_response(status: HTTPStatus, text: str | None = None) -> Response:
    return Response(status, ((text or status.phrase) + "\n").encode())


def json_response(status: HTTPStatus, payload: object) -> Response:
    return Response(status, json.dumps(payload).encode() + b"\n", "application/json")


def encode_response(response: Response, *, keep_alive: bool, head_only: bool = False) -> bytes:
    lines = [
        f"HTTP/1.1 {response.status.value} {response.status.phrase}",
        "Server: braid",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
        "Cache-Control: no-store",
        f"Connection: {'keep-alive' if keep_alive else 'close'}",
    ]
    lines.extend(f"{name}: {value}" for name, value in response.headers)
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + response.body


Handler = Callable[[Request], Response]


class Router:
    """Exact paths to handlers; GET and HEAD only. Counts responses by status code."""

    def __init__(self, routes: Mapping[str, Handler]) -> None:
        self.routes = dict(routes)
        self.responses: dict[int, int] = {}

    def respond(self, request: Request) -> Response:
        handler = self.routes.get(request.path)
        if handler is None:
            response = text_response(HTTPStatus.NOT_FOUND)
        elif request.method not in ALLOWED_METHODS:
            response = Response(
                HTTPStatus.METHOD_NOT_ALLOWED,
                b"Method Not Allowed\n",
                headers=(("Allow", ", ".join(ALLOWED_METHODS)),),
            )
        else:
            try:
                response = handler(request)
            except Exception:
                log.exception("HTTP handler for %s failed", request.path)
                response = text_response(HTTPStatus.INTERNAL_SERVER_ERROR)
        self.count(response.status)
        return response

    def count(self, status: HTTPStatus) -> None:
        self.responses[status.value] = self.responses.get(status.value, 0) + 1

    def collect_metrics(self) -> list[metrics.Family]:
        return [
            metrics.Family(
                "braid_http_responses_total",
                metrics.COUNTER,
                "Responses of the operations HTTP listener, by status code.",
                [({"code": str(code)}, count) for code, count in sorted(self.responses.items())],
            )
        ]


class _Connection(asyncio.Protocol):
    """Moves bytes between one socket and the parser/router; nothing else."""

    def __init__(self, router: Router, connections: set[_Connection]) -> None:
        self.router = router
        self.connections = connections
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.idle_timer: asyncio.TimerHandle | None = None
        self.closing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = transport = cast(asyncio.Transport, transport)
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self.connections.add(self)
        self._arm_idle_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        self.transport = None

    def pause_writing(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.closing:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.closing or self.transport is None:
            return
        self.buffer += data
        out: list[bytes] = []
        while self.buffer:
            try:
                parsed = parse_request(self.buffer)
            except RemoteProtocolError as error:
                log.debug("bad HTTP request: %s", error.detail)
                self.router.count(error.status)
                out.append(
                    encode_response(text_response(error.status, error.detail), keep_alive=False)
                )
                self.closing = True
                break
            if parsed is None:
                break
            request, consumed = parsed
            del self.buffer[:consumed]
            keep_alive = request.keep_alive
            response = self.router.respond(request)
            out.append(
                encode_response(response, keep_alive=keep_alive, head_only=request.method == "HEAD")
            )
            if not keep_alive:
                self.closing = True
                break
        if out:
            self.transport.write(b"".join(out))
            self._arm_idle_timer()
        if self.closing:
            self.buffer.clear()
            self.transport.close()

    def eof_received(self) -> bool:
        return False  # the client is done sending: close once our responses are written

    def _arm_idle_timer(self) -> None:
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        loop = asyncio.get_running_loop()
        self.idle_timer = loop.call_later(IDLE_TIMEOUT_S, self._idle)

    def _idle(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class HTTPServer:
    """The listener: ``await start(host, port)``, ``address``, ``await close()``."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self.router, self._connections),
            host,
            port,
            reuse_address=True,
        )

    @property
    def address(self) -> tuple[str, int] | None:
        if self._server is None or not self._server.sockets:
            return None
        sockname = self._server.sockets[0].getsockname()
        return str(sockname[0]), int(sockname[1])

    @property
    def sockets(self) -> list[socket.socket]:
        return list(self._server.sockets) if self._server is not None else []

    async def close(self) -> None:
        """Stop accepting, then drop open keep-alive connections."""
        if self._server is None:
            return
        self._server.close()
        for connection in list(self._connections):
            connection.abort()
        with contextlib.suppress(Exception):
            await self._server.wait_closed()
        self._server = None


# -- the operations endpoints ----------------------------------------------------------------

HealthCheck = Callable[[], tuple[bool, dict[str, object]]]


def operations_router(health: HealthCheck, registry: metrics.MetricsRegistry) -> Router:
    """``/health``: 200 ``{"status": "ok", ...}`` or 503 ``{"status": "unavailable", ...}``;
    ``/metrics``: the registry in the Prometheus text format."""
    started = time.monotonic()

    def get_health(_request: Request) -> Response:
        ok, details = health()
        payload: dict[str, object] = {"status": "ok" if ok else "unavailable"}
        payload["uptime_seconds"] = round(time.monotonic() - started, 3)
        payload.update(details)
        return json_response(HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE, payload)

    def get_metrics(_request: Request) -> Response:
        return Response(HTTPStatus.OK, registry.render().encode(), metrics.CONTENT_TYPE)

    router = Router({"/health": get_health, "/metrics": get_metrics})
    registry.register("http", router.collect_metrics)
    return router
