"""gateway/kafka/tagfilters.py without sockets: which group a Fetch belongs to (members'
client id, host and assigned partitions, claims, the ambiguity rule of docs/mapping.md,
"Kafka:"), the filter expression check, and runtime settings kept in ``__meta``.

A real Node on a temporary directory; groups formed through its real coordinator."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.api import PROTOCOL_KAFKA, ClientContext
from core.broker import Node
from core.groups.results import MemberIdentity
from core.log import TagFilter
from gateway.kafka.context import Connection
from gateway.kafka.tagfilters import (
    GroupTagFilters,
    assigned_partitions,
    expression_error,
    group_tag_filters,
)
from tests.kafka.conftest import api_of, open_broker

TOPIC = "orders"
CLIENT_ID = "app"  # every consumer below runs with this client id on this host
HOST = "127.0.0.1"
# Who sets filters at runtime below: an admin client's connection.
ADMIN = ClientContext(PROTOCOL_KAFKA, peer=f"{HOST}:9999", connection_id="kafka-admin")


def assignment(partitions: dict[str, list[int]]) -> bytes:
    """A ConsumerProtocolAssignment v0: [topic, [partition]], null user data."""
    out = struct.pack(">hi", 0, len(partitions))
    for topic, numbers in partitions.items():
        raw = topic.encode()
        out += struct.pack(">h", len(raw)) + raw + struct.pack(">i", len(numbers))
        out += b"".join(struct.pack(">i", n) for n in numbers)
    return out + struct.pack(">i", -1)


async def form_group(
    broker: Node, group: str, partitions: list[int], client_id: str = CLIENT_ID
) -> str:
    """A one-member ``consumer`` group, Stable, its member (client id, /HOST) assigned
    ``partitions`` of TOPIC; the registry told as SyncGroup tells it. Returns the member id."""
    joined = await broker.shard.groups.join(
        group,
        "",
        None,
        "consumer",
        [("range", b"")],
        session_timeout_ms=30_000,
        rebalance_timeout_ms=30_000,
        client_id=client_id,
        client_host="/" + HOST,
        require_known_member_id=False,
    )
    assert joined.is_leader
    synced = await broker.shard.groups.sync(
        group,
        joined.generation_id,
        joined.member_id,
        None,
        {joined.member_id: assignment({TOPIC: partitions})},
    )
    assert int(synced.error_code) == 0
    group_tag_filters(api_of(broker)).on_sync(group)
    return joined.member_id


def fetcher(port: int, client_id: str = CLIENT_ID, host: str = HOST) -> Connection:
    """A fetch connection of a consumer (another connection than its coordinator's)."""
    return Connection(peer=f"{host}:{port}", local_host=HOST, local_port=9092, client_id=client_id)


def tags_of(tag_filter: TagFilter | None) -> set[str] | None:
    return None if tag_filter is None else set(tag_filter.tags)


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Node]:
    opened = open_broker(tmp_path / "data")
    await opened.shard.store.start()
    await opened.start()
    yield opened
    await opened.close()
    await opened.shard.store.aclose()


def test_assigned_partitions_reads_the_consumer_protocol_assignment() -> None:
    raw = assignment({"a": [0, 2], "b": [1]})
    assert assigned_partitions(raw) == {("a", 0), ("a", 2), ("b", 1)}
    assert assigned_partitions(raw[:9]) == frozenset()  # cut short: nothing, no exception
    assert assigned_partitions(b"") == frozenset()


@pytest.mark.parametrize("good", ["", " ", "*", "TagA", " TagA || TagB ", "TagA||TagB||Tag C"])
def test_valid_expressions(good: str) -> None:
    assert expression_error(good) is None


@pytest.mark.parametrize(
    "bad",
    [
        "TagA | TagB",
        "TagA ||",
        "|| TagA",
        "TagA |||| TagB",
        "TagA,TagB",
        "* || TagA",
        "A&&B",
        "A\x00",
    ],
)
def test_invalid_expressions(bad: str) -> None:
    message = expression_error(bad)
    assert message is not None
    assert repr(bad) in message


async def test_one_candidate_gets_its_groups_filter(broker: Node) -> None:
    registry = group_tag_filters(api_of(broker))
    registry.configure({"billing": "TagA || TagB"})
    await form_group(broker, "billing", [0])
    assert tags_of(registry.filter_for(fetcher(5001), TOPIC, 0)) == {"TagA", "TagB"}
    # Another partition, client id or host is not this member's.
    assert registry.filter_for(fetcher(5001), TOPIC, 1) is None
    assert registry.filter_for(fetcher(5002, client_id="other"), TOPIC, 0) is None
    assert registry.filter_for(fetcher(5003, host="10.0.0.9"), TOPIC, 0) is None
    assert registry.metrics["filtered_fetches"] == 1


