"""The Kafka listener: a thin ``asyncio.Protocol`` per connection around the sans-IO codec.

``KafkaServer(api, ...)`` (``api``: the ``core.api.BrokerAPI``, all it uses of the core) accepts
connections; each ``KafkaConnection`` feeds received bytes to its ``KafkaDecoder``, parses every
complete frame of the read at once, and hands each request to its handler (``admin``,
``produce``, ``fetch``, ``groups``, ``txn_handlers``).

Ordering. Kafka answers the requests of a connection in the order they came (clients match
responses by correlation id but librdkafka and the Java client require the order). A handler is
an ``async`` function started *eagerly*: it runs at once, inside ``data_received``, up to its
first real suspension, so what it does before waiting (appends to the log, sequence checks,
group bookkeeping) happens in request order. Most requests finish right there and their
response is queued without creating a task; a handler that must wait (acks=all durability, a
long-poll fetch, a rebalance) goes on in a task. Responses leave in request order whatever
order the waits end in: each request holds a slot in ``pending``; the head slots that are
ready are written.

I/O batching (ARCHITECTURE.md): every frame of a read is parsed before yielding; responses that
become ready in one loop iteration go out in one ``transport.write``. Reading pauses while the
requests still owed a response hold more than ``MAX_PENDING_BYTES`` or number more than
``MAX_PENDING_REQUESTS``, or while the transport's write buffer is above its high-water mark
(``pause_writing``); it resumes once they are back under half of that.

Errors: a frame with a bad size prefix or a request that does not parse, or a request for an API
or version we do not speak (other than ApiVersions, answered per KIP-511), closes that
connection, with a log line, as the Kafka broker does; nothing else is affected. A handler that
raises is a bug: logged with its traceback, and the connection is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import socket
from collections import deque
from collections.abc import Iterator
from typing import Any, Final, cast

from core.api import (
    PROTOCOL_KAFKA,
    BrokerAPI,
    ClientContext,
    RestOfCoroutine,
    run_until_first_wait,
)
from gateway.kafka import access, acls, admin, fetch, groups, produce, txn_handlers
from gateway.kafka.apis import SUPPORTED_APIS
from gateway.kafka.codec import (
    MAX_REQUEST_SIZE,
    KafkaDecoder,
    Request,
    UnsupportedRequest,
    encode_response,
    encode_unsupported_response,
    preload_schemas,
)
from gateway.kafka.context import Connection, Handler, KafkaContext, KafkaSettings
from gateway.kafka.errors import KafkaFrameError, MalformedRequestError
from gateway.kafka.producers import (
    TAIL_ENTRIES,
    MetadataTable,
    ProducerIdAllocator,
    ProducerStates,
    TailBatch,
    last_sequence,
)
from gateway.kafka.records import BATCH_HEADER_SIZE, read_batch_header
from gateway.kafka.transactions import TransactionCoordinator

log = logging.getLogger(__name__)

# High-water marks of the requests a connection may have in flight (owed a response). librdkafka
# keeps up to 1,000,000 requests in flight (5 per partition when idempotent) and Kafka reads on
# until queued.max.requests (500, whole broker) are queued. A producer with linger.ms=1 at 10k
# records/s has a thousand requests a second in flight while an fsync takes a few ms, so the
# count is generous; the bytes bound memory (Produce requests hold their records until answered).
MAX_PENDING_REQUESTS: Final = 1000
MAX_PENDING_BYTES: Final = 64 * 1024 * 1024
# Kafka's socket.listen.backlog.size (KIP-764) default.
LISTEN_BACKLOG: Final = 50
# Names connections in the ClientContext (logs, the management API).
_connection_numbers = itertools.count(1)

HANDLERS: Final[dict[int, Handler]] = {
    **admin.HANDLERS,
    **produce.HANDLERS,
    **fetch.HANDLERS,
    **groups.HANDLERS,
    **txn_handlers.HANDLERS,
    **access.HANDLERS,
    **acls.HANDLERS,
}

METRICS: Final = (
    "connections_opened",
    "connections_closed",
    "requests",
    "request_bytes",
    "response_bytes",
    "malformed_requests",
    "unsupported_requests",
    "handler_errors",
    "produced_batches",
    "produced_records",
    "produced_bytes",
    "duplicate_batches",
    "produce_errors",
    "fetched_bytes",
    "producer_ids",
    "topics_created",
    "committed",
    "aborted",
    "expired",
)


class _Slot:
    """One owed response, in request order."""

    __slots__ = ("ready", "reply", "request")

    def __init__(
        self, request: Request | None, ready: bool = False, reply: bytes | None = None
    ) -> None:
        self.request = request
        self.ready = ready
        self.reply = reply


class KafkaConnection(asyncio.Protocol):
    def __init__(self, server: KafkaServer, context: KafkaContext) -> None:
        self.server = server
        self.context = context
        self.metrics = context.metrics
        self.decoder = KafkaDecoder(max_request_size=server.max_request_size)
        self.transport: asyncio.Transport | None = None
        self.connection = Connection("?", "", 0)
        self.pending: deque[_Slot] = deque()
        self.pending_bytes = 0  # frame sizes of the requests owed a response
        self.out: list[bytes] = []
        self.tasks: set[asyncio.Task[Any]] = set()
        self.flush_scheduled = False
        self.reading_paused = False
        self.writing_paused = False
        self.closed = False

    # -- connection lifecycle ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        local = transport.get_extra_info("sockname")
        peer_text = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        client = ClientContext(
            PROTOCOL_KAFKA, peer=peer_text, connection_id=f"kafka-{next(_connection_numbers)}"
        )
        if isinstance(local, tuple):
            self.connection = Connection(peer_text, str(local[0]), int(local[1]), client=client)
        else:
            self.connection = Connection(peer_text, "", 0, client=client)
        # A TLS connection with a verified client certificate: its CN is the principal unless
        # the client logs in with SASL (access.py).
        common_name = access.certificate_common_name(transport.get_extra_info("peercert"))
        if common_name is not None:
            self.connection.login.certificate_user = common_name
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.connections.add(self)
        self.metrics["connections_opened"] += 1

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed:
            self.closed = True
        self.server.connections.discard(self)
        self.metrics["connections_closed"] += 1
        for task in list(self.tasks):
            task.cancel()
        self.pending.clear()
        self.out.clear()

    def close(self, *, abort: bool = False) -> None:
        if self.closed or self.transport is None:
            return
        self.closed = True
        for task in list(self.tasks):
            task.cancel()
        if abort:
            self.transport.abort()
        else:
            self._write_out()
            self.transport.close()

    def pause_writing(self) -> None:
        self.writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._update_reading()

    def _update_reading(self) -> None:
        transport = self.transport
        if transport is None or self.closed:
            return
        owed = len(self.pending)
        held = self.pending_bytes
        if not self.reading_paused:
            if self.writing_paused or owed >= MAX_PENDING_REQUESTS or held >= MAX_PENDING_BYTES:
                self.reading_paused = True
                transport.pause_reading()
        elif (
            not self.writing_paused
            and owed <= MAX_PENDING_REQUESTS // 2
            and held <= MAX_PENDING_BYTES // 2
        ):
            self.reading_paused = False
            transport.resume_reading()

    # -- requests in ---------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.metrics["request_bytes"] += len(data)
        decoder = self.decoder
        try:
            decoder.feed(data)
            while (event := decoder.next_event()) is not None:
                self.metrics["requests"] += 1
                if type(event) is UnsupportedRequest:
                    self._unsupported(event)
                else:
                    assert isinstance(event, Request)
                    self._start(event)
                if self.closed:
                    return
        except (KafkaFrameError, MalformedRequestError) as exc:
            self.metrics["malformed_requests"] += 1
            log.warning(
                "kafka: %s (client %r): %s; closing the connection",
                self.connection.peer,
                self.connection.client_id,
                exc,
            )
            self.close(abort=True)
            return
        self._write_out()
        self._update_reading()

    def _unsupported(self, event: UnsupportedRequest) -> None:
        self.metrics["unsupported_requests"] += 1
        reply = encode_unsupported_response(event)
        if reply is None:
            log.warning(
                "kafka: %s (client %r) sent api %d v%d, which this broker does not support; "
                "closing the connection",
                self.connection.peer,
                event.client_id,
                event.api_key,
                event.api_version,
            )
            self.close(abort=True)
            return
        if self.pending:
            self.pending.append(_Slot(None, True, reply))
        else:
            self.out.append(reply)

    def _start(self, request: Request) -> None:
        """Run the request's handler eagerly; queue its response in request order."""
        connection = self.connection
        if request.client_id != connection.client_id:
            connection.client_id = request.client_id
            connection.client = dataclasses.replace(
                connection.client, client_id=request.client_id or ""
            )
        if (
            not connection.login.logged_in
            and request.api_key not in access.BEFORE_LOGIN
            and not access.admit(self.context, connection, request)
        ):
            self.close()
            return
        handler = HANDLERS[request.api_key]
        try:
            started = run_until_first_wait(handler(self.context, connection, request))
        except Exception:
            self._handler_failed(request)
            return
        if not isinstance(started, RestOfCoroutine):
            try:
                reply = self._encode(request, started)
            except Exception:
                self._handler_failed(request)
                return
            if self.pending:
                self.pending.append(_Slot(None, True, reply))
            elif reply is not None:
                self.out.append(reply)
            return
        slot = _Slot(request)
        self.pending.append(slot)
        self.pending_bytes += request.size
        task = asyncio.get_running_loop().create_task(started.finish())
        self.tasks.add(task)
        task.add_done_callback(lambda done: self._finished(slot, done))

    def _encode(self, request: Request, body: Any) -> bytes | None:
        """The response frame: a kio body encoded, or ``bytes`` a handler encoded itself."""
        if body is None or not request.expects_response:
            return None
        reply = body if type(body) is bytes else encode_response(request, body)
        self.metrics["response_bytes"] += len(reply)
        return reply

    def _finished(self, slot: _Slot, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        request = slot.request
        if request is not None:
            self.pending_bytes -= request.size
        if task.cancelled() or self.closed or request is None:
            return
        error = task.exception()
        if error is not None:
            self._handler_failed(request, error)
            return
        try:
            slot.reply = self._encode(request, task.result())
        except Exception as exc:
            self._handler_failed(request, exc)
            return
        slot.ready = True
        pending = self.pending
        while pending and pending[0].ready:
            done = pending.popleft()
            if done.reply is not None:
                self.out.append(done.reply)
        if self.out and not self.flush_scheduled:
            # Responses completed in this loop iteration (one fsync answers many) go together.
            self.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._write_out)
        self._update_reading()

    def _handler_failed(self, request: Request, error: BaseException | None = None) -> None:
        self.metrics["handler_errors"] += 1
        log.error(
            "kafka: %s v%d request from %s failed; closing the connection",
            request.api_key,
            request.api_version,
            self.connection.peer,
            exc_info=error if error is not None else True,
        )
        self.close(abort=True)

    # -- responses out -------------------------------------------------------------------

    def _write_out(self) -> None:
        self.flush_scheduled = False
        out = self.out
        if not out or self.transport is None or self.transport.is_closing():
            return
        if len(out) == 1:
            self.transport.write(out[0])
        else:
            self.transport.write(b"".join(out))
        out.clear()


