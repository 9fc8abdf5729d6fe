"""Straightforward reference matchers, built on regular expressions, to check the trie against.

A subject of words ``w1..wn`` is written as ``<sep>w1<sep>w2...<sep>wn`` (the empty AMQP key is
the empty string), so every word, empty ones too, is "a separator and then no separators", and a
pattern translates word by word: a literal to itself, the one-word wildcard to one such word,
the multi-word wildcard to any number of them.
"""

from __future__ import annotations

import re
from functools import lru_cache


def _compile(words: list[str], sep: str, one: str, many: str) -> re.Pattern[str]:
    word = f"{re.escape(sep)}[^{re.escape(sep)}]*"
    parts = []
    for token in words:
        if token == one:
            parts.append(word)
        elif token == many:
            parts.append(f"(?:{word})*")
        else:
            parts.append(re.escape(sep + token))
    return re.compile("".join(parts), re.DOTALL)


@lru_cache(maxsize=4096)
def _amqp_regex(pattern: str) -> re.Pattern[str]:
    return _compile(pattern.split(".") if pattern else [], ".", "*", "#")


def amqp_reference(pattern: str, key: str) -> bool:
    """RabbitMQ topic matching: '' is zero words, '*' one word, '#' zero or more."""
    subject = "".join("." + w for w in key.split(".")) if key else ""
    return _amqp_regex(pattern).fullmatch(subject) is not None


@lru_cache(maxsize=4096)
def _mqtt_regex(topic_filter: str) -> re.Pattern[str]:
    return _compile(topic_filter.split("/"), "/", "+", "#")


def mqtt_reference(topic_filter: str, topic: str) -> bool:
    """MQTT matching, including [MQTT-4.7.2-1] for topics starting with '$'."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    subject = "".join("/" + level for level in topic.split("/"))
    return _mqtt_regex(topic_filter).fullmatch(subject) is not None
