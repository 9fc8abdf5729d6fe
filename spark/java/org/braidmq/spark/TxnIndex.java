package org.braidmq.spark;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;

/**
 * Kafka transactions in the log, read-only: {@code core.log.txnindex.TxnOutcomes}, from the
 * same transaction index and by the same rules (docs/storage.md, "The Kafka transaction
 * index").
 *
 * <p>A Kafka transactional batch is an ordinary batch frame of its partition, stored when
 * produced; a COMMIT or ABORT marker is a control batch frame there. The first batch of a
 * producer's transaction in a partition and every control batch are also indexed in queue
 * {@code __kafka_txns/0}, in log order. So a transactional batch of producer P in partition
 * (T, Q) at commit-log position X belongs to the transaction that the first control batch of P
 * in (T, Q) after X ends (committed or aborted); none yet: still open. A partition's Last
 * Stable Offset is the first offset of its earliest open transaction, else its next offset.
 *
 * <p>What tells the frames apart is the Kafka RecordBatch v2 header in the body (big-endian):
 * magic (offset 16) 2, attributes (21, int16) bit 4 transactional, bit 5 control, producer id
 * (43, int64); a control batch's one record (from 61, never compressed) has a key of version
 * int16 and type int16: 0 ABORT, 1 COMMIT.
 *
 * <p>Read once, then only what was indexed since ({@link #refresh}). Not thread-safe: one per
 * task, or the stream's driver.
 */
final class TxnIndex {
  static final String TOPIC = "__kafka_txns";
  static final int QUEUE = 0;

  // The RecordBatch v2 header fields read here (big-endian; KafkaBatch has the whole layout).
  private static final int MAGIC_AT = 16;
  private static final int ATTRIBUTES_AT = 21;
  private static final int PRODUCER_ID_AT = 43;
  private static final int RECORDS_AT = 61;
  private static final int TRANSACTIONAL = 0x10; // attributes bit 4
  private static final int CONTROL = 0x20; // attributes bit 5
  private static final int CONTROL_ABORT = 0; // ControlRecordType
  private static final int CONTROL_COMMIT = 1;
  /**
   * How far past a frame's store time its entry in the partition is looked for (it is written in
   * the same append, with the same time; a margin costs a few entries read): txnindex.py's.
   */
  static final long STORE_MS_SLACK = 1000;

  enum Outcome {
    COMMITTED,
    ABORTED,
    OPEN
  }

  /** The transaction fields of a transactional or control batch. */
  static final class BatchTxn {
    final long producerId;
    final boolean control;
    /** A control batch's marker: TRUE COMMIT, FALSE ABORT, null another type (or not one). */
    final Boolean commit;

    BatchTxn(long producerId, boolean control, Boolean commit) {
      this.producerId = producerId;
      this.control = control;
      this.commit = commit;
    }
  }

  /** The control batches of one producer in one partition: positions ascending, markers. */
  private static final class Markers {
    long[] positions = new long[4];
    boolean[] commits = new boolean[4];
    int size;

    void add(long position, boolean commit) {
      int at = Arrays.binarySearch(positions, 0, size, position);
      if (at >= 0) {
        return;
      }
      at = -at - 1;
      if (size == positions.length) {
        positions = Arrays.copyOf(positions, size * 2);
        commits = Arrays.copyOf(commits, size * 2);
      }
      System.arraycopy(positions, at, positions, at + 1, size - at);
      System.arraycopy(commits, at, commits, at + 1, size - at);
      positions[at] = position;
      commits[at] = commit;
      size++;
    }

    /** The first marker after {@code position}: its index, or {@code size} if none. */
    int after(long position) {
      int at = Arrays.binarySearch(positions, 0, size, position);
      return at >= 0 ? at + 1 : -at - 1;
    }
  }

  // "topic\0queue\0producer id" -> its control batches
  private final Map<String, Markers> markers = new HashMap<>();
  // "topic\0queue" -> producer id -> {position, store ms} of its open transaction's first batch
  private final Map<String, Map<Long, long[]>> open = new HashMap<>();
  private long nextEntry = -1; // in the transaction index: where to go on

