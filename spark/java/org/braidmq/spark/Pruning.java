package org.braidmq.spark;

import java.io.IOException;
import java.io.Serializable;
import java.sql.Timestamp;
import java.time.Instant;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import org.apache.spark.sql.sources.And;
import org.apache.spark.sql.sources.EqualTo;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.sources.GreaterThan;
import org.apache.spark.sql.sources.GreaterThanOrEqual;
import org.apache.spark.sql.sources.In;
import org.apache.spark.sql.sources.LessThan;
import org.apache.spark.sql.sources.LessThanOrEqual;

/**
 * What the filters Spark pushes down say about where rows can be: which shards, topics and
 * queues, which offsets, which store times. Planning reads only those queues and ranges, found in the
 * index without touching a record (store times are binary-searched, as {@code startTime}
 * does). Pruning only narrows what is read: Spark still applies every filter to the rows, so
 * the answers are those of a full read. Immutable once built.
 */
final class Pruning implements Serializable {
  private static final long serialVersionUID = 1L;
  static final Pruning NONE = new Pruning();

  private Set<String> topics; // null: any topic
  private Set<Integer> queues; // null: any queue
  private Set<Integer> shards; // null: any shard (a single-node directory's is null: none)
  private long offsetLow = Long.MIN_VALUE; // first offset that can match
  private long offsetHigh = Long.MAX_VALUE; // offsets from here on cannot match
  private Long storeLowMs; // entries stored before this cannot match
  private Long storeHighMs; // entries stored at or after this cannot match
  private final List<Filter> used = new ArrayList<>();

  /** The pruning the given filters allow, and which of them it used. */
  static Pruning of(Filter[] filters) {
    Pruning pruning = new Pruning();
    for (Filter filter : filters) {
      pruning.add(filter);
    }
    return pruning;
  }

  Filter[] used() {
    return used.toArray(new Filter[0]);
  }

  private boolean add(Filter filter) {
    boolean understood;
    if (filter instanceof And) {
      boolean left = add(((And) filter).left());
      boolean right = add(((And) filter).right());
      understood = left || right;
    } else if (filter instanceof EqualTo) {
      EqualTo equal = (EqualTo) filter;
      understood = restrict(equal.attribute(), new Object[] {equal.value()});
    } else if (filter instanceof In) {
      In in = (In) filter;
      understood = restrict(in.attribute(), in.values());
    } else if (filter instanceof GreaterThan) {
      GreaterThan greater = (GreaterThan) filter;
      understood = bound(greater.attribute(), greater.value(), true, false);
    } else if (filter instanceof GreaterThanOrEqual) {
      GreaterThanOrEqual greater = (GreaterThanOrEqual) filter;
      understood = bound(greater.attribute(), greater.value(), true, true);
    } else if (filter instanceof LessThan) {
      LessThan less = (LessThan) filter;
      understood = bound(less.attribute(), less.value(), false, false);
    } else if (filter instanceof LessThanOrEqual) {
      LessThanOrEqual less = (LessThanOrEqual) filter;
      understood = bound(less.attribute(), less.value(), false, true);
    } else {
      understood = false;
    }
    if (understood && !(filter instanceof And)) {
      used.add(filter);
    }
    return understood;
  }

  /** {@code attribute} IN {@code values}. */
  private boolean restrict(String attribute, Object[] values) {
    switch (attribute) {
      case "topic":
        Set<String> named = new HashSet<>();
        for (Object value : values) {
          if (value != null) {
            named.add(value.toString());
          }
        }
        if (topics != null) {
          named.retainAll(topics);
        }
        topics = named;
        return true;
      case "queue":
        Set<Integer> numbers = integers(values);
        if (queues != null) {
          numbers.retainAll(queues);
        }
        queues = numbers;
        return true;
      case "shard":
        Set<Integer> chosen = integers(values);
        if (shards != null) {
          chosen.retainAll(shards);
        }
        shards = chosen;
        return true;
      case "offset":
      case "store_timestamp":
        if (values.length == 0) {
          return bound(attribute, 0L, false, false) && bound(attribute, 0L, true, true);
        }
        Object lowest = null;
        Object highest = null;
        for (Object value : values) {
          if (value == null) {
            continue;
          }
          if (lowest == null || micros(value) < micros(lowest)) {
            lowest = value;
          }
          if (highest == null || micros(value) > micros(highest)) {
            highest = value;
          }
        }
        if (lowest == null) {
          return false;
        }
        return bound(attribute, lowest, true, true) && bound(attribute, highest, false, true);
      default:
        return false;
    }
  }

  private static Set<Integer> integers(Object[] values) {
    Set<Integer> numbers = new HashSet<>();
    for (Object value : values) {
      if (value instanceof Number) {
        numbers.add(((Number) value).intValue());
      }
    }
    return numbers;
  }

  /** {@code attribute} above (or below) {@code value}, inclusive or not. */
  private boolean bound(String attribute, Object value, boolean lower, boolean inclusive) {
    if (value == null) {
      return false;
    }
    if (attribute.equals("offset") && value instanceof Number) {
      long offset = ((Number) value).longValue();
      if (lower) {
        offsetLow = Math.max(offsetLow, inclusive ? offset : offset + 1);
      } else {
        offsetHigh = Math.min(offsetHigh, inclusive ? offset + 1 : offset);
      }
      return true;
    }
    if (attribute.equals("store_timestamp") && isTime(value)) {
      long us = micros(value);
      // store_timestamp is the index entry's store_ms in microseconds.
      long floorMs = Math.floorDiv(us, 1000L);
      long ceilMs = -Math.floorDiv(-us, 1000L);
      if (lower) {
        long low = inclusive ? ceilMs : floorMs + 1;
        storeLowMs = storeLowMs == null ? low : Math.max(storeLowMs, low);
      } else {
        long high = inclusive ? floorMs + 1 : ceilMs;
        storeHighMs = storeHighMs == null ? high : Math.min(storeHighMs, high);
      }
      return true;
    }
    return false;
  }

  private static boolean isTime(Object value) {
    return value instanceof Timestamp || value instanceof Instant;
  }

  private static long micros(Object value) {
    if (value instanceof Timestamp) {
      Timestamp time = (Timestamp) value;
      return Math.floorDiv(time.getTime(), 1000L) * 1_000_000L + time.getNanos() / 1000;
    }
    if (value instanceof Instant) {
      Instant time = (Instant) value;
      return time.getEpochSecond() * 1_000_000L + time.getNano() / 1000;
    }
    return ((Number) value).longValue();
  }

  boolean allows(String topic, int queue) {
    return (topics == null || topics.contains(topic)) && (queues == null || queues.contains(queue));
  }

  /** Whether rows of {@code shard} can match ({@link Slice#NO_SHARD}: a null shard never equals). */
  boolean allowsShard(int shard) {
    return shards == null || (shard != Slice.NO_SHARD && shards.contains(shard));
  }

  long narrowStart(LogDir log, LogDir.QueueKey key, long start) throws IOException {
    long narrowed = Math.max(start, offsetLow);
    if (storeLowMs != null) {
      narrowed = Math.max(narrowed, log.offsetForTime(key.topic, key.queue, storeLowMs));
    }
    return narrowed;
  }

  long narrowEnd(LogDir log, LogDir.QueueKey key, long end) throws IOException {
    long narrowed = Math.min(end, offsetHigh);
    if (storeHighMs != null) {
      narrowed = Math.min(narrowed, log.offsetForTime(key.topic, key.queue, storeHighMs));
    }
    return narrowed;
  }
}
