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

Not thread-safe: the event loop's thread, like the store's appends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from core.deadletter.policy import DEAD_LETTER_TOPIC_HEADER
from core.delivery.message import Message, messages_of
from core.log import LogStore
from core.log import record as rec
from core.log.reader import QueueRecord
from core.log.txnindex import batch_txn
from core.routing.live import LiveRouter

log = logging.getLogger(__name__)

LiveReader = Callable[[Message], None]
_Entry = tuple[str, int, int]  # (topic, queue, offset) of an index entry


class LiveFeed:
    """One per broker: the live router and the reading-back of others' records for it."""

    def __init__(self, store: LogStore) -> None:
        self.store = store
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
        store.index_listeners.append(self._on_index)

    def close(self) -> None:
        if self._on_index in self.store.index_listeners:
            self.store.index_listeners.remove(self._on_index)
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

    def _on_index(self, topic: str, queue: int, offset: int) -> None:
        """The log indexed a record (store index listener, inside the append)."""
        router = self.router
        if not router.count or topic[:2] == "__" or not self.readers or not router.wants(topic):
            return
        own = self.own_topic
        if own is not None:
            if topic != own:
                self._own_entries.append((topic, queue, offset))
            return
        self._tapped.append((topic, queue, offset))
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._read_back)

    def _read_back(self) -> None:
        self._scheduled = False
        entries, self._tapped = self._tapped, []
        store = self.store
        for topic, queue, offset in entries:
            try:
                found = store.read(topic, queue, offset, max_records=1)
            except Exception:
                log.exception("cannot read %s/%d@%d for live subscribers", topic, queue, offset)
                continue
            for queued in found:
                if queued.offset > offset:
                    continue
                if self._held_back(queued):
                    continue
                self._deliver(queued, topic, offset)

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

    def _held_back(self, queued: QueueRecord) -> bool:
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
            self._held.setdefault(key, []).append((queued.topic, queued.queue, queued.offset))
            return True
        held = self._held.pop(key, ())
        if info.commit:
            for topic, queue, offset in held:
                try:
                    found = self.store.read(topic, queue, offset, max_records=1)
                except Exception:
                    log.exception("cannot read %s/%d@%d for live subscribers", topic, queue, offset)
                    continue
                for committed in found:
                    if committed.offset == offset:
                        self._deliver(committed, topic, offset)
        return True


def is_dead_letter_in(message: Message, topic: str) -> bool:
    """Whether ``message`` is a record dead-lettered to ``topic`` (its entry there is the dead
    letter's own, as a publish to the dead-letter exchange)."""
    target = message.header(DEAD_LETTER_TOPIC_HEADER) if message.headers else None
    return target is not None and target == topic.encode()
