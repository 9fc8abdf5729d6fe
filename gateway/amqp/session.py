"""One AMQP connection's state machine: handshake, channels, heartbeats, confirms, closing.

The transport (server.py) feeds it bytes and gives it a ``SessionIO`` to write to; everything
else happens here, in the order frames arrive:

    state        accepts on channel 0                 then
    -----------  -----------------------------------  --------------------------------------
    header       the protocol header                  Connection.Start  -> start_ok
    start_ok     Connection.Start-Ok                  Connection.Tune   -> tune_ok
    tune_ok      Connection.Tune-Ok                   -> open
    open         Connection.Open                      Connection.Open-Ok -> opened
    opened       Connection.Close, Update-Secret;     channels work
                 any method on channels 1..max
    closing      Connection.Close(-Ok) only           (the server sent Connection.Close)
    closed       nothing

Anything missing from the table is a connection error (504 CHANNEL_ERROR, as RabbitMQ's
``handle_method0`` "unexpected method in connection state"). A channel error closes only its
channel: the server sends Channel.Close and ignores the channel's frames until Close-Ok; a
connection error sends Connection.Close and waits (bounded) for Close-Ok. Both are logged.

Frames are handled synchronously; a handler that must wait (a flow-blocked publish, a tx.commit
waiting for the disk) returns an awaitable, and the session stops reading and parks the rest of
the frames until it is done. A read holding many publishes is handled ``PUBLISH_SLICE`` publishes
per loop iteration (parked in between), so one fast publisher cannot starve the acks and
deliveries of other connections. Publisher confirms: the publishes of one slice are appended at
once, then one durability wait covers them all; confirms go out in order, ``multiple`` when
several. At the end of a slice the queues it acked in are pumped, so the deliveries the acks made
room for leave in the same write as the read's replies.

A client that does not read (issue 21 item 4): deliveries to the connection's consumers stop
(``stop_deliveries``: their subscriptions paused, whatever their prefetch or no-ack) once its
buffered bytes reach ``outgoing_bound`` (``[limits] max_outgoing_buffer_bytes``): the transport's
``pause_writing``, or the deliveries written in this loop iteration on top of the transport's
buffer (a queue's pump would write a whole backlog in one iteration). The messages stay in their
queues; deliveries resume when the buffer drains (``outgoing_drained``). Direct reply-to replies
have no queue to stay in: while deliveries are stopped they are dropped and counted
(``reply_dropped``: ``replies_dropped``, and a log line at most every ``REPLY_DROP_LOG_S`` per
connection); the responder's publish is confirmed all the same, as RabbitMQ's.
"""

from __future__ import annotations

import asyncio
import logging
import platform
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from pamqp import base, commands

from core.api import (
    PROTOCOL_AMQP,
    BrokerAPI,
    ClientContext,
    Clock,
    Settlements,
    ShardUnavailable,
    Timer,
)
from gateway.amqp.auth import Access, log_in, mechanisms_offered
from gateway.amqp.channel import Channel
from gateway.amqp.codec import AmqpDecoder, encode_ack, encode_heartbeat, encode_method, encode_nack
from gateway.amqp.constants import (
    ACCESS_REFUSED,
    CHANNEL_ERROR,
    COMMAND_INVALID,
    DEFAULT_FRAME_MAX,
    FRAME_MIN_SIZE,
    INDEX_BASIC_ACK,
    INDEX_BASIC_NACK,
    INDEX_BASIC_PUBLISH,
    INDEX_BASIC_REJECT,
    INTERNAL_ERROR,
    NOT_ALLOWED,
    UNEXPECTED_FRAME,
)
from gateway.amqp.consumer import resume_channel_deliveries, stop_channel_deliveries
from gateway.amqp.errors import AmqpChannelError, AmqpConnectionError, AmqpError
from gateway.amqp.events import (
    Ack,
    AmqpEvent,
    BadProtocolHeader,
    Heartbeat,
    Method,
    Nack,
    ProtocolHeader,
    Publish,
    Reject,
)
from gateway.amqp.management import amqp_connection_closed, amqp_connection_opened
from gateway.amqp.vhost import VirtualHost
from gateway.transport import READING_BUSY, peer_certificate_cn

log = logging.getLogger(__name__)

__all__ = ["Session", "SessionIO", "SessionSettings"]

# RabbitMQ's defaults (rabbit.app): channel_max 2047, heartbeat 60 s, handshake_timeout 10 s.
DEFAULT_CHANNEL_MAX: Final = 2047
DEFAULT_HEARTBEAT_S: Final = 60
HANDSHAKE_TIMEOUT_S: Final = 10.0
# How long the server waits for Connection.Close-Ok after sending Connection.Close
# (RabbitMQ's ?CLOSING_TIMEOUT is 30 s; a client that answers does so at once).
CLOSE_OK_TIMEOUT_S: Final = 10.0
# Publishes handled per turn of a connection: a read holding more is handled in slices, one per
# loop iteration, so the acks and deliveries of other connections are not kept waiting behind
# it (a consumer's deliveries would otherwise fall ever further behind a fast publisher).
PUBLISH_SLICE: Final = 64
# A client is gone when nothing arrived for this many heartbeat intervals (rabbit_heartbeat).
HEARTBEAT_MISSES: Final = 2
# A requester that does not read has every reply to it dropped: one log line per this many
# seconds per connection says how many (the counter has them all).
REPLY_DROP_LOG_S: Final = 10.0

