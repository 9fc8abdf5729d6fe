package org.braidmq.spark;

import java.util.zip.CRC32C;

/**
 * Checks on frames copied out of a segment. {@link CRC32C} is a HotSpot intrinsic (SSE4.2
 * {@code crc32} instructions): one call per frame costs about as much as the copy, so frames
 * are checked one by one, not chained as the Python decoder must (docs/spark.md). Stateless
 * and thread-safe.
 */
final class Frames {
  private Frames() {}

  /** Whether the frame at {@code data[at, at + size)} matches its stored CRC32C. */
  static boolean crcMatches(byte[] data, int at, int size) {
    CRC32C crc = new CRC32C();
    crc.update(data, at + Layout.CRC_START, size - Layout.CRC_START);
    return (int) crc.getValue() == Layout.i32(data, at + Layout.CRC);
  }
}
