"""Options of the ``braid`` data source, and planning: which (queue, offset range) slices to read.

Pure functions over a :class:`core.log.LogReader` and the option strings Spark passes (keys are
case-insensitive there; here they are looked up case-insensitively too). ``docs/spark.md`` lists
every option. Planning never reads a record: bounds come from the queue indexes, times from
their binary-searched store times, so pruning options reduce what ``read()`` touches.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from core.log import LogReader, names
from core.log.txnindex import TxnOutcomes

# Kafka's spark source uses -2 and -1 inside a JSON offset map for "earliest" and "latest".
EARLIEST = -2
LATEST = -1
# One Spark partition reads at most this many records by default: about 400 MB of 100-byte
# records, one to three seconds of one core (Python decoding and Spark's conversion of the rows),
# so a failed task is cheap to redo. Fewer, larger tasks are faster: each Python task costs
# Spark 0.05-0.2 s to start.
DEFAULT_MAX_RECORDS_PER_PARTITION = 4_000_000
# ``minPartitions`` spreads a read over that many tasks (the cores, by default: see
# spark.register), but never into tasks of fewer records than this: below it a task's fixed cost
# outweighs what it parallelises.
MIN_RECORDS_PER_PARTITION = 100_000


class OptionError(ValueError):
    """An option the user passed is malformed (the user's fault, reported at planning)."""


@dataclass(frozen=True)
class Slice:
    """Offsets ``[start, end)`` of one queue; of one shard's queue in a cluster's data root
    (``shard`` None: a single-node directory)."""

    topic: str
    queue: int
    start: int
    end: int
    shard: int | None = None

    @property
    def records(self) -> int:
        return max(0, self.end - self.start)


@dataclass(frozen=True)
class ReadOptions:
    path: str
    topics: tuple[str, ...] | None = None
    topic_pattern: re.Pattern[str] | None = None
    queues: frozenset[int] | None = None
    topic_queues: frozenset[tuple[str, int]] | None = None
    starting: str | int | dict[str, dict[str, int]] = "earliest"
    ending: str | int | dict[str, dict[str, int]] = "latest"
    start_time_ms: int | None = None
    end_time_ms: int | None = None
    include_system: bool = False
    max_records_per_partition: int = DEFAULT_MAX_RECORDS_PER_PARTITION
    min_partitions: int = 1
    max_records_per_trigger: int | None = None
    verify_checksums: bool = True
    dedupe: bool = False
    include_aborted: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool = False) -> ReadOptions:
        lowered = {key.lower(): value for key, value in options.items()}

        def get(name: str) -> str | None:
            value = lowered.get(name.lower())
            return None if value is None or value.strip() == "" else value.strip()

        path = get("path")
        if path is None:
            raise OptionError("option 'path' (the broker's data directory) is required")
        topics = get("topics") or get("topic")
        queues, topic_queues = _parse_queues(get("queues"))
        pattern = get("topicPattern")
        starting = _parse_offsets(
            get("startingOffsets") or get("startingOffset"), "earliest", "startingOffsets"
        )
        ending = _parse_offsets(
            get("endingOffsets") or get("endingOffset"), "latest", "endingOffsets"
        )
        if streaming and ending != "latest":
            raise OptionError("endingOffsets is a batch option; a stream reads on as records come")
        return cls(
            path=path,
            topics=tuple(t.strip() for t in topics.split(",") if t.strip()) if topics else None,
            topic_pattern=re.compile(pattern) if pattern else None,
            queues=queues,
            topic_queues=topic_queues,
            starting=starting,
            ending=ending,
            start_time_ms=_parse_time(get("startTime"), "startTime"),
            end_time_ms=_parse_time(get("endTime"), "endTime"),
            include_system=_parse_bool(get("includeSystem"), False, "includeSystem"),
            max_records_per_partition=_parse_positive(
                get("maxRecordsPerPartition"), None, "maxRecordsPerPartition"
            )
            or DEFAULT_MAX_RECORDS_PER_PARTITION,
            min_partitions=_parse_positive(get("minPartitions"), 1, "minPartitions") or 1,
            max_records_per_trigger=_parse_positive(
                get("maxRecordsPerTrigger"), None, "maxRecordsPerTrigger"
            ),
            verify_checksums=_parse_bool(get("verifyChecksums"), True, "verifyChecksums"),
            dedupe=_parse_bool(get("dedupe"), False, "dedupe"),
            include_aborted=_parse_bool(get("includeAborted"), False, "includeAborted"),
        )

    # -- selection -------------------------------------------------------------------------

    def selects(self, topic: str, queue: int) -> bool:
        named = self.topics is not None and topic in self.topics
        if names.is_system_topic(topic) and not (self.include_system or named):
            return False
        if self.topics is not None and not named:
            return False
        if self.topic_pattern is not None and not self.topic_pattern.fullmatch(topic):
            return False
        if self.queues is not None or self.topic_queues is not None:
            in_all = self.queues is not None and queue in self.queues
            in_topic = self.topic_queues is not None and (topic, queue) in self.topic_queues
            return in_all or in_topic
        return True

    def selected_queues(self, reader: LogReader) -> list[tuple[str, int]]:
        return [key for key in reader.queues(include_system=True) if self.selects(*key)]

    # -- offset ranges ---------------------------------------------------------------------

    def bounds(
        self, reader: LogReader, topic: str, queue: int, transactions: TxnOutcomes | None = None
    ) -> tuple[int, int]:
        """``(first offset, readable end)`` of a queue. With ``transactions`` (a read of
        committed data), the end of a user topic's queue is its Last Stable Offset: nothing at
        or past the first record of a Kafka transaction still open is read, as Kafka's
        read_committed consumers (a record shown is never one that is later aborted). System
        topics are read as stored."""
        first, after = reader.queue_bounds(topic, queue)
        if transactions is not None and not names.is_system_topic(topic):
            after = max(first, min(after, transactions.last_stable_offset(reader, topic, queue)))
        return first, after

    def start_offset(
        self, reader: LogReader, topic: str, queue: int, transactions: TxnOutcomes | None = None
    ) -> int:
        first, after = self.bounds(reader, topic, queue, transactions)
        offset = _resolve(self.starting, topic, queue, first, after, default=EARLIEST)
        if self.start_time_ms is not None:
            offset = max(offset, reader.offset_for_time(topic, queue, self.start_time_ms))
        return max(first, min(offset, after))

    def end_offset(
        self, reader: LogReader, topic: str, queue: int, transactions: TxnOutcomes | None = None
    ) -> int:
        first, after = self.bounds(reader, topic, queue, transactions)
        offset = _resolve(self.ending, topic, queue, first, after, default=LATEST)
        if self.end_time_ms is not None:
            offset = min(offset, reader.offset_for_time(topic, queue, self.end_time_ms))
        return max(first, min(offset, after))

    def batch_slices(
        self, reader: LogReader, transactions: TxnOutcomes | None = None, shard: int | None = None
    ) -> list[Slice]:
        """The non-empty slices a batch read covers, one per selected queue (each ending at its
        Last Stable Offset with ``transactions``: see :meth:`bounds`), of ``reader``, shard
        ``shard`` of a cluster's data root (None: a single-node directory)."""
        out: list[Slice] = []
        for topic, queue in self.selected_queues(reader):
            start = self.start_offset(reader, topic, queue, transactions)
            end = self.end_offset(reader, topic, queue, transactions)
            if end > start:
                out.append(Slice(topic, queue, start, end, shard))
        return out


