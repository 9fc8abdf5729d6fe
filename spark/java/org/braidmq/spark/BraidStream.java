package org.braidmq.spark;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.HashMap;
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
 * target is fixed when the query starts. On a cluster's data root, every shard's queues, an
 * offset per shard and queue ({@link BraidOffset}); a shard first written while the query runs
 * is read from its beginning. Reading holds nothing back: commit releases nothing. Used by the
 * driver only.
 */
final class BraidStream implements MicroBatchStream, SupportsTriggerAvailableNow {
  private final ReadOptions options;
  private final int[] columns;
  // Per shard, the Kafka transactions' outcomes, kept between triggers.
  private final Map<Integer, TxnIndex> transactions = new HashMap<>();
  private BraidOffset target;

  BraidStream(ReadOptions options, int[] columns) {
    this.options = options;
    this.columns = columns;
  }

  private DataRoot root() {
    try {
      return DataRoot.of(options.path);
    } catch (IOException error) {
      throw new UncheckedIOException(error);
    }
  }

  /** The log of every shard holding one, in shard order (NO_SHARD: a single-node directory). */
  private TreeMap<Integer, LogDir> open(DataRoot root) throws IOException {
    TreeMap<Integer, LogDir> logs = new TreeMap<>();
    for (int shard : root.shardsWithLogs()) {
      logs.put(shard, new LogDir(DataRoot.shardDir(options.path, shard)));
    }
    return logs;
  }

  /**
   * A shard's Kafka transactions' outcomes, kept between triggers (only what was indexed since
   * is read), brought up to date after {@code log} read its queues (TxnIndex.lastStableOffset).
   */
  private TxnIndex transactions(int shard, LogDir log) throws IOException {
    TxnIndex known = transactions.computeIfAbsent(shard, any -> new TxnIndex());
    known.refresh(log);
    return known;
  }

  @Override
  public Offset initialOffset() {
    DataRoot root = root();
    TreeMap<Integer, TreeMap<String, TreeMap<Integer, Long>>> shards = new TreeMap<>();
    try {
      for (Map.Entry<Integer, LogDir> shard : open(root).entrySet()) {
        LogDir log = shard.getValue();
        TxnIndex known = transactions(shard.getKey(), log);
        TreeMap<String, TreeMap<Integer, Long>> offsets = BraidOffset.empty();
        for (LogDir.QueueKey key : options.selectedQueues(log, Pruning.NONE)) {
          offsets
              .computeIfAbsent(key.topic, topic -> new TreeMap<>())
              .put(key.queue, options.startOffset(log, key.topic, key.queue, known));
        }
        shards.put(shard.getKey(), offsets);
      }
    } catch (IOException error) {
      throw new UncheckedIOException(error);
    }
    return new BraidOffset(root.isRoot(), shards);
  }

  /**
   * Where each queue's readable records end now, in every shard: its Last Stable Offset, so a
   * micro-batch never passes a Kafka transaction still open (ReadOptions.bounds).
   */
  private BraidOffset available(DataRoot root) {
    TreeMap<Integer, TreeMap<String, TreeMap<Integer, Long>>> shards = new TreeMap<>();
    try {
      for (Map.Entry<Integer, LogDir> shard : open(root).entrySet()) {
        LogDir log = shard.getValue();
        TxnIndex known = transactions(shard.getKey(), log);
        TreeMap<String, TreeMap<Integer, Long>> offsets = BraidOffset.empty();
        for (LogDir.QueueKey key : options.selectedQueues(log, Pruning.NONE)) {
          offsets
              .computeIfAbsent(key.topic, topic -> new TreeMap<>())
              .put(key.queue, options.bounds(log, key.topic, key.queue, known)[1]);
        }
        shards.put(shard.getKey(), offsets);
      }
    } catch (IOException error) {
      throw new UncheckedIOException(error);
    }
    return new BraidOffset(root.isRoot(), shards);
  }

  @Override
  public void prepareForTriggerAvailableNow() {
    target = available(root());
  }

  @Override
  public ReadLimit getDefaultReadLimit() {
    return options.maxRecordsPerTrigger == null
        ? ReadLimit.allAvailable()
        : ReadLimit.maxRows(options.maxRecordsPerTrigger);
  }

