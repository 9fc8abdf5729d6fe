"""The ``braid`` PySpark data source: batch and structured-streaming reads of a BraidMQ log.

Spark pickles these classes (by reference: they must live in an importable module, never in
``__main__``) and runs ``partitions()`` in a planner worker and ``read()`` in executor workers,
each a separate Python process that opens the data directory read-only. Keep ``struct`` objects
and other unpicklable state out of this module's globals: the decoding lives in
:mod:`spark.decode`, imported where it is used.

Streaming offsets are JSON ``{"topic": {"queue": next_offset}}``: a queue absent from a start
offset starts at its earliest offset (queues created while a query runs are read from their
beginning).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar

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

from spark.options import ReadOptions, Slice, pack_slices
from spark.schema import FORMAT, columns_of, spark_schema

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from core.log import LogReader
    from core.log.txnindex import TxnOutcomes

Offsets = dict[str, dict[str, int]]


class BraidPartition(InputPartition):  # type: ignore[misc]
    """One Spark task: consecutive offset ranges of one or more queues."""

    def __init__(self, slices: Sequence[Slice]) -> None:
        super().__init__([(s.topic, s.queue, s.start, s.end) for s in slices])
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


def _reader(options: ReadOptions, *, refresh: bool = False) -> LogReader:
    from spark import readers

    reader = readers.open_reader(options.path)
    if refresh:
        readers.refresh(reader)
    return reader


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
    reader = _reader(options)
    for piece in partition.slices:
        yield from decode.read_range(
            reader,
            piece.topic,
            piece.queue,
            piece.start,
            piece.end,
            verify_checksums=options.verify_checksums,
            dedupe=options.dedupe,
            include_aborted=options.include_aborted,
            columns=columns,
        )


class BraidBatchReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, options: ReadOptions, columns: tuple[str, ...]) -> None:
        self.options = options
        self.columns = columns

    def partitions(self) -> Sequence[InputPartition]:
        reader = _reader(self.options, refresh=True)
        slices = self.options.batch_slices(reader, _transactions(reader))
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
        self.target: Offsets | None = None

    # -- offsets ---------------------------------------------------------------------------

    def initialOffset(self) -> Offsets:
        reader = _reader(self.options, refresh=True)
        transactions = _transactions(reader)
        offsets: Offsets = {}
        for topic, queue in self.options.selected_queues(reader):
            offsets.setdefault(topic, {})[str(queue)] = self.options.start_offset(
                reader, topic, queue, transactions
            )
        return offsets

    def _available(self) -> Offsets:
        """Where each queue's readable records end now: its Last Stable Offset, so a
        micro-batch never passes a Kafka transaction still open (ReadOptions.bounds)."""
        reader = _reader(self.options, refresh=True)
        transactions = _transactions(reader)
        offsets: Offsets = {}
        for topic, queue in self.options.selected_queues(reader):
            offsets.setdefault(topic, {})[str(queue)] = self.options.bounds(
                reader, topic, queue, transactions
            )[1]
        return offsets

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._available()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_records_per_trigger)

    def latestOffset(self, start: Offsets | None = None, limit: ReadLimit | None = None) -> Offsets:
        """The end of the next micro-batch. (PySpark < 4.2 calls it without arguments: then
        everything available, uncapped.)"""
        latest = self.target if self.target is not None else self._available()
        if start is None:
            return latest
        reader = _reader(self.options)
        start = {topic: dict(queues) for topic, queues in start.items()}
        for topic, queues in latest.items():  # a queue new since `start` begins at its earliest
            for queue in queues:
                if queue not in start.setdefault(topic, {}):
                    start[topic][queue] = reader.queue_bounds(topic, int(queue))[0]
        end = merge_offsets(start, latest)
        if isinstance(limit, ReadMaxRows):
            end = cap_offsets(start, end, limit.max_rows)
        return end

    def reportLatestOffset(self) -> Offsets:
        return self._available()

    # -- planning and reading --------------------------------------------------------------

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        reader = _reader(self.options)
        slices = []
        for topic, queues in sorted(end.items()):
            for queue_key, stop in sorted(queues.items(), key=lambda item: int(item[0])):
                queue = int(queue_key)
                begin = start.get(topic, {}).get(queue_key)
                if begin is None:
                    begin = reader.queue_bounds(topic, queue)[0]
                if stop > begin:
                    slices.append(Slice(topic, queue, begin, stop))
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
    """Move ``end`` back so at most ``max_rows`` records lie between ``start`` and it, shared
    out over queues in proportion to their backlog (Kafka source's rate limit), at least one
    record per backlogged queue while the budget lasts (queues in (topic, queue) order), so a cap
    smaller than the number of queues still makes progress."""
    backlog: dict[tuple[str, str], tuple[int, int]] = {}
    for topic, queues in end.items():
        for queue, stop in queues.items():
            begin = start.get(topic, {}).get(queue, 0)
            if stop > begin:
                backlog[(topic, queue)] = (begin, stop)
    total = sum(stop - begin for begin, stop in backlog.values())
    if total <= max_rows:
        return end
    capped: Offsets = {topic: dict(queues) for topic, queues in end.items()}
    budget = max_rows
    order = sorted(backlog)
    for key in order:
        begin, stop = backlog[key]
        share = min(max(1, (stop - begin) * max_rows // total), stop - begin, budget)
        capped[key[0]][key[1]] = begin + share
        budget -= share
    for key in order:  # what rounding down left over, first come first served
        if budget <= 0:
            break
        stop = backlog[key][1]
        extra = min(budget, stop - capped[key[0]][key[1]])
        capped[key[0]][key[1]] += extra
        budget -= extra
    return capped
