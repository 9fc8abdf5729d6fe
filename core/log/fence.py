"""The storage fence of a shard's log (docs/cluster.md section 5.3-5.4): how a writer learns that
a newer owner claimed its directory, and the seals that bound what readers take from a segment.

core/log knows nothing of nodes, leases or Redis. The cluster layer (core/cluster/epochs.py)
builds a :class:`Fence` from its epoch files and hands it to the
:class:`~core.log.store.LogStore` it opens; a single node passes none and pays nothing for it.
With a fence the store checks it once per commit-log fsync, after the fsync and before any
waiter is released (:meth:`core.log.commitlog.CommitLog.sync_to`); once it says fenced the
store releases nobody, fails its waiters and refuses every append with :class:`StoreFenced`,
and writes nothing more.

**Seals.** An owner that takes a shard over after an unclean stop records the recovered end of
the last segment (a *seal*) and writes from the next segment boundary: a paused old owner that
wakes writes only past the seal. Every reader bounds each sealed segment by it. The seals are
read here, from the shard directory's ``epochs/`` files (written by core/cluster/epochs.py),
so LogReader, ``braid log`` and Spark honour them without the cluster layer::

    epochs/<epoch:020d>          the claim, JSON, created O_EXCL: {..., "sealed": {...}}
    epochs/<epoch:020d>.sealed   JSON written when the owner opened the log, before its first
                                 write (tmp + rename): {"start": <position>,
                                 "sealed": {"<segment base position>": <end position>, ...}}

The seal of a segment is the smallest end any file names for it: nobody writes into a segment
after it was sealed, so bytes past the first seal are a fenced owner's. Both files are written
once (a claim may be read while its claimer is still writing it: then it does not parse and is
read again next time), so :class:`Seals` parses each file once. Not checksummed (see
core/cluster/epochs.py: a torn claim fences but says nothing).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

EPOCHS_DIR: Final = "epochs"
SEALED_SUFFIX: Final = ".sealed"
EPOCH_DIGITS: Final = 20  # as segment names (core/log/names.py): a listing sorts numerically


class StoreFenced(Exception):
    """A newer owner claimed this log's directory: nothing more is acknowledged or written here.
    Retriable for a client: the record was not acknowledged, and the shard is served by its new
    owner (a protocol answers as for an unavailable shard: Kafka NOT_LEADER_OR_FOLLOWER, an
    AMQP nack, an MQTT reason code; docs/cluster.md section 11)."""

    retriable = True

    def __init__(self, data_dir: Path, reason: str = "a newer owner claimed this log") -> None:
        super().__init__(f"{data_dir}: {reason}; nothing more is acknowledged or written here")
        self.data_dir = data_dir
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Fence:
    """What a store needs from its owner's claim.

    ``is_fenced``: whether a newer owner exists (one ``stat`` of the next epoch's file); called
    once per commit-log fsync and never on an append. An ``OSError`` from it propagates to the
    waiters of that fsync: an owner that cannot tell does not acknowledge.
    ``start_at_segment_boundary``: the previous owner did not close cleanly; after recovery the
    store seals the recovered end and starts at the next segment boundary.
    ``record_start``: called once the log is recovered and before anything is written to it,
    with the position the store starts writing at and the seal it made (``{segment base: end}``,
    empty when it continues the segment); it must make them durable (the next owner and every
    reader bound the segment by them).
    """

    is_fenced: Callable[[], bool]
    start_at_segment_boundary: bool = False
    record_start: Callable[[int, dict[int, int]], object] | None = None


def is_epoch_file_name(name: str) -> bool:
    """``<20 digits>`` (a claim) or ``<20 digits>.sealed`` (what its owner recorded at open)."""
    digits = name[: -len(SEALED_SUFFIX)] if name.endswith(SEALED_SUFFIX) else name
    return len(digits) == EPOCH_DIGITS and digits.isdigit()


def parse_seals(data: bytes) -> dict[int, int] | None:
    """The ``sealed`` map of an epoch file's JSON; None when it does not parse (torn)."""
    try:
        value: Any = json.loads(data)
        return {int(base): int(end) for base, end in value["sealed"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def merge_seals(found: Mapping[str, Mapping[int, int]]) -> dict[int, int]:
    """The smallest end per segment base over every file's seals."""
    bounds: dict[int, int] = {}
    for seals in found.values():
        for base, end in seals.items():
            bounds[base] = min(end, bounds.get(base, end))
    return bounds


class Seals:
    """The seals of one data directory, brought up to date by :meth:`refresh` (a directory
    listing, and a parse of each file not seen before)."""

    __slots__ = ("_directory", "_parsed", "bounds")

    def __init__(self, data_dir: Path) -> None:
        self._directory = data_dir / EPOCHS_DIR
        self._parsed: dict[str, dict[int, int]] = {}
        self.bounds: dict[int, int] = {}  # segment base position -> end of its valid bytes

    def refresh(self) -> dict[int, int]:
        """The merged seals now (the same dict as before when nothing changed)."""
        try:
            listed = os.listdir(self._directory)
        except FileNotFoundError:  # a single node's directory, or a shard never claimed
            return self.bounds
        added = False
        for name in listed:
            if name in self._parsed or not is_epoch_file_name(name):
                continue
            try:
                data = (self._directory / name).read_bytes()
            except FileNotFoundError:
                continue
            seals = parse_seals(data)
            if seals is not None:
                self._parsed[name] = seals
                added = added or bool(seals)
        if added:
            self.bounds = merge_seals(self._parsed)
        return self.bounds


def sealed_bounds(data_dir: Path) -> dict[int, int]:
    """Segment base position -> the end of its valid bytes, over every epoch file of
    ``data_dir``; segments absent from the result are bounded by their frames."""
    return Seals(data_dir).refresh()
