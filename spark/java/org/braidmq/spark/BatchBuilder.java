package org.braidmq.spark;

import java.util.Arrays;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * The rows of one {@code ColumnarBatch} as the decoder adds them, column by column, only the
 * columns the query asked for (a row of the value query costs three array stores). Binary and
 * string columns record where each value lies (see {@link Vectors.Bytes}); nothing is copied.
 * Arrays grow by half as rows are added. Not thread-safe.
 */
final class BatchBuilder {
  private static final int INITIAL_ROWS = 1024;

  private final int[] columns; // column ids, in the order of the batch
  final boolean[] wanted = new boolean[Schema.COUNT];
  int rows;
  /**
   * The decoder's count of builders started when this one was (re)started: batches are handed
   * to Spark in this order, which tells when a chunk's copy is no longer pointed into.
   */
  long number;
  /** Bytes of keys and values added: a batch is cut at {@link RangeDecoder#BATCH_BYTES}. */
  long payloadBytes;

  private int capacity = INITIAL_ROWS;
  private final long[][] longs = new long[Schema.COUNT][];
  private final int[][] ints = new int[Schema.COUNT][];
  private final Ranges[] bytes = new Ranges[Schema.COUNT];
  // headers: per row a run of header entries; tags: per row a run of tags.
  private int[] headerStarts;
  private int[] headerCounts;
  final Ranges headerKeys = new Ranges(INITIAL_ROWS);
  final Ranges headerValues = new Ranges(INITIAL_ROWS);
  private int[] tagStarts;
  private int[] tagCounts;
  final Ranges tagValues = new Ranges(INITIAL_ROWS);

  /** Whether a column other than the key, the value and the headers is asked for. */
  final boolean wantsCommon;

  BatchBuilder(int[] columns) {
    this.columns = columns;
    boolean common = false;
    for (int id : columns) {
      common |= id != Schema.KEY && id != Schema.VALUE && id != Schema.HEADERS;
    }
    this.wantsCommon = common;
    for (int id : columns) {
      wanted[id] = true;
      switch (id) {
        case Schema.QUEUE:
        case Schema.FLAGS:
        case Schema.SHARD:
          ints[id] = new int[capacity];
          break;
        case Schema.OFFSET:
        case Schema.TIMESTAMP:
        case Schema.STORE_TIMESTAMP:
        case Schema.POSITION:
          longs[id] = new long[capacity];
          break;
        case Schema.HEADERS:
          headerStarts = new int[capacity];
          headerCounts = new int[capacity];
          break;
        case Schema.TAGS:
          tagStarts = new int[capacity];
          tagCounts = new int[capacity];
          break;
        default:
          bytes[id] = new Ranges(capacity);
      }
    }
  }

  /** Empty again, its arrays kept for the next batch. */
  void reset() {
    rows = 0;
    payloadBytes = 0;
    headerKeys.size = 0;
    headerValues.size = 0;
    tagValues.size = 0;
  }

  /** Room for one more row; returns its number. */
  int addRow() {
    if (rows == capacity) {
      grow();
    }
    return rows++;
  }

  /** Room for {@code count} more rows; returns the number of the first. */
  int addRows(int count) {
    while (rows + count > capacity) {
      grow();
    }
    int first = rows;
    rows += count;
    return first;
  }

  private void grow() {
    capacity += capacity >> 1;
    for (int id = 0; id < Schema.COUNT; id++) {
      if (longs[id] != null) {
        longs[id] = Arrays.copyOf(longs[id], capacity);
      }
      if (ints[id] != null) {
        ints[id] = Arrays.copyOf(ints[id], capacity);
      }
      if (bytes[id] != null) {
        bytes[id].ensure(capacity);
      }
    }
    if (headerStarts != null) {
      headerStarts = Arrays.copyOf(headerStarts, capacity);
      headerCounts = Arrays.copyOf(headerCounts, capacity);
    }
    if (tagStarts != null) {
      tagStarts = Arrays.copyOf(tagStarts, capacity);
      tagCounts = Arrays.copyOf(tagCounts, capacity);
    }
  }

