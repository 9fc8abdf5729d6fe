package org.braidmq.spark;

import java.io.IOException;

/**
 * A stored frame fails its length, magic or CRC check, or does not match its index entry; it is
 * never returned as a row. The message is {@code core.log.record.CorruptRecordError}'s, word for
 * word, so a job fails with the same words whichever reader ran it. A plain {@link IOException}:
 * a task's error travels to the driver serialized, and a class of this jar would not resolve
 * there (Spark reports such a failure as "UnknownReason", losing the message).
 */
final class Corruption {
  private Corruption() {}

  static IOException at(long position, String reason) {
    return new IOException("corrupt record at commit-log position " + position + ": " + reason);
  }
}
