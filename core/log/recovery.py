"""Recovery: bring the indexes back in line with the CommitLog when a store opens.

The procedure is the same after a clean shutdown and after a crash (a clean shutdown just leaves
nothing to replay):

1. Read the checkpoint: commit-log position ``C`` and each queue's entry count at ``C``. Both were
   fdatasync'ed before the checkpoint file was atomically replaced.
2. Truncate every queue index to its checkpointed count (a queue created after ``C``: to 0).
3. Scan the CommitLog from ``C``, verifying each frame's length, magic and CRC32C, and dispatch
   every good frame again through the index writer (:mod:`core.log.index_writer`, the dispatch
   an append takes), rebuilding its index entries.
4. At the first bad frame: if nothing valid follows in a later segment it is a torn tail, erased
   and reported in bytes; inside a sealed segment the rest of that segment is reported lost and
   the scan continues with the next segment.
5. After an unclean change of owner (``start_at_segment_boundary``, docs/cluster.md section
   5.4): seal the segment holding the recovered end at that end and start writing at the next
   segment boundary, so whatever a paused old owner writes after waking lies past the seal.
   Writing never starts inside a segment sealed earlier either.
6. Flush, and write a new checkpoint.

Seals recorded before (the reader loads them from the epoch files, :mod:`core.log.fence`)
bound the scan: bytes past a segment's seal are not replayed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from core.log import names
from core.log import record as rec
from core.log.checkpoint import Checkpoints, queue_key, read_checkpoint
from core.log.commitlog import CommitLog
from core.log.durability import GroupCommit
from core.log.index_writer import IndexWriter

log = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    clean_shutdown: bool
    checkpoint_position: int
    replayed_records: int
    end_position: int  # the end of the recovered log
    truncated_bytes: int
    corrupt_positions: list[int]
    # Where appends start: end_position, or a later segment boundary (step 5).
    start_position: int = 0
    # The seal step 5 made, {segment base: end_position}; empty when the segment continues.
    sealed: dict[int, int] = field(default_factory=dict)


def recover(
    commitlog: CommitLog,
    indexes: IndexWriter,
    durability: GroupCommit,
    checkpoints: Checkpoints,
    *,
    check_own_writes: bool,
    start_at_segment_boundary: bool = False,
) -> RecoveryReport:
    """Run the procedure above on an opened store's parts: frames are indexed again through
    ``indexes`` (the path every append takes), ``durability`` flushes and ``checkpoints``
    writes the new checkpoint. ``check_own_writes``: do not trust this process's own frames
    on reads (see CommitLog.trust_from). ``start_at_segment_boundary``: step 5."""
    marker = checkpoints.data_dir / names.CLEAN_SHUTDOWN_FILE
    clean = marker.exists()
    position, counts = read_checkpoint(checkpoints.data_dir)
    if commitlog.segments and position < commitlog.start_position:
        position = commitlog.start_position
    for (topic, queue), index in indexes.queues.items():
        index.truncate(counts.get(queue_key(topic, queue), 0))

    replayed = 0
    truncated = 0
    corrupt: list[int] = []
    scan_from = position
    end = position
    while True:
        try:
            for frame_position, size, _magic in commitlog.scan(scan_from):
                commitlog.write_position = frame_position + size
                indexes.dispatch_frame(frame_position, size)
                replayed += 1
                end = frame_position + size
            break
        except rec.CorruptRecordError as error:
            bad = error.position
            number = bad // commitlog.segment_size
            later = [n for n in commitlog.segment_numbers() if n > number]
            if later and _has_valid_start(commitlog, later[0]):
                log.error(
                    "commit log corrupt at %d (%s): rest of segment %s lost",
                    bad,
                    error.reason,
                    names.segment_name(number * commitlog.segment_size),
                )
                corrupt.append(bad)
                scan_from = later[0] * commitlog.segment_size
                continue
            truncated = commitlog.truncate_at(bad)
            end = bad
            log.warning(
                "commit log torn tail at %d (%s): %d bytes erased", bad, error.reason, truncated
            )
            break
    sealed: dict[int, int] = {}
    start = end
    if start_at_segment_boundary:
        base = commitlog.seal(end)
        sealed[base] = end
        start = base + commitlog.segment_size
    start = commitlog.first_unsealed(start)
    if start != end:
        log.info(
            "commit log: segment %s sealed at %d; writing starts at segment %s",
            names.segment_name(end - end % commitlog.segment_size),
            end,
            names.segment_name(start),
        )
    commitlog.write_position = start
    commitlog.flushed_position = min(position, end)
    if not check_own_writes:
        # Only what this process appends from here on skips the CRC check on reads.
        commitlog.trust_from(start)
    marker.unlink(missing_ok=True)
    durability.flush()
    checkpoints.write()
    report = RecoveryReport(
        clean, position, replayed, end, truncated, corrupt, commitlog.write_position, sealed
    )
    # An empty log (a brand-new data directory) has nothing to recover and no shutdown to
    # report: it would log clean_shutdown=False on every first start.
    if replayed or truncated or corrupt or (not clean and commitlog.write_position):
        log.info("recovery: %s", report)
    return report


def _has_valid_start(commitlog: CommitLog, number: int) -> bool:
    segment = commitlog.segments[number]
    try:
        rec.verify_frame(segment.buf, 0, len(segment.buf))
    except rec.CorruptRecordError:
        return False
    return True
