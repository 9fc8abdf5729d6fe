"""The ``braid`` PySpark data source: batch and structured-streaming reads of a BraidMQ log.

Spark pickles these classes (by reference: they must live in an importable module, never in
``__main__``) and runs ``partitions()`` in a planner worker and ``read()`` in executor workers,
each a separate Python process that opens the data directory read-only. Keep ``struct`` objects
and other unpicklable state out of this module's globals: the decoding lives in
:mod:`spark.decode`, imported where it is used.

Streaming offsets are JSON ``{"topic": {"queue": next_offset}}`` for a single-node directory; for
a cluster's data root, ``{"format": 2, "shards": {"0003": {"topic": {"queue": next_offset}}}}``,
the same per shard (shards holding no selected queue left out). An unversioned offset read on a
root is the one a stream wrote before the directory was adopted: its shard is the adopted one
(``legacy_shard``). A queue absent from a start offset starts at its earliest offset (queues,
and shards, created while a query runs are read from their beginning).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)

try:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # PySpark < 4.2: no admission control for Python streams; batch reads work
    from spark._compat import (  # type: ignore[assignment]
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

from spark.options import OptionError, ReadOptions, Slice, pack_slices
from spark.schema import FORMAT, columns_of, spark_schema

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from core.log import LogReader
    from core.log.txnindex import TxnOutcomes
    from spark.readers import DataRoot

Offsets = dict[str, dict[str, int]]
# A stream's position in every shard (the key None: a single-node directory).
ShardOffsets = dict[int | None, Offsets]
# The version of a cluster root's stream offsets; a single-node directory's have none (they
# are its Offsets themselves, as before there were shards, so its checkpoints still resume).
ROOT_OFFSETS_FORMAT = 2


class BraidPartition(InputPartition):  # type: ignore[misc]
    """One Spark task: consecutive offset ranges of one or more queues."""

    def __init__(self, slices: Sequence[Slice]) -> None:
        super().__init__([(s.shard, s.topic, s.queue, s.start, s.end) for s in slices])
        self.slices = tuple(slices)

    @property
    def records(self) -> int:
        return sum(piece.records for piece in self.slices)


class BraidDataSource(DataSource):  # type: ignore[misc]
    """``spark.read.format("braid").option("path", DATA_DIR).load()``."""

    # ``minPartitions`` when a read does not set it: the session's parallelism, set on the
    # subclass that spark.register registers (see with_default_min_partitions).
    default_min_partitions: ClassVar[int | None] = None

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return spark_schema()

    def _options(self) -> dict[str, str]:
        options = dict(self.options)
        given = {key.lower() for key in options}
        if self.default_min_partitions and "minpartitions" not in given:
            options["minPartitions"] = str(self.default_min_partitions)
        return options

    def reader(self, schema: StructType) -> DataSourceReader:
        return BraidBatchReader(ReadOptions.parse(self._options()), columns_of(schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = ReadOptions.parse(self._options(), streaming=True)
        return BraidStreamReader(options, columns_of(schema))


def with_default_min_partitions(min_partitions: int | None) -> type[BraidDataSource]:
    """:class:`BraidDataSource`, or a subclass whose reads default to ``minPartitions =
    min_partitions``. Python data sources see only their reads' options, and run in worker
    processes: the subclass made here is not a module attribute, so the cloudpickle that
    ``spark.dataSource.register`` uses copies it by value, default included (its base class
    travels by reference, as usual)."""
    if not min_partitions or min_partitions <= 1:
        return BraidDataSource
    name = f"BraidDataSource_minPartitions_{min_partitions}"
    attributes = {
        "default_min_partitions": min_partitions,
        "__module__": __name__,
        "__qualname__": name,
        "__doc__": BraidDataSource.__doc__,
    }
    return type(name, (BraidDataSource,), attributes)


def with_name(source: type[BraidDataSource], name: str) -> type[BraidDataSource]:
    """``source`` registered under another name (``braid_python``: the Python source, whatever
    ``braid`` resolves to), pickled by value as :func:`with_default_min_partitions`' classes."""
    attributes = {
        "name": classmethod(lambda cls: name),
        "__module__": __name__,
        "__qualname__": f"{source.__qualname__}_as_{name}",
        "__doc__": source.__doc__,
    }
    return type(f"{source.__name__}_as_{name}", (source,), attributes)


def _root(options: ReadOptions) -> DataRoot:
    from spark import readers

    return readers.data_root(options.path)


def _shards(root: DataRoot, *, refresh: bool = False) -> list[tuple[int | None, LogReader]]:
    """The reader of each shard holding a log (one, shard None, for a single-node directory)."""
    from spark import readers

    return readers.open_shards(root, refresh_readers=refresh)


def _shard_reader(options: ReadOptions, shard: int | None) -> LogReader:
    from spark import readers

    return readers.open_reader(readers.shard_dir(options.path, shard))


