"""AckQueue: AMQP-queue / MQTT-session delivery semantics over one log queue.

Records are read from the queue's index and handed to consumers with an in-flight limit each
(prefetch / receive-maximum). Consumers compete (round robin), or only the first one receives
(single active consumer). Each delivered record waits for ack, nack/reject with or without
requeue; a consumer that goes away returns its in-flight records, which are redelivered first, in
offset order, flagged redelivered and with their delivery count.

Ack state is cheap to keep: ``cursor`` (every offset below it acked) plus the set of acked offsets
above it, and ``delivered_frontier`` (everything below was handed out at least once, so after a
restart those records come back flagged redelivered). The broker persists the state of dirty
queues in batches (:mod:`core.delivery.persist`), never one write per ack.

Not thread-safe: one event loop.
"""

from __future__ import annotations

import heapq
import logging
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from core.deadletter.policy import DeadLetterPolicy
from core.delivery.message import Message, messages_of
from core.log import CorruptRecordError, LogStore, TagFilter
from core.log.store import now_ms

log = logging.getLogger(__name__)

OVERFLOW_DROP_HEAD = "drop-head"
OVERFLOW_REJECT_PUBLISH = "reject-publish"
# How many index entries one refill of the delivery buffer reads.
READ_AHEAD_RECORDS = 256
# A priority queue picks the highest priority among this many ready records read ahead
# (RabbitMQ's classic priority queue keeps one sub-queue per priority; here the records stay in
# the log and only this window is sorted into per-priority lanes).
PRIORITY_READ_AHEAD = 65536
# RabbitMQ's limit on x-max-priority.
MAX_PRIORITY = 255
# Before delivering past the persisted delivered-frontier, the queue persists a frontier this far
# ahead (write-ahead), so after a crash every record that may have been delivered comes back
# flagged redelivered, whatever acks were lost with the last unpersisted batch.
FRONTIER_LEASE = 4096

REASON_REJECTED = "rejected"
REASON_EXPIRED = "expired"
REASON_MAXLEN = "maxlen"
REASON_DELIVERY_LIMIT = "delivery_limit"

# Called when a record leaves the queue without being consumed: (queue, message, reason).
DeadLetterHook = Callable[["AckQueue", Message, str], None]


def _offset_of(message: Message) -> int:
    return message.offset


def _not_owed(_error: CorruptRecordError) -> None:
    """A damaged record is not owed (it is skipped when reached): the retention guard passes
    over it."""


@dataclass
class AckQueueConfig:
    message_ttl_ms: int | None = None  # x-message-ttl
    max_length: int | None = None  # x-max-length (ready records)
    overflow: str = OVERFLOW_DROP_HEAD  # x-overflow
    single_active_consumer: bool = False  # x-single-active-consumer
    delivery_limit: int | None = None  # x-delivery-limit: redeliveries before dead-lettering
    tag_filter: TagFilter | None = None
    dead_letter: DeadLetterPolicy = field(default_factory=DeadLetterPolicy)
    max_priority: int | None = None  # x-max-priority (1-255): a priority queue


class Consumer:
    __slots__ = ("deliver", "inflight", "no_ack", "prefetch", "queue", "tag")

    def __init__(
        self,
        queue: AckQueue,
        tag: str,
        prefetch: int,
        deliver: Callable[[Delivery], None],
        no_ack: bool,
    ) -> None:
        self.queue = queue
        self.tag = tag
        self.prefetch = prefetch  # 0: unlimited
        self.deliver = deliver
        self.no_ack = no_ack
        self.inflight = 0

    def has_capacity(self) -> bool:
        prefetch = self.prefetch
        if self.no_ack:
            # No in-flight limit (AMQP ignores a no-ack consumer's prefetch), but a paused one
            # (NO_CREDIT, -1: its connection's outgoing buffer is full) takes nothing.
            return prefetch >= 0
        return not prefetch or self.inflight < prefetch

    def __repr__(self) -> str:
        return f"Consumer({self.tag}, inflight={self.inflight}/{self.prefetch})"


class Delivery:
    __slots__ = ("consumer", "delivery_count", "message", "offset", "queue", "redelivered")

    def __init__(
        self,
        queue: AckQueue,
        offset: int,
        message: Message,
        redelivered: bool,
        delivery_count: int,
        consumer: Consumer | None,
    ) -> None:
        self.queue = queue
        self.offset = offset
        self.message = message
        self.redelivered = redelivered
        self.delivery_count = delivery_count
        self.consumer = consumer

    def ack(self) -> None:
        self.queue.ack(self.offset)

    def nack(self, requeue: bool = True) -> None:
        self.queue.nack(self.offset, requeue=requeue)


