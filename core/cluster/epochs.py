"""Epoch files: ownership of a shard made real on its storage (docs/cluster.md section 5.2-5.4).

Layout, in each shard directory::

    SHARD/epochs/00000000000000000007          one file per ownership, created O_CREAT|O_EXCL
    SHARD/epochs/00000000000000000007.sealed   where epoch 7's owner started writing and what it
                                               sealed, written (tmp + rename) when it opened the
                                               log, before its first write
    SHARD/epochs/00000000000000000007.closed   present once epoch 7's owner stopped cleanly

An epoch file holds one JSON object, written once by the node that claimed the shard::

    {"node": "2", "incarnation": 1234, "claimed_ms": 1764547200000,
     "start": <commit-log position it starts writing at>,
     "sealed": {"<segment base position>": <end position>, ...}}

The claim is written before the log is opened, so it holds ``start: 0`` and no seals; what
opening the log decided goes to the ``.sealed`` companion, same two fields::

    {"start": <position>, "sealed": {"<segment base position>": <end position>}}

:func:`read_claim` returns the claim with the companion's values when there is one. The
companion is separate so that the claim stays created once with ``O_EXCL`` (the fence) and is
never rewritten. Readers in core/log read both files (:mod:`core.log.fence`), since the log
must not import this package.

Who writes: the claiming node, before it opens the shard, after Redis granted it the epoch
(section 4's claim script); the file, not Redis, makes the grant real: ``O_EXCL`` lets exactly
one claimer of an epoch through, even when a Sentinel failover made Redis hand it out twice.
The owner at epoch ``e`` checks, after each group-commit fsync and before it releases any waiter,
that ``e + 1`` does not exist (:func:`is_fenced`: one ``stat``); a new owner creates ``e + 1``
before it recovers, so a record released by the old owner was on disk before the new owner read
the log. The ``.closed`` marker says the owner stopped after its last fsync: the next owner then
continues the segment; without it the next owner seals the recovered end (``sealed``) and starts
at the next segment boundary, so bytes a paused old owner writes later are past every reader's
bound (:func:`sealed_bounds`). :func:`log_fence` hands all this to the shard's LogStore.

Not checksummed: a file is fsynced before its directory entry is, so a crash leaves either no
file, or an empty or partial one whose claimer never opened the shard (it writes before it
opens): :func:`read_claim` returns None for it, and it still fences (it exists). Functions over
the filesystem only; safe from any thread or process (the filesystem serialises them).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Final

from core.log import fence as log_fences
from core.log.config import write_atomically
from core.log.fence import EPOCHS_DIR, SEALED_SUFFIX, Fence

__all__ = [
    "CLOSED_SUFFIX",
    "EPOCHS_DIR",
    "SEALED_SUFFIX",
    "EpochClaim",
    "EpochTaken",
    "claim_epoch",
    "closed_path",
    "continues_segment",
    "epoch_path",
    "epochs",
    "highest_epoch",
    "is_fenced",
    "log_fence",
    "mark_closed",
    "read_claim",
    "record_start",
    "sealed_bounds",
    "sealed_path",
    "was_closed",
]

CLOSED_SUFFIX: Final = ".closed"
_EPOCH_DIGITS: Final = log_fences.EPOCH_DIGITS  # as segment names: a listing sorts numerically
_FILE_MODE: Final = 0o644


class EpochTaken(Exception):
    """Another claimer created this epoch's file first: Redis handed the epoch out twice (a lost
    grant after a Sentinel failover) or two nodes raced. The claimer reads :func:`highest_epoch`,
    moves Redis past it and claims again (section 5.2)."""

    def __init__(self, shard_dir: Path, epoch: int) -> None:
        super().__init__(
            f"epoch {epoch} of shard {shard_dir} is already claimed "
            f"({epoch_path(shard_dir, epoch)} exists): claim a higher epoch"
        )
        self.shard_dir = shard_dir
        self.epoch = epoch


@dataclass(frozen=True, slots=True)
class EpochClaim:
    """The content of an epoch file."""

    node: str
    incarnation: int
    claimed_ms: int
    start: int  # commit-log position the owner starts writing at
    # Segment base position -> end position: bytes of that segment past it are not the log's.
    sealed: dict[int, int] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "node": self.node,
                "incarnation": self.incarnation,
                "claimed_ms": self.claimed_ms,
                "start": self.start,
                "sealed": {str(base): end for base, end in sorted(self.sealed.items())},
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> EpochClaim:
        value: Any = json.loads(data)
        return cls(
            node=str(value["node"]),
            incarnation=int(value["incarnation"]),
            claimed_ms=int(value["claimed_ms"]),
            start=int(value["start"]),
            sealed={int(base): int(end) for base, end in value["sealed"].items()},
        )


def epoch_name(epoch: int) -> str:
    if epoch < 0:
        raise ValueError(f"an epoch is not negative: {epoch}")
    return f"{epoch:0{_EPOCH_DIGITS}d}"


def epochs_dir(shard_dir: Path) -> Path:
    return shard_dir / EPOCHS_DIR


def epoch_path(shard_dir: Path, epoch: int) -> Path:
    return shard_dir / EPOCHS_DIR / epoch_name(epoch)


def closed_path(shard_dir: Path, epoch: int) -> Path:
    return shard_dir / EPOCHS_DIR / f"{epoch_name(epoch)}{CLOSED_SUFFIX}"


def sealed_path(shard_dir: Path, epoch: int) -> Path:
    return shard_dir / EPOCHS_DIR / f"{epoch_name(epoch)}{SEALED_SUFFIX}"


def fsync_dir(path: Path) -> None:
    """Make the directory's entries (a create, a rename) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _ensure_epochs_dir(shard_dir: Path) -> Path:
    directory = epochs_dir(shard_dir)
    if not directory.is_dir():
        directory.mkdir(exist_ok=True)
        fsync_dir(shard_dir)  # the new directory's entry in the shard directory
    return directory


