"""A topic's own retention (Kafka's retention.ms / retention.bytes topic configs) as the log's
retention applies it (core/log/retention.py): its queues' start moves past what it no longer
keeps, and the commit-log segments its live records are in are kept past the log's limits."""

from __future__ import annotations

import time
from pathlib import Path

from core.log import LogStore
from core.log.retention import TopicLimits, stored_bytes
from tests.log.conftest import SMALL_SEGMENT, small_config

RECORD = b"y" * 1000


def test_a_topic_with_its_own_limits_holds_its_segments(tmp_path: Path) -> None:
    store = LogStore(small_config(tmp_path / "r", retention_bytes=2 * SMALL_SEGMENT))
    store.append("kept", 0, RECORD)  # in the first segment
    for _ in range(300):
        store.append("other", 0, RECORD)
    assert len(store.commitlog.segments) > 3
    limits = {"kept": TopicLimits(None, None)}  # no limit: kept forever
    store.retention.topic_limits = lambda: limits
    assert store.enforce_retention() == []  # the first segment holds "kept"'s record
    assert store.queue_bounds("kept", 0) == (0, 1)
    # Its own size limit lets the record go, and with it the segments.
    limits["kept"] = TopicLimits(None, 0)
    deleted = store.enforce_retention()
    assert deleted[0] == 0
    assert store.queue_bounds("kept", 0) == (1, 1)
    assert len(store.commitlog.segments) == 2
    store.close()


def test_a_topic_keeps_its_newest_records_by_time_and_size(tmp_path: Path) -> None:
    store = LogStore(small_config(tmp_path / "t"))
    for _ in range(10):
        store.append("t", 0, RECORD)
    index = store.queue_index("t", 0)
    assert index is not None
    size = stored_bytes(index, 0, 10)
    assert size == sum(index.entry(n).size for n in range(10))
    # Room for three records' frames: the seven oldest go.
    store.retention.topic_limits = lambda: {"t": TopicLimits(None, 3 * size // 10)}
    assert store.retention.trim_topics() == 7
    assert store.queue_bounds("t", 0) == (7, 10)
    assert [entry.offset for entry in store.read("t", 0, 0)] == [7, 8, 9]
    # By time: an hour later, a one-minute limit keeps none.
    later = time.time_ns() // 1_000_000 + 3_600_000
    store.retention.topic_limits = lambda: {"t": TopicLimits(60_000, None)}
    assert store.retention.trim_topics(later) == 3
    assert store.queue_bounds("t", 0) == (10, 10)
    store.close()
