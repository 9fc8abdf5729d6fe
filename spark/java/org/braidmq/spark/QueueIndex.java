package org.braidmq.spark;

import java.io.IOException;
import java.nio.ByteOrder;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;

/**
 * The index of one queue, read-only: {@code core.log.consumequeue.ConsumeQueue} seen from
 * another process. Files of {@code entriesPerFile} 40-byte entries (see {@link Layout}), each
 * named by the 20-digit number of its first entry; entry {@code n} lives in file {@code n /
 * entriesPerFile}. The writer appends an entry after its frame, so an entry whose size field is
 * still 0 marks the end of what is written; files are mapped once and remapped when they grew.
 * Not thread-safe: one per task.
 */
final class QueueIndex {
  private static final String SUFFIX = ".idx";

  final String topic;
  final int queue;
  private final Path directory;
  private final int entriesPerFile;
  private final long fileBytes;
  private final TreeMap<Long, MappedByteBuffer> files = new TreeMap<>();
  long startEntry;
  long nextEntry;
  long nextOffset;

  QueueIndex(Path directory, String topic, int queue, int entriesPerFile) throws IOException {
    this.directory = directory;
    this.topic = topic;
    this.queue = queue;
    this.entriesPerFile = entriesPerFile;
    this.fileBytes = (long) entriesPerFile * Layout.ENTRY_SIZE;
    refresh();
  }

  /** Map new files, drop deleted ones and find the end of written entries. */
  void refresh() throws IOException {
    Map<Long, Path> onDisk = new TreeMap<>();
    if (Files.isDirectory(directory)) {
      try (DirectoryStream<Path> listing = Files.newDirectoryStream(directory, "*" + SUFFIX)) {
        for (Path path : listing) {
          long first = LogDir.numberOf(path);
          onDisk.put(first / entriesPerFile, path);
        }
      } catch (NoSuchFileException gone) {
        // the queue was deleted while we listed it: no files
      }
    }
    Set<Long> stale = new HashSet<>(files.keySet());
    stale.removeAll(onDisk.keySet());
    for (Long number : stale) {
      files.remove(number);
    }
    for (Map.Entry<Long, Path> file : onDisk.entrySet()) {
      MappedByteBuffer mapped = files.get(file.getKey());
      // Files are created sparse at full size, but a reader may find one just created and
      // not yet extended (size 0): remap it once it is.
      if (mapped == null || mapped.capacity() < fileBytes) {
        MappedByteBuffer fresh = map(file.getValue());
        if (fresh != null) {
          files.put(file.getKey(), fresh);
        }
      }
    }
    if (files.isEmpty()) {
      startEntry = nextEntry;
      return;
    }
    startEntry = Math.max(startEntry, files.firstKey() * entriesPerFile);
    long last = files.lastKey();
    nextEntry = last * entriesPerFile + countIn(files.get(last));
    if (nextEntry > startEntry) {
      long tail = nextEntry - 1;
      nextOffset = firstOffset(tail) + recordCount(tail);
    } else if (nextEntry == 0) {
      nextOffset = 0;
    }
  }

  private MappedByteBuffer map(Path path) throws IOException {
    try (FileChannel channel = FileChannel.open(path, StandardOpenOption.READ)) {
      long length = Math.min(fileBytes, channel.size());
      MappedByteBuffer mapped = channel.map(FileChannel.MapMode.READ_ONLY, 0, length);
      mapped.order(ByteOrder.LITTLE_ENDIAN);
      return mapped;
    } catch (NoSuchFileException gone) {
      return null; // deleted by retention between the listing and here
    }
  }

  /** Entries written in a file: binary search for the first zero size field. */
  private static long countIn(MappedByteBuffer file) {
    int low = 0;
    int high = file.capacity() / Layout.ENTRY_SIZE;
    while (low < high) {
      int middle = (low + high) >>> 1;
      if (file.getInt(middle * Layout.ENTRY_SIZE + Layout.ENTRY_SIZE_FIELD) != 0) {
        low = middle + 1;
      } else {
        high = middle;
      }
    }
    return low;
  }

  /** Advance past entries whose commit-log segment retention has deleted. */
  void skipDeletedHead(long logStart) {
    while (startEntry < nextEntry && position(startEntry) < logStart) {
      startEntry++;
    }
  }

  long startOffset() {
    return startEntry >= nextEntry ? nextOffset : firstOffset(startEntry);
  }

  /** Entries from {@code entry} to the end of its file (the most one read can view at once). */
  long entriesLeftInFile(long entry) {
    return entriesPerFile - entry % entriesPerFile;
  }

  /**
   * The entry holding queue {@code offset} (the first entry after it if it fell in a gap);
   * {@code nextEntry} when {@code offset} is at or past the end.
   */
  long entryForOffset(long offset) {
    if (offset >= nextOffset) {
      return nextEntry;
    }
    long low = startEntry;
    long high = nextEntry;
    if (low <= offset && offset < high) {
      long first = firstOffset(offset);
      if (first <= offset && offset < first + recordCount(offset)) {
        return offset; // an unbatched queue: entry n holds offset n
      }
    }
    while (low < high) {
      long middle = (low + high) >>> 1;
      if (firstOffset(middle) + recordCount(middle) <= offset) {
        low = middle + 1;
      } else {
        high = middle;
      }
    }
    return low;
  }

  /** The first entry stored at or after {@code timestampMs} ({@code nextEntry} if none). */
  long entryForTime(long timestampMs) {
    long low = startEntry;
    long high = nextEntry;
    while (low < high) {
      long middle = (low + high) >>> 1;
      if (storeMs(middle) < timestampMs) {
        low = middle + 1;
      } else {
        high = middle;
      }
    }
    return low;
  }

  /** The mapping holding entry {@code entry}, and where in it: see {@link #slot}. */
  MappedByteBuffer fileOf(long entry) {
    return files.get(entry / entriesPerFile);
  }

  int slot(long entry) {
    return (int) (entry % entriesPerFile) * Layout.ENTRY_SIZE;
  }

  long position(long entry) {
    return fileOf(entry).getLong(slot(entry) + Layout.ENTRY_POSITION);
  }

  int size(long entry) {
    return fileOf(entry).getInt(slot(entry) + Layout.ENTRY_SIZE_FIELD);
  }

  long recordCount(long entry) {
    return fileOf(entry).getInt(slot(entry) + Layout.ENTRY_RECORD_COUNT) & 0xFFFFFFFFL;
  }

  long storeMs(long entry) {
    return fileOf(entry).getLong(slot(entry) + Layout.ENTRY_STORE_MS);
  }

  long firstOffset(long entry) {
    return fileOf(entry).getLong(slot(entry) + Layout.ENTRY_FIRST_OFFSET);
  }
}
