package org.braidmq.spark;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.util.Arrays;
import java.util.zip.GZIPInputStream;

/**
 * The records of a Kafka RecordBatch (magic 2) stored as one batch record: what {@code
 * core.log.batches.unpack_batch} gets from aiokafka's codec, decoded here without a copy when
 * the batch is not compressed (each record's key, value and headers are ranges of the frame).
 *
 * <pre>
 * offset size field (big-endian)
 *  0     8    base offset (patched on fetch; offsets here are deltas)
 *  8     4    batch length
 * 12     4    partition leader epoch
 * 16     1    magic (2)
 * 17     4    CRC-32C over [21, end) (not checked: the frame's CRC32C covers the whole body)
 * 21     2    attributes: bits 0-2 codec, bit 3 log-append time, bit 5 control batch
 * 23     4    last offset delta
 * 27     8    first timestamp
 * 35     8    max timestamp
 * 43     8    producer id
 * 51     2    producer epoch
 * 53     4    base sequence
 * 57     4    record count
 * 61          records, compressed as a whole by the codec (gzip, snappy, lz4 frame, zstd)
 * record: length varint, attributes varint, timestamp delta varlong, offset delta varint,
 *         key (varint length, -1 null), value (likewise), header count varint,
 *         headers (key: varint length + UTF-8, value: varint length, -1 null)
 * </pre>
 *
 * Varints are zigzag-encoded (protobuf's sint). A malformed batch is an {@link IOException}
 * naming its commit-log position, as aiokafka's CorruptRecordException fails the Python
 * reader. Reused across batches of a task; not thread-safe.
 */
final class KafkaBatch {
  static final int ATTRIBUTES = 21;
  static final int FIRST_TIMESTAMP = 27;
  static final int MAX_TIMESTAMP = 35;
  static final int RECORD_COUNT = 57;
  static final int RECORDS = 61;
  static final int CODEC_MASK = 0x07;
  static final int LOG_APPEND_TIME = 0x08;
  static final int CONTROL = 0x20;
  static final int CODEC_NONE = 0;
  static final int CODEC_GZIP = 1;
  static final int CODEC_SNAPPY = 2;
  static final int CODEC_LZ4 = 3;
  static final int CODEC_ZSTD = 4;
  /** xerial snappy-java's stream header: magic, then version 1 and compatible version 1. */
  private static final byte[] XERIAL_MAGIC = {(byte) 0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0};

  private static final int XERIAL_HEADER = 16;

  // The decoded records: the arrays they point into and, per record, where each field lies.
  byte[] data;
  int count;
  int[] offsetDeltas = new int[16];
  long[] timestamps = new long[16];
  int[] keyStarts = new int[16];
  int[] keyLengths = new int[16]; // -1: null
  int[] valueStarts = new int[16];
  int[] valueLengths = new int[16];
  int[] headerFirst = new int[16]; // index into the header arrays
  int[] headerCounts = new int[16];
  int headers;
  int[] headerKeyStarts = new int[16];
  int[] headerKeyLengths = new int[16];
  int[] headerValueStarts = new int[16];
  int[] headerValueLengths = new int[16]; // a null header value reads as empty (batches.py)

  private int cursor;
  private int limit;
  private long position;

