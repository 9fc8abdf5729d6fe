package org.braidmq.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.Serializable;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.time.format.DateTimeParseException;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.regex.Pattern;

/**
 * The options of the {@code braid} format and the planning they drive: {@code
 * spark/options.py}, line for line, so both readers select the same queues, the same offset
 * ranges and the same partitions, and refuse the same malformed options with the same words.
 * Immutable; Serializable (the stream keeps it on the driver only, but Spark may serialize a
 * scan).
 */
final class ReadOptions implements Serializable {
  private static final long serialVersionUID = 1L;

  /** Kafka's Spark source uses -2 and -1 inside a JSON offset map for earliest and latest. */
  static final long EARLIEST = -2;

  static final long LATEST = -1;
  /** About 400 MB of 100-byte records: a failed task is cheap to redo (options.py). */
  static final long DEFAULT_MAX_RECORDS_PER_PARTITION = 4_000_000;
  /** Below this many records a task's fixed cost outweighs what it parallelises. */
  static final long MIN_RECORDS_PER_PARTITION = 100_000;

  final String path;
  final List<String> topics; // null: every topic
  final Pattern topicPattern; // null: every topic
  final Set<Integer> queues; // null: not selected this way
  final Set<String> topicQueues; // "topic\0queue"; null: not selected this way
  final OffsetSpec starting;
  final OffsetSpec ending;
  final Long startTimeMs;
  final Long endTimeMs;
  final boolean includeSystem;
  final long maxRecordsPerPartition;
  final int minPartitions;
  final Long maxRecordsPerTrigger;
  final boolean verifyChecksums;
  final boolean dedupe;
  final boolean includeAborted;

  private ReadOptions(Map<String, String> lowered, boolean streaming, Integer defaultMinPartitions) {
    String givenPath = get(lowered, "path");
    if (givenPath == null) {
      throw new IllegalArgumentException(
          "option 'path' (the broker's data directory) is required");
    }
    path = givenPath;
    String topicList = firstOf(get(lowered, "topics"), get(lowered, "topic"));
    List<String> parsedTopics = null;
    if (topicList != null) {
      parsedTopics = new ArrayList<>();
      for (String topic : topicList.split(",", -1)) {
        if (!topic.strip().isEmpty()) {
          parsedTopics.add(topic.strip());
        }
      }
    }
    topics = parsedTopics;
    String pattern = get(lowered, "topicPattern");
    topicPattern = pattern != null ? Pattern.compile(pattern) : null;
    Set<Integer> plain = null;
    Set<String> perTopic = null;
    String queueList = get(lowered, "queues");
    if (queueList != null) {
      plain = new HashSet<>();
      perTopic = new HashSet<>();
      for (String raw : queueList.split(",", -1)) {
        String item = raw.strip();
        if (item.isEmpty()) {
          continue;
        }
        int colon = item.lastIndexOf(':');
        String topic = colon < 0 ? "" : item.substring(0, colon);
        String number = item.substring(colon + 1);
        if (!isDigits(number)) {
          throw new IllegalArgumentException(
              "queues: '" + item + "' is neither N nor topic:N");
        }
        if (!topic.isEmpty()) {
          perTopic.add(topic + '\0' + Integer.parseInt(number));
        } else {
          plain.add(Integer.parseInt(number));
        }
      }
      plain = plain.isEmpty() ? null : plain;
      perTopic = perTopic.isEmpty() ? null : perTopic;
    }
    queues = plain;
    topicQueues = perTopic;
    starting =
        OffsetSpec.parse(
            firstOf(get(lowered, "startingOffsets"), get(lowered, "startingOffset")),
            "earliest",
            "startingOffsets");
    ending =
        OffsetSpec.parse(
            firstOf(get(lowered, "endingOffsets"), get(lowered, "endingOffset")),
            "latest",
            "endingOffsets");
    if (streaming && !"latest".equals(ending.word)) {
      throw new IllegalArgumentException(
          "endingOffsets is a batch option; a stream reads on as records come");
    }
    startTimeMs = parseTime(get(lowered, "startTime"), "startTime");
    endTimeMs = parseTime(get(lowered, "endTime"), "endTime");
    includeSystem = parseBool(get(lowered, "includeSystem"), false, "includeSystem");
    Long maxPerPartition = parsePositive(get(lowered, "maxRecordsPerPartition"), "maxRecordsPerPartition");
    maxRecordsPerPartition =
        maxPerPartition != null ? maxPerPartition : DEFAULT_MAX_RECORDS_PER_PARTITION;
    Long minParts = parsePositive(get(lowered, "minPartitions"), "minPartitions");
    if (minParts == null) {
      // spark.register's default for the Python source: the session's parallelism.
      minPartitions = defaultMinPartitions != null ? Math.max(1, defaultMinPartitions) : 1;
    } else {
      minPartitions = (int) Math.min(Integer.MAX_VALUE, minParts);
    }
    maxRecordsPerTrigger = parsePositive(get(lowered, "maxRecordsPerTrigger"), "maxRecordsPerTrigger");
    verifyChecksums = parseBool(get(lowered, "verifyChecksums"), true, "verifyChecksums");
    dedupe = parseBool(get(lowered, "dedupe"), false, "dedupe");
    includeAborted = parseBool(get(lowered, "includeAborted"), false, "includeAborted");
  }

