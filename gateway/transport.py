"""The one gateway transport: the ``asyncio.Protocol`` base of the three listeners.

Each protocol's connection class (``gateway/amqp/server.py:AmqpConnection``,
``gateway/mqtt/server.py:MqttProtocol``, ``gateway/kafka/server.py:KafkaConnection``)
subclasses :class:`GatewayTransport` and adds only its codec and state machine. What they share
lives here, once:

- **Write coalescing** (ARCHITECTURE.md's batch I/O): :meth:`GatewayTransport.write` appends to
  a list; the list leaves in ONE ``transport.write`` at the end of the read that produced it
  (``FLUSH_AFTER_READ``: replies, confirms and the deliveries a read's acks free go together)
  or, for writes outside a read (deliveries, durability waits ending), at the end of the loop
  iteration (``call_soon``).
- **Read pausing by reasons**: :meth:`pause_reading` / :meth:`resume_reading` take a reason
  (``"writing"``: the transport's write buffer is above ``write_high_water``, a client that
  does not read what we send does not get to send more, as uvicorn's flow control; ``"busy"``:
  a handler is waiting; a protocol's own reasons). Reading resumes when the last reason goes.
- **Parking events while a handler waits** (:meth:`park`, :meth:`wait_for`): the events
  decoded after one whose handler returned an awaitable wait, in order, with reading paused,
  until it is done (AMQP and MQTT; a Kafka connection pipelines its requests instead, each
  holding a slot for its response in request order, pauses reading by their count, and parks
  the rest of a read while its write buffer is over the high-water mark).
- **An outgoing bound** (issue 21 item 4, :meth:`GatewayTransport.bound_outgoing`): the
  ``[limits] max_outgoing_buffer_bytes`` lower the write high-water mark where they are smaller,
  so ``pause_writing`` tells the protocol to stop delivering (``writing_paused``); a connection
  whose socket takes nothing for ``stalled_client_timeout_s`` while paused is aborted with a log
  line (:meth:`GatewayTransport.stalled`), as RabbitMQ's ``send_timeout`` closes a blocked
  socket; one that takes bytes, however slowly, is a slow link and stays.
- **Partial requests** (issue 21 item 5, :meth:`track_incomplete`): a request (Kafka request,
  AMQP frame, MQTT packet) that stays partly received for ``incomplete_timeout_s`` while reading
  is not paused closes the connection with a log line, so a peer that stops half-way through a
  large request does not pin its buffer for as long as the socket lives.
- **Counters**: ``recv_oct``/``recv_cnt`` (bytes and reads) and ``send_oct``/``send_cnt``
  (bytes and socket writes), RabbitMQ's names in ``/api/connections``; plain integers.
- **Close**: :meth:`close` flushes what was written, then closes; a peer that never reads
  would keep the socket (and its buffer) forever, since ``transport.close()`` waits for the
  buffer to drain, so the connection is aborted ``close_timeout_s`` later if it is still there.

The limits are one :class:`TransportLimits` per listener, each protocol with its own defaults
(below, with their reasons). Timers use the injected :class:`~core.api.Clock`.

Not thread-safe: one instance per connection, on the event loop's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Final, cast

from core.api import Clock, LoopClock, Timer

log = logging.getLogger(__name__)

__all__ = [
    "CLOSE_TIMEOUT_S",
    "READING_BUSY",
    "READING_WRITES",
    "GatewayTransport",
    "TransportLimits",
    "peer_text",
]

# How long a closing connection's peer gets to take what was written before the socket is
# aborted. RabbitMQ's writer gives a send 15 s (send_timeout) before it drops the socket;
# Kafka's connections.max.idle.ms is far longer but counts idleness, not a stuck send.
CLOSE_TIMEOUT_S: Final = 15.0
# The read-pause reasons this module sets itself.
READING_WRITES: Final = "writing"  # the write buffer is above its high-water mark
READING_BUSY: Final = "busy"  # a handler is waiting; the events after it are parked


@dataclass(frozen=True, slots=True)
class TransportLimits:
    """A listener's transport limits.

    ``write_high_water``: above this many bytes in the transport's write buffer, reading the
    client pauses; it resumes below ``write_low_water`` (asyncio's own defaults are 64 KiB /
    16 KiB). ``close_timeout_s``: how long :meth:`GatewayTransport.close` waits for a peer to
    take what is buffered before aborting.
    """

    write_high_water: int
    write_low_water: int
    close_timeout_s: float = CLOSE_TIMEOUT_S

    def __post_init__(self) -> None:
        if not 0 <= self.write_low_water <= self.write_high_water:
            raise ValueError("need 0 <= write_low_water <= write_high_water")
        if self.close_timeout_s < 0:
            raise ValueError("close_timeout_s must not be negative")


def peer_text(transport: asyncio.BaseTransport) -> str:
    """``host:port`` of the peer (``[v6]:port`` for IPv6), or ``?``."""
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = str(peer[0])
        return f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
    return "?" if peer is None else str(peer)


def peer_certificate_cn(transport: asyncio.BaseTransport) -> str | None:
    """The common name of the verified client certificate of a TLS connection (``ssl``'s
    ``getpeercert()`` form), or None: the user for AMQP EXTERNAL, MQTT's identity as user name
    and Kafka's ``User:CN`` principal."""
    certificate = transport.get_extra_info("peercert")
    if not certificate:
        return None
    for rdn in certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