  @Override
  public Offset latestOffset() {
    return target != null ? target : available(root());
  }

  @Override
  public Offset latestOffset(Offset startOffset, ReadLimit limit) {
    DataRoot root = root();
    BraidOffset latest = target != null ? target : available(root);
    if (startOffset == null) {
      return latest;
    }
    BraidOffset start = asBraid(startOffset, root);
    TreeMap<Integer, TreeMap<String, TreeMap<Integer, Long>>> begin = copy(start.shards);
    try {
      for (Map.Entry<Integer, TreeMap<String, TreeMap<Integer, Long>>> shard :
          latest.shards.entrySet()) {
        TreeMap<String, TreeMap<Integer, Long>> known =
            begin.computeIfAbsent(shard.getKey(), s -> BraidOffset.empty());
        LogDir log = null;
        for (Map.Entry<String, TreeMap<Integer, Long>> topic : shard.getValue().entrySet()) {
          for (Integer queue : topic.getValue().keySet()) { // a queue new since start: earliest
            TreeMap<Integer, Long> queues =
                known.computeIfAbsent(topic.getKey(), t -> new TreeMap<>());
            if (!queues.containsKey(queue)) {
              if (log == null) {
                log = new LogDir(DataRoot.shardDir(options.path, shard.getKey()));
              }
              queues.put(queue, log.queueBounds(topic.getKey(), queue)[0]);
            }
          }
        }
      }
    } catch (IOException error) {
      throw new UncheckedIOException(error);
    }
    BraidOffset beginning = new BraidOffset(root.isRoot(), begin);
    BraidOffset end = merge(beginning, latest);
    if (limit instanceof ReadMaxRows) {
      end = cap(beginning, end, ((ReadMaxRows) limit).maxRows());
    }
    return end;
  }

  @Override
  public Offset reportLatestOffset() {
    return available(root());
  }

  /** {@code latest} for every queue, never behind {@code start} (source.merge_offsets). */
  static BraidOffset merge(BraidOffset start, BraidOffset latest) {
    TreeMap<Integer, TreeMap<String, TreeMap<Integer, Long>>> merged = copy(start.shards);
    for (Map.Entry<Integer, TreeMap<String, TreeMap<Integer, Long>>> shard :
        latest.shards.entrySet()) {
      TreeMap<String, TreeMap<Integer, Long>> topics =
          merged.computeIfAbsent(shard.getKey(), s -> BraidOffset.empty());
      for (Map.Entry<String, TreeMap<Integer, Long>> topic : shard.getValue().entrySet()) {
        TreeMap<Integer, Long> queues = topics.computeIfAbsent(topic.getKey(), t -> new TreeMap<>());
        for (Map.Entry<Integer, Long> queue : topic.getValue().entrySet()) {
          Long before = queues.get(queue.getKey());
          queues.put(
              queue.getKey(),
              before == null ? queue.getValue() : Math.max(before, queue.getValue()));
        }
      }
    }
    return new BraidOffset(latest.root, merged);
  }

  /** A queue waiting to be read: its shard, topic, queue and offsets {@code [from, to)}. */
  private static final class Backlog {
    final int shard;
    final String topic;
    final int queue;
    final long from;
    final long to;

    Backlog(int shard, String topic, int queue, long from, long to) {
      this.shard = shard;
      this.topic = topic;
      this.queue = queue;
      this.from = from;
      this.to = to;
    }
  }

