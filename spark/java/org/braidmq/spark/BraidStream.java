package org.braidmq.spark;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxRows;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;

/**
 * Micro-batches over the queues' offsets: {@code spark.source.BraidStreamReader}, the same
 * offsets, limits and {@code availableNow} semantics. Each trigger re-reads the directory (new
 * segments, index files, queues), so it sees what a running broker appended; a queue that
 * appears while the query runs is read from its beginning; {@code maxRecordsPerTrigger} is
 * shared out over queues in proportion to their backlog; under {@code Trigger.AvailableNow} the
 * target is fixed when the query starts. Reading holds nothing back: commit releases nothing.
 * Used by the driver only.
 */
final class BraidStream implements MicroBatchStream, SupportsTriggerAvailableNow {
  private final ReadOptions options;
  private final int[] columns;
  private final TxnIndex transactions = new TxnIndex();
  private BraidOffset target;

  BraidStream(ReadOptions options, int[] columns) {
    this.options = options;
    this.columns = columns;
  }

  private LogDir open() {
    try {
      return new LogDir(options.path);
    } catch (IOException error) {
      throw new UncheckedIOException(error);
    }
  }

  /**
   * The Kafka transactions' outcomes, kept between triggers (only what was indexed since is
   * read), brought up to date after {@code log} read its queues (TxnIndex.lastStableOffset).
   */
  private TxnIndex transactions(LogDir log) throws IOException {
    transactions.refresh(log);
    return transactions;
  }

  @Override
  public Offset initialOffset() {
    LogDir log = open();
    TreeMap<String, TreeMap<Integer, Long>> offsets = BraidOffset.empty();
    try {
      TxnIndex known = transactions(log);
      for (LogDir.QueueKey key : options.selectedQueues(log, Pruning.NONE)) {
        offsets
            .computeIfAbsent(key.topic, topic -> new TreeMap<>())
            .put(key.queue, options.startOffset(log, key.topic, key.queue, known));
      }
    } catch (IOException error) {
      throw new UncheckedIOException(error);
    }
    return new BraidOffset(offsets);
  }

  /**
   * Where each queue's readable records end now: its Last Stable Offset, so a micro-batch never
   * passes a Kafka transaction still open (ReadOptions.bounds).
   */
  private BraidOffset available() {
    LogDir log = open();
    TreeMap<String, TreeMap<Integer, Long>> offsets = BraidOffset.empty();
    try {
      TxnIndex known = transactions(log);
      for (LogDir.QueueKey key : options.selectedQueues(log, Pruning.NONE)) {
        offsets
            .computeIfAbsent(key.topic, topic -> new TreeMap<>())
            .put(key.queue, options.bounds(log, key.topic, key.queue, known)[1]);
      }
    } catch (IOException error) {
      throw new UncheckedIOException(error);
    }
    return new BraidOffset(offsets);
  }

  @Override
  public void prepareForTriggerAvailableNow() {
    target = available();
  }

  @Override
  public ReadLimit getDefaultReadLimit() {
    return options.maxRecordsPerTrigger == null
        ? ReadLimit.allAvailable()
        : ReadLimit.maxRows(options.maxRecordsPerTrigger);
  }

  @Override
  public Offset latestOffset() {
    return target != null ? target : available();
  }

  @Override
  public Offset latestOffset(Offset startOffset, ReadLimit limit) {
    BraidOffset latest = target != null ? target : available();
    if (startOffset == null) {
      return latest;
    }
    BraidOffset start = asBraid(startOffset);
    TreeMap<String, TreeMap<Integer, Long>> begin = copy(start.queues);
    LogDir log = open();
    try {
      for (Map.Entry<String, TreeMap<Integer, Long>> topic : latest.queues.entrySet()) {
        for (Integer queue : topic.getValue().keySet()) { // a queue new since start: earliest
          TreeMap<Integer, Long> known = begin.computeIfAbsent(topic.getKey(), t -> new TreeMap<>());
          if (!known.containsKey(queue)) {
            known.put(queue, log.queueBounds(topic.getKey(), queue)[0]);
          }
        }
      }
    } catch (IOException error) {
      throw new UncheckedIOException(error);
    }
    BraidOffset beginning = new BraidOffset(begin);
    BraidOffset end = merge(beginning, latest);
    if (limit instanceof ReadMaxRows) {
      end = cap(beginning, end, ((ReadMaxRows) limit).maxRows());
    }
    return end;
  }

  @Override
  public Offset reportLatestOffset() {
    return available();
  }

  /** {@code latest} for every queue, never behind {@code start} (source.merge_offsets). */
  static BraidOffset merge(BraidOffset start, BraidOffset latest) {
    TreeMap<String, TreeMap<Integer, Long>> merged = copy(start.queues);
    for (Map.Entry<String, TreeMap<Integer, Long>> topic : latest.queues.entrySet()) {
      TreeMap<Integer, Long> queues = merged.computeIfAbsent(topic.getKey(), t -> new TreeMap<>());
      for (Map.Entry<Integer, Long> queue : topic.getValue().entrySet()) {
        Long before = queues.get(queue.getKey());
        queues.put(queue.getKey(), before == null ? queue.getValue() : Math.max(before, queue.getValue()));
      }
    }
    return new BraidOffset(merged);
  }

