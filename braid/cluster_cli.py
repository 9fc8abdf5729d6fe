"""``braid cluster init ROOT [--shards N] [--adopt]``, ``braid cluster check ROOT`` and
``braid cluster status [--cluster URL] [ROOT] [--json]``.

``init`` makes a cluster's data root (core/cluster/layout.py; docs/cluster.md section 2), or with
``--adopt`` turns a stopped single-node data directory into one whose shard 0 holds its files.
It holds the directory's lock (the ``flock`` a running ``braid serve`` holds, braid/server.py)
while it runs, so a broker cannot start on the directory half-way.

``check`` tests what fencing by epoch files needs of the filesystem under ROOT (section 5.3),
with two processes: that ``O_CREAT|O_EXCL`` lets exactly one of two racing creators through,
and that a file one process created and fsynced is seen by the other's next ``stat`` (also
right after that process saw it absent: an NFS client's cached negative lookup fails this).
It uses the epoch-file functions the nodes use (core/cluster/epochs.py) in a scratch directory
it removes afterwards.

``status`` reads the cluster's Redis (section 9): the live nodes (addresses, lease left,
incarnation), every shard's owner, epoch and since when, and the shards nobody serves. It only
reads: a Redis that does not hold the cluster is reported, not given one.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import multiprocessing
import os
import shutil
import sys
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any, TextIO

from braid.dirlock import DirectoryLocked, lock_directory
from core.cluster import epochs, layout
from core.cluster.epochs import EpochClaim, EpochTaken

EXIT_FAILED = 1  # a check failed, the directory is in use, an I/O error
EXIT_REFUSED = 2  # the directory is not what the command needs (as `braid log`: not a log)
DEFAULT_CHECK_ROUNDS = 100
# How long one process waits for the other at a step of a check: generous, a slow NFS server
# answers in well under this, and a dead partner must not hang the command.
CHECK_STEP_TIMEOUT_S = 30.0
CHECK_DIR_PREFIX = ".braid-check-"
# Where `braid serve --workers N` puts its private Redis's socket (docs/cluster.md section 9).
SUPERVISOR_SOCKET = "run/redis.sock"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}")
    return value


def build_cluster_parser(commands: Any) -> None:
    """``braid cluster ...`` under the top-level subparsers ``commands``."""
    cluster = commands.add_parser(
        "cluster",
        help="make and check a cluster's data root",
        description="Make a cluster's data root, or check its filesystem (docs/cluster.md).",
    )
    cluster_commands = cluster.add_subparsers(
        dest="cluster_command", metavar="COMMAND", required=True
    )
    init = cluster_commands.add_parser(
        "init",
        help="make a data root (cluster.json, shards/NNNN), or adopt a single-node directory",
        description=(
            "Make ROOT a cluster's data root: cluster.json and one directory per shard. ROOT "
            "must be absent or empty; with --adopt it must be a stopped single-node data "
            "directory, whose files move (by rename) into shards/0000. Running it again after "
            "an interruption finishes the job."
        ),
    )
    init.add_argument("root", metavar="ROOT")
    init.add_argument(
        "--shards",
        type=_positive,
        metavar="N",
        help=f"number of shards, fixed for good (default: {layout.DEFAULT_SHARDS})",
    )
    init.add_argument(
        "--adopt",
        action="store_true",
        help="ROOT is a single-node data directory: make it shard 0 of the new root",
    )
    check = cluster_commands.add_parser(
        "check",
        help="check that ROOT's filesystem can fence shard owners (O_EXCL, stat visibility)",
        description=(
            "Check, with two processes, what fencing by epoch files needs of the filesystem "
            "under ROOT: O_CREAT|O_EXCL lets exactly one racing creator through, and a file "
            "created and fsynced by one process is seen by the other's next stat. Prints OK or "
            "FAIL per check; exit 1 if any failed."
        ),
    )
    check.add_argument("root", metavar="ROOT")
    check.add_argument(
        "--rounds",
        type=_positive,
        default=DEFAULT_CHECK_ROUNDS,
        metavar="N",
        help=f"rounds of each check (default: {DEFAULT_CHECK_ROUNDS})",
    )

    status = cluster_commands.add_parser(
        "status",
        help="show a cluster's nodes, shard owners and epochs, and unowned shards",
        description=(
            "Show what the cluster's Redis says: the live nodes (addresses, lease left, "
            "incarnation), each shard's owner, epoch and since when, and the shards nobody "
            "serves. ROOT (a data root) names the cluster by its cluster.json; without ROOT "
            "the Redis must hold exactly one cluster. Without --cluster: the supervisor's "
            f"Redis, unix://ROOT/{SUPERVISOR_SOCKET}."
        ),
    )
    status.add_argument("root", metavar="ROOT", nargs="?")
    status.add_argument(
        "--cluster",
        metavar="URL",
        help="the cluster's Redis: redis://, rediss://, unix:// or redis+sentinel://",
    )
    status.add_argument("--json", action="store_true", help="one JSON object")

    drain = cluster_commands.add_parser(
        "drain",
        help="move a node's shards to the other nodes; it stays up owning nothing (a standby)",
        description=(
            "Ask node NODE to hand its shards over (core/cluster/drain.py): it closes them "
            "cleanly and releases them, the other nodes take them over (they need [cluster] "
            "takeover on), and it stays up as a standby until stopped: a rolling restart "
            "stops it then. Waits until no shard is the node's; prints where each went. "
            "ROOT and --cluster as for status."
        ),
    )
    drain.add_argument("node", metavar="NODE")
    drain.add_argument("root", metavar="ROOT", nargs="?")
    drain.add_argument(
        "--cluster",
        metavar="URL",
        help="the cluster's Redis: redis://, rediss://, unix:// or redis+sentinel://",
    )
    drain.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=_positive,
        default=60,
        help="how long to wait for the handover (default 60)",
    )


def run(args: argparse.Namespace) -> int:
    if args.cluster_command == "init":
        return init(Path(args.root), shards=args.shards, adopting=args.adopt)
    if args.cluster_command == "status":
        root = Path(args.root) if args.root is not None else None
        return status(root, url=args.cluster, as_json=args.json)
    if args.cluster_command == "drain":
        root = Path(args.root) if args.root is not None else None
        return drain(args.node, root, url=args.cluster, timeout_s=args.timeout)
    return check(Path(args.root), rounds=args.rounds)


# -- init --------------------------------------------------------------------------------------


class DirectoryInUse(Exception):
    pass


@contextmanager
def _directory_lock(directory: Path) -> Iterator[None]:
    """Refuse a directory a broker runs on (braid/logtool.py's probe of its flock, which names
    the broker's pid), then hold the same exclusive flock until the block ends, so no broker
    starts on it meanwhile."""
    from braid.logtool import _broker_pid

    pid = _broker_pid(directory)
    if pid is not None:
        raise DirectoryInUse(
            f"{directory} is in use by a running broker (pid {pid}): stop it first"
        )
    try:
        fd = lock_directory(directory)
    except DirectoryLocked:
        raise DirectoryInUse(f"{directory} is in use by another braid process") from None
    try:
        yield
    finally:
        os.close(fd)  # releases the flock


def init(root: Path, *, shards: int | None, adopting: bool, out: TextIO | None = None) -> int:
    name = "braid cluster init"
    out = out or sys.stdout
    existed = (root / layout.CLUSTER_FILE).exists()
    try:
        if not adopting:
            root.mkdir(parents=True, exist_ok=True)  # the lock is on the directory itself
        elif not root.is_dir():
            raise layout.LayoutError(f"{root} is not a directory: nothing to adopt")
        with _directory_lock(root):
            done = layout.adopt(root, shards) if adopting else layout.init(root, shards)
    except layout.LayoutError as error:
        print(f"{name}: error: {error}", file=sys.stderr)
        return EXIT_REFUSED
    except (DirectoryInUse, OSError) as error:
        print(f"{name}: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    legacy = (
        f", shard {done.legacy_shard} holds the adopted single-node data"
        if done.legacy_shard is not None
        else ""
    )
    print(
        f"{'already a ' if existed else ''}cluster root {root}: {done.shards} shards in "
        f"{root / layout.SHARDS_DIR}{legacy} "
        f"(cluster id {done.cluster_id})",
        file=out,
    )
    return 0


# -- check -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'OK  ' if self.ok else 'FAIL'} {self.name}: {self.detail}"


def race_verdict(
    rounds: int, wins: Sequence[Sequence[int]], owners: Sequence[str | None]
) -> Verdict:
    """Each process's won rounds (``wins[i]``: the epochs process ``i`` created) and the node
    each epoch file names (``owners[epoch]``, None if unreadable): each round exactly one
    winner, and the file says it is that one's."""
    failures: list[str] = []
    for epoch in range(rounds):
        winners = [str(index) for index, won in enumerate(wins) if epoch in won]
        if len(winners) != 1:
            failures.append(f"epoch {epoch}: {len(winners)} creators")
        elif owners[epoch] != winners[0]:
            failures.append(f"epoch {epoch}: created by {winners[0]}, file says {owners[epoch]}")
    if failures:
        shown = "; ".join(failures[:5])
        return Verdict("o_excl_race", False, f"{len(failures)} of {rounds} rounds wrong: {shown}")
    return Verdict(
        "o_excl_race",
        True,
        f"{rounds} rounds, exactly one of {len(wins)} processes created each epoch file",
    )


def visibility_verdict(
    rounds: int, seen_before: Sequence[bool], seen_after: Sequence[bool]
) -> Verdict:
    """Per round: whether the reader saw the file before the writer made it (must not) and
    right after the writer said it was fsynced (must)."""
    failures = [
        f"round {index}: seen before creation" for index, seen in enumerate(seen_before) if seen
    ] + [
        f"round {index}: not seen after creation"
        for index, seen in enumerate(seen_after)
        if not seen
    ]
    if len(seen_before) != rounds or len(seen_after) != rounds:
        failures.append(f"{min(len(seen_before), len(seen_after))} of {rounds} rounds ran")
    if failures:
        shown = "; ".join(failures[:5])
        return Verdict("stat_visibility", False, f"{len(failures)} failures: {shown}")
    return Verdict(
        "stat_visibility",
        True,
        f"{rounds} rounds, a file created and fsynced by one process was seen by the other's "
        "next stat, right after that one had seen it absent",
    )


def _claim(node: str) -> EpochClaim:
    return EpochClaim(node=node, incarnation=os.getpid(), claimed_ms=0, start=0)


def _race(directory: Path, rounds: int, node: str, barrier: Barrier) -> list[int]:
    won: list[int] = []
    for epoch in range(rounds):
        barrier.wait(CHECK_STEP_TIMEOUT_S)
        try:
            epochs.claim_epoch(directory, epoch, _claim(node))
        except EpochTaken:
            continue
        won.append(epoch)
    return won


def _partner(scratch: str, rounds: int, barrier: Barrier, conn: Connection) -> None:
    """The second process: races the first for each epoch, then creates the files the first
    one looks for, one per request."""
    conn.send(_race(Path(scratch) / "race", rounds, "1", barrier))
    visible = Path(scratch) / "visible"
    while True:
        request = conn.recv()
        if request is None:
            break
        epochs.claim_epoch(visible, request, _claim("1"))
        conn.send(request)


def _run_checks(scratch: Path, rounds: int) -> list[Verdict]:
    race_dir = scratch / "race"
    visible = scratch / "visible"
    race_dir.mkdir()
    visible.mkdir()
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing shared
    barrier = context.Barrier(2)
    conn, partner_conn = context.Pipe()
    partner = context.Process(
        target=_partner, args=(str(scratch), rounds, barrier, partner_conn), daemon=True
    )
    partner.start()
    partner_conn.close()
    try:
        try:
            mine = _race(race_dir, rounds, "0", barrier)
        except threading.BrokenBarrierError:
            raise TimeoutError(
                f"the second process did not keep up with the race (exit code "
                f"{partner.exitcode}, None: still running)"
            ) from None
        if not conn.poll(CHECK_STEP_TIMEOUT_S):
            raise TimeoutError("the second process did not report its race")
        theirs: list[int] = conn.recv()
        owners: list[str | None] = []
        for epoch in range(rounds):
            claim = epochs.read_claim(race_dir, epoch)
            owners.append(claim.node if claim is not None else None)
        verdicts = [race_verdict(rounds, [mine, theirs], owners)]

        seen_before: list[bool] = []
        seen_after: list[bool] = []
        for epoch in range(rounds):
            # is_fenced(epoch) stats epoch + 1: the file the partner creates next.
            seen_before.append(epochs.is_fenced(visible, epoch))
            conn.send(epoch + 1)
            if not conn.poll(CHECK_STEP_TIMEOUT_S) or conn.recv() != epoch + 1:
                raise TimeoutError(f"the second process did not create epoch {epoch + 1}")
            seen_after.append(epochs.is_fenced(visible, epoch))
        conn.send(None)
        verdicts.append(visibility_verdict(rounds, seen_before, seen_after))
    finally:
        conn.close()
        partner.join(CHECK_STEP_TIMEOUT_S)
        if partner.is_alive():
            partner.kill()
            partner.join()
    return verdicts


def check(root: Path, *, rounds: int, out: TextIO | None = None) -> int:
    name = "braid cluster check"
    out = out or sys.stdout
    if not root.is_dir():
        print(f"{name}: error: {root} is not a directory", file=sys.stderr)
        return EXIT_REFUSED
    scratch = root / f"{CHECK_DIR_PREFIX}{uuid.uuid4().hex}"
    try:
        scratch.mkdir()
        verdicts = _run_checks(scratch, rounds)
    except (OSError, TimeoutError, EOFError) as error:
        print(f"{name}: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for verdict in verdicts:
        print(verdict.line(), file=out)
    failed = [verdict.name for verdict in verdicts if not verdict.ok]
    print(f"{root}: {'FAIL (' + ', '.join(failed) + ')' if failed else 'OK'}", file=out)
    return EXIT_FAILED if failed else 0


# -- status ------------------------------------------------------------------------------------

# A shard's state in `status`: who serves it now.
OWNED = "owned"  # its recorded owner holds a lease with the incarnation that claimed it
STALE = "stale"  # the owner is live under another incarnation (fenced, not claimed back yet)
DOWN = "down"  # the owner holds no lease: nobody serves it until it is back (section 11)
NEVER = "never claimed"


class StatusError(Exception):
    """What stops ``status`` before it shows anything; the message says why."""


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    """What ``status`` shows, as its JSON."""

    cluster_id: str
    shard_count: int
    nodes: list[dict[str, Any]]
    shards: list[dict[str, Any]]

    @property
    def unowned(self) -> list[int]:
        return [shard["shard"] for shard in self.shards if shard["state"] != OWNED]

    def to_json(self) -> dict[str, Any]:
        return {
            "cluster_id": self.cluster_id,
            "shard_count": self.shard_count,
            "nodes": self.nodes,
            "shards": self.shards,
            "unowned": self.unowned,
        }


def _cluster_of(
    recorded: layout.ClusterLayout | None, url: str, found: dict[str, int]
) -> tuple[str, int]:
    """The cluster id and shard count: ROOT's cluster.json's (which the Redis must hold), or
    the one cluster the Redis holds."""
    if recorded is not None:
        if recorded.cluster_id not in found:
            raise StatusError(
                f"{url} holds no cluster {recorded.cluster_id} (ROOT {recorded.root}): no node "
                "of this root has started with that Redis"
            )
        return recorded.cluster_id, recorded.shards
    if len(found) != 1:
        held = ", ".join(found) if found else "none"
        raise StatusError(f"{url} holds {len(found)} clusters ({held}): name one by its ROOT")
    return next(iter(found.items()))


async def read_status(url: str, recorded: layout.ClusterLayout | None) -> ClusterStatus:
    """Connect to the cluster's Redis and read its nodes and shard owners (the cluster of
    ``recorded``, a root's layout, or the only one that Redis holds)."""
    from core.cluster import redis_metadata
    from core.cluster.membership import node_order

    found = await redis_metadata.find_clusters(url)
    cluster_id, shard_count = _cluster_of(recorded, url, found)
    metadata = await redis_metadata.connect(url, cluster_id, shards=shard_count)
    try:
        live = await metadata.live_nodes()
        owners = await metadata.shard_owners()
    finally:
        await metadata.aclose()
    nodes = []
    for node_id, info in sorted(live.items(), key=lambda item: node_order(item[0])):
        fields = info.fields
        nodes.append(
            {
                "node": node_id,
                "incarnation": info.incarnation,
                "lease_left_ms": info.lease_left_ms,
                "host": fields.get("host", ""),
                "grpc": fields.get("grpc", ""),
                "kafka": fields.get("kafka", ""),
                "kafka_tls": fields.get("kafka_tls", ""),
                "pid": int(fields["pid"]) if fields.get("pid", "").isdigit() else None,
                "started_ms": int(fields["started_ms"]) if "started_ms" in fields else None,
                # The registered incarnation differs from the lease's while a node re-registers.
                "registered_incarnation": int(fields.get("incarnation", "0")) or None,
            }
        )
    shards = []
    for shard in range(shard_count):
        record = owners.get(shard)
        owner = record.owner if record is not None else None
        if owner is None:
            state = NEVER
        elif owner not in live:
            state = DOWN
        elif record is not None and record.incarnation != live[owner].incarnation:
            state = STALE
        else:
            state = OWNED
        shards.append(
            {
                "shard": shard,
                "owner": owner,
                "incarnation": record.incarnation if record is not None else None,
                "epoch": record.epoch if record is not None else 0,
                "since_ms": record.since_ms if record is not None else None,
                "state": state,
            }
        )
    return ClusterStatus(cluster_id, shard_count, nodes, shards)


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def format_status(found: ClusterStatus, url: str) -> str:
    lines = [f"cluster {found.cluster_id}: {found.shard_count} shards, metadata at {url}"]
    lines.append(f"nodes ({len(found.nodes)} live):")
    if found.nodes:
        rows = [["node", "incarnation", "lease_left_ms", "host", "grpc", "kafka", "pid", "started"]]
        for node in found.nodes:
            kafka = node["kafka"] + (f" (tls {node['kafka_tls']})" if node["kafka_tls"] else "")
            rows.append(
                [
                    node["node"],
                    str(node["incarnation"]),
                    "-" if node["lease_left_ms"] is None else str(node["lease_left_ms"]),
                    node["host"] or "-",
                    node["grpc"] or "-",
                    kafka or "-",
                    "-" if node["pid"] is None else str(node["pid"]),
                    _when(node["started_ms"]),
                ]
            )
        lines += _table(rows)
    lines.append("shards:")
    rows = [["shard", "owner", "epoch", "since", "state"]]
    for shard in found.shards:
        rows.append(
            [
                str(shard["shard"]),
                shard["owner"] or "-",
                str(shard["epoch"]),
                _when(shard["since_ms"]),
                shard["state"],
            ]
        )
    lines += _table(rows)
    unowned = found.unowned
    lines.append(f"unowned: {', '.join(map(str, unowned)) if unowned else 'none'}")
    return "\n".join(lines)


def _redis_url_of(root: Path | None, url: str | None) -> tuple[str, layout.ClusterLayout | None]:
    """The Redis URL to read (``--cluster``, else the supervisor's socket in ROOT) and ROOT's
    recorded layout, which names the cluster; one of the two is given."""
    recorded = layout.ClusterLayout.open(root) if root is not None else None
    if url is None:
        assert root is not None
        url = f"unix://{(root / SUPERVISOR_SOCKET).absolute()}"
    return url, recorded


def status(root: Path | None, *, url: str | None, as_json: bool, out: TextIO | None = None) -> int:
    name = "braid cluster status"
    out = out or sys.stdout
    if url is None and root is None:
        print(f"{name}: error: give --cluster URL or ROOT", file=sys.stderr)
        return EXIT_REFUSED
    try:
        url, recorded = _redis_url_of(root, url)
        found = asyncio.run(read_status(url, recorded))
    except (layout.LayoutError, ValueError) as error:
        print(f"{name}: error: {error}", file=sys.stderr)
        return EXIT_REFUSED
    except Exception as error:  # Redis unreachable, a cluster it does not hold, ...
        print(f"{name}: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    if as_json:
        print(json.dumps(found.to_json(), indent=2), file=out)
    else:
        print(format_status(found, url), file=out)
    return 0


# -- drain -------------------------------------------------------------------------------------


async def drain_node(
    url: str, recorded: layout.ClusterLayout | None, node: str, timeout_s: float
) -> tuple[dict[int, tuple[str, int]], list[int]]:
    """Ask ``node`` to drain and wait for the handover: (the shards it owned -> (new owner,
    epoch)), and the shards still its when the wait ended (empty: done)."""
    from core.cluster import drain as draining
    from core.cluster import redis_metadata

    found = await redis_metadata.find_clusters(url)
    cluster_id, shard_count = _cluster_of(recorded, url, found)
    metadata = await redis_metadata.connect(url, cluster_id, shards=shard_count)
    redis, closers = redis_metadata._client(url, redis_metadata.METADATA_WAIT_MS, None)
    try:
        live = await metadata.live_nodes()
        if node not in live:
            raise StatusError(f"node {node} is not live in cluster {cluster_id}")
        owned = await draining.owned_by(redis, cluster_id, shard_count, node)
        await draining.request_drain(redis, cluster_id, node)
        left = await draining.wait_handed_over(
            redis, cluster_id, shard_count, node, int(timeout_s * 1000)
        )
        owners = await metadata.shard_owners()
    finally:
        await closers.run()
        await metadata.aclose()
    moved = {
        shard: (owners[shard].owner or "-", owners[shard].epoch)
        for shard in owned
        if shard in owners and shard not in left
    }
    return moved, left


def drain(
    node: str, root: Path | None, *, url: str | None, timeout_s: float, out: TextIO | None = None
) -> int:
    name = "braid cluster drain"
    out = out or sys.stdout
    if url is None and root is None:
        print(f"{name}: error: give --cluster URL or ROOT", file=sys.stderr)
        return EXIT_REFUSED
    try:
        url, recorded = _redis_url_of(root, url)
        moved, left = asyncio.run(drain_node(url, recorded, node, timeout_s))
    except (layout.LayoutError, ValueError, StatusError) as error:
        print(f"{name}: error: {error}", file=sys.stderr)
        return EXIT_REFUSED
    except Exception as error:  # Redis unreachable, ...
        print(f"{name}: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    for shard, (owner, epoch) in sorted(moved.items()):
        print(f"shard {shard}: node {node} -> node {owner} (epoch {epoch})", file=out)
    if left:
        print(f"{name}: shards {left} still on node {node} after {timeout_s} s", file=sys.stderr)
        return EXIT_FAILED
    print(f"node {node} drained: owns no shard (a standby until stopped)", file=out)
    return 0