HEADER, START_OK, TUNE_OK, OPEN, OPENED, CLOSING, CLOSED = (
    "header",
    "start_ok",
    "tune_ok",
    "open",
    "opened",
    "closing",
    "closed",
)

# What RabbitMQ 3.x advertises (rabbit_reader:server_capabilities), less consumer priorities.
SERVER_CAPABILITIES: Final = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": True,
}


def _product_version() -> str:
    try:
        from importlib.metadata import version

        return version("braidmq")
    except Exception:
        return "0"


# A user's permissions naming this may open every vhost (BraidMQ's, not RabbitMQ's).
ANY_VHOST: Final = "*"


@dataclass
class SessionSettings:
    # Logins and permissions come from the broker's one user store (Broker API, auth.py).
    # ``users`` (name: password), with the vhosts ``permissions`` gives each, are brought into
    # that store when the listener starts (a missing user is created, a vhost without a
    # permission for it gets ".*" for all three; nothing stored is overwritten), as braid serve
    # brings the config file's [amqp.users]. None: the store alone (braid serve).
    users: Mapping[str, str] | None = None
    vhosts: tuple[str, ...] = ("/",)
    # user -> the vhosts it may open (``"*"``: all). None: every user may open every vhost.
    # RabbitMQ's default: guest may use "/".
    permissions: Mapping[str, Collection[str]] | None = field(
        default_factory=lambda: {"guest": ("/",)}
    )
    frame_max: int = DEFAULT_FRAME_MAX
    channel_max: int = DEFAULT_CHANNEL_MAX
    heartbeat: int = DEFAULT_HEARTBEAT_S
    server_properties: dict[str, Any] = field(
        default_factory=lambda: {
            "product": "BraidMQ",
            "version": _product_version(),
            "platform": f"Python {platform.python_version()}",
            "copyright": "BraidMQ contributors",
            "information": "Licensed under the Apache License 2.0",
            "cluster_name": f"braid@{platform.node()}",
            "capabilities": dict(SERVER_CAPABILITIES),
        }
    )

    def may_open(self, user: str, vhost: str) -> bool:
        """Whether these settings give ``user`` access to ``vhost`` (brought into the store)."""
        return vhost in self.vhosts_of(user) or ANY_VHOST in self.vhosts_of(user)

    def vhosts_of(self, user: str) -> Collection[str]:
        """The vhosts these settings let ``user`` open (``"*"``: all)."""
        if self.permissions is None:
            return (ANY_VHOST,)
        return self.permissions.get(user, ())

    def users_to_import(self) -> dict[str, tuple[str, Collection[str]]]:
        """``users`` with their vhosts, as :meth:`BrokerAPI.import_users` takes them."""
        return {name: (pw, self.vhosts_of(name)) for name, pw in (self.users or {}).items()}


class SessionIO(Protocol):
    """What a session needs of its transport (server.py's ``AmqpConnection``, a
    ``gateway/transport.py:GatewayTransport``)."""

    peer: str
    clock: Clock  # the heartbeat, handshake and Close-Ok timers
    last_write_ms: float

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...  # flush what was written, then close

    def abort(self) -> None: ...

    def park(self, events: list[Any], start: int) -> None: ...

    def park_more(self, events: list[Any]) -> bool: ...

    def take_parked(self) -> tuple[list[Any], int] | None: ...

    def wait_for(
        self,
        waiting: Awaitable[None],
        then: Callable[[], None],
        failed: Callable[[BaseException], None],
    ) -> None: ...

    def resume_reading(self, reason: str) -> None: ...


class _ConfirmBatch:
    """The confirms one channel owes for one read's worth of publishes."""

    __slots__ = ("all_nacked", "channel", "high", "marks", "nacks", "refusals")

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.high = 0
        self.nacks: list[int] = []
        # (seq, durable mark) of each publish with one: the group waits for the highest mark
        # only, which does not say whether an earlier publish's forward failed.
        self.marks: list[tuple[int, int]] = []
        # (seq, the publish's outcome.refused) of each publish forwarded to another node's
        # shard: that owner's refusal (reject-publish) fills the list when its forward is
        # answered, which the group's durability wait waits for.
        self.refusals: list[tuple[int, Collection[object]]] = []
        # Every publish of the batch nacked: a shard it reached on another node was
        # unavailable (docs/cluster.md section 8: basic.nack).
        self.all_nacked = False


class _ConfirmGroup:
    __slots__ = ("batches", "ready")

    def __init__(self, batches: list[_ConfirmBatch]) -> None:
        self.batches = batches
        self.ready = False


Handler = Callable[[Channel, Any], Awaitable[None] | None]


