package org.braidmq.spark;

import java.util.Map;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * The {@code braid} format on the JVM: {@code spark.read.format("braid").option("path",
 * DATA_DIR).load()} reads a BraidMQ log in place, as the Python data source in {@code
 * spark/source.py} does (same schema, options, partitions and rows), with columnar batches,
 * column pruning and pushed-down topic, queue, offset and store-time filters. Found by its short
 * name through {@code META-INF/services} once its jar is on the session's class path ({@code
 * spark.register} adds it); {@code docs/spark.md} says which reader runs when.
 */
public final class BraidSource implements TableProvider, DataSourceRegister {
  /** The format's name, as the Python source's. */
  public static final String NAME = "braid";

  @Override
  public String shortName() {
    return NAME;
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return Schema.FULL;
  }

  /** A user-specified schema reads only those columns (any subset, in any order). */
  @Override
  public boolean supportsExternalMetadata() {
    return true;
  }

  @Override
  public Table getTable(
      StructType schema, Transform[] partitioning, Map<String, String> properties) {
    Schema.columnsOf(schema); // refuse an unknown column or a wrong type now, not per task
    return new BraidTable(schema);
  }
}
