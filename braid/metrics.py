"""Metrics: a registry of collector callbacks rendered in the Prometheus text format 0.0.4.

A collector is any callable returning metric families. A family is a plain tuple
``(name, kind, help, samples)`` so components below ``braid`` (gateways, core) can provide one
without importing this module: ``kind`` is ``"counter"`` or ``"gauge"``, ``samples`` is a number
(one unlabelled sample) or a sequence of ``(labels dict, number)``. Simplest of all, a component
keeps a ``dict[str, int]`` of counters (as ``LogStore.metrics`` does) and the server registers it
with :meth:`MetricsRegistry.register_counters`.

Exposition format: https://prometheus.io/docs/instrumenting/exposition_formats/ (``# HELP``,
``# TYPE``, then ``name{label="value"} number`` lines, one family's lines together).

Collectors run on the event-loop thread when ``/metrics`` is scraped; they must be quick and
must not block. A failing collector is logged and counted, never fails the scrape.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from core.log import names

if TYPE_CHECKING:
    from core.log import LogStore

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
COUNTER = "counter"
GAUGE = "gauge"
KINDS = (COUNTER, GAUGE)

# Prometheus data model: metric and label names.
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

Number = int | float
Labels = Mapping[str, str]
Samples = Number | Sequence[tuple[Labels, Number]]


class Family(NamedTuple):
    name: str
    kind: str  # COUNTER or GAUGE
    help: str
    samples: Samples


Collector = Callable[[], Iterable[tuple[str, str, str, Samples]]]


def format_value(value: Number) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def escape_label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _sample_lines(name: str, samples: Samples) -> list[str]:
    if isinstance(samples, int | float):
        return [f"{name} {format_value(samples)}"]
    lines = []
    for labels, value in samples:
        if labels:
            for label in labels:
                if not _LABEL_NAME.fullmatch(label) or label.startswith("__"):
                    raise ValueError(f"bad label name {label!r} in {name}")
            inner = ",".join(f'{k}="{escape_label_value(str(v))}"' for k, v in labels.items())
            lines.append(f"{name}{{{inner}}} {format_value(value)}")
        else:
            lines.append(f"{name} {format_value(value)}")
    return lines


class MetricsRegistry:
    """Collectors by registration order; :meth:`render` runs them all."""

    def __init__(self) -> None:
        self._collectors: list[tuple[str, Collector]] = []
        self.collector_errors = 0

    def register(self, source: str, collector: Collector) -> None:
        """Add a collector; ``source`` names it in error logs."""
        self._collectors.append((source, collector))

    def register_counters(
        self,
        prefix: str,
        counters: Callable[[], Mapping[str, int]],
        help_texts: Mapping[str, str] | None = None,
    ) -> None:
        """Export each key of a counter dict as ``<prefix><key>_total``."""
        texts = help_texts or {}

        def collect() -> list[Family]:
            return [
                Family(f"{prefix}{key}_total", COUNTER, texts.get(key, f"{prefix}{key}"), value)
                for key, value in counters().items()
            ]

        self.register(prefix, collect)

    def collect(self) -> list[Family]:
        """Every family from every collector; families with one name are merged."""
        merged: dict[str, Family] = {}
        for source, collector in self._collectors:
            try:
                families = [Family(*family) for family in collector()]
                for family in families:
                    if not _METRIC_NAME.fullmatch(family.name):
                        raise ValueError(f"bad metric name {family.name!r}")
                    if family.kind not in KINDS:
                        raise ValueError(f"{family.name}: kind must be one of {KINDS}")
                    _sample_lines(family.name, family.samples)  # validates labels
            except Exception:
                self.collector_errors += 1
                log.exception("metrics collector %s failed", source)
                continue
            for family in families:
                known = merged.get(family.name)
                if known is None:
                    merged[family.name] = family
                elif known.kind != family.kind:
                    self.collector_errors += 1
                    log.error(
                        "metric %s registered as %s and %s", family.name, known.kind, family.kind
                    )
                else:
                    merged[family.name] = known._replace(
                        samples=[*_as_list(known.samples), *_as_list(family.samples)]
                    )
        # Last, so that it counts this scrape's errors too.
        merged.update((family.name, family) for family in self._own_metrics())
        return list(merged.values())

    def render(self, extra: Iterable[Family] = ()) -> str:
        """The registry's families, then ``extra`` (families built for this scrape)."""
        return render_families([*self.collect(), *extra])

    def _own_metrics(self) -> list[Family]:
        return [
            Family(
                "braid_metrics_collector_errors_total",
                COUNTER,
                "Metric collectors that raised while /metrics was scraped.",
                self.collector_errors,
            )
        ]


