package org.braidmq.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.ByteArrayOutputStream;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.nio.ByteOrder;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;

/**
 * A BraidMQ data directory opened read-only: {@code core.log.LogReader}'s catalogue and
 * commit-log mappings, from another process, on a running broker's files or a stopped one's.
 *
 * <pre>
 *   DATA_DIR/log.json                                  segment size, entries per index file
 *   DATA_DIR/commitlog/00000000000000000000.log        segments named by their base position
 *   DATA_DIR/index/&lt;topic&gt;/&lt;queue&gt;/00000000000000000000.idx  index files (QueueIndex)
 * </pre>
 *
 * <p>Segments are mapped whole (they are created sparse at full size, so one mapping sees what
 * the writer appends later). Not thread-safe: each Spark task opens its own (opening lists two
 * directories and maps lazily).
 */
final class LogDir {
  static final String META_FILE = "log.json";
  static final String COMMITLOG_DIR = "commitlog";
  static final String INDEX_DIR = "index";
  private static final String SEGMENT_SUFFIX = ".log";
  /** A MappedByteBuffer holds at most this much: larger segments are refused (as decode.py). */
  static final long MAX_SEGMENT_BYTES = Integer.MAX_VALUE;

  final Path dataDir;
  final long segmentSize;
  final int entriesPerFile;
  private final TreeMap<Long, Path> segmentFiles = new TreeMap<>();
  private final Map<Long, MappedByteBuffer> segments = new TreeMap<>();
  private final TreeMap<QueueKey, QueueIndex> queues = new TreeMap<>();

  LogDir(String path) throws IOException {
    this.dataDir = Paths.get(path);
    Path meta = dataDir.resolve(META_FILE);
    if (!Files.exists(meta)) {
      throw new FileNotFoundException(dataDir + " holds no BraidMQ log (" + META_FILE + ")");
    }
    JsonNode parsed = new ObjectMapper().readTree(meta.toFile());
    this.segmentSize = parsed.get("segment_size").asLong();
    this.entriesPerFile = parsed.get("index_entries_per_file").asInt();
    if (segmentSize > MAX_SEGMENT_BYTES) {
      throw new IOException("segments above " + MAX_SEGMENT_BYTES + " bytes are not supported");
    }
    refreshSegments();
    discoverQueues();
  }

  // -- catalogue ---------------------------------------------------------------------------

  /** Pick up what a running broker appended: new segments, queues and index entries. */
  void refresh() throws IOException {
    refreshSegments();
    discoverQueues();
    for (QueueIndex index : queues.values()) {
      index.refresh();
    }
  }

  private void discoverQueues() throws IOException {
    Path root = dataDir.resolve(INDEX_DIR);
    if (!Files.isDirectory(root)) {
      return;
    }
    try (DirectoryStream<Path> topics = Files.newDirectoryStream(root, Files::isDirectory)) {
      for (Path topicDir : topics) {
        String topic = decodeTopicDir(topicDir.getFileName().toString());
        try (DirectoryStream<Path> queueDirs = Files.newDirectoryStream(topicDir)) {
          for (Path queueDir : queueDirs) {
            String name = queueDir.getFileName().toString();
            if (isDigits(name) && Files.isDirectory(queueDir)) {
              QueueKey key = new QueueKey(topic, Integer.parseInt(name));
              if (!queues.containsKey(key)) {
                queues.put(key, new QueueIndex(queueDir, topic, key.queue, entriesPerFile));
              }
            }
          }
        } catch (NoSuchFileException gone) {
          // a topic deleted while we listed it
        }
      }
    }
  }

  /** The queues, in (topic, queue) order; internal topics only with {@code includeSystem}. */
  List<QueueKey> queues(boolean includeSystem) {
    List<QueueKey> out = new ArrayList<>();
    for (QueueKey key : queues.keySet()) {
      if (includeSystem || !Layout.isSystemTopic(key.topic)) {
        out.add(key);
      }
    }
    return out;
  }

  /** The index of a queue, or null for a queue never written. */
  QueueIndex queueIndex(String topic, int queue) throws IOException {
    QueueKey key = new QueueKey(topic, queue);
    QueueIndex found = queues.get(key);
    if (found == null) {
      Path directory = queueDir(topic, queue);
      if (Files.isDirectory(directory)) {
        found = new QueueIndex(directory, topic, queue, entriesPerFile);
        queues.put(key, found);
      }
    }
    return found;
  }

