"""Consumer groups of several members become Stable promptly: kafka-python's own ``test_group``
(four consumers, session timeout 3 s, four partitions), against a broker configured as
kafka-python's suite configures Kafka (``group.min.session.timeout.ms=1000``). With BraidMQ's
default (Kafka's, 6 s) every member was refused with INVALID_SESSION_TIMEOUT and the group never
formed; ``[broker] group_min_session_timeout_ms`` now sets it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.structs import MemberState

from tests.braid_process import BraidProcess
from tests.kafka.conftest import unique

PARTITIONS = 4
CONSUMERS = 4
DEADLINE_S = 60


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    tmp_path: Path = tmp_path_factory.mktemp("braid")
    config = tmp_path / "braid.toml"
    config.write_text(
        f"[broker]\nnum_partitions = {PARTITIONS}\ngroup_min_session_timeout_ms = 1000\n"
    )
    with BraidProcess(
        tmp_path, listeners=("kafka",), extra_args=("--config", str(config))
    ) as process:
        yield process


class Member:
    """A consumer polling in its own thread, as kafka-python's ConsumerGroupRunner runs them."""

    def __init__(self, bootstrap: str, topic: str, group: str, index: int) -> None:
        self.consumer = KafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            client_id=f"member-{index}",
            session_timeout_ms=3000,
            request_timeout_ms=4000,
            heartbeat_interval_ms=500,
        )
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"member-{index}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                self.consumer.poll(timeout_ms=200)
        except BaseException as error:  # surfaced by the test
            self.error = error
        finally:
            self.consumer.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=DEADLINE_S)


def is_stable(members: list[Member]) -> bool:
    """kafka-python's ``wait_for_stable``: every member STABLE, assigned, one generation."""
    generations = set()
    for member in members:
        assert member.error is None, member.error
        metadata = member.consumer.group_metadata()
        if metadata.state != MemberState.STABLE or not member.consumer.assignment():
            return False
        generations.add(metadata.generation_id)
    return len(generations) == 1


def test_four_members_become_stable_with_a_short_session_timeout(braid: BraidProcess) -> None:
    topic = unique("stable")
    group = unique("stable-group")
    members: list[Member] = []
    try:
        for index in range(CONSUMERS):
            members.append(Member(braid.kafka_bootstrap, topic, group, index))
        deadline = time.monotonic() + DEADLINE_S
        while not is_stable(members):
            assert time.monotonic() < deadline, "the group did not become stable"
            time.sleep(0.1)
        assigned: set[TopicPartition] = set()
        for member in members:
            assignment = member.consumer.assignment()
            assert assignment
            assert assigned.isdisjoint(assignment)
            assigned |= assignment
        assert assigned == {TopicPartition(topic, p) for p in range(PARTITIONS)}
    finally:
        for member in members:
            member.close()
