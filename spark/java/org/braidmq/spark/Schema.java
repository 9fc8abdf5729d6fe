package org.braidmq.spark;

import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * The columns of the {@code braid} format: {@code spark/schema.py}'s, in the same order, with
 * the same types, every one nullable. Column ids are positions in {@link #FULL}. Stateless and
 * thread-safe.
 */
final class Schema {
  private Schema() {}

  static final int TOPIC = 0;
  static final int QUEUE = 1;
  static final int OFFSET = 2;
  static final int TIMESTAMP = 3;
  static final int KEY = 4;
  static final int VALUE = 5;
  static final int HEADERS = 6;
  static final int TAGS = 7;
  static final int PROTOCOL = 8;
  static final int STORE_TIMESTAMP = 9;
  static final int SUBJECT = 10;
  static final int ORIGIN_ADDRESS = 11;
  static final int CLIENT_ID = 12;
  static final int FLAGS = 13;
  static final int POSITION = 14;
  static final int SHARD = 15;
  static final int COUNT = 16;

  static final StructType HEADER =
      new StructType(
          new StructField[] {
            DataTypes.createStructField("key", DataTypes.StringType, true),
            DataTypes.createStructField("value", DataTypes.BinaryType, true),
          });

  static final StructType FULL =
      new StructType(
          new StructField[] {
            field("topic", DataTypes.StringType),
            field("queue", DataTypes.IntegerType),
            field("offset", DataTypes.LongType),
            field("timestamp", DataTypes.TimestampType),
            field("key", DataTypes.BinaryType),
            field("value", DataTypes.BinaryType),
            field("headers", DataTypes.createArrayType(HEADER, true)),
            field("tags", DataTypes.createArrayType(DataTypes.StringType, true)),
            field("protocol", DataTypes.StringType),
            field("store_timestamp", DataTypes.TimestampType),
            field("subject", DataTypes.StringType),
            field("origin_address", DataTypes.StringType),
            field("client_id", DataTypes.StringType),
            field("flags", DataTypes.IntegerType),
            field("position", DataTypes.LongType),
            field("shard", DataTypes.IntegerType),
          });

  private static StructField field(String name, DataType type) {
    return DataTypes.createStructField(name, type, true);
  }

  /**
   * The column ids a schema asks for, in its order: any subset of the columns, each with its
   * type (a user-specified schema, or what Spark pruned the scan to). Errors word for word as
   * {@code spark.schema.columns_of}.
   */
  static int[] columnsOf(StructType schema) {
    int[] ids = new int[schema.fields().length];
    for (int i = 0; i < ids.length; i++) {
      StructField wanted = schema.fields()[i];
      int id = indexOf(wanted.name());
      if (id < 0) {
        throw new IllegalArgumentException(
            "braid has no column '" + wanted.name() + "'; columns: " + names());
      }
      DataType type = FULL.fields()[id].dataType();
      if (!sameType(type, wanted.dataType())) {
        throw new IllegalArgumentException(
            "column '"
                + wanted.name()
                + "' is "
                + type.simpleString()
                + ", not "
                + wanted.dataType().simpleString());
      }
      ids[i] = id;
    }
    return ids;
  }

  /** Types equal but for nullability (Spark may hand back a pruned schema marked otherwise). */
  private static boolean sameType(DataType expected, DataType given) {
    if (expected instanceof ArrayType && given instanceof ArrayType) {
      return sameType(
          ((ArrayType) expected).elementType(), ((ArrayType) given).elementType());
    }
    if (expected instanceof StructType && given instanceof StructType) {
      StructField[] left = ((StructType) expected).fields();
      StructField[] right = ((StructType) given).fields();
      if (left.length != right.length) {
        return false;
      }
      for (int i = 0; i < left.length; i++) {
        if (!left[i].name().equals(right[i].name())
            || !sameType(left[i].dataType(), right[i].dataType())) {
          return false;
        }
      }
      return true;
    }
    return expected.equals(given);
  }

  static int indexOf(String name) {
    String[] all = FULL.fieldNames();
    for (int i = 0; i < all.length; i++) {
      if (all[i].equals(name)) {
        return i;
      }
    }
    return -1;
  }

  private static String names() {
    return "['" + String.join("', '", FULL.fieldNames()) + "']";
  }

  /** The schema of the given column ids, in that order. */
  static StructType of(int[] ids) {
    StructField[] fields = new StructField[ids.length];
    for (int i = 0; i < ids.length; i++) {
      fields[i] = FULL.fields()[ids[i]];
    }
    return new StructType(fields);
  }
}