class GatewayTransport(asyncio.Protocol):
    """Bytes in to :meth:`received`, bytes out coalesced; read pausing by reasons; close.

    A subclass implements :meth:`received` (and may extend ``connection_made`` and
    ``connection_lost``, calling the base).
    """

    # Flush at the end of each read what the read wrote (AMQP, Kafka), or leave every write to
    # the end of the loop iteration (MQTT: the publishes of a read fan out to subscribers
    # through call_soon; their writes then join the publisher's replies in one flush).
    FLUSH_AFTER_READ: ClassVar[bool] = True
    # Set TCP_NODELAY: replies are coalesced here already, Nagle would only delay them.
    NO_DELAY: ClassVar[bool] = True

    def __init__(
        self,
        limits: TransportLimits,
        clock: Clock | None = None,
        metrics: dict[str, int] | None = None,
    ) -> None:
        self.limits = limits
        # The listener's counters: ``bytes_sent`` is counted here when given.
        self._counters = metrics
        self.clock: Clock = clock if clock is not None else LoopClock()
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.closed = False  # closing or gone: nothing more is written
        self.lost = False  # connection_lost came
        self.last_write_ms = self.clock.now_ms()
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._in_read = False
        self._pause_reasons: set[str] = set()
        self._close_timer: Timer | None = None
        self._parked: tuple[list[Any], int] | None = None
        self._waiter: asyncio.Task[None] | None = None
        # RabbitMQ's per-connection counters (/api/connections): octets and reads / writes.
        self.recv_oct = 0
        self.recv_cnt = 0
        self.send_oct = 0
        self.send_cnt = 0
        # The partial-request timeout (None: none) and since when a request has been partly
        # received (None: no partial request), checked lazily by one timer.
        self.incomplete_timeout_s: float | None = None
        self._incomplete_since_ms: float | None = None
        self._incomplete_bytes = 0
        self._incomplete_timer: Timer | None = None
        # The write side's state: above the high-water mark since pause_writing, and the timer
        # that disconnects a client staying there (None: no stall timeout set).
        self.writing_paused = False
        self.stall_timeout_s: float | None = None
        self._stall_timer: Timer | None = None
        self._stall_taken = 0  # taken_bytes() when the stall timer was armed

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.peer = peer_text(transport)
        if self.NO_DELAY:
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        limits = self.limits
        with contextlib.suppress(AttributeError, NotImplementedError):
            self.transport.set_write_buffer_limits(limits.write_high_water, limits.write_low_water)

    def data_received(self, data: bytes) -> None:
        self.recv_oct += len(data)
        self.recv_cnt += 1
        if not self.FLUSH_AFTER_READ:
            self.received(data)
            return
        # What this read makes the connection write leaves in one write at the end of the
        # read, not one loop iteration later.
        self._in_read = True
        try:
            self.received(data)
        finally:
            self._in_read = False
        if self._out and not self._flush_scheduled:
            self.flush()

    def received(self, data: bytes) -> None:
        """Handle received bytes (the subclass's codec and state machine)."""
        raise NotImplementedError

    def eof_received(self) -> bool | None:
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.lost = True
        self._out.clear()
        self._parked = None
        self._incomplete_since_ms = None
        if self._incomplete_timer is not None:
            self._incomplete_timer.cancel()
            self._incomplete_timer = None
        if self._waiter is not None:
            self._waiter.cancel()
            self._waiter = None
        if self._close_timer is not None:
            self._close_timer.cancel()
            self._close_timer = None
        self._cancel_stall_timer()

    def pause_writing(self) -> None:
        self.writing_paused = True
        self.pause_reading(READING_WRITES)
        if self.stall_timeout_s is not None and self._stall_timer is None and not self.lost:
            self._arm_stall_timer(self.stall_timeout_s)

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._cancel_stall_timer()
        self.resume_reading(READING_WRITES)

    # -- the outgoing bound --------------------------------------------------------------------

    def bound_outgoing(self, max_bytes: int, stall_timeout_s: float) -> None:
        """Stop deliveries at ``max_bytes`` buffered (the write high-water mark, lowered to it;
        the low mark to a quarter of it) and disconnect the client once it has stayed there
        ``stall_timeout_s`` (``[limits] max_outgoing_buffer_bytes``, ``stalled_client_timeout_s``).
        """
        self.stall_timeout_s = stall_timeout_s
        limits = self.limits
        high = min(limits.write_high_water, max_bytes)
        low = min(limits.write_low_water, high // 4)
        if (high, low) != (limits.write_high_water, limits.write_low_water):
            self.limits = TransportLimits(high, low, limits.close_timeout_s)
            if self.transport is not None:
                with contextlib.suppress(AttributeError, NotImplementedError):
                    self.transport.set_write_buffer_limits(high, low)
        if self.writing_paused and self._stall_timer is None and not self.lost:
            self._arm_stall_timer(stall_timeout_s)

    def outgoing_bytes(self) -> int:
        """Bytes written and not yet taken by the socket: the transport's buffer and what waits
        here for the next flush."""
        buffered = sum(len(data) for data in self._out)
        if self.transport is not None:
            buffered += self.transport.get_write_buffer_size()
        return buffered

    def _cancel_stall_timer(self) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    def taken_bytes(self) -> int:
        """Bytes the socket has taken from us so far (handed to the transport, less what its
        buffer still holds): grows while the client reads, however slowly."""
        if self.transport is None:
            return self.send_oct
        return self.send_oct - self.transport.get_write_buffer_size()

    def _arm_stall_timer(self, timeout_s: float) -> None:
        self._stall_taken = self.taken_bytes()
        self._stall_timer = self.clock.call_later(timeout_s * 1000.0, self._stall_timed_out)

    def _stall_timed_out(self) -> None:
        self._stall_timer = None
        if self.lost or self.transport is None or not self.writing_paused:
            return
        if self.taken_bytes() > self._stall_taken and self.stall_timeout_s is not None:
            # It took something meanwhile: a slow link (a large Fetch over a thin pipe), not a
            # stalled client. As RabbitMQ's send_timeout, what counts is a send that makes no
            # progress for the whole timeout; its buffer stays bounded meanwhile.
            self._arm_stall_timer(self.stall_timeout_s)
            return
        if self._counters is not None and "stalled_disconnects" in self._counters:
            self._counters["stalled_disconnects"] += 1
        log.warning(
            "%s: client took too little of %d buffered bytes for %.1f s "
            "([limits] stalled_client_timeout_s); disconnecting it",
            self.peer,
            self.outgoing_bytes(),
            self.stall_timeout_s or 0.0,
        )
        self.stalled()

    def stalled(self) -> None:
        """The client stayed over the outgoing bound past the stall timeout: drop it (nothing
        more can reach it, a goodbye included). A protocol may first end its session state."""
        self.abort()

    # -- writing -----------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Queue ``data``; it leaves with everything else written in this read or iteration."""
        if self.closed:
            return
        self._out.append(data)
        if not self._flush_scheduled and not self._in_read:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write out what is queued, in one ``transport.write``."""
        self._flush_scheduled = False
        out = self._out
        transport = self.transport
        if not out:
            return
        if self.closed or transport is None or transport.is_closing():
            out.clear()  # after close(): nothing more goes out
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        transport.write(data)
        self.send_oct += len(data)
        self.send_cnt += 1
        if self._counters is not None:
            self._counters["bytes_sent"] += len(data)
        self.last_write_ms = self.clock.now_ms()

    # -- reading -----------------------------------------------------------------------------

    def pause_reading(self, reason: str) -> None:
        reasons = self._pause_reasons
        if not reasons and self.transport is not None and not self.closed:
            with contextlib.suppress(RuntimeError):  # the transport is closing
                self.transport.pause_reading()
        reasons.add(reason)

    def resume_reading(self, reason: str) -> None:
        reasons = self._pause_reasons
        if reason not in reasons:
            return
        reasons.discard(reason)
        if not reasons and self.transport is not None and not self.closed:
            with contextlib.suppress(RuntimeError):
                self.transport.resume_reading()

    def reading_paused_for(self, reason: str) -> bool:
        return reason in self._pause_reasons

    # -- parking events while a handler waits ------------------------------------------------

    def park(self, events: list[Any], start: int) -> None:
        """Hold ``events[start:]`` (decoded, not handled yet) with reading paused, until
        :meth:`take_parked`. Events decoded from a read already under way join them
        (:meth:`park_more`), so the order stays the order of the wire."""
        self._parked = (events, start)
        self.pause_reading(READING_BUSY)

    def park_more(self, events: list[Any]) -> bool:
        """Add ``events`` behind the parked ones; False when none are parked."""
        parked = self._parked
        if parked is None:
            return False
        parked[0].extend(events)
        return True

    def take_parked(self) -> tuple[list[Any], int] | None:
        """The parked events and where to go on from; reading stays paused until the caller
        has handled them and calls ``resume_reading(READING_BUSY)``."""
        parked, self._parked = self._parked, None
        return parked

    def wait_for(
        self,
        waiting: Awaitable[None],
        then: Callable[[], None],
        failed: Callable[[BaseException], None],
    ) -> None:
        """A handler returned ``waiting``: await it in a task (reading paused), then call
        ``then`` (``failed(error)`` first if it raised), unless the connection went meanwhile."""
        self.pause_reading(READING_BUSY)
        self._waiter = self.loop.create_task(self._wait_then(waiting, then, failed))

    @property
    def handler_waiting(self) -> bool:
        return self._waiter is not None

    async def _wait_then(
        self,
        waiting: Awaitable[None],
        then: Callable[[], None],
        failed: Callable[[BaseException], None],
    ) -> None:
        try:
            await waiting
        except Exception as error:
            failed(error)
        self._waiter = None
        if not self.lost:
            then()

    # -- partial requests --------------------------------------------------------------------

    def track_incomplete(self, buffered: int, completed: bool) -> None:
        """After a read: the decoder holds ``buffered`` bytes of a request not yet complete;
        ``completed``: the read completed at least one request. The partial-request clock starts
        with a partial request and restarts with each completed one (a producer streaming large
        requests always has one partly received); it stops when nothing is partly received."""
        if not buffered:
            self._incomplete_since_ms = None
            return
        self._incomplete_bytes = buffered
        if completed or self._incomplete_since_ms is None:
            self._incomplete_since_ms = self.clock.now_ms()
            if self._incomplete_timer is None and self.incomplete_timeout_s is not None:
                self._incomplete_timer = self.clock.call_later(
                    self.incomplete_timeout_s * 1000.0, self._check_incomplete
                )

    def _check_incomplete(self) -> None:
        """Re-armed lazily (reads only move ``_incomplete_since_ms``)."""
        self._incomplete_timer = None
        since = self._incomplete_since_ms
        timeout_s = self.incomplete_timeout_s
        if since is None or timeout_s is None or self.closed:
            return
        now = self.clock.now_ms()
        if self._pause_reasons:
            # We are not reading: the rest of the request may be waiting in the socket.
            self._incomplete_since_ms = since = now
        due = since + timeout_s * 1000.0
        if now < due:
            self._incomplete_timer = self.clock.call_later(due - now, self._check_incomplete)
            return
        self.incomplete_timed_out(self._incomplete_bytes, timeout_s)

    def incomplete_timed_out(self, buffered: int, timeout_s: float) -> None:
        """A request stayed partly received ``timeout_s``: log it and drop the connection (a
        protocol may answer first; nothing can be answered to a request not received)."""
        log.warning(
            "%s: a request partly received (%d bytes) did not complete within %.1f s "
            "([limits] incomplete_request_timeout_s); closing the connection",
            self.peer,
            buffered,
            timeout_s,
        )
        self.abort()

    # -- closing -----------------------------------------------------------------------------

    def close(self) -> None:
        """Flush what was written, then close; abort if the peer has not taken it after
        ``close_timeout_s``."""
        transport = self.transport
        if self.closed or transport is None:
            return
        self.flush()
        self.closed = True
        transport.close()
        if not self.lost:
            self._close_timer = self.clock.call_later(
                self.limits.close_timeout_s * 1000.0, self._close_timed_out
            )

    def _close_timed_out(self) -> None:
        self._close_timer = None
        if self.lost or self.transport is None:
            return
        log.info(
            "%s: peer did not take %d buffered bytes within %.1f s of closing; aborting",
            self.peer,
            self.transport.get_write_buffer_size(),
            self.limits.close_timeout_s,
        )
        self.transport.abort()

    def abort(self) -> None:
        """Drop the connection now, without sending what is buffered."""
        self.closed = True
        self._out.clear()
        if self.transport is not None:
            self.transport.abort()
