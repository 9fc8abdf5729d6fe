"""braid/web/: the aiohttp listener over real sockets: /health and /metrics as before (open,
keep-alive, pipelining, bad requests, idle timeout, close), responses counted by status code,
HTTP Basic auth against the user store, and the RabbitMQ-style users and permissions API."""

from __future__ import annotations

import asyncio
import base64
import json
import re

import aiohttp
import pytest

from braid.metrics import MetricsRegistry
from braid.web import WebServer, build_app
from braid.web.server import ResponseCounter
from core.cluster import LocalMetadata
from core.log import LogConfig, LogStore
from core.security import SecurityService
from core.security.passwords import verify_password


@pytest.fixture
async def security(tmp_path):
    store = LogStore(LogConfig(tmp_path / "data", segment_size=256 * 1024, retention_ms=None))
    yield SecurityService(LocalMetadata(store), vhosts=("/", "staging"))
    await store.aclose()


async def started(security, *, idle_timeout_s: float = 30.0):
    healthy = {"ok": True}

    def health():
        return healthy["ok"], {"detail": 1}

    registry = MetricsRegistry()
    registry.register("test", lambda: [("test_value", "gauge", "A test gauge.", 7)])
    counter = ResponseCounter()
    registry.register("http", counter.collect_metrics)
    server = WebServer(
        build_app(health, registry, security), counter, idle_timeout_s=idle_timeout_s
    )
    await server.start("127.0.0.1", 0)
    server.healthy = healthy
    server.registry = registry
    return server


@pytest.fixture
async def server(security):
    instance = await started(security)
    yield instance
    await instance.close()


async def exchange(server, data: bytes) -> bytes:
    host, port = server.address
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(data)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    await writer.wait_closed()
    return answer


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


GUEST = {"Authorization": basic("guest", "guest")}


def url(server, path: str) -> str:
    host, port = server.address
    return f"http://{host}:{port}{path}"


async def test_health_and_metrics_are_open(server):
    answer = await exchange(server, b"GET /health HTTP/1.0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.0 200 OK\r\n")  # aiohttp answers in the request's version
    assert b"Server: braid\r\n" in answer
    assert b'"status": "ok"' in answer
    assert b'"detail": 1' in answer
    server.healthy["ok"] = False
    answer = await exchange(server, b"GET /health HTTP/1.0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.0 503 Service Unavailable\r\n")
    assert b'"status": "unavailable"' in answer
    answer = await exchange(server, b"GET /metrics HTTP/1.0\r\n\r\n")
    assert b"Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n" in answer
    assert b"# TYPE test_value gauge\ntest_value 7\n" in answer


async def test_pipelined_keep_alive_requests_are_answered_in_order(server):
    requests = (
        b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )  # (a request after "Connection: close" breaks RFC 9112 9.6: llhttp answers 400)
    answer = await exchange(server, requests)
    statuses = re.findall(rb"HTTP/1\.1 \d{3} [^\r]*", answer)
    ok, missing = b"HTTP/1.1 200 OK", b"HTTP/1.1 404 Not Found"
    assert statuses == [ok, ok, missing, ok]
    assert b"# HELP" not in answer  # HEAD: no body


async def test_a_bad_request_closes_only_its_connection(server):
    host, port = server.address
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    first = await asyncio.wait_for(reader.readuntil(b"}"), 10)
    assert first.startswith(b"HTTP/1.1 200 OK")

    for garbage in (b"BAD\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"):
        answer = await exchange(server, garbage)  # read to the end: the server closes
        assert re.match(rb"HTTP/1\.[01] 400 Bad Request\r\n", answer)

    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")  # the first connection still works
    await writer.drain()
    second = await asyncio.wait_for(reader.read(4096), 10)
    assert second.startswith(b"HTTP/1.1 200 OK")
    writer.close()
    await writer.wait_closed()
    text = server.registry.render()
    assert 'braid_http_responses_total{code="400"} 2' in text
    assert 'braid_http_responses_total{code="200"} 2' in text


async def test_idle_connections_are_closed(security):
    server = await started(security, idle_timeout_s=0.05)
    try:
        host, port = server.address
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)  # answered, then closed when idle
        assert answer.startswith(b"HTTP/1.1 200 OK")
        writer.close()
    finally:
        await server.close()


async def test_close_drops_open_connections(server):
    host, port = server.address
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    assert (await asyncio.wait_for(reader.read(4096), 10)).startswith(b"HTTP/1.1 200")
    await server.close()
    assert server.address is None
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection(host, port)


async def test_the_api_needs_basic_auth_from_a_management_user(server, security):
    await security.put_user("viewer", password="v", tags="monitoring")
    await security.put_user("app", password="a", tags="")
    async with aiohttp.ClientSession() as client:
        async with client.get(url(server, "/api/whoami")) as response:
            assert response.status == 401
            assert response.headers["WWW-Authenticate"] == 'Basic realm="BraidMQ"'
        for headers in ({"Authorization": basic("guest", "wrong")}, {"Authorization": "Bearer x"}):
            async with client.get(url(server, "/api/whoami"), headers=headers) as response:
                assert response.status == 401
        async with client.get(url(server, "/api/whoami"), headers=GUEST) as response:
            assert response.status == 200
            assert await response.json() == {"name": "guest", "tags": ["administrator"]}
        viewer = {"Authorization": basic("viewer", "v")}
        async with client.get(url(server, "/api/whoami"), headers=viewer) as response:
            assert await response.json() == {"name": "viewer", "tags": ["monitoring"]}
        async with client.get(url(server, "/api/users"), headers=viewer) as response:
            assert response.status == 401
            assert (await response.json())["reason"] == "Not administrator user"
        app = {"Authorization": basic("app", "a")}
        async with client.get(url(server, "/api/whoami"), headers=app) as response:
            assert response.status == 401
            assert (await response.json())["reason"] == "Not management user"
        async with client.get(url(server, "/health")) as response:
            assert response.status == 200


