"""The live feed: records stored by anyone else, read back for the live router's subscribers.

A publisher that feeds live subscriptions itself (the MQTT gateway hands each PUBLISH to its
clean sessions straight from the packet, without reading it back) brackets its publish with
setting :attr:`LiveFeed.own_topic` / calling :meth:`LiveFeed.end_own_publish`. Every other record a
live subscription may want (another protocol's publish, a delayed record whose time came, a
transaction's commit, a dead letter) is seen through the log's index notifications
(:meth:`_on_index`, inside the append): its entry is noted, and once the append is over (one
``call_soon`` per burst) read back once and handed to every reader (:meth:`follow`) as
:class:`~core.delivery.message.Message` values, each record of a batch on its own.

A Kafka transaction's batches are stored in their partition when produced (see
``core/transactions/partitions.py``), but live subscribers keep the half-message view: such a
batch is held (its entry, not its data) until its producer's COMMIT marker reaches the same
partition, then delivered; an ABORT marker drops it; control batches are never delivered.

Entries a follower's own publish made in *other* topics (records the publish moved elsewhere:
dead-lettered by a queue's max-length, routed copies) are kept for the same read-back; routed
copies are recognised there and skipped: only a record's own topic entry (or a dead letter's
entry in its dead-letter topic) is a publish to that topic.

A node of many shards has a store per local shard: the feed follows each of them
(:meth:`LiveFeed.add_store`), so a record indexed in any local shard reaches the live
subscribers, whichever shard its topic's queue is placed in.

Not thread-safe: the event loop's thread, like the store's appends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final

from core.deadletter.policy import DEAD_LETTER_TOPIC_HEADER
from core.delivery.message import Message, messages_of
from core.log import LogStore
from core.log import record as rec
from core.log.reader import QueueRecord
from core.log.txnindex import batch_txn
from core.routing.live import LiveRouter

log = logging.getLogger(__name__)

LiveReader = Callable[[Message], None]
# A frame's protocol byte: right after its flags (core/log/record.py's HEADER).
_PROTOCOL_OFFSET: Final = rec.FLAGS_OFFSET + rec.FLAGS.size
_Entry = tuple[LogStore, str, int, int]  # (its store, topic, queue, offset) of an index entry
IndexListener = Callable[[str, int, int], None]


class LiveFeed:
    """One per broker: the live router and the reading-back of others' records for it."""

    def __init__(self, store: LogStore) -> None:
        self.store = store  # the first store followed (the node's lowest local shard)
        self._listeners: dict[LogStore, IndexListener] = {}
        self.router: LiveRouter[object] = LiveRouter()
        self.readers: list[LiveReader] = []
        # Set by a follower around its own publish (an attribute, not a method: the MQTT
        # gateway's per-message path): index entries of this topic are the caller's to
        # deliver, it has the message in hand; others are read back after the publish.
        self.own_topic: str | None = None
        self._own_entries: list[_Entry] = []
        self._tapped: list[_Entry] = []
        self._scheduled = False
        # (topic, queue, producer id) -> entries of its open transaction's batches there.
        self._held: dict[tuple[str, int, int], list[_Entry]] = {}
        # A cluster node's check whether other nodes' live subscriptions may want a record of
        # a topic (their routes): such records are read back too, for the fan-out.
        self.others_want: Callable[[str], bool] | None = None
        self.add_store(store)

    def add_store(self, store: LogStore) -> None:
        """Follow ``store``'s index too (another local shard); following one twice is one."""
        if store in self._listeners:
            return

        def on_index(topic: str, queue: int, offset: int) -> None:
            self._on_index(store, topic, queue, offset)

        self._listeners[store] = on_index
        store.index_listeners.append(on_index)

    @property
    def stores(self) -> list[LogStore]:
        """The stores followed."""
        return list(self._listeners)

    def close(self) -> None:
        for store, listener in self._listeners.items():
            if listener in store.index_listeners:
                store.index_listeners.remove(listener)
        self._listeners.clear()
        self.readers.clear()

    def follow(self, reader: LiveReader) -> None:
        if reader not in self.readers:
            self.readers.append(reader)

    def unfollow(self, reader: LiveReader) -> None:
        if reader in self.readers:
            self.readers.remove(reader)

    # -- a follower's own publish --------------------------------------------------------

    def end_own_publish(self) -> None:
        """The follower's publish is over: what it indexed elsewhere is read back now."""
        self.own_topic = None
        if self._own_entries:
            self._tapped += self._own_entries
            self._own_entries = []
            self._schedule()

    # -- index notifications -------------------------------------------------------------

    def _on_index(self, store: LogStore, topic: str, queue: int, offset: int) -> None:
        """``store`` indexed a record (its index listener, inside the append)."""
        router = self.router
        if topic[:2] == "__" or not self.readers:
            return
        if not router.count or not router.wants(topic):
            # On a cluster node, other nodes' subscribers may want it: its shard's owner (this
            # node: the record is indexed here) fans it out (core/api/sessions.py).
            others = self.others_want
            if others is None or not others(topic):
                return
        own = self.own_topic
        if own is not None:
            if topic != own:
                self._own_entries.append((store, topic, queue, offset))
            return
        self._tapped.append((store, topic, queue, offset))
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._read_back)

    def _read_back(self) -> None:
        self._scheduled = False
        entries, self._tapped = self._tapped, []
        for store, topic, queue, offset in entries:
            try:
                found = store.read(topic, queue, offset, max_records=1)
            except Exception:
                log.exception("cannot read %s/%d@%d for live subscribers", topic, queue, offset)
                continue
            for queued in found:
                if queued.offset > offset:
                    continue
                if (
                    self._only_for_others(topic)
                    and not queued.link_headers
                    and _is_mqtt_publish(queued)
                ):
                    continue
                if self._held_back(store, queued):
                    continue
                self._deliver(queued, topic, offset)

    def _only_for_others(self, topic: str) -> bool:
        """Whether a record of ``topic`` was read back only for other nodes' subscribers (no
        live subscription here may match it)."""
        router = self.router
        return self.others_want is not None and not (router.count and router.wants(topic))

    def _deliver(self, queued: QueueRecord, topic: str, offset: int) -> None:
        for message in messages_of(queued):
            # Only the record's own topic entry: copies routed into queues are not
            # publishes to those queues.
            if message.offset < offset or (
                message.topic != topic and not is_dead_letter_in(message, topic)
            ):
                continue
            for reader in self.readers:
                reader(message)

    def _held_back(self, store: LogStore, queued: QueueRecord) -> bool:
        """A Kafka transaction's batch (held until its COMMIT marker) or a control batch
        (which delivers or drops what its producer's transaction held): True when the entry
        is not to be delivered now."""
        # The frame's flags and the batch header, read in place (no record decoded here).
        (flags,) = rec.FLAGS.unpack_from(queued.frame, rec.FLAGS_OFFSET)
        if not flags & rec.FLAG_BATCH:
            return False
        info = batch_txn(queued.body)
        if info is None:
            return False
        key = (queued.topic, queued.queue, info.producer_id)
        if not info.control:
            entry = (store, queued.topic, queued.queue, queued.offset)
            self._held.setdefault(key, []).append(entry)
            return True
        held = self._held.pop(key, ())
        if info.commit:
            # (a transaction's batches and its marker are in one partition: one store)
            for held_store, topic, queue, offset in held:
                try:
                    found = held_store.read(topic, queue, offset, max_records=1)
                except Exception:
                    log.exception("cannot read %s/%d@%d for live subscribers", topic, queue, offset)
                    continue
                for committed in found:
                    if committed.offset == offset:
                        self._deliver(committed, topic, offset)
        return True


