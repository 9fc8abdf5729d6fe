"""Run a coroutine's first step at once, in the caller's frame, and keep the rest for a task.

Most broker calls complete without suspending (a publish that is not flow-blocked and does not
wait for the disk; a durability wait already covered by the last fsync). Starting them eagerly
keeps a connection's frames in order and spares a task per message; only a call that really
suspends gets a task, and the connection waits for it before the next frame (the same device as
the Kafka gateway's handlers; Python 3.12's eager task factory does this for whole tasks).
"""

from __future__ import annotations

import types
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["run_eagerly"]


@types.coroutine
def _continue(coro: Coroutine[Any, Any, T], suspended_on: Any) -> Generator[Any, Any, T]:
    """The rest of ``coro`` after its first step suspended on ``suspended_on``: what
    ``yield from`` does, resumed by whoever awaits this (values and exceptions passed on)."""
    while True:
        try:
            sent = yield suspended_on
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:
            try:
                suspended_on = coro.throw(exc)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
        else:
            try:
                suspended_on = coro.send(sent)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]


async def _finish(coro: Coroutine[Any, Any, T], suspended_on: Any) -> T:
    return await _continue(coro, suspended_on)


def run_eagerly(coro: Coroutine[Any, Any, T]) -> tuple[T | None, Coroutine[Any, Any, T] | None]:
    """``(result, None)`` if ``coro`` finished in its first step, else ``(None, rest)`` where
    ``rest`` is a coroutine to await for the result. Exceptions of the first step propagate."""
    try:
        suspended_on = coro.send(None)
    except StopIteration as stop:
        return stop.value, None
    return None, _finish(coro, suspended_on)