  void setLong(int column, int row, long value) {
    longs[column][row] = value;
  }

  void setInt(int column, int row, int value) {
    ints[column][row] = value;
  }

  /** {@code length} -1: null. */
  void setBytes(int column, int row, byte[] source, int start, int length) {
    bytes[column].set(row, source, start, length);
  }

  /**
   * Rows {@code [first, first + count)}: element {@code i} of {@code starts} and {@code lengths}
   * (-1: null), all in {@code source}.
   */
  void setBytesRun(int column, int first, byte[] source, int[] starts, int[] lengths, int count) {
    bytes[column].setRun(first, source, starts, lengths, count);
  }

  /** The row's headers are the next {@code count} entries of headerKeys/headerValues. */
  void setHeaders(int row, int first, int count) {
    headerStarts[row] = first;
    headerCounts[row] = count;
  }

  void setTags(int row, int first, int count) {
    tagStarts[row] = first;
    tagCounts[row] = count;
  }

  ColumnarBatch build() {
    ColumnVector[] vectors = new ColumnVector[columns.length];
    for (int i = 0; i < columns.length; i++) {
      int id = columns[i];
      vectors[i] = vector(id);
    }
    return new ColumnarBatch(vectors, rows);
  }

  private ColumnVector vector(int id) {
    switch (id) {
      case Schema.QUEUE:
      case Schema.FLAGS:
        return new Vectors.Ints(DataTypes.IntegerType, ints[id]);
      case Schema.SHARD:
        return new Vectors.Shards(ints[id], rows);
      case Schema.OFFSET:
      case Schema.POSITION:
        return new Vectors.Longs(DataTypes.LongType, longs[id]);
      case Schema.TIMESTAMP:
      case Schema.STORE_TIMESTAMP:
        return new Vectors.Longs(DataTypes.TimestampType, longs[id]);
      case Schema.KEY:
      case Schema.VALUE:
        return bytes[id].vector(DataTypes.BinaryType, rows);
      case Schema.HEADERS:
        ColumnVector entries =
            new Vectors.Structs(
                Schema.HEADER,
                new ColumnVector[] {
                  headerKeys.vector(DataTypes.StringType, headerKeys.size),
                  headerValues.vector(DataTypes.BinaryType, headerValues.size),
                });
        return new Vectors.Lists(
            Schema.FULL.fields()[id].dataType(), headerStarts, headerCounts, entries);
      case Schema.TAGS:
        return new Vectors.Lists(
            (ArrayType) Schema.FULL.fields()[id].dataType(),
            tagStarts,
            tagCounts,
            tagValues.vector(DataTypes.StringType, tagValues.size));
      default:
        return bytes[id].vector(DataTypes.StringType, rows);
    }
  }

  /** Where values lie: a source array, a start and a length (-1: null) per element. */
  static final class Ranges {
    byte[][] sources;
    int[] starts;
    int[] lengths;
    int size; // elements appended with add

    Ranges(int capacity) {
      sources = new byte[capacity][];
      starts = new int[capacity];
      lengths = new int[capacity];
    }

    void ensure(int capacity) {
      if (capacity > starts.length) {
        int grown = Math.max(capacity, starts.length + (starts.length >> 1));
        sources = Arrays.copyOf(sources, grown);
        starts = Arrays.copyOf(starts, grown);
        lengths = Arrays.copyOf(lengths, grown);
      }
    }

    void set(int index, byte[] source, int start, int length) {
      sources[index] = source;
      starts[index] = start;
      lengths[index] = length;
    }

    void setRun(int first, byte[] source, int[] runStarts, int[] runLengths, int count) {
      Arrays.fill(sources, first, first + count, source);
      System.arraycopy(runStarts, 0, starts, first, count);
      System.arraycopy(runLengths, 0, lengths, first, count);
    }

    /** Append one element (list children: header keys and values, tags). */
    void add(byte[] source, int start, int length) {
      ensure(size + 1);
      set(size++, source, start, length);
    }

    Vectors.Bytes vector(org.apache.spark.sql.types.DataType type, int rows) {
      return new Vectors.Bytes(type, sources, starts, lengths, rows);
    }
  }
}
