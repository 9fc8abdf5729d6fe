"""What the group coordinator answers: small frozen records a gateway turns into wire responses.

Field names follow Kafka's response schemas (JoinGroup, SyncGroup, LeaveGroup, DescribeGroups,
ListGroups) so the Kafka front end copies them across; ``None`` where Kafka's schema has a
nullable string, and where an older version has a non-nullable one the gateway sends ``""``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from core.groups.errors import ErrorCode

# JoinGroupRequest.UNKNOWN_MEMBER_ID and UNKNOWN_GENERATION_ID: a member that has not joined yet,
# or a commit that does not use group management ("simple consumer").
UNKNOWN_MEMBER_ID = ""
UNKNOWN_GENERATION_ID = -1


class JoinMember(NamedTuple):
    """One member as the leader sees it in its JoinGroup response."""

    member_id: str
    group_instance_id: str | None
    metadata: bytes  # the member's metadata for the selected protocol


@dataclass(frozen=True, slots=True)
class JoinResult:
    """A JoinGroup response. ``members`` is filled for the leader only."""

    error_code: ErrorCode
    generation_id: int
    protocol_name: str | None
    leader_id: str
    member_id: str
    members: list[JoinMember] = field(default_factory=list)
    protocol_type: str | None = None

    @property
    def is_leader(self) -> bool:
        return self.error_code == ErrorCode.NONE and self.leader_id == self.member_id


@dataclass(frozen=True, slots=True)
class SyncResult:
    """A SyncGroup response: the member's assignment, opaque bytes the leader produced."""

    error_code: ErrorCode
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


class MemberIdentity(NamedTuple):
    """One member named in a LeaveGroup request (v3+ carries several)."""

    member_id: str
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class MemberLeaveResult:
    member_id: str
    group_instance_id: str | None
    error_code: ErrorCode


@dataclass(frozen=True, slots=True)
class LeaveResult:
    """A LeaveGroup response: a top-level error, and one error per member named."""

    error_code: ErrorCode
    members: list[MemberLeaveResult] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class MemberDescription:
    """One member in DescribeGroups. ``metadata`` and ``assignment`` are empty unless Stable."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """One group in DescribeGroups. An unknown group is described as Dead with no members."""

    error_code: ErrorCode
    group_id: str
    state: str
    protocol_type: str
    protocol_name: str
    members: list[MemberDescription] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class GroupListing:
    """One group in ListGroups."""

    group_id: str
    protocol_type: str
    state: str
