"""``python -m bench <name> [options]``: run one benchmark.

Each benchmark is a module with ``main(argv: list[str]) -> int``. To add one, add its name and
module to :data:`BENCHMARKS`; modules are imported only when chosen, so one benchmark's
dependencies (pyspark, a client library) are not needed to run another.
"""

from __future__ import annotations

import importlib
import sys

# name -> module holding ``main(argv: list[str]) -> int``
BENCHMARKS: dict[str, str] = {
    "log": "bench.log",
    "core": "bench.core",
    "kafka": "bench.kafka",
    "amqp": "bench.amqp",
    "mqtt": "bench.mqtt",
    "mqtt_ws": "bench.mqtt_ws",
    "spark": "bench.spark",
    "interop": "bench.interop",
    "codec": "bench.codec",
    "routing": "bench.routing_table",
    "timers": "bench.timers",
    "compare": "bench.compare",
    "mgmt": "bench.management",
    "tls": "bench.tls",
    "soak": "bench.soak",
    "topic-memory": "bench.topic_memory",
    "cluster": "bench.cluster",
}


def usage() -> str:
    return "usage: python -m bench {" + ",".join(BENCHMARKS) + "} [options]  (--help per benchmark)"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    module_name = BENCHMARKS.get(name)
    if module_name is None:
        print(f"unknown benchmark {name!r}\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(module_name)
    result: int = module.main(rest)
    return result


if __name__ == "__main__":
    sys.exit(main())
