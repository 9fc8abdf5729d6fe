"""Kafka error codes the group coordinator answers with, and its one internal error.

Client faults are never raised: every operation returns an :class:`ErrorCode`, which a gateway
puts on the wire unchanged (Kafka) or maps to its own reply (another protocol). The numbers are
Kafka's (``org.apache.kafka.common.protocol.Errors``), so the Kafka front end needs no table.

:class:`IllegalGroupTransition` is the opposite case: a transition missing from the state table
(:mod:`core.groups.state`) means the coordinator itself is wrong, as Kafka's
``IllegalStateException`` in ``GroupMetadata.assertValidTransition`` does.
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """Kafka error codes used by group membership. Compares equal to the plain ``int``."""

    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    # The coordinator is closing or was closed; the client looks the coordinator up again.
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    # The request carries a generation other than the group's current one.
    ILLEGAL_GENERATION = 22
    # No protocol every member supports, or a protocol type other than the group's.
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    # session.timeout.ms outside [group.min.session.timeout.ms, group.max.session.timeout.ms].
    INVALID_SESSION_TIMEOUT = 26
    # A rebalance started: the member must send JoinGroup again.
    REBALANCE_IN_PROGRESS = 27
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    # KIP-394: the member got an id in this response and must join again with it.
    MEMBER_ID_REQUIRED = 79
    GROUP_MAX_SIZE_REACHED = 81
    # KIP-345: another member id holds this group.instance.id now.
    FENCED_INSTANCE_ID = 82


class IllegalGroupTransition(RuntimeError):
    """A group state transition that the table does not allow: a coordinator bug, not a client's."""

    def __init__(self, group_id: str, state: str, event: str) -> None:
        self.group_id = group_id
        self.state = state
        self.event = event
        super().__init__(f"group {group_id!r}: no transition from {state} on {event}")