  /** Options as Spark passes them (keys case-insensitive there and here). */
  static ReadOptions parse(Map<String, String> options, boolean streaming, Integer defaultMin) {
    Map<String, String> lowered = new HashMap<>();
    for (Map.Entry<String, String> option : options.entrySet()) {
      lowered.put(option.getKey().toLowerCase(Locale.ROOT), option.getValue());
    }
    return new ReadOptions(lowered, streaming, defaultMin);
  }

  private static String get(Map<String, String> lowered, String name) {
    String value = lowered.get(name.toLowerCase(Locale.ROOT));
    return value == null || value.strip().isEmpty() ? null : value.strip();
  }

  private static String firstOf(String first, String second) {
    return first != null ? first : second;
  }

  // -- selection ---------------------------------------------------------------------------

  boolean selects(String topic, int queue) {
    boolean named = topics != null && topics.contains(topic);
    if (Layout.isSystemTopic(topic) && !(includeSystem || named)) {
      return false;
    }
    if (topics != null && !named) {
      return false;
    }
    if (topicPattern != null && !topicPattern.matcher(topic).matches()) {
      return false;
    }
    if (queues != null || topicQueues != null) {
      boolean inAll = queues != null && queues.contains(queue);
      boolean inTopic = topicQueues != null && topicQueues.contains(topic + '\0' + queue);
      return inAll || inTopic;
    }
    return true;
  }

  List<LogDir.QueueKey> selectedQueues(LogDir log, Pruning pruning) {
    List<LogDir.QueueKey> out = new ArrayList<>();
    for (LogDir.QueueKey key : log.queues(true)) {
      if (selects(key.topic, key.queue) && pruning.allows(key.topic, key.queue)) {
        out.add(key);
      }
    }
    return out;
  }

  // -- offset ranges -----------------------------------------------------------------------

  /**
   * {@code {first offset, readable end}} of a queue. With {@code transactions} (a read of
   * committed data), the end of a user topic's queue is its Last Stable Offset: nothing at or
   * past the first record of a Kafka transaction still open is read, as Kafka's read_committed
   * consumers. System topics are read as stored (options.ReadOptions.bounds).
   */
  long[] bounds(LogDir log, String topic, int queue, TxnIndex transactions) throws IOException {
    long[] bounds = log.queueBounds(topic, queue);
    if (transactions != null && !Layout.isSystemTopic(topic)) {
      long stable = transactions.lastStableOffset(log, topic, queue);
      bounds = new long[] {bounds[0], Math.max(bounds[0], Math.min(bounds[1], stable))};
    }
    return bounds;
  }

  long startOffset(LogDir log, String topic, int queue, TxnIndex transactions)
      throws IOException {
    long[] bounds = bounds(log, topic, queue, transactions);
    long offset = starting.resolve(topic, queue, bounds[0], bounds[1], EARLIEST);
    if (startTimeMs != null) {
      offset = Math.max(offset, log.offsetForTime(topic, queue, startTimeMs));
    }
    return Math.max(bounds[0], Math.min(offset, bounds[1]));
  }

  long endOffset(LogDir log, String topic, int queue, TxnIndex transactions) throws IOException {
    long[] bounds = bounds(log, topic, queue, transactions);
    long offset = ending.resolve(topic, queue, bounds[0], bounds[1], LATEST);
    if (endTimeMs != null) {
      offset = Math.min(offset, log.offsetForTime(topic, queue, endTimeMs));
    }
    return Math.max(bounds[0], Math.min(offset, bounds[1]));
  }