# Channel methods (channels 1..max) -> handler; anything else is 503 COMMAND_INVALID.
CHANNEL_HANDLERS: Final[dict[type[base.Frame], Handler]] = {
    commands.Exchange.Declare: Channel.exchange_declare,
    commands.Exchange.Delete: Channel.exchange_delete,
    commands.Exchange.Bind: Channel.exchange_bind,
    commands.Exchange.Unbind: Channel.exchange_unbind,
    commands.Queue.Declare: Channel.queue_declare,
    commands.Queue.Bind: Channel.queue_bind,
    commands.Queue.Unbind: Channel.queue_unbind,
    commands.Queue.Purge: Channel.queue_purge,
    commands.Queue.Delete: Channel.queue_delete,
    commands.Basic.Qos: Channel.basic_qos,
    commands.Basic.Consume: Channel.basic_consume,
    commands.Basic.Cancel: Channel.basic_cancel,
    commands.Basic.Get: Channel.basic_get,
    commands.Basic.Recover: Channel.basic_recover,
    commands.Basic.RecoverAsync: Channel.basic_recover_async,
    commands.Basic.Ack: lambda ch, m: ch.basic_ack(m.delivery_tag, m.multiple),
    commands.Basic.Nack: lambda ch, m: ch.basic_nack(m.delivery_tag, m.multiple, m.requeue),
    commands.Basic.Reject: lambda ch, m: ch.basic_nack(m.delivery_tag, False, m.requeue),
    commands.Channel.Flow: Channel.channel_flow,
    commands.Channel.FlowOk: lambda ch, m: None,
    commands.Confirm.Select: Channel.confirm_select,
    commands.Tx.Select: lambda ch, m: ch.tx_select(),
    commands.Tx.Commit: lambda ch, m: ch.tx_commit(),
    commands.Tx.Rollback: lambda ch, m: ch.tx_rollback(),
}


