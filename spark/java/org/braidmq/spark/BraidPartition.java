package org.braidmq.spark;

import org.apache.spark.sql.connector.read.InputPartition;

/** One Spark task: consecutive offset ranges of one or more queues. Immutable. */
final class BraidPartition implements InputPartition {
  private static final long serialVersionUID = 1L;

  final Slice[] slices;

  BraidPartition(Slice[] slices) {
    this.slices = slices;
  }

  long records() {
    long total = 0;
    for (Slice slice : slices) {
      total += slice.records();
    }
    return total;
  }
}