async def test_users_the_rabbitmq_way(server, security):
    async with aiohttp.ClientSession(headers=GUEST) as client:
        body = {"password": "alice-secret", "tags": "management"}
        async with client.put(url(server, "/api/users/alice"), json=body) as response:
            assert response.status == 201
        async with client.put(url(server, "/api/users/alice"), json=body) as response:
            assert response.status == 204
        async with client.get(url(server, "/api/users/alice")) as response:
            alice = await response.json()
        assert alice["name"] == "alice"
        assert alice["hashing_algorithm"] == "argon2id"
        assert alice["tags"] == ["management"]
        assert "alice-secret" not in json.dumps(alice)
        imported = {
            "password_hash": "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR",
            "hashing_algorithm": "rabbit_password_hashing_sha256",
            "tags": ["administrator"],
        }
        async with client.put(url(server, "/api/users/old"), json=imported) as response:
            assert response.status == 201
        assert verify_password(security.store.user("old").password, "test12")
        async with client.get(url(server, "/api/users")) as response:
            names = [user["name"] for user in await response.json()]
        assert names == ["alice", "guest", "old"]
        for bad in (
            {"tags": ""},
            {"password": 5, "tags": ""},
            {"password_hash": "??", "tags": ""},
            {"password_hash": "x", "hashing_algorithm": "md4", "tags": ""},
        ):
            async with client.put(url(server, "/api/users/bad"), json=bad) as response:
                assert response.status == 400, bad
        async with client.put(url(server, "/api/users/bad"), data=b"{not json") as response:
            assert response.status == 400
        async with client.delete(url(server, "/api/users/alice")) as response:
            assert response.status == 204
        async with client.delete(url(server, "/api/users/alice")) as response:
            assert response.status == 404
        async with client.get(url(server, "/api/users/alice")) as response:
            assert response.status == 404
            assert await response.json() == {"error": "Object Not Found", "reason": "Not Found"}
        async with client.post(url(server, "/api/users/alice"), json=body) as response:
            assert response.status == 405


async def test_permissions_and_topic_permissions_the_rabbitmq_way(server, security):
    await security.put_user("alice", password="a")
    async with aiohttp.ClientSession(headers=GUEST) as client:
        permission = {"configure": "^alice\\.", "write": "^alice\\.", "read": ".*"}
        async with client.put(url(server, "/api/permissions/%2F/alice"), json=permission) as r:
            assert r.status == 201
        async with client.put(url(server, "/api/permissions/staging/alice"), json=permission) as r:
            assert r.status == 201
        async with client.get(url(server, "/api/permissions/%2F/alice")) as r:
            assert await r.json() == {"user": "alice", "vhost": "/", **permission}
        async with client.get(url(server, "/api/users/alice/permissions")) as r:
            assert [p["vhost"] for p in await r.json()] == ["/", "staging"]
        async with client.get(url(server, "/api/permissions")) as r:
            assert [(p["vhost"], p["user"]) for p in await r.json()] == [
                ("/", "alice"),
                ("/", "guest"),
                ("staging", "alice"),
            ]
        for path, body in (
            ("/api/permissions/nope/alice", permission),  # no such vhost
            ("/api/permissions/%2F/bob", permission),  # no such user
            ("/api/permissions/%2F/alice", {**permission, "write": "("}),
            ("/api/permissions/%2F/alice", {"configure": ".*"}),
        ):
            async with client.put(url(server, path), json=body) as r:
                assert r.status == 400, path
        topic = {"exchange": "amq.topic", "write": "^{username}\\.", "read": ".*"}
        async with client.put(url(server, "/api/topic-permissions/%2F/alice"), json=topic) as r:
            assert r.status == 201
        async with client.get(url(server, "/api/topic-permissions/%2F/alice")) as r:
            assert await r.json() == [{"user": "alice", "vhost": "/", **topic}]
        async with client.get(url(server, "/api/topic-permissions")) as r:
            assert len(await r.json()) == 1
        async with client.delete(url(server, "/api/topic-permissions/%2F/alice")) as r:
            assert r.status == 204
        async with client.get(url(server, "/api/topic-permissions/%2F/alice")) as r:
            assert r.status == 404
        async with client.delete(url(server, "/api/permissions/%2F/alice")) as r:
            assert r.status == 204
        async with client.get(url(server, "/api/permissions/%2F/alice")) as r:
            assert r.status == 404
        async with client.get(url(server, "/api/vhosts")) as r:
            assert await r.json() == [{"name": "/"}, {"name": "staging"}]
    # The authorizer sees the change at once.
    assert security.authorize(
        "amqp", "1.2.3.4:5", "alice", "", "amqp basic.publish", "amq.vhost.staging.alice.x"
    )
    assert not security.authorize("amqp", "1.2.3.4:5", "alice", "", "amqp basic.publish", "alice.x")
