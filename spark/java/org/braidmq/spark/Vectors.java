package org.braidmq.spark;

import java.util.Arrays;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarArray;
import org.apache.spark.sql.vectorized.ColumnarMap;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Read-only column vectors over what the decoder produced, handed to Spark in a {@code
 * ColumnarBatch}. Binary and string values are not copied into the vector: each row points at
 * its bytes in the frames copied out of a segment (or in a decompressed Kafka batch), so a
 * value is copied once, by Spark, when it builds its rows ({@code getUTF8String} does not even
 * do that). A batch's vectors stay valid until the reader moves to the next batch, Spark's
 * contract for columnar reads. Not thread-safe (one task reads one batch at a time).
 */
final class Vectors {
  private Vectors() {}

  /** What every vector here does not hold. */
  private abstract static class ReadOnly extends ColumnVector {
    ReadOnly(DataType type) {
      super(type);
    }

    @Override
    public void close() {}

    @Override
    public boolean getBoolean(int rowId) {
      throw unsupported();
    }

    @Override
    public byte getByte(int rowId) {
      throw unsupported();
    }

    @Override
    public short getShort(int rowId) {
      throw unsupported();
    }

    @Override
    public int getInt(int rowId) {
      throw unsupported();
    }

    @Override
    public long getLong(int rowId) {
      throw unsupported();
    }

    @Override
    public float getFloat(int rowId) {
      throw unsupported();
    }

    @Override
    public double getDouble(int rowId) {
      throw unsupported();
    }

    @Override
    public ColumnarArray getArray(int rowId) {
      throw unsupported();
    }

    @Override
    public ColumnarMap getMap(int ordinal) {
      throw unsupported();
    }

    @Override
    public Decimal getDecimal(int rowId, int precision, int scale) {
      throw unsupported();
    }

    @Override
    public UTF8String getUTF8String(int rowId) {
      throw unsupported();
    }

    @Override
    public byte[] getBinary(int rowId) {
      throw unsupported();
    }

    @Override
    public ColumnVector getChild(int ordinal) {
      throw unsupported();
    }

    private UnsupportedOperationException unsupported() {
      return new UnsupportedOperationException(getClass().getSimpleName() + " of " + type);
    }
  }

  /** A non-null long per row: offsets, positions, timestamps (microseconds). */
  static final class Longs extends ReadOnly {
    private final long[] values;

    Longs(DataType type, long[] values) {
      super(type);
      this.values = values;
    }

    @Override
    public boolean hasNull() {
      return false;
    }

    @Override
    public int numNulls() {
      return 0;
    }

    @Override
    public boolean isNullAt(int rowId) {
      return false;
    }

    @Override
    public long getLong(int rowId) {
      return values[rowId];
    }
  }

  /** A non-null int per row: queue numbers, flags. */
  static final class Ints extends ReadOnly {
    private final int[] values;

    Ints(DataType type, int[] values) {
      super(type);
      this.values = values;
    }

    @Override
    public boolean hasNull() {
      return false;
    }

    @Override
    public int numNulls() {
      return 0;
    }

    @Override
    public boolean isNullAt(int rowId) {
      return false;
    }

    @Override
    public int getInt(int rowId) {
      return values[rowId];
    }
  }

  /**
   * The shard column: a shard number per row, {@link Slice#NO_SHARD} (a single-node directory)
   * read as null.
   */
  static final class Shards extends ReadOnly {
    private final int[] values;
    private final int rows;
    private int nulls = -1; // counted when first asked

    Shards(int[] values, int rows) {
      super(DataTypes.IntegerType);
      this.values = values;
      this.rows = rows;
    }

    @Override
    public boolean hasNull() {
      return numNulls() > 0;
    }

    @Override
    public int numNulls() {
      if (nulls < 0) {
        int count = 0;
        for (int row = 0; row < rows; row++) {
          count += values[row] == Slice.NO_SHARD ? 1 : 0;
        }
        nulls = count;
      }
      return nulls;
    }

    @Override
    public boolean isNullAt(int rowId) {
      return values[rowId] == Slice.NO_SHARD;
    }

    @Override
    public int getInt(int rowId) {
      return values[rowId];
    }
  }

  /**
   * Binary or string values, each a range of some byte array: {@code sources[row]} from {@code
   * starts[row]}, {@code lengths[row]} bytes; a length of -1 is null.
   */
  static final class Bytes extends ReadOnly {
    private final byte[][] sources;
    private final int[] starts;
    private final int[] lengths;
    private final int nulls;

    Bytes(DataType type, byte[][] sources, int[] starts, int[] lengths, int rows) {
      super(type);
      this.sources = sources;
      this.starts = starts;
      this.lengths = lengths;
      int count = 0;
      for (int row = 0; row < rows; row++) {
        if (lengths[row] < 0) {
          count++;
        }
      }
      this.nulls = count;
    }

    @Override
    public boolean hasNull() {
      return nulls > 0;
    }

    @Override
    public int numNulls() {
      return nulls;
    }

    @Override
    public boolean isNullAt(int rowId) {
      return lengths[rowId] < 0;
    }

    @Override
    public UTF8String getUTF8String(int rowId) {
      int length = lengths[rowId];
      return length < 0 ? null : UTF8String.fromBytes(sources[rowId], starts[rowId], length);
    }

    @Override
    public byte[] getBinary(int rowId) {
      int length = lengths[rowId];
      if (length < 0) {
        return null;
      }
      int start = starts[rowId];
      return Arrays.copyOfRange(sources[rowId], start, start + length);
    }
  }

  /** A list per row (never null: no headers is an empty list): elements of a child vector. */
  static final class Lists extends ReadOnly {
    private final int[] starts;
    private final int[] counts;
    private final ColumnVector elements;

    Lists(DataType type, int[] starts, int[] counts, ColumnVector elements) {
      super(type);
      this.starts = starts;
      this.counts = counts;
      this.elements = elements;
    }

    @Override
    public boolean hasNull() {
      return false;
    }

    @Override
    public int numNulls() {
      return 0;
    }

    @Override
    public boolean isNullAt(int rowId) {
      return false;
    }

    @Override
    public ColumnarArray getArray(int rowId) {
      return new ColumnarArray(elements, starts[rowId], counts[rowId]);
    }

    @Override
    public ColumnVector getChild(int ordinal) {
      return elements;
    }
  }

  /** A struct per row (never null), its fields child vectors: a header's key and value. */
  static final class Structs extends ReadOnly {
    private final ColumnVector[] fields;

    Structs(DataType type, ColumnVector[] fields) {
      super(type);
      this.fields = fields;
    }

    @Override
    public boolean hasNull() {
      return false;
    }

    @Override
    public int numNulls() {
      return 0;
    }

    @Override
    public boolean isNullAt(int rowId) {
      return false;
    }

    @Override
    public ColumnVector getChild(int ordinal) {
      return fields[ordinal];
    }
  }
}