def _transactions(reader: LogReader) -> TxnOutcomes:
    """The Kafka transactions' outcomes, read after ``reader`` was refreshed: planning ends
    each queue at its Last Stable Offset (ReadOptions.bounds)."""
    from spark import readers

    return readers.transactions(reader)


def _read(
    options: ReadOptions, columns: tuple[str, ...], partition: InputPartition
) -> Iterator[pa.RecordBatch]:
    from spark import decode

    if not isinstance(partition, BraidPartition):
        return  # Spark plans one empty InputPartition(None) when partitions() returns none
    for piece in partition.slices:
        yield from decode.read_range(
            _shard_reader(options, piece.shard),
            piece.topic,
            piece.queue,
            piece.start,
            piece.end,
            verify_checksums=options.verify_checksums,
            dedupe=options.dedupe,
            include_aborted=options.include_aborted,
            columns=columns,
            shard=piece.shard,
        )


class BraidBatchReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, options: ReadOptions, columns: tuple[str, ...]) -> None:
        self.options = options
        self.columns = columns

    def partitions(self) -> Sequence[InputPartition]:
        slices: list[Slice] = []
        for shard, reader in _shards(_root(self.options), refresh=True):
            slices.extend(self.options.batch_slices(reader, _transactions(reader), shard))
        packed = pack_slices(
            slices, self.options.max_records_per_partition, self.options.min_partitions
        )
        return [BraidPartition(group) for group in packed]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, self.columns, partition)


class BraidStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """Micro-batches over the queues' offsets. ``latestOffset`` refreshes the reader so it sees
    what a running broker appended; ``maxRecordsPerTrigger`` caps a micro-batch (shared out over
    queues in proportion to what each has waiting); under ``Trigger.AvailableNow`` the target is
    fixed when the query starts and reached in capped steps."""

    def __init__(self, options: ReadOptions, columns: tuple[str, ...]) -> None:
        self.options = options
        self.columns = columns
        self.target: ShardOffsets | None = None

    # -- offsets ---------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        root = _root(self.options)
        by_shard: ShardOffsets = {}
        for shard, reader in _shards(root, refresh=True):
            transactions = _transactions(reader)
            offsets = by_shard.setdefault(shard, {})
            for topic, queue in self.options.selected_queues(reader):
                offsets.setdefault(topic, {})[str(queue)] = self.options.start_offset(
                    reader, topic, queue, transactions
                )
        return encode_offsets(by_shard, root)

    def _available(self, root: DataRoot) -> ShardOffsets:
        """Where each queue's readable records end now, in every shard: its Last Stable
        Offset, so a micro-batch never passes a Kafka transaction still open
        (ReadOptions.bounds)."""
        by_shard: ShardOffsets = {}
        for shard, reader in _shards(root, refresh=True):
            transactions = _transactions(reader)
            offsets = by_shard.setdefault(shard, {})
            for topic, queue in self.options.selected_queues(reader):
                offsets.setdefault(topic, {})[str(queue)] = self.options.bounds(
                    reader, topic, queue, transactions
                )[1]
        return by_shard

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._available(_root(self.options))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_records_per_trigger)

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, Any]:
        """The end of the next micro-batch. (PySpark < 4.2 calls it without arguments: then
        everything available, uncapped.)"""
        root = _root(self.options)
        latest = self.target if self.target is not None else self._available(root)
        if start is None:
            return encode_offsets(latest, root)
        begin = decode_offsets(start, root)
        for shard, offsets in latest.items():  # a queue new since `start` begins at its earliest
            known = begin.setdefault(shard, {})
            for topic, queues in offsets.items():
                for queue in queues:
                    if queue not in known.setdefault(topic, {}):
                        reader = _shard_reader(self.options, shard)
                        known[topic][queue] = reader.queue_bounds(topic, int(queue))[0]
        end = {
            shard: merge_offsets(begin.get(shard, {}), latest.get(shard, {}))
            for shard in _shard_order(set(begin) | set(latest))
        }
        if isinstance(limit, ReadMaxRows):
            end = cap_shard_offsets(begin, end, limit.max_rows)
        return encode_offsets(end, root)

    def reportLatestOffset(self) -> dict[str, Any]:
        root = _root(self.options)
        return encode_offsets(self._available(root), root)

    # -- planning and reading --------------------------------------------------------------

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        root = _root(self.options)
        begin = decode_offsets(start, root)
        stop = decode_offsets(end, root)
        slices = []
        for shard in _shard_order(stop):
            for topic, queues in sorted(stop[shard].items()):
                for queue_key, last in sorted(queues.items(), key=lambda item: int(item[0])):
                    queue = int(queue_key)
                    first = begin.get(shard, {}).get(topic, {}).get(queue_key)
                    if first is None:
                        first = _shard_reader(self.options, shard).queue_bounds(topic, queue)[0]
                    if last > first:
                        slices.append(Slice(topic, queue, first, last, shard))
        packed = pack_slices(
            slices, self.options.max_records_per_partition, self.options.min_partitions
        )
        return [BraidPartition(group) for group in packed]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, self.columns, partition)

    def commit(self, end: Offsets) -> None:
        """Nothing to release: the log is read in place, and what a stream has read does not
        hold back retention (a query that falls behind retention resumes at the oldest record
        still stored)."""

    def stop(self) -> None:
        from spark import readers

        readers.close_readers()


