"""Tag hashing for the index: a 64-bit Bloom mask per record, checked without reading bodies.

Each tag sets two bits chosen by its CRC32C. A subscription ``TagA || TagB`` matches an index
entry when every bit of at least one tag's mask is set; a hit is confirmed against the record's
real tags (a collision costs one body read, a miss costs nothing).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from crc32c import crc32c

# The record header a publisher of any protocol sets tags with (AMQP header, MQTT 5 user
# property, Kafka record header): ``TagA,TagB``.
TAGS_HEADER = "x-braid-tags"
_TAGS_HEADER_BYTES = TAGS_HEADER.encode()


def tags_from_headers(headers: Sequence[tuple[str, bytes]]) -> list[str]:
    """Tags named by ``x-braid-tags`` headers (comma separated, blanks dropped, order kept)."""
    tags: list[str] = []
    for name, value in headers:
        if name == TAGS_HEADER:
            for part in bytes(value).decode("utf-8", "replace").split(","):
                tag = part.strip()
                if tag and tag not in tags:
                    tags.append(tag)
    return tags


def batch_may_have_tags(batch: bytes | memoryview) -> bool:
    """Whether an uncompressed Kafka batch may carry ``x-braid-tags`` (a byte search)."""
    return _TAGS_HEADER_BYTES in bytes(batch)


def tag_mask(tag: str) -> int:
    digest = crc32c(tag.encode())
    return (1 << (digest & 63)) | (1 << ((digest >> 6) & 63))


def tags_mask(tags: Iterable[str]) -> int:
    mask = 0
    for tag in tags:
        mask |= tag_mask(tag)
    return mask


def parse_tag_expression(expression: str) -> frozenset[str] | None:
    """RocketMQ's tag expression: ``"TagA || TagB"``; ``"*"`` or empty means every record."""
    tags = frozenset(part.strip() for part in expression.split("||") if part.strip())
    if not tags or "*" in tags:
        return None
    return tags


class TagFilter:
    """A parsed tag subscription: the masks to test the index with and the tags to confirm."""

    __slots__ = ("masks", "tags")

    def __init__(self, tags: Iterable[str]) -> None:
        self.tags = frozenset(tags)
        self.masks = tuple({tag_mask(tag) for tag in self.tags})

    @classmethod
    def parse(cls, expression: str) -> TagFilter | None:
        tags = parse_tag_expression(expression)
        return None if tags is None else cls(tags)

    def may_match(self, entry_mask: int) -> bool:
        return any(entry_mask & mask == mask for mask in self.masks)

    def matches(self, record_tags: Iterable[str]) -> bool:
        return not self.tags.isdisjoint(record_tags)