  /**
   * {@code end} moved back so at most {@code maxRows} records lie between {@code start} and it,
   * shared out in proportion to each queue's backlog, at least one record per backlogged queue
   * while the budget lasts, then what rounding down left over, first come first served, in
   * (topic, queue) order (source.cap_offsets).
   */
  static BraidOffset cap(BraidOffset start, BraidOffset end, long maxRows) {
    // (topic, queue as text, begin, stop): the Python source orders queues by their JSON key.
    List<Object[]> waiting = new ArrayList<>();
    long total = 0;
    for (Map.Entry<String, TreeMap<Integer, Long>> topic : end.queues.entrySet()) {
      for (Map.Entry<Integer, Long> queue : topic.getValue().entrySet()) {
        Long begin = start.get(topic.getKey(), queue.getKey());
        long from = begin == null ? 0 : begin;
        if (queue.getValue() > from) {
          waiting.add(new Object[] {topic.getKey(), queue.getKey(), from, queue.getValue()});
          total += queue.getValue() - from;
        }
      }
    }
    waiting.sort(
        (left, right) -> {
          int byTopic = LogDir.compareCodePoints((String) left[0], (String) right[0]);
          return byTopic != 0 ? byTopic : String.valueOf(left[1]).compareTo(String.valueOf(right[1]));
        });
    List<String> topics = new ArrayList<>();
    List<Integer> queues = new ArrayList<>();
    List<long[]> backlog = new ArrayList<>();
    for (Object[] item : waiting) {
      topics.add((String) item[0]);
      queues.add((Integer) item[1]);
      backlog.add(new long[] {(Long) item[2], (Long) item[3]});
    }
    if (total <= maxRows) {
      return end;
    }
    TreeMap<String, TreeMap<Integer, Long>> capped = copy(end.queues);
    long budget = maxRows;
    for (int i = 0; i < backlog.size(); i++) {
      long[] range = backlog.get(i);
      long behind = range[1] - range[0];
      long share =
          Math.min(
              Math.min(Math.max(1, java.math.BigInteger.valueOf(behind)
                  .multiply(java.math.BigInteger.valueOf(maxRows))
                  .divide(java.math.BigInteger.valueOf(total)).longValue()), behind),
              budget);
      capped.get(topics.get(i)).put(queues.get(i), range[0] + share);
      budget -= share;
    }
    for (int i = 0; i < backlog.size() && budget > 0; i++) {
      long stop = backlog.get(i)[1];
      long now = capped.get(topics.get(i)).get(queues.get(i));
      long extra = Math.min(budget, stop - now);
      capped.get(topics.get(i)).put(queues.get(i), now + extra);
      budget -= extra;
    }
    return new BraidOffset(capped);
  }

  private static TreeMap<String, TreeMap<Integer, Long>> copy(
      TreeMap<String, TreeMap<Integer, Long>> queues) {
    TreeMap<String, TreeMap<Integer, Long>> out = BraidOffset.empty();
    for (Map.Entry<String, TreeMap<Integer, Long>> topic : queues.entrySet()) {
      out.put(topic.getKey(), new TreeMap<>(topic.getValue()));
    }
    return out;
  }

  private static BraidOffset asBraid(Offset offset) {
    return offset instanceof BraidOffset ? (BraidOffset) offset : BraidOffset.parse(offset.json());
  }

  @Override
  public InputPartition[] planInputPartitions(Offset startOffset, Offset endOffset) {
    BraidOffset start = asBraid(startOffset);
    BraidOffset end = asBraid(endOffset);
    LogDir log = open();
    List<Slice> slices = new ArrayList<>();
    try {
      for (Map.Entry<String, TreeMap<Integer, Long>> topic : end.queues.entrySet()) {
        for (Map.Entry<Integer, Long> queue : topic.getValue().entrySet()) {
          Long begin = start.get(topic.getKey(), queue.getKey());
          long from =
              begin != null ? begin : log.queueBounds(topic.getKey(), queue.getKey())[0];
          if (queue.getValue() > from) {
            slices.add(new Slice(topic.getKey(), queue.getKey(), from, queue.getValue()));
          }
        }
      }
    } catch (IOException error) {
      throw new UncheckedIOException(error);
    }
    return BraidScan.partitions(
        ReadOptions.packSlices(slices, options.maxRecordsPerPartition, options.minPartitions));
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    return new BraidReaderFactory(
        options.path, columns, options.verifyChecksums, options.dedupe, options.includeAborted);
  }

  @Override
  public Offset deserializeOffset(String json) {
    return BraidOffset.parse(json);
  }

  @Override
  public void commit(Offset end) {}

  @Override
  public void stop() {}
}
