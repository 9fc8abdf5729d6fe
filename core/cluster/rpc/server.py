"""The gRPC server a node answers its peers on (docs/cluster.md section 7).

:class:`RpcServer` binds ``host:port`` (port 0: any free port; :meth:`RpcServer.start` returns
the one bound), checks the shared secret of every call in :class:`SecretCheck` before any
handler runs, and stops gracefully. :class:`NodeService` answers the service's calls: ``Admin``
through a registry of named handlers (``ping`` built in); the data calls (``Append``,
``Consume``, ``Get``, ``Deliver``, ``TakeOverSession``, ``WriteTxnMarkers``) go to the
handlers the node plugs in (attributes of :class:`NodeService`), and answer UNIMPLEMENTED
while none is.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import NoReturn, TypeVar

import grpc
from grpc import aio

from core.cluster.rpc import cluster_pb2 as pb
from core.cluster.rpc import cluster_pb2_grpc as pb_grpc
from core.cluster.rpc.options import (
    PING,
    SECRET_METADATA_KEY,
    JsonObject,
    RpcSettings,
    server_options,
)

log = logging.getLogger(__name__)

AdminHandler = Callable[[JsonObject], Awaitable[JsonObject]]
In = TypeVar("In")
Out = TypeVar("Out")
# A streaming call's handler: the requests and the call's context in, the replies out.
StreamHandler = Callable[[AsyncIterator[In], aio.ServicerContext], AsyncIterator[Out]]
UnaryHandler = Callable[[In, aio.ServicerContext], Awaitable[Out]]


async def _abort(context: aio.ServicerContext, code: grpc.StatusCode, details: str) -> NoReturn:
    await context.abort(code, details)
    raise AssertionError("ServicerContext.abort raises")  # pragma: no cover


async def _not_built(context: aio.ServicerContext, call: str) -> NoReturn:
    await _abort(
        context,
        grpc.StatusCode.UNIMPLEMENTED,
        f"{call} is not built yet (docs/cluster.md section 15)",
    )


class NodeService(pb_grpc.NodeServicer):
    """The ``braid.cluster.v1.Node`` service of one node. ``node_id`` and ``incarnation`` say
    who answers (``ping``); :meth:`register` adds named ``Admin`` handlers."""

    def __init__(self, node_id: int, incarnation: int) -> None:
        self.node_id = node_id
        self.incarnation = incarnation
        self._admin: dict[str, AdminHandler] = {PING: self._ping}
        # The data calls' handlers, plugged in by the node (None: UNIMPLEMENTED).
        self.append: StreamHandler[pb.AppendBatch, pb.AppendResult] | None = None
        self.consume: StreamHandler[pb.ConsumeControl, pb.DeliveryBatch] | None = None
        self.get: UnaryHandler[pb.ConsumeControl, pb.DeliveryBatch] | None = None
        self.deliver: StreamHandler[pb.FanoutBatch, pb.Empty] | None = None
        self.take_over_session: UnaryHandler[pb.TakeOver, pb.TakenOver] | None = None
        self.write_txn_markers: UnaryHandler[pb.TxnMarkers, pb.AppendResult] | None = None

    def register(self, name: str, handler: AdminHandler) -> None:
        """Answer ``Admin(name)`` with ``handler``: it takes the call's JSON object and returns
        the reply's. One handler per name."""
        if name in self._admin:
            raise ValueError(f"admin call {name!r} is already registered")
        self._admin[name] = handler

    async def _ping(self, args: JsonObject) -> JsonObject:
        return {"node": self.node_id, "incarnation": self.incarnation}

    async def Admin(self, request: pb.AdminCall, context: aio.ServicerContext) -> pb.AdminReply:
        handler = self._admin.get(request.name)
        if handler is None:
            await _abort(
                context,
                grpc.StatusCode.NOT_FOUND,
                f"node {self.node_id} has no admin call {request.name!r}",
            )
        try:
            args = json.loads(request.json) if request.json else {}
        except ValueError as error:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"arguments: {error}")
        if not isinstance(args, dict):
            await _abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, "arguments must be a JSON object"
            )
        try:
            reply = await handler(args)
            encoded = json.dumps(reply, separators=(",", ":")).encode()
        except Exception as error:
            # A handler's bug is this node's: logged here, and the caller gets its message.
            log.exception("admin call %r failed", request.name)
            await _abort(
                context, grpc.StatusCode.INTERNAL, f"admin call {request.name!r} failed: {error}"
            )
        return pb.AdminReply(json=encoded)

    # The data calls are answered by the handlers the node plugs in (each in its own module:
    # core/cluster/rpc/append.py, consume.py, ...); one that is not plugged in answers
    # UNIMPLEMENTED.

    async def Append(
        self, request_iterator: AsyncIterator[pb.AppendBatch], context: aio.ServicerContext
    ) -> AsyncIterator[pb.AppendResult]:
        if self.append is None:
            await _not_built(context, "Append")
        async for result in self.append(request_iterator, context):
            yield result

    async def Consume(
        self, request_iterator: AsyncIterator[pb.ConsumeControl], context: aio.ServicerContext
    ) -> AsyncIterator[pb.DeliveryBatch]:
        if self.consume is None:
            await _not_built(context, "Consume")
        async for batch in self.consume(request_iterator, context):
            yield batch

    async def Get(
        self, request: pb.ConsumeControl, context: aio.ServicerContext
    ) -> pb.DeliveryBatch:
        if self.get is None:
            await _not_built(context, "Get")
        return await self.get(request, context)

    async def Deliver(
        self, request_iterator: AsyncIterator[pb.FanoutBatch], context: aio.ServicerContext
    ) -> AsyncIterator[pb.Empty]:
        if self.deliver is None:
            await _not_built(context, "Deliver")
        async for reply in self.deliver(request_iterator, context):
            yield reply

    async def TakeOverSession(
        self, request: pb.TakeOver, context: aio.ServicerContext
    ) -> pb.TakenOver:
        if self.take_over_session is None:
            await _not_built(context, "TakeOverSession")
        return await self.take_over_session(request, context)

    async def WriteTxnMarkers(
        self, request: pb.TxnMarkers, context: aio.ServicerContext
    ) -> pb.AppendResult:
        if self.write_txn_markers is None:
            await _not_built(context, "WriteTxnMarkers")
        return await self.write_txn_markers(request, context)


