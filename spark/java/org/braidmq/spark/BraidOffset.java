package org.braidmq.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.Map;
import java.util.TreeMap;
import org.apache.spark.sql.connector.read.streaming.Offset;

/**
 * A stream's position: the next offset of every queue, JSON {@code {"topic": {"queue": next
 * offset}}} as the Python source writes it (topics sorted, queues in numeric order). Immutable
 * once built.
 */
final class BraidOffset extends Offset {
  private static final ObjectMapper JSON = new ObjectMapper();

  /** topic -> queue -> next offset. */
  final TreeMap<String, TreeMap<Integer, Long>> queues;

  BraidOffset(TreeMap<String, TreeMap<Integer, Long>> queues) {
    this.queues = queues;
  }

  static BraidOffset parse(String json) {
    TreeMap<String, TreeMap<Integer, Long>> queues = new TreeMap<>(LogDir::compareCodePoints);
    try {
      JsonNode parsed = JSON.readTree(json);
      for (Map.Entry<String, JsonNode> topic : parsed.properties()) {
        TreeMap<Integer, Long> byQueue = new TreeMap<>();
        for (Map.Entry<String, JsonNode> entry : topic.getValue().properties()) {
          byQueue.put(Integer.parseInt(entry.getKey()), entry.getValue().asLong());
        }
        queues.put(topic.getKey(), byQueue);
      }
    } catch (IOException error) {
      throw new UncheckedIOException(error);
    }
    return new BraidOffset(queues);
  }

  static TreeMap<String, TreeMap<Integer, Long>> empty() {
    return new TreeMap<>(LogDir::compareCodePoints);
  }

  Long get(String topic, int queue) {
    TreeMap<Integer, Long> byQueue = queues.get(topic);
    return byQueue == null ? null : byQueue.get(queue);
  }

  @Override
  public String json() {
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
