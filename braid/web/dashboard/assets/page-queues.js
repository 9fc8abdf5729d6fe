// Queues and topics: AMQP queues with depth, rate and consumers (purge, delete); every topic's
// partitions with their offsets and each Kafka group's lag on them.

import { get, remove, seg } from "./api.js";
import { Section, button, count, h, perSecond, table } from "./dom.js";

const POLL_MS = 2000;

function queueActions(ctx, q) {
  if (!ctx.managesQueues) return "";
  const where = `queues/${seg(q.vhost)}/${seg(q.name)}`;
  return h(
    "span",
    { class: "actions" },
    button("Purge", () => ctx.act(`Purge the ${q.messages_ready} ready messages of queue '${q.name}'?`, () => remove(`${where}/contents`), `purged queue '${q.name}'`), { "data-action": "purge" }),
    button("Delete", () => ctx.act(`Delete queue '${q.name}' and its messages?`, () => remove(where), `deleted queue '${q.name}'`), { "data-action": "delete", class: "danger" }),
  );
}

function browseLink(ctx, topic, partition, end) {
  if (!ctx.admin || end < 1) return "";
  const query = new URLSearchParams({ topic, partition: String(partition), offset: String(end - 1) });
  return h("a", { href: `#/browser?${query}`, "data-action": "browse" }, "newest");
}

export const queues = {
  id: "queues",
  title: "Queues & topics",
  mount(root, ctx) {
    const amqp = new Section(root, "AMQP queues", "queues");
    const topics = new Section(root, "Topics and partitions (Kafka lag per group)", "topics");

    ctx.every(POLL_MS, async () => {
      const listed = await get("queues");
      const rows = listed.map((q) => ({
        vhost: q.vhost,
        name: q.name,
        messages: q.messages,
        messages_ready: q.messages_ready,
        messages_unacknowledged: q.messages_unacknowledged,
        rate: (q.messages_details || {}).rate || 0,
        consumers: q.consumers,
        arguments: q.arguments,
      }));
      amqp.show(rows, (data) =>
        table("queues", [
          { id: "vhost", label: "Vhost", value: (q) => q.vhost },
          { id: "name", label: "Name", value: (q) => q.name },
          { id: "ready", label: "Ready", cls: "num", value: (q) => count(q.messages_ready) },
          { id: "unacked", label: "Unacked", cls: "num", value: (q) => count(q.messages_unacknowledged) },
          { id: "messages", label: "Total", cls: "num", value: (q) => count(q.messages) },
          { id: "rate", label: "Depth change", cls: "num", value: (q) => perSecond(q.rate) },
          { id: "consumers", label: "Consumers", cls: "num", value: (q) => count(q.consumers) },
          { id: "arguments", label: "Arguments", value: (q) => Object.keys(q.arguments || {}).join(", ") },
          { id: "actions", label: "", value: (q) => queueActions(ctx, q) },
        ], data, (q) => `${q.vhost}|${q.name}`, "no queues"),
      );
    });

    if (!ctx.monitors) {
      topics.note("Topics and consumer groups need the monitoring tag.");
      return;
    }
    // Each partition's log end at the last poll: records appended per second between polls
    // (the API gives offsets, not rates).
    let ends = new Map();
    let endsAt = 0;
    ctx.every(POLL_MS, async () => {
      const [listed, groups] = await Promise.all([get("braid/kafka/topics"), get("braid/kafka/groups")]);
      const now = performance.now();
      const seconds = (now - endsAt) / 1000;
      const lags = new Map();
      for (const group of groups) {
        for (const p of group.partitions) {
          const key = `${p.topic}|${p.partition}`;
          if (!lags.has(key)) lags.set(key, []);
          lags.get(key).push(`${group.group_id}: ${p.lag}`);
        }
      }
      const rows = listed.flatMap((t) =>
        t.partitions.map((p) => {
          const key = `${t.name}|${p.partition}`;
          const before = ends.get(key);
          const rate = before === undefined ? null : Math.max(0, p.log_end_offset - before) / seconds;
          return { topic: t.name, ...p, rate, lag: lags.get(key) || [] };
        }),
      );
      ends = new Map(rows.map((r) => [`${r.topic}|${r.partition}`, r.log_end_offset]));
      endsAt = now;
      topics.show(rows, (data) =>
        table("topics", [
          { id: "topic", label: "Topic", value: (r) => r.topic },
          { id: "partition", label: "Partition", cls: "num", value: (r) => r.partition },
          { id: "start", label: "Log start", cls: "num", value: (r) => count(r.log_start_offset) },
          { id: "end", label: "Log end", cls: "num", value: (r) => count(r.log_end_offset) },
          { id: "messages", label: "Records", cls: "num", value: (r) => count(r.messages) },
          { id: "rate", label: "Appended", cls: "num", value: (r) => perSecond(r.rate) },
          { id: "lag", label: "Group lag", value: (r) => r.lag.join("; ") },
          { id: "browse", label: "", value: (r) => browseLink(ctx, r.topic, r.partition, r.log_end_offset) },
        ], data, (r) => `${r.topic}|${r.partition}`, "no topics"),
      );
    });
  },
};
