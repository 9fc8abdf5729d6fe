package org.braidmq.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.nio.MappedByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * Decodes the slices of one Spark partition into {@code ColumnarBatch}es: {@code
 * spark.decode.read_range}, the same rows in the same order, from the same checks.
 *
 * <p>Index entries are read a chunk at a time (at most {@link #CHUNK_ENTRIES} entries, within
 * one index file, and {@link #BATCH_BYTES} of frames), accepted only while their offsets are
 * contiguous (a torn tail entry being written is left for a later read). Each chunk's frames are
 * copied out of the segment mapping into one array (one bulk copy per stretch of adjacent
 * frames), checked (length and magic against the entry, then CRC32C per frame), and decoded from
 * that copy: a plain frame is one row whose binary and string columns point into the copy; a
 * Kafka batch is one row per record it holds (only those the queue took, see {@link
 * #BATCH_SELECT_HEADER}); a LINK is followed to the frame it moved and read with the LINK's
 * headers laid over its own (in system topics LINKs are read as stored).
 *
 * <p>Slices of a cluster's data root name their shard: each shard's directory is opened (once
 * per task) when its first slice is read, and its rows carry the shard's number.
 *
 * <p>Not thread-safe: one per task, with its own {@link LogDir}s.
 */
final class RangeDecoder {
  /** Entries per chunk, and rows per batch handed to Spark (decode.DEFAULT_BATCH_ROWS). */
  static final int CHUNK_ENTRIES = 32_768;

  /** Bytes of frames per chunk and of keys and values per batch (decode.DEFAULT_BATCH_BYTES). */
  static final long BATCH_BYTES = 8L << 20;

  /**
   * On a Kafka batch record indexed into queues that take only some of its records: JSON
   * {@code {"<topic>\u0000<queue>": [offset deltas]}} (core.delivery.message).
   */
  static final String BATCH_SELECT_HEADER = "x-braid-batch-select";

  /**
   * Frame copies kept for reuse once Spark is done with every batch pointing into them. Two
   * cover a steady read: the chunk being decoded, and the one the batch Spark holds points into.
   */
  static final int SPARE_COPIES = 2;

  private static final byte[][] PROTOCOL_BYTES = protocolBytes();
  private static final ObjectMapper JSON = new ObjectMapper();

  private final String path;
  // The log of each shard read so far (Slice.NO_SHARD: a single-node directory), and of the
  // current slice's shard.
  private final Map<Integer, LogDir> logs = new HashMap<>();
  private LogDir log;
  private final Slice[] slices;
  private final int[] columns;
  private final boolean verifyChecksums;
  private final boolean dedupe;
  private final boolean includeAborted;
  // The Kafka transactions' outcomes per shard: read when its first transactional batch is met.
  private final Map<Integer, TxnIndex> transactionsByShard = new HashMap<>();
  private TxnIndex transactions;
  private final KafkaBatch kafka = new KafkaBatch();
  private final ArrayDeque<BatchBuilder> ready = new ArrayDeque<>();
  // Builders whose batch Spark is done with (it asked for the next one): their arrays are
  // reused, as Parquet's reader reuses its vectors, rather than allocated per batch (for every
  // column of a Kafka batch's rows that was ~150 bytes a row of garbage).
  private final ArrayDeque<BatchBuilder> spare = new ArrayDeque<>();
  private BatchBuilder handedOut;
  private BatchBuilder builder;
  private long buildersStarted; // the number of the last builder started: see BatchBuilder.number
  // The arrays chunks' frames are copied into, reused rather than allocated per chunk: a new
  // array of up to 8 MiB is a humongous object for G1, zeroed with a memset and faulted in page
  // by page (perf over the value column of 5M Kafka-batched records: ~8% of the decoding
  // thread's CPU in memset alone), and those allocations started 22 of 36 young collections
  // over 7 reads (-Xlog:gc; 6 of 36 with reuse). A copy is reused once Spark is done with the
  // last batch that may point into it.
  private final ArrayDeque<CopyInUse> copiesInUse = new ArrayDeque<>();
  private final ArrayDeque<byte[]> spareCopies = new ArrayDeque<>();

  // Where decoding stands: the slice, its queue and the next index entry to read.
  private int sliceNumber = -1;
  private Slice slice;
  private byte[] topicBytes;
  private boolean followLinks;
  private QueueIndex index;
  private long start;
  private long end;
  private long entry;
  private long stopEntry;
  private long expectedOffset;
  private boolean sliceDone = true;

  // The chunk being decoded: its entries' fields.
  private long[] positions = new long[0];
  private int[] sizes = new int[0];
  private long[] counts = new long[0];
  private long[] storeMs = new long[0];
  private long[] firstOffsets = new long[0];

  RangeDecoder(
      String path,
      Slice[] slices,
      int[] columns,
      boolean verify,
      boolean dedupe,
      boolean includeAborted) {
    this.path = path;
    this.slices = slices;
    this.columns = columns;
    this.verifyChecksums = verify;
    this.dedupe = dedupe;
    this.includeAborted = includeAborted;
    this.builder = new BatchBuilder(columns);
  }

  /**
   * The next batch, or null when every slice is read. The batch returned before this one is no
   * longer valid (Spark's contract for columnar reads: it is done with a batch when it asks for
   * the next).
   */
  ColumnarBatch next() throws IOException {
    if (handedOut != null) {
      freeCopies(handedOut.number);
      handedOut.reset();
      spare.add(handedOut);
      handedOut = null;
    }
    while (ready.isEmpty()) {
      if (sliceDone) {
        if (!nextSlice()) {
          if (builder.rows > 0) {
            ready.add(builder);
            builder = newBuilder();
          }
          break;
        }
        continue;
      }
      decodeChunk();
    }
    handedOut = ready.poll();
    return handedOut == null ? null : handedOut.build();
  }

  private BatchBuilder newBuilder() {
    BatchBuilder reused = spare.poll();
    BatchBuilder started = reused != null ? reused : new BatchBuilder(columns);
    started.number = ++buildersStarted;
    return started;
  }

  /** A chunk's copy and the number of the last builder that may point into it. */
  private static final class CopyInUse {
    final byte[] bytes;
    final long lastBuilder;

    CopyInUse(byte[] bytes, long lastBuilder) {
      this.bytes = bytes;
      this.lastBuilder = lastBuilder;
    }
  }

  /**
   * Spark is done with builder {@code number} and every one before it (they are handed out in
   * number order): the copies only they point into can be reused.
   */
  private void freeCopies(long number) {
    while (!copiesInUse.isEmpty() && copiesInUse.peek().lastBuilder <= number) {
      byte[] freed = copiesInUse.poll().bytes;
      if (spareCopies.size() < SPARE_COPIES) {
        spareCopies.add(freed);
      }
    }
  }

  /**
   * An array of at least {@code size} bytes to copy frames into: a spare one when it is large
   * enough, else a new one rounded up to a power of two (chunk sizes vary a little, up to
   * {@link #BATCH_BYTES}: rounded, one size fits the next).
   */
  private byte[] takeCopy(int size) {
    byte[] reused = spareCopies.poll();
    if (reused != null && reused.length >= size) {
      return reused;
    }
    int rounded = size <= 1 || size > (1 << 30) ? size : Integer.highestOneBit(size - 1) << 1;
    return new byte[rounded];
  }

  private boolean nextSlice() throws IOException {
    while (++sliceNumber < slices.length) {
      slice = slices[sliceNumber];
      topicBytes = slice.topic.getBytes(StandardCharsets.UTF_8);
      followLinks = !Layout.isSystemTopic(slice.topic);
      log = logs.get(slice.shard);
      if (log == null) {
        log = new LogDir(DataRoot.shardDir(path, slice.shard));
        logs.put(slice.shard, log);
      }
      transactions = transactionsByShard.get(slice.shard);
      index = log.queueIndex(slice.topic, slice.queue);
      if (index == null) {
        continue;
      }
      if (slice.end > index.nextOffset) {
        index.refresh(); // what a running broker appended since planning
        log.refreshSeals(); // after the index: see LogDir.refresh
      }
      long[] bounds = log.queueBounds(slice.topic, slice.queue);
      start = Math.max(slice.start, bounds[0]);
      end = Math.min(slice.end, bounds[1]);
      if (start >= end) {
        continue;
      }
      entry = index.entryForOffset(start);
      stopEntry = index.nextEntry;
      expectedOffset = -1;
      sliceDone = false;
      return true;
    }
    return false;
  }

  /** One chunk of entries of the current slice (read_range's loop body). */
  private void decodeChunk() throws IOException {
    if (entry >= stopEntry) {
      sliceDone = true;
      return;
    }
    int count =
        (int) Math.min(CHUNK_ENTRIES, Math.min(stopEntry - entry, index.entriesLeftInFile(entry)));
    readEntries(count);
    long cumulative = 0;
    for (int i = 0; i < count; i++) {
      cumulative += sizes[i] & 0xFFFFFFFFL;
      if (cumulative > BATCH_BYTES) {
        count = Math.max(1, i); // a single larger frame still makes a chunk
        break;
      }
    }
    int keep = count;
    for (int i = 0; i < count; i++) {
      long chained =
          i == 0 ? (expectedOffset < 0 ? firstOffsets[0] : expectedOffset)
              : firstOffsets[i - 1] + counts[i - 1];
      if (firstOffsets[i] != chained || sizes[i] < Layout.HEADER_SIZE || counts[i] <= 0) {
        keep = i;
        break;
      }
    }
    int inRange = 0;
    while (inRange < keep && firstOffsets[inRange] < end) {
      inRange++;
    }
    if (inRange == 0) {
      sliceDone = true;
      return;
    }
    // Before decoding: decodeEntries may drop entries past a seal from the chunk's arrays.
    expectedOffset = firstOffsets[inRange - 1] + counts[inRange - 1];
    decodeEntries(inRange);
    entry += inRange;
    if (inRange < count) {
      sliceDone = true;
    }
  }

  private void readEntries(int count) {
    if (positions.length < count) {
      positions = new long[count];
      sizes = new int[count];
      counts = new long[count];
      storeMs = new long[count];
      firstOffsets = new long[count];
    }
    MappedByteBuffer file = index.fileOf(entry);
    int at = index.slot(entry);
    for (int i = 0; i < count; i++, at += Layout.ENTRY_SIZE) {
      positions[i] = file.getLong(at + Layout.ENTRY_POSITION);
      sizes[i] = file.getInt(at + Layout.ENTRY_SIZE_FIELD);
      counts[i] = file.getInt(at + Layout.ENTRY_RECORD_COUNT) & 0xFFFFFFFFL;
      storeMs[i] = file.getLong(at + Layout.ENTRY_STORE_MS);
      firstOffsets[i] = file.getLong(at + Layout.ENTRY_FIRST_OFFSET);
    }
  }

  /** Entries [0, count) of the chunk, run by run of entries in one segment. */
  private void decodeEntries(int count) throws IOException {
    if (!log.seals().isEmpty()) {
      count = dropSealed(count);
    }
    long segmentSize = log.segmentSize;
    int low = 0;
    while (low < count) {
      long number = positions[low] / segmentSize;
      int high = low + 1;
      while (high < count && positions[high] / segmentSize == number) {
        high++;
      }
      decodeRun(number, low, high);
      low = high;
    }
  }

  /**
   * Entries [0, count) of the chunk without those at or past their segment's seal, moved up in
   * place; returns how many are left ({@code decode._within_seals}). A fenced old owner's
   * entries sit at the end of their segment's run, and their first offsets continue the chain,
   * so the contiguity check keeps them: they are dropped here, as LogReader skips them.
   */
  private int dropSealed(int count) {
    int kept = 0;
    for (int i = 0; i < count; i++) {
      if (log.pastSeal(positions[i])) {
        continue;
      }
      if (kept != i) {
        positions[kept] = positions[i];
        sizes[kept] = sizes[i];
        counts[kept] = counts[i];
        storeMs[kept] = storeMs[i];
        firstOffsets[kept] = firstOffsets[i];
      }
      kept++;
    }
    return kept;
  }

  private void decodeRun(long number, int low, int high) throws IOException {
    long base = number * log.segmentSize;
    long furthest = 0;
    for (int i = low; i < high; i++) {
      furthest = Math.max(furthest, positions[i] - base + (sizes[i] & 0xFFFFFFFFL));
    }
    MappedByteBuffer segment = log.segment(number, furthest);
    if (segment == null) {
      return; // deleted by retention while we read: what it held is gone
    }
    int length = segment.capacity();
    for (int i = low; i < high; i++) {
      if (positions[i] - base + (sizes[i] & 0xFFFFFFFFL) > length) {
        throw Corruption.at(positions[i], "index entry points past the segment");
      }
    }
    // Every frame of the run copied end to end: one bulk copy per stretch of adjacent frames.
    long total = 0;
    for (int i = low; i < high; i++) {
      total += sizes[i];
    }
    byte[] copy = takeCopy((int) total);
    int[] starts = new int[high - low];
    int filled = 0;
    int i = low;
    while (i < high) {
      int from = (int) (positions[i] - base);
      int stretch = sizes[i];
      starts[i - low] = filled;
      int j = i + 1;
      while (j < high && positions[j] == positions[j - 1] + sizes[j - 1]) {
        starts[j - low] = filled + stretch;
        stretch += sizes[j];
        j++;
      }
      segment.get(from, copy, filled, stretch);
      filled += stretch;
      i = j;
    }
    for (int k = low; k < high; k++) {
      int at = starts[k - low];
      if (Layout.i32(copy, at + Layout.MAGIC) != Layout.RECORD_MAGIC
          || Layout.i32(copy, at + Layout.TOTAL_SIZE) != sizes[k]) {
        throw Corruption.at(positions[k], "frame does not match its index entry");
      }
    }
    if (verifyChecksums) {
      for (int k = low; k < high; k++) {
        if (!Frames.crcMatches(copy, starts[k - low], sizes[k])) {
          throw Corruption.at(positions[k], "crc32c mismatch");
        }
      }
    }
    int special = Layout.FLAG_BATCH | (followLinks ? Layout.FLAG_LINK : 0);
    for (int k = low; k < high; k++) {
      int at = starts[k - low];
      if ((Layout.u16(copy, at + Layout.FLAGS) & special) != 0) {
        decodeOneByOne(copy, at, k);
      } else {
        decodePlain(copy, at, k);
      }
      if (builder.rows >= CHUNK_ENTRIES || builder.payloadBytes >= BATCH_BYTES) {
        ready.add(builder);
        builder = newBuilder();
      }
    }
    copiesInUse.add(new CopyInUse(copy, builder.number));
  }

  // -- one frame, one row -------------------------------------------------------------------

  /** A frame's variable fields: where each starts in the array holding the frame. */
  private static final class Fields {
    int topic;
    int topicLength;
    int subject;
    int subjectLength;
    int key;
    int keyLength; // -1: null
    int headers;
    int headersLength;
    int tags;
    int tagsLength;
    int client;
    int clientLength;
    int address;
    int addressLength;
    int dests;
    int destsLength;
    int body;
    int bodyLength; // -1: null

    void locate(byte[] frame, int at) {
      topic = at + Layout.HEADER_SIZE;
      topicLength = Layout.u16(frame, at + Layout.TOPIC_LEN);
      subject = topic + topicLength;
      subjectLength = Layout.u16(frame, at + Layout.SUBJECT_LEN);
      long rawKey = Layout.u32(frame, at + Layout.KEY_LEN);
      keyLength = rawKey == Layout.NULL_LENGTH ? -1 : (int) rawKey;
      key = subject + subjectLength;
      headers = key + Math.max(0, keyLength);
      headersLength = Layout.i32(frame, at + Layout.HEADERS_LEN);
      tags = headers + headersLength;
      tagsLength = Layout.u16(frame, at + Layout.TAGS_LEN);
      client = tags + tagsLength;
      clientLength = Layout.u16(frame, at + Layout.CLIENT_LEN);
      address = client + clientLength;
      addressLength = Layout.u16(frame, at + Layout.ADDRESS_LEN);
      dests = address + addressLength;
      destsLength = Layout.u16(frame, at + Layout.DESTS_LEN);
      long rawBody = Layout.u32(frame, at + Layout.BODY_LEN);
      bodyLength = rawBody == Layout.NULL_LENGTH ? -1 : (int) rawBody;
      body = at + Layout.i32(frame, at + Layout.TOTAL_SIZE) - Math.max(0, bodyLength);
    }
  }

  private final Fields fields = new Fields();

  private void decodePlain(byte[] frame, int at, int k) {
    Fields f = fields;
    f.locate(frame, at);
    if (dedupe && (isCopy(frame, at) || !isHome(frame, at, f))) {
      return;
    }
    BatchBuilder b = builder;
    boolean[] want = b.wanted;
    int row = b.addRow();
    if (want[Schema.VALUE]) {
      b.setBytes(Schema.VALUE, row, frame, f.body, f.bodyLength);
    }
    if (want[Schema.KEY]) {
      b.setBytes(Schema.KEY, row, frame, f.key, f.keyLength);
    }
    b.payloadBytes += Math.max(0, f.bodyLength) + Math.max(0, f.keyLength);
    if (want[Schema.HEADERS]) {
      addFrameHeaders(row, frame, f, null);
    }
    common(row, frame, at, f, k, firstOffsets[k], Layout.i64(frame, at + Layout.BORN_MS), positions[k]);
  }

  /** The columns every row of a frame shares (a Kafka batch's records too). */
  private void common(
      int row, byte[] frame, int at, Fields f, int k, long offset, long timestampMs, long position) {
    BatchBuilder b = builder;
    boolean[] want = b.wanted;
    if (want[Schema.TOPIC]) {
      b.setBytes(Schema.TOPIC, row, topicBytes, 0, topicBytes.length);
    }
    if (want[Schema.QUEUE]) {
      b.setInt(Schema.QUEUE, row, slice.queue);
    }
    if (want[Schema.OFFSET]) {
      b.setLong(Schema.OFFSET, row, offset);
    }
    if (want[Schema.TIMESTAMP]) {
      b.setLong(Schema.TIMESTAMP, row, timestampMs * 1000);
    }
    if (want[Schema.TAGS]) {
      int first = b.tagValues.size;
      int end = f.tags + f.tagsLength;
      for (int cursor = f.tags; cursor < end; ) {
        int length = frame[cursor] & 0xFF;
        b.tagValues.add(frame, cursor + 1, length);
        cursor += 1 + length;
      }
      b.setTags(row, first, b.tagValues.size - first);
    }
    if (want[Schema.PROTOCOL]) {
      byte[] name = PROTOCOL_BYTES[frame[at + Layout.PROTOCOL] & 0xFF];
      b.setBytes(Schema.PROTOCOL, row, name, 0, name.length);
    }
    if (want[Schema.STORE_TIMESTAMP]) {
      b.setLong(Schema.STORE_TIMESTAMP, row, storeMs[k] * 1000);
    }
    if (want[Schema.SUBJECT]) {
      b.setBytes(Schema.SUBJECT, row, frame, f.subject, f.subjectLength);
    }
    if (want[Schema.ORIGIN_ADDRESS]) {
      b.setBytes(Schema.ORIGIN_ADDRESS, row, frame, f.address, f.addressLength);
    }
    if (want[Schema.CLIENT_ID]) {
      b.setBytes(Schema.CLIENT_ID, row, frame, f.client, f.clientLength);
    }
    if (want[Schema.FLAGS]) {
      b.setInt(Schema.FLAGS, row, Layout.u16(frame, at + Layout.FLAGS));
    }
    if (want[Schema.POSITION]) {
      b.setLong(Schema.POSITION, row, position);
    }
    if (want[Schema.SHARD]) {
      b.setInt(Schema.SHARD, row, slice.shard);
    }
  }

  /**
   * The frame's headers for a row: in order, then (for a moved record) those of the LINKs laid
   * over them, outer LINK first: a header the LINK has replaces the record's of that name.
   */
  private void addFrameHeaders(int row, byte[] frame, Fields f, Map<String, byte[][]> overlay) {
    BatchBuilder b = builder;
    int first = b.headerKeys.size;
    int end = f.headers + f.headersLength;
    for (int cursor = f.headers; cursor < end; ) {
      int nameLength = Layout.u16(frame, cursor);
      int name = cursor + 2;
      int valueLength = Layout.i32(frame, name + nameLength);
      int value = name + nameLength + 4;
      cursor = value + valueLength;
      if (overlay == null
          || !overlay.containsKey(new String(frame, name, nameLength, StandardCharsets.UTF_8))) {
        b.headerKeys.add(frame, name, nameLength);
        b.headerValues.add(frame, value, valueLength);
      }
    }
    addOverlay(overlay);
    b.setHeaders(row, first, b.headerKeys.size - first);
  }

  private void addOverlay(Map<String, byte[][]> overlay) {
    if (overlay == null) {
      return;
    }
    for (byte[][] header : overlay.values()) {
      builder.headerKeys.add(header[0], 0, header[0].length);
      builder.headerValues.add(header[1], 0, header[1].length);
    }
  }

  /** Whether the frame is a copy of a record whose home is another shard of the cluster. */
  private static boolean isCopy(byte[] frame, int at) {
    return (Layout.u16(frame, at + Layout.FLAGS) & Layout.FLAG_COPY) != 0;
  }

  /** Whether this queue is the frame's home: the first queue it was indexed into. */
  private boolean isHome(byte[] frame, int at, Fields f) {
    if (f.destsLength == 0) {
      return Layout.i32(frame, at + Layout.QUEUE) == slice.queue
          && Arrays.equals(
              frame, f.topic, f.topic + f.topicLength, topicBytes, 0, topicBytes.length);
    }
    int topicLength = Layout.u16(frame, f.dests);
    int queue = Layout.i32(frame, f.dests + 2);
    int topic = f.dests + 6;
    return queue == slice.queue
        && Arrays.equals(frame, topic, topic + topicLength, topicBytes, 0, topicBytes.length);
  }

  // -- record by record: Kafka batches, moved records ---------------------------------------

  private void decodeOneByOne(byte[] copy, int at, int k) throws IOException {
    byte[] frame = copy;
    long position = positions[k];
    Map<String, byte[][]> overlay = null;
    if (followLinks && (Layout.u16(frame, at + Layout.FLAGS) & Layout.FLAG_LINK) != 0) {
      overlay = new LinkedHashMap<>();
      int depth = 0;
      do {
        if (depth++ == Layout.MAX_LINK_DEPTH) {
          throw Corruption.at(position, "LINK chain too deep");
        }
        Fields link = new Fields();
        link.locate(frame, at);
        collectHeaders(frame, link, overlay);
        if (link.bodyLength != Layout.LINK_TARGET_SIZE) {
          throw new IOException(
              "the LINK at commit-log position "
                  + position
                  + " moves "
                  + Math.max(0, link.bodyLength) / Layout.LINK_TARGET_SIZE
                  + " records; an indexed LINK moves one");
        }
        position = Layout.i64(frame, link.body);
        frame = log.readFrame(position); // CRC-checked, as LogReader reads a LINK's target
        at = 0;
      } while ((Layout.u16(frame, Layout.FLAGS) & Layout.FLAG_LINK) != 0);
      if (overlay.isEmpty()) {
        overlay = null;
      }
    }
    Fields f = new Fields();
    f.locate(frame, at);
    if (dedupe && (isCopy(frame, at) || !isHome(frame, at, f))) {
      return;
    }
    int flags = Layout.u16(frame, at + Layout.FLAGS);
    long firstOffset = firstOffsets[k];
    if ((flags & Layout.FLAG_BATCH) == 0) {
      if (start <= firstOffset && firstOffset < end) {
        BatchBuilder b = builder;
        int row = b.addRow();
        if (b.wanted[Schema.VALUE]) {
          b.setBytes(Schema.VALUE, row, frame, f.body, f.bodyLength);
        }
        if (b.wanted[Schema.KEY]) {
          b.setBytes(Schema.KEY, row, frame, f.key, f.keyLength);
        }
        b.payloadBytes += Math.max(0, f.bodyLength) + Math.max(0, f.keyLength);
        if (b.wanted[Schema.HEADERS]) {
          addFrameHeaders(row, frame, f, overlay);
        }
        common(row, frame, at, f, k, firstOffset, Layout.i64(frame, at + Layout.BORN_MS), position);
      }
      return;
    }
    if ((flags & Layout.FLAG_TXN_CONTROL) != 0 || f.bodyLength < 0) {
      return; // a Kafka transaction marker is no record
    }
    if (followLinks && !transactionShows(frame, at, f, position)) {
      return;
    }
    int[] selected = batchSelection(frame, f);
    kafka.decode(frame, f.body, f.bodyLength, position);
    KafkaBatch records = kafka;
    BatchBuilder b = builder;
    if (selected == null && !b.wanted[Schema.HEADERS] && allInRange(records, firstOffset)) {
      addRecords(records, frame, at, f, k, firstOffset, position);
      return;
    }
    for (int r = 0; r < records.count; r++) {
      int delta = records.offsetDeltas[r];
      if (selected != null && Arrays.binarySearch(selected, delta) < 0) {
        continue; // routed elsewhere: this queue never received it
      }
      long offset = firstOffset + delta;
      if (offset < start || offset >= end) {
        continue;
      }
      int row = b.addRow();
      if (b.wanted[Schema.VALUE]) {
        b.setBytes(Schema.VALUE, row, records.data, records.valueStarts[r], records.valueLengths[r]);
      }
      if (b.wanted[Schema.KEY]) {
        b.setBytes(Schema.KEY, row, records.data, records.keyStarts[r], records.keyLengths[r]);
      }
      b.payloadBytes += Math.max(0, records.valueLengths[r]) + Math.max(0, records.keyLengths[r]);
      if (b.wanted[Schema.HEADERS]) {
        int first = b.headerKeys.size;
        int last = records.headerFirst[r] + records.headerCounts[r];
        for (int h = records.headerFirst[r]; h < last; h++) {
          int nameLength = records.headerKeyLengths[h];
          if (overlay != null
              && overlay.containsKey(
                  new String(
                      records.data, records.headerKeyStarts[h], nameLength, StandardCharsets.UTF_8))) {
            continue;
          }
          b.headerKeys.add(records.data, records.headerKeyStarts[h], nameLength);
          b.headerValues.add(
              records.data, records.headerValueStarts[h], records.headerValueLengths[h]);
        }
        addOverlay(overlay);
        b.setHeaders(row, first, b.headerKeys.size - first);
      }
      common(row, frame, at, f, k, offset, records.timestamps[r], position);
    }
  }

  /** Whether every record of the batch is in the slice's offsets [start, end). */
  private boolean allInRange(KafkaBatch records, long firstOffset) {
    int[] deltas = records.offsetDeltas;
    for (int r = 0; r < records.count; r++) {
      long offset = firstOffset + deltas[r];
      if (offset < start || offset >= end) {
        return false;
      }
    }
    return true;
  }

  /**
   * Every record of a Kafka batch as rows, when the queue took them all and no header column
   * is asked for (no LINK overlay to apply): keys and values added column by column, a bulk
   * copy of the batch's ranges, rather than row by row (the row loop was the reader's second
   * largest cost on the value column after decoding the batch).
   */
  private void addRecords(
      KafkaBatch records, byte[] frame, int at, Fields f, int k, long firstOffset, long position) {
    BatchBuilder b = builder;
    int n = records.count;
    int first = b.addRows(n);
    if (b.wanted[Schema.VALUE]) {
      b.setBytesRun(Schema.VALUE, first, records.data, records.valueStarts, records.valueLengths, n);
    }
    if (b.wanted[Schema.KEY]) {
      b.setBytesRun(Schema.KEY, first, records.data, records.keyStarts, records.keyLengths, n);
    }
    long payload = 0;
    int[] valueLengths = records.valueLengths;
    int[] keyLengths = records.keyLengths;
    for (int r = 0; r < n; r++) {
      payload += Math.max(0, valueLengths[r]) + Math.max(0, keyLengths[r]);
    }
    b.payloadBytes += payload;
    if (b.wantsCommon) {
      int[] deltas = records.offsetDeltas;
      long[] timestamps = records.timestamps;
      for (int r = 0; r < n; r++) {
        common(first + r, frame, at, f, k, firstOffset + deltas[r], timestamps[r], position);
      }
    }
  }

  /**
   * Whether a Kafka batch's records are rows: not a control batch; a transactional one once
   * committed (aborted too with includeAborted), never while open. The outcomes are read when
   * the first transactional batch is met, and again once when a batch's transaction looks open
   * (the planner saw the log later than this task may have): decode._transaction_shows.
   */
  private boolean transactionShows(byte[] frame, int at, Fields f, long position)
      throws IOException {
    TxnIndex.BatchTxn info = TxnIndex.batchTxn(frame, f.body, f.bodyLength);
    if (info == null) {
      return true;
    }
    if (info.control) {
      return false;
    }
    String topic = new String(frame, f.topic, f.topicLength, StandardCharsets.UTF_8);
    long queue = Layout.u32(frame, at + Layout.QUEUE);
    TxnIndex.Outcome state = TxnIndex.Outcome.OPEN;
    if (transactions != null) {
      state = transactions.outcome(topic, queue, info.producerId, position);
    }
    if (state == TxnIndex.Outcome.OPEN) {
      if (transactions == null) {
        transactions = new TxnIndex();
        transactionsByShard.put(slice.shard, transactions);
      }
      transactions.refresh(log);
      state = transactions.outcome(topic, queue, info.producerId, position);
    }
    return state == TxnIndex.Outcome.COMMITTED
        || (includeAborted && state == TxnIndex.Outcome.ABORTED);
  }

  /** The frame's headers, into {@code overlay}, a name already there kept (outer LINK wins). */
  private static void collectHeaders(byte[] frame, Fields f, Map<String, byte[][]> overlay) {
    int end = f.headers + f.headersLength;
    for (int cursor = f.headers; cursor < end; ) {
      int nameLength = Layout.u16(frame, cursor);
      int name = cursor + 2;
      int valueLength = Layout.i32(frame, name + nameLength);
      int value = name + nameLength + 4;
      cursor = value + valueLength;
      overlay.putIfAbsent(
          new String(frame, name, nameLength, StandardCharsets.UTF_8),
          new byte[][] {
            Arrays.copyOfRange(frame, name, name + nameLength),
            Arrays.copyOfRange(frame, value, value + valueLength),
          });
    }
  }

  /**
   * The offset deltas of a batch record's records that this queue took, sorted, from its
   * {@link #BATCH_SELECT_HEADER}; null when it took them all.
   */
  private int[] batchSelection(byte[] frame, Fields f) throws IOException {
    int end = f.headers + f.headersLength;
    byte[] wanted = BATCH_SELECT_HEADER.getBytes(StandardCharsets.UTF_8);
    for (int cursor = f.headers; cursor < end; ) {
      int nameLength = Layout.u16(frame, cursor);
      int name = cursor + 2;
      int valueLength = Layout.i32(frame, name + nameLength);
      int value = name + nameLength + 4;
      cursor = value + valueLength;
      if (Arrays.equals(frame, name, name + nameLength, wanted, 0, wanted.length)) {
        JsonNode chosen =
            JSON.readTree(frame, value, valueLength).get(slice.topic + '\u0000' + slice.queue);
        if (chosen == null) {
          return null;
        }
        List<Integer> deltas = new ArrayList<>();
        chosen.forEach(delta -> deltas.add(delta.asInt()));
        int[] sorted = deltas.stream().mapToInt(Integer::intValue).toArray();
        Arrays.sort(sorted);
        return sorted;
      }
    }
    return null;
  }

  private static byte[][] protocolBytes() {
    byte[][] names = new byte[256][];
    for (int code = 0; code < names.length; code++) {
      names[code] = Layout.protocolName(code).getBytes(StandardCharsets.UTF_8);
    }
    return names;
  }
}
