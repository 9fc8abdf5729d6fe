"""MQTT topic names, filters, `$` topics and shared subscriptions (MQTT 5.0 section 4.7, 4.8.2)."""

from __future__ import annotations

import pytest

from core.routing import (
    BindingTable,
    InvalidSharedSubscription,
    InvalidTopicFilter,
    InvalidTopicName,
    MatchKind,
    SharedSubscription,
    mqtt_matches,
    parse_shared_subscription,
    split_topic,
    validate_topic_filter,
    validate_topic_name,
)
from core.routing.errors import MQTT_TOPIC_FILTER_INVALID, MQTT_TOPIC_NAME_INVALID
from core.routing.mqtt_topic import MAX_TOPIC_BYTES
from tests.routing.reference import mqtt_reference

# (filter, topic, matches?), the examples of MQTT 5.0 section 4.7 first.
MATCH_CASES = [
    ("sport/tennis/player1/#", "sport/tennis/player1", True),  # '#' matches the parent
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),  # '+' matches an empty level
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("#", "/", True),
    ("+", "a", True),
    ("+/#", "a", True),
    ("a/b", "a/b", True),
    ("a/b", "a/b/", False),
    ("a//b", "a//b", True),
    ("a/+/b", "a//b", True),
    ("A/b", "a/b", False),  # no normalisation [MQTT-4.7.3-4]
    ("a/b/#", "a", False),
    ("+/+/+", "a/b", False),
    ("sensors/+/temp", "sensors/kitchen/temp", True),
    # [MQTT-4.7.2-1]: filters starting with a wildcard do not match '$' topics
    ("#", "$SYS/broker/load", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("$SYS/#", "$SYS/monitor/Clients", True),
    ("$SYS/#", "$SYS", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("+", "$", False),
    ("$", "$", True),
    ("a/#", "a/$x", True),  # only the first level is protected
    ("#", "x$", True),
    ("+/b", "$a/b", False),
    # shared filters are matched by their inner filter
    ("$share/g/sport/+", "sport/tennis", True),
    ("$share/g/#", "$SYS/x", False),
]


@pytest.mark.parametrize(("topic_filter", "topic", "expected"), MATCH_CASES)
def test_matching(topic_filter: str, topic: str, expected: bool) -> None:
    assert mqtt_matches(topic_filter, topic) is expected
    shared = parse_shared_subscription(topic_filter)
    assert mqtt_reference(shared.filter if shared else topic_filter, topic) is expected
    table: BindingTable[str] = BindingTable()
    table.add("t", MatchKind.MQTT, topic_filter, "session")
    routed = table.route_with_shared("t", topic)
    if shared is None:
        assert routed.destinations == ({"session"} if expected else set())
        assert routed.shared == {}
    else:
        assert routed.destinations == set()
        assert routed.shared == ({shared: {"session"}} if expected else {})


def test_split_topic_keeps_empty_levels() -> None:
    assert split_topic("/") == ["", ""]
    assert split_topic("a//b/") == ["a", "", "b", ""]


@pytest.mark.parametrize(
    "topic",
    ["a", "/", "a/b/c", "$SYS/x", "é/ü", " ", "a" * MAX_TOPIC_BYTES, "é" * (MAX_TOPIC_BYTES // 2)],
)
def test_valid_topic_names(topic: str) -> None:
    validate_topic_name(topic)


@pytest.mark.parametrize(
    ("topic", "rule"),
    [
        ("", "MQTT-4.7.3-1"),
        ("a/+", "MQTT-4.7.0-1"),
        ("a/#", "MQTT-4.7.0-1"),
        ("a+b", "MQTT-4.7.0-1"),
        ("a\x00b", "MQTT-4.7.3-2"),
        ("a" * (MAX_TOPIC_BYTES + 1), "MQTT-4.7.3-3"),
        ("é" * (MAX_TOPIC_BYTES // 2 + 1), "MQTT-4.7.3-3"),  # 2 bytes each in UTF-8
        ("a\ud800", "MQTT-1.5.4-1"),  # a lone surrogate is not UTF-8
    ],
)
def test_invalid_topic_names(topic: str, rule: str) -> None:
    with pytest.raises(InvalidTopicName) as caught:
        validate_topic_name(topic)
    assert caught.value.rule == rule
    assert caught.value.reason in str(caught.value)
    assert caught.value.mqtt_reason_code == MQTT_TOPIC_NAME_INVALID
    assert isinstance(caught.value, ValueError)
    assert len(str(caught.value)) < 200  # long values are shortened in the message


@pytest.mark.parametrize(
    "topic_filter",
    ["#", "+", "+/+", "/#", "a/#", "a/+/b", "+/tennis/#", "a//b", "$SYS/#", "$share", "a/b"],
)
def test_valid_filters(topic_filter: str) -> None:
    validate_topic_filter(topic_filter)


@pytest.mark.parametrize(
    ("topic_filter", "rule"),
    [
        ("", "MQTT-4.7.3-1"),
        ("a\x00", "MQTT-4.7.3-2"),
        ("a/" * 40_000, "MQTT-4.7.3-3"),
        ("#/a", "MQTT-4.7.1-1"),
        ("a/#/b", "MQTT-4.7.1-1"),
        ("a#", "MQTT-4.7.1-1"),
        ("a/b#", "MQTT-4.7.1-1"),
        ("#/#", "MQTT-4.7.1-1"),
        ("a+", "MQTT-4.7.1-2"),
        ("a/+b/c", "MQTT-4.7.1-2"),
        ("++", "MQTT-4.7.1-2"),
        ("+#", "MQTT-4.7.1-1"),
    ],
)
def test_invalid_filters(topic_filter: str, rule: str) -> None:
    with pytest.raises(InvalidTopicFilter) as caught:
        validate_topic_filter(topic_filter)
    assert caught.value.rule == rule
    assert caught.value.mqtt_reason_code == MQTT_TOPIC_FILTER_INVALID
    table: BindingTable[str] = BindingTable()
    with pytest.raises(InvalidTopicFilter):
        table.add("t", MatchKind.MQTT, topic_filter, "s")
    assert len(table) == 0
    assert table.sources() == []


@pytest.mark.parametrize(
    ("topic_filter", "expected"),
    [
        ("$share/g/a/b", SharedSubscription("g", "a/b")),
        ("$share/group-1/#", SharedSubscription("group-1", "#")),
        ("$share/g/+/x/#", SharedSubscription("g", "+/x/#")),
        ("$share/g//", SharedSubscription("g", "/")),
        ("$share/g/$SYS/#", SharedSubscription("g", "$SYS/#")),
        ("$share/g/$share/h/x", SharedSubscription("g", "$share/h/x")),
        ("$share", None),  # a plain filter
        ("$sharex/g/a", None),
        ("a/$share/g/b", None),
        ("$SHARE/g/a", None),  # case-sensitive
    ],
)
def test_parse_shared_subscription(topic_filter: str, expected: SharedSubscription | None) -> None:
    assert parse_shared_subscription(topic_filter) == expected


@pytest.mark.parametrize(
    ("topic_filter", "rule"),
    [
        ("$share/", "MQTT-4.8.2-1"),
        ("$share//a", "MQTT-4.8.2-1"),
        ("$share/g", "MQTT-4.8.2-2"),  # not followed by '/'
        ("$share/g/", "MQTT-4.8.2-2"),  # no filter after the '/'
        ("$share/g+/a", "MQTT-4.8.2-2"),
        ("$share/#/a", "MQTT-4.8.2-2"),
        ("$share/+/a", "MQTT-4.8.2-2"),
        ("$share/g/a/#/b", "MQTT-4.7.1-1"),  # the inner filter is validated
        ("$share/g/a+", "MQTT-4.7.1-2"),
        ("$share/g/a\x00", "MQTT-4.7.3-2"),
    ],
)
def test_invalid_shared_subscriptions(topic_filter: str, rule: str) -> None:
    with pytest.raises(InvalidSharedSubscription) as caught:
        parse_shared_subscription(topic_filter)
    assert caught.value.rule == rule
    assert caught.value.value == topic_filter
    assert isinstance(caught.value, InvalidTopicFilter)
    table: BindingTable[str] = BindingTable()
    with pytest.raises(InvalidSharedSubscription):
        table.add("t", MatchKind.MQTT, topic_filter, "s")


def test_shared_groups_are_routed_apart_from_plain_subscriptions() -> None:
    table: BindingTable[str] = BindingTable()
    table.add("t", MatchKind.MQTT, "sensors/+/temp", "plain")
    table.add("t", MatchKind.MQTT, "$share/workers/sensors/#", "w1")
    table.add("t", MatchKind.MQTT, "$share/workers/sensors/#", "w2")
    table.add("t", MatchKind.MQTT, "$share/workers/sensors/+/temp", "w3")  # another filter
    table.add("t", MatchKind.MQTT, "$share/audit/#", "a1")
    table.add("t", MatchKind.MQTT, "$share/audit/#", "plain")  # also a member of a group
    table.add("t", MatchKind.MQTT, "$share/other/alarms/#", "o1")

    destinations, shared = table.route_with_shared("t", "sensors/kitchen/temp")
    assert destinations == {"plain"}
    assert shared == {
        SharedSubscription("workers", "sensors/#"): {"w1", "w2"},
        SharedSubscription("workers", "sensors/+/temp"): {"w3"},
        SharedSubscription("audit", "#"): {"a1", "plain"},
    }
    # route() leaves shared groups out: they must get one copy per group, not per member
    assert table.route("t", "sensors/kitchen/temp") == {"plain"}

    assert table.remove("t", MatchKind.MQTT, "$share/workers/sensors/#", "w1")
    assert not table.remove("t", MatchKind.MQTT, "$share/workers/sensors/#", "w1")
    assert table.route_with_shared("t", "sensors/x").shared == {
        SharedSubscription("workers", "sensors/#"): {"w2"},
        SharedSubscription("audit", "#"): {"a1", "plain"},
    }
    assert table.route_with_shared("t", "$SYS/x") == ({*()}, {})


def test_routed_sets_are_fresh_copies() -> None:
    table: BindingTable[str] = BindingTable()
    table.add("t", MatchKind.MQTT, "$share/g/a", "m1")
    routed = table.route_with_shared("t", "a")
    routed.shared[SharedSubscription("g", "a")].add("intruder")
    assert table.route_with_shared("t", "a").shared == {SharedSubscription("g", "a"): {"m1"}}
