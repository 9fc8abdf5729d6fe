package org.braidmq.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.Map;
import java.util.TreeMap;
import org.apache.spark.sql.connector.read.streaming.Offset;

/**
 * A stream's position: the next offset of every queue, as the Python source writes it ({@code
 * spark.source.encode_offsets}). A single-node directory's is JSON {@code {"topic": {"queue":
 * next offset}}} (topics sorted, queues in numeric order), as before there were shards; a
 * cluster root's is {@code {"format": 2, "shards": {"0003": {"topic": {"queue": next offset}}}}}
 * (shards ascending, those holding no queue left out). An unversioned offset read on a root was
 * written before the directory was adopted: it is the adopted shard's. Immutable once built.
 */
final class BraidOffset extends Offset {
  private static final ObjectMapper JSON = new ObjectMapper();
  /** The version of a cluster root's offsets (a single-node directory's have none). */
  static final int ROOT_FORMAT = 2;

  /** Whether this is a cluster root's position (written versioned, per shard). */
  final boolean root;

  /** shard ({@link Slice#NO_SHARD} for a single-node directory) -> topic -> queue -> next. */
  final TreeMap<Integer, TreeMap<String, TreeMap<Integer, Long>>> shards;

  BraidOffset(boolean root, TreeMap<Integer, TreeMap<String, TreeMap<Integer, Long>>> shards) {
    this.root = root;
    this.shards = shards;
  }

  static BraidOffset parse(String json, DataRoot where) {
    TreeMap<Integer, TreeMap<String, TreeMap<Integer, Long>>> shards = new TreeMap<>();
    try {
      JsonNode parsed = JSON.readTree(json);
      JsonNode version = parsed.get("format");
      if (version != null && version.isIntegralNumber()) {
        if (version.asInt() != ROOT_FORMAT) {
          throw new IllegalArgumentException(
              "stream offsets of format " + version + ": this reader knows 1 and 2");
        }
        if (!where.isRoot()) {
          throw new IllegalArgumentException(
              "the stream's offsets are a cluster root's (per shard), but "
                  + where.path
                  + " is a single-node data directory");
        }
        for (Map.Entry<String, JsonNode> shard : parsed.get("shards").properties()) {
          shards.put(Integer.parseInt(shard.getKey()), topics(shard.getValue()));
        }
      } else {
        TreeMap<String, TreeMap<Integer, Long>> single = topics(parsed);
        if (!where.isRoot()) {
          shards.put(Slice.NO_SHARD, single);
        } else if (!single.isEmpty()) {
          if (where.legacyShard == null) {
            throw new IllegalArgumentException(
                "the stream's offsets are a single-node directory's, and the cluster root "
                    + where.path
                    + " adopted none (no legacy shard): start the query with a new checkpoint");
          }
          shards.put(where.legacyShard, single);
        }
      }
    } catch (IOException error) {
      throw new UncheckedIOException(error);
    }
    return new BraidOffset(where.isRoot(), shards);
  }

  private static TreeMap<String, TreeMap<Integer, Long>> topics(JsonNode node) {
    TreeMap<String, TreeMap<Integer, Long>> queues = empty();
    for (Map.Entry<String, JsonNode> topic : node.properties()) {
      TreeMap<Integer, Long> byQueue = new TreeMap<>();
      for (Map.Entry<String, JsonNode> entry : topic.getValue().properties()) {
        byQueue.put(Integer.parseInt(entry.getKey()), entry.getValue().asLong());
      }
      queues.put(topic.getKey(), byQueue);
    }
    return queues;
  }

  /** An empty topic -> queue -> offset map, topics ordered as Python orders them. */
  static TreeMap<String, TreeMap<Integer, Long>> empty() {
    return new TreeMap<>(LogDir::compareCodePoints);
  }

  Long get(int shard, String topic, int queue) {
    TreeMap<String, TreeMap<Integer, Long>> topics = shards.get(shard);
    TreeMap<Integer, Long> byQueue = topics == null ? null : topics.get(topic);
    return byQueue == null ? null : byQueue.get(queue);
  }

  @Override
  public String json() {
    if (!root) {
      TreeMap<String, TreeMap<Integer, Long>> single = shards.get(Slice.NO_SHARD);
      return topicsJson(single == null ? empty() : single);
    }
    StringBuilder out = new StringBuilder("{\"format\": ").append(ROOT_FORMAT);
    out.append(", \"shards\": {");
    String separator = "";
    for (Map.Entry<Integer, TreeMap<String, TreeMap<Integer, Long>>> shard : shards.entrySet()) {
      if (shard.getKey() == Slice.NO_SHARD || shard.getValue().isEmpty()) {
        continue;
      }
      out.append(separator).append(String.format("\"%04d\": ", shard.getKey()));
      out.append(topicsJson(shard.getValue()));
      separator = ", ";
    }
    return out.append("}}").toString();
  }

  private static String topicsJson(TreeMap<String, TreeMap<Integer, Long>> queues) {
    StringBuilder out = new StringBuilder("{");
    String topicSeparator = "";
    for (Map.Entry<String, TreeMap<Integer, Long>> topic : queues.entrySet()) {
      out.append(topicSeparator).append(quote(topic.getKey())).append(": {");
      String queueSeparator = "";
      for (Map.Entry<Integer, Long> queue : topic.getValue().entrySet()) {
        out.append(queueSeparator).append('"').append(queue.getKey()).append("\": ");
        out.append(queue.getValue());
        queueSeparator = ", ";
      }
      out.append('}');
      topicSeparator = ", ";
    }
    return out.append('}').toString();
  }

  private static String quote(String text) {
    try {
      return JSON.writeValueAsString(text);
    } catch (IOException error) {
      throw new UncheckedIOException(error);
    }
  }
}