async def test_two_groups_same_client_id_and_host_are_served_unfiltered(broker: Node) -> None:
    """Members of two groups with different filters, same client id and host, same partition:
    with no earlier claim to tell them apart, the fetch is unfiltered (nobody loses records)."""
    registry = group_tag_filters(api_of(broker))
    registry.configure({"billing": "TagA", "audit": "*"})
    await form_group(broker, "billing", [0])
    await form_group(broker, "audit", [0])
    assert registry.filter_for(fetcher(6001), TOPIC, 0) is None
    assert registry.filter_for(fetcher(6002), TOPIC, 0) is None
    assert registry.metrics["ambiguous_fetches"] == 2
    assert registry.metrics["filtered_fetches"] == 0


async def test_two_groups_with_the_same_filter_are_not_ambiguous(broker: Node) -> None:
    registry = group_tag_filters(api_of(broker))
    registry.configure({"billing": "TagA", "audit": "TagA"})
    await form_group(broker, "billing", [0])
    await form_group(broker, "audit", [0])
    assert tags_of(registry.filter_for(fetcher(6101), TOPIC, 0)) == {"TagA"}
    assert registry.metrics["ambiguous_fetches"] == 0


async def test_claims_tell_the_members_apart(broker: Node) -> None:
    """A connection that fetched a partition only one of the members owns claims that member
    and keeps it; another connection then leaves the claimed member out."""
    registry = group_tag_filters(api_of(broker))
    registry.configure({"billing": "TagA", "audit": "TagB"})
    await form_group(broker, "billing", [0, 1])
    await form_group(broker, "audit", [0])
    billing_fetches, audit_fetches = fetcher(7001), fetcher(7002)
    assert tags_of(registry.filter_for(billing_fetches, TOPIC, 1)) == {"TagA"}  # billing's alone
    assert tags_of(registry.filter_for(billing_fetches, TOPIC, 0)) == {"TagA"}  # keeps its claim
    assert tags_of(registry.filter_for(audit_fetches, TOPIC, 0)) == {"TagB"}  # billing's is taken
    assert tags_of(registry.filter_for(billing_fetches, TOPIC, 0)) == {"TagA"}
    assert registry.metrics["ambiguous_fetches"] == 0


async def test_a_group_that_is_left_stops_counting(broker: Node) -> None:
    registry = group_tag_filters(api_of(broker))
    registry.configure({"billing": "TagA", "audit": "TagB"})
    billing = await form_group(broker, "billing", [0])
    await form_group(broker, "audit", [0])
    assert registry.filter_for(fetcher(8001), TOPIC, 0) is None  # ambiguous
    broker.shard.groups.leave("billing", [MemberIdentity(billing)])
    registry.on_leave("billing", {billing})
    assert tags_of(registry.filter_for(fetcher(8002), TOPIC, 0)) == {"TagB"}


async def test_runtime_setting_overrides_the_file_and_is_kept_in_meta(tmp_path: Path) -> None:
    broker = open_broker(tmp_path / "data")
    await broker.shard.store.start()
    await broker.start()
    registry: GroupTagFilters = group_tag_filters(api_of(broker))
    registry.configure({"billing": "TagA", "audit": "TagB"})
    assert registry.setting("billing") == ("TagA", "file")
    assert registry.setting("nobody") == (None, "none")
    await registry.store_filter(ADMIN, "billing", "TagC || TagD")
    await registry.store_filter(ADMIN, "audit", "*")  # explicitly none, over the file's
    assert registry.setting("billing") == ("TagC || TagD", "runtime")
    assert tags_of(registry.filters["billing"]) == {"TagC", "TagD"}
    assert registry.filters["audit"] is None
    assert registry.active
    await broker.close()
    await broker.shard.store.aclose()

    reopened = open_broker(tmp_path / "data")
    await reopened.shard.store.start()
    await reopened.start()
    try:
        again = group_tag_filters(api_of(reopened))
        assert again is not registry
        again.configure({"billing": "TagA", "audit": "TagB"})
        assert again.setting("billing") == ("TagC || TagD", "runtime")
        assert again.setting("audit") == ("*", "runtime")
        # Nothing to delete, nothing written.
        assert await again.set_filter(ADMIN, "nobody", None) is None
        await again.store_filter(ADMIN, "billing", None)  # back to the file's
        assert again.setting("billing") == ("TagA", "file")
        assert tags_of(again.filters["billing"]) == {"TagA"}
    finally:
        await reopened.close()
        await reopened.shard.store.aclose()