class Session:
    def __init__(
        self,
        io: SessionIO,
        api: BrokerAPI,
        vhosts: Mapping[str, VirtualHost],
        settings: SessionSettings,
        metrics: dict[str, int],
        *,
        blocked: Callable[[], str | None] = lambda: None,
        outgoing_bound: int = 1 << 62,
    ) -> None:
        self.io = io
        self.write: Callable[[bytes], None] = io.write
        self.vhosts = vhosts  # name -> VirtualHost: the server's vhosts
        self.vhost: VirtualHost | None = None  # the one Connection.Open chose
        self.api = api
        self.settings = settings
        self.metrics = metrics
        self._blocked = blocked  # the broker's flow-control reason while blocked
        self.peer = io.peer
        self.loop = asyncio.get_running_loop()
        # The largest body: [limits] max_message_size (RabbitMQ's, 128 MiB by default).
        self.decoder = AmqpDecoder(
            max_message_size=api.max_message_size(ClientContext(PROTOCOL_AMQP, peer=io.peer))
        )
        self.state = HEADER
        self.user = ""
        # A TLS connection's verified client certificate: its CN is the user EXTERNAL logs in.
        transport = getattr(io, "transport", None)
        self.certificate_user = peer_certificate_cn(transport) if transport is not None else None
        self.access: Access | None = None  # the permission checks, from Connection.Open on
        self.client_name = ""
        self.client_properties: dict[str, Any] = {}
        # Who calls the Broker API for this connection (complete once Connection.Open chose
        # the vhost; until then no call is made for it).
        self.context = ClientContext(PROTOCOL_AMQP, peer=self.peer, connection_id=self.peer)
        self.capabilities: dict[str, Any] = {}
        self.frame_max = FRAME_MIN_SIZE
        self.channel_max = settings.channel_max
        self.heartbeat = 0
        self.channels: dict[int, Channel] = {}
        self.closing_channels: set[int] = set()
        self.clock = io.clock
        self.last_received_ms = self.clock.now_ms()
        self._current_channel = 0
        self._current_index = 0
        # Where the handler that is waiting was (io.wait_for), for the error it may raise.
        self._waiting_at = (0, 0)
        # Acks and nacks of this connection's deliveries; the queues they made room in deliver
        # at the end of the read, so those deliveries leave with the read's replies (not a
        # loop iteration later).
        self.settlements = Settlements()
        # The outgoing bound (module docstring): the bytes deliveries may still write before the
        # next flush (the bound less the transport's buffer at the last one), and whether
        # deliveries are stopped.
        self.outgoing_bound = outgoing_bound
        self.outgoing_room = outgoing_bound
        self.deliveries_stopped = False
        # Direct replies dropped since the last log line, and when that line was written.
        self._replies_dropped = 0
        self._reply_drop_logged_ms: float | None = None
        self._confirms: dict[Channel, _ConfirmBatch] = {}
        self._confirm_end = 0
        self._confirm_groups: deque[_ConfirmGroup] = deque()
        self._confirm_tasks: set[asyncio.Task[None]] = set()
        self._confirm_flush_scheduled = False
        self._timer: Timer | None = self.clock.call_later(
            HANDSHAKE_TIMEOUT_S * 1000, self._handshake_timeout
        )
        self.metrics["connections_opened"] += 1

    # -- input -------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self.last_received_ms = self.clock.now_ms()
        events = self.decoder.feed(data)
        if not events:
            return
        if self.io.park_more(events):  # (reading is paused; only a read already under way)
            return
        self._run(events, 0)

    def _run(self, events: list[AmqpEvent], start: int) -> None:
        """Handle ``events[start:]`` in order. Stops early, parking the rest with reading
        paused, when a handler must wait (resumed by a task) or after ``PUBLISH_SLICE``
        publishes (resumed at the next loop iteration, so other connections' acks and
        deliveries get their turn between the slices of a big read)."""
        step = self._step
        budget = PUBLISH_SLICE
        count = len(events)
        i = start
        while i < count:
            event = events[i]
            i += 1
            pending = step(event)
            if pending is not None:
                self._end_of_run()
                self.io.park(events, i)
                self._waiting_at = (self._current_channel, self._current_index)
                self.io.wait_for(pending, self._unpark, self._handler_failed)
                return
            if type(event) is Publish:
                budget -= 1
                if not budget and i < count:
                    self._end_of_run()
                    self.io.park(events, i)
                    self.loop.call_soon(self._unpark)
                    return
        self._end_of_run()
        if self.state != CLOSED:
            self.io.resume_reading(READING_BUSY)

    def _unpark(self) -> None:
        parked = self.io.take_parked()
        if parked is not None and self.state != CLOSED:
            self._run(*parked)

    def _step(self, event: AmqpEvent) -> Awaitable[None] | None:
        """Handle one event; errors become Channel.Close / Connection.Close."""
        try:
            return self._dispatch(event)
        except AmqpChannelError as error:
            self._channel_error(error)
        except AmqpConnectionError as error:
            self._connection_error(error)
        except Exception:
            log.exception("amqp %s: internal error handling %r", self.peer, event)
            self._connection_error(
                AmqpConnectionError(INTERNAL_ERROR, "INTERNAL_ERROR - see the broker log")
            )
        return None

    def _handler_failed(self, error: BaseException) -> None:
        """A handler that had to wait raised: the error is its channel's or connection's (the
        parked events go on after it, as after an error of a handler that did not wait)."""
        if isinstance(error, AmqpChannelError):
            self._current_channel, self._current_index = self._waiting_at
            self._channel_error(error)
        elif isinstance(error, AmqpConnectionError):
            self._current_channel, self._current_index = self._waiting_at
            self._connection_error(error)
        else:
            log.error("amqp %s: internal error", self.peer, exc_info=error)
            self._connection_error(
                AmqpConnectionError(INTERNAL_ERROR, "INTERNAL_ERROR - see the broker log")
            )

    def _dispatch(self, event: AmqpEvent) -> Awaitable[None] | None:
        kind = type(event)
        if kind is Publish:
            assert isinstance(event, Publish)
            channel = self._channel_for(event.channel, INDEX_BASIC_PUBLISH)
            return None if channel is None else channel.basic_publish(event)
        if kind is Ack:
            assert isinstance(event, Ack)
            channel = self._channel_for(event.channel, INDEX_BASIC_ACK)
            if channel is not None:
                channel.basic_ack(event.delivery_tag, event.multiple)
            return None
        if kind is Method:
            assert isinstance(event, Method)
            return self._method(event.channel, event.method)
        if kind is Nack:
            assert isinstance(event, Nack)
            channel = self._channel_for(event.channel, INDEX_BASIC_NACK)
            if channel is not None:
                channel.basic_nack(event.delivery_tag, event.multiple, event.requeue)
            return None
        if kind is Reject:
            assert isinstance(event, Reject)
            channel = self._channel_for(event.channel, INDEX_BASIC_REJECT)
            if channel is not None:
                channel.basic_nack(event.delivery_tag, False, event.requeue)
            return None
        if kind is Heartbeat:
            return None
        if kind is ProtocolHeader:
            self._send_start()
            return None
        if kind is BadProtocolHeader:
            assert isinstance(event, BadProtocolHeader)
            log.warning("amqp %s: not an AMQP 0-9-1 client (header %r)", self.peer, event.received)
            self.io.write(event.reply)
            self._finish()
            return None
        if isinstance(event, AmqpError):
            raise event
        raise AmqpConnectionError(INTERNAL_ERROR, f"INTERNAL_ERROR - unexpected event {event!r}")

    def _channel_for(self, number: int, index: int) -> Channel | None:
        """The open channel a content or ack frame is for; None if it is closing (ignored)."""
        self._current_channel, self._current_index = number, index
        channel = self.channels.get(number)
        if channel is not None:
            return channel
        if number in self.closing_channels or self.state in (CLOSING, CLOSED):
            return None
        if self.state != OPENED:
            raise AmqpConnectionError(
                UNEXPECTED_FRAME, f"UNEXPECTED_FRAME - frame on channel {number} before open"
            )
        raise AmqpConnectionError(CHANNEL_ERROR, "CHANNEL_ERROR - expected 'channel.open'")

    # -- methods -----------------------------------------------------------------------------

    def _method(self, number: int, method: base.Frame) -> Awaitable[None] | None:
        self._current_channel, self._current_index = number, method.index
        kind = type(method)
        if number == 0:
            return self._connection_method(method)
        if self.state != OPENED:
            if self.state in (CLOSING, CLOSED):
                return None
            raise AmqpConnectionError(
                UNEXPECTED_FRAME, f"UNEXPECTED_FRAME - {method.name} before connection.open"
            )
        if kind is commands.Channel.Open:
            self._channel_open(number)
            return None
        channel = self.channels.get(number)
        if channel is None:
            if number in self.closing_channels:
                if kind is commands.Channel.Close:
                    self.io.write(encode_method(number, commands.Channel.CloseOk()))
                elif kind is commands.Channel.CloseOk:
                    self.closing_channels.discard(number)
                return None
            raise AmqpConnectionError(CHANNEL_ERROR, "CHANNEL_ERROR - expected 'channel.open'")
        if kind is commands.Channel.Close:
            del self.channels[number]
            channel.cleanup()
            self.io.write(encode_method(number, commands.Channel.CloseOk()))
            self.metrics["channels_closed"] += 1
            return None
        if kind is commands.Channel.CloseOk:
            return None
        handler = CHANNEL_HANDLERS.get(kind)
        if handler is None:
            raise AmqpConnectionError(
                COMMAND_INVALID, f"COMMAND_INVALID - unexpected {method.name}"
            )
        return handler(channel, method)

    def _channel_open(self, number: int) -> None:
        if number in self.channels:
            raise AmqpConnectionError(CHANNEL_ERROR, "CHANNEL_ERROR - second 'channel.open' seen")
        if number in self.closing_channels:
            return  # reused before Close-Ok: RabbitMQ ignores frames of a closing channel
        # channel_max limits how many channels are open at once, not their numbers: any of
        # 1-65535 may be opened (RabbitMQ's rabbit_reader:create_channel compares its channel
        # count; aiormq's test_bad_channel opens 65535 right after Tune).
        if self.channel_max and len(self.channels) >= self.channel_max:  # 0: no limit
            raise AmqpConnectionError(
                NOT_ALLOWED,
                f"NOT_ALLOWED - number of channels opened ({len(self.channels)}) has reached "
                f"the negotiated channel_max ({self.channel_max})",
            )
        self.channels[number] = Channel(self, number)
        self.metrics["channels_opened"] += 1
        self.io.write(encode_method(number, commands.Channel.OpenOk()))

    def _connection_method(self, method: base.Frame) -> Awaitable[None] | None:
        kind = type(method)
        state = self.state
        if kind is commands.Connection.Close:
            self._client_close(method)
        elif kind is commands.Connection.CloseOk:
            if state == CLOSING:
                self._finish()
        elif state in (CLOSING, CLOSED):
            return None
        elif kind is commands.Connection.StartOk and state == START_OK:
            assert isinstance(method, commands.Connection.StartOk)
            return self._start_ok(method)
        elif kind is commands.Connection.TuneOk and state == TUNE_OK:
            assert isinstance(method, commands.Connection.TuneOk)
            self._tune_ok(method)
        elif kind is commands.Connection.Open and state == OPEN:
            assert isinstance(method, commands.Connection.Open)
            self._open(method)
        elif kind is commands.Connection.UpdateSecret and state == OPENED:
            self.io.write(encode_method(0, commands.Connection.UpdateSecretOk()))
        else:
            raise AmqpConnectionError(
                CHANNEL_ERROR,
                f"CHANNEL_ERROR - unexpected method {method.name} in connection state {state}",
            )
        return None

    def _send_start(self) -> None:
        self.io.write(
            encode_method(
                0,
                commands.Connection.Start(
                    0,
                    9,
                    self.settings.server_properties,
                    mechanisms_offered(self.certificate_user),
                    "en_US",
                ),
            )
        )
        self.state = START_OK

    def _start_ok(self, method: commands.Connection.StartOk) -> Awaitable[None]:
        self.client_properties = dict(method.client_properties or {})
        capabilities = self.client_properties.get("capabilities")
        self.capabilities = dict(capabilities) if isinstance(capabilities, dict) else {}
        name = self.client_properties.get("connection_name")
        product = self.client_properties.get("product")
        self.client_name = str(name or product or "")[:255]
        response = method.response
        raw = response.encode("utf-8", "surrogateescape") if isinstance(response, str) else response
        # The user store decides (auth.py); the password check may wait (the host's login
        # slow-down, argon2 in a thread): the frames after Start-Ok wait with it.
        return self._log_in(method.mechanism, bytes(raw))

    async def _log_in(self, mechanism: str, response: bytes) -> None:
        result = await log_in(self.api, self.context, mechanism, response, self.certificate_user)
        if self.state != START_OK:  # closed while the password was checked
            return
        if not result.ok:
            # rabbit_reader:auth_fail: the reason goes to the log (the core's audit line);
            # the client learns only that the login was refused, and only if it said it can
            # take a Connection.Close (authentication_failure_close), else the socket closes.
            self.metrics["logins_refused"] += 1
            log.warning(
                "amqp %s: login refused for user %r (mechanism %s): %s",
                self.peer,
                result.user,
                mechanism,
                result.reason,
            )
            if self.capabilities.get("authentication_failure_close"):
                raise AmqpConnectionError(
                    ACCESS_REFUSED,
                    f"ACCESS_REFUSED - Login was refused using authentication mechanism "
                    f"{mechanism}. For details see the broker logfile.",
                )
            self._finish()
            return
        self.user = result.user
        self.io.write(
            encode_method(
                0,
                commands.Connection.Tune(
                    self.settings.channel_max, self.settings.frame_max, self.settings.heartbeat
                ),
            )
        )
        self.state = TUNE_OK

    def _tune_ok(self, method: commands.Connection.TuneOk) -> None:
        frame_max = method.frame_max or self.settings.frame_max
        if frame_max < FRAME_MIN_SIZE:
            raise AmqpConnectionError(
                NOT_ALLOWED, f"NOT_ALLOWED - frame_max={frame_max} < {FRAME_MIN_SIZE} min size"
            )
        if frame_max > self.settings.frame_max:
            raise AmqpConnectionError(
                NOT_ALLOWED,
                f"NOT_ALLOWED - frame_max={frame_max} > {self.settings.frame_max} max size",
            )
        self.frame_max = frame_max
        self.decoder.frame_max = frame_max
        channel_max = method.channel_max or self.settings.channel_max
        self.channel_max = min(channel_max, self.settings.channel_max)
        self.heartbeat = method.heartbeat
        self.state = OPEN

    def _open(self, method: commands.Connection.Open) -> None:
        # rabbit_access_control:check_vhost_access: first the vhost must exist, then the user
        # must have permissions on it; both are 530 NOT_ALLOWED with these texts.
        name = method.virtual_host
        vhost = self.vhosts.get(name)
        if vhost is None:
            raise AmqpConnectionError(NOT_ALLOWED, f"NOT_ALLOWED - vhost {name} not found")
        context = ClientContext(
            PROTOCOL_AMQP,
            name,
            self.user,
            self.peer,
            connection_id=self.peer,
            client_id=self.client_name,
        )
        refusal = self.api.connection_limit_refusal(context)  # before access, as RabbitMQ
        if refusal is not None:
            raise AmqpConnectionError(NOT_ALLOWED, f"NOT_ALLOWED - {refusal.text}")
        if not self.api.may_open_vhost(context, name):  # any permission there, as RabbitMQ
            raise AmqpConnectionError(
                NOT_ALLOWED,
                f"NOT_ALLOWED - access to vhost '{name}' refused for user '{self.user}'",
            )
        self.vhost = vhost
        self.context = context
        self.access = Access(self.api, context)
        self.io.write(encode_method(0, commands.Connection.OpenOk()))
        self.state = OPENED
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.heartbeat > 0:
            self._timer = self.clock.call_later(self.heartbeat * 500, self._heartbeat_tick)
        log.info(
            "amqp %s: connection open (user %r, vhost %r, client %r)",
            self.peer,
            self.user,
            name,
            self.client_name,
        )
        amqp_connection_opened(self)  # shown in /api/connections from now on
        reason = self._blocked()
        if reason is not None:
            self.flow_changed(True, reason)

    def _client_close(self, method: base.Frame) -> None:
        if self.state != CLOSING:
            assert isinstance(method, commands.Connection.Close)
            if method.reply_code not in (0, 200):
                log.info(
                    "amqp %s: client closed the connection: %d %s",
                    self.peer,
                    method.reply_code,
                    method.reply_text,
                )
        self._cleanup()
        self.io.write(encode_method(0, commands.Connection.CloseOk()))
        self._finish()

    # -- errors ------------------------------------------------------------------------------

    def _fill_method(self, error: AmqpError) -> None:
        if not error.class_id and not error.method_id:
            error.class_id, error.method_id = divmod(self._current_index, 1 << 16)

    def _channel_error(self, error: AmqpChannelError) -> None:
        number = error.channel or self._current_channel
        if not number:
            self._connection_error(
                AmqpConnectionError(
                    error.reply_code, error.reply_text, error.class_id, error.method_id
                )
            )
            return
        if self.state in (CLOSING, CLOSED) or number in self.closing_channels:
            return
        self._fill_method(error)
        error.channel = number
        self.metrics["channel_errors"] += 1
        log.warning("amqp %s: channel %d closed: %s", self.peer, number, error)
        channel = self.channels.pop(number, None)
        if channel is not None:
            channel.cleanup()
        self.closing_channels.add(number)
        self.io.write(encode_method(number, error.close_method()))

    def _connection_error(self, error: AmqpConnectionError) -> None:
        if self.state in (CLOSING, CLOSED):
            return
        self._fill_method(error)
        self.metrics["connection_errors"] += 1
        log.warning("amqp %s: connection closed: %s", self.peer, error)
        self._cleanup()
        self.io.write(encode_method(0, error.close_method()))
        if self.decoder.dead:
            self._finish()
            return
        self.decoder.start_closing()
        self.state = CLOSING
        self._timer = self.clock.call_later(CLOSE_OK_TIMEOUT_S * 1000, self._close_ok_timeout)

    def close_by_server(self, reply_code: int, reply_text: str) -> None:
        """Server shutdown: Connection.Close (e.g. 320 CONNECTION_FORCED) to the client."""
        if self.state == OPENED:
            self._current_channel = self._current_index = 0
            self._connection_error(AmqpConnectionError(reply_code, reply_text))
        elif self.state != CLOSED:
            self._finish()

    def _handshake_timeout(self) -> None:
        self._timer = None
        if self.state in (HEADER, START_OK, TUNE_OK, OPEN):
            log.warning("amqp %s: handshake timeout", self.peer)
            self._finish()

    def _close_ok_timeout(self) -> None:
        self._timer = None
        if self.state == CLOSING:
            self._cleanup()
            self.state = CLOSED
            self.io.abort()

    def _heartbeat_tick(self) -> None:
        self._timer = None
        if self.state != OPENED:
            return
        now_ms = self.clock.now_ms()
        if now_ms - self.last_received_ms > HEARTBEAT_MISSES * self.heartbeat * 1000:
            log.warning(
                "amqp %s: missed heartbeats from client, timeout: %ds", self.peer, self.heartbeat
            )
            self._cleanup()
            self.state = CLOSED
            self.io.abort()
            return
        if now_ms - self.io.last_write_ms >= self.heartbeat * 500:
            self.io.write(encode_heartbeat())
        self._timer = self.clock.call_later(self.heartbeat * 500, self._heartbeat_tick)

    # -- flow control ------------------------------------------------------------------------

    def flow_changed(self, blocked: bool, reason: str) -> None:
        """The broker blocked or unblocked publishers: tell clients that asked to be told."""
        if self.state != OPENED or not self.capabilities.get("connection.blocked"):
            return
        if blocked:
            self.io.write(encode_method(0, commands.Connection.Blocked(reason[:255])))
        else:
            self.io.write(encode_method(0, commands.Connection.Unblocked()))

    # -- publisher confirms ------------------------------------------------------------------

    def stop_deliveries(self) -> None:
        """The outgoing buffer is full: pause every consumer of this connection."""
        if self.deliveries_stopped:
            return
        self.deliveries_stopped = True
        for channel in self.channels.values():
            stop_channel_deliveries(channel)

    def reply_dropped(self) -> None:
        """A direct reply-to reply for this connection was dropped (deliveries are stopped):
        counted, and logged at most once per ``REPLY_DROP_LOG_S``."""
        self.metrics["replies_dropped"] += 1
        self._replies_dropped += 1
        now = self.clock.now_ms()
        last = self._reply_drop_logged_ms
        if last is not None and now - last < REPLY_DROP_LOG_S * 1000:
            return
        log.warning(
            "amqp: %s: %d direct reply-to replies dropped: the client's outgoing buffer is over "
            "[limits] max_outgoing_buffer_bytes (%d bytes)",
            self.peer,
            self._replies_dropped,
            self.outgoing_bound,
        )
        self._replies_dropped = 0
        self._reply_drop_logged_ms = now

    def outgoing_drained(self, buffered: int, writing_paused: bool) -> None:
        """After a flush (or ``resume_writing``) with ``buffered`` bytes left in the transport:
        the room for the next loop iteration's deliveries; stopped ones resume unless the
        transport is still over its high-water mark (its ``resume_writing`` will come)."""
        self.outgoing_room = self.outgoing_bound - buffered
        if self.deliveries_stopped and not writing_paused and self.state != CLOSED:
            self.deliveries_stopped = False
            for channel in list(self.channels.values()):
                resume_channel_deliveries(channel)

    def confirm(
        self,
        channel: Channel,
        seq: int,
        end: int,
        nack: bool,
        refused: Collection[object] | None = None,
    ) -> None:
        """Publish ``seq`` on ``channel`` is stored up to log position ``end`` (0: nothing to
        wait for); confirm it (``nack``: negatively) once durable, in order. ``refused``: the
        destinations that refused it, still filled by forwards to other nodes until ``end``
        is durable (nacked then when not empty)."""
        batch = self._confirms.get(channel)
        if batch is None:
            batch = self._confirms[channel] = _ConfirmBatch(channel)
        batch.high = seq
        if nack:
            batch.nacks.append(seq)
        if end:
            batch.marks.append((seq, end))
            if refused is not None:
                batch.refusals.append((seq, refused))
            if end > self._confirm_end:
                self._confirm_end = end

    def _end_of_run(self) -> None:
        """After a read's frames: pump the queues it acked in; one durability wait covers
        every publish it made."""
        self.settlements.deliver_freed()
        if not self._confirms:
            return
        group = _ConfirmGroup(list(self._confirms.values()))
        self._confirms = {}
        end, self._confirm_end = self._confirm_end, 0
        self._confirm_groups.append(group)
        if end and not self.api.is_durable(end):
            task = self.loop.create_task(self._wait_durable(end))
            self._confirm_tasks.add(task)
            task.add_done_callback(lambda done: self._durable(group, done))
            return
        self._nack_not_stored(group)
        self._nack_refused(group)
        group.ready = True
        # Not now: after the deliveries these publishes make (the queues' pumps are already
        # scheduled with call_soon), so a consumer on this connection gets a message before
        # its publisher's confirm, as from RabbitMQ. aiormq's "connection close stairway" test
        # publishes, awaits the confirm, then awaits the delivery: with the confirm first, a
        # connection dropped between the two left it waiting forever (15 of 16 cases hung).
        if not self._confirm_flush_scheduled:
            self._confirm_flush_scheduled = True
            self.loop.call_soon(self._flush_ready_confirms)

    def _flush_ready_confirms(self) -> None:
        self._confirm_flush_scheduled = False
        if self.state != CLOSED:
            self._flush_confirms()

    async def _wait_durable(self, end: int) -> None:
        await self.api.when_durable(end)

    def _durable(self, group: _ConfirmGroup, task: asyncio.Task[None]) -> None:
        self._confirm_tasks.discard(task)
        if task.cancelled() or self.state == CLOSED:
            return
        error = task.exception()
        if isinstance(error, ShardUnavailable):
            # The highest mark's forward failed: those of its publishes that failed are nacked
            # (the others were stored); all of them when no mark is named.
            if not self._nack_not_stored(group):
                log.warning("amqp %s: publishes nacked: %s", self.peer, error)
                for batch in group.batches:
                    batch.all_nacked = True
        elif error is not None:
            log.error("amqp %s: durability wait failed: %r", self.peer, error)
            self._connection_error(
                AmqpConnectionError(INTERNAL_ERROR, "INTERNAL_ERROR - the log could not sync")
            )
            return
        else:
            self._nack_not_stored(group)
        self._nack_refused(group)
        group.ready = True
        self._flush_confirms()

    def _nack_not_stored(self, group: _ConfirmGroup) -> bool:
        """Nack the publishes of ``group`` whose forward to another node's shard failed
        (``BrokerAPI.failed_marks``): the wait for the group's highest mark passes them.
        Whether there were any."""
        marks = [end for batch in group.batches for _, end in batch.marks]
        if not marks:
            return False
        failed = self.api.failed_marks(marks)
        if not failed:
            return False
        for batch in group.batches:
            seqs = [seq for seq, end in batch.marks if end in failed]
            if seqs:
                batch.nacks = sorted({*batch.nacks, *seqs})
        log.warning(
            "amqp %s: %d publishes not stored, nacked: %s",
            self.peer,
            len(failed),
            next(iter(failed.values())),
        )
        return True

    @staticmethod
    def _nack_refused(group: _ConfirmGroup) -> None:
        """Nack the publishes of ``group`` that a queue of another node refused
        (reject-publish): known only once their forwards were answered, as a local queue's
        refusal is known at the publish (RabbitMQ nacks both)."""
        for batch in group.batches:
            seqs = [seq for seq, refused in batch.refusals if refused]
            if seqs:
                batch.nacks = sorted({*batch.nacks, *seqs})
            batch.refusals = []

    def _flush_confirms(self) -> None:
        groups = self._confirm_groups
        write = self.io.write
        while groups and groups[0].ready:
            for batch in groups.popleft().batches:
                channel = batch.channel
                if channel.closed:
                    continue
                number = channel.number
                done = channel.confirmed
                if batch.all_nacked and batch.high > done:
                    write(encode_nack(number, batch.high, batch.high - done > 1))
                    done = batch.high
                for seq in () if batch.all_nacked else batch.nacks:
                    if seq - 1 > done:
                        write(encode_ack(number, seq - 1, seq - 1 - done > 1))
                    write(encode_nack(number, seq))
                    done = seq
                if batch.high > done:
                    write(encode_ack(number, batch.high, batch.high - done > 1))
                self.metrics["confirms"] += batch.high - channel.confirmed
                channel.confirmed = batch.high

    # -- closing -----------------------------------------------------------------------------

    def _cleanup(self) -> None:
        """Channels go (consumers cancelled, unacked requeued), exclusive queues are deleted."""
        for channel in list(self.channels.values()):
            channel.cleanup()
            self.metrics["channels_closed"] += 1
        self.channels.clear()
        self.closing_channels.clear()
        if self.vhost is not None:
            self.vhost.owner_gone(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _finish(self) -> None:
        """Done with the socket: flush what was written and close it."""
        if self.state == CLOSED:
            return
        self._cleanup()
        self.state = CLOSED
        self.io.close()

    def connection_lost(self) -> None:
        amqp_connection_closed(self)
        if self.state == OPENED:
            log.info("amqp %s: client closed the socket without Connection.Close", self.peer)
        self._cleanup()
        self.state = CLOSED
        self.metrics["connections_closed"] += 1
        for task in list(self._confirm_tasks):
            task.cancel()
        self._confirm_tasks.clear()
        self._confirm_groups.clear()
        self._confirms.clear()
        # A message body half received is dropped now, not with the session.
        self.decoder.start_closing()