  /**
   * The non-empty slices a batch read covers, one per selected queue of {@code log} (shard
   * {@code shard} of a root, or {@link Slice#NO_SHARD}), narrowed by filters, each ending at
   * its Last Stable Offset with {@code transactions} (see {@link #bounds}).
   */
  List<Slice> batchSlices(LogDir log, Pruning pruning, TxnIndex transactions, int shard)
      throws IOException {
    List<Slice> out = new ArrayList<>();
    for (LogDir.QueueKey key : selectedQueues(log, pruning)) {
      long start =
          pruning.narrowStart(log, key, startOffset(log, key.topic, key.queue, transactions));
      long end = pruning.narrowEnd(log, key, endOffset(log, key.topic, key.queue, transactions));
      if (end > start) {
        out.add(new Slice(key.topic, key.queue, start, end, shard));
      }
    }
    return out;
  }

  // -- partitions --------------------------------------------------------------------------

  /** How many partitions {@code records} records are read in: options.partition_count. */
  static long partitionCount(long records, long maxRecords, long minPartitions) {
    if (records <= 0) {
      return 0;
    }
    long count = ceilDiv(records, maxRecords);
    long spread = Math.max(1, Math.min(minPartitions, records / MIN_RECORDS_PER_PARTITION));
    if (count > spread && spread > 1) {
      count = ceilDiv(count, spread) * spread;
    }
    return Math.min(Math.max(count, spread), records);
  }

  /**
   * Slices grouped into {@link #partitionCount} partitions of equal size within one record: a
   * large queue cut into several ranges, small queues sharing one (options.pack_slices).
   */
  static List<List<Slice>> packSlices(List<Slice> slices, long maxRecords, long minPartitions) {
    List<Slice> pieces = new ArrayList<>();
    long total = 0;
    for (Slice piece : slices) {
      if (piece.records() > 0) {
        pieces.add(piece);
        total += piece.records();
      }
    }
    long count = partitionCount(total, maxRecords, minPartitions);
    List<List<Slice>> partitions = new ArrayList<>();
    List<Slice> current = new ArrayList<>();
    long currentRecords = 0;
    for (Slice piece : pieces) {
      long start = piece.start;
      while (start < piece.end) {
        // Partition n ends after ceil((n + 1) * total / count) records: sizes differ by <= 1.
        long done = partitions.size();
        long target = ceilDiv((done + 1) * total, count) - ceilDiv(done * total, count);
        long end = Math.min(piece.end, start + target - currentRecords);
        current.add(new Slice(piece.topic, piece.queue, start, end, piece.shard));
        currentRecords += end - start;
        start = end;
        if (currentRecords >= target) {
          partitions.add(current);
          current = new ArrayList<>();
          currentRecords = 0;
        }
      }
    }
    if (!current.isEmpty()) {
      partitions.add(current);
    }
    return partitions;
  }

  private static long ceilDiv(long numerator, long denominator) {
    return -Math.floorDiv(-numerator, denominator);
  }

  // -- parsing helpers ---------------------------------------------------------------------

  private static boolean isDigits(String text) {
    if (text.isEmpty()) {
      return false;
    }
    for (int i = 0; i < text.length(); i++) {
      if (!Character.isDigit(text.charAt(i))) {
        return false;
      }
    }
    return true;
  }

  private static boolean parseBool(String raw, boolean fallback, String option) {
    if (raw == null) {
      return fallback;
    }
    String lowered = raw.toLowerCase(Locale.ROOT);
    if (lowered.equals("true") || lowered.equals("1") || lowered.equals("yes")) {
      return true;
    }
    if (lowered.equals("false") || lowered.equals("0") || lowered.equals("no")) {
      return false;
    }
    throw new IllegalArgumentException(option + ": expected true or false, not '" + raw + "'");
  }

  private static Long parsePositive(String raw, String option) {
    if (raw == null) {
      return null;
    }
    if (!isDigits(raw) || new java.math.BigInteger(raw).signum() <= 0) {
      throw new IllegalArgumentException(
          option + ": expected a positive integer, not '" + raw + "'");
    }
    return Long.parseLong(raw);
  }

