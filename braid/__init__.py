"""braid: the ``braid`` command. ``braid serve`` assembles and runs the broker (braid/server.py);
``braid log`` inspects a data directory read-only (braid/logtool.py)."""

from functools import cache


@cache
def version() -> str:
    """The installed distribution's version (importlib.metadata costs ~0.1 s: only on demand)."""
    from importlib import metadata

    try:
        return metadata.version("braidmq")
    except metadata.PackageNotFoundError:  # a source tree that is not pip-installed
        return "0+unknown"
