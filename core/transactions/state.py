"""The in-memory state of one transaction, and what the service reports about it.

Not thread-safe: owned by the event-loop thread of :class:`~core.transactions.TransactionService`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.transactions.decisions import TargetIndex

# Transaction states (``TransactionService.txn_state``).
OPEN = "open"  # halves stored and invisible; outcome unknown
COMMITTED = "committed"  # op record and LINK appended: visible at every destination
ROLLED_BACK = "rolled_back"  # op record appended: the halves are never indexed anywhere visible

# What a check-back answers (RocketMQ's LocalTransactionState: COMMIT_MESSAGE,
# ROLLBACK_MESSAGE, UNKNOW).
COMMIT = "commit"
ROLLBACK = "rollback"
UNKNOWN = "unknown"


class TransactionError(Exception):
    """A call that does not fit the transaction's state (the caller's fault): an unknown id,
    adding to or committing a decided transaction, reusing an open id."""


@dataclass(eq=False, slots=True)
class Transaction:
    txn_id: str
    producer_group: str
    # This transaction's check timeout (None: the service's ``check_timeout_ms``).
    timeout_ms: float | None = None
    state: str = OPEN
    # (commit-log position, frame size) of each half, in the order added.
    halves: list[tuple[int, int]] = field(default_factory=list)
    # Offset of the first half in __half/0, and the end of __transactions/0 when it was added:
    # the resume mark while this is the oldest open transaction.
    first_half_offset: int = 0
    first_op_offset: int = 0
    # Some half went to a topic with sync durability: decisions wait for the fsync too.
    sync: bool = False
    checks: int = 0  # check-backs asked so far, durable (op records of kind "check")
    checking: bool = False  # a check-back or the default outcome is under way
    deadline_ms: float = 0.0  # clock time after which the outcome is overdue
    # The headers added to each half, encoded (core.transactions.layout.encode_half_headers);
    # empty until the first half.
    half_headers: bytes = b""
    # How each half is indexed once committed, parallel to ``halves`` (shorter for halves
    # found by restart: their commit reads it from their frames).
    half_index: list[TargetIndex] = field(default_factory=list)

    def known_half_index(self) -> list[TargetIndex] | None:
        """``half_index`` when it describes every half, else None (the commit then reads the
        halves' frames)."""
        return self.half_index if len(self.half_index) == len(self.halves) else None


@dataclass(frozen=True, slots=True)
class PendingTransaction:
    """One open transaction, as :meth:`TransactionService.pending` lists it."""

    txn_id: str
    producer_group: str
    halves: int
    first_position: int | None
    checks: int
    checking: bool