  Path queueDir(String topic, int queue) {
    return dataDir.resolve(INDEX_DIR).resolve(encodeTopicDir(topic)).resolve(String.valueOf(queue));
  }

  /** {@code {start offset, next offset}} of a queue; {@code {0, 0}} for one never written. */
  long[] queueBounds(String topic, int queue) throws IOException {
    QueueIndex index = queueIndex(topic, queue);
    if (index == null) {
      return new long[] {0, 0};
    }
    index.skipDeletedHead(startPosition());
    return new long[] {index.startOffset(), index.nextOffset};
  }

  /** The first offset stored at or after {@code timestampMs}; the next offset if none. */
  long offsetForTime(String topic, int queue, long timestampMs) throws IOException {
    QueueIndex index = queueIndex(topic, queue);
    if (index == null) {
      return 0;
    }
    long entry = index.entryForTime(timestampMs);
    if (entry >= index.nextEntry) {
      return index.nextOffset;
    }
    return index.firstOffset(Math.max(entry, index.startEntry));
  }

  // -- the commit log ----------------------------------------------------------------------

  private void refreshSegments() throws IOException {
    Map<Long, Path> onDisk = new TreeMap<>();
    Path directory = dataDir.resolve(COMMITLOG_DIR);
    if (Files.isDirectory(directory)) {
      try (DirectoryStream<Path> listing =
          Files.newDirectoryStream(directory, "*" + SEGMENT_SUFFIX)) {
        for (Path path : listing) {
          long base = numberOf(path);
          if (base % segmentSize != 0) {
            throw new IOException(path + " is not aligned to segment size " + segmentSize);
          }
          onDisk.put(base / segmentSize, path);
        }
      }
    }
    Set<Long> gone = new HashSet<>(segmentFiles.keySet());
    gone.removeAll(onDisk.keySet());
    for (Long number : gone) {
      segmentFiles.remove(number);
      segments.remove(number);
    }
    segmentFiles.putAll(onDisk);
  }

  /** Base position of the oldest segment still on disk (retention moves it). */
  long startPosition() {
    return segmentFiles.isEmpty() ? 0 : segmentFiles.firstKey() * segmentSize;
  }

  /**
   * The mapping of segment {@code number} covering at least {@code end} bytes when the file
   * has them (a segment file just created may not be extended yet); null when the segment is
   * gone (deleted by retention). New segments are looked for once before giving up.
   */
  MappedByteBuffer segment(long number, long end) throws IOException {
    MappedByteBuffer mapped = segments.get(number);
    if (mapped != null && mapped.capacity() >= end) {
      return mapped;
    }
    if (!segmentFiles.containsKey(number)) {
      refreshSegments();
    }
    Path path = segmentFiles.get(number);
    if (path == null) {
      return null;
    }
    try (FileChannel channel = FileChannel.open(path, StandardOpenOption.READ)) {
      long length = Math.min(segmentSize, channel.size());
      mapped = channel.map(FileChannel.MapMode.READ_ONLY, 0, length);
      mapped.order(ByteOrder.LITTLE_ENDIAN);
    } catch (NoSuchFileException deleted) {
      segmentFiles.remove(number);
      segments.remove(number);
      return null;
    }
    segments.put(number, mapped);
    return mapped;
  }

  /**
   * The frame at commit-log {@code position}, checked (length, magic, CRC32C) and copied out:
   * {@code core.log.commitlog.CommitLog.read_frame}, used to follow LINKs.
   */
  byte[] readFrame(long position) throws IOException {
    long number = position / segmentSize;
    int at = (int) (position % segmentSize);
    MappedByteBuffer mapped = segment(number, at + Layout.CRC_START);
    if (mapped == null) {
      throw new IOException("commit-log position " + position + ": its segment is gone");
    }
    int limit = mapped.capacity();
    if (at + Layout.CRC_START > limit) {
      throw Corruption.at(position, "truncated frame prefix");
    }
    long total = mapped.getInt(at + Layout.TOTAL_SIZE) & 0xFFFFFFFFL;
    int magic = mapped.getInt(at + Layout.MAGIC);
    if (magic != Layout.RECORD_MAGIC) {
      // A BLANK filler is never the target of an index entry or a LINK.
      throw Corruption.at(position, String.format("bad magic 0x%08x", magic));
    }
    if (total < Layout.HEADER_SIZE || at + total > limit) {
      throw Corruption.at(position, "bad size " + total);
    }
    byte[] frame = new byte[(int) total];
    mapped.get(at, frame, 0, frame.length);
    if (!Frames.crcMatches(frame, 0, frame.length)) {
      throw Corruption.at(position, "crc32c mismatch");
    }
    return frame;
  }

