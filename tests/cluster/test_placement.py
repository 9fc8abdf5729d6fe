"""core/cluster/placement.py: the rule of each kind (docs/cluster.md section 3) against values
computed independently (Kafka's own murmur2 test values, and kafka-python's murmur2), and the
recorded placements that override the rule."""

from __future__ import annotations

import random
import string

import pytest
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from core.cluster.placement import (
    PLACE_GROUP,
    PLACE_KINDS,
    PLACE_PARTITION,
    PLACE_QUEUE,
    PLACE_RETAINED,
    PLACE_SESSION,
    PLACE_SHARE,
    PLACE_TXN,
    Placements,
    exclusive_queue_shard,
    group_shard,
    key_hash,
    partition_key,
    partition_shard,
    queue_key,
    queue_shard,
    retained_shard,
    session_shard,
    share_key,
    share_shard,
    split_partition_key,
    transaction_shard,
)

# Kafka's UtilsTest.testMurmur2: Utils.murmur2(s.getBytes()) as Java ints (signed).
KAFKA_MURMUR2 = {
    "21": -973932308,
    "foobar": -790332482,
    "a-little-bit-long-string": -985981536,
    "a-little-bit-longer-string": -1486304829,
    "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    "abc": 479470107,
}


def kafka_to_positive(java_int: int) -> int:
    """Kafka's Utils.toPositive: the Java int with its sign bit cleared."""
    return java_int & 0x7FFFFFFF


def reference_hash(key: str) -> int:
    """h(key) by kafka-python's own murmur2 (a separate implementation from ours)."""
    return kafka_python_murmur2(key.encode()) & 0x7FFFFFFF