def claim_epoch(shard_dir: Path, epoch: int, claim: EpochClaim) -> Path:
    """Create ``epochs/<epoch>`` with ``O_CREAT|O_EXCL``, write ``claim``, fsync the file and the
    directory; return its path. Raises :class:`EpochTaken` if the file exists already."""
    directory = _ensure_epochs_dir(shard_dir)
    path = directory / epoch_name(epoch)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
    except FileExistsError:
        raise EpochTaken(shard_dir, epoch) from None
    try:
        data = claim.to_json()
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(directory)
    return path


def epochs(shard_dir: Path) -> list[int]:
    """The claimed epochs of a shard, ascending (an empty list when none was ever claimed)."""
    try:
        names = os.listdir(epochs_dir(shard_dir))
    except FileNotFoundError:
        return []
    return sorted(int(name) for name in names if len(name) == _EPOCH_DIGITS and name.isdigit())


def highest_epoch(shard_dir: Path) -> int | None:
    """The highest claimed epoch of the shard, or None when none was."""
    found = epochs(shard_dir)
    return found[-1] if found else None


def read_claim(shard_dir: Path, epoch: int) -> EpochClaim | None:
    """What epoch ``epoch``'s file says, with ``start`` and ``sealed`` from its ``.sealed``
    companion once its owner opened the log; None when the claim is absent or was never
    completely written (its claimer crashed before the fsync, so it never opened the shard)."""
    try:
        data = epoch_path(shard_dir, epoch).read_bytes()
    except FileNotFoundError:
        return None
    try:
        claim = EpochClaim.from_json(data)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    try:
        opened: Any = json.loads(sealed_path(shard_dir, epoch).read_bytes())
    except FileNotFoundError:
        return claim
    return EpochClaim(
        node=claim.node,
        incarnation=claim.incarnation,
        claimed_ms=claim.claimed_ms,
        start=int(opened["start"]),
        sealed={int(base): int(end) for base, end in opened["sealed"].items()},
    )


def record_start(shard_dir: Path, epoch: int, start: int, sealed: dict[int, int]) -> Path:
    """Write epoch ``epoch``'s ``.sealed`` companion: the commit-log position its owner starts
    writing at and the seal it made (section 5.4). Atomic (tmp + fsync + rename + fsync of the
    directory): readers see all of it or nothing. Called by the store before its first write
    (:func:`log_fence`)."""
    path = sealed_path(shard_dir, epoch)
    data = json.dumps(
        {"start": start, "sealed": {str(base): end for base, end in sorted(sealed.items())}},
        separators=(",", ":"),
    ).encode()
    write_atomically(path, data)
    return path


def is_fenced(shard_dir: Path, epoch: int) -> bool:
    """Whether a newer owner claimed the shard: ``epochs/<epoch + 1>`` exists. One ``stat``, the
    check an owner makes after each group-commit fsync before it acknowledges (section 5.3). An
    I/O error other than "no such file" propagates: an owner that cannot tell must not
    acknowledge."""
    try:
        os.stat(epoch_path(shard_dir, epoch + 1))
    except FileNotFoundError:
        return False
    return True


def mark_closed(shard_dir: Path, epoch: int) -> Path:
    """Record that epoch ``epoch``'s owner stopped cleanly after its last fsync (section 5.4):
    the next owner continues the segment instead of sealing it. Idempotent."""
    directory = _ensure_epochs_dir(shard_dir)
    path = closed_path(shard_dir, epoch)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, _FILE_MODE)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(directory)
    return path


def was_closed(shard_dir: Path, epoch: int) -> bool:
    return closed_path(shard_dir, epoch).exists()


def sealed_bounds(shard_dir: Path) -> dict[int, int]:
    """Segment base position -> the end of its valid bytes, merged over every epoch file and
    companion: the smallest end recorded for a segment, because nobody writes into a segment
    after it was sealed (the new owner starts at the next segment boundary), so bytes past the
    first seal came from a fenced owner. Segments absent from the result are bounded by their
    frames. The log's readers compute the same (:func:`core.log.fence.sealed_bounds`)."""
    return log_fences.sealed_bounds(shard_dir)


def continues_segment(shard_dir: Path, epoch: int) -> bool:
    """Whether epoch ``epoch``'s owner continues the last segment (section 5.4): the epoch
    before it on disk closed cleanly, or there is none (a new shard, or an adopted single-node
    directory, whose broker was stopped). Otherwise that owner may still be writing, paused:
    the new owner seals the recovered end and starts at the next segment boundary. An earlier
    epoch whose claimer never opened the log still counts as unclean: it may be paused between
    its recovery and its first write."""
    earlier = [found for found in epochs(shard_dir) if found < epoch]
    return not earlier or was_closed(shard_dir, earlier[-1])


def log_fence(shard_dir: Path, epoch: int) -> Fence:
    """The fence the owner of ``epoch`` opens the shard's LogStore with: fenced once
    ``epoch + 1`` exists (:func:`is_fenced`), a new segment unless :func:`continues_segment`,
    and the start and seal written to the ``.sealed`` companion before the first write. Call it
    after :func:`claim_epoch` (it reads the earlier epochs then)."""
    return Fence(
        is_fenced=partial(is_fenced, shard_dir, epoch),
        start_at_segment_boundary=not continues_segment(shard_dir, epoch),
        record_start=partial(record_start, shard_dir, epoch),
    )