  // -- names (core/log/names.py) -----------------------------------------------------------

  static long numberOf(Path path) {
    String name = path.getFileName().toString();
    int dot = name.indexOf('.');
    return Long.parseLong(dot < 0 ? name : name.substring(0, dot));
  }

  private static boolean isDigits(String text) {
    if (text.isEmpty()) {
      return false;
    }
    for (int i = 0; i < text.length(); i++) {
      char c = text.charAt(i);
      if (c < '0' || c > '9') {
        return false;
      }
    }
    return true;
  }

  /** A topic name from its directory name: {@code %XX} escapes of UTF-8 bytes; "%" is "". */
  static String decodeTopicDir(String name) {
    if (name.equals("%")) {
      return "";
    }
    ByteArrayOutputStream raw = new ByteArrayOutputStream(name.length());
    int i = 0;
    while (i < name.length()) {
      char c = name.charAt(i);
      if (c == '%') {
        raw.write(Integer.parseInt(name.substring(i + 1, i + 3), 16));
        i += 3;
      } else {
        byte[] bytes = String.valueOf(c).getBytes(StandardCharsets.UTF_8);
        raw.write(bytes, 0, bytes.length);
        i += 1;
      }
    }
    return raw.toString(StandardCharsets.UTF_8);
  }

  /** Bytes outside {@code [A-Za-z0-9_.-]}, and a leading ".", become {@code %XX}. */
  static String encodeTopicDir(String topic) {
    StringBuilder out = new StringBuilder();
    int index = 0;
    for (int offset = 0; offset < topic.length(); ) {
      int codePoint = topic.codePointAt(offset);
      boolean safe =
          (codePoint >= 'A' && codePoint <= 'Z')
              || (codePoint >= 'a' && codePoint <= 'z')
              || (codePoint >= '0' && codePoint <= '9')
              || codePoint == '_'
              || codePoint == '.'
              || codePoint == '-';
      if (safe && !(index == 0 && codePoint == '.')) {
        out.appendCodePoint(codePoint);
      } else {
        for (byte b : new String(Character.toChars(codePoint)).getBytes(StandardCharsets.UTF_8)) {
          out.append(String.format("%%%02X", b & 0xFF));
        }
      }
      offset += Character.charCount(codePoint);
      index++;
    }
    return out.length() == 0 ? "%" : out.toString();
  }

  /** A queue of a topic, ordered as Python orders {@code (topic, queue)} tuples. */
  static final class QueueKey implements Comparable<QueueKey> {
    final String topic;
    final int queue;

    QueueKey(String topic, int queue) {
      this.topic = topic;
      this.queue = queue;
    }

    @Override
    public int compareTo(QueueKey other) {
      int byTopic = compareCodePoints(topic, other.topic);
      return byTopic != 0 ? byTopic : Integer.compare(queue, other.queue);
    }

    @Override
    public boolean equals(Object other) {
      return other instanceof QueueKey
          && ((QueueKey) other).topic.equals(topic)
          && ((QueueKey) other).queue == queue;
    }

    @Override
    public int hashCode() {
      return topic.hashCode() * 31 + queue;
    }

    @Override
    public String toString() {
      return topic + "/" + queue;
    }
  }

  /** Python compares strings by code point; Java's compareTo by UTF-16 unit (differs above
   * U+FFFF): the same order as the Python planner, so both plan the same partitions. */
  static int compareCodePoints(String left, String right) {
    int i = 0;
    int j = 0;
    while (i < left.length() && j < right.length()) {
      int a = left.codePointAt(i);
      int b = right.codePointAt(j);
      if (a != b) {
        return Integer.compare(a, b);
      }
      i += Character.charCount(a);
      j += Character.charCount(b);
    }
    return Integer.compare(left.length() - i, right.length() - j);
  }
}