def _is_mqtt_publish(queued: QueueRecord) -> bool:
    """Whether the entry's record is an MQTT publish visible since it was stored, read from its
    frame's header (nothing decoded). Another node's MQTT publish forwarded here was sent to the
    other nodes' subscribers by its publisher (core/api/sessions.py ``_fan_out``): read back
    only for them, it is skipped before it is decoded (``fan_out_live_record`` would drop it
    after). A delayed record come due or a committed half message became visible here, later:
    its publisher sent it to nobody, so it is read (``fan_out_live_record`` sends it); so is a
    copy (``FLAG_COPY``: a dead letter copied into this shard, or a routed copy, which
    ``_deliver`` drops). A dead letter indexed by a LINK (``link_headers``) is kept by the
    caller."""
    (flags,) = rec.FLAGS.unpack_from(queued.frame, rec.FLAGS_OFFSET)
    if flags & (rec.FLAG_DELAYED | rec.FLAG_HALF | rec.FLAG_COPY):
        return False
    return bool(queued.frame[_PROTOCOL_OFFSET] == rec.PROTOCOL_MQTT)


def is_dead_letter_in(message: Message, topic: str) -> bool:
    """Whether ``message`` is a record dead-lettered to ``topic`` (its entry there is the dead
    letter's own, as a publish to the dead-letter exchange)."""
    target = message.header(DEAD_LETTER_TOPIC_HEADER) if message.headers else None
    return target is not None and target == topic.encode()
