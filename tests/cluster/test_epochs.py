"""core/cluster/epochs.py on real files: O_EXCL claims raced by two processes, the fence check
an owner makes before acknowledging, the clean-close marker and sealed segment bounds
(docs/cluster.md section 5.2-5.4)."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from core.cluster.epochs import (
    EpochClaim,
    EpochTaken,
    claim_epoch,
    epoch_path,
    epochs,
    highest_epoch,
    is_fenced,
    mark_closed,
    read_claim,
    sealed_bounds,
    was_closed,
)

RACE_ROUNDS = 40
STEP_TIMEOUT_S = 30.0


def claim(node: str, *, start: int = 0, sealed: dict[int, int] | None = None) -> EpochClaim:
    return EpochClaim(
        node=node, incarnation=7, claimed_ms=1_700_000_000_000, start=start, sealed=sealed or {}
    )


def racer(shard_dir: str, node: str, barrier, results) -> None:
    """One of two processes: at each round both pass the barrier and claim the same epoch."""
    won = []
    for epoch in range(RACE_ROUNDS):
        barrier.wait(STEP_TIMEOUT_S)
        try:
            claim_epoch(Path(shard_dir), epoch, claim(node))
        except EpochTaken:
            continue
        won.append(epoch)
    results.put((node, won))


def test_two_processes_racing_for_an_epoch_one_wins(tmp_path):
    shard = tmp_path / "shards" / "0003"
    shard.mkdir(parents=True)
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    results = context.Queue()
    processes = [
        context.Process(target=racer, args=(str(shard), node, barrier, results))
        for node in ("a", "b")
    ]
    for process in processes:
        process.start()
    try:
        won = dict(results.get(timeout=STEP_TIMEOUT_S * 2) for _ in processes)
    finally:
        for process in processes:
            process.join(STEP_TIMEOUT_S)
    assert [process.exitcode for process in processes] == [0, 0]
    for epoch in range(RACE_ROUNDS):
        winners = [node for node, epochs_won in won.items() if epoch in epochs_won]
        assert len(winners) == 1, (epoch, won)
        # The file is the winner's, written whole.
        assert read_claim(shard, epoch) == claim(winners[0])
    assert epochs(shard) == list(range(RACE_ROUNDS))
    assert highest_epoch(shard) == RACE_ROUNDS - 1


def test_a_second_claim_of_an_epoch_is_refused_and_leaves_the_first(tmp_path):
    path = claim_epoch(tmp_path, 5, claim("1", start=4096, sealed={0: 1000}))
    assert path == epoch_path(tmp_path, 5) == tmp_path / "epochs" / "00000000000000000005"
    with pytest.raises(EpochTaken, match=r"epoch 5 .* already claimed") as taken:
        claim_epoch(tmp_path, 5, claim("2"))
    assert taken.value.epoch == 5
    assert json.loads(path.read_bytes()) == {
        "node": "1",
        "incarnation": 7,
        "claimed_ms": 1_700_000_000_000,
        "start": 4096,
        "sealed": {"0": 1000},
    }


def test_highest_epoch_of_a_shard_never_claimed(tmp_path):
    assert highest_epoch(tmp_path) is None
    assert epochs(tmp_path) == []
    claim_epoch(tmp_path, 3, claim("1"))
    claim_epoch(tmp_path, 12, claim("2"))
    mark_closed(tmp_path, 12)
    (tmp_path / "epochs" / "00000000000000000013.tmp").write_text("")  # not an epoch
    assert epochs(tmp_path) == [3, 12]
    assert highest_epoch(tmp_path) == 12


def test_the_owner_is_fenced_once_the_next_epoch_exists(tmp_path):
    claim_epoch(tmp_path, 1, claim("1"))
    assert not is_fenced(tmp_path, 1)
    claim_epoch(tmp_path, 2, claim("2"))
    assert is_fenced(tmp_path, 1)
    assert not is_fenced(tmp_path, 2)


def test_a_torn_claim_still_fences_but_says_nothing(tmp_path):
    """A claimer that died between the create and the fsync: the file exists (it fences the
    old owner), but it never opened the shard, so its content is ignored."""
    claim_epoch(tmp_path, 1, claim("1", sealed={0: 500}))
    torn = epoch_path(tmp_path, 2)
    fd = os.open(torn, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    os.write(fd, b'{"node": "2", "inc')
    os.close(fd)
    assert is_fenced(tmp_path, 1)
    assert read_claim(tmp_path, 2) is None
    assert sealed_bounds(tmp_path) == {0: 500}
    with pytest.raises(EpochTaken):
        claim_epoch(tmp_path, 2, claim("3"))


def test_the_closed_marker(tmp_path):
    claim_epoch(tmp_path, 4, claim("1"))
    assert not was_closed(tmp_path, 4)
    mark_closed(tmp_path, 4)
    assert was_closed(tmp_path, 4)
    mark_closed(tmp_path, 4)  # idempotent: a second clean stop of the same epoch
    assert was_closed(tmp_path, 4)
    assert not was_closed(tmp_path, 3)
    assert not is_fenced(tmp_path, 4)  # a clean close is no claim: nobody is fenced by it


def test_sealed_bounds_merge_every_epoch_keeping_the_first_seal(tmp_path):
    segment = 64 * 1024
    claim_epoch(tmp_path, 1, claim("1"))
    claim_epoch(tmp_path, 2, claim("2", start=segment, sealed={0: 900}))
    claim_epoch(tmp_path, 3, claim("3", start=3 * segment, sealed={2 * segment: 2 * segment + 40}))
    # A later epoch that names segment 0 again with a larger end does not widen it: bytes past
    # the first seal came from a fenced owner.
    claim_epoch(tmp_path, 4, claim("1", start=3 * segment + 10, sealed={0: 5000}))
    assert sealed_bounds(tmp_path) == {0: 900, 2 * segment: 2 * segment + 40}


def test_a_negative_epoch_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not negative"):
        claim_epoch(tmp_path, -1, claim("1"))
