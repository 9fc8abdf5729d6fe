"""braid/http.py: the sans-IO parser from byte strings, then the server over a real socket."""

from __future__ import annotations

import asyncio
import re
from http import HTTPStatus

import pytest

from braid import http
from braid.http import (
    HTTPServer,
    RemoteProtocolError,
    Request,
    Response,
    Router,
    encode_response,
    operations_router,
    parse_request,
)
from braid.metrics import MetricsRegistry

SIMPLE = b"GET /health HTTP/1.1\r\nHost: example\r\nAccept: */*\r\n\r\n"


def feed_one_byte_at_a_time(data: bytes) -> tuple[Request, int]:
    buffer = bytearray()
    for index in range(len(data)):
        buffer += data[index : index + 1]
        parsed = parse_request(buffer)
        if parsed is not None:
            assert index == len(data) - 1, "parsed before the request was complete"
            return parsed
    raise AssertionError("never parsed")


@pytest.mark.parametrize(
    ("raw", "method", "path", "version", "keep_alive"),
    [
        (SIMPLE, "GET", "/health", (1, 1), True),
        (
            b"GET /metrics?x=1 HTTP/1.1\r\nConnection: close\r\n\r\n",
            "GET",
            "/metrics",
            (1, 1),
            False,
        ),
        (b"GET /health HTTP/1.0\r\n\r\n", "GET", "/health", (1, 0), False),
        (b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", "GET", "/", (1, 0), True),
        (b"HEAD http://h:1/metrics HTTP/1.1\r\n\r\n", "HEAD", "/metrics", (1, 1), True),
        (
            b"\r\nPOST /health HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
            "POST",
            "/health",
            (1, 1),
            True,
        ),
        (b"OPTIONS * HTTP/1.1\r\n\r\n", "OPTIONS", "*", (1, 1), True),
    ],
)
def test_parse_whole_and_byte_by_byte_and_with_trailing_bytes(
    raw, method, path, version, keep_alive
):
    for request, consumed in (
        parse_request(raw),
        feed_one_byte_at_a_time(raw),
        parse_request(raw + b"GET /next HTTP/1.1\r\n"),
    ):
        assert consumed == len(raw)
        assert request.method == method
        assert request.path == path
        assert request.version == version
        assert request.keep_alive is keep_alive


def test_headers_are_lower_cased_and_trimmed():
    request, _ = parse_request(b"GET / HTTP/1.1\r\nX-Thing:  a b \t\r\nHOST: h\r\n\r\n")
    assert request.headers == (("x-thing", "a b"), ("host", "h"))
    assert request.header("host") == "h"
    assert request.header("missing") is None


def test_pipelined_requests_parse_in_turn():
    buffer = bytearray(SIMPLE + b"GET /metrics HTTP/1.1\r\n\r\n")
    first, consumed = parse_request(buffer)
    del buffer[:consumed]
    second, consumed = parse_request(buffer)
    assert (first.path, second.path) == ("/health", "/metrics")
    assert consumed == len(buffer)


def test_incomplete_body_waits():
    assert parse_request(b"GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\nab") is None


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"garbage\r\n\r\n", HTTPStatus.BAD_REQUEST),
        (b"\r\n\r\n", HTTPStatus.BAD_REQUEST),
        (b"GET /a b HTTP/1.1\r\n\r\n", HTTPStatus.BAD_REQUEST),
        (b"GET health HTTP/1.1\r\n\r\n", HTTPStatus.BAD_REQUEST),
        (b"GET /\x7f HTTP/1.1\r\n\r\n", HTTPStatus.BAD_REQUEST),
        (b"G(T / HTTP/1.1\r\n\r\n", HTTPStatus.BAD_REQUEST),
        (b"GET / HTTP/1\r\n\r\n", HTTPStatus.BAD_REQUEST),
        (b"GET / HTTP/2.0\r\n\r\n", HTTPStatus.HTTP_VERSION_NOT_SUPPORTED),
        (b"GET / HTTP/1.1\r\nno colon\r\n\r\n", HTTPStatus.BAD_REQUEST),
        (b"GET / HTTP/1.1\r\nHost : x\r\n\r\n", HTTPStatus.BAD_REQUEST),
        (b"GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n", HTTPStatus.BAD_REQUEST),
        (b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", HTTPStatus.NOT_IMPLEMENTED),
        (b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", HTTPStatus.BAD_REQUEST),
        (b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n", 413),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * (http.MAX_HEAD_BYTES + 1), 431),
    ],
)
def test_bad_requests(raw, status):
    with pytest.raises(RemoteProtocolError) as caught:
        parse_request(raw)
    assert caught.value.status == status


def test_a_long_head_without_end_is_rejected_early():
    with pytest.raises(RemoteProtocolError):
        parse_request(b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * (http.MAX_HEAD_BYTES // 6 + 1))


def test_encode_response():
    response = Response(HTTPStatus.OK, b"hi", "text/plain", (("X-A", "1"),))
    raw = encode_response(response, keep_alive=False)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"HTTP/1.1 200 OK"
    assert b"Content-Length: 2" in head
    assert b"Connection: close" in head
    assert b"X-A: 1" in head
    assert body == b"hi"
    assert encode_response(response, keep_alive=True, head_only=True).endswith(b"\r\n\r\n")


def test_router_statuses():
    def boom(_request):
        raise RuntimeError("handler bug")

    router = Router({"/ok": lambda _r: Response(HTTPStatus.OK), "/boom": boom})
    get = Request("GET", "/ok", "/ok", (1, 1), ())
    assert router.respond(get).status == HTTPStatus.OK
    missing = Request("GET", "/nope", "/nope", (1, 1), ())
    assert router.respond(missing).status == HTTPStatus.NOT_FOUND
    assert router.respond(Request("PUT", "/ok", "/ok", (1, 1), ())).status == 405
    assert router.respond(Request("GET", "/boom", "/boom", (1, 1), ())).status == 500
    assert router.responses == {200: 1, 404: 1, 405: 1, 500: 1}


# -- over a real socket ----------------------------------------------------------------------


@pytest.fixture
async def server():
    healthy = {"ok": True}

    def health():
        return healthy["ok"], {"detail": 1}

    registry = MetricsRegistry()
    registry.register("test", lambda: [("test_value", "gauge", "A test gauge.", 7)])
    instance = HTTPServer(operations_router(health, registry))
    await instance.start("127.0.0.1", 0)
    instance.healthy = healthy
    yield instance
    await instance.close()


async def exchange(server, data: bytes, *, read_until_close: bool = True) -> bytes:
    host, port = server.address
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(data)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10) if read_until_close else b""
    writer.close()
    await writer.wait_closed()
    return answer


async def test_health_and_metrics(server):
    answer = await exchange(server, b"GET /health HTTP/1.0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b'"status": "ok"' in answer
    assert b'"detail": 1' in answer
    server.healthy["ok"] = False
    answer = await exchange(server, b"GET /health HTTP/1.0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert b'"status": "unavailable"' in answer
    answer = await exchange(server, b"GET /metrics HTTP/1.0\r\n\r\n")
    assert b"Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n" in answer
    assert b"# TYPE test_value gauge\ntest_value 7\n" in answer


async def test_pipelined_keep_alive_requests_are_answered_in_order(server):
    requests = (
        b"GET /health HTTP/1.1\r\n\r\n"
        b"HEAD /metrics HTTP/1.1\r\n\r\n"
        b"GET /nope HTTP/1.1\r\n\r\n"
        b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n"
        b"GET /never-answered HTTP/1.1\r\n\r\n"
    )
    answer = await exchange(server, requests)
    statuses = re.findall(rb"HTTP/1\.1 \d{3} [^\r]*", answer)
    ok, missing = b"HTTP/1.1 200 OK", b"HTTP/1.1 404 Not Found"
    assert statuses == [ok, ok, missing, ok]
    assert b"# HELP" not in answer  # HEAD: no body


async def test_a_bad_request_closes_only_its_connection(server):
    host, port = server.address
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /health HTTP/1.1\r\n\r\n")
    await writer.drain()
    first = await asyncio.wait_for(reader.read(4096), 10)
    assert first.startswith(b"HTTP/1.1 200 OK")

    answer = await exchange(server, b"BAD\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b"Connection: close" in answer

    writer.write(b"GET /metrics HTTP/1.1\r\n\r\n")  # the first connection still works
    await writer.drain()
    second = await asyncio.wait_for(reader.read(4096), 10)
    assert second.startswith(b"HTTP/1.1 200 OK")
    writer.close()
    await writer.wait_closed()


async def test_idle_connections_are_closed(server, monkeypatch):
    monkeypatch.setattr(http, "IDLE_TIMEOUT_S", 0.05)
    host, port = server.address
    reader, writer = await asyncio.open_connection(host, port)
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()
    await writer.wait_closed()


async def test_close_drops_open_connections(server):
    host, port = server.address
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /health HTTP/1.1\r\n\r\n")
    await writer.drain()
    assert (await asyncio.wait_for(reader.read(4096), 10)).startswith(b"HTTP/1.1 200")
    await server.close()
    assert server.address is None
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection(host, port)
