package org.braidmq.spark;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;

/**
 * The on-disk layouts the reader mirrors, byte for byte, from {@code core/log}: the commit-log
 * frame ({@code core/log/record.py}), the per-queue index entry ({@code
 * core/log/consumequeue.py}) and the variable fields inside a frame. The Python modules are the
 * reference; a layout change there is made here in the same commit (no compatibility shims: the
 * format has not shipped). Little-endian throughout. Stateless and thread-safe.
 */
final class Layout {
  private Layout() {}

  // -- the frame: 72-byte header, then topic, subject, key, headers, tags, client, address,
  // destinations, body (core/log/record.py).
  static final int TOTAL_SIZE = 0; // u32, the whole frame
  static final int MAGIC = 4; // u32
  static final int CRC = 8; // u32 CRC32C over bytes [CRC_START, total_size)
  static final int FLAGS = 12; // u16
  static final int PROTOCOL = 14; // u8
  static final int STORE_MS = 16; // i64, broker append time
  static final int BORN_MS = 24; // i64, producer time
  static final int DELIVER_AT_MS = 32; // i64
  static final int QUEUE = 40; // u32
  static final int RECORD_COUNT = 44; // u32
  static final int TOPIC_LEN = 48; // u16
  static final int SUBJECT_LEN = 50; // u16
  static final int KEY_LEN = 52; // u32, NULL_LENGTH for a null key
  static final int HEADERS_LEN = 56; // u32
  static final int TAGS_LEN = 60; // u16
  static final int CLIENT_LEN = 62; // u16
  static final int ADDRESS_LEN = 64; // u16
  static final int DESTS_LEN = 66; // u16
  static final int BODY_LEN = 68; // u32, NULL_LENGTH for a null body
  static final int HEADER_SIZE = 72;
  /** The checksum covers everything after size, magic and the CRC itself. */
  static final int CRC_START = 12;

  static final int RECORD_MAGIC = 0xB4A1D001;
  /** Fills the end of a segment that could not hold the next frame; never indexed. */
  static final int BLANK_MAGIC = 0xB4A1D0FF;
  static final long NULL_LENGTH = 0xFFFFFFFFL;

  static final int FLAG_BATCH = 0x0001; // the body is one Kafka RecordBatch
  static final int FLAG_LINK = 0x0008; // the body points at earlier frames
  static final int FLAG_TXN_CONTROL = 0x0040; // a Kafka transaction marker
  static final int FLAG_COPY = 0x0100; // a copy of a record whose home is another shard

  /** Protocol byte to name (core.log.record.PROTOCOL_NAMES); "unknown" for any other. */
  static final String[] PROTOCOL_NAMES = {"internal", "kafka", "amqp", "mqtt"};

  static final String UNKNOWN_PROTOCOL = "unknown";

  // -- a LINK body: repeated u64 position, u32 size.
  static final int LINK_TARGET_SIZE = 12;
  /** A record moved more often than this is refused as corrupt (core.log.reader). */
  static final int MAX_LINK_DEPTH = 64;

  // -- the index entry: 40 bytes (core/log/consumequeue.py).
  static final int ENTRY_SIZE = 40;
  static final int ENTRY_POSITION = 0; // u64 commit-log position of the frame
  static final int ENTRY_SIZE_FIELD = 8; // u32 frame size; 0 marks the end of written entries
  static final int ENTRY_RECORD_COUNT = 12; // u32
  static final int ENTRY_STORE_MS = 24; // i64 when the entry was written (monotonic per queue)
  static final int ENTRY_FIRST_OFFSET = 32; // u64 queue offset of its first record

  /** Internal topics start with this (core.log.names.SYSTEM_PREFIX). */
  static final String SYSTEM_PREFIX = "__";

  private static final VarHandle INT_LE =
      MethodHandles.byteArrayViewVarHandle(int[].class, ByteOrder.LITTLE_ENDIAN);
  private static final VarHandle LONG_LE =
      MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
  private static final VarHandle SHORT_LE =
      MethodHandles.byteArrayViewVarHandle(short[].class, ByteOrder.LITTLE_ENDIAN);

  static int u16(byte[] data, int at) {
    return (short) SHORT_LE.get(data, at) & 0xFFFF;
  }

  static int i32(byte[] data, int at) {
    return (int) INT_LE.get(data, at);
  }

  static long u32(byte[] data, int at) {
    return (int) INT_LE.get(data, at) & 0xFFFFFFFFL;
  }

  static long i64(byte[] data, int at) {
    return (long) LONG_LE.get(data, at);
  }

  static boolean isSystemTopic(String topic) {
    return topic.startsWith(SYSTEM_PREFIX);
  }

  static String protocolName(int code) {
    return code < PROTOCOL_NAMES.length ? PROTOCOL_NAMES[code] : UNKNOWN_PROTOCOL;
  }
}
