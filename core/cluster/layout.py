"""The cluster's data root: ``cluster.json`` and a directory per shard (docs/cluster.md sec. 2).

Layout::

    ROOT/
      cluster.json          {"format": 1, "cluster_id": "<uuid4>", "shards": 16,
                             "created_ms": ..., "legacy_shard": null | 0}
      cluster.json.pending  the same, while `braid cluster init` runs (see below)
      shards/0000/          one shard: exactly a single-node data directory (log.json, ...)
      ...
      shards/0015/

Who writes: ``braid cluster init`` (:func:`init`, :func:`adopt`), once; ``cluster.json`` never
changes afterwards, because placement by hash depends on the shard count. Not checksummed: it
is written whole with tmp + fsync + rename + directory fsync (``write_atomically``).

Crash safety of a creation: the plan (the final ``cluster.json`` content, with its cluster id)
is written first as ``cluster.json.pending``; then the shard directories are made and, for an
adoption, the single-node directory's entries are renamed into ``shards/0000/`` one by one (each
rename atomic, so each entry is in exactly one of the two places); last, the plan is renamed to
``cluster.json``. A crash anywhere leaves the plan, and running the same command again finishes
from it. :func:`detect` calls a directory holding either file a root, so a plain ``braid serve``
never opens a half-moved single-node directory.

Not thread-safe; one process at a time (the caller holds the directory's lock, as
braid/cluster_cli.py does).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from core.cluster.epochs import fsync_dir
from core.log.config import write_atomically
from core.log.names import LOG_META_FILE

CLUSTER_FILE: Final = "cluster.json"
PENDING_FILE: Final = "cluster.json.pending"
SHARDS_DIR: Final = "shards"
FORMAT: Final = 1  # cluster.json's format: a node refuses one it does not know
DEFAULT_SHARDS: Final = 16  # section 2: a 16-core machine runs 16 workers
MAX_SHARDS: Final = 9999  # shard directories are named %04d
LEGACY_SHARD: Final = 0  # where an adopted single-node directory's files go
# Entries of ROOT that are the root's own, never moved into shard 0 by an adoption: the
# layout's files (and write_atomically's temporary), and the supervisor's directories.
ROOT_ENTRIES: Final = frozenset(
    {CLUSTER_FILE, PENDING_FILE, f"{PENDING_FILE}.tmp", SHARDS_DIR, "redis", "run"}
)

Kind = Literal["root", "single", "new"]


class LayoutError(Exception):
    """The directory is not what the command needs; nothing was changed. The message says why
    and what to run instead."""


def detect(path: Path) -> Kind:
    """``"root"``: a cluster's data root (``cluster.json``, or an unfinished ``cluster init``'s
    plan); ``"single"``: a single-node data directory (``log.json``); ``"new"``: neither (absent,
    empty, or holding neither file)."""
    if (path / CLUSTER_FILE).exists() or (path / PENDING_FILE).exists():
        return "root"
    if (path / LOG_META_FILE).exists():
        return "single"
    return "new"


def shard_dir_name(shard: int) -> str:
    return f"{shard:04d}"


@dataclass(frozen=True, slots=True)
class ClusterLayout:
    """A data root as ``cluster.json`` describes it."""

    root: Path
    cluster_id: str
    shards: int
    created_ms: int
    legacy_shard: int | None  # 0 when the root adopted a single-node directory

    def shard_dir(self, shard: int) -> Path:
        if not 0 <= shard < self.shards:
            raise ValueError(f"shard {shard} is not one of the {self.shards} shards of {self.root}")
        return self.root / SHARDS_DIR / shard_dir_name(shard)

    def shard_dirs(self) -> list[Path]:
        return [self.shard_dir(shard) for shard in range(self.shards)]

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "format": FORMAT,
                "cluster_id": self.cluster_id,
                "shards": self.shards,
                "created_ms": self.created_ms,
                "legacy_shard": self.legacy_shard,
            },
            indent=2,
        ).encode()

    @classmethod
    def from_json(cls, root: Path, data: bytes, source: str) -> ClusterLayout:
        try:
            value: Any = json.loads(data)
            layout_format = value["format"]
            if layout_format != FORMAT:
                raise LayoutError(
                    f"{source} has format {layout_format!r}; this braid knows format {FORMAT}"
                )
            layout = cls(
                root=root,
                cluster_id=str(uuid.UUID(value["cluster_id"])),
                shards=int(value["shards"]),
                created_ms=int(value["created_ms"]),
                legacy_shard=None if value["legacy_shard"] is None else int(value["legacy_shard"]),
            )
        except (ValueError, KeyError, TypeError) as error:
            raise LayoutError(f"{source} is not a valid cluster file: {error}") from None
        _check_shards(layout.shards)
        if layout.legacy_shard is not None and not 0 <= layout.legacy_shard < layout.shards:
            raise LayoutError(f"{source}: legacy_shard {layout.legacy_shard} is not a shard")
        return layout

    @classmethod
    def open(cls, root: Path) -> ClusterLayout:
        """The layout of an existing root; :class:`LayoutError` when ROOT is not one, or its
        creation did not finish."""
        path = root / CLUSTER_FILE
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            if (root / PENDING_FILE).exists():
                raise LayoutError(
                    f"{root}: `braid cluster init` did not finish ({PENDING_FILE} is there): "
                    "run the same command again to finish it"
                ) from None
            raise LayoutError(f"{root} is not a cluster data root (no {CLUSTER_FILE})") from None
        return cls.from_json(root, data, str(path))


def _check_shards(shards: int) -> None:
    if not 1 <= shards <= MAX_SHARDS:
        raise LayoutError(f"--shards must be 1..{MAX_SHARDS}, not {shards}")


def _existing(root: Path, shards: int | None, *, adopting: bool) -> ClusterLayout:
    """A finished root asked to be created again: fine when it is what was asked."""
    layout = ClusterLayout.open(root)
    if shards is not None and shards != layout.shards:
        raise LayoutError(
            f"{root} is a cluster root of {layout.shards} shards ({CLUSTER_FILE}); "
            f"the shard count never changes, so --shards {shards} is refused"
        )
    if adopting and layout.legacy_shard is None:
        raise LayoutError(f"{root} is already a cluster root: there is no single node to adopt")
    return layout


def _plan(root: Path, shards: int | None, *, adopting: bool) -> ClusterLayout:
    """What this creation makes: an unfinished one's plan, or a new one."""
    pending = root / PENDING_FILE
    if pending.exists():
        plan = ClusterLayout.from_json(root, pending.read_bytes(), str(pending))
        if plan.legacy_shard is not None and not adopting:
            raise LayoutError(
                f"an adoption of {root} was interrupted: run `braid cluster init {root} --adopt` "
                "to finish it"
            )
        if plan.legacy_shard is None and adopting:
            raise LayoutError(
                f"an init of {root} (nothing to adopt) was interrupted: run `braid cluster init "
                f"{root}` without --adopt to finish it"
            )
        if shards is not None and shards != plan.shards:
            raise LayoutError(
                f"the interrupted init of {root} was for {plan.shards} shards, not {shards}"
            )
        return plan
    kind = detect(root)
    if kind == "single" and not adopting:
        raise LayoutError(
            f"{root} is a single-node data directory ({LOG_META_FILE}): run "
            f"`braid cluster init {root} --adopt` to make it shard 0 of a cluster"
        )
    if kind == "new" and adopting:
        raise LayoutError(
            f"{root} is not a single-node data directory (no {LOG_META_FILE}): nothing to adopt"
        )
    if (
        kind == "new"
        and root.exists()
        and any(entry.name != f"{PENDING_FILE}.tmp" for entry in root.iterdir())
    ):
        raise LayoutError(
            f"{root} is not empty and not a data directory: refusing to make a cluster root there"
        )
    count = DEFAULT_SHARDS if shards is None else shards
    _check_shards(count)
    return ClusterLayout(
        root=root,
        cluster_id=str(uuid.uuid4()),
        shards=count,
        created_ms=time.time_ns() // 1_000_000,
        legacy_shard=LEGACY_SHARD if adopting else None,
    )


