"""``braid log stat|dump|verify``: inspect a data directory through the read-only LogReader.

Safe on the directory of a running broker (nothing is written, the lock is only probed) and on
a stopped one. Exit codes: 0 fine, 1 corruption found, 2 not a BraidMQ data directory.
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
from core.log import CorruptRecordError, LogReader, Record, names
from core.log import record as rec

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
)


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


def iso_ms(ms: int) -> str:
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def flag_names(flags: int) -> list[str]:
    return [name for bit, name in FLAG_NAMES if flags & bit]


# -- stat ------------------------------------------------------------------------------------


def _broker_pid(data_dir: Path) -> str | None:
    """The pid of the broker holding the data-dir lock, or None if no broker runs on it."""
    try:
        fd = os.open(data_dir / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
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
        end = number * commitlog.segment_size + used
        segments.append(
            SegmentStat(
                segment.path.name, segment.base, info.st_size, info.st_blocks * 512, used, sealed
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


def stat(data_dir: str, *, as_json: bool, out: TextIO) -> int:
    with open_reader(data_dir) as reader:
        info = collect_stat(reader)
    if as_json:
        out.write(json.dumps(dataclasses.asdict(info), indent=2) + "\n")
        return EXIT_OK
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
    out.write("\n".join(lines) + "\n")
    return EXIT_OK


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


def record_json(record: Record, offset: int | None, max_body: int) -> dict[str, object]:
    body, truncated = preview(record.body, max_body)
    out: dict[str, object] = {
        "topic": record.topic,
        "queue": record.queue,
    }
    if offset is not None:
        out["offset"] = offset
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
    return out


def record_text(record: Record, offset: int | None, max_body: int) -> str:
    where = f"{record.topic}/{record.queue}"
    if offset is not None:
        where += f"@{offset}"
    parts = [where, f"pos={record.position}", f"size={record.size}"]
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
    if record.flags & rec.FLAG_LINK and record.body is not None:
        targets = rec.decode_link_body(record.body)
        parts.append("link=[" + ", ".join(f"pos {p} size {s}" for p, s in targets) + "]")
    elif record.body is None:
        parts.append("body=null")
    else:
        body, truncated = preview(record.body, max_body)
        parts.append(f"body[{len(record.body)}]={body!r}{'...' if truncated else ''}")
    return " ".join(parts)


Item = tuple[Record, int | None] | CorruptRecordError


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
                yield entry.record(), entry.offset
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
) -> int:
    """With ``topic``: that topic's queues (or one) by offset from ``start``. Without: every
    record in commit-log order from commit-log position ``start`` (``queue`` filters).
    Corrupt records are reported on ``err`` and skipped; the exit code is then 1."""
    with open_reader(data_dir) as reader:
        items: Iterator[Item]
        if topic is not None:
            known = [q for t, q in reader.queues(include_system=True) if t == topic]
            if queue is not None:
                known = [queue] if queue in known else []
            if not known:
                err.write(f"braid log dump: no queue {topic}/{'*' if queue is None else queue}\n")
                return EXIT_NOT_A_LOG
            items = _queue_records(reader, topic, known, start)
        else:
            if start is not None and start < reader.commitlog.start_position:
                start = reader.commitlog.start_position
            items = _scan_records(reader, queue, start)
        written = 0
        corrupt = 0
        for item in items:
            if isinstance(item, CorruptRecordError):
                corrupt += 1
                hint = ""
                if topic is None and start is not None and item.position == start:
                    hint = " (--from must be the position of a record)"
                out.flush()
                err.write(f"braid log dump: {item}{hint}\n")
                err.flush()
                continue
            if limit is not None and written >= limit:
                break
            record, offset = item
            if as_json:
                out.write(json.dumps(record_json(record, offset, max_body)) + "\n")
            else:
                out.write(record_text(record, offset, max_body) + "\n")
            written += 1
    return EXIT_CORRUPT if corrupt else EXIT_OK


# -- verify ----------------------------------------------------------------------------------


def verify(data_dir: str, *, out: TextIO) -> int:
    with open_reader(data_dir) as reader:
        errors = reader.verify()
        numbers = reader.commitlog.segment_numbers()
        segment_size = reader.commitlog.segment_size
    for error in errors:
        number, offset = divmod(error.position, segment_size)
        out.write(
            f"corrupt: position {error.position}"
            f" (segment {names.segment_name(number * segment_size)} offset {offset}):"
            f" {error.reason}; the rest of that segment is unreadable\n"
        )
    if errors:
        out.write(f"FAILED: {len(errors)} of {len(numbers)} segments corrupt\n")
        return EXIT_CORRUPT
    out.write(f"ok: {len(numbers)} segments verified\n")
    return EXIT_OK
