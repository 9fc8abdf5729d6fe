package org.braidmq.spark;

import java.io.IOException;

/**
 * A stored frame fails its length, magic or CRC check, or does not match its index entry; it is
 * never returned as a row. The message is {@code core.log.record.CorruptRecordError}'s, word for
 * word, so a job fails with the same words whichever reader ran it.
 */
public final class CorruptRecordException extends IOException {
  private static final long serialVersionUID = 1L;

  /** Commit-log position of the frame. */
  public final long position;

  /** What is wrong with it. */
  public final String reason;

  public CorruptRecordException(long position, String reason) {
    super("corrupt record at commit-log position " + position + ": " + reason);
    this.position = position;
    this.reason = reason;
  }
}