  /**
   * Decode the batch at {@code body[start, start + length)} (of the frame at commit-log
   * {@code position}); a control batch has no records.
   */
  void decode(byte[] body, int start, int length, long position) throws IOException {
    this.position = position;
    count = 0;
    headers = 0;
    if (length < RECORDS) {
      throw corrupt("shorter than a RecordBatch header (" + length + " bytes)");
    }
    int attributes = u16be(body, start + ATTRIBUTES);
    if ((attributes & CONTROL) != 0) {
      return;
    }
    long firstTimestamp = i64be(body, start + FIRST_TIMESTAMP);
    long maxTimestamp = i64be(body, start + MAX_TIMESTAMP);
    boolean appendTime = (attributes & LOG_APPEND_TIME) != 0;
    int records = i32be(body, start + RECORD_COUNT);
    int codec = attributes & CODEC_MASK;
    if (codec == CODEC_NONE) {
      data = body;
      cursor = start + RECORDS;
      limit = start + length;
    } else {
      data = decompress(codec, body, start + RECORDS, length - RECORDS);
      cursor = 0;
      limit = data.length;
    }
    if (records < 0 || records > limit - cursor) { // a record takes at least 7 bytes
      throw corrupt("record count " + records + " does not fit in " + (limit - cursor) + " bytes");
    }
    ensure(records);
    // The record loop below reads its varints inline, with the position in a local: one- and
    // two-byte varints (nearly every field: lengths below 8 KiB, small deltas) are decoded in
    // place, anything else (longer, truncated, malformed) by varint()/varlong() from the
    // cursor field, which report it as before. Through varint() for every field this loop was
    // ~40% of a task's CPU reading the value column of Kafka-batched records (perf), 13.8 ns a
    // record against 10.4 inline (one 10,000-record batch decoded repeatedly, thread CPU).
    final byte[] d = data;
    final int end = limit;
    final int[] deltas = offsetDeltas;
    final long[] times = timestamps;
    final int[] keyAt = keyStarts;
    final int[] keySize = keyLengths;
    final int[] valueAt = valueStarts;
    final int[] valueSize = valueLengths;
    int c = cursor;
    int b;
    for (int i = 0; i < records; i++) {
      int size;
      if (c + 1 < end && (b = d[c]) >= 0) {
        size = (b >>> 1) ^ -(b & 1);
        c++;
      } else if (c + 1 < end && d[c + 1] >= 0) {
        int raw = (d[c] & 0x7F) | (d[c + 1] << 7);
        size = (raw >>> 1) ^ -(raw & 1);
        c += 2;
      } else {
        size = varintAt(c);
        c = cursor;
      }
      int recordStart = c;
      // attributes: unused (aiokafka reads them as a varint too)
      if (c < end && d[c] >= 0) {
        c++;
      } else {
        varintAt(c);
        c = cursor;
      }
      long timestampDelta;
      if (c + 1 < end && (b = d[c]) >= 0) {
        timestampDelta = (b >>> 1) ^ -(b & 1);
        c++;
      } else if (c + 1 < end && d[c + 1] >= 0) {
        int raw = (d[c] & 0x7F) | (d[c + 1] << 7);
        timestampDelta = (raw >>> 1) ^ -(raw & 1);
        c += 2;
      } else {
        cursor = c;
        timestampDelta = varlong();
        c = cursor;
      }
      times[i] = appendTime ? maxTimestamp : firstTimestamp + timestampDelta;
      int delta;
      if (c + 1 < end && (b = d[c]) >= 0) {
        delta = (b >>> 1) ^ -(b & 1);
        c++;
      } else if (c + 1 < end && d[c + 1] >= 0) {
        int raw = (d[c] & 0x7F) | (d[c + 1] << 7);
        delta = (raw >>> 1) ^ -(raw & 1);
        c += 2;
      } else {
        delta = varintAt(c);
        c = cursor;
      }
      deltas[i] = delta;
      int keyLength;
      if (c + 1 < end && (b = d[c]) >= 0) {
        keyLength = (b >>> 1) ^ -(b & 1);
        c++;
      } else if (c + 1 < end && d[c + 1] >= 0) {
        int raw = (d[c] & 0x7F) | (d[c + 1] << 7);
        keyLength = (raw >>> 1) ^ -(raw & 1);
        c += 2;
      } else {
        keyLength = varintAt(c);
        c = cursor;
      }
      keyAt[i] = c;
      if (keyLength < 0) {
        keyLength = -1;
      } else if (keyLength > end - c) {
        throw corrupt("a field of " + keyLength + " bytes runs past the batch");
      } else {
        c += keyLength;
      }
      keySize[i] = keyLength;
      int valueLength;
      if (c + 1 < end && (b = d[c]) >= 0) {
        valueLength = (b >>> 1) ^ -(b & 1);
        c++;
      } else if (c + 1 < end && d[c + 1] >= 0) {
        int raw = (d[c] & 0x7F) | (d[c + 1] << 7);
        valueLength = (raw >>> 1) ^ -(raw & 1);
        c += 2;
      } else {
        valueLength = varintAt(c);
        c = cursor;
      }
      valueAt[i] = c;
      if (valueLength < 0) {
        valueLength = -1;
      } else if (valueLength > end - c) {
        throw corrupt("a field of " + valueLength + " bytes runs past the batch");
      } else {
        c += valueLength;
      }
      valueSize[i] = valueLength;
      int headerCount;
      if (c + 1 < end && (b = d[c]) >= 0) {
        headerCount = (b >>> 1) ^ -(b & 1);
        c++;
      } else if (c + 1 < end && d[c + 1] >= 0) {
        int raw = (d[c] & 0x7F) | (d[c + 1] << 7);
        headerCount = (raw >>> 1) ^ -(raw & 1);
        c += 2;
      } else {
        headerCount = varintAt(c);
        c = cursor;
      }
      if (headerCount < 0) {
        throw corrupt("invalid number of record headers " + headerCount);
      }
      headerFirst[i] = headers;
      headerCounts[i] = headerCount;
      if (headerCount > 0) {
        cursor = c;
        readHeaders(headerCount);
        c = cursor;
      }
      if (c - recordStart != size) {
        throw corrupt(
            "invalid record size: expected " + size + " bytes, read " + (c - recordStart));
      }
      count++;
    }
    cursor = c;
    if (cursor != limit) {
      throw corrupt((limit - cursor) + " unconsumed bytes after all records");
    }
  }

