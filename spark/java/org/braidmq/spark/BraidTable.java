package org.braidmq.spark;

import java.util.EnumSet;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** A log seen as a table: batch reads and micro-batch streams of its queues. Immutable. */
final class BraidTable implements SupportsRead {
  private final StructType schema;

  BraidTable(StructType schema) {
    this.schema = schema;
  }

  @Override
  public String name() {
    return BraidSource.NAME;
  }

  /** Spark 4 prefers {@code columns()}, whose default is derived from this. */
  @Override
  @SuppressWarnings("deprecation")
  public StructType schema() {
    return schema;
  }

  @Override
  public Set<TableCapability> capabilities() {
    return EnumSet.of(TableCapability.BATCH_READ, TableCapability.MICRO_BATCH_READ);
  }

  @Override
  public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
    return new BraidScanBuilder(schema, options);
  }
}