def _refusing(handler: grpc.RpcMethodHandler, method: str, why: str) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s kind (unary or streaming each way, so the request is read as
    the method's) that logs the refusal and answers UNAUTHENTICATED without running anything."""

    async def refuse(request: object, context: aio.ServicerContext) -> None:
        log.warning("cluster call %s from %s refused: %s", method, context.peer(), why)
        await _abort(context, grpc.StatusCode.UNAUTHENTICATED, why)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)


class SecretCheck(aio.ServerInterceptor):  # type: ignore[misc]  # grpc has no type stubs
    """Lets a call through only when its metadata carries the cluster secret (compared in
    constant time, so its bytes cannot be guessed one by one from response times)."""

    def __init__(self, secret: str) -> None:
        self._secret = secret.encode()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return None  # an unknown method: gRPC answers UNIMPLEMENTED
        sent = [
            value
            for key, value in (details.invocation_metadata or ())
            if key == SECRET_METADATA_KEY
        ]
        presented = sent[0].encode() if sent and isinstance(sent[0], str) else b""
        if len(sent) == 1 and hmac.compare_digest(presented, self._secret):
            return handler
        why = "no cluster secret" if not sent else "wrong cluster secret"
        return _refusing(handler, details.method, why)


class RpcServer:
    """A node's gRPC listener: :meth:`start`, then :meth:`stop`."""

    def __init__(self, settings: RpcSettings, service: NodeService) -> None:
        self._settings = settings
        self._service = service
        self._server: aio.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (``port`` 0: any free one) and return the port bound."""
        if self._server is not None:
            raise RuntimeError("the cluster RPC server is already started")
        server = aio.server(
            interceptors=[SecretCheck(self._settings.secret)],
            options=server_options(self._settings),
        )
        pb_grpc.add_NodeServicer_to_server(self._service, server)
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = int(server.add_insecure_port(address))
        except RuntimeError as error:  # grpc raises this when the address cannot be bound
            bound, failure = 0, f": {error}"
        else:
            failure = ""  # older grpc answers 0 instead of raising
        if bound == 0:
            await server.stop(None)  # its threads and completion queue, never started
            raise OSError(f"cannot listen for cluster calls on {address}{failure}")
        await server.start()
        self._server = server
        self.port = bound
        log.info("cluster calls on %s:%d", host, bound)
        return bound

    async def stop(self, grace_s: float = 5.0) -> None:
        """Refuse new calls, give the running ones ``grace_s`` seconds to finish, then cancel
        what is left. Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace_s)