  /** The varint at {@code at}, read by {@link #varint}: the cursor is then past it. */
  private int varintAt(int at) throws IOException {
    cursor = at;
    return (int) varint();
  }

  /** A record's headers, from the cursor on (the field path: headers are rare). */
  private void readHeaders(int headerCount) throws IOException {
    for (int h = 0; h < headerCount; h++) {
      ensureHeaders(headers + 1);
      int keyLength = bytesField();
      if (keyLength < 0) {
        throw corrupt("invalid negative header key size " + keyLength);
      }
      headerKeyStarts[headers] = cursor - keyLength;
      headerKeyLengths[headers] = keyLength;
      int valueLength = bytesField();
      headerValueStarts[headers] = cursor - Math.max(0, valueLength);
      headerValueLengths[headers] = Math.max(0, valueLength);
      headers++;
    }
  }

  private void ensure(int records) {
    if (records > offsetDeltas.length) {
      int grown = Math.max(records, offsetDeltas.length * 2);
      offsetDeltas = Arrays.copyOf(offsetDeltas, grown);
      timestamps = Arrays.copyOf(timestamps, grown);
      keyStarts = Arrays.copyOf(keyStarts, grown);
      keyLengths = Arrays.copyOf(keyLengths, grown);
      valueStarts = Arrays.copyOf(valueStarts, grown);
      valueLengths = Arrays.copyOf(valueLengths, grown);
      headerFirst = Arrays.copyOf(headerFirst, grown);
      headerCounts = Arrays.copyOf(headerCounts, grown);
    }
  }

  private void ensureHeaders(int wanted) {
    if (wanted > headerKeyStarts.length) {
      int grown = Math.max(wanted, headerKeyStarts.length * 2);
      headerKeyStarts = Arrays.copyOf(headerKeyStarts, grown);
      headerKeyLengths = Arrays.copyOf(headerKeyLengths, grown);
      headerValueStarts = Arrays.copyOf(headerValueStarts, grown);
      headerValueLengths = Arrays.copyOf(headerValueLengths, grown);
    }
  }

  /** A varint length and that many bytes (skipped); the length, -1 for null. */
  private int bytesField() throws IOException {
    long length = varint();
    if (length < 0) {
      return -1;
    }
    if (length > limit - cursor) {
      throw corrupt("a field of " + length + " bytes runs past the batch");
    }
    cursor += (int) length;
    return (int) length;
  }