def partition_count(records: int, max_records: int, min_partitions: int = 1) -> int:
    """How many partitions ``records`` records are read in: enough that none holds more than
    ``max_records``; at least ``min_partitions`` (the cores) when there are enough records for
    each to get ``MIN_RECORDS_PER_PARTITION``; and, once above ``min_partitions``, a multiple
    of it, so that every wave of tasks keeps every core busy (5 equal tasks on 2 cores take 3
    task-times, 6 smaller ones 2.5)."""
    if records <= 0:
        return 0
    count = -(-records // max_records)
    spread = max(1, min(min_partitions, records // MIN_RECORDS_PER_PARTITION))
    if count > spread > 1:
        count = -(-count // spread) * spread
    return min(max(count, spread), records)


def pack_slices(
    slices: Iterable[Slice], max_records: int, min_partitions: int = 1
) -> list[list[Slice]]:
    """Group slices into :func:`partition_count` partitions of equal size (within one record):
    a large queue is cut into several consecutive ranges, small queues share one partition
    (10,000 MQTT session queues of a few records must not become 10,000 tasks)."""
    pieces = [piece for piece in slices if piece.records]
    total = sum(piece.records for piece in pieces)
    count = partition_count(total, max_records, min_partitions)
    partitions: list[list[Slice]] = []
    current: list[Slice] = []
    current_records = 0
    for piece in pieces:
        start = piece.start
        while start < piece.end:
            # Partition n ends after ceil((n + 1) * total / count) records: sizes differ by <= 1.
            done = len(partitions)
            target = -(-(done + 1) * total // count) + (done * total // -count)
            end = min(piece.end, start + target - current_records)
            current.append(Slice(piece.topic, piece.queue, start, end, piece.shard))
            current_records += end - start
            start = end
            if current_records >= target:
                partitions.append(current)
                current, current_records = [], 0
    if current:
        partitions.append(current)
    return partitions


# -- parsing helpers -------------------------------------------------------------------------


def _parse_queues(
    raw: str | None,
) -> tuple[frozenset[int] | None, frozenset[tuple[str, int]] | None]:
    """``"0,2"`` selects queues 0 and 2 of every topic; ``"orders:1"`` queue 1 of ``orders``."""
    if raw is None:
        return None, None
    plain: set[int] = set()
    per_topic: set[tuple[str, int]] = set()
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        topic, _, number = item.rpartition(":")
        if not number.isdigit():
            raise OptionError(f"queues: {item!r} is neither N nor topic:N")
        if topic:
            per_topic.add((topic, int(number)))
        else:
            plain.add(int(number))
    return (frozenset(plain) if plain else None, frozenset(per_topic) if per_topic else None)


def _parse_offsets(
    raw: str | None, default: str, option: str
) -> str | int | dict[str, dict[str, int]]:
    """``earliest``, ``latest``, one integer for every queue, or Kafka-style JSON
    ``{"topic": {"queue": offset}}`` with -2 for earliest and -1 for latest."""
    if raw is None:
        return default
    if raw.lower() in ("earliest", "latest"):
        return raw.lower()
    if raw.lstrip("-").isdigit():
        return int(raw)
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as error:
        raise OptionError(f"{option}: not earliest/latest, an integer or JSON: {raw!r}") from error
    if not isinstance(parsed, dict) or not all(isinstance(v, dict) for v in parsed.values()):
        raise OptionError(f'{option}: JSON must look like {{"topic": {{"0": 42}}}}')
    return {
        str(topic): {str(queue): int(offset) for queue, offset in queues.items()}
        for topic, queues in parsed.items()
    }


def _resolve(
    spec: str | int | dict[str, dict[str, int]],
    topic: str,
    queue: int,
    first: int,
    after: int,
    *,
    default: int,
) -> int:
    if isinstance(spec, dict):
        value = spec.get(topic, {}).get(str(queue), default)
    elif isinstance(spec, int):
        value = spec
    else:
        value = EARLIEST if spec == "earliest" else LATEST
    if value == EARLIEST:
        return first
    if value == LATEST:
        return after
    if value < 0:
        raise OptionError(f"offset {value} for {topic}/{queue}: use -2 (earliest) or -1 (latest)")
    return value


def _parse_time(raw: str | None, option: str) -> int | None:
    """Milliseconds since the epoch, or an ISO-8601 time (UTC unless it names a zone)."""
    if raw is None:
        return None
    if raw.isdigit():
        return int(raw)
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError as error:
        raise OptionError(f"{option}: not epoch milliseconds or ISO-8601: {raw!r}") from error
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _parse_bool(raw: str | None, default: bool, option: str) -> bool:
    if raw is None:
        return default
    lowered = raw.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise OptionError(f"{option}: expected true or false, not {raw!r}")


def _parse_positive(raw: str | None, default: int | None, option: str) -> int | None:
    if raw is None:
        return default
    if not raw.isdigit() or int(raw) <= 0:
        raise OptionError(f"{option}: expected a positive integer, not {raw!r}")
    return int(raw)
