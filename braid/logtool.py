"""``braid log stat|dump|verify``: inspect a data directory through the read-only LogReader.

Safe on the directory of a running broker (nothing is written, the lock is only probed) and on
a stopped one. On a cluster's data root (``cluster.json``, docs/cluster.md section 2), every
shard in turn, each in a section of its own (a shard nobody has written yet says so), or the one
``--shard N`` names. Exit codes: 0 fine, 1 corruption found, 2 not a BraidMQ data directory
(or root, or no such shard).
"""

from __future__ import annotations

import base64
import dataclasses
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from braid.config import LOCK_FILE
from core.cluster.layout import ClusterLayout, LayoutError, detect, shard_dir_name
from core.delivery.message import BATCH_SELECT_HEADER, selection_key
from core.log import CorruptRecordError, LogReader, Record, names
from core.log import record as rec
from core.log.batches import BatchRecord, unpack_batch

EXIT_OK = 0
EXIT_CORRUPT = 1
EXIT_NOT_A_LOG = 2
# Bytes of a body shown by ``dump`` unless --max-body says otherwise (0: all of it).
DEFAULT_MAX_BODY = 100
# Records read per LogReader.read call while dumping a queue.
READ_CHUNK = 1000

FLAG_NAMES = (
    (rec.FLAG_BATCH, "batch"),
    (rec.FLAG_HALF, "half"),
    (rec.FLAG_DELAYED, "delayed"),
    (rec.FLAG_LINK, "link"),
    (rec.FLAG_NULL_KEY, "null-key"),
    (rec.FLAG_NULL_BODY, "null-body"),
    (rec.FLAG_TXN_CONTROL, "txn-control"),
    (rec.FLAG_COPY, "copy"),
)


# Kafka RecordBatch v2: attributes (int16, big-endian) at byte 21; bits 0-2 the codec, bit 5
# marks a control batch (a transaction's commit or abort marker).
BATCH_ATTRIBUTES_AT = 21
BATCH_CODEC_MASK = 0x07
BATCH_CONTROL_BIT = 0x20
BATCH_CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
# A control record's key: version (int16), type (int16): 0 abort, 1 commit (Kafka's
# ControlRecordType).
CONTROL_TYPES = {0: "abort", 1: "commit"}


class NotALogError(Exception):
    pass


def open_reader(data_dir: str) -> LogReader:
    path = Path(data_dir)
    if not path.is_dir():
        raise NotALogError(f"{data_dir}: no such directory")
    try:
        return LogReader(path)
    except FileNotFoundError as error:
        raise NotALogError(str(error)) from None
    except (OSError, ValueError, KeyError) as error:
        raise NotALogError(f"{data_dir}: cannot read the log: {error}") from None


@dataclass(frozen=True, slots=True)
class Target:
    """One data directory a command reads: a single-node directory (``shard`` None), or one
    shard of a cluster's data root."""

    shard: int | None
    data_dir: Path

    def has_log(self) -> bool:
        return (self.data_dir / names.LOG_META_FILE).exists()

    @property
    def label(self) -> str:
        return "" if self.shard is None else f"shard {shard_dir_name(self.shard)}"


@dataclass(frozen=True, slots=True)
class Targets:
    """What ``DIR`` (and ``--shard``) name: its layout when it is a cluster's data root."""

    layout: ClusterLayout | None
    targets: list[Target]


def targets(data_dir: str, shard: int | None = None) -> Targets:
    """The directories a command reads in ``data_dir``: itself when it is not a cluster root;
    every shard of a root, or only ``shard``. :class:`NotALogError` when ``--shard`` names no
    shard of it (or ``data_dir`` is no root), or the root's creation did not finish."""
    path = Path(data_dir)
    if not path.is_dir():
        raise NotALogError(f"{data_dir}: no such directory")
    if detect(path) != "root":
        if shard is not None:
            raise NotALogError(f"{data_dir} is not a cluster data root: it has no shard {shard}")
        return Targets(None, [Target(None, path)])
    try:
        layout = ClusterLayout.open(path)
    except LayoutError as error:
        raise NotALogError(str(error)) from None
    if shard is None:
        return Targets(layout, [Target(n, layout.shard_dir(n)) for n in range(layout.shards)])
    if not 0 <= shard < layout.shards:
        raise NotALogError(f"{data_dir} has shards 0..{layout.shards - 1}, not {shard}")
    return Targets(layout, [Target(shard, layout.shard_dir(shard))])