def _shard_order(shards: Iterable[int | None]) -> list[int | None]:
    """Shards in ascending order (None, a single-node directory, is alone)."""
    return sorted(shards, key=lambda shard: -1 if shard is None else shard)


def encode_offsets(by_shard: ShardOffsets, root: DataRoot) -> dict[str, Any]:
    """A stream's offsets as JSON-ready data: a single-node directory's Offsets as they always
    were; a cluster root's versioned, per shard (``%04d``, ascending; empty shards left out)."""
    if not root.is_root:
        return dict(by_shard.get(None, {}))
    return {
        "format": ROOT_OFFSETS_FORMAT,
        "shards": {
            f"{shard:04d}": offsets
            for shard, offsets in sorted((k, v) for k, v in by_shard.items() if k is not None)
            if offsets
        },
    }


def decode_offsets(offsets: Mapping[str, Any], root: DataRoot) -> ShardOffsets:
    """:func:`encode_offsets` undone. An unversioned offset (a single-node directory's: its
    values are topics' queue maps, never a number) read on a cluster root was written before
    the directory was adopted: it is the adopted shard's (``legacy_shard``)."""
    version = offsets.get("format")
    if isinstance(version, int):
        if version != ROOT_OFFSETS_FORMAT:
            raise OptionError(f"stream offsets of format {version}: this reader knows 1 and 2")
        if not root.is_root:
            raise OptionError(
                f"the stream's offsets are a cluster root's (per shard), but {root.path} is a "
                "single-node data directory"
            )
        return {int(shard): dict(queues) for shard, queues in offsets["shards"].items()}
    single = {str(topic): dict(queues) for topic, queues in offsets.items()}
    if not root.is_root:
        return {None: single}
    if not single:
        return {}
    if root.legacy_shard is None:
        raise OptionError(
            f"the stream's offsets are a single-node directory's, and the cluster root "
            f"{root.path} adopted none (no legacy shard): start the query with a new checkpoint"
        )
    return {root.legacy_shard: single}


def merge_offsets(start: Offsets, latest: Offsets) -> Offsets:
    """``latest`` for every queue, never behind ``start`` (an offset never goes backwards, even
    when retention moved a queue's start)."""
    merged: Offsets = {}
    for topic in sorted(set(start) | set(latest)):
        queues = dict(start.get(topic, {}))
        for queue, offset in latest.get(topic, {}).items():
            queues[queue] = max(offset, queues.get(queue, offset))
        merged[topic] = queues
    return merged


def cap_offsets(start: Offsets, end: Offsets, max_rows: int) -> Offsets:
    """:func:`cap_shard_offsets` of a single-node directory's offsets."""
    return cap_shard_offsets({None: start}, {None: end}, max_rows)[None]


def cap_shard_offsets(start: ShardOffsets, end: ShardOffsets, max_rows: int) -> ShardOffsets:
    """Move ``end`` back so at most ``max_rows`` records lie between ``start`` and it, shared
    out over queues (of every shard) in proportion to their backlog (Kafka source's rate
    limit), at least one record per backlogged queue while the budget lasts (queues in (shard,
    topic, queue) order), so a cap smaller than the number of queues still makes progress."""
    backlog: dict[tuple[int, str, str], tuple[int, int]] = {}
    for shard, offsets in end.items():
        for topic, queues in offsets.items():
            for queue, stop in queues.items():
                begin = start.get(shard, {}).get(topic, {}).get(queue, 0)
                if stop > begin:
                    backlog[(-1 if shard is None else shard, topic, queue)] = (begin, stop)
    total = sum(stop - begin for begin, stop in backlog.values())
    if total <= max_rows:
        return end
    capped: ShardOffsets = {
        shard: {topic: dict(queues) for topic, queues in offsets.items()}
        for shard, offsets in end.items()
    }

    def queues_of(key: tuple[int, str, str]) -> dict[str, int]:
        return capped[None if key[0] < 0 else key[0]][key[1]]

    budget = max_rows
    order = sorted(backlog)
    for key in order:
        begin, stop = backlog[key]
        share = min(max(1, (stop - begin) * max_rows // total), stop - begin, budget)
        queues_of(key)[key[2]] = begin + share
        budget -= share
    for key in order:  # what rounding down left over, first come first served
        if budget <= 0:
            break
        stop = backlog[key][1]
        extra = min(budget, stop - queues_of(key)[key[2]])
        queues_of(key)[key[2]] += extra
        budget -= extra
    return capped