  /** Milliseconds since the epoch, or an ISO-8601 time (UTC unless it names a zone). */
  static Long parseTime(String raw, String option) {
    if (raw == null) {
      return null;
    }
    if (isDigits(raw)) {
      return Long.parseLong(raw);
    }
    String text = raw.replace("Z", "+00:00");
    if (text.length() > 10 && text.charAt(10) == ' ') {
      text = text.substring(0, 10) + 'T' + text.substring(11); // fromisoformat takes both
    }
    try {
      return OffsetDateTime.parse(text).toInstant().toEpochMilli();
    } catch (DateTimeParseException notZoned) {
      try {
        return LocalDateTime.parse(text).toInstant(ZoneOffset.UTC).toEpochMilli();
      } catch (DateTimeParseException notLocal) {
        try {
          return LocalDate.parse(text).atStartOfDay().toInstant(ZoneOffset.UTC).toEpochMilli();
        } catch (DateTimeParseException notDate) {
          throw new IllegalArgumentException(
              option + ": not epoch milliseconds or ISO-8601: '" + raw + "'");
        }
      }
    }
  }

  /** An offset option: earliest, latest, one number for every queue, or per-queue JSON. */
  static final class OffsetSpec implements Serializable {
    private static final long serialVersionUID = 1L;
    final String word; // "earliest" or "latest", else null
    final Long number; // one offset for every queue, else null
    final Map<String, Map<String, Long>> perQueue; // else null

    private OffsetSpec(String word, Long number, Map<String, Map<String, Long>> perQueue) {
      this.word = word;
      this.number = number;
      this.perQueue = perQueue;
    }

    static OffsetSpec parse(String raw, String fallback, String option) {
      if (raw == null) {
        return new OffsetSpec(fallback, null, null);
      }
      String lowered = raw.toLowerCase(Locale.ROOT);
      if (lowered.equals("earliest") || lowered.equals("latest")) {
        return new OffsetSpec(lowered, null, null);
      }
      String digits = raw;
      while (digits.startsWith("-")) {
        digits = digits.substring(1); // Python's lstrip("-")
      }
      if (isDigits(digits)) {
        return new OffsetSpec(null, Long.parseLong(raw), null);
      }
      JsonNode parsed;
      try {
        parsed = new ObjectMapper().readTree(raw);
      } catch (IOException error) {
        throw new IllegalArgumentException(
            option + ": not earliest/latest, an integer or JSON: '" + raw + "'", error);
      }
      boolean shaped = parsed != null && parsed.isObject();
      if (shaped) {
        for (Iterator<JsonNode> values = parsed.elements(); values.hasNext(); ) {
          shaped &= values.next().isObject();
        }
      }
      if (!shaped) {
        throw new IllegalArgumentException(
            option + ": JSON must look like {\"topic\": {\"0\": 42}}");
      }
      Map<String, Map<String, Long>> offsets = new HashMap<>();
      for (Map.Entry<String, JsonNode> topic : parsed.properties()) {
        Map<String, Long> byQueue = new HashMap<>();
        for (Map.Entry<String, JsonNode> queue : topic.getValue().properties()) {
          byQueue.put(queue.getKey(), queue.getValue().asLong());
        }
        offsets.put(topic.getKey(), byQueue);
      }
      return new OffsetSpec(null, null, offsets);
    }

    long resolve(String topic, int queue, long first, long after, long fallback) {
      long value;
      if (perQueue != null) {
        Long given = perQueue.getOrDefault(topic, Collections.emptyMap()).get(String.valueOf(queue));
        value = given != null ? given : fallback;
      } else if (number != null) {
        value = number;
      } else {
        value = "earliest".equals(word) ? EARLIEST : LATEST;
      }
      if (value == EARLIEST) {
        return first;
      }
      if (value == LATEST) {
        return after;
      }
      if (value < 0) {
        throw new IllegalArgumentException(
            "offset "
                + value
                + " for "
                + topic
                + "/"
                + queue
                + ": use -2 (earliest) or -1 (latest)");
      }
      return value;
    }
  }

  @Override
  public String toString() {
    String selection = topics != null ? " topics=" + topics : "";
    if (topicPattern != null) {
      selection += " topicPattern=" + topicPattern.pattern();
    }
    return "path=" + path + selection;
  }
}