_STATE_HEAD = struct.Struct("<QQI")  # cursor, delivered_frontier, number of acked offsets


class AckQueue:
    # Past the last damaged record a read skipped (_skip_corrupt).
    _corrupt_end = 0

    def __init__(
        self,
        store: LogStore,
        topic: str,
        queue: int,
        config: AckQueueConfig | None = None,
        *,
        schedule: Callable[[Callable[[], object]], object] | None = None,
        on_dead_letter: DeadLetterHook | None = None,
        persist_now: Callable[[AckQueue], None] | None = None,
    ) -> None:
        self.store = store
        self._persist_now = persist_now
        self.topic = topic
        self.queue = queue
        self.config = config or AckQueueConfig()
        self.on_dead_letter = on_dead_letter
        self._schedule = schedule
        self.consumers: list[Consumer] = []
        self._turn = 0  # round-robin position among consumers
        self.cursor, _ = store.queue_bounds(topic, queue)
        self.acked: set[int] = set()
        self.delivered_frontier = self.cursor
        self.frontier_lease = self.cursor  # persisted bound above delivered_frontier
        self.frontier = self.cursor  # next offset to read from the index
        self.inflight: dict[int, Delivery] = {}
        self._redeliver: list[int] = []  # heap of offsets
        self._delivery_counts: dict[int, int] = {}
        self._buffer: deque[Message] = deque()
        # A priority queue's read-ahead window, one lane per priority (None: FIFO queue).
        self._lanes: list[deque[Message]] | None = None
        self._laned = 0  # records in the lanes
        self.set_max_priority(self.config.max_priority)
        self._pump_scheduled = False
        self.dirty = False
        self.deleted = False

    def set_max_priority(self, max_priority: int | None) -> None:
        """Make this a priority queue of priorities 0..``max_priority`` (None: FIFO). The
        priorities are the records' own (``x-braid-priority``), so they hold after a restart
        as soon as the queue is a priority queue again."""
        self.config.max_priority = max_priority
        self._lanes = None if max_priority is None else [deque() for _ in range(max_priority + 1)]
        self._laned = 0
        self._buffer.clear()
        self.frontier = self.cursor

    # -- state -----------------------------------------------------------------------------

    def encode_state(self) -> bytes:
        acked = sorted(self.acked)
        return _STATE_HEAD.pack(self.cursor, self.frontier_lease, len(acked)) + struct.pack(
            f"<{len(acked)}Q", *acked
        )

    def restore_state(self, raw: bytes) -> None:
        cursor, frontier, count = _STATE_HEAD.unpack_from(raw)
        acked = struct.unpack_from(f"<{count}Q", raw, _STATE_HEAD.size)
        start, end = self.store.queue_bounds(self.topic, self.queue)
        self.cursor = max(cursor, start)
        self.acked = {offset for offset in acked if offset >= self.cursor}
        # Records appended after the restart were never delivered, whatever the lease said.
        self.delivered_frontier = max(min(frontier, end), self.cursor)
        self.frontier_lease = self.delivered_frontier
        self.frontier = self.cursor
        self._buffer.clear()
        self._clear_lanes()
        self._advance_cursor()

    # -- counts ----------------------------------------------------------------------------

    @property
    def next_offset(self) -> int:
        return self.store.queue_bounds(self.topic, self.queue)[1]

    def message_count(self) -> int:
        """Ready records: neither acked nor in flight (what AMQP's queue.declare-ok reports)."""
        return max(0, self.next_offset - self.cursor - len(self.acked) - len(self.inflight))

    def unacked_count(self) -> int:
        return len(self.inflight)

    def would_overflow(self) -> bool:
        """True when one more publish must be refused (x-overflow reject-publish)."""
        limit = self.config.max_length
        return (
            limit is not None
            and self.config.overflow == OVERFLOW_REJECT_PUBLISH
            and self.message_count() >= limit
        )

    # -- consumers -------------------------------------------------------------------------

    def add_consumer(
        self,
        tag: str,
        prefetch: int,
        deliver: Callable[[Delivery], None],
        *,
        no_ack: bool = False,
    ) -> Consumer:
        consumer = Consumer(self, tag, prefetch, deliver, no_ack)
        self.consumers.append(consumer)
        self.notify()
        return consumer

    def remove_consumer(self, consumer: Consumer) -> int:
        """Detach a consumer; its in-flight records are requeued. Returns how many."""
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        returned = [d for d in self.inflight.values() if d.consumer is consumer]
        for delivery in returned:
            del self.inflight[delivery.offset]
            self._delivery_counts[delivery.offset] = delivery.delivery_count
            heapq.heappush(self._redeliver, delivery.offset)
        consumer.inflight = 0
        if returned:
            self.notify()
        return len(returned)

    @property
    def active_consumer(self) -> Consumer | None:
        return self.consumers[0] if self.consumers else None

    # -- acknowledgements ------------------------------------------------------------------

    def ack(self, offset: int) -> bool:
        delivery = self.inflight.pop(offset, None)
        if delivery is None:
            return False
        if delivery.consumer is not None:
            delivery.consumer.inflight -= 1
        self._mark_acked(offset)
        self.notify()
        return True

    def ack_upto(self, consumer: Consumer, offset: int) -> int:
        """Cumulative ack of a consumer's in-flight records up to ``offset`` inclusive."""
        done = [o for o, d in self.inflight.items() if d.consumer is consumer and o <= offset]
        for acked_offset in done:
            self.ack(acked_offset)
        return len(done)

    def nack(self, offset: int, *, requeue: bool = True) -> bool:
        delivery = self.inflight.pop(offset, None)
        if delivery is None:
            return False
        if delivery.consumer is not None:
            delivery.consumer.inflight -= 1
        limit = self.config.delivery_limit
        if requeue and (limit is None or delivery.delivery_count <= limit):
            self._delivery_counts[offset] = delivery.delivery_count
            heapq.heappush(self._redeliver, offset)
        else:
            reason = REASON_REJECTED if not requeue else REASON_DELIVERY_LIMIT
            self._mark_acked(offset)
            self._dead_letter(delivery.message, reason)
        self.notify()
        return True

    def _mark_acked(self, offset: int) -> None:
        self._delivery_counts.pop(offset, None)
        if offset == self.cursor:
            self.cursor += 1
            self._advance_cursor()
        elif offset > self.cursor:
            self.acked.add(offset)
        self.dirty = True

    def _advance_cursor(self) -> None:
        acked = self.acked
        while self.cursor in acked:
            acked.discard(self.cursor)
            self.cursor += 1

    def _dead_letter(self, message: Message, reason: str) -> None:
        if self.on_dead_letter is not None:
            try:
                self.on_dead_letter(self, message, reason)
            except Exception:
                log.exception("dead-letter hook failed for %s/%d", self.topic, self.queue)

    def purge(self) -> int:
        """Drop every ready record (in-flight ones stay, as AMQP's queue.purge does)."""
        purged = 0
        end = self.next_offset
        self._buffer.clear()
        self._clear_lanes()
        self._redeliver = [o for o in self._redeliver if o in self.inflight]
        offset = self.cursor
        while offset < end:
            if offset not in self.inflight and offset not in self.acked:
                self._mark_acked(offset)
                purged += 1
            offset += 1
        self.frontier = end
        self.delivered_frontier = max(self.delivered_frontier, end)
        self.dirty = True
        return purged

    # -- delivery --------------------------------------------------------------------------

    def notify(self) -> None:
        """New records or capacity: deliver soon (coalesced per loop iteration)."""
        if self._pump_scheduled or not self.consumers:
            return
        if self._schedule is None:
            self.pump()
            return
        self._pump_scheduled = True
        self._schedule(self.pump)

    def _eligible(self) -> list[Consumer]:
        if self.config.single_active_consumer:
            active = self.active_consumer
            return [active] if active is not None and active.has_capacity() else []
        return [c for c in self.consumers if c.has_capacity()]

    def pump(self) -> int:
        """Deliver as much as consumers can take now; returns deliveries made."""
        if self.deleted:
            self._pump_scheduled = False
            return 0
        # Acks made by consumers inside this loop must not schedule another pump: the loop
        # re-checks capacity itself.
        self._pump_scheduled = True
        delivered = 0
        try:
            while True:
                eligible = self._eligible()
                if not eligible:
                    break
                progressed = False
                if len(eligible) > 1:
                    self._turn = (self._turn + 1) % len(eligible)
                    eligible = eligible[self._turn :] + eligible[: self._turn]
                for consumer in eligible:
                    while consumer.has_capacity() and consumer in self.consumers:
                        message = self._next_message()
                        if message is None:
                            return delivered
                        self._deliver_to(consumer, message, track=not consumer.no_ack)
                        delivered += 1
                        progressed = True
                        if len(eligible) > 1:
                            break  # round robin: next consumer
                if not progressed:
                    break
        finally:
            self._pump_scheduled = False
        return delivered

    def _deliver_to(self, consumer: Consumer | None, message: Message, *, track: bool) -> Delivery:
        offset = message.offset
        # Only records handed out before keep a count (set when they come back), so the common
        # first delivery costs no dict write.
        count = self._delivery_counts.get(offset, 0) + 1
        redelivered = count > 1 or offset < self.delivered_frontier
        if offset >= self.delivered_frontier:
            self.delivered_frontier = offset + 1
            self.dirty = True
            if offset >= self.frontier_lease:
                self.frontier_lease = offset + FRONTIER_LEASE
                if self._persist_now is not None:
                    self._persist_now(self)
        delivery = Delivery(self, offset, message, redelivered, count, consumer)
        if not track:
            self._mark_acked(offset)
        else:
            self.inflight[offset] = delivery
            if consumer is not None:
                consumer.inflight += 1
        if consumer is not None and consumer.queue is self and consumer in self.consumers:
            consumer.deliver(delivery)
        return delivery

    def get(self, *, no_ack: bool, holder: Consumer | None = None) -> Delivery | None:
        """basic.get: one record, tracked for ack under ``holder`` unless ``no_ack``."""
        message = self._next_message()
        if message is None:
            return None
        return self._deliver_to(holder, message, track=not no_ack)

    def _next_message(self) -> Message | None:
        now: int | None = None
        while True:
            message = self._take_candidate()
            if message is None:
                return None
            if self.config.message_ttl_ms is not None or message.headers:
                now = now or now_ms()
                if self._expired(message, now):
                    self._mark_acked(message.offset)
                    self._dead_letter(message, REASON_EXPIRED)
                    continue
            return message

    def _expired(self, message: Message, now: int) -> bool:
        ttl = self.config.message_ttl_ms
        if ttl is not None and message.enqueued_ms + ttl <= now:
            return True
        expires_at = message.expires_at_ms if message.headers else None
        return expires_at is not None and expires_at <= now

    def _take_candidate(self) -> Message | None:
        if self._lanes is not None:
            return self._take_by_priority(self._lanes)
        while self._redeliver:
            offset = heapq.heappop(self._redeliver)
            if offset in self.inflight or offset < self.cursor or offset in self.acked:
                continue
            message = self._read_one(offset)
            if message is not None:
                return message
        while True:
            if not self._buffer and not self._refill():
                return None
            message = self._buffer.popleft()
            offset = message.offset
            if offset < self.cursor or offset in self.acked or offset in self.inflight:
                continue
            return message

    def _take_by_priority(self, lanes: list[deque[Message]]) -> Message | None:
        """The oldest ready record of the highest priority in the read-ahead window; a
        requeued record goes back to the head of its priority's lane (RabbitMQ's priority
        queue requeues into the record's own priority, not ahead of higher ones)."""
        if self._redeliver:
            self._requeue_into_lanes(lanes)
        self._fill_lanes(lanes)
        for lane in reversed(lanes):
            while lane:
                message = lane.popleft()
                self._laned -= 1
                offset = message.offset
                if offset < self.cursor or offset in self.acked or offset in self.inflight:
                    continue
                return message
        return None

    def put_back(self, message: Message) -> None:
        """Return a record ``_next_message`` gave out, undelivered, to the head of where it
        came from (its priority's lane in a priority queue).

        A requeued record (it keeps a delivery count until acked) goes back into the requeue
        heap, which is read before the buffer: in the buffer it would come out after the other
        requeued records, behind offsets it precedes (RabbitMQ keeps publish order)."""
        lanes = self._lanes
        if lanes is None:
            if message.offset in self._delivery_counts:
                heapq.heappush(self._redeliver, message.offset)
            else:
                self._buffer.appendleft(message)
        else:
            lanes[message.priority(len(lanes) - 1)].appendleft(message)
            self._laned += 1

    def _requeue_into_lanes(self, lanes: list[deque[Message]]) -> None:
        """Requeued records go to the front of their priority's lane, merged in offset order
        with the records requeued there before (a lane's front may already hold some, put there
        by an earlier requeue and not delivered since: the TTL sweep's put_back)."""
        top = len(lanes) - 1
        by_lane: dict[int, list[Message]] = {}
        while self._redeliver:
            offset = heapq.heappop(self._redeliver)  # ascending offsets
            if offset in self.inflight or offset < self.cursor or offset in self.acked:
                continue
            message = self._read_one(offset)
            if message is not None:
                by_lane.setdefault(message.priority(top), []).append(message)
        for priority, requeued in by_lane.items():
            lane = lanes[priority]
            last = requeued[-1].offset
            ahead: list[Message] = []
            while lane and lane[0].offset < last:
                ahead.append(lane.popleft())
            merged = list(heapq.merge(requeued, ahead, key=_offset_of))
            lane.extendleft(reversed(merged))
            self._laned += len(requeued)

    def _fill_lanes(self, lanes: list[deque[Message]]) -> None:
        top = len(lanes) - 1
        buffer = self._buffer
        while self._laned < PRIORITY_READ_AHEAD:
            if not buffer and not self._refill():
                return
            while buffer:
                message = buffer.popleft()
                lanes[message.priority(top)].append(message)
                self._laned += 1

    def _clear_lanes(self) -> None:
        if self._lanes is not None:
            for lane in self._lanes:
                lane.clear()
            self._laned = 0

    def _read_one(self, offset: int) -> Message | None:
        for queued in self.store.read(self.topic, self.queue, offset, max_records=1):
            for message in messages_of(queued):
                if message.offset == offset:
                    return message
        return None

    def _refill(self) -> bool:
        records = self.store.read(
            self.topic,
            self.queue,
            self.frontier,
            max_records=READ_AHEAD_RECORDS,
            tag_filter=self.config.tag_filter,
            on_corrupt=self._skip_corrupt,
        )
        if not records and self._corrupt_end > self.frontier:  # only a damaged record read
            self.frontier = self._corrupt_end
            return self._refill_more()
        if not records:
            end = self.next_offset
            if self.config.tag_filter is not None and self.frontier < end:
                self._skip_filtered(self.frontier, end)
                self.frontier = end
            return False
        for queued in records:
            if self.config.tag_filter is not None and queued.offset > self.frontier:
                self._skip_filtered(self.frontier, queued.offset)
            messages = messages_of(queued, selected=True)
            if len(messages) < queued.record_count:
                # A batch routed here for some of its records: the others are not owed.
                taken = {message.offset for message in messages}
                for offset in range(max(self.frontier, queued.offset), queued.next_offset):
                    if offset not in taken and offset >= self.cursor:
                        self._mark_acked(offset)
            for message in messages:
                if message.offset >= self.frontier:
                    self._buffer.append(message)
            self.frontier = max(self.frontier, queued.next_offset)
        self.frontier = max(self.frontier, self._corrupt_end)
        return bool(self._buffer) or self._refill_more()

    def _skip_corrupt(self, error: CorruptRecordError) -> None:
        """A damaged record (issue 21 item 6): skipped, with an ERROR line, so the records
        after it are delivered. Not dead-lettered: its bytes cannot be trusted, and a
        dead-letter queue would hand the same damaged frame to its consumers."""
        log.error(
            "queue %s/%d: records %d..%d skipped: %s",
            self.topic,
            self.queue,
            error.offset,
            error.next_offset - 1,
            error,
        )
        for offset in range(max(error.offset, self.cursor), error.next_offset):
            self._mark_acked(offset)
        # The frontier passes it once the records read with it are buffered (_refill).
        self._corrupt_end = max(self._corrupt_end, error.next_offset)

    def _refill_more(self) -> bool:
        # Everything read was already behind the frontier (a batch entry straddling it).
        return self.frontier < self.next_offset and self._refill()

    def _skip_filtered(self, start: int, end: int) -> None:
        """Offsets a tag filter skipped are not owed to this queue's consumers."""
        for offset in range(max(start, self.cursor), end):
            self._mark_acked(offset)

    def enforce_max_length(self) -> int:
        """x-max-length with drop-head: drop the oldest ready records over the limit."""
        limit = self.config.max_length
        if limit is None or self.config.overflow != OVERFLOW_DROP_HEAD:
            return 0
        dropped = 0
        excess = self.message_count() - limit
        while excess > 0:
            message = self._take_candidate()
            if message is None:
                break
            self._mark_acked(message.offset)
            self._dead_letter(message, REASON_MAXLEN)
            dropped += 1
            excess -= 1
        return dropped

    def owed_from_position(self) -> int | None:
        """Lowest commit-log position among the next records still owed (retention guard)."""
        candidates = [d.message.position for d in self.inflight.values()]
        records = self.store.read(
            self.topic, self.queue, self.cursor, max_records=64, on_corrupt=_not_owed
        )
        candidates.extend(r.position for r in records)
        return min(candidates) if candidates else None

    def __repr__(self) -> str:
        return (
            f"AckQueue({self.topic}/{self.queue} cursor={self.cursor} "
            f"inflight={len(self.inflight)} consumers={len(self.consumers)})"
        )