  /** Add what the transaction index got since the last call. */
  void refresh(LogDir log) throws IOException {
    QueueIndex index = log.queueIndex(TOPIC, QUEUE);
    if (index == null) {
      return;
    }
    // Read after the partitions the caller looked at: see lastStableOffset.
    index.refresh();
    index.skipDeletedHead(log.startPosition());
    long entry = Math.max(nextEntry, index.startEntry);
    for (; entry < index.nextEntry; entry++) {
      long position = index.position(entry);
      if (position < log.startPosition()) {
        continue; // deleted by retention
      }
      if (log.pastSeal(position)) {
        continue; // a fenced owner's, skipped as LogReader.read skips it
      }
      byte[] frame = log.readFrame(position); // CRC-checked, as LogReader.read
      int bodyLength = (int) Layout.u32(frame, Layout.BODY_LEN);
      if (Layout.u32(frame, Layout.BODY_LEN) == Layout.NULL_LENGTH) {
        continue;
      }
      BatchTxn info = batchTxn(frame, frame.length - bodyLength, bodyLength);
      if (info == null) {
        continue;
      }
      String partition = partitionKey(frame);
      if (!info.control) {
        open.computeIfAbsent(partition, key -> new HashMap<>())
            .putIfAbsent(
                info.producerId, new long[] {position, Layout.i64(frame, Layout.STORE_MS)});
      } else if (info.commit != null) {
        markers
            .computeIfAbsent(partition + '\0' + info.producerId, key -> new Markers())
            .add(position, info.commit);
        Map<Long, long[]> opened = open.get(partition);
        long[] began = opened == null ? null : opened.get(info.producerId);
        if (began != null && began[0] < position) {
          opened.remove(info.producerId);
        }
      }
    }
    nextEntry = entry;
  }

  private static String partitionKey(byte[] frame) {
    int topicLength = Layout.u16(frame, Layout.TOPIC_LEN);
    String topic = new String(frame, Layout.HEADER_SIZE, topicLength, StandardCharsets.UTF_8);
    return topic + '\0' + Layout.u32(frame, Layout.QUEUE);
  }

  /** The outcome of producer {@code producerId}'s transactional batch at {@code position}. */
  Outcome outcome(String topic, long queue, long producerId, long position) {
    Markers found = markers.get(topic + '\0' + queue + '\0' + producerId);
    if (found == null) {
      return Outcome.OPEN;
    }
    int at = found.after(position);
    if (at == found.size) {
      return Outcome.OPEN;
    }
    return found.commits[at] ? Outcome.COMMITTED : Outcome.ABORTED;
  }

  /**
   * The Last Stable Offset of a queue: the first offset of its earliest open transaction, else
   * its next offset. Call {@link #refresh} after {@code log}'s queue was read (a new {@link
   * LogDir}, or refreshed): a frame's partition entry is written just before its
   * transaction-index entry, so then the only entry whose transaction-index entry may not be
   * visible yet is the partition's last, and it is looked at here (one frame read).
   */
  long lastStableOffset(LogDir log, String topic, int queue) throws IOException {
    long[] bounds = log.queueBounds(topic, queue);
    long stable = bounds[1];
    QueueIndex index = log.queueIndex(topic, queue);
    Map<Long, long[]> opened = open.get(topic + '\0' + queue);
    if (opened != null) {
      for (long[] began : opened.values()) {
        long offset = offsetAt(index, began[0], began[1]);
        if (offset >= 0) {
          stable = Math.min(stable, offset);
        }
      }
    }
    if (index == null || index.nextEntry <= index.startEntry || bounds[1] == 0) {
      return stable;
    }
    long last = index.nextEntry - 1;
    long firstOffset = index.firstOffset(last);
    long position = index.position(last);
    // A last entry past its segment's seal is a fenced owner's: LogReader.read returns nothing.
    if (firstOffset < stable && position >= log.startPosition() && !log.pastSeal(position)) {
      byte[] frame = log.readFrame(position);
      int flags = Layout.u16(frame, Layout.FLAGS);
      if ((flags & Layout.FLAG_BATCH) != 0 && (flags & Layout.FLAG_LINK) == 0) {
        long bodyLength = Layout.u32(frame, Layout.BODY_LEN);
        if (bodyLength != Layout.NULL_LENGTH) {
          BatchTxn info = batchTxn(frame, frame.length - (int) bodyLength, (int) bodyLength);
          if (info != null
              && !info.control
              && outcome(topic, queue, info.producerId, position) == Outcome.OPEN) {
            stable = firstOffset;
          }
        }
      }
    }
    return stable;
  }

