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

I/O batching (ARCHITECTURE.md): every frame of a read is parsed before yielding (the decoder's
``feed`` returns them as a list); responses that become ready in one loop iteration go out in
one ``transport.write``. Reading pauses while the requests still owed a response hold more than
``MAX_PENDING_BYTES`` or number more than ``MAX_PENDING_REQUESTS``, or while the transport's
write buffer is above its high-water mark (``pause_writing``); it resumes once they are back
under half of that. Requests are handled only while the write buffer is under that mark (at most
``[limits] max_outgoing_buffer_bytes``): the rest of a read waits, parked, until the client has
taken its responses, as Kafka mutes a channel until its response is sent, and a client that
stays over it for ``stalled_client_timeout_s`` is dropped (issue 21 item 4).

Idle connections: a connection with no read and no write for ``[limits]
kafka_connections_max_idle_ms`` that owes no response is closed with a log line, as Kafka's
Selector closes one idle for ``connections.max.idle.ms`` (one lazily re-armed timer each).

Errors: a frame with a bad size prefix or a request that does not parse, or a request for an API
or version we do not speak (other than ApiVersions, answered per KIP-511), closes that
connection, with a log line, as the Kafka broker does; nothing else is affected. A handler that
raises is a bug: logged with its traceback, and the connection is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final

from core.api import (
    PROTOCOL_KAFKA,
    BrokerAPI,
    ClientContext,
    Clock,
    LoopClock,
    RestOfCoroutine,
    Timer,
    run_until_first_wait,
)
from gateway.kafka import access, acls, admin, fetch, groups, produce, txn_handlers
from gateway.kafka.apis import SUPPORTED_APIS, ApiKey
from gateway.kafka.codec import (
    MAX_REQUEST_SIZE,
    Event,
    KafkaDecoder,
    Request,
    UnsupportedRequest,
    encode_response,
    encode_unsupported_response,
    preload_schemas,
)
from gateway.kafka.context import Connection, Handler, KafkaContext, KafkaSettings
from gateway.kafka.errors import KafkaFrameError, MalformedRequestError
from gateway.kafka.management import kafka_connection_closed, kafka_connection_opened
from gateway.kafka.producers import (
    TABLE_CONTEXT,
    TAIL_ENTRIES,
    MetadataTable,
    ProducerIdAllocator,
    ProducerStates,
    TailBatch,
    last_sequence,
)
from gateway.kafka.records import BATCH_HEADER_SIZE, read_batch_header
from gateway.kafka.transactions import TransactionCoordinator
from gateway.transport import READING_BUSY, GatewayTransport, TransportLimits, peer_certificate_cn

log = logging.getLogger(__name__)

# Kafka's connections.max.idle.ms default (10 minutes); the listener reads the [limits] setting
# (core/limits/config.py) at start.
DEFAULT_KAFKA_CONNECTIONS_MAX_IDLE_MS: Final = 600_000

# High-water marks of the requests a connection may have in flight (owed a response). librdkafka
# keeps up to 1,000,000 requests in flight (5 per partition when idempotent) and Kafka reads on
# until queued.max.requests (500, whole broker) are queued. A producer with linger.ms=1 at 10k
# records/s has a thousand requests a second in flight while an fsync takes a few ms, so the
# count is generous; the bytes bound memory (Produce requests hold their records until answered).
MAX_PENDING_REQUESTS: Final = 1000
MAX_PENDING_BYTES: Final = 64 * 1024 * 1024
# The read-pause reason of too many requests owed a response.
READING_PENDING: Final = "pending"
# asyncio's default write-buffer marks (64 KiB / 16 KiB), as before the shared transport: a
# consumer's fetch response of more than that pauses reading its next requests until it drains.
TRANSPORT_LIMITS: Final = TransportLimits(write_high_water=64 << 10, write_low_water=16 << 10)
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
    "idle_disconnects",
    "stalled_disconnects",
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