  /**
   * {@code end} moved back so at most {@code maxRows} records lie between {@code start} and it,
   * shared out in proportion to each queue's backlog (over every shard), at least one record per
   * backlogged queue while the budget lasts, then what rounding down left over, first come first
   * served, in (shard, topic, queue) order (source.cap_shard_offsets).
   */
  static BraidOffset cap(BraidOffset start, BraidOffset end, long maxRows) {
    List<Backlog> waiting = new ArrayList<>();
    long total = 0;
    for (Map.Entry<Integer, TreeMap<String, TreeMap<Integer, Long>>> shard :
        end.shards.entrySet()) {
      for (Map.Entry<String, TreeMap<Integer, Long>> topic : shard.getValue().entrySet()) {
        for (Map.Entry<Integer, Long> queue : topic.getValue().entrySet()) {
          Long begin = start.get(shard.getKey(), topic.getKey(), queue.getKey());
          long from = begin == null ? 0 : begin;
          if (queue.getValue() > from) {
            waiting.add(
                new Backlog(shard.getKey(), topic.getKey(), queue.getKey(), from, queue.getValue()));
            total += queue.getValue() - from;
          }
        }
      }
    }
    if (total <= maxRows) {
      return end;
    }
    // The Python source orders queues by their JSON key (the queue number as text).
    waiting.sort(
        (left, right) -> {
          int byShard = Integer.compare(left.shard, right.shard);
          if (byShard != 0) {
            return byShard;
          }
          int byTopic = LogDir.compareCodePoints(left.topic, right.topic);
          return byTopic != 0
              ? byTopic
              : String.valueOf(left.queue).compareTo(String.valueOf(right.queue));
        });
    TreeMap<Integer, TreeMap<String, TreeMap<Integer, Long>>> capped = copy(end.shards);
    long budget = maxRows;
    for (Backlog item : waiting) {
      long behind = item.to - item.from;
      long share =
          Math.min(
              Math.min(
                  Math.max(
                      1,
                      java.math.BigInteger.valueOf(behind)
                          .multiply(java.math.BigInteger.valueOf(maxRows))
                          .divide(java.math.BigInteger.valueOf(total))
                          .longValue()),
                  behind),
              budget);
      capped.get(item.shard).get(item.topic).put(item.queue, item.from + share);
      budget -= share;
    }
    for (int i = 0; i < waiting.size() && budget > 0; i++) {
      Backlog item = waiting.get(i);
      TreeMap<Integer, Long> queues = capped.get(item.shard).get(item.topic);
      long now = queues.get(item.queue);
      long extra = Math.min(budget, item.to - now);
      queues.put(item.queue, now + extra);
      budget -= extra;
    }
    return new BraidOffset(end.root, capped);
  }

  private static TreeMap<Integer, TreeMap<String, TreeMap<Integer, Long>>> copy(
      TreeMap<Integer, TreeMap<String, TreeMap<Integer, Long>>> shards) {
    TreeMap<Integer, TreeMap<String, TreeMap<Integer, Long>>> out = new TreeMap<>();
    for (Map.Entry<Integer, TreeMap<String, TreeMap<Integer, Long>>> shard : shards.entrySet()) {
      TreeMap<String, TreeMap<Integer, Long>> topics = BraidOffset.empty();
      for (Map.Entry<String, TreeMap<Integer, Long>> topic : shard.getValue().entrySet()) {
        topics.put(topic.getKey(), new TreeMap<>(topic.getValue()));
      }
      out.put(shard.getKey(), topics);
    }
    return out;
  }

  private static BraidOffset asBraid(Offset offset, DataRoot root) {
    return offset instanceof BraidOffset
        ? (BraidOffset) offset
        : BraidOffset.parse(offset.json(), root);
  }

  @Override
  public InputPartition[] planInputPartitions(Offset startOffset, Offset endOffset) {
    DataRoot root = root();
    BraidOffset start = asBraid(startOffset, root);
    BraidOffset end = asBraid(endOffset, root);
    List<Slice> slices = new ArrayList<>();
    try {
      for (Map.Entry<Integer, TreeMap<String, TreeMap<Integer, Long>>> shard :
          end.shards.entrySet()) {
        LogDir log = null;
        for (Map.Entry<String, TreeMap<Integer, Long>> topic : shard.getValue().entrySet()) {
          for (Map.Entry<Integer, Long> queue : topic.getValue().entrySet()) {
            Long begin = start.get(shard.getKey(), topic.getKey(), queue.getKey());
            if (begin == null) {
              if (log == null) {
                log = new LogDir(DataRoot.shardDir(options.path, shard.getKey()));
              }
              begin = log.queueBounds(topic.getKey(), queue.getKey())[0];
            }
            if (queue.getValue() > begin) {
              slices.add(
                  new Slice(topic.getKey(), queue.getKey(), begin, queue.getValue(), shard.getKey()));
            }
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
    return BraidOffset.parse(json, root());
  }

  @Override
  public void commit(Offset end) {}

  @Override
  public void stop() {}
}