def render_families(families: Iterable[Family]) -> str:
    """Families in the Prometheus text format (one HELP and TYPE line each)."""
    lines: list[str] = []
    for family in families:
        lines.append(f"# HELP {family.name} {escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        lines.extend(_sample_lines(family.name, family.samples))
    return "\n".join(lines) + "\n"


def _as_list(samples: Samples) -> list[tuple[Labels, Number]]:
    if isinstance(samples, int | float):
        return [({}, samples)]
    return list(samples)


# -- a cluster's families (docs/cluster.md section 9) ---------------------------------------

# The label each node's samples carry on a cluster's /metrics; a sample that already has one
# keeps it as ``exported_node`` (Prometheus' own rule for a target label a series already has).
NODE_LABEL = "node"
EXPORTED_NODE_LABEL = "exported_node"


def family_to_json(family: Family) -> dict[str, object]:
    """``family`` as JSON, for an ``Admin`` answer: name, type, help and its samples as
    ``[labels, value]`` pairs (a NaN or infinite value as its text, which JSON lacks)."""
    return {
        "name": family.name,
        "type": family.kind,
        "help": family.help,
        "samples": [
            [dict(labels), _json_number(value)] for labels, value in _as_list(family.samples)
        ],
    }


def family_from_json(data: object) -> Family:
    """The family :func:`family_to_json` made; ValueError for anything else (a peer's answer is
    checked as any input is)."""
    if not isinstance(data, dict):
        raise ValueError(f"a metric family is a JSON object, not {data!r}")
    name, kind, text, samples = (data.get(key) for key in ("name", "type", "help", "samples"))
    if not isinstance(name, str) or not _METRIC_NAME.fullmatch(name):
        raise ValueError(f"bad metric name {name!r}")
    if kind not in KINDS:
        raise ValueError(f"{name}: kind must be one of {KINDS}, not {kind!r}")
    if not isinstance(text, str) or not isinstance(samples, list):
        raise ValueError(f"{name}: help must be a string and samples a list")
    parsed: list[tuple[Labels, Number]] = []
    for sample in samples:
        if not (isinstance(sample, list) and len(sample) == 2 and isinstance(sample[0], dict)):
            raise ValueError(f"{name}: a sample is [labels, value], not {sample!r}")
        labels, value = sample
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise ValueError(f"{name}: label names and values are strings")
        parsed.append((labels, _number_from_json(name, value)))
    family = Family(name, str(kind), text, parsed)
    _sample_lines(name, parsed)  # validates the label names
    return family


def _json_number(value: Number) -> Number | str:
    if isinstance(value, float) and not math.isfinite(value):
        return format_value(value)  # "NaN", "+Inf", "-Inf"
    return value


def _number_from_json(name: str, value: object) -> Number:
    if isinstance(value, int | float):
        return value
    if value in ("NaN", "+Inf", "-Inf"):
        return float(str(value).replace("Inf", "inf"))
    raise ValueError(f"{name}: a sample value is a number, not {value!r}")


def with_node_label(family: Family, node: str) -> Family:
    """``family`` with ``node="<node>"`` on every sample (a ``node`` label already there
    moves to ``exported_node``)."""
    labelled: list[tuple[Labels, Number]] = []
    for labels, value in _as_list(family.samples):
        moved = dict(labels)
        if NODE_LABEL in moved:
            moved[EXPORTED_NODE_LABEL] = moved.pop(NODE_LABEL)
        labelled.append(({NODE_LABEL: node, **moved}, value))
    return family._replace(samples=labelled)


def merge_node_families(per_node: Mapping[str, Iterable[Family]]) -> list[Family]:
    """One family per name over every node's families, each sample labelled with its node
    (Prometheus wants one HELP and TYPE per name, and the samples of a name together). The
    first node's help text is kept; a family whose type differs from the first node's (nodes
    of different versions) is left out and logged, never rendered as a second TYPE line."""
    merged: dict[str, Family] = {}
    for node, families in per_node.items():
        for family in families:
            labelled = with_node_label(family, node)
            known = merged.get(family.name)
            if known is None:
                merged[family.name] = labelled
            elif known.kind != family.kind:
                log.error(
                    "metric %s is a %s on node %s but a %s before: left out",
                    family.name,
                    family.kind,
                    node,
                    known.kind,
                )
            else:
                merged[family.name] = known._replace(
                    samples=[*_as_list(known.samples), *_as_list(labelled.samples)]
                )
    return list(merged.values())


# -- collectors the server registers ----------------------------------------------------------

# LogStore.metrics keys: exported name, kind, help. A key missing here is exported as a counter
# named braid_log_<key>_total; add it here when it is a gauge or needs a better help text.
STORE_METRICS: dict[str, tuple[str, str, str]] = {
    "appends": ("braid_log_appends_total", COUNTER, "Records appended to the commit log."),
    "appended_bytes": (
        "braid_log_appended_bytes_total",
        COUNTER,
        "Bytes of record frames appended to the commit log.",
    ),
    "index_entries": (
        "braid_log_index_entries_total",
        COUNTER,
        "Per-queue index entries written (one append may index into several queues).",
    ),
    "fsyncs": ("braid_log_fsyncs_total", COUNTER, "fdatasync calls on commit-log segments."),
    "checkpoints": ("braid_log_checkpoints_total", COUNTER, "Checkpoints written."),
    "segments_deleted": (
        "braid_log_segments_deleted_total",
        COUNTER,
        "Commit-log segments deleted by retention.",
    ),
    "recovered_records": (
        "braid_log_recovered_records",
        GAUGE,
        "Records replayed by recovery when the store was opened.",
    ),
    "truncated_bytes": (
        "braid_log_recovery_truncated_bytes",
        GAUGE,
        "Bytes of torn tail erased by recovery when the store was opened.",
    ),
}


def store_collector(store: LogStore) -> Collector:
    """Counters from ``store.metrics`` plus gauges of the commit log and the queues."""

    def collect() -> list[Family]:
        families = []
        for key, value in store.metrics.items():
            name, kind, text = STORE_METRICS.get(
                key, (f"braid_log_{key}_total", COUNTER, f"LogStore.metrics[{key!r}]")
            )
            families.append(Family(name, kind, text, value))
        commitlog = store.commitlog
        queues = store.queues(include_system=True)
        system = sum(1 for topic, _ in queues if names.is_system_topic(topic))
        families += [
            Family(
                "braid_log_write_position_bytes",
                GAUGE,
                "Commit-log write position: end of the last appended frame.",
                commitlog.write_position,
            ),
            Family(
                "braid_log_flushed_position_bytes",
                GAUGE,
                "Commit-log position before which everything is fdatasync'ed.",
                commitlog.flushed_position,
            ),
            Family(
                "braid_log_start_position_bytes",
                GAUGE,
                "Base position of the oldest commit-log segment still on disk.",
                commitlog.start_position,
            ),
            Family(
                "braid_log_segments", GAUGE, "Commit-log segment files.", len(commitlog.segments)
            ),
            Family(
                "braid_log_segment_size_bytes",
                GAUGE,
                "Size of each commit-log segment file.",
                commitlog.segment_size,
            ),
            Family(
                "braid_log_queues",
                GAUGE,
                "Queues with an index, by kind (system: topics starting with __).",
                [({"kind": "user"}, len(queues) - system), ({"kind": "system"}, system)],
            ),
            Family(
                "braid_log_open",
                GAUGE,
                "1 while the log store is open for writing, 0 once it is closed.",
                0 if store.closed else 1,
            ),
        ]
        return families

    return collect


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _process_start_time() -> float:
    """From /proc (field 22 of /proc/self/stat, in clock ticks after boot, plus the boot time);
    the time this module was imported where /proc is missing."""
    try:
        with open("/proc/self/stat") as stream:
            # The command name (field 2) may hold spaces; fields after it follow its ')'.
            after_name = stream.read().rpartition(")")[2].split()
        with open("/proc/stat") as stream:
            boot = next(int(line.split()[1]) for line in stream if line.startswith("btime "))
        return boot + int(after_name[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


_STARTED = _process_start_time()


# gc.get_freeze_count() walks the whole frozen list (~8 ms per call in braid serve: 90% of a
# /metrics scrape, measured with py-spy by bench mgmt). braid serve freezes once, at start, and
# never unfreezes: the first non-zero count is kept (an empty list costs nothing to count).
_frozen_count = 0


def _frozen_objects() -> int:
    global _frozen_count
    if not _frozen_count:
        _frozen_count = gc.get_freeze_count()
    return _frozen_count


def process_collector() -> list[Family]:
    """The standard ``process_*`` metrics (names as in prometheus/client_python), from /proc."""
    times = os.times()
    families = [
        Family(
            "process_cpu_seconds_total",
            COUNTER,
            "Total user and system CPU time spent in seconds.",
            round(times.user + times.system, 3),
        ),
        Family(
            "process_start_time_seconds",
            GAUGE,
            "Start time of the process since unix epoch in seconds.",
            _STARTED,
        ),
        Family(
            "braid_gc_frozen_objects",
            GAUGE,
            "Objects loaded at start-up that the garbage collector's passes skip (gc.freeze).",
            _frozen_objects(),
        ),
    ]
    try:
        with open("/proc/self/statm") as stream:
            size_pages, resident_pages, *_ = (int(field) for field in stream.read().split())
    except OSError:
        return families  # not Linux
    families += [
        Family(
            "process_resident_memory_bytes",
            GAUGE,
            "Resident memory size in bytes.",
            resident_pages * _PAGE_SIZE,
        ),
        Family(
            "process_virtual_memory_bytes",
            GAUGE,
            "Virtual memory size in bytes.",
            size_pages * _PAGE_SIZE,
        ),
    ]
    with contextlib.suppress(OSError):
        families.append(
            Family(
                "process_open_fds",
                GAUGE,
                "Number of open file descriptors.",
                len(os.listdir("/proc/self/fd")),
            )
        )
    return families