def root_summary(layout: ClusterLayout) -> str:
    legacy = "none" if layout.legacy_shard is None else str(layout.legacy_shard)
    return (
        f"cluster root {layout.root}: {layout.shards} shards, cluster id {layout.cluster_id},"
        f" legacy shard {legacy}"
    )


def iso_ms(ms: int) -> str:
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def flag_names(flags: int) -> list[str]:
    return [name for bit, name in FLAG_NAMES if flags & bit]


# -- stat ------------------------------------------------------------------------------------


def _broker_pid(data_dir: Path) -> str | None:
    """The pid of the broker holding the data-dir lock (an flock on the directory itself, see
    braid/server.py), or None if no broker runs on it."""
    try:
        fd = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        try:
            return (data_dir / LOCK_FILE).read_text()[:32].strip() or "?"
        except OSError:
            return "?"
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _used_bytes(reader: LogReader, number: int) -> int:
    """Bytes holding frames in a segment, walking frame sizes (no CRC check)."""
    segment = reader.commitlog.segments[number]
    offset = 0
    while offset < segment.size:
        size = segment.frame_size_at(offset)
        if size == 0 or offset + size > segment.size:
            break
        offset += size
    return offset


@dataclass
class SegmentStat:
    file: str
    base_position: int
    size: int  # file size (segments are created sparse at full size)
    allocated: int  # bytes the file system really holds for it
    used: int  # bytes holding frames
    sealed: bool
    # A cluster shard's epoch seal (core/log/fence.py): the end of the segment's valid bytes
    # after an unclean change of owner; what lies past it was a fenced owner's and is ignored.
    epoch_seal: int | None = None


@dataclass
class QueueStat:
    queue: int
    start_offset: int
    next_offset: int
    records: int
    entries: int  # index entries (a Kafka batch is one entry holding many records)
    index_files: int


@dataclass
class TopicStat:
    system: bool
    queues: list[QueueStat] = field(default_factory=list)


@dataclass
class CheckpointStat:
    position: int | None = None
    written_ms: int | None = None
    queues: int | None = None
    error: str | None = None


@dataclass
class LogStat:
    data_dir: str
    format_version: int
    segment_size: int
    index_entries_per_file: int
    running_pid: str | None
    clean_shutdown: bool
    checkpoint: CheckpointStat | None
    start_position: int
    end_position: int
    segments: list[SegmentStat]
    topics: dict[str, TopicStat]


def _read_checkpoint(path: Path) -> CheckpointStat | None:
    if not path.exists():
        return None
    try:
        raw = json.loads(path.read_text())
        return CheckpointStat(
            position=int(raw["position"]),
            written_ms=int(raw.get("written_ms", 0)),
            queues=len(raw.get("queues", {})),
        )
    except (ValueError, KeyError, TypeError, OSError) as error:
        return CheckpointStat(error=f"unreadable: {error}")


def collect_stat(reader: LogReader) -> LogStat:
    data_dir = reader.data_dir
    commitlog = reader.commitlog
    numbers = commitlog.segment_numbers()
    segments = []
    end = commitlog.start_position
    for number in numbers:
        segment = commitlog.segments[number]
        info = os.stat(segment.path)
        sealed = number != numbers[-1]
        used = segment.size if sealed else _used_bytes(reader, number)
        epoch_seal = commitlog.seals.get(segment.base)
        if epoch_seal is not None:
            used = min(used, epoch_seal - segment.base)
        end = number * commitlog.segment_size + used
        segments.append(
            SegmentStat(
                segment.path.name,
                segment.base,
                info.st_size,
                info.st_blocks * 512,
                used,
                sealed,
                epoch_seal,
            )
        )
    topics: dict[str, TopicStat] = {}
    for topic, queue in reader.queues(include_system=True):
        start, next_offset = reader.queue_bounds(topic, queue)
        index = reader.queue_index(topic, queue)
        topic_stat = topics.setdefault(topic, TopicStat(names.is_system_topic(topic)))
        topic_stat.queues.append(
            QueueStat(
                queue,
                start,
                next_offset,
                next_offset - start,
                0 if index is None else index.next_entry - index.start_entry,
                0 if index is None else len(index.files),
            )
        )
    return LogStat(
        data_dir=str(data_dir),
        format_version=reader.meta.version,
        segment_size=reader.meta.segment_size,
        index_entries_per_file=reader.meta.index_entries_per_file,
        running_pid=_broker_pid(data_dir),
        clean_shutdown=(data_dir / names.CLEAN_SHUTDOWN_FILE).exists(),
        checkpoint=_read_checkpoint(data_dir / names.CHECKPOINT_FILE),
        start_position=commitlog.start_position,
        end_position=end,
        segments=segments,
        topics=topics,
    )


