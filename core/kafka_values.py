"""Value types of the Kafka part of the Broker API (``core/api/`` re-exports them).

Small frozen records the API returns instead of core objects: the log's settings a
DescribeConfigs shows, an open transaction, a committed offset as it is given.
"""

from __future__ import annotations

from typing import NamedTuple

# (topic, partition, offset, leader epoch, metadata): one offset to commit for a group.
OffsetCommit = tuple[str, int, int, int, str]


class StorageSettings(NamedTuple):
    """The log's retention and segment size, and a topic's durability (``sync``/``async``)."""

    retention_ms: int | None
    retention_bytes: int | None
    segment_bytes: int
    durability: str


class OpenTransaction(NamedTuple):
    """A transaction still open: its id, its producer group and how many halves it holds."""

    transaction_id: str
    producer_group: str
    halves: int
