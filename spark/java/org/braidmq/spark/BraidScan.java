package org.braidmq.spark;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.SparkContext;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * A batch read planned as the Python source plans it ({@link ReadOptions#batchSlices}, {@link
 * ReadOptions#packSlices}): few equal partitions, at least the session's cores when each then
 * gets {@link ReadOptions#MIN_RECORDS_PER_PARTITION} records; on a cluster's data root, over
 * the queues of every shard ({@link DataRoot}), in shard order. Planning never reads a record.
 */
final class BraidScan implements Scan, Batch {
  private final StructType schema;
  private final CaseInsensitiveStringMap options;
  private final Pruning pruning;
  private final int[] columns;

  BraidScan(StructType schema, CaseInsensitiveStringMap options, Pruning pruning) {
    this.schema = schema;
    this.options = options;
    this.pruning = pruning;
    this.columns = Schema.columnsOf(schema);
  }

  @Override
  public StructType readSchema() {
    return schema;
  }

  @Override
  public String description() {
    return "braid(JVM) " + options.get("path") + " " + String.join(",", schema.fieldNames());
  }

  @Override
  public Batch toBatch() {
    return this;
  }

  /** Set by {@code spark.register(session, min_partitions=N)}: the reads' default. */
  static final String MIN_PARTITIONS_CONF = "spark.braid.minPartitions";

  /**
   * {@code minPartitions} when a read does not set it: {@link #MIN_PARTITIONS_CONF}, else the
   * session's cores (what spark.register tells the Python source).
   */
  static Integer defaultParallelism() {
    try {
      String configured = SparkSession.active().conf().get(MIN_PARTITIONS_CONF, null);
      if (configured != null) {
        return Integer.parseInt(configured.strip());
      }
      return SparkContext.getOrCreate().defaultParallelism();
    } catch (RuntimeException noSession) {
      return null;
    }
  }

  @Override
  public InputPartition[] planInputPartitions() {
    ReadOptions read = ReadOptions.parse(options.asCaseSensitiveMap(), false, defaultParallelism());
    try {
      List<Slice> slices = new ArrayList<>();
      for (int shard : DataRoot.of(read.path).shardsWithLogs()) {
        if (!pruning.allowsShard(shard)) {
          continue;
        }
        LogDir log = new LogDir(DataRoot.shardDir(read.path, shard));
        TxnIndex transactions = new TxnIndex();
        transactions.refresh(log); // after the queues were read: see TxnIndex.lastStableOffset
        slices.addAll(read.batchSlices(log, pruning, transactions, shard));
      }
      return partitions(
          ReadOptions.packSlices(slices, read.maxRecordsPerPartition, read.minPartitions));
    } catch (IOException error) {
      throw new UncheckedIOException(error);
    }
  }

  static InputPartition[] partitions(List<List<Slice>> packed) {
    InputPartition[] out = new InputPartition[packed.size()];
    for (int i = 0; i < out.length; i++) {
      out[i] = new BraidPartition(packed.get(i).toArray(new Slice[0]));
    }
    return out;
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    ReadOptions read = ReadOptions.parse(options.asCaseSensitiveMap(), false, null);
    return new BraidReaderFactory(
        read.path, columns, read.verifyChecksums, read.dedupe, read.includeAborted);
  }

  @Override
  public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
    ReadOptions read = ReadOptions.parse(options.asCaseSensitiveMap(), true, defaultParallelism());
    return new BraidStream(read, columns);
  }
}
