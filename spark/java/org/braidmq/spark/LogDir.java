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
import java.util.HashMap;
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
 *   DATA_DIR/epochs/00000000000000000007[.sealed]      a cluster shard's claims: the seals
 * </pre>
 *
 * <p>Seals ({@code core.log.fence}, docs/cluster.md section 5.4): an owner that took a cluster
 * shard over after an unclean stop records the recovered end of the last segment, and bytes of
 * that segment past it are a fenced old owner's. Every file of {@code epochs/} named by 20
 * digits (a claim) or 20 digits + {@code .sealed} (what its owner recorded when it opened the
 * log) is JSON with a {@code "sealed": {"<segment base>": end}} object; the seal of a segment
 * is the smallest end any file names. Each file is parsed once; one that does not parse (a
 * claim being written) is read again at the next {@link #refresh}. A single node's directory
 * has no {@code epochs/}: no seals, and nothing is checked per entry.
 *
 * <p>Segments are mapped whole (they are created sparse at full size, so one mapping sees what
 * the writer appends later). Not thread-safe: each Spark task opens its own (opening lists two
 * directories and maps lazily).
 */
final class LogDir {
  static final String META_FILE = "log.json";
  static final String COMMITLOG_DIR = "commitlog";
  static final String INDEX_DIR = "index";
  static final String EPOCHS_DIR = "epochs";
  private static final String SEALED_SUFFIX = ".sealed";
  private static final int EPOCH_DIGITS = 20;
  // Trailing bytes after the JSON value fail the parse, as Python's json.loads.
  private static final ObjectMapper EPOCH_JSON =
      new ObjectMapper()
          .enable(com.fasterxml.jackson.databind.DeserializationFeature.FAIL_ON_TRAILING_TOKENS);
  private static final String SEGMENT_SUFFIX = ".log";
  /** A MappedByteBuffer holds at most this much: larger segments are refused (as decode.py). */
  static final long MAX_SEGMENT_BYTES = Integer.MAX_VALUE;

  final Path dataDir;
  final long segmentSize;
  final int entriesPerFile;
  private final TreeMap<Long, Path> segmentFiles = new TreeMap<>();
  private final Map<Long, MappedByteBuffer> segments = new TreeMap<>();
  private final TreeMap<QueueKey, QueueIndex> queues = new TreeMap<>();
  // The seals of each epoch file parsed so far, and merged: segment base -> end of its bytes.
  private final Map<String, Map<Long, Long>> epochFiles = new HashMap<>();
  private Map<Long, Long> seals = new HashMap<>();

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
    refreshSeals();
  }

  // -- catalogue ---------------------------------------------------------------------------

  /** Pick up what a running broker appended: new segments, queues, index entries and seals. */
  void refresh() throws IOException {
    refreshSegments();
    discoverQueues();
    for (QueueIndex index : queues.values()) {
      index.refresh();
    }
    // After the index: a seal is written before its owner's first write, so entries read
    // before it are bounded by every seal written before them.
    refreshSeals();
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
   * {@code core.log.commitlog.CommitLog.read_frame}, used to follow LINKs. A position at or
   * past its segment's seal is refused.
   */
  byte[] readFrame(long position) throws IOException {
    long number = position / segmentSize;
    int at = (int) (position % segmentSize);
    MappedByteBuffer mapped = segment(number, at + Layout.CRC_START);
    if (mapped == null) {
      throw new IOException("commit-log position " + position + ": its segment is gone");
    }
    if (pastSeal(position)) {
      // A fenced owner's bytes, not the log's: CommitLog.read_frame's KeyError.
      throw new IOException("commit-log position " + position + ": past its segment's seal");
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

  // -- seals (core/log/fence.py) -----------------------------------------------------------

  /**
   * Read the epoch files not parsed yet (one directory listing; a file that does not parse is
   * left for the next call) and merge the seals: {@code core.log.fence.Seals.refresh}.
   */
  void refreshSeals() throws IOException {
    Path directory = dataDir.resolve(EPOCHS_DIR);
    List<String> names = new ArrayList<>();
    try (DirectoryStream<Path> listing = Files.newDirectoryStream(directory)) {
      for (Path path : listing) {
        names.add(path.getFileName().toString());
      }
    } catch (NoSuchFileException none) {
      return; // a single node's directory, or a shard never claimed
    }
    boolean added = false;
    for (String name : names) {
      if (epochFiles.containsKey(name) || !isEpochFileName(name)) {
        continue;
      }
      byte[] data;
      try {
        data = Files.readAllBytes(directory.resolve(name));
      } catch (NoSuchFileException gone) {
        continue;
      }
      Map<Long, Long> found = parseSeals(data);
      if (found != null) {
        epochFiles.put(name, found);
        added = added || !found.isEmpty();
      }
    }
    if (added) {
      Map<Long, Long> merged = new HashMap<>();
      for (Map<Long, Long> found : epochFiles.values()) {
        for (Map.Entry<Long, Long> seal : found.entrySet()) {
          merged.merge(seal.getKey(), seal.getValue(), Math::min);
        }
      }
      seals = merged;
    }
  }

  /** Segment base position -> the end of its valid bytes; empty for most directories. */
  Map<Long, Long> seals() {
    return seals;
  }

  /** Whether {@code position} is at or past its segment's seal (a fenced owner's bytes). */
  boolean pastSeal(long position) {
    if (seals.isEmpty()) {
      return false;
    }
    Long end = seals.get(position - position % segmentSize);
    return end != null && position >= end;
  }

  /** {@code <20 digits>} (a claim) or {@code <20 digits>.sealed}; not a {@code .tmp}. */
  static boolean isEpochFileName(String name) {
    String digits =
        name.endsWith(SEALED_SUFFIX)
            ? name.substring(0, name.length() - SEALED_SUFFIX.length())
            : name;
    return digits.length() == EPOCH_DIGITS && isDigits(digits);
  }

  /** The {@code sealed} map of an epoch file's JSON; null when it does not parse (torn). */
  static Map<Long, Long> parseSeals(byte[] data) {
    JsonNode sealed;
    try {
      JsonNode parsed = EPOCH_JSON.readTree(data);
      sealed = parsed == null || !parsed.isObject() ? null : parsed.get("sealed");
    } catch (IOException torn) {
      return null;
    }
    if (sealed == null || !sealed.isObject()) {
      return null;
    }
    Map<Long, Long> found = new HashMap<>();
    for (Map.Entry<String, JsonNode> field : sealed.properties()) {
      JsonNode end = field.getValue();
      if (!end.isIntegralNumber() || !end.canConvertToLong()) {
        return null;
      }
      try {
        found.put(Long.parseLong(field.getKey().trim()), end.asLong());
      } catch (NumberFormatException notANumber) {
        return null;
      }
    }
    return found;
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