def _make_dir(path: Path) -> bool:
    """mkdir; True when it was made now (its parent's entry needs an fsync)."""
    try:
        path.mkdir()
    except FileExistsError:
        if not path.is_dir():
            raise LayoutError(f"{path} exists and is not a directory") from None
        return False
    return True


def _move_into_shard(root: Path, shard: Path) -> None:
    """Rename every entry of a single-node directory ``root`` into ``shard`` (same filesystem:
    each rename is atomic, nothing is copied). Entries already moved are not in ``root``."""
    for entry in sorted(os.listdir(root)):
        if entry in ROOT_ENTRIES:
            continue
        target = shard / entry
        if target.exists() or target.is_symlink():
            raise LayoutError(
                f"cannot move {root / entry} into {shard}: {target} exists already "
                "(a shard holds one single-node directory)"
            )
        os.rename(root / entry, target)
    fsync_dir(shard)
    fsync_dir(root)


def _create(root: Path, shards: int | None, *, adopting: bool) -> ClusterLayout:
    if (root / CLUSTER_FILE).exists():
        return _existing(root, shards, adopting=adopting)
    plan = _plan(root, shards, adopting=adopting)
    root.mkdir(parents=True, exist_ok=True)
    pending = root / PENDING_FILE
    if not pending.exists():
        write_atomically(pending, plan.to_json())
    made = _make_dir(root / SHARDS_DIR)
    if made:
        fsync_dir(root)
    made = False
    for shard_dir in plan.shard_dirs():
        made = _make_dir(shard_dir) or made
    if made:
        fsync_dir(root / SHARDS_DIR)
    if plan.legacy_shard is not None:
        _move_into_shard(root, plan.shard_dir(plan.legacy_shard))
    # Last: the plan becomes cluster.json (a rename, so it appears whole, and only once).
    os.rename(pending, root / CLUSTER_FILE)
    fsync_dir(root)
    return plan


def init(root: Path, shards: int | None = None) -> ClusterLayout:
    """Make ``root`` (absent or empty) a cluster data root of ``shards`` (default 16) empty
    shards. On a finished root: its layout, if ``shards`` is its count or None. Finishes an
    interrupted init. Raises :class:`LayoutError` on a single-node directory (see :func:`adopt`)
    or a non-empty directory that is neither."""
    return _create(root, shards, adopting=False)


def adopt(directory: Path, shards: int | None = None) -> ClusterLayout:
    """Make the single-node data directory ``directory`` a cluster data root whose shard 0 holds
    its files, moved by rename (``legacy_shard`` 0: everything already in it stays placed there).
    Finishes an interrupted adoption. The broker must be stopped and its directory lock held by
    the caller."""
    return _create(directory, shards, adopting=True)
