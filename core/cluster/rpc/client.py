"""Calls from this node to its peers (docs/cluster.md section 7).

:class:`RpcClient` keeps one channel per peer address (opened on first use, closed by
:meth:`RpcClient.close`). Every call on it carries the cluster secret, and every unary call
without a deadline of its own gets ``rpc_timeout_ms`` (:class:`_CallDefaults`). A peer that
cannot be reached or does not answer in time raises :class:`PeerUnavailable`, whatever the call;
any other failure is the peer's answer and stays a ``grpc.aio.AioRpcError`` with its status.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar, cast

import grpc
from grpc import aio

from core.cluster.rpc import cluster_pb2 as pb
from core.cluster.rpc import cluster_pb2_grpc as pb_grpc
from core.cluster.rpc.options import (
    PING,
    SECRET_METADATA_KEY,
    JsonObject,
    RpcSettings,
    channel_options,
)

T = TypeVar("T")

# The statuses that say "the peer is not there (now)", not "the peer refused": gRPC answers
# UNAVAILABLE when it cannot connect or the connection broke, DEADLINE_EXCEEDED when no answer
# came in time.
PEER_GONE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class PeerUnavailable(Exception):
    """A peer could not be reached, or did not answer within the deadline."""

    def __init__(self, address: str, code: grpc.StatusCode, details: str | None) -> None:
        super().__init__(f"cluster peer {address} unavailable ({code.name}): {details or ''}")
        self.address = address
        self.code = code
        self.details = details


class _CallDefaults:
    """Adds the cluster secret to every call, and the unary deadline to unary calls that have
    none (streams live as long as their peer, watched by keepalive). One subclass per kind of
    call: a grpc.aio channel files each interceptor under the first kind it is an instance of."""

    def __init__(self, secret: str, unary_timeout_s: float) -> None:
        self._secret = secret
        self._unary_timeout_s = unary_timeout_s

    def _details(self, details: aio.ClientCallDetails, unary: bool) -> aio.ClientCallDetails:
        metadata = aio.Metadata(*(details.metadata or ()))
        metadata.add(SECRET_METADATA_KEY, self._secret)
        timeout = details.timeout
        if unary and timeout is None:
            timeout = self._unary_timeout_s
        return aio.ClientCallDetails(
            method=details.method,
            timeout=timeout,
            metadata=metadata,
            credentials=details.credentials,
            wait_for_ready=details.wait_for_ready,
        )


# grpc has no type stubs: its interceptor bases are Any to mypy.
class _UnaryUnary(_CallDefaults, aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: aio.ClientCallDetails, request: Any
    ) -> Any:
        return await continuation(self._details(details, unary=True), request)


class _StreamUnary(_CallDefaults, aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_unary(
        self, continuation: Callable[..., Any], details: aio.ClientCallDetails, requests: Any
    ) -> Any:
        return await continuation(self._details(details, unary=True), requests)


class _UnaryStream(_CallDefaults, aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_stream(
        self, continuation: Callable[..., Any], details: aio.ClientCallDetails, request: Any
    ) -> Any:
        return await continuation(self._details(details, unary=False), request)


class _StreamStream(_CallDefaults, aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_stream(
        self, continuation: Callable[..., Any], details: aio.ClientCallDetails, requests: Any
    ) -> Any:
        return await continuation(self._details(details, unary=False), requests)


@asynccontextmanager
async def peer_errors(address: str) -> AsyncIterator[None]:
    """Turns UNAVAILABLE and DEADLINE_EXCEEDED raised inside into :class:`PeerUnavailable`
    (for streams, which the caller reads itself)."""
    try:
        yield
    except aio.AioRpcError as error:
        if error.code() in PEER_GONE:
            raise PeerUnavailable(address, error.code(), error.details()) from error
        raise


class RpcClient:
    """This node's calls to its peers, by peer address (``host:port``)."""

    def __init__(self, settings: RpcSettings) -> None:
        self._settings = settings
        self._channels: dict[str, tuple[aio.Channel, pb_grpc.NodeAsyncStub]] = {}
        self._closed = False

    def stub(self, address: str) -> pb_grpc.NodeAsyncStub:
        """The stub of the peer at ``address``, over its one channel (opened on first use)."""
        if self._closed:
            raise RuntimeError("the cluster RPC client is closed")
        opened = self._channels.get(address)
        if opened is None:
            channel = aio.insecure_channel(
                address,
                options=channel_options(self._settings),
                interceptors=[
                    kind(self._settings.secret, self._settings.rpc_timeout_s)
                    for kind in (_UnaryUnary, _StreamUnary, _UnaryStream, _StreamStream)
                ],
            )
            # NodeAsyncStub exists for type checkers only; grpc has no type stubs, so the
            # overload that returns it for an aio channel is not chosen.
            opened = (channel, cast("pb_grpc.NodeAsyncStub", pb_grpc.NodeStub(channel)))
            self._channels[address] = opened
        return opened[1]

    async def unary(self, address: str, call: Callable[[pb_grpc.NodeAsyncStub], Awaitable[T]]) -> T:
        """``await call(stub)`` on the peer at ``address``, with :class:`PeerUnavailable` for a
        peer gone: ``await client.unary(address, lambda stub: stub.Get(control))``."""
        async with peer_errors(address):
            return await call(self.stub(address))

    async def admin(self, address: str, name: str, args: JsonObject | None = None) -> JsonObject:
        """The peer's ``Admin(name)`` handler called with ``args``; its JSON object reply."""
        request = pb.AdminCall(name=name, json=json.dumps(args or {}).encode())
        reply = await self.unary(address, lambda stub: stub.Admin(request))
        answer = json.loads(reply.json)
        if not isinstance(answer, dict):
            raise ValueError(f"admin call {name!r} on {address} answered {answer!r}")
        return answer

    async def ping(self, address: str) -> JsonObject:
        """``{"node": id, "incarnation": n}`` of the peer at ``address``."""
        return await self.admin(address, PING)

    async def close(self, grace_s: float | None = None) -> None:
        """Close every channel (calls still running get ``grace_s`` seconds, then CANCELLED)."""
        self._closed = True
        channels, self._channels = self._channels, {}
        for channel, _stub in channels.values():
            await channel.close(grace_s)