def random_names(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits + "._-/é€"
    return ["".join(rng.choices(alphabet, k=rng.randint(1, 40))) for _ in range(count)]


@pytest.mark.parametrize(("text", "java_int"), sorted(KAFKA_MURMUR2.items()))
def test_hash_is_kafkas_murmur2_made_positive(text, java_int):
    assert key_hash(text) == kafka_to_positive(java_int)


def test_hash_agrees_with_kafka_python_on_many_names():
    names = random_names(500, seed=22)
    assert [key_hash(name) for name in names] == [reference_hash(name) for name in names]


@pytest.mark.parametrize("shards", [1, 7, 16, 50])
def test_every_kind_follows_its_documented_key(shards):
    """Fixed expected values from Kafka's test vectors: the shard each kind's rule gives for a
    key whose murmur2 Kafka published."""
    for text, java_int in KAFKA_MURMUR2.items():
        expected = kafka_to_positive(java_int) % shards
        assert session_shard(text, shards) == expected
        assert group_shard(text, shards) == expected
        assert transaction_shard(text, shards) == expected
        assert retained_shard(text, shards) == expected
        for queue in (0, 1, 11):
            assert partition_shard(text, queue, shards) == (
                (kafka_to_positive(java_int) + queue) % shards
            )
    for name in random_names(50, seed=shards):
        assert queue_shard("/", name, shards) == reference_hash("/\0" + name) % shards
        assert share_shard("g1", name, shards) == reference_hash("g1/" + name) % shards


def test_twelve_partitions_of_a_topic_land_on_twelve_distinct_shards_of_sixteen():
    for topic in ["orders", "payments.eu", "__offsets", *random_names(300, seed=12)]:
        shards = [partition_shard(topic, queue, 16) for queue in range(12)]
        assert len(set(shards)) == 12, (topic, shards)
        # Consecutive partitions on consecutive shards, wrapping around.
        assert shards == [(shards[0] + queue) % 16 for queue in range(12)]


def test_names_spread_over_all_shards():
    counts = [0] * 16
    for name in random_names(1600, seed=16):
        counts[queue_shard("/", name, 16)] += 1
    assert all(count > 0 for count in counts), counts


def test_exclusive_queues_land_on_the_declaring_nodes_shards():
    own = [11, 3, 7]
    used = set()
    for name in random_names(200, seed=3):
        shard = exclusive_queue_shard("/", f"amq.gen-{name}", 16, own)
        assert shard in own
        used.add(shard)
        # The h(key) % len(own)-th of the sorted list: the same answer on every node.
        assert shard == sorted(own)[reference_hash(f"/\0amq.gen-{name}") % 3]
    assert used == set(own)


def test_an_exclusive_queue_of_a_node_without_shards_follows_the_hash_rule():
    for name in random_names(20, seed=4):
        assert exclusive_queue_shard("v1", name, 16, []) == queue_shard("v1", name, 16)


def test_an_exclusive_queue_cannot_go_to_a_shard_outside_the_cluster():
    with pytest.raises(ValueError, match="not one of"):
        exclusive_queue_shard("/", "q", 16, [16])


def test_partition_names_round_trip():
    assert split_partition_key(partition_key("a/b\0c", 11)) == ("a/b\0c", 11)
    with pytest.raises(ValueError, match="not a partition"):
        split_partition_key("orders")


@pytest.mark.parametrize("shards", [0, -1])
def test_a_cluster_has_shards(shards):
    with pytest.raises(ValueError, match="at least one shard"):
        queue_shard("/", "q", shards)


# -- Placements: recorded values first --------------------------------------------------------


def test_nothing_is_placed_until_recorded():
    placements = Placements(16)
    for kind in PLACE_KINDS:
        assert placements.shard_of(kind, "x") is None
    assert placements.place(PLACE_GROUP, "g") == group_shard("g", 16)
    assert placements.shard_of(PLACE_GROUP, "g") is None  # place computes, record records


def test_place_answers_each_kind_by_its_rule():
    placements = Placements(16)
    assert placements.place(PLACE_PARTITION, partition_key("orders", 5)) == partition_shard(
        "orders", 5, 16
    )
    assert placements.place(PLACE_QUEUE, queue_key("/", "jobs")) == queue_shard("/", "jobs", 16)
    assert placements.place(PLACE_SESSION, "c1") == session_shard("c1", 16)
    assert placements.place(PLACE_SHARE, share_key("g", "a/+")) == share_shard("g", "a/+", 16)
    assert placements.place(PLACE_TXN, "t1") == transaction_shard("t1", 16)
    assert placements.place(PLACE_RETAINED, "a/b") == retained_shard("a/b", 16)


def test_a_recorded_placement_wins_over_the_rule():
    name = queue_key("/", "jobs")
    by_rule = queue_shard("/", "jobs", 16)
    moved = (by_rule + 5) % 16
    placements = Placements(16, recorded={PLACE_QUEUE: {name: moved}})
    assert placements.shard_of(PLACE_QUEUE, name) == moved
    assert placements.place(PLACE_QUEUE, name) == moved
    placements.forget(PLACE_QUEUE, name)
    assert placements.shard_of(PLACE_QUEUE, name) is None
    assert placements.place(PLACE_QUEUE, name) == by_rule


def test_an_adopted_roots_existing_things_stay_in_the_legacy_shard():
    adopted = Placements(16, legacy_shard=0)
    fresh = Placements(16)
    names = [name for name in random_names(50, seed=0) if group_shard(name, 16) != 0]
    for name in names:
        assert adopted.place(PLACE_GROUP, name, existing=True) == 0
        assert adopted.place(PLACE_GROUP, name) == group_shard(name, 16)  # new ones hash
        assert fresh.place(PLACE_GROUP, name, existing=True) == group_shard(name, 16)


def test_exclusive_placement_through_placements():
    placements = Placements(16)
    name = queue_key("/", "amq.gen-1")
    assert placements.place(PLACE_QUEUE, name, own_shards=[4]) == 4
    with pytest.raises(ValueError, match="only AMQP queues"):
        placements.place(PLACE_SESSION, "c1", own_shards=[4])


def test_unknown_kinds_and_shards_are_refused():
    placements = Placements(4)
    with pytest.raises(ValueError, match="unknown placement kind"):
        placements.place("exchange", "x")
    with pytest.raises(ValueError, match="unknown placement kind"):
        placements.shard_of("exchange", "x")
    with pytest.raises(ValueError, match="not one of the 4"):
        placements.record(PLACE_QUEUE, "x", 4)
    with pytest.raises(ValueError, match="legacy shard"):
        Placements(4, legacy_shard=4)
