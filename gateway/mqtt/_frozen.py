"""Fast construction of frozen, slotted dataclasses, for the decoder's hot path.

A frozen dataclass's generated ``__init__`` stores every field through ``object.__setattr__``
(it has to get past the ``__setattr__`` that raises ``FrozenInstanceError``): about 1.5 µs for a
7-field PUBLISH, more than all the parsing around it. The decoder instead fills a *twin* class
that has the same ``__slots__`` but no frozen ``__setattr__`` (plain slot stores, specialised by
the interpreter), then assigns ``__class__``: CPython allows that between classes with the same
slot layout, and the object is from then on an ordinary, frozen instance of the dataclass. It
compares, hashes and refuses assignment like one built by ``__init__``.

Used only for instances the codec builds from bytes; no validation is skipped, since the
dataclasses have no ``__post_init__`` (``frozen_builder`` refuses classes that do).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def twin_class(cls: type[Any]) -> type[Any]:
    """A mutable class with the same slot layout as the frozen slotted dataclass ``cls``."""
    slots = cls.__dict__.get("__slots__")
    if slots is None or "__dict__" in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not a slotted class")
    return type(f"_{cls.__name__}Twin", (), {"__slots__": slots, "__module__": cls.__module__})


def frozen_builder(cls: type[T]) -> Callable[..., T]:
    """A function with ``cls.__init__``'s signature that builds instances without ``__init__``.

    Generated source, like ``dataclasses`` generates ``__init__``::

        def build(topic, payload, qos=_default_qos, ...):
            obj = _Twin()
            obj.topic = topic
            ...
            obj.__class__ = _Frozen
            return obj
    """
    if not dataclasses.is_dataclass(cls) or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} must be a dataclass without __post_init__")
    namespace: dict[str, Any] = {"_Twin": twin_class(cls), "_Frozen": cls}
    params: list[str] = []
    lines = ["    obj = _Twin()"]
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING:
            namespace[f"_default_{field.name}"] = field.default
            params.append(f"{field.name}=_default_{field.name}")
        elif field.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{field.name}: default factories are not supported")
        else:
            params.append(field.name)
        lines.append(f"    obj.{field.name} = {field.name}")
    lines += ["    obj.__class__ = _Frozen", "    return obj"]
    source = f"def build({', '.join(params)}):\n" + "\n".join(lines) + "\n"
    exec(source, namespace)
    build: Callable[..., T] = namespace["build"]
    build.__qualname__ = build.__name__ = f"build_{cls.__name__}"
    return build
