package org.braidmq.spark;

import java.io.IOException;
import java.util.Iterator;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * Sent to the executors: opens the data directory (or each shard's of a cluster's data root)
 * read-only in each task and decodes the task's slices into columnar batches (rows, when Spark
 * asks for them, are the batches' rows).
 */
final class BraidReaderFactory implements PartitionReaderFactory {
  private static final long serialVersionUID = 1L;

  private final String path;
  private final int[] columns;
  private final boolean verifyChecksums;
  private final boolean dedupe;
  private final boolean includeAborted;

  BraidReaderFactory(
      String path,
      int[] columns,
      boolean verifyChecksums,
      boolean dedupe,
      boolean includeAborted) {
    this.path = path;
    this.columns = columns;
    this.verifyChecksums = verifyChecksums;
    this.dedupe = dedupe;
    this.includeAborted = includeAborted;
  }

  @Override
  public boolean supportColumnarReads(InputPartition partition) {
    return true;
  }

  @Override
  public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
    return new ColumnarReader(decoder(partition));
  }

  @Override
  public PartitionReader<InternalRow> createReader(InputPartition partition) {
    return new RowReader(decoder(partition));
  }

  /** Each shard's directory is opened when the decoder reaches its first slice. */
  private RangeDecoder decoder(InputPartition partition) {
    return new RangeDecoder(
        path, ((BraidPartition) partition).slices, columns, verifyChecksums, dedupe, includeAborted);
  }

  private static final class ColumnarReader implements PartitionReader<ColumnarBatch> {
    private final RangeDecoder decoder;
    private ColumnarBatch current;

    ColumnarReader(RangeDecoder decoder) {
      this.decoder = decoder;
    }

    @Override
    public boolean next() throws IOException {
      current = decoder.next();
      return current != null;
    }

    @Override
    public ColumnarBatch get() {
      return current;
    }

    @Override
    public void close() {}
  }

  private static final class RowReader implements PartitionReader<InternalRow> {
    private final RangeDecoder decoder;
    private Iterator<InternalRow> rows;
    private InternalRow current;

    RowReader(RangeDecoder decoder) {
      this.decoder = decoder;
    }

    @Override
    public boolean next() throws IOException {
      while (rows == null || !rows.hasNext()) {
        ColumnarBatch batch = decoder.next();
        if (batch == null) {
          return false;
        }
        rows = batch.rowIterator();
      }
      current = rows.next();
      return true;
    }

    @Override
    public InternalRow get() {
      return current;
    }

    @Override
    public void close() {}
  }
}
