"""A transaction's commit decision as one frame: a LINK that is also a record of
``__transactions/0`` (``FLAG_LINK | FLAG_LINK_INDEXED``, see :mod:`core.log.record`).

Deciding and making the halves visible are then one frame, so no crash separates them, and a
commit costs one append. The frame carries the decision's key (transaction id), client
(producer group), tags and headers (see :mod:`core.transactions.layout`); its body names the
halves. Replaying it (recovery, or the general append path) indexes it in ``__transactions/0``,
then each half into its destinations (:meth:`core.log.index_writer.IndexWriter.dispatch`).

:meth:`DecisionWriter.append` is the fast path, a commit per transaction making it as hot as a
publish: the frame head is shared while the field lengths and the millisecond repeat, the frame
is packed into the mapping in one call, and it is indexed without parsing back the frame just
encoded (the general path re-reads it: about a third of a commit's cost), from what the service
knows of each half when it has a :class:`TargetIndex` for every one (about a fifth more).
:meth:`DecisionWriter.append_reference` is the plain version, ``LogStore.append`` of the same
fields; the parity tests (``tests/log/test_frame_parity.py``) compare the two byte for byte.

Not thread-safe: the event-loop thread of the store's writer.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

from crc32c import crc32c

from core.log import frames
from core.log import record as rec
from core.log.names import TRANSACTIONS_TOPIC
from core.log.store import Appended, LogStore, encoded_headers
from core.log.tags import tags_mask

_new_tuple = tuple.__new__
_TRANSACTIONS_TOPIC_BYTES = TRANSACTIONS_TOPIC.encode()
_OWN_QUEUE = (TRANSACTIONS_TOPIC, 0)  # where a decision is itself indexed
# One target of a LINK body (see core.log.record.encode_link_body).
_LINK_TARGET = struct.Struct("<QI")
# What follows the head in a decision frame, packed as one string: key, headers, tags, client,
# destinations, body.
DecisionLayout = tuple[int, int, int, int, int, int, int]


class LinkDecision(NamedTuple):
    """The record fields of a commit decision. ``headers`` may arrive encoded
    (:func:`core.log.record.encode_headers`)."""

    key: bytes
    client: str
    tags: Sequence[str]
    headers: rec.Headers | bytes


class TargetIndex(NamedTuple):
    """How a half is indexed once committed, when the caller knows it already (it appended the
    half): tag mask, record count, and the half's own destinations (its ``destinations``, or
    its own (topic, queue))."""

    tag_mask: int
    record_count: int
    destinations: Sequence[tuple[str, int]]


# Decision frame Structs by the length of what follows the head (the head's length is fixed).
_decision_structs: dict[int, struct.Struct] = {}


def decision_head(
    layout: DecisionLayout,
) -> tuple[DecisionLayout, bytes, int, struct.Struct]:
    """The head of a decision frame for ``layout`` (store_ms, then the lengths of key, headers,
    tags, client, destinations and body), its CRC32C, and the Struct packing the whole frame."""
    store_ms, key_len, headers_len, tags_len, client_len, dests_len, body_len = layout
    head = (
        frames.HEAD_TAIL.pack(
            rec.FLAG_LINK | rec.FLAG_LINK_INDEXED,
            rec.PROTOCOL_INTERNAL,
            store_ms,
            store_ms,  # born_ms
            0,  # deliver_at_ms
            0,  # queue
            1,  # record_count
            len(_TRANSACTIONS_TOPIC_BYTES),
            0,  # subject
            key_len,
            headers_len,
            tags_len,
            client_len,
            0,  # address
            dests_len,
            body_len,
        )
        + _TRANSACTIONS_TOPIC_BYTES
    )
    # The fields after the head go in as one string (joined, then checksummed in one call).
    rest_len = key_len + headers_len + tags_len + client_len + dests_len + body_len
    frame = _decision_structs.get(rest_len)
    if frame is None:
        if len(_decision_structs) >= 4096:
            _decision_structs.clear()  # id and group lengths vary without bound
        frame = _decision_structs[rest_len] = struct.Struct(
            f"{rec.PREFIX.format}{len(head)}s{rest_len}s"
        )
    return layout, head, crc32c(head), frame


class DecisionWriter:
    """Appends commit decisions to ``store``."""

    def __init__(self, store: LogStore) -> None:
        self.store = store
        # Decision tags -> (encoded, index mask): a commit's tags never change.
        self._tags: dict[Sequence[str], tuple[bytes, int]] = {}
        # The last decision head (see decision_head).
        self._head: tuple[DecisionLayout, bytes, int, struct.Struct] | None = None

    def append_reference(
        self,
        targets: Sequence[tuple[int, int]],
        decision: LinkDecision,
        destinations: Sequence[tuple[str, int]] | None = None,
    ) -> Appended:
        """The decision frame through the general encoder and dispatch: linking ``targets``
        (``(position, frame size)`` of each half) into ``destinations``, or each into its own."""
        return self.store.append(
            TRANSACTIONS_TOPIC,
            0,
            rec.encode_link_body(targets),
            key=decision.key,
            headers=decision.headers,
            tags=decision.tags,
            client=decision.client,
            destinations=list(destinations) if destinations else None,
            flags=rec.FLAG_LINK | rec.FLAG_LINK_INDEXED,
        )

    def append(
        self,
        targets: Sequence[tuple[int, int]],
        decision: LinkDecision,
        known_targets: Sequence[TargetIndex] | None = None,
        destinations: Sequence[tuple[str, int]] | None = None,
    ) -> Appended:
        """:meth:`append_reference`, fast. ``known_targets``: each target's
        :class:`TargetIndex` (all of them, or None: they are read from the targets' frames)."""
        store = self.store
        if not store.fast_paths:
            return self.append_reference(targets, decision, destinations)
        store_ms = frames.clock_ns() // 1_000_000
        tags = decision.tags
        cached = self._tags.get(tags)
        if cached is None:
            cached = self._tags[tags] = (rec.encode_tags(tags), tags_mask(tags))
        tag_bytes, own_mask = cached
        key = decision.key
        headers = encoded_headers(decision.headers)
        client = decision.client.encode()
        body = (
            _LINK_TARGET.pack(*targets[0]) if len(targets) == 1 else rec.encode_link_body(targets)
        )
        dests = rec.encode_destinations(destinations) if destinations else b""
        layout = (
            store_ms,
            len(key),
            len(headers),
            len(tag_bytes),
            len(client),
            len(dests),
            len(body),
        )
        head = self._head
        if head is None or head[0] != layout:
            head = self._head = decision_head(layout)
        _, head_bytes, head_crc, frame = head
        size = frame.size
        rest = b"".join((key, headers, tag_bytes, client, dests, body))
        position = store.frames.write_packed(frame, crc32c(rest, head_crc), head_bytes, rest)
        indexes = store.indexes
        add = indexes.add
        queues = indexes.queues
        own = queues.get(_OWN_QUEUE) or indexes.queue(TRANSACTIONS_TOPIC, 0)
        first = add(TRANSACTIONS_TOPIC, 0, own, position, size, 1, own_mask, store_ms)
        offsets = [(TRANSACTIONS_TOPIC, 0, first)]
        if known_targets is None:
            offsets += indexes.link_targets(position, size, targets, destinations, False, store_ms)
            return Appended(position, position + size, offsets)
        # The entries IndexWriter.link_targets writes for this frame, in the same order.
        for (target_position, target_size), known in zip(targets, known_targets, strict=True):
            for topic, queue in destinations or known.destinations:
                index = queues.get((topic, queue)) or indexes.queue(topic, queue)
                offset = add(
                    topic,
                    queue,
                    index,
                    target_position,
                    target_size,
                    known.record_count,
                    known.tag_mask,
                    store_ms,
                )
                offsets.append((topic, queue, offset))
        return _new_tuple(Appended, (position, position + size, offsets))
