"""What the transport tests share: a client socket that takes little, and polling with a
deadline (never a timing assert: a condition that does not come within it fails the test)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest

DEADLINE_S = 30.0  # generous: an event that does not come within this fails the test


def small_window_socket(address: tuple[str, int]) -> socket.socket:
    """A client socket with a small receive buffer (set before connecting: shrinking the
    window of an open connection stalls it), so little of what the server sends fits."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(address)
    return sock


async def until(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` until true; fail after DEADLINE_S."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not condition():
        if loop.time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.001)
