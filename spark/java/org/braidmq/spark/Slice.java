package org.braidmq.spark;

import java.io.Serializable;

/**
 * Offsets {@code [start, end)} of one queue, of one shard of a cluster's data root or of a
 * single-node directory ({@link #NO_SHARD}) (spark.options.Slice). Immutable.
 */
final class Slice implements Serializable {
  private static final long serialVersionUID = 2L;

  /** The shard of a single-node directory: the {@code shard} column is null. */
  static final int NO_SHARD = -1;

  final String topic;
  final int queue;
  final long start;
  final long end;
  final int shard;

  Slice(String topic, int queue, long start, long end, int shard) {
    this.topic = topic;
    this.queue = queue;
    this.start = start;
    this.end = end;
    this.shard = shard;
  }

  long records() {
    return Math.max(0, end - start);
  }

  @Override
  public String toString() {
    String where = shard == NO_SHARD ? "" : String.format("shard %04d ", shard);
    return where + topic + "/" + queue + "[" + start + ", " + end + ")";
  }
}