class KafkaConnection(GatewayTransport):
    """One Kafka connection: its requests in order; the buffering, read pausing and closing
    are ``gateway/transport.py``'s."""

    def __init__(self, server: KafkaServer, context: KafkaContext) -> None:
        super().__init__(server.limits, server.clock)
        self.server = server
        self.context = context
        self.metrics = context.metrics
        # Until the client logs in, a request may be at most [limits]
        # kafka_max_request_bytes_before_login (Kafka's sasl.server.max.receive.size), so an
        # anonymous connection cannot make the broker buffer 100 MiB (issue 21 item 5).
        self.decoder = KafkaDecoder(
            max_request_size=min(server.max_request_size, server.max_request_size_before_login)
        )
        # The oversize hook is set once the client has introduced itself (ApiVersions): before
        # that, a request over the cap is refused at its size prefix, without waiting for the
        # api key that may never come.
        self.introduced = False  # an ApiVersions request was answered
        self.incomplete_timeout_s = server.incomplete_request_timeout_s
        self.connection = Connection("?", "", 0)
        self.pending: deque[_Slot] = deque()
        self.pending_bytes = 0  # frame sizes of the requests owed a response
        self.tasks: set[asyncio.Task[Any]] = set()
        self.counted_user = ""  # whom the connection counts for (its login, once logged in)
        # [limits] kafka_connections_max_idle_ms: checked by one timer, re-armed lazily from
        # the last read (``last_read_ms``) or write (the transport's ``last_write_ms``).
        self.idle_timeout_ms = server.connections_max_idle_ms
        self.last_read_ms = self.clock.now_ms()
        self._idle_timer: Timer | None = None
        self.unflushed = 0  # bytes written since the last flush

    # -- connection lifecycle ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
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
        if transport.get_extra_info("ssl_object") is not None:
            # Metadata and FindCoordinator then advertise this (TLS) listener's port.
            self.connection.tls = True
        common_name = peer_certificate_cn(transport)
        if common_name is not None:
            self.connection.login.certificate_user = common_name
        refusal = self.context.api.connection_limit_refusal(client)
        if refusal is not None:  # closed at once, as Kafka past max.connections.per.ip
            log.warning("kafka: %s: %s; closing the connection", peer_text, refusal.text)
            self.close(abort=True)
            return
        self.server.connections.add(self)
        kafka_connection_opened(self.context.api, self)  # shown in /api/connections
        self._idle_timer = self.clock.call_later(self.idle_timeout_ms, self._check_idle)
        # [limits] max_outgoing_buffer_bytes lowers the write high-water mark where smaller
        # (at least 64 KiB, Kafka's own mark: it never is); stalled_client_timeout_s above it
        # drops the connection (gateway/transport.py).
        self.bound_outgoing(*self.context.api.outgoing_buffer_limits(client))
        self.metrics["connections_opened"] += 1
        if not self.context.api.may_accept_connection():  # near the descriptor limit
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self.server.connections.discard(self)
        kafka_connection_closed(self.context.api, self)
        self.metrics["connections_closed"] += 1
        for task in list(self.tasks):
            task.cancel()
        self.pending.clear()

    def close(self, *, abort: bool = False) -> None:
        if self.closed or self.transport is None:
            return
        for task in list(self.tasks):
            task.cancel()
        if abort:
            self.abort()
        else:
            super().close()

    def _count_login(self) -> bool:
        """The client logged in (SASL, certificate or anonymous): count the connection for
        its user, or close it past the user's ``max-connections`` (core/api/limits.py)."""
        client = self.connection.client
        self.counted_user = client.user
        refusal = self.context.api.login_connection_limit_refusal(client)
        if refusal is not None:
            peer = self.connection.peer
            log.warning("kafka: %s: %s; closing the connection", peer, refusal.text)
            self.close()
            return False
        kafka_connection_opened(self.context.api, self)  # again: now as that user
        return True

    def _check_idle(self) -> None:
        """Close the connection once it has gone ``idle_timeout_ms`` without a read or a write
        and owes no response, as Kafka's Selector closes a channel idle for
        ``connections.max.idle.ms`` (a long-poll fetch or a commit waiting for its fsync owes
        one; the client is then waiting on us, not idle)."""
        self._idle_timer = None
        if self.closed:
            return
        now = self.clock.now_ms()
        if self.pending:
            self.last_read_ms = now  # idle from when the last response goes, at the earliest
        due = max(self.last_read_ms, self.last_write_ms) + self.idle_timeout_ms
        if now < due:
            self._idle_timer = self.clock.call_later(due - now, self._check_idle)
            return
        self.metrics["idle_disconnects"] += 1
        log.info(
            "kafka: %s (client %r): no request for %d ms ([limits] "
            "kafka_connections_max_idle_ms, Kafka's connections.max.idle.ms); closing the "
            "idle connection",
            self.connection.peer,
            self.connection.client_id,
            now - max(self.last_read_ms, self.last_write_ms),
        )
        self.close()

    def _update_reading(self) -> None:
        """Pause reading while the requests owed a response are too many or too large; resume
        once they are back under half of that."""
        owed = len(self.pending)
        held = self.pending_bytes
        if owed >= MAX_PENDING_REQUESTS or held >= MAX_PENDING_BYTES:
            self.pause_reading(READING_PENDING)
        elif owed <= MAX_PENDING_REQUESTS // 2 and held <= MAX_PENDING_BYTES // 2:
            self.resume_reading(READING_PENDING)

    # -- requests in ---------------------------------------------------------------------

    def received(self, data: bytes) -> None:
        if self.closed:
            return
        self.metrics["request_bytes"] += len(data)
        self.last_read_ms = self.clock.now_ms()
        try:
            events = self.decoder.feed(data)
        except (KafkaFrameError, MalformedRequestError) as exc:
            self._refuse(exc)
            return
        if not self.park_more(events):  # (parked: these wait behind the parked ones)
            self._handle(events, 0)

    def _handle(self, events: list[Event], start: int) -> bool:
        """Handle ``events[start:]``, then what the decoder held back for after them (a frame
        over the size cap that they may have lifted, or the error of a bad frame). False when
        it stopped: the connection closed, or the rest parked because the client does not take
        the responses (the transport's write buffer went over its high-water mark, at most
        ``[limits] max_outgoing_buffer_bytes``), as Kafka mutes a channel until its response
        is sent: one read of pipelined Fetch requests is otherwise answered in full, 178 MB of
        responses for 2,000 fetches (tests/kafka/test_limits_outgoing.py)."""
        decoder = self.decoder
        completed = bool(events)
        while events:
            for index in range(start, len(events)):
                event = events[index]
                self.metrics["requests"] += 1
                if type(event) is UnsupportedRequest:
                    self._unsupported(event)
                else:
                    assert isinstance(event, Request)
                    self._start(event)
                if self.closed:
                    return False
                if event.api_key == ApiKey.API_VERSIONS and not self.introduced:
                    self.introduced = True
                    decoder.oversize = self._oversize_before_login
                if decoder.max_request_size < self.server.max_request_size:
                    self._after_login_size()
                if self.unflushed >= self.limits.write_high_water:
                    self.flush()  # transport.write calls pause_writing if the client lags
                    if self.writing_paused:
                        self.park(events, index + 1)
                        return False
            start = 0
            try:
                events = decoder.feed(b"")
            except (KafkaFrameError, MalformedRequestError) as exc:
                self._refuse(exc)
                return False
        self.track_incomplete(decoder.buffered, completed)
        self._update_reading()  # (what the read wrote is flushed when it returns)
        return True

    def _refuse(self, exc: KafkaFrameError | MalformedRequestError) -> None:
        """A frame with a bad size prefix or a request that does not parse: close, as Kafka."""
        self.metrics["malformed_requests"] += 1
        before_login = ""
        if not self.connection.login.logged_in and isinstance(exc, KafkaFrameError):
            before_login = " before login ([limits] kafka_max_request_bytes_before_login)"
        log.warning(
            "kafka: %s (client %r): %s%s; closing the connection",
            self.connection.peer,
            self.connection.client_id,
            exc,
            before_login,
        )
        self.close(abort=True)

    # -- responses out -------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        self.unflushed += len(data)
        super().write(data)

    def flush(self) -> None:
        self.unflushed = 0
        super().flush()

    def resume_writing(self) -> None:
        """The client took its responses: handle the requests parked meanwhile."""
        parked = self.take_parked()
        super().resume_writing()
        if parked is not None and self._handle(*parked):
            self.resume_reading(READING_BUSY)

    def stalled(self) -> None:
        self.metrics["stalled_disconnects"] += 1
        self.close(abort=True)

    def _oversize_before_login(self, api_key: int) -> None:
        """A request over the before-login cap: once the client has introduced itself with
        ApiVersions, a request other than ApiVersions/SASL logs it in (by certificate or as
        anonymous, as it would when handled) and is read up to the listener's cap. librdkafka's
        first request on a broker connection after ApiVersions may be a Produce of up to its
        message.max.bytes (1,000,000): refused at the prefix, it was retried on a new connection
        forever and the producer never got an acknowledgement. A raw oversize first request, or
        one during or after a failed SASL exchange, is still refused at its size prefix."""
        connection = self.connection
        if (
            self.introduced
            and not connection.login.logged_in
            and api_key not in access.BEFORE_LOGIN
            and access.admit(self.context, connection, api_key)
        ):
            self.decoder.max_request_size = self.server.max_request_size

    def _after_login_size(self) -> None:
        """Once logged in, a request may be as large as the listener allows."""
        if self.connection.login.logged_in:
            self.decoder.max_request_size = self.server.max_request_size

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
            self.write(reply)

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
            and not access.admit(self.context, connection, request.api_key)
        ):
            self.close()
            return
        if connection.client.user != self.counted_user and not self._count_login():
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
                self.write(reply)
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
        # Responses completed in this loop iteration (one fsync answers many) go together:
        # write() flushes once at the end of the iteration.
        while pending and pending[0].ready:
            done = pending.popleft()
            if done.reply is not None:
                self.write(done.reply)
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
        limits: TransportLimits = TRANSPORT_LIMITS,
        clock: Clock | None = None,
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
        # [limits] kafka_max_request_bytes_before_login and incomplete_request_timeout_s, read
        # at start (the limits service is configured by then).
        self.max_request_size_before_login = max_request_size
        self.incomplete_request_timeout_s: float | None = None
        # [limits] kafka_connections_max_idle_ms, read at start.
        self.connections_max_idle_ms: float = DEFAULT_KAFKA_CONNECTIONS_MAX_IDLE_MS
        self.limits = limits
        self.clock: Clock = clock if clock is not None else LoopClock()
        self.metrics: dict[str, int] = dict.fromkeys(METRICS, 0)
        self.connections: set[KafkaConnection] = set()
        self.context: KafkaContext | None = None
        self._server: asyncio.Server | None = None
        self._preload: asyncio.Future[None] | None = None
        self._closed = False

    async def start(
        self,
        host: str,
        port: int,
        listen: Callable[[Callable[[], asyncio.BaseProtocol], str, int], Awaitable[asyncio.Server]]
        | None = None,
    ) -> None:
        """Listen on ``host:port``, by ``listen(protocol factory, host, port)`` when given: Kafka
        over TLS (SSL / SASL_SSL) on its own listens through braid/tls.py, which audits failed
        handshakes (a TLS listener beside the plain one serves this server's connections)."""
        loop = asyncio.get_running_loop()
        # Resolve every request schema in the background (~2 s: kio imports one module per API
        # version), so that the first request of each kind is about as fast as the next without
        # delaying the start; a request that comes first resolves its own schema.
        self._preload = loop.run_in_executor(None, preload_schemas, SUPPORTED_APIS, self._closing)
        api = self.api
        before_login, incomplete_timeout_s = api.incomplete_request_limits(
            ClientContext(PROTOCOL_KAFKA, connection_id="kafka-listener")
        )
        self.max_request_size_before_login = before_login
        self.incomplete_request_timeout_s = incomplete_timeout_s
        self.connections_max_idle_ms = api.kafka_connections_max_idle_ms(
            ClientContext(PROTOCOL_KAFKA, connection_id="kafka-listener")
        )
        table = MetadataTable(api)
        producer_ids = ProducerIdAllocator(
            table, functools.partial(api.producer_id_block, TABLE_CONTEXT)
        )
        transactions = TransactionCoordinator(
            api, table, producer_ids, metrics=self.metrics, clock=self.clock
        )
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
            if listen is not None:
                self._server = await listen(lambda: KafkaConnection(self, context), host, port)
            else:
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
