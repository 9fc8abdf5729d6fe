"""Headers-exchange matching, with RabbitMQ's x-match rules."""

from __future__ import annotations

from typing import Any

import pytest

from core.routing import (
    BindingTable,
    HeadersMatcher,
    InvalidBindingArguments,
    MatchKind,
    XMatch,
    headers_match,
)
from core.routing.errors import AMQP_PRECONDITION_FAILED

# (binding arguments, message headers, matches?)
CASES: list[tuple[dict[str, Any], dict[str, Any] | None, bool]] = [
    # all (the default)
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "x"}, True),
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "x", "c": 3}, True),
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1}, False),
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "y"}, False),
    ({"a": 1, "b": "x"}, {"a": 1, "b": "x"}, True),  # x-match omitted: all
    ({"a": 1, "b": "x"}, {"a": 1}, False),
    ({"x-match": "all"}, {}, True),  # nothing to compare: matches everything
    ({"x-match": "all"}, None, True),
    ({}, {"anything": 1}, True),
    # any
    ({"x-match": "any", "a": 1, "b": "x"}, {"a": 1}, True),
    ({"x-match": "any", "a": 1, "b": "x"}, {"b": "x"}, True),
    ({"x-match": "any", "a": 1, "b": "x"}, {"a": 2, "b": "y"}, False),
    ({"x-match": "any", "a": 1, "b": "x"}, {}, False),
    ({"x-match": "any", "a": 1}, None, False),
    ({"x-match": "any"}, {"a": 1}, False),  # nothing to compare: matches nothing
    # void (None) binding values match presence only
    ({"x-match": "all", "a": None}, {"a": "whatever"}, True),
    ({"x-match": "all", "a": None}, {"a": None}, True),
    ({"x-match": "all", "a": None}, {"b": 1}, False),
    ({"x-match": "any", "a": None, "b": 1}, {"a": 0}, True),
    ({"x-match": "any", "a": None}, {}, False),
    ({"x-match": "all", "a": 1}, {"a": None}, False),  # a void header is not 1
    # x- keys are ignored by all/any ...
    ({"x-match": "all", "x-tenant": "t1", "a": 1}, {"a": 1}, True),
    ({"x-match": "all", "x-tenant": "t1", "a": 1}, {"a": 1, "x-tenant": "t2"}, True),
    ({"x-match": "any", "x-tenant": "t1"}, {"x-tenant": "t1"}, False),
    ({"x-match": "all", "x-tenant": "t1"}, {}, True),
    # ... and compared by all-with-x / any-with-x
    ({"x-match": "all-with-x", "x-tenant": "t1", "a": 1}, {"a": 1}, False),
    ({"x-match": "all-with-x", "x-tenant": "t1", "a": 1}, {"a": 1, "x-tenant": "t1"}, True),
    ({"x-match": "all-with-x", "x-tenant": "t1"}, {"x-tenant": "t2"}, False),
    ({"x-match": "any-with-x", "x-tenant": "t1", "a": 1}, {"x-tenant": "t1"}, True),
    ({"x-match": "any-with-x", "x-tenant": "t1"}, {"x-tenant": "t2"}, False),
    ({"x-match": "any-with-x", "x-tenant": None}, {"x-tenant": 0}, True),
    # x-match itself is never compared
    ({"x-match": "all-with-x"}, {"x-match": "any"}, True),
    ({"x-match": "any-with-x"}, {"x-match": "any-with-x"}, False),
    # value comparison as RabbitMQ compares Erlang terms
    ({"a": 1}, {"a": 1.0}, True),
    ({"a": True}, {"a": 1}, False),  # a boolean is not a number
    ({"a": 1}, {"a": True}, False),
    ({"a": False}, {"a": 0}, False),
    ({"a": True}, {"a": True}, True),
    ({"a": "abc"}, {"a": b"abc"}, True),  # longstr and byte array are both binaries
    ({"a": b"abc"}, {"a": "abc"}, True),
    ({"a": "é"}, {"a": "é".encode()}, True),
    ({"a": "abc"}, {"a": b"abd"}, False),
    ({"a": "1"}, {"a": 1}, False),
    ({"a": [1, 2]}, {"a": [1, 2]}, True),
    ({"a": {"n": 1}}, {"a": {"n": 1}}, True),
    # names are case-sensitive, and names the binding does not mention never matter
    ({"A": 1}, {"a": 1}, False),
]


@pytest.mark.parametrize(("arguments", "headers", "expected"), CASES)
def test_headers_matching(
    arguments: dict[str, Any], headers: dict[str, Any] | None, expected: bool
) -> None:
    assert headers_match(arguments, headers) is expected
    table: BindingTable[str] = BindingTable()
    table.add("h", MatchKind.HEADERS, "", "q", arguments)
    assert table.route("h", "ignored.routing.key", headers) == ({"q"} if expected else set())


@pytest.mark.parametrize("mode", ["all", "any", "all-with-x", "any-with-x", b"any"])
def test_valid_x_match(mode: str | bytes) -> None:
    matcher = HeadersMatcher({"x-match": mode})
    assert matcher.mode == XMatch(mode.decode() if isinstance(mode, bytes) else mode)


@pytest.mark.parametrize("mode", ["ALL", "some", "", 1, ["all"]])
def test_invalid_x_match_is_refused(mode: object) -> None:
    with pytest.raises(InvalidBindingArguments) as caught:
        HeadersMatcher({"x-match": mode, "a": 1})
    assert caught.value.amqp_reply_code == AMQP_PRECONDITION_FAILED
    table: BindingTable[str] = BindingTable()
    with pytest.raises(InvalidBindingArguments):
        table.add("h", MatchKind.HEADERS, "", "q", {"x-match": mode})
    assert len(table) == 0


def test_headers_bindings_with_other_arguments_are_other_bindings() -> None:
    table: BindingTable[str] = BindingTable()
    assert table.add("h", "headers", "", "q", {"x-match": "any", "a": 1})
    assert table.add("h", "headers", "", "q", {"x-match": "any", "b": 2})
    assert not table.add("h", "headers", "", "q", {"b": 2, "x-match": "any"})  # same table
    assert len(table) == 2
    assert table.route("h", "", {"a": 1}) == {"q"}
    assert table.route("h", "", {"b": 2}) == {"q"}
    assert table.remove("h", "headers", "", "q", {"x-match": "any", "a": 1})
    assert table.route("h", "", {"a": 1}) == set()
    assert table.route("h", "", {"b": 2}) == {"q"}
    assert not table.remove("h", "headers", "", "q", {"x-match": "any", "c": 3})


def test_binding_arguments_are_copied() -> None:
    arguments: dict[str, Any] = {"x-match": "all", "a": 1}
    table: BindingTable[str] = BindingTable()
    table.add("h", MatchKind.HEADERS, "", "q", arguments)
    arguments["a"] = 2  # the caller's dict changes; the binding does not
    assert table.route("h", "", {"a": 1}) == {"q"}
    assert table.bindings()[0].arguments == {"x-match": "all", "a": 1}
    with pytest.raises(TypeError):
        table.bindings()[0].arguments["a"] = 3  # type: ignore[index]