  /**
   * The queue offset of {@code index}'s entry for the frame at {@code position}, appended at
   * {@code storeMs}; -1 if there is none. Entries' store times grow with their offsets, and an
   * appended frame's entry has the frame's store time: binary search by time, then a short scan
   * (txnindex.offset_at).
   */
  static long offsetAt(QueueIndex index, long position, long storeMs) {
    if (index == null) {
      return -1;
    }
    for (long entry = Math.max(index.entryForTime(storeMs), index.startEntry);
        entry < index.nextEntry;
        entry++) {
      if (index.position(entry) == position) {
        return index.firstOffset(entry);
      }
      if (index.storeMs(entry) > storeMs + STORE_MS_SLACK) {
        return -1;
      }
    }
    return -1;
  }

  /**
   * The transaction fields of the Kafka batch at {@code body} in {@code frame}; null when it is
   * neither transactional nor a control batch (or not a v2 batch): txnindex.batch_txn.
   */
  static BatchTxn batchTxn(byte[] frame, int body, int length) {
    if (length < RECORDS_AT || frame[body + MAGIC_AT] != 2) {
      return null;
    }
    ByteBuffer header = ByteBuffer.wrap(frame, body, length).order(ByteOrder.BIG_ENDIAN);
    int attributes = header.getShort(body + ATTRIBUTES_AT);
    if ((attributes & (TRANSACTIONAL | CONTROL)) == 0) {
      return null;
    }
    long producerId = header.getLong(body + PRODUCER_ID_AT);
    boolean control = (attributes & CONTROL) != 0;
    Boolean commit = null;
    if (control) {
      commit = controlMarker(frame, body, length);
    }
    return new BatchTxn(producerId, control, commit);
  }

  /**
   * A control batch's marker, read in place (never compressed): the record's length,
   * attributes int8, timestamp delta, offset delta, key length, then the key's version int16 and
   * type int16. TRUE COMMIT, FALSE ABORT, null another type or a malformed record.
   */
  private static Boolean controlMarker(byte[] frame, int body, int length) {
    int[] at = {body + RECORDS_AT};
    int end = body + length;
    try {
      varint(frame, at, end); // record length
      at[0] += 1; // record attributes
      varint(frame, at, end); // timestamp delta
      varint(frame, at, end); // offset delta
      long keyLength = varint(frame, at, end);
      if (keyLength < 4 || at[0] + 4 > end) {
        return null;
      }
      int kind = (short) (((frame[at[0] + 2] & 0xFF) << 8) | (frame[at[0] + 3] & 0xFF));
      if (kind == CONTROL_COMMIT) {
        return Boolean.TRUE;
      }
      if (kind == CONTROL_ABORT) {
        return Boolean.FALSE;
      }
      return null;
    } catch (IllegalArgumentException malformed) {
      return null;
    }
  }

  /** A zigzag varint at {@code at[0]}, which moves past it. */
  private static long varint(byte[] data, int[] at, int end) {
    long raw = 0;
    for (int shift = 0; shift <= 63; shift += 7) {
      if (at[0] >= end) {
        throw new IllegalArgumentException("varint past the batch");
      }
      int b = data[at[0]++] & 0xFF;
      raw |= (long) (b & 0x7F) << shift;
      if ((b & 0x80) == 0) {
        return (raw >>> 1) ^ -(raw & 1);
      }
    }
    throw new IllegalArgumentException("varint too long");
  }
}
