"""The live router (core/routing/live.py): MQTT filters -> subscribers by full topic name."""

from __future__ import annotations

from core.routing.live import LiveRouter
from core.routing.mqtt_topic import filter_levels_match, mqtt_matches


def test_match_add_remove_and_the_dollar_rule() -> None:
    router: LiveRouter[str] = LiveRouter()
    router.add("a/+/c", "one")
    router.add("#", "all")
    router.add("a/#", "under-a")
    assert set(router.match("a/b/c")) == {"one", "all", "under-a"}
    assert set(router.match("a")) == {"all", "under-a"}  # '#' matches the parent level
    assert router.match("$SYS/x") == ()  # [MQTT-4.7.2-1]
    assert router.count == 3
    assert router.remove("#", "all")
    assert not router.remove("#", "all")
    assert set(router.match("a/b/c")) == {"one", "under-a"}  # the cache was cleared
    assert router.count == 2


def test_wants_only_the_log_topics_of_its_filters() -> None:
    router: LiveRouter[str] = LiveRouter()
    assert not router.wants("a")
    router.add("a/b", "x")
    router.add("/b", "y")  # an empty first level is the log topic "/"
    assert router.wants("a")
    assert router.wants("/")
    assert not router.wants("b")
    router.add("+/b", "z")  # a wildcard first level wants every topic
    assert router.wants("b")
    router.remove("+/b", "z")
    router.remove("a/b", "x")
    assert not router.wants("a")
    assert router.wants("/")


def test_filter_levels_match_agrees_with_mqtt_matches() -> None:
    filters = ["a/b", "a/+", "a/#", "#", "+/+", "+", "/+", "a/+/#", "$SYS/#"]
    topics = ["a", "a/b", "a/b/c", "/", "/x", "b", "$SYS/load", "a/"]
    for topic_filter in filters:
        for topic in topics:
            expected = mqtt_matches(topic_filter, topic)
            assert filter_levels_match(topic_filter.split("/"), topic) == expected
