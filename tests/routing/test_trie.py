"""The wildcard trie against the regex reference matchers, on random patterns and subjects."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.routing import BindingTable, MatchKind, WildcardTrie, mqtt_matches, topic_matches
from tests.routing.reference import amqp_reference, mqtt_reference

# Few distinct words, so random patterns and keys often meet; '' for empty words.
WORDS = st.sampled_from(["a", "b", "", "$x"])
AMQP_TOKENS = st.one_of(WORDS, st.sampled_from(["*", "#"]))

amqp_patterns = st.lists(AMQP_TOKENS, max_size=6).map(".".join)
amqp_keys = st.lists(WORDS, max_size=7).map(".".join)


@st.composite
def mqtt_filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(st.one_of(WORDS, st.just("+")), min_size=1, max_size=5))
    if draw(st.booleans()):
        levels.append("#")
    topic_filter = "/".join(levels)
    return topic_filter or "+"  # '' is not a valid filter


mqtt_topics = st.lists(WORDS, min_size=1, max_size=6).map("/".join).filter(bool)


@settings(max_examples=300)
@given(st.lists(amqp_patterns, min_size=1, max_size=25), st.lists(amqp_keys, max_size=10))
def test_amqp_trie_matches_reference(patterns: list[str], keys: list[str]) -> None:
    table: BindingTable[int] = BindingTable()
    for number, pattern in enumerate(patterns):
        table.add("x", MatchKind.TOPIC, pattern, number)
    for key in keys:
        expected = {n for n, p in enumerate(patterns) if amqp_reference(p, key)}
        assert table.route("x", key) == expected
        assert {n for n, p in enumerate(patterns) if topic_matches(p, key)} == expected


@settings(max_examples=300)
@given(st.lists(mqtt_filters(), min_size=1, max_size=25), st.lists(mqtt_topics, max_size=10))
def test_mqtt_trie_matches_reference(filters: list[str], topics: list[str]) -> None:
    table: BindingTable[int] = BindingTable()
    for number, topic_filter in enumerate(filters):
        table.add("t", MatchKind.MQTT, topic_filter, number)
    for topic in topics:
        expected = {n for n, f in enumerate(filters) if mqtt_reference(f, topic)}
        assert table.route("t", topic) == expected
        assert {n for n, f in enumerate(filters) if mqtt_matches(f, topic)} == expected


@settings(max_examples=200)
@given(
    st.lists(st.tuples(amqp_patterns, st.integers(0, 3)), min_size=1, max_size=30),
    st.data(),
)
def test_random_adds_and_removes_agree_with_a_model(
    bindings: list[tuple[str, int]], data: st.DataObject
) -> None:
    """Duplicates are counted; removing some leaves exactly the rest routed; nodes are pruned."""
    trie: WildcardTrie[int, str] = WildcardTrie("*", "#")
    for pattern, destination in bindings:
        trie.add(pattern.split(".") if pattern else [], destination)
    removed = data.draw(st.lists(st.sampled_from(range(len(bindings))), unique=True))
    for position in removed:
        pattern, destination = bindings[position]
        assert trie.remove(pattern.split(".") if pattern else [], destination)
    remaining = [b for i, b in enumerate(bindings) if i not in set(removed)]
    assert len(trie) == len(set(remaining))
    for key in data.draw(st.lists(amqp_keys, max_size=8)):
        words = key.split(".") if key else []
        assert trie.match(words) == {d for p, d in remaining if amqp_reference(p, key)}
    for pattern, destination in remaining:
        assert trie.remove(pattern.split(".") if pattern else [], destination)
    assert len(trie) == 0
    assert trie.node_count() == 1  # only the root is left


def test_removal_prunes_only_unused_nodes() -> None:
    trie: WildcardTrie[str, str] = WildcardTrie("+", "#", dollar_rule=True)
    trie.add(["a", "b", "c"], "s1")
    trie.add(["a", "+", "#"], "s2")
    trie.add(["a", "b"], "s3")
    assert trie.node_count() == 6  # root, a, b, c, +, #
    assert not trie.remove(["a", "b", "c"], "nobody")
    assert not trie.remove(["a", "x"], "s1")
    assert trie.remove(["a", "b", "c"], "s1")
    assert trie.node_count() == 5  # c is gone, b still holds s3
    assert trie.remove(["a", "+", "#"], "s2")
    assert trie.node_count() == 3
    assert trie.match(["a", "b"]) == {"s3"}
    assert trie.remove(["a", "b"], "s3")
    assert trie.node_count() == 1


def test_bindings_are_counted() -> None:
    trie: WildcardTrie[str, str] = WildcardTrie("*", "#")
    trie.add(["a", "*"], "q")
    trie.add(["a", "*"], "q")
    trie.add(["a", "*"], "q", group="g")
    assert len(trie) == 2
    assert trie.remove(["a", "*"], "q")
    assert trie.match(["a", "b"]) == {"q"}
    assert trie.remove(["a", "*"], "q")
    assert trie.match(["a", "b"]) == set()
    found: set[str] = set()
    groups: dict[str, set[str]] = {}
    trie.collect(["a", "b"], found, groups)
    assert (found, groups) == (set(), {"g": {"q"}})
    assert not trie.remove(["a", "*"], "q", group="other")
    assert trie.remove(["a", "*"], "q", group="g")
    assert trie.node_count() == 1


def test_many_multi_word_wildcards_stay_polynomial() -> None:
    """'#.#.#...' against a long key would take exponential time without visited states."""
    trie: WildcardTrie[str, str] = WildcardTrie("*", "#")
    trie.add(["#"] * 12 + ["z"], "q")
    trie.add(["#", "a"] * 6 + ["#"], "r")
    assert trie.match(["a"] * 60) == {"r"}
    assert trie.match(["a"] * 60 + ["z"]) == {"q", "r"}
    assert topic_matches("#." * 12 + "z", "a." * 60 + "z")


def test_unrelated_bindings_leave_the_walk_alone() -> None:
    """100,000 non-matching patterns under one prefix: the match is still exact."""
    table: BindingTable[int] = BindingTable()
    for number in range(100_000):
        table.add("s", MatchKind.MQTT, f"sensors/{number}/+/temp", number)
    table.add("s", MatchKind.MQTT, "sensors/#", -1)
    assert table.route("s", "sensors/4242/room/temp") == {4242, -1}
    assert table.route("s", "sensors/4242/room") == {-1}
    assert table.route("s", "sensors") == {-1}
    assert table.route("s", "$sensors/1/x/temp") == set()