class KafkaServer:
    """The Kafka protocol listener of a broker (see the module docstring).

    ``advertised_host``/``advertised_port``: the address Metadata and FindCoordinator give
    clients; ``None`` means the address the client connected to, right for loopback and for a
    host reached under one name. ``auto_create_topics``: Metadata creates the topics it is
    asked for (Kafka's ``auto.create.topics.enable``), with ``num_partitions`` partitions
    (``num.partitions``).
    """

    def __init__(
        self,
        api: BrokerAPI,
        *,
        advertised_host: str | None = None,
        advertised_port: int | None = None,
        auto_create_topics: bool = True,
        num_partitions: int = 1,
        max_request_size: int = MAX_REQUEST_SIZE,
    ) -> None:
        if num_partitions < 1:
            raise ValueError("num_partitions must be >= 1")
        self.api = api
        self.settings = KafkaSettings(
            advertised_host=advertised_host,
            advertised_port=advertised_port,
            auto_create_topics=auto_create_topics,
            num_partitions=num_partitions,
        )
        self.max_request_size = max_request_size
        self.metrics: dict[str, int] = dict.fromkeys(METRICS, 0)
        self.connections: set[KafkaConnection] = set()
        self.context: KafkaContext | None = None
        self._server: asyncio.Server | None = None
        self._preload: asyncio.Future[None] | None = None
        self._closed = False

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        # Resolve every request schema in the background (~2 s: kio imports one module per API
        # version), so that the first request of each kind is about as fast as the next without
        # delaying the start; a request that comes first resolves its own schema.
        self._preload = loop.run_in_executor(None, preload_schemas, SUPPORTED_APIS, self._closing)
        api = self.api
        table = MetadataTable(api)
        producer_ids = ProducerIdAllocator(table)
        transactions = TransactionCoordinator(api, table, producer_ids, metrics=self.metrics)
        context = KafkaContext(
            api=api,
            settings=self.settings,
            producer_states=ProducerStates(self._stored_producer_batches),
            producer_ids=producer_ids,
            transactions=transactions,
            metrics=self.metrics,
        )
        self.context = context
        try:
            await transactions.recover()
            self._server = await loop.create_server(
                lambda: KafkaConnection(self, context),
                host,
                port,
                reuse_address=True,
                backlog=LISTEN_BACKLOG,
            )
        except BaseException:
            transactions.close()
            raise

    @property
    def address(self) -> tuple[str, int] | None:
        if self._server is None or not self._server.sockets:
            return None
        sockname = self._server.sockets[0].getsockname()
        return str(sockname[0]), int(sockname[1])

    def _closing(self) -> bool:
        return self._closed

    async def close(self) -> None:
        self._closed = True
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for connection in list(self.connections):
            connection.close(abort=True)
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 5)
        if self.context is not None:
            self.context.transactions.close()
        if self._preload is not None:
            with contextlib.suppress(Exception):
                await self._preload

    def _stored_producer_batches(self, topic: str, partition: int) -> Iterator[TailBatch]:
        """The idempotent batches among the last ``TAIL_ENTRIES`` entries of a partition, oldest
        first: what rebuilds its producer state after a restart (``producers``)."""
        stored = self.api.read_tail_batch_headers(
            topic, partition, max_entries=TAIL_ENTRIES, header_size=BATCH_HEADER_SIZE
        )
        for base_offset, raw_header in stored:
            header = read_batch_header(raw_header)
            if header.producer_id >= 0 and header.base_sequence >= 0:
                yield (
                    header.producer_id,
                    header.producer_epoch,
                    header.base_sequence,
                    last_sequence(header.base_sequence, header.last_offset_delta),
                    base_offset,
                )
