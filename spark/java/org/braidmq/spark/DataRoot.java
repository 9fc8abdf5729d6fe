package org.braidmq.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;

/**
 * What a read's {@code path} is: a single-node data directory, or a cluster's data root ({@code
 * spark.readers.DataRoot}, docs/cluster.md section 2) whose {@code shards/%04d/} are each a data
 * directory, read shard by shard. {@code cluster.json} names the shard count (and the shard an
 * adopted single-node directory became); a shard nobody has written yet (no {@code log.json})
 * is skipped until it has one. Immutable.
 */
final class DataRoot {
  static final String CLUSTER_FILE = "cluster.json";
  static final String PENDING_FILE = "cluster.json.pending";
  static final String SHARDS_DIR = "shards";
  static final int CLUSTER_FORMAT = 1;

  final String path;
  /** 0: a single-node directory. */
  final int shards;
  /** The shard an adopted single-node directory became; null if none. */
  final Integer legacyShard;

  private DataRoot(String path, int shards, Integer legacyShard) {
    this.path = path;
    this.shards = shards;
    this.legacyShard = legacyShard;
  }

  boolean isRoot() {
    return shards > 0;
  }

  /** Reads {@code cluster.json} each time (one small file): a root, else a single node. */
  static DataRoot of(String path) throws IOException {
    Path root = Paths.get(path);
    Path file = root.resolve(CLUSTER_FILE);
    byte[] raw;
    try {
      raw = Files.readAllBytes(file);
    } catch (NoSuchFileException absent) {
      if (Files.exists(root.resolve(PENDING_FILE))) {
        throw new IOException(
            path + ": `braid cluster init` did not finish (" + PENDING_FILE + " is there)");
      }
      return new DataRoot(path, 0, null);
    }
    JsonNode layout;
    try {
      layout = new ObjectMapper().readTree(raw);
    } catch (IOException error) {
      throw new IOException(file + " is not a valid cluster file: " + error.getMessage(), error);
    }
    JsonNode format = layout == null ? null : layout.get("format");
    JsonNode count = layout == null ? null : layout.get("shards");
    if (format == null || count == null || !count.canConvertToInt()) {
      throw new IOException(file + " is not a valid cluster file: no format or shards");
    }
    if (!format.isInt() || format.asInt() != CLUSTER_FORMAT) {
      throw new IOException(
          file + " has format " + format + "; this reader knows format " + CLUSTER_FORMAT);
    }
    JsonNode legacy = layout.get("legacy_shard");
    Integer legacyShard = legacy == null || legacy.isNull() ? null : legacy.asInt();
    return new DataRoot(path, count.asInt(), legacyShard);
  }

  /** The data directory of a shard of the root {@code path}; {@code path} for NO_SHARD. */
  static String shardDir(String path, int shard) {
    if (shard == Slice.NO_SHARD) {
      return path;
    }
    return Paths.get(path, SHARDS_DIR, String.format("%04d", shard)).toString();
  }

  /**
   * The shards holding a log, ascending: {@code [NO_SHARD]} for a single-node directory (opening
   * it says what is wrong with it).
   */
  List<Integer> shardsWithLogs() {
    List<Integer> found = new ArrayList<>();
    if (!isRoot()) {
      found.add(Slice.NO_SHARD);
      return found;
    }
    for (int shard = 0; shard < shards; shard++) {
      if (Files.exists(Paths.get(shardDir(path, shard), LogDir.META_FILE))) {
        found.add(shard);
      }
    }
    return found;
  }
}
