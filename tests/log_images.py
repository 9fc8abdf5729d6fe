"""Copies of a live store's directory: what kill -9 would leave at that moment."""

from __future__ import annotations

import shutil
from pathlib import Path


def copy_image(source: Path, target: Path) -> None:
    """Copy a directory a running store writes to (the event loop is blocked meanwhile; worker
    threads may rename a checkpoint's temporary file away: it is not part of the image then).
    The segments are shared mappings, so the files hold every append made so far."""
    for path in sorted(source.rglob("*")):
        destination = target / path.relative_to(source)
        if path.is_dir():
            destination.mkdir(parents=True, exist_ok=True)
            continue
        destination.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copyfile(path, destination)
        except FileNotFoundError:
            continue
