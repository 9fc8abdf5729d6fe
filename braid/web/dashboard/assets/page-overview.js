// Overview: publish and deliver rates per protocol as live charts, connections per protocol,
// queue totals, disk, memory, alarms.

import { check, get, metrics } from "./api.js";
import { LineChart } from "./chart.js";
import { Section, bytes, count, h } from "./dom.js";

const POLL_MS = 2000;
const WINDOW = 90; // samples: three minutes at one per two seconds

// Each protocol's counters on /metrics, summed over its plain and TLS listeners. "publish" is
// what its clients sent in, "deliver" what its clients were sent. Kafka's fetches are served
// as stored batches without counting records, so its consumption is the consumer groups'
// committed offsets moving (kafka_exporter's kafka_consumergroup_current_offset).
const PROTOCOLS = [
  {
    id: "amqp",
    title: "AMQP 0-9-1",
    publish: ["braid_amqp_published_total", "braid_amqps_published_total"],
    deliver: ["braid_amqp_delivered_total", "braid_amqps_delivered_total"],
  },
  {
    id: "mqtt",
    title: "MQTT",
    publish: ["mqtt", "mqtts", "mqtt_ws", "mqtt_wss"].map((p) => `braid_${p}_publishes_received_total`),
    deliver: ["mqtt", "mqtts", "mqtt_ws", "mqtt_wss"].map((p) => `braid_${p}_publishes_sent_total`),
  },
  {
    id: "kafka",
    title: "Kafka",
    publish: ["braid_kafka_produced_records_total"],
    deliver: ["kafka_consumergroup_current_offset"],
  },
];

const CONNECTION_PROTOCOLS = ["AMQP 0-9-1", "MQTT 3.1.1", "MQTT 5.0", "Kafka"];

function total(sums, names) {
  return names.reduce((sum, name) => sum + (sums.get(name) || 0), 0);
}

function card(name, label, value, detail, bad = false) {
  return h("div", { class: bad ? "card bad" : "card", "data-card": name }, h("div", { class: "label" }, label), h("div", { class: "value" }, value), detail ? h("div", { class: "detail" }, detail) : null);
}

export const overview = {
  id: "overview",
  title: "Overview",
  mount(root, ctx) {
    const charts = new Map(
      PROTOCOLS.map((p) => [
        p.id,
        new LineChart(p.id, `${p.title} messages per second`, [
          { id: "publish", label: "publish" },
          { id: "deliver", label: "deliver" },
        ], WINDOW),
      ]),
    );
    root.append(h("div", { class: "charts" }, [...charts.values()].map((c) => c.element)));
    const totals = new Section(root, "Broker", "totals");
    let previous = null;

    ctx.every(POLL_MS, async () => {
      const [sums, summary, connections, alarms] = await Promise.all([
        metrics(),
        get("overview"),
        get("connections"),
        check("health/checks/alarms"),
      ]);
      const now = performance.now();
      const current = new Map(PROTOCOLS.map((p) => [p.id, { publish: total(sums, p.publish), deliver: total(sums, p.deliver) }]));
      if (previous !== null) {
        const seconds = (now - previous.at) / 1000;
        for (const p of PROTOCOLS) {
          const before = previous.counts.get(p.id);
          const after = current.get(p.id);
          charts.get(p.id).push({
            publish: (after.publish - before.publish) / seconds,
            deliver: (after.deliver - before.deliver) / seconds,
          });
        }
      }
      previous = { at: now, counts: current };

      const byProtocol = new Map(CONNECTION_PROTOCOLS.map((p) => [p, 0]));
      for (const c of connections) byProtocol.set(c.protocol, (byProtocol.get(c.protocol) || 0) + 1);
      const logBytes = (sums.get("braid_log_write_position_bytes") || 0) - (sums.get("braid_log_start_position_bytes") || 0);
      const diskLimit = sums.get("rabbitmq_disk_space_available_limit_bytes") || 0;
      const queued = summary.queue_totals || {};
      const objects = summary.object_totals || {};
      const data = {
        byProtocol: [...byProtocol],
        queued,
        objects,
        disk: sums.get("rabbitmq_disk_space_available_bytes"),
        diskLimit,
        logBytes,
        memory: sums.get("rabbitmq_process_resident_memory_bytes"),
        fds: [sums.get("rabbitmq_process_open_fds"), sums.get("rabbitmq_process_max_fds")],
        alarm: alarms.status === "ok" ? null : alarms.reason || "alarm",
        version: `${summary.product_name} ${summary.product_version} (RabbitMQ API ${summary.management_version})`,
      };
      totals.show(data, (d) =>
        h(
          "div",
          {},
          h(
            "div",
            { class: "cards" },
            card("alarms", "Alarms", d.alarm ? d.alarm : "none", d.alarm ? "publishers are held back" : "publishing open", Boolean(d.alarm)),
            ...d.byProtocol.map(([protocol, n]) => card(`connections-${protocol}`, `${protocol} connections`, count(n))),
            card("queues", "AMQP queues", count(d.objects.queues), `${count(d.objects.consumers)} consumers`),
            card("messages", "Messages queued", count(d.queued.messages), `${count(d.queued.messages_ready)} ready, ${count(d.queued.messages_unacknowledged)} unacked`),
            card("disk", "Disk free", bytes(d.disk), `log ${bytes(d.logBytes)}; alarm below ${d.diskLimit ? bytes(d.diskLimit) : "(none set)"}`),
            card("memory", "Memory (RSS)", bytes(d.memory), `${count(d.fds[0])} of ${count(d.fds[1])} file descriptors`),
          ),
          h("p", { class: "note" }, d.version),
        ),
      );
    });
  },
};