  private long varint() throws IOException {
    long value = varlong();
    if (value != (int) value) {
      throw corrupt("varint out of range");
    }
    return value;
  }

  /** An unsigned LEB128 number, zigzag-decoded. */
  private long varlong() throws IOException {
    long raw = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (cursor >= limit) {
        throw corrupt("truncated varint");
      }
      byte b = data[cursor++];
      raw |= (long) (b & 0x7F) << shift;
      if (b >= 0) {
        return (raw >>> 1) ^ -(raw & 1);
      }
    }
    throw corrupt("varint longer than 10 bytes");
  }

  private IOException corrupt(String why) {
    return new IOException(
        "Kafka batch in the frame at commit-log position " + position + ": " + why);
  }

  private byte[] decompress(int codec, byte[] body, int start, int length) throws IOException {
    try {
      switch (codec) {
        case CODEC_GZIP:
          return readAll(new GZIPInputStream(new ByteArrayInputStream(body, start, length)));
        case CODEC_SNAPPY:
          return snappy(body, start, length);
        case CODEC_LZ4:
          return readAll(
              new net.jpountz.lz4.LZ4FrameInputStream(
                  new ByteArrayInputStream(body, start, length)));
        case CODEC_ZSTD:
          return readAll(
              new com.github.luben.zstd.ZstdInputStreamNoFinalizer(
                  new ByteArrayInputStream(body, start, length)));
        default:
          throw corrupt("unknown compression codec " + codec);
      }
    } catch (IOException | RuntimeException error) {
      if (error.getMessage() != null && error.getMessage().startsWith("Kafka batch")) {
        throw error;
      }
      throw new IOException(
          "Kafka batch in the frame at commit-log position " + position + ": " + error, error);
    }
  }

  private static byte[] readAll(InputStream stream) throws IOException {
    try (InputStream in = stream) {
      return in.readAllBytes();
    }
  }

  /**
   * Snappy as Kafka producers write it: xerial's framing (a 16-byte header, then blocks, each a
   * big-endian length and a raw snappy block), or one raw block (aiokafka's snappy_decode).
   */
  private static byte[] snappy(byte[] body, int start, int length) throws IOException {
    boolean xerial =
        length > XERIAL_HEADER
            && Arrays.equals(
                body, start, start + XERIAL_MAGIC.length, XERIAL_MAGIC, 0, XERIAL_MAGIC.length)
            && i32be(body, start + 8) == 1
            && i32be(body, start + 12) == 1;
    if (!xerial) {
      int size = org.xerial.snappy.Snappy.uncompressedLength(body, start, length);
      byte[] out = new byte[size];
      org.xerial.snappy.Snappy.uncompress(body, start, length, out, 0);
      return out;
    }
    ByteArrayOutputStream out = new ByteArrayOutputStream(length * 3);
    int at = start + XERIAL_HEADER;
    int end = start + length;
    while (at < end) {
      int block = i32be(body, at);
      at += 4;
      int size = org.xerial.snappy.Snappy.uncompressedLength(body, at, block);
      byte[] piece = new byte[size];
      org.xerial.snappy.Snappy.uncompress(body, at, block, piece, 0);
      out.write(piece, 0, size);
      at += block;
    }
    return out.toByteArray();
  }

  static int u16be(byte[] data, int at) {
    return ((data[at] & 0xFF) << 8) | (data[at + 1] & 0xFF);
  }

  static int i32be(byte[] data, int at) {
    return ((data[at] & 0xFF) << 24)
        | ((data[at + 1] & 0xFF) << 16)
        | ((data[at + 2] & 0xFF) << 8)
        | (data[at + 3] & 0xFF);
  }

  static long i64be(byte[] data, int at) {
    return ((long) i32be(data, at) << 32) | (i32be(data, at + 4) & 0xFFFFFFFFL);
  }
}
