"""core/cluster/rpc over real loopback gRPC: the secret is checked on every kind of call, Admin's
registry answers, message sizes follow max_message_size, a peer gone is one clear exception
within the deadline, calls not built yet answer UNIMPLEMENTED, and stop lets running calls end."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc import aio

from core.cluster.rpc import (
    JsonObject,
    NodeService,
    PeerUnavailable,
    RpcClient,
    RpcServer,
    RpcSettings,
)
from core.cluster.rpc import cluster_pb2 as pb
from core.cluster.rpc import cluster_pb2_grpc as pb_grpc

SECRET = "braid-test-secret"
MIB = 1024 * 1024
# Waits only: a test that hangs fails here instead of at pytest's 300 s.
DEADLINE_S = 10.0
NODE_ID = 7
INCARNATION = 42


async def echo(args: JsonObject) -> JsonObject:
    return args


async def drain(stream: AsyncIterator[object]) -> None:
    """Read a response stream to its end (where its status is raised)."""
    async with asyncio.timeout(DEADLINE_S):
        async for _ in stream:
            pass


@pytest.fixture
def settings() -> RpcSettings:
    # 6 MiB bodies: gRPC's limit becomes 7 MiB, over its 4 MiB default.
    return RpcSettings(secret=SECRET, max_message_size=6 * MIB, heartbeat_ms=500)


@pytest.fixture
def service() -> NodeService:
    node = NodeService(NODE_ID, INCARNATION)
    node.register("echo", echo)
    return node


@pytest.fixture
async def server(settings: RpcSettings, service: NodeService) -> AsyncIterator[RpcServer]:
    rpc = RpcServer(settings, service)
    await rpc.start("127.0.0.1", 0)
    yield rpc
    await rpc.stop(grace_s=0)


@pytest.fixture
async def client(settings: RpcSettings) -> AsyncIterator[RpcClient]:
    rpc = RpcClient(settings)
    yield rpc
    await rpc.close()


def address_of(server: RpcServer) -> str:
    return f"127.0.0.1:{server.port}"


async def test_ping_with_the_right_secret(server: RpcServer, client: RpcClient) -> None:
    assert server.port > 0
    reply = await asyncio.wait_for(client.ping(address_of(server)), DEADLINE_S)
    assert reply == {"node": NODE_ID, "incarnation": INCARNATION}


async def test_registered_admin_handler_gets_the_arguments(
    server: RpcServer, client: RpcClient
) -> None:
    args = {"queue": "orders", "n": 3, "nested": {"ok": True}}
    reply = await asyncio.wait_for(client.admin(address_of(server), "echo", args), DEADLINE_S)
    assert reply == args


async def test_wrong_secret_is_unauthenticated_and_logged(
    settings: RpcSettings,
    service: NodeService,
    server: RpcServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[JsonObject] = []

    async def record(args: JsonObject) -> JsonObject:
        calls.append(args)
        return {}

    service.register("record", record)
    intruder = RpcClient(RpcSettings(secret=SECRET + "x", max_message_size=MIB))
    try:
        with (
            caplog.at_level(logging.WARNING, logger="core.cluster.rpc.server"),
            pytest.raises(aio.AioRpcError) as refused,
        ):
            await asyncio.wait_for(intruder.admin(address_of(server), "record"), DEADLINE_S)
    finally:
        await intruder.close()
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert calls == []  # the handler never ran
    assert "refused: wrong cluster secret" in caplog.text
    assert "/braid.cluster.v1.Node/Admin" in caplog.text


async def test_missing_secret_is_unauthenticated_for_unary_and_stream_calls(
    server: RpcServer, caplog: pytest.LogCaptureFixture
) -> None:
    # A plain channel: no interceptor adds the secret.
    async with aio.insecure_channel(address_of(server)) as channel:
        stub = pb_grpc.NodeStub(channel)
        with (
            caplog.at_level(logging.WARNING, logger="core.cluster.rpc.server"),
            pytest.raises(aio.AioRpcError) as unary,
        ):
            await stub.Admin(pb.AdminCall(name="ping"), timeout=DEADLINE_S)
        assert unary.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # A streaming call not built yet: the secret is checked before UNIMPLEMENTED.
        stream = stub.Append(iter([pb.AppendBatch()]), timeout=DEADLINE_S)
        with pytest.raises(aio.AioRpcError) as streaming:
            await drain(stream)
        assert streaming.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert caplog.text.count("refused: no cluster secret") == 2


async def test_unknown_admin_name_is_not_found(server: RpcServer, client: RpcClient) -> None:
    with pytest.raises(aio.AioRpcError) as unknown:
        await asyncio.wait_for(client.admin(address_of(server), "no-such-call"), DEADLINE_S)
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    assert "no-such-call" in (unknown.value.details() or "")


async def test_admin_arguments_must_be_a_json_object(server: RpcServer, client: RpcClient) -> None:
    request = pb.AdminCall(name="echo", json=b"[1, 2]")
    with pytest.raises(aio.AioRpcError) as bad:
        await asyncio.wait_for(
            client.unary(address_of(server), lambda stub: stub.Admin(request)), DEADLINE_S
        )
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_failing_handler_is_internal_with_its_message(
    service: NodeService, server: RpcServer, client: RpcClient
) -> None:
    async def broken(args: JsonObject) -> JsonObject:
        raise KeyError("lost")

    service.register("broken", broken)
    with pytest.raises(aio.AioRpcError) as failed:
        await asyncio.wait_for(client.admin(address_of(server), "broken"), DEADLINE_S)
    assert failed.value.code() == grpc.StatusCode.INTERNAL
    assert "lost" in (failed.value.details() or "")


async def test_messages_over_grpcs_4_mib_default_pass_both_ways(
    server: RpcServer, client: RpcClient
) -> None:
    blob = "b" * (5 * MIB)
    reply = await asyncio.wait_for(
        client.admin(address_of(server), "echo", {"blob": blob}), DEADLINE_S
    )
    assert reply["blob"] == blob


async def test_messages_over_max_message_size_plus_envelope_are_refused(
    server: RpcServer, client: RpcClient
) -> None:
    # 7 MiB is the limit with max_message_size 6 MiB: the sizes are set, not unlimited.
    with pytest.raises(aio.AioRpcError) as too_big:
        await asyncio.wait_for(
            client.admin(address_of(server), "echo", {"blob": "b" * (7 * MIB)}), DEADLINE_S
        )
    assert too_big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_calls_not_built_yet_are_unimplemented(server: RpcServer, client: RpcClient) -> None:
    address = address_of(server)
    with pytest.raises(aio.AioRpcError) as unary:
        await asyncio.wait_for(
            client.unary(address, lambda stub: stub.Get(pb.ConsumeControl())), DEADLINE_S
        )
    assert unary.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "Get" in (unary.value.details() or "")

    stream = client.stub(address).Consume(iter([pb.ConsumeControl(credit=1)]))
    with pytest.raises(aio.AioRpcError) as streaming:
        await drain(stream)
    assert streaming.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_a_stopped_server_is_peer_unavailable(
    settings: RpcSettings, service: NodeService
) -> None:
    server = RpcServer(settings, service)
    port = await server.start("127.0.0.1", 0)
    client = RpcClient(RpcSettings(secret=SECRET, rpc_timeout_ms=2000))
    try:
        address = f"127.0.0.1:{port}"
        assert (await asyncio.wait_for(client.ping(address), DEADLINE_S))["node"] == NODE_ID
        await server.stop(grace_s=0)
        with pytest.raises(PeerUnavailable) as gone:
            await asyncio.wait_for(client.ping(address), DEADLINE_S)
    finally:
        await server.stop(grace_s=0)
        await client.close()
    assert gone.value.address == address
    assert gone.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


async def test_a_peer_that_does_not_answer_in_time_is_peer_unavailable(
    settings: RpcSettings, service: NodeService, server: RpcServer
) -> None:
    async def stuck(args: JsonObject) -> JsonObject:
        await asyncio.sleep(DEADLINE_S)
        return {}

    service.register("stuck", stuck)
    impatient = RpcClient(RpcSettings(secret=SECRET, rpc_timeout_ms=300))
    try:
        with pytest.raises(PeerUnavailable) as late:
            await asyncio.wait_for(impatient.admin(address_of(server), "stuck"), DEADLINE_S)
    finally:
        await impatient.close()
    assert late.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_a_taken_port_is_refused(
    settings: RpcSettings, service: NodeService, server: RpcServer
) -> None:
    # gRPC would share the port by SO_REUSEPORT unless told not to.
    second = RpcServer(settings, NodeService(NODE_ID + 1, 1))
    try:
        with pytest.raises(OSError, match="cannot listen"):
            await second.start("127.0.0.1", server.port)
    finally:
        await second.stop(grace_s=0)  # started after all when the check is broken


async def test_stop_lets_a_running_call_finish_and_refuses_new_ones(
    settings: RpcSettings, service: NodeService, client: RpcClient
) -> None:
    entered = asyncio.Event()
    release = asyncio.Event()

    async def slow(args: JsonObject) -> JsonObject:
        entered.set()
        await release.wait()
        return {"done": True}

    service.register("slow", slow)
    server = RpcServer(settings, service)
    address = f"127.0.0.1:{await server.start('127.0.0.1', 0)}"
    running = asyncio.create_task(client.admin(address, "slow"))
    await asyncio.wait_for(entered.wait(), DEADLINE_S)
    stopping = asyncio.create_task(server.stop(grace_s=DEADLINE_S))
    await asyncio.sleep(0.1)  # the server is stopping: new calls are refused
    with pytest.raises(PeerUnavailable):
        await asyncio.wait_for(client.ping(address), DEADLINE_S)
    release.set()
    assert await asyncio.wait_for(running, DEADLINE_S) == {"done": True}
    await asyncio.wait_for(stopping, DEADLINE_S)
