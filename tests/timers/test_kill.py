"""SIGKILL a process running timers at random moments, again and again: after the last restart
every timer ever scheduled is visible exactly once."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from core.timers import TimerService

from .conftest import assert_exactly_once, positions, scheduled_positions, wait_until
from .kill_child import DEST, TIMER_OPTIONS, open_store

CHILD = Path(__file__).with_name("kill_child.py")
KILLS = 4


def run_and_kill(data: Path, rounds: int, rng: random.Random) -> list[str]:
    """Start the child, let it work a random while, SIGKILL it; returns its recovery modes."""
    modes = []
    for round_number in range(rounds):
        child = subprocess.Popen(
            [sys.executable, str(CHILD), str(data), str(round_number)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        ready = child.stdout.readline().split()
        assert ready[:1] == ["ready"], ready
        modes.append(ready[1])
        time.sleep(rng.uniform(0.15, 0.5))
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()
    return modes


async def test_sigkill_loses_no_timer_and_fires_none_twice(tmp_path: Path):
    data = tmp_path / "data"
    modes = run_and_kill(data, KILLS, random.Random(11))
    assert modes[0] == "rebuild"  # a fresh directory
    assert set(modes[1:]) == {"checkpoint"}
    store = open_store(str(data))
    timers = TimerService(store, **TIMER_OPTIONS)  # type: ignore[arg-type]
    expected = scheduled_positions(store)
    assert len(expected) > 100
    assert 0 < len(positions(store, *DEST)) < len(expected)  # killed with some fired, some not
    await timers.start()
    await wait_until(lambda: timers.pending_count() == 0, 5, "every timer to fire")
    assert_exactly_once(store, DEST, expected)
    await timers.stop()
    store.close()