def stat(data_dir: str, *, as_json: bool, out: TextIO, shard: int | None = None) -> int:
    """A single-node directory's summary; a cluster root's per shard (``shard``: that one)."""
    found = targets(data_dir, shard)
    if found.layout is None:
        with open_reader(data_dir) as reader:
            single = collect_stat(reader)
        if as_json:
            out.write(json.dumps(dataclasses.asdict(single), indent=2) + "\n")
        else:
            out.write("\n".join(_stat_lines(single)) + "\n")
        return EXIT_OK
    layout = found.layout
    shards: list[dict[str, object]] = []
    lines = [root_summary(layout)]
    for target in found.targets:
        lines.append(f"== {target.label}  {target.data_dir}")
        info: LogStat | None = None
        if target.has_log():
            with open_reader(str(target.data_dir)) as reader:
                info = collect_stat(reader)
            lines.extend(_stat_lines(info))
        else:
            lines.append("no log yet (nothing written to this shard)")
        shards.append(
            {
                "shard": target.shard,
                "data_dir": str(target.data_dir),
                "log": None if info is None else dataclasses.asdict(info),
            }
        )
    if as_json:
        document = {
            "root": str(layout.root),
            "cluster_id": layout.cluster_id,
            "shard_count": layout.shards,
            "legacy_shard": layout.legacy_shard,
            "shards": shards,
        }
        out.write(json.dumps(document, indent=2) + "\n")
    else:
        out.write("\n".join(lines) + "\n")
    return EXIT_OK


def _stat_lines(info: LogStat) -> list[str]:
    if info.running_pid is not None:
        state = f"running (broker pid {info.running_pid})"
    elif info.clean_shutdown:
        state = "stopped cleanly"
    else:
        state = "not cleanly stopped (crashed, or never closed): recovery replays on next open"
    lines = [
        f"data dir     {info.data_dir}",
        f"format       version {info.format_version}, segment size {info.segment_size} B,"
        f" {info.index_entries_per_file} entries per index file",
        f"state        {state}",
    ]
    checkpoint = info.checkpoint
    if checkpoint is None:
        lines.append("checkpoint   none")
    elif checkpoint.error is not None:
        lines.append(f"checkpoint   {checkpoint.error}")
    else:
        lines.append(
            f"checkpoint   position {checkpoint.position},"
            f" written {iso_ms(checkpoint.written_ms or 0)}, {checkpoint.queues} queues"
        )
    lines.append(
        f"commit log   positions {info.start_position}..{info.end_position},"
        f" {len(info.segments)} segments"
    )
    for segment in info.segments:
        lines.append(
            f"  {segment.file}  size {segment.size}  used {segment.used}"
            f"  allocated {segment.allocated}  {'sealed' if segment.sealed else 'active'}"
            + (
                ""
                if segment.epoch_seal is None
                else f"  epoch seal at {segment.epoch_seal}: bytes past it ignored"
            )
        )
    lines.append(f"topics       {len(info.topics)}")
    for topic, topic_stat in info.topics.items():
        marker = "  [system]" if topic_stat.system else ""
        count = len(topic_stat.queues)
        lines.append(f"  {topic}{marker}  ({count} queue{'' if count == 1 else 's'})")
        for queue in topic_stat.queues:
            lines.append(
                f"    queue {queue.queue:<4} offsets {queue.start_offset}..{queue.next_offset}"
                f"  records {queue.records}  entries {queue.entries}"
                f"  index files {queue.index_files}"
            )
    return lines


# -- dump ------------------------------------------------------------------------------------


