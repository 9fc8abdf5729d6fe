"""OffsetStore: commit/fetch offsets per (group, topic, queue), durable in ``__offsets``.

Each commit is one record of the ``__offsets`` system topic (key ``group\\x00topic\\x00queue``,
body ``i64 offset, i32 leader epoch, i64 commit ms, metadata``) through a DurableTable, so a
restart replays them and compaction keeps replay short. A commit is durable when ``commit``
returns (it awaits the log's sync durability).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import NamedTuple

from core.log import LogStore
from core.log.names import OFFSETS_TOPIC
from core.log.store import now_ms
from core.state import DurableTable

# i64 offset, i32 leader epoch (-1 unknown), i64 commit time ms; metadata follows.
_VALUE = struct.Struct("<qiq")
_SEPARATOR = "\x00"


class CommittedOffset(NamedTuple):
    offset: int
    leader_epoch: int
    metadata: str
    commit_ms: int


def _key(group: str, topic: str, queue: int) -> str:
    return f"{group}{_SEPARATOR}{topic}{_SEPARATOR}{queue}"


class OffsetStore:
    def __init__(self, store: LogStore) -> None:
        self.store = store
        self.table = DurableTable(store, OFFSETS_TOPIC)
        self._groups: dict[str, dict[tuple[str, int], CommittedOffset]] = {}
        for key, value in self.table.items():
            group, topic, queue = key.split(_SEPARATOR)
            self._groups.setdefault(group, {})[(topic, int(queue))] = self._decode(value)

    @staticmethod
    def _decode(value: bytes) -> CommittedOffset:
        offset, epoch, commit_ms = _VALUE.unpack_from(value)
        return CommittedOffset(offset, epoch, value[_VALUE.size :].decode(), commit_ms)

    def commit_nowait(
        self,
        group: str,
        commits: Iterable[tuple[str, int, int, int, str]],
    ) -> int:
        """Record ``(topic, queue, offset, leader_epoch, metadata)`` commits; returns the log end
        to await for durability."""
        end = 0
        positions = self._groups.setdefault(group, {})
        stamp = now_ms()
        for topic, queue, offset, epoch, metadata in commits:
            committed = CommittedOffset(offset, epoch, metadata, stamp)
            positions[(topic, queue)] = committed
            appended = self.table.put(
                _key(group, topic, queue),
                _VALUE.pack(offset, epoch, stamp) + metadata.encode(),
            )
            end = appended.end
        return end

    async def commit(self, group: str, commits: Iterable[tuple[str, int, int, int, str]]) -> None:
        end = self.commit_nowait(group, commits)
        if end:
            await self.store.wait_durable(end, OFFSETS_TOPIC)

    def fetch(self, group: str, topic: str, queue: int) -> CommittedOffset | None:
        return self._groups.get(group, {}).get((topic, queue))

    def fetch_group(self, group: str) -> dict[tuple[str, int], CommittedOffset]:
        return dict(self._groups.get(group, {}))

    def groups(self) -> list[str]:
        return sorted(self._groups)

    def delete_group(self, group: str) -> None:
        for topic, queue in self._groups.pop(group, {}):
            self.table.delete(_key(group, topic, queue))

    def delete_partitions(self, group: str, partitions: Iterable[tuple[str, int]]) -> int:
        """Forget the group's offsets of these ``(topic, queue)`` (Kafka's OffsetDelete); the
        log end to await for durability (0: none was there)."""
        end = 0
        positions = self._groups.get(group, {})
        for key in partitions:
            if positions.pop(key, None) is not None:
                deleted = self.table.delete(_key(group, *key))
                end = deleted.end if deleted is not None else end
        return end

    def delete_topic(self, topic: str) -> None:
        """Forget every group's offsets for ``topic`` (the topic was deleted)."""
        for group, positions in list(self._groups.items()):
            for key in [key for key in positions if key[0] == topic]:
                del positions[key]
                self.table.delete(_key(group, *key))
            if not positions:
                del self._groups[group]
