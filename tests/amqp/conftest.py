"""Fixtures of the AMQP front-end tests.

End-to-end tests drive the real clients (aio-pika, pika, kombu) against a real ``braid serve``
subprocess with only the AMQP listener on: ``braid`` is one per test module (tests use their own
exchange and queue names), ``fresh_braid`` one per test for restarts.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.braid_process import BraidProcess

_names = itertools.count()


def unique(prefix: str) -> str:
    """An exchange or queue name no other test of the session uses."""
    return f"{prefix}-{os.getpid()}-{next(_names)}"


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    with BraidProcess(tmp_path_factory.mktemp("braid"), listeners=("amqp",)) as process:
        yield process


@pytest.fixture
def fresh_braid(tmp_path: Path) -> Iterator[BraidProcess]:
    with BraidProcess(tmp_path, listeners=("amqp",)) as process:
        yield process
