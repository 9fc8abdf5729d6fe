"""Epoch files: ownership of a shard made real on its storage (docs/cluster.md section 5.2-5.4).

Layout, in each shard directory::

    SHARD/epochs/00000000000000000007          one file per ownership, created O_CREAT|O_EXCL
    SHARD/epochs/00000000000000000007.closed   present once epoch 7's owner stopped cleanly

An epoch file holds one JSON object, written once by the node that claimed the shard::

    {"node": "2", "incarnation": 1234, "claimed_ms": 1764547200000,
     "start": <commit-log position it starts writing at>,
     "sealed": {"<segment base position>": <end position>, ...}}

Who writes: the claiming node, before it opens the shard, after Redis granted it the epoch
(section 4's claim script); the file, not Redis, makes the grant real: ``O_EXCL`` lets exactly
one claimer of an epoch through, even when a Sentinel failover made Redis hand it out twice.
The owner at epoch ``e`` checks, after each group-commit fsync and before it releases any waiter,
that ``e + 1`` does not exist (:func:`is_fenced`: one ``stat``); a new owner creates ``e + 1``
before it recovers, so a record released by the old owner was on disk before the new owner read
the log. The ``.closed`` marker says the owner stopped after its last fsync: the next owner then
continues the segment; without it the next owner seals the recovered end (``sealed``) and starts
at the next segment boundary, so bytes a paused old owner writes later are past every reader's
bound (:func:`sealed_bounds`).

Not checksummed: a file is fsynced before its directory entry is, so a crash leaves either no
file, or an empty or partial one whose claimer never opened the shard (it writes before it
opens): :func:`read_claim` returns None for it, and it still fences (it exists). Functions over
the filesystem only; safe from any thread or process (the filesystem serialises them).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

EPOCHS_DIR: Final = "epochs"
CLOSED_SUFFIX: Final = ".closed"
_EPOCH_DIGITS: Final = 20  # as segment names (core/log/names.py): a listing sorts numerically
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
    """What epoch ``epoch``'s file says, or None when it is absent or was never completely
    written (its claimer crashed before the fsync, so it never opened the shard)."""
    try:
        data = epoch_path(shard_dir, epoch).read_bytes()
    except FileNotFoundError:
        return None
    try:
        return EpochClaim.from_json(data)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


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
    """Segment base position -> the end of its valid bytes, merged over every epoch file: the
    smallest end recorded for a segment, because nobody writes into a segment after it was
    sealed (the new owner starts at the next segment boundary), so bytes past the first seal
    came from a fenced owner. Segments absent from the result are bounded by their frames."""
    bounds: dict[int, int] = {}
    for epoch in epochs(shard_dir):
        claim = read_claim(shard_dir, epoch)
        if claim is None:
            continue
        for base, end in claim.sealed.items():
            bounds[base] = min(end, bounds.get(base, end))
    return bounds
