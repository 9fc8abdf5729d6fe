"""Headers-exchange matching (AMQP 0-9-1 headers exchange, RabbitMQ 3.x semantics).

A headers binding is a table of arguments; ``x-match`` chooses how its other entries are
compared with a message's headers (``rabbit_exchange_type_headers``):

- ``all`` (the default when ``x-match`` is absent): every binding entry must be present in the
  headers with an equal value. A binding with no entries matches every message.
- ``any``: at least one binding entry must be present with an equal value. A binding with no
  entries matches nothing.
- For ``all`` and ``any``, binding entries whose name starts with ``x-`` are ignored;
  ``all-with-x`` and ``any-with-x`` (RabbitMQ 3.10+) compare them too. ``x-match`` itself is
  never compared. Header names that the binding does not mention never matter.
- A binding entry with no value (AMQP ``void``, ``None`` here) matches the header's presence,
  whatever its value.
- Values compare as RabbitMQ compares Erlang terms: ``1 == 1.0``; a boolean never equals a
  number (``True != 1``, unlike Python); a ``str`` equals the ``bytes`` of its UTF-8 encoding
  (both are binaries on the wire).
- Any other ``x-match`` value is refused at bind time (RabbitMQ's ``validate_binding``), with
  :class:`~core.routing.errors.InvalidBindingArguments`.

Headers bindings cannot be indexed by a trie: a publish checks each binding of its exchange in
turn, as RabbitMQ does. A compiled :class:`HeadersMatcher` is immutable and thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Final

from core.routing.errors import InvalidBindingArguments

X_MATCH: Final = "x-match"
X_PREFIX: Final = "x-"

_MISSING: Final = object()


class XMatch(StrEnum):
    """The values of the ``x-match`` binding argument."""

    ALL = "all"
    ANY = "any"
    ALL_WITH_X = "all-with-x"
    ANY_WITH_X = "any-with-x"


class HeadersMatcher:
    """One headers binding's arguments, compiled once at bind time."""

    __slots__ = ("_any", "_entries", "mode")

    def __init__(self, arguments: Mapping[str, object] | None) -> None:
        """Compile ``arguments``; raise ``InvalidBindingArguments`` for a bad ``x-match``."""
        arguments = arguments or {}
        self.mode = _parse_x_match(arguments.get(X_MATCH))
        self._any = self.mode in (XMatch.ANY, XMatch.ANY_WITH_X)
        with_x = self.mode in (XMatch.ALL_WITH_X, XMatch.ANY_WITH_X)
        self._entries: tuple[tuple[str, object], ...] = tuple(
            (name, value)
            for name, value in arguments.items()
            if name != X_MATCH and (with_x or not name.startswith(X_PREFIX))
        )

    def matches(self, headers: Mapping[str, object] | None) -> bool:
        """Whether a message with these ``headers`` (name -> value) matches the binding."""
        if headers is None:
            headers = {}
        if self._any:
            for name, expected in self._entries:
                actual = headers.get(name, _MISSING)
                if actual is not _MISSING and (expected is None or values_equal(expected, actual)):
                    return True
            return False
        for name, expected in self._entries:
            actual = headers.get(name, _MISSING)
            if actual is _MISSING or (expected is not None and not values_equal(expected, actual)):
                return False
        return True

    def __repr__(self) -> str:
        return f"HeadersMatcher(mode={self.mode.value!r}, entries={self._entries!r})"


def headers_match(
    arguments: Mapping[str, object] | None, headers: Mapping[str, object] | None
) -> bool:
    """One-off check of a binding's ``arguments`` against a message's ``headers``."""
    return HeadersMatcher(arguments).matches(headers)


def values_equal(expected: object, actual: object) -> bool:
    """Header value equality as RabbitMQ sees it (see the module docstring)."""
    if expected == actual:
        # Python says True == 1; an AMQP boolean is an Erlang atom and never equals a number.
        return isinstance(expected, bool) == isinstance(actual, bool)
    if isinstance(expected, str) and isinstance(actual, bytes | bytearray):
        return expected.encode("utf-8", "surrogatepass") == actual
    if isinstance(actual, str) and isinstance(expected, bytes | bytearray):
        return actual.encode("utf-8", "surrogatepass") == expected
    return False


def _parse_x_match(raw: object) -> XMatch:
    if raw is None:
        return XMatch.ALL  # RabbitMQ allows omitting it: "in practice it's useful"
    if isinstance(raw, bytes | bytearray):
        raw = bytes(raw).decode("utf-8", "replace")
    if isinstance(raw, str):
        try:
            return XMatch(raw)
        except ValueError:
            pass
    raise InvalidBindingArguments(
        raw, "x-match must be one of 'all', 'any', 'all-with-x' or 'any-with-x'"
    )
