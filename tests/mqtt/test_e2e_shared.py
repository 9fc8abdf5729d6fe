"""Shared subscriptions against a real ``braid serve`` with paho-mqtt: each message goes to one
member, chosen per message (issue 17, item 1): round robin by default, exactly even within one
message; EMQX's ``random``, ``sticky`` and ``hash_clientid`` as ``[mqtt]
shared_subscription_strategy``; a member that goes away gives its messages in flight to the
others."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.mqtt.codec import (
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Publish,
    Subscribe,
    Subscription,
)
from tests.braid_process import BraidProcess

from .clients import TIMEOUT, Paho, RawClient, assert_clean_log, unique

MESSAGES = 100


def _braid(path: Path, strategy: str | None) -> Iterator[BraidProcess]:
    args: tuple[str, ...] = ()
    if strategy is not None:
        config = path / "braid.toml"
        config.write_text(f'[mqtt]\nshared_subscription_strategy = "{strategy}"\n')
        args = ("--config", str(config))
    with BraidProcess(path, listeners=("mqtt",), extra_args=args) as process:
        yield process
    assert_clean_log(process)


@pytest.fixture(scope="module")
def default_braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    yield from _braid(tmp_path_factory.mktemp("braid-share"), None)


@pytest.fixture(scope="module", params=["random", "sticky", "hash_clientid"])
def strategy_braid(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, BraidProcess]]:
    path = tmp_path_factory.mktemp(f"braid-share-{request.param}")
    for process in _braid(path, request.param):
        yield request.param, process


def _members(port: int, count: int, share_filter: str, version: int = 5) -> list[Paho]:
    members = [Paho(port, version=version) for _ in range(count)]
    for member in members:
        member.connect()
        member.subscribe(share_filter, 1)
    return members


def _publish_each_awaited(port: int, topic: str, count: int, client_id: str | None = None) -> None:
    """``count`` QoS 1 messages, one after another, each after the PUBACK of the one before."""
    with Paho(port, client_id=client_id) as publisher:
        publisher.connect()
        for number in range(count):
            publisher.publish(topic, str(number).encode(), 1)


def _collect(members: list[Paho], total: int) -> list[list[int]]:
    """What each member received, once ``total`` messages arrived in all; then no member gets
    one more (a duplicate) for a moment."""
    deadline = time.monotonic() + TIMEOUT
    while sum(m.messages.qsize() for m in members) < total and time.monotonic() < deadline:
        time.sleep(0.02)
    received = []
    for member in members:
        got = []
        while not member.messages.empty():
            got.append(int(member.get().payload))
        received.append(got)
    for member in members:
        member.nothing(0.2)
    return received


def _raw_member(port: int, share_filter: str, receive_maximum: int = 100) -> RawClient:
    """A member on a raw socket: it acknowledges only what the test says."""
    raw = RawClient(port)
    raw.connect(unique("raw"), properties=Properties(receive_maximum=receive_maximum))
    raw.send(Subscribe(1, (Subscription(share_filter, 1),)))
    raw.recv()  # SUBACK
    return raw


@pytest.mark.parametrize("version", [4, 5])
@pytest.mark.parametrize("count", [2, 5])
def test_round_robin_is_even(default_braid: BraidProcess, count: int, version: int) -> None:
    port = default_braid.mqtt_port
    base = unique("rr")
    members = _members(port, count, f"$share/w/{base}/jobs", version)
    try:
        _publish_each_awaited(port, f"{base}/jobs", MESSAGES)
        received = _collect(members, MESSAGES)
        assert sorted(n for got in received for n in got) == list(range(MESSAGES))
        counts = [len(got) for got in received]
        assert max(counts) - min(counts) <= 1, counts
        for got in received:  # each member's share in publish order
            assert got == sorted(got)
    finally:
        for member in members:
            member.close()


def test_a_member_that_goes_gives_back_what_it_has_in_flight(
    default_braid: BraidProcess,
) -> None:
    """A member that never acknowledges, then disconnects: its messages go to the other (DUP),
    none lost, none twice at the member that acknowledges."""
    port = default_braid.mqtt_port
    base = unique("gone")
    share_filter = f"$share/w/{base}/#"
    silent = _raw_member(port, share_filter)
    (worker,) = _members(port, 1, share_filter)
    try:
        _publish_each_awaited(port, f"{base}/a", 10)
        held = [silent.recv() for _ in range(5)]  # round robin: every other message
        assert all(isinstance(packet, Publish) for packet in held)
        assert _collect([worker], 5)[0] == [1, 3, 5, 7, 9]
        silent.close()  # gone without PUBACK: its five go to the worker
        assert sorted(_collect([worker], 5)[0]) == [0, 2, 4, 6, 8]
    finally:
        worker.close()


def test_strategies(strategy_braid: tuple[str, BraidProcess]) -> None:
    strategy, braid = strategy_braid
    port = braid.mqtt_port
    base = unique(strategy)
    members = _members(port, 2, f"$share/w/{base}/jobs")
    try:
        publisher = unique("p1-")
        _publish_each_awaited(port, f"{base}/jobs", MESSAGES, client_id=publisher)
        first = _collect(members, MESSAGES)
        assert sorted(n for got in first for n in got) == list(range(MESSAGES))
        counts = sorted(len(got) for got in first)
        if strategy == "random":
            assert counts[0] > 0, counts  # (all to one: a chance of 2 in 2**100)
        else:  # sticky and hash_clientid: one member, while it has room / for one publisher
            assert counts == [0, MESSAGES], counts
        if strategy != "random":  # the same publisher again: the same member
            chosen = [len(got) for got in first].index(MESSAGES)
            _publish_each_awaited(port, f"{base}/jobs", 10, client_id=publisher)
            again = _collect(members, 10)
            assert len(again[chosen]) == 10, [len(got) for got in again]
    finally:
        for member in members:
            member.close()


def test_a_member_without_room_is_skipped(default_braid: BraidProcess) -> None:
    """A member whose Receive Maximum is used up is passed over (its turn goes to the member
    with room) until its PUBACK makes room again."""
    port = default_braid.mqtt_port
    base = unique("room")
    full = _raw_member(port, f"$share/w/{base}", receive_maximum=1)
    (paho,) = _members(port, 1, f"$share/w/{base}")
    try:
        _publish_each_awaited(port, base, 6)
        first = full.recv()
        assert isinstance(first, Publish)
        # Its one slot is taken: the other five go to the member with room.
        assert sorted(_collect([paho], 5)[0]) == sorted({0, 1, 2, 3, 4, 5} - {int(first.payload)})
        full.send(Puback(first.packet_id or 0))
        full.send(Pingreq())  # its PINGRESP: the PUBACK before it was handled
        assert isinstance(full.recv(), Pingresp)
        _publish_each_awaited(port, base, 2)  # room again: its turn comes back
        second = full.recv()
        assert isinstance(second, Publish)
        assert len(_collect([paho], 1)[0]) == 1
    finally:
        full.close()
        paho.close()
