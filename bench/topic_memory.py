"""``python -m bench topic-memory``: what one idle topic costs the broker in memory.

Issue 21's soak found anonymous memory growing ~8.5 KiB per new topic under topic churn (one
MQTT client publishing QoS 0 to a fresh first-level topic, each a broker topic). This runs the
whole broker (``braid.server.BraidServer``, default settings, only the MQTT listener on) in this
process, makes ``--warmup`` topics that way (one-time costs: caches, imports, first segments),
then ``--topics`` more, and reports per new topic:

- anonymous resident memory (``RssAnon`` of /proc/self/status, less what tracemalloc itself
  holds when ``--tracemalloc`` is on);
- with ``--tracemalloc``: the Python heap traced, and its growth by allocating line (or by
  traceback with ``--frames``);
- the mappings of /proc/self/smaps: index files (``.idx``) mapped, anonymous regions, and their
  resident and private sizes.

The publisher is a raw socket in a thread (pre-encoded PUBLISH packets); the broker is counted
as done when its registry holds every topic. ``--subscriber stalled`` adds the soak's other
abuser, an MQTT subscriber on ``#`` that never reads (``reading``: one that reads everything).
Background work (checkpoints, the timer service) may hold a transient copy of something at
either look: a line with 0.00 blocks per topic is one such object, not a per-topic cost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import re
import socket
import tempfile
import threading
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

from braid.config import ListenerSettings, ServerSettings
from braid.server import BraidServer
from gateway.mqtt.codec import Connect, Subscribe, Subscription, encode, encode_publish

TOPICS = 5_000
WARMUP = 500
BATCH = 100  # publishes per sendall
DEADLINE_S = 120.0  # for the broker to register every topic
V311 = 4
_SMAPS_HEADER = re.compile(r"^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+\s*(.*)$")


@dataclass
class Memory:
    """One look at the process: bytes."""

    rss_anon: int
    traced: int  # tracemalloc's traced heap (0 when off)
    tracemalloc_overhead: int  # what tracemalloc's own tables hold (inside rss_anon)
    idx_maps: int  # mappings of index files
    idx_rss: int
    anon_maps: int  # anonymous mappings (heap, arenas, thread stacks)
    anon_private: int  # Private_Dirty + Private_Clean of anonymous mappings

    @property
    def heap(self) -> int:
        """Anonymous resident memory, tracemalloc's own tables left out."""
        return self.rss_anon - self.tracemalloc_overhead


def status_field(name: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
    return 0


def smaps() -> tuple[int, int, int, int]:
    """(index-file mappings, their Rss, anonymous mappings, their private bytes)."""
    idx_maps = idx_rss = anon_maps = anon_private = 0
    kind = ""
    with open("/proc/self/smaps") as lines:
        for line in lines:
            header = _SMAPS_HEADER.match(line)
            if header is not None:
                path = header.group(1)
                kind = "idx" if path.endswith(".idx") else "anon" if not path else ""
                idx_maps += kind == "idx"
                anon_maps += kind == "anon"
                continue
            if kind == "idx" and line.startswith("Rss:"):
                idx_rss += int(line.split()[1]) * 1024
            elif kind == "anon" and line.startswith(("Private_Dirty:", "Private_Clean:")):
                anon_private += int(line.split()[1]) * 1024
    return idx_maps, idx_rss, anon_maps, anon_private


def look() -> Memory:
    gc.collect()
    tracing = tracemalloc.is_tracing()
    return Memory(
        status_field("RssAnon"),
        tracemalloc.get_traced_memory()[0] if tracing else 0,
        tracemalloc.get_tracemalloc_memory() if tracing else 0,
        *smaps(),
    )


def subscribe_everything(port: int, reading: bool, stop: threading.Event) -> socket.socket:
    """An MQTT 3.1.1 subscriber on ``#`` (QoS 1): reading what it gets in a thread until
    ``stop``, or never (a small receive buffer, as the soak's stalled subscriber)."""
    sock = socket.socket()
    if not reading:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        encode(Connect("topicmem-subscriber", V311), V311)
        + encode(Subscribe(1, (Subscription("#", 1),)), V311)
    )
    if reading:
        sock.settimeout(0.2)

        def drain() -> None:
            while not stop.is_set():
                try:
                    if not sock.recv(65536):
                        return
                except TimeoutError:
                    continue
                except OSError:
                    return

        threading.Thread(target=drain, daemon=True).start()
    return sock


