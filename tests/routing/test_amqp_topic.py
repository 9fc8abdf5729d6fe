"""AMQP direct and topic matching, against RabbitMQ's own expectations."""

from __future__ import annotations

import pytest

from core.routing import BindingTable, MatchKind, direct_matches, split_routing_key, topic_matches
from tests.routing.reference import amqp_reference

# (binding key, routing key, matches?)
TOPIC_CASES = [
    ("a.b.c", "a.b.c", True),
    ("a.b.c", "a.b", False),
    ("a.b.c", "a.b.c.d", False),
    ("*", "a", True),
    ("*", "", False),  # '*' needs exactly one word; '' is zero words
    ("*", "a.b", False),
    ("*", ".", False),  # '.' is two empty words
    ("*.*", ".", True),
    ("#", "", True),
    ("#", "a", True),
    ("#", "a.b.c", True),
    ("#", "..", True),
    ("", "", True),
    ("", "a", False),
    ("a.#", "a", True),  # '#' matches zero words
    ("a.#", "a.b.c", True),
    ("a.#", "b", False),
    ("#.a", "a", True),
    ("#.a", "x.y.a", True),
    ("#.a", "a.x", False),
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.y.b", True),
    ("a.#.b", "a.x.y", False),
    ("a.#.b", "a.b.b", True),
    ("#.#", "", True),
    ("#.#", "a.b", True),
    ("#.*.#", "", False),
    ("#.*.#", "a", True),
    ("*.#", "", False),
    ("*.#", "a", True),
    ("a.*.b", "a..b", True),  # '*' matches an empty word
    ("a..b", "a..b", True),
    ("a..b", "a.b", False),
    ("a.", "a", False),
    ("a.", "a.", True),
    ("a.*", "a.", True),
    ("a*", "a*", True),  # '*' inside a word is a literal
    ("a*", "ab", False),
    ("#b", "ab", False),
    ("#b", "#b", True),
    ("a.b", "A.B", False),  # no normalisation
    ("é.*", "é.ü", True),
]


@pytest.mark.parametrize(("pattern", "key", "expected"), TOPIC_CASES)
def test_topic_matches(pattern: str, key: str, expected: bool) -> None:
    assert topic_matches(pattern, key) is expected
    assert amqp_reference(pattern, key) is expected
    table: BindingTable[str] = BindingTable()
    table.add("x", MatchKind.TOPIC, pattern, "q")
    assert table.route("x", key) == ({"q"} if expected else set())


@pytest.mark.parametrize(
    ("key", "words"),
    [("", []), ("a", ["a"]), ("a.b", ["a", "b"]), (".", ["", ""]), ("a..b", ["a", "", "b"])],
)
def test_split_routing_key(key: str, words: list[str]) -> None:
    assert split_routing_key(key) == words


def test_direct_matches_is_equality() -> None:
    assert direct_matches("a.b", "a.b")
    assert not direct_matches("a.*", "a.b")
    assert not direct_matches("a", "A")


# RabbitMQ's topic exchange test (rabbit_tests test_topic_matching): bindings t1..t26,
# the queues each routing key reaches, then again after removing t1, t5, t11, t19, t21.
RABBIT_BINDINGS = {
    "t1": "a.b.c",
    "t2": "a.*.c",
    "t3": "a.#.b",
    "t4": "a.b.b.c",
    "t5": "#",
    "t6": "#.#",
    "t7": "#.b",
    "t8": "*.*",
    "t9": "a.*",
    "t10": "*.b.c",
    "t11": "a.#",
    "t12": "a.#.#",
    "t13": "b.b.c",
    "t14": "a.b.b",
    "t15": "a.b",
    "t16": "b.c",
    "t17": "",
    "t18": "*.*.*",
    "t19": "vodka.martini",
    "t20": "a.b.c",
    "t21": "*.#",
    "t22": "#.*.#",
    "t23": "*.#.#",
    "t24": "#.#.#",
    "t25": "*",
    "t26": "#.b.#",
}
RABBIT_EXPECTED = {
    "a.b.c": "t1 t2 t5 t6 t10 t11 t12 t18 t20 t21 t22 t23 t24 t26",
    "a.b": "t3 t5 t6 t7 t8 t9 t11 t12 t15 t21 t22 t23 t24 t26",
    "a.b.b": "t3 t5 t6 t7 t11 t12 t14 t18 t21 t22 t23 t24 t26",
    "": "t5 t6 t17 t24",
    "b.c.c": "t5 t6 t18 t21 t22 t23 t24 t26",
    "a.a.a.a.a": "t5 t6 t11 t12 t21 t22 t23 t24",
    "vodka.gin": "t5 t6 t8 t21 t22 t23 t24",
    "vodka.martini": "t5 t6 t8 t19 t21 t22 t23 t24",
    "b.b.c": "t5 t6 t10 t13 t18 t21 t22 t23 t24 t26",
    "nothing.here.at.all": "t5 t6 t21 t22 t23 t24",
    "oneword": "t5 t6 t21 t22 t23 t24 t25",
}
RABBIT_REMOVED = ("t1", "t5", "t11", "t19", "t21")
RABBIT_EXPECTED_AFTER_REMOVAL = {
    "a.b.c": "t2 t6 t10 t12 t18 t20 t22 t23 t24 t26",
    "a.b": "t3 t6 t7 t8 t9 t12 t15 t22 t23 t24 t26",
    "a.b.b": "t3 t6 t7 t12 t14 t18 t22 t23 t24 t26",
    "": "t6 t17 t24",
    "b.c.c": "t6 t18 t22 t23 t24 t26",
    "a.a.a.a.a": "t6 t12 t22 t23 t24",
    "vodka.gin": "t6 t8 t22 t23 t24",
    "vodka.martini": "t6 t8 t22 t23 t24",
    "b.b.c": "t6 t10 t13 t18 t22 t23 t24 t26",
    "nothing.here.at.all": "t6 t22 t23 t24",
    "oneword": "t6 t22 t23 t24 t25",
}


def test_rabbitmq_topic_suite() -> None:
    table: BindingTable[str] = BindingTable()
    for queue, pattern in RABBIT_BINDINGS.items():
        assert table.add("topic_x", MatchKind.TOPIC, pattern, queue)
    for key, expected in RABBIT_EXPECTED.items():
        assert table.route("topic_x", key) == set(expected.split()), key
        assert {q for q, p in RABBIT_BINDINGS.items() if topic_matches(p, key)} == set(
            expected.split()
        )

    for queue in RABBIT_REMOVED:
        assert table.remove("topic_x", MatchKind.TOPIC, RABBIT_BINDINGS[queue], queue)
    for key, expected in RABBIT_EXPECTED_AFTER_REMOVAL.items():
        assert table.route("topic_x", key) == set(expected.split()), key

    assert table.remove_source("topic_x") == len(RABBIT_BINDINGS) - len(RABBIT_REMOVED)
    for key in ("a.b.c", "b.b.c", ""):
        assert table.route("topic_x", key) == set()


def test_rabbitmq_direct_suite() -> None:
    table: BindingTable[str] = BindingTable()
    for queue, pattern in RABBIT_BINDINGS.items():
        table.add("direct_x", MatchKind.EXACT, pattern, queue)
    assert table.route("direct_x", "a.b.c") == {"t1", "t20"}
    assert table.route("direct_x", "") == {"t17"}
    assert table.route("direct_x", "#") == {"t5"}  # a literal key for a direct exchange
    assert table.route("direct_x", "nothing.here.at.all") == set()
