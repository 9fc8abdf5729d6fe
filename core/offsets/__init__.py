"""Committed consumer positions of offset groups (Kafka consumer-group semantics)."""

from core.offsets.store import CommittedOffset, OffsetStore

__all__ = ["CommittedOffset", "OffsetStore"]