def publish_fresh_topics(port: int, prefix: str, first: int, count: int) -> None:
    """One MQTT 3.1.1 client publishing QoS 0 once to each of ``count`` fresh first-level
    topics (as the soak's topic-creating abuser does), then disconnecting."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(encode(Connect(f"{prefix}-{first}", V311), V311))
        for start in range(first, first + count, BATCH):
            stop = min(first + count, start + BATCH)
            sock.sendall(
                b"".join(
                    encode_publish(f"{prefix}-{n}/t", b"x", version=V311)
                    for n in range(start, stop)
                )
            )
        sock.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError):
            while sock.recv(4096):
                pass


async def make_topics(server: BraidServer, port: int, prefix: str, first: int, count: int) -> None:
    broker = server.broker
    assert broker is not None
    wanted = len(broker.topics) + count
    thread = threading.Thread(
        target=publish_fresh_topics, args=(port, prefix, first, count), daemon=True
    )
    thread.start()
    deadline = time.monotonic() + DEADLINE_S
    while len(broker.topics) < wanted:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(broker.topics)} topics of {wanted} after {DEADLINE_S} s")
        await asyncio.sleep(0.05)
    await asyncio.to_thread(thread.join)
    await asyncio.sleep(0.2)  # let the connection's close settle


def per_topic(after: int, before: int, topics: int) -> str:
    return f"{(after - before) / topics:9.0f} B"


async def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="braid-topicmem-") as root:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        listeners = ListenerSettings(  # the MQTT listener only
            host="127.0.0.1",
            mqtt_port=port,
            amqp_port=0,
            mqtt_ws_port=0,
            kafka_port=0,
            http_port=0,
            amqps_port=0,
            mqtts_port=0,
            mqtt_wss_port=0,
            kafka_tls_port=0,
            https_port=0,
        )
        server = BraidServer(ServerSettings(data_dir=str(Path(root) / "data"), listeners=listeners))
        await server.start()
        stop = threading.Event()
        subscriber: socket.socket | None = None
        try:
            if args.subscriber != "none":
                subscriber = subscribe_everything(port, args.subscriber == "reading", stop)
            prefix = f"topicmem-{os.getpid()}"
            await make_topics(server, port, prefix, 0, args.warmup)
            if args.tracemalloc:
                tracemalloc.start(args.frames)
            before = look()
            snapshot = tracemalloc.take_snapshot() if args.tracemalloc else None
            started = time.monotonic()
            await make_topics(server, port, prefix, args.warmup, args.topics)
            seconds = time.monotonic() - started
            after = look()
            n = args.topics
            print(
                f"{n:,} new topics (after {args.warmup:,} warm-up ones) in {seconds:.1f} s; "
                "per new topic:"
            )
            print(f"  anonymous resident (RssAnon)   {per_topic(after.heap, before.heap, n)}")
            print(
                f"  anonymous mappings, private    "
                f"{per_topic(after.anon_private, before.anon_private, n)} "
                f"({before.anon_maps} -> {after.anon_maps} mappings)"
            )
            print(
                f"  index files mapped             {before.idx_maps} -> {after.idx_maps} "
                f"(resident {before.idx_rss / 1024:.0f} -> {after.idx_rss / 1024:.0f} KiB)"
            )
            if snapshot is not None:
                heap = per_topic(after.traced, before.traced, n)
                print(f"  Python heap (tracemalloc)      {heap}")
                grouping = "traceback" if args.frames > 1 else "lineno"
                stats = tracemalloc.take_snapshot().compare_to(snapshot, grouping)
                print(f"  heap growth by {grouping}, bytes per new topic:")
                for stat in stats[: args.top]:
                    if stat.size_diff <= 0:
                        continue
                    lines = stat.traceback.format(limit=args.frames)
                    where = " <- ".join(line.strip() for line in lines if line.startswith("  F"))
                    print(
                        f"    {stat.size_diff / n:8.1f}  ({stat.count_diff / n:5.2f} blocks)  "
                        f"{where}"
                    )
        finally:
            stop.set()
            if subscriber is not None:
                subscriber.close()
            tracemalloc.stop()
            await server.stop()
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench topic-memory", description=__doc__)
    parser.add_argument("--topics", type=int, default=TOPICS, help="new topics measured")
    parser.add_argument("--warmup", type=int, default=WARMUP, help="topics made before")
    parser.add_argument("--tracemalloc", action="store_true", help="trace the Python heap")
    parser.add_argument("--frames", type=int, default=1, help="traceback frames per allocation")
    parser.add_argument("--top", type=int, default=25, help="allocation sites shown")
    parser.add_argument(
        "--subscriber",
        choices=("none", "stalled", "reading"),
        default="none",
        help="an MQTT subscriber on # besides the publisher",
    )
    return asyncio.run(run(parser.parse_args(argv)))
