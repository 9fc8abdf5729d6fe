"""File and directory names of a data directory, and the reserved system topics.

Layout of a data directory (every file name that holds a position or number is 20 digits, so a
listing sorts numerically and finding a file is arithmetic)::

    DATA_DIR/
      log.json                      segment size and format version (fixed at creation)
      checkpoint                    JSON: commit-log position and index entry counts (see recovery)
      clean_shutdown                present only between a clean close and the next open
      commitlog/00000000000000000000.log   segment files named by their base position
      index/<topic>/<queue>/00000000000000000000.idx  per-queue index files named by first entry
"""

from __future__ import annotations

import re
from pathlib import Path

COMMITLOG_DIR = "commitlog"
INDEX_DIR = "index"
LOG_META_FILE = "log.json"
CHECKPOINT_FILE = "checkpoint"
CLEAN_SHUTDOWN_FILE = "clean_shutdown"
SEGMENT_SUFFIX = ".log"
INDEX_SUFFIX = ".idx"

# Internal topics: names starting with "__" are reserved (Kafka's __consumer_offsets precedent).
SYSTEM_PREFIX = "__"
OFFSETS_TOPIC = "__offsets"  # offset-group commits
TIMERS_TOPIC = "__timers"  # delayed records waiting for their time (issue: delay)
TRANSACTIONS_TOPIC = "__transactions"  # half-message commit/rollback operations
HALF_TOPIC = "__half"  # index of pending half messages
RETAINED_TOPIC = "__retained"  # MQTT retained messages
SESSIONS_TOPIC = "__sessions"  # MQTT session state
ACKS_TOPIC = "__acks"  # ack-group cursors
META_TOPIC = "__meta"  # topic definitions and bindings
SYSTEM_TOPICS = (
    OFFSETS_TOPIC,
    TIMERS_TOPIC,
    TRANSACTIONS_TOPIC,
    HALF_TOPIC,
    RETAINED_TOPIC,
    SESSIONS_TOPIC,
    ACKS_TOPIC,
    META_TOPIC,
)

_SAFE = re.compile(r"[A-Za-z0-9_.-]")
# A name made of safe characters only, not starting with ".": its own directory name.
_ALL_SAFE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")


def is_system_topic(topic: str) -> bool:
    return topic.startswith(SYSTEM_PREFIX)


def segment_name(base_position: int) -> str:
    return f"{base_position:020d}{SEGMENT_SUFFIX}"


def index_file_name(first_entry: int) -> str:
    return f"{first_entry:020d}{INDEX_SUFFIX}"


def number_of(path: Path) -> int:
    return number_of_name(path.name)


def number_of_name(name: str) -> int:
    """The number a segment or index file name starts with."""
    return int(name.split(".", 1)[0])


def encode_topic_dir(topic: str) -> str:
    """A topic name as one safe directory name: bytes outside ``[A-Za-z0-9_.-]`` become ``%XX``
    (AMQP exchange names may hold ``/`` or ``:``), and a leading ``.`` too."""
    if _ALL_SAFE.fullmatch(topic):
        return topic  # the common case, and built on demand for every mapping of an index file
    out: list[str] = []
    for index, char in enumerate(topic):
        if _SAFE.fullmatch(char) and not (index == 0 and char == "."):
            out.append(char)
        else:
            out.extend(f"%{byte:02X}" for byte in char.encode())
    return "".join(out) or "%"


def decode_topic_dir(name: str) -> str:
    if name == "%":
        return ""
    raw = bytearray()
    i = 0
    while i < len(name):
        if name[i] == "%":
            raw.append(int(name[i + 1 : i + 3], 16))
            i += 3
        else:
            raw.extend(name[i].encode())
            i += 1
    return raw.decode()


def queue_dir(data_dir: Path, topic: str, queue: int) -> Path:
    return data_dir / INDEX_DIR / encode_topic_dir(topic) / str(queue)