def bytes_json(value: bytes | None, *, truncated: bool = False) -> object:
    """UTF-8 text as a JSON string; anything else as ``{"base64": ...}``; null stays null.
    A ``truncated`` preview may end inside a multi-byte character: that tail is dropped."""
    if value is None:
        return None
    for cut in range(4 if truncated else 1):
        try:
            return value[: len(value) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return {"base64": base64.b64encode(value).decode("ascii")}


def preview(body: bytes | None, max_body: int) -> tuple[bytes | None, bool]:
    if body is None or max_body <= 0 or len(body) <= max_body:
        return body, False
    return body[:max_body], True


@dataclass(frozen=True, slots=True)
class QueueSpot:
    """Where a record was read from when dumping a queue: that queue and the offset there (a
    record fanned out or moved to a queue is stored once, under its own topic and queue)."""

    topic: str
    queue: int
    offset: int


@dataclass(slots=True)
class UnpackedBatch:
    """A Kafka RecordBatch stored as one batch record, decoded: its codec, whether it is a
    transaction marker (and which), its records (those a dumped queue took, when it took only
    some) or why it could not be decoded."""

    codec: str
    control: str | None = None
    records: list[BatchRecord] = field(default_factory=list)
    skipped: int = 0  # records of the batch the dumped queue did not take
    error: str | None = None


def unpack_stored_batch(record: Record, spot: QueueSpot | None) -> UnpackedBatch | None:
    """The records of a stored Kafka batch (None for any other record). Read through a queue
    that took only some of them (``x-braid-batch-select``), only those."""
    if not record.flags & rec.FLAG_BATCH or record.body is None:
        return None
    body = record.body
    if len(body) < BATCH_ATTRIBUTES_AT + 2:
        return UnpackedBatch("?", error=f"{len(body)} bytes: shorter than a batch header")
    attributes = int.from_bytes(body[BATCH_ATTRIBUTES_AT : BATCH_ATTRIBUTES_AT + 2], "big")
    codec = BATCH_CODECS.get(attributes & BATCH_CODEC_MASK, f"codec {attributes & 7}")
    if attributes & BATCH_CONTROL_BIT:
        return UnpackedBatch(codec, control=_control_type(body))
    try:
        records = unpack_batch(body)
    except Exception as error:  # aiokafka's codec raises its own and the compressors' errors
        return UnpackedBatch(codec, error=f"{type(error).__name__}: {error}")
    unpacked = UnpackedBatch(codec, records=records)
    if spot is not None:
        chosen = _batch_selection(record.headers, spot.topic, spot.queue)
        if chosen is not None:
            unpacked.records = [inner for inner in records if inner.offset_delta in chosen]
            unpacked.skipped = len(records) - len(unpacked.records)
    return unpacked


def _control_type(body: bytes) -> str:
    # One control record; its key (after the record's varint-framed header) is decoded by
    # aiokafka's own reader, which skips control batches, so read it from the raw batch.
    from aiokafka.record.default_records import (  # type: ignore[import-untyped]
        DefaultRecordBatch,
    )

    try:
        for inner in DefaultRecordBatch(bytes(body)):
            key = inner.key or b""
            if len(key) >= 4:
                kind = int.from_bytes(key[2:4], "big")
                return CONTROL_TYPES.get(kind, f"type {kind}")
    except Exception:  # a marker that does not decode is still shown as a marker
        pass
    return "unknown"


def _batch_selection(headers: list[tuple[str, bytes]], topic: str, queue: int) -> set[int] | None:
    for name, value in headers:
        if name == BATCH_SELECT_HEADER:
            chosen = json.loads(value).get(selection_key(topic, queue))
            return None if chosen is None else {int(delta) for delta in chosen}
    return None


def record_json(record: Record, spot: QueueSpot | None, max_body: int) -> dict[str, object]:
    body, truncated = preview(record.body, max_body)
    out: dict[str, object] = {
        "topic": record.topic if spot is None else spot.topic,
        "queue": record.queue if spot is None else spot.queue,
    }
    if spot is not None:
        out["offset"] = spot.offset
        if (spot.topic, spot.queue) != (record.topic, record.queue):
            out["stored_in"] = [record.topic, record.queue]
    out.update(
        {
            "position": record.position,
            "size": record.size,
            "flags": flag_names(record.flags),
            "protocol": record.protocol_name,
            "store_ms": record.store_ms,
            "store_time": iso_ms(record.store_ms),
            "born_ms": record.born_ms,
            "deliver_at_ms": record.deliver_at_ms,
            "record_count": record.record_count,
            "subject": record.subject,
            "key": bytes_json(record.key),
            "headers": [[name, bytes_json(value)] for name, value in record.headers],
            "tags": record.tags,
            "client": record.client,
            "address": record.address,
            "destinations": [[topic, queue] for topic, queue in record.destinations],
            "body_size": None if record.body is None else len(record.body),
            "body": bytes_json(body, truncated=truncated),
            "body_truncated": truncated,
        }
    )
    if record.flags & rec.FLAG_LINK and record.body is not None:
        out["link"] = [
            {"position": position, "size": size}
            for position, size in rec.decode_link_body(record.body)
        ]
    batch = unpack_stored_batch(record, spot)
    if batch is not None:
        del out["body"], out["body_truncated"]  # the records below say it, readably
        out["batch"] = _batch_json(batch, spot, max_body)
    return out


def _batch_json(batch: UnpackedBatch, spot: QueueSpot | None, max_body: int) -> dict[str, object]:
    out: dict[str, object] = {"codec": batch.codec}
    if batch.control is not None:
        out["control"] = batch.control
    if batch.error is not None:
        out["error"] = batch.error
    if batch.skipped:
        out["skipped"] = batch.skipped
    records = []
    for inner in batch.records:
        value, truncated = preview(inner.value, max_body)
        item: dict[str, object] = {"offset_delta": inner.offset_delta}
        if spot is not None:
            item["offset"] = spot.offset + inner.offset_delta
        item.update(
            {
                "timestamp_ms": inner.timestamp_ms,
                "time": iso_ms(inner.timestamp_ms),
                "key": bytes_json(inner.key),
                "headers": [[name, bytes_json(value)] for name, value in inner.headers],
                "value_size": None if inner.value is None else len(inner.value),
                "value": bytes_json(value, truncated=truncated),
                "value_truncated": truncated,
            }
        )
        records.append(item)
    out["records"] = records
    return out


def record_text(record: Record, spot: QueueSpot | None, max_body: int) -> str:
    """One line for the record; a Kafka batch adds one indented line per record inside it."""
    if spot is None:
        where = f"{record.topic}/{record.queue}"
    else:
        where = f"{spot.topic}/{spot.queue}@{spot.offset}"
    parts = [where, f"pos={record.position}", f"size={record.size}"]
    if spot is not None and (spot.topic, spot.queue) != (record.topic, record.queue):
        parts.append(f"stored_in={record.topic}/{record.queue}")
    parts.append(f"time={iso_ms(record.store_ms)}")
    parts.append(f"protocol={record.protocol_name}")
    if record.flags:
        parts.append("flags=" + "|".join(flag_names(record.flags)))
    if record.born_ms != record.store_ms:
        parts.append(f"born={iso_ms(record.born_ms)}")
    if record.deliver_at_ms:
        parts.append(f"deliver_at={iso_ms(record.deliver_at_ms)}")
    if record.record_count != 1:
        parts.append(f"records={record.record_count}")
    if record.subject:
        parts.append(f"subject={record.subject!r}")
    if record.key is None:
        parts.append("key=null")
    elif record.key:
        parts.append(f"key={record.key!r}")
    if record.headers:
        parts.append("headers={" + ", ".join(f"{n!r}: {v!r}" for n, v in record.headers) + "}")
    if record.tags:
        parts.append(f"tags={record.tags!r}")
    if record.client:
        parts.append(f"client={record.client!r}")
    if record.address:
        parts.append(f"address={record.address!r}")
    if record.destinations:
        parts.append("destinations=[" + ", ".join(f"{t}/{q}" for t, q in record.destinations) + "]")
    batch = unpack_stored_batch(record, spot)
    if record.flags & rec.FLAG_LINK and record.body is not None:
        targets = rec.decode_link_body(record.body)
        parts.append("link=[" + ", ".join(f"pos {p} size {s}" for p, s in targets) + "]")
    elif record.body is None:
        parts.append("body=null")
    elif batch is not None:
        parts.append(_batch_summary(batch, len(record.body)))
    else:
        body, truncated = preview(record.body, max_body)
        parts.append(f"body[{len(record.body)}]={body!r}{'...' if truncated else ''}")
    lines = [" ".join(parts)]
    if batch is not None:
        lines.extend(_inner_text(inner, spot, max_body) for inner in batch.records)
    return "\n".join(lines)


def _batch_summary(batch: UnpackedBatch, size: int) -> str:
    if batch.control is not None:
        return f"kafka-batch[{size}] control={batch.control} codec={batch.codec}"
    if batch.error is not None:
        return f"kafka-batch[{size}] codec={batch.codec} undecodable ({batch.error})"
    summary = f"kafka-batch[{size}] codec={batch.codec}"
    if batch.skipped:
        summary += f" skipped={batch.skipped} (routed to other queues)"
    return summary


def _inner_text(inner: BatchRecord, spot: QueueSpot | None, max_body: int) -> str:
    """One record of a Kafka batch, indented under its batch: ``@offset`` when reading a queue,
    ``+delta`` (its offset delta in the batch) in a commit-log scan."""
    delta = inner.offset_delta
    parts = [f"  @{spot.offset + delta}" if spot is not None else f"  +{delta}"]
    parts.append(f"time={iso_ms(inner.timestamp_ms)}")
    parts.append("key=null" if inner.key is None else f"key={inner.key!r}")
    if inner.headers:
        parts.append("headers={" + ", ".join(f"{n!r}: {v!r}" for n, v in inner.headers) + "}")
    if inner.value is None:
        parts.append("value=null")
    else:
        value, truncated = preview(inner.value, max_body)
        parts.append(f"value[{len(inner.value)}]={value!r}{'...' if truncated else ''}")
    return " ".join(parts)


Item = tuple[Record, QueueSpot | None] | CorruptRecordError


def _queue_records(
    reader: LogReader, topic: str, queues: list[int], start: int | None
) -> Iterator[Item]:
    """Records of ``queues`` by offset. A corrupt record is yielded as its error and skipped:
    every index entry points at its own frame, so the entries after it are still readable."""
    for queue in queues:
        first, next_offset = reader.queue_bounds(topic, queue)
        offset = first if start is None else max(start, first)
        chunk = READ_CHUNK
        while offset < next_offset:
            try:
                batch = reader.read(topic, queue, offset, max_records=chunk)
            except CorruptRecordError as error:
                if chunk > 1:
                    chunk = 1  # find the bad entry, one record at a time
                    continue
                yield error
                index = reader.queue_index(topic, queue)
                assert index is not None
                bad = index.entry(index.entry_for_offset(offset))
                offset = bad.first_offset + max(1, bad.record_count)
                continue
            if not batch:
                break
            for entry in batch:
                yield entry.record(), QueueSpot(topic, queue, entry.offset)
            offset = batch[-1].next_offset
            chunk = READ_CHUNK


def _scan_records(reader: LogReader, queue: int | None, start: int | None) -> Iterator[Item]:
    """Every record in commit-log order. After a corrupt frame the rest of its segment cannot
    be framed: the error is yielded and the scan goes on with the next segment."""
    position = start
    segment_size = reader.commitlog.segment_size
    while True:
        try:
            for record in reader.scan(position):
                if queue is None or record.queue == queue:
                    yield record, None
            return
        except CorruptRecordError as error:
            yield error
            following = [
                n for n in reader.commitlog.segment_numbers() if n > error.position // segment_size
            ]
            if not following:
                return
            position = following[0] * segment_size


def dump(
    data_dir: str,
    *,
    topic: str | None,
    queue: int | None,
    start: int | None,
    limit: int | None,
    as_json: bool,
    max_body: int,
    out: TextIO,
    err: TextIO,
    shard: int | None = None,
) -> int:
    """With ``topic``: that topic's queues (or one) by offset from ``start``. Without: every
    record in commit-log order from commit-log position ``start`` (``queue`` filters).
    Corrupt records are reported on ``err`` and skipped; the exit code is then 1.

    On a cluster root, every shard holding a log in turn (or ``shard``), each after a ``#
    shard NNNN`` line (text) or with a ``shard`` field in each record (JSON); ``start`` and
    ``queue`` apply in each shard, ``limit`` to them all."""
    found = targets(data_dir, shard)
    readable = [target for target in found.targets if target.has_log()]
    if found.layout is None:
        readable = found.targets  # opening it says what is wrong with it
    readers: list[tuple[Target, LogReader]] = []
    try:
        for target in readable:
            readers.append((target, open_reader(str(target.data_dir))))
        sources: list[tuple[Target, Iterator[Item]]] = []
        for target, reader in readers:
            if topic is not None:
                known = [q for t, q in reader.queues(include_system=True) if t == topic]
                if queue is not None:
                    known = [queue] if queue in known else []
                if known:
                    sources.append((target, _queue_records(reader, topic, known, start)))
            else:
                first = start
                if first is not None and first < reader.commitlog.start_position:
                    first = reader.commitlog.start_position
                sources.append((target, _scan_records(reader, queue, first)))
        if topic is not None and not sources:
            where = f" in any shard of {data_dir}" if found.layout is not None else ""
            err.write(
                f"braid log dump: no queue {topic}/{'*' if queue is None else queue}{where}\n"
            )
            return EXIT_NOT_A_LOG
        written = 0
        corrupt = 0
        for target, items in sources:
            if limit is not None and written >= limit:
                break
            if target.shard is not None and not as_json:
                out.write(f"# {target.label}  {target.data_dir}\n")
            for item in items:
                if isinstance(item, CorruptRecordError):
                    corrupt += 1
                    hint = ""
                    if topic is None and start is not None and item.position == start:
                        hint = " (--from must be the position of a record)"
                    where = f"{target.label}: " if target.shard is not None else ""
                    out.flush()
                    err.write(f"braid log dump: {where}{item}{hint}\n")
                    err.flush()
                    continue
                if limit is not None and written >= limit:
                    break
                record, spot = item
                if as_json:
                    shown = record_json(record, spot, max_body)
                    if target.shard is not None:
                        shown = {"shard": target.shard, **shown}
                    out.write(json.dumps(shown) + "\n")
                else:
                    out.write(record_text(record, spot, max_body) + "\n")
                written += 1
    finally:
        for _, reader in readers:
            reader.close()
    return EXIT_CORRUPT if corrupt else EXIT_OK


# -- verify ----------------------------------------------------------------------------------


def verify(data_dir: str, *, out: TextIO, shard: int | None = None) -> int:
    """Every frame's CRC32C; on a cluster root, of every shard (or ``shard``), a line each, and
    a last line for them all."""
    found = targets(data_dir, shard)
    if found.layout is None:
        return _verify_one(data_dir, "", out)
    out.write(root_summary(found.layout) + "\n")
    failed = empty = 0
    for target in found.targets:
        if not target.has_log():
            empty += 1
            out.write(f"{target.label}: no log yet (nothing written to this shard)\n")
        elif _verify_one(str(target.data_dir), f"{target.label}: ", out) != EXIT_OK:
            failed += 1
    checked = len(found.targets) - empty
    if failed:
        out.write(f"FAILED: {failed} of {checked} shards with a log corrupt\n")
        return EXIT_CORRUPT
    out.write(f"ok: {checked} shards with a log verified, {empty} without one\n")
    return EXIT_OK


def _verify_one(data_dir: str, prefix: str, out: TextIO) -> int:
    with open_reader(data_dir) as reader:
        errors = reader.verify()  # up to each segment's epoch seal (core/log/fence.py)
        numbers = reader.commitlog.segment_numbers()
        segment_size = reader.commitlog.segment_size
        seals = len([base for base in reader.commitlog.seals if base // segment_size in numbers])
    for error in errors:
        number, offset = divmod(error.position, segment_size)
        out.write(
            f"{prefix}corrupt: position {error.position}"
            f" (segment {names.segment_name(number * segment_size)} offset {offset}):"
            f" {error.reason}; the rest of that segment is unreadable\n"
        )
    if errors:
        out.write(f"{prefix}FAILED: {len(errors)} of {len(numbers)} segments corrupt\n")
        return EXIT_CORRUPT
    sealed = f" ({seals} up to an epoch seal: bytes past it ignored)" if seals else ""
    out.write(f"{prefix}ok: {len(numbers)} segments verified{sealed}\n")
    return EXIT_OK
