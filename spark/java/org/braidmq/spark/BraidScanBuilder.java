package org.braidmq.spark;

import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.SupportsPushDownFilters;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * Column pruning (only the columns a query uses are built) and filter pushdown: filters on
 * {@code topic}, {@code queue}, {@code offset} and {@code store_timestamp} narrow which queues
 * and offset ranges are read ({@link Pruning}); Spark still applies every filter to the rows.
 */
final class BraidScanBuilder implements SupportsPushDownRequiredColumns, SupportsPushDownFilters {
  private final CaseInsensitiveStringMap options;
  private StructType schema;
  private Pruning pruning = Pruning.NONE;

  BraidScanBuilder(StructType schema, CaseInsensitiveStringMap options) {
    this.schema = schema;
    this.options = options;
  }

  @Override
  public void pruneColumns(StructType required) {
    schema = required;
  }

  @Override
  public Filter[] pushFilters(Filter[] filters) {
    pruning = Pruning.of(filters);
    return filters; // all still evaluated after the scan: pruning only reads less
  }

  @Override
  public Filter[] pushedFilters() {
    return pruning.used();
  }

  @Override
  public Scan build() {
    return new BraidScan(schema, options, pruning);
  }
}
