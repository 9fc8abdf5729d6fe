"""``python -m bench codec {amqp,mqtt,kafka} [ARGS]``: one protocol codec's throughput (no I/O).

The codecs are sans-IO, so these measure decoding and encoding alone, single core: what a
gateway's parsing costs before any broker work (see each module for its cases).
"""

from __future__ import annotations

import importlib
import sys

CODECS = {"amqp": "bench.codec_amqp", "mqtt": "bench.codec_mqtt", "kafka": "bench.codec_kafka"}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in CODECS:
        print("usage: python -m bench codec {" + ",".join(CODECS) + "} [ARGS]", file=sys.stderr)
        return 2
    importlib.import_module(CODECS[argv[0]]).main(argv[1:])
    return 0
