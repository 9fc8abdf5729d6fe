"""The columns of the ``braid`` data source: one Spark schema and the Arrow schema it maps to.

One row is one record of one queue. ``docs/spark.md`` describes every column; the short form:

    column           type                                  from
    topic            string                                the queue's topic (the stream read)
    queue            int                                   the queue number inside ``topic``
    offset           long                                  the record's offset in that queue
    timestamp        timestamp                             producer time (``born_ms``; Kafka
                                                           CreateTime per record of a batch)
    key              binary                                null when the producer sent none
    value            binary                                the body; null for a tombstone
    headers          array<struct<key:string,value:binary>> order kept, duplicates allowed
    tags             array<string>
    protocol         string                                kafka, amqp, mqtt or internal
    store_timestamp  timestamp                             broker append time (``store_ms``)
    subject          string                                routing key / MQTT topic levels
    origin_address   string                                address as the publisher wrote it
    client_id        string                                publishing client's id
    flags            int                                   frame FLAG_* bits (core.log.record)
    position         long                                  commit-log position of the frame
    shard            int                                   the shard of a cluster's data root
                                                           the row was read in; null for a
                                                           single-node directory

Every column is nullable, as a DDL-declared Python data source's are. The Arrow schema is derived
by PySpark's own ``to_arrow_schema`` so that the batches ``read()`` yields equal it exactly
(PySpark rejects a batch whose schema differs, SPARK-55583).
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

FORMAT = "braid"

# (name, Spark DDL type) in column order.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("topic", "string"),
    ("queue", "int"),
    ("offset", "bigint"),
    ("timestamp", "timestamp"),
    ("key", "binary"),
    ("value", "binary"),
    ("headers", "array<struct<key:string,value:binary>>"),
    ("tags", "array<string>"),
    ("protocol", "string"),
    ("store_timestamp", "timestamp"),
    ("subject", "string"),
    ("origin_address", "string"),
    ("client_id", "string"),
    ("flags", "int"),
    ("position", "bigint"),
    ("shard", "int"),
)
COLUMN_NAMES = tuple(name for name, _ in COLUMNS)
DDL = ", ".join(f"`{name}` {kind}" for name, kind in COLUMNS)


@cache
def spark_schema(columns: tuple[str, ...] = COLUMN_NAMES) -> StructType:
    """The schema (or the given columns of it, in that order) as a StructType, built without a
    session, unlike DDL parsing."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    kinds = {
        "string": StringType(),
        "int": IntegerType(),
        "bigint": LongType(),
        "timestamp": TimestampType(),
        "binary": BinaryType(),
        "array<struct<key:string,value:binary>>": ArrayType(header),
        "array<string>": ArrayType(StringType()),
    }
    by_name = dict(COLUMNS)
    return StructType([StructField(name, kinds[by_name[name]]) for name in columns])


@cache
def arrow_schema(columns: tuple[str, ...] = COLUMN_NAMES) -> pa.Schema:
    """The Arrow schema PySpark expects the batches of ``read()`` to have."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_schema(columns), timezone="UTC")


def columns_of(schema: StructType) -> tuple[str, ...]:
    """The columns a user-specified schema (``.schema(...)`` on the reader) asks for: any subset
    of the columns, in any order, each with its type; reading fewer columns is faster because
    every column of every row is converted by Spark (a Python data source gets no column
    pruning)."""
    full = {field.name: field.dataType for field in spark_schema().fields}
    wanted: list[str] = []
    for field in schema.fields:
        if field.name not in full:
            raise ValueError(f"braid has no column {field.name!r}; columns: {list(full)}")
        if field.dataType != full[field.name]:
            raise ValueError(
                f"column {field.name!r} is {full[field.name].simpleString()}, "
                f"not {field.dataType.simpleString()}"
            )
        wanted.append(field.name)
    return tuple(wanted)
