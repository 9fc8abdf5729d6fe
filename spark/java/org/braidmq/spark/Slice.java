package org.braidmq.spark;

import java.io.Serializable;

/** Offsets {@code [start, end)} of one queue (spark.options.Slice). Immutable. */
final class Slice implements Serializable {
  private static final long serialVersionUID = 1L;

  final String topic;
  final int queue;
  final long start;
  final long end;

  Slice(String topic, int queue, long start, long end) {
    this.topic = topic;
    this.queue = queue;
    this.start = start;
    this.end = end;
  }

  long records() {
    return Math.max(0, end - start);
  }

  @Override
  public String toString() {
    return topic + "/" + queue + "[" + start + ", " + end + ")";
  }
}
