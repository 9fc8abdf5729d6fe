// The message browser: one stored record (topic, partition, offset) as the log holds it and
// as a Kafka consumer, an AMQP consumer and an MQTT subscriber are sent it, side by side.

import { get, seg } from "./api.js";
import { button, h, shown, when } from "./dom.js";

function fields(view, rows) {
  return h(
    "dl",
    {},
    rows.flatMap(([name, value]) => [h("dt", {}, name), h("dd", { "data-field": `${view}.${name}` }, value === undefined || value === null || value === "" ? "(none)" : String(value))]),
  );
}

function panel(view, title, subtitle, rows) {
  return h("section", { class: "view", "data-view": view }, h("h2", {}, title), h("p", { class: "note" }, subtitle), fields(view, rows));
}

function headerList(headers, keyName) {
  return headers.map((header) => `${header[keyName]}=${shown(header.value)}`).join(", ");
}

function views(record) {
  const { stored, kafka, amqp, mqtt } = record;
  const props = mqtt.properties;
  return h(
    "div",
    { class: "views" },
    panel("stored", "Stored", "what the log holds", [
      ["protocol", stored.protocol],
      ["published_to", stored.published_to],
      ["subject", stored.subject],
      ["key", shown(stored.key)],
      ["client", stored.client],
      ["address", stored.address],
      ["born", when(stored.born_ms)],
      ["stored", when(stored.store_ms)],
      ["position", stored.position],
      ["batch_records", stored.batch_records],
      ["tags", (stored.tags || []).join(", ")],
      ["headers", headerList(stored.headers, "name")],
      ["body", shown(stored.body)],
    ]),
    panel("kafka", "Kafka", "what a consumer of this partition fetches", [
      ["topic", kafka.topic],
      ["partition", kafka.partition],
      ["offset", kafka.offset],
      ["timestamp", `${kafka.timestamp} (${when(kafka.timestamp)})`],
      ["key", shown(kafka.key)],
      ["value", shown(kafka.value)],
      ["headers", headerList(kafka.headers, "key")],
    ]),
    panel("amqp", "AMQP 0-9-1", "what basic.deliver carries", [
      ["vhost", amqp.vhost],
      ["exchange", amqp.exchange],
      ["routing_key", amqp.routing_key],
      ...Object.entries(amqp.properties).map(([name, value]) => [name, typeof value === "object" ? JSON.stringify(value) : value]),
      ["headers", JSON.stringify(amqp.headers)],
      ["payload_bytes", amqp.payload_bytes],
    ]),
    panel("mqtt", "MQTT", "what a subscriber is sent (3.1.1: topic, QoS, payload)", [
      ["topic", mqtt.topic],
      ["qos", mqtt.qos],
      ["retain", mqtt.retain],
      ["content_type", props.content_type],
      ["response_topic", props.response_topic],
      ["correlation_data", props.correlation_data ? shown(props.correlation_data) : null],
      ["message_expiry_interval", props.message_expiry_interval],
      ["payload_format_indicator", props.payload_format_indicator],
      ["user_properties", props.user_properties.map(([k, v]) => `${k}=${v}`).join(", ")],
      ["payload_bytes", mqtt.payload_bytes],
    ]),
  );
}

export const browser = {
  id: "browser",
  title: "Message browser",
  needs: (ctx) => (ctx.admin ? null : "The message browser shows message bodies: it needs the administrator tag."),
  mount(root, ctx) {
    const topic = h("input", { name: "topic", list: "topics", required: true, placeholder: "topic", value: ctx.params.get("topic") || "" });
    const partition = h("input", { name: "partition", type: "number", min: 0, required: true, value: ctx.params.get("partition") || "0" });
    const offset = h("input", { name: "offset", type: "number", min: 0, required: true, value: ctx.params.get("offset") || "0" });
    const names = h("datalist", { id: "topics" });
    const result = h("div", { "data-record": "" });

    const show = async () => {
      const where = `${topic.value}/${partition.value}/${offset.value}`;
      history.replaceState(null, "", `#/browser?${new URLSearchParams({ topic: topic.value, partition: partition.value, offset: offset.value })}`);
      result.replaceChildren(h("p", { class: "note" }, `reading ${where}…`));
      try {
        const record = await get(`braid/records/${seg(topic.value)}/${seg(partition.value)}/${seg(offset.value)}`);
        if (!ctx.live()) return;
        result.dataset.record = where;
        result.replaceChildren(views(record));
      } catch (error) {
        result.dataset.record = "";
        result.replaceChildren(h("p", { class: "note bad", "data-error": "true" }, `${where}: ${error.reason || error.message}`));
      }
    };
    const step = (by) => () => {
      offset.value = String(Math.max(0, Number(offset.value) + by));
      show();
    };
    const form = h(
      "form",
      { class: "browse", onsubmit: (event) => { event.preventDefault(); show(); } },
      h("label", {}, "Topic ", topic),
      h("label", {}, "Partition ", partition),
      h("label", {}, "Offset ", offset),
      h("button", { type: "submit", "data-action": "show" }, "Show"),
      button("◀", step(-1), { title: "previous offset", "data-action": "previous" }),
      button("▶", step(1), { title: "next offset", "data-action": "next" }),
      names,
    );
    root.append(form, result);
    ctx.every(30000, async () => {
      const listed = await get("braid/kafka/topics");
      names.replaceChildren(...listed.map((t) => h("option", { value: t.name })));
    });
    if (ctx.params.get("topic")) show();
  },
};
