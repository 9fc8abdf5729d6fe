"""Build kio response entities of any version from one version-independent description.

Kafka response schemas grow field by field over versions (``throttle_time`` from v1,
``log_start_offset`` from v5, ...), and kio generates one frozen dataclass per version. The
handlers describe a response once, as nested mappings holding every field any version has,
and ``build(cls, values)`` keeps the fields ``cls`` declares, converts them to kio's types and
fills the missing ones with their schema default. One handler serves every version::

    build(response_class(ApiKey.HEARTBEAT, request.api_version),
          {"throttle_time": 0, "error_code": 27})

Conversions (by the field's ``kafka_type``): ``timedelta_i32``/``timedelta_i64`` take
milliseconds (int), ``datetime_i64`` milliseconds since the epoch (negative: null),
``error_code`` any int (kio writes ``ErrorCode.value``), nested entities and arrays of them
take mappings and sequences of mappings. Everything else is passed through: kio's integer and
string types are plain ``int``/``str`` at run time.

A missing field takes the dataclass default when the schema has one, else the zero of its
type: ``None`` when nullable, ``()`` for arrays, ``0``, ``""``, ``b""``, ``False``, error
``NONE``, an entity built from nothing. ``None`` given for a field the version cannot null
becomes that zero too. Pure functions; plans are cached per class.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

_MISSING: Final = dataclasses.MISSING
_UTC: Final = datetime.UTC
_EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=_UTC)
E = TypeVar("E")

# Field kinds of a build plan.
_PLAIN: Final = 0
_ENTITY: Final = 1
_ENTITY_ARRAY: Final = 2
_CONVERTED: Final = 3
_CONVERTED_ARRAY: Final = 4

_ZEROS: Final[dict[str, object]] = {
    "bool": False,
    "int8": 0,
    "int16": 0,
    "int32": 0,
    "int64": 0,
    "uint8": 0,
    "uint16": 0,
    "uint32": 0,
    "uint64": 0,
    "float64": 0.0,
    "string": "",
    "bytes": b"",
    "records": b"",
    "error_code": ErrorCode.none,
    "timedelta_i32": datetime.timedelta(0),
    "timedelta_i64": datetime.timedelta(0),
}


def _timedelta(value: Any) -> Any:
    if isinstance(value, datetime.timedelta):
        return value
    return datetime.timedelta(milliseconds=value)


def _datetime(value: Any) -> Any:
    if value is None or isinstance(value, datetime.datetime):
        return value
    if value < 0:
        return None
    return _EPOCH + datetime.timedelta(milliseconds=value)


def _error_code(value: Any) -> Any:
    return value if type(value) is ErrorCode else ErrorCode(int(value))


_CONVERTERS: Final[dict[str, Callable[[Any], Any]]] = {
    "timedelta_i32": _timedelta,
    "timedelta_i64": _timedelta,
    "datetime_i64": _datetime,
    "error_code": _error_code,
}


def _unwrap(hint: Any) -> tuple[Any, bool, bool]:
    """(inner type, is array, is nullable) of a field's type hint."""
    nullable = False
    array = False
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        nullable = True
        hint = args[0]
    if typing.get_origin(hint) is tuple:
        array = True
        hint = typing.get_args(hint)[0]
        if isinstance(hint, types.UnionType):
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return hint, array, nullable


# (name, kind, entity class or converter, default, zero for None in a non-nullable field)
_Plan = list[tuple[str, int, Any, Any, Any]]


@functools.cache
def _plan(cls: type) -> _Plan:
    hints = typing.get_type_hints(cls)
    plan: _Plan = []
    for field in dataclasses.fields(cls):
        inner, array, nullable = _unwrap(hints[field.name])
        kafka_type = field.metadata.get("kafka_type")
        default: Any
        if field.default is not _MISSING:
            default = field.default
        elif nullable:
            default = None
        elif array:
            default = ()
        elif dataclasses.is_dataclass(inner):
            default = _MISSING  # built from an empty mapping on use
        else:
            default = _ZEROS.get(str(kafka_type), None)
        if nullable:
            zero: Any = None
        elif array:
            zero = ()
        elif dataclasses.is_dataclass(inner):
            zero = _MISSING  # an entity built from an empty mapping
        else:
            zero = _ZEROS.get(str(kafka_type))
        if dataclasses.is_dataclass(inner):
            plan.append((field.name, _ENTITY_ARRAY if array else _ENTITY, inner, default, zero))
        elif kafka_type in _CONVERTERS:
            kind = _CONVERTED_ARRAY if array else _CONVERTED
            plan.append((field.name, kind, _CONVERTERS[str(kafka_type)], default, zero))
        else:
            plan.append((field.name, _PLAIN, None, default, zero))
    return plan


def build(cls: type[E], values: Mapping[str, Any]) -> E:
    """An instance of the kio entity ``cls`` from ``values`` (see the module docstring)."""
    kwargs: dict[str, Any] = {}
    for name, kind, helper, default, zero in _plan(cls):  # type: ignore[arg-type]
        value = values.get(name, _MISSING)
        if value is None and zero is not None:
            # None for a field this version cannot null (a string that became nullable in a
            # later version): its zero, as Kafka writes "" there.
            value = build(helper, {}) if zero is _MISSING else zero
        elif value is _MISSING:
            value = build(helper, {}) if default is _MISSING else default
        elif value is None:
            pass
        elif kind == _PLAIN:
            if type(value) is list:
                value = tuple(value)
        elif kind == _CONVERTED:
            value = helper(value)
        elif kind == _ENTITY_ARRAY:
            value = tuple([build(helper, item) for item in value])
        elif kind == _ENTITY:
            value = build(helper, value)
        else:  # _CONVERTED_ARRAY
            value = tuple([helper(item) for item in value])
        kwargs[name] = value
    return cls(**kwargs)


@functools.cache
def response_class(api_key: int, api_version: int) -> type[Any]:
    """The kio response entity of ``(api_key, api_version)``."""
    return load_response_schema(api_key, api_version)


def build_response(api_key: int, api_version: int, values: Mapping[str, Any]) -> Any:
    """``build`` of the response entity of ``(api_key, api_version)``."""
    return build(response_class(api_key, api_version), values)
