"""The exclusive lock a braid process holds on its data directory (or cluster data root).

One ``flock`` on the directory itself, opened ``O_RDONLY | O_DIRECTORY``: no file operation
inside the directory can take it away. A lock on a file inside it (``braid.lock`` up to issue
21) was lost when that file was deleted; a second broker then recovered the live log under the
first and confirmed messages were lost. ``braid serve``, the ``--workers`` supervisor and
``braid cluster init`` all take this same lock, so none of them starts on a directory another
one holds.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class DirectoryLocked(OSError):
    """Another process holds the directory's lock."""


def lock_directory(directory: Path) -> int:
    """Create ``directory`` if needed and take its exclusive lock without waiting.

    Returns the open descriptor that holds the lock (``os.close`` releases it). Raises
    ``DirectoryLocked`` when another process holds it, ``OSError`` when the directory cannot be
    made or opened.
    """
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise DirectoryLocked(f"{directory} is locked by another process") from None
    return fd
