"""Stand-ins for ``pyspark.sql.streaming.datasource`` (PySpark 4.2+) on older PySpark 4.x, so
that batch reads work there; streams then run without per-trigger limits."""

from __future__ import annotations

from dataclasses import dataclass


class ReadLimit:
    pass


@dataclass
class ReadAllAvailable(ReadLimit):
    pass


@dataclass
class ReadMaxRows(ReadLimit):
    max_rows: int


class SupportsTriggerAvailableNow:
    def prepareForTriggerAvailableNow(self) -> None:
        raise NotImplementedError
