"""AMQP 0-9-1 routing keys and topic-exchange binding patterns (RabbitMQ semantics).

Rules, as RabbitMQ implements them (``rabbit_db_topic_exchange:split_topic_key/1``, ``trie_match``):

- A routing key or binding key is a list of words separated by ``.``. The empty string is the
  empty list (zero words); otherwise every ``.`` separates two words, so ``"a..b"`` is
  ``["a", "", "b"]``, ``"a."`` is ``["a", ""]`` and ``"."`` is ``["", ""]``. Empty words are
  ordinary words.
- In a binding key, a word that is exactly ``*`` matches exactly one word (the empty word too);
  a word that is exactly ``#`` matches zero or more words. ``*`` or ``#`` inside a longer word
  (``a*``, ``#b``) is a literal. ``#`` can stand anywhere and more than once (``a.#.b``, ``#.#``).
- Consequences: ``#`` matches every key, the empty key included; ``*`` never matches the empty
  key; ``a.#`` matches ``a``; the binding key ``""`` matches only the routing key ``""``.
- No normalisation: matching is by exact string comparison of words.

Routing many bindings at once goes through :class:`core.routing.trie.WildcardTrie`; the function
:func:`topic_matches` below checks one pattern and is what tests and admin tools use.
Pure functions, no state: thread-safe.
"""

from __future__ import annotations

WORD_SEPARATOR = "."
ONE_WORD = "*"  # matches exactly one word
ANY_WORDS = "#"  # matches zero or more words


def split_routing_key(key: str) -> list[str]:
    """Split a routing or binding key into words; ``""`` is zero words (RabbitMQ's rule)."""
    return key.split(WORD_SEPARATOR) if key else []


def direct_matches(binding_key: str, routing_key: str) -> bool:
    """Direct exchange: the routing key equals the binding key, byte for byte."""
    return binding_key == routing_key


def topic_matches(pattern: str, routing_key: str) -> bool:
    """Whether the topic-exchange binding key ``pattern`` matches ``routing_key``.

    Runs the pattern as a nondeterministic automaton over the key's words (states are positions
    in the pattern), so it is linear in ``len(words) * len(pattern)`` whatever the ``#`` count.
    """
    pattern_words = split_routing_key(pattern)
    size = len(pattern_words)
    states = _skip_any_words(pattern_words, {0})
    for word in split_routing_key(routing_key):
        following: set[int] = set()
        for position in states:
            if position == size:
                continue
            token = pattern_words[position]
            if token == ANY_WORDS:
                following.add(position)  # '#' swallows this word and may swallow more
            elif token in (ONE_WORD, word):
                following.add(position + 1)
        if not following:
            return False
        states = _skip_any_words(pattern_words, following)
    return size in states


def _skip_any_words(pattern_words: list[str], states: set[int]) -> set[int]:
    """Close ``states`` under "a ``#`` may match zero words": step over every ``#`` reached."""
    closed = set(states)
    pending = list(states)
    while pending:
        position = pending.pop()
        if position < len(pattern_words) and pattern_words[position] == ANY_WORDS:
            after = position + 1
            if after not in closed:
                closed.add(after)
                pending.append(after)
    return closed
