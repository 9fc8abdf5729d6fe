// MQTT: sessions (connected clients and persistent sessions with what they have queued), with
// disconnect; retained messages, with delete.

import { get, remove, seg } from "./api.js";
import { Section, button, count, h, table, when } from "./dom.js";

const POLL_MS = 3000;
const PAYLOAD_SHOWN = 80; // characters of a retained payload shown in the table

function preview(m) {
  const text = m.payload_encoding === "base64" ? `base64:${m.payload}` : m.payload;
  return text.length > PAYLOAD_SHOWN ? `${text.slice(0, PAYLOAD_SHOWN)}…` : text;
}

// The topic's levels as path segments, each escaped (a level may hold '%' or '?').
function retainedPath(topic) {
  return `braid/mqtt/retained/${topic.split("/").map(seg).join("/")}`;
}

export const mqtt = {
  id: "mqtt",
  title: "MQTT",
  needs: (ctx) => (ctx.monitors ? null : "MQTT sessions and retained messages need the monitoring tag."),
  mount(root, ctx) {
    const sessions = new Section(root, "Sessions", "sessions");
    const retained = new Section(root, "Retained messages", "retained");
    ctx.every(POLL_MS, async () => {
      const [listed, kept] = await Promise.all([get("braid/mqtt/sessions"), get("braid/mqtt/retained")]);
      sessions.show(listed, (data) =>
        table("sessions", [
          { id: "client", label: "Client id", value: (s) => s.client_id },
          { id: "state", label: "State", value: (s) => (s.connected ? "connected" : "offline") },
          { id: "persistent", label: "Persistent", value: (s) => (s.persistent ? "yes" : "no") },
          { id: "protocol", label: "Protocol", value: (s) => s.protocol || "" },
          { id: "user", label: "User", value: (s) => s.user || "" },
          { id: "ready", label: "Queued", cls: "num", value: (s) => count(s.messages_ready) },
          { id: "unacked", label: "In flight", cls: "num", value: (s) => count(s.messages_unacknowledged) },
          {
            id: "actions",
            label: "",
            value: (s) =>
              ctx.admin && s.connected
                ? button("Disconnect", () => ctx.act(`Disconnect MQTT client '${s.client_id}'?`, () => remove(`braid/mqtt/clients/${seg(s.client_id)}`), `disconnected '${s.client_id}'`), { "data-action": "disconnect", class: "danger" })
                : "",
          },
        ], data, (s) => s.client_id, "no sessions"),
      );
      retained.show(kept, (data) =>
        table("retained", [
          { id: "topic", label: "Topic", value: (m) => m.topic },
          { id: "qos", label: "QoS", cls: "num", value: (m) => m.qos },
          { id: "bytes", label: "Bytes", cls: "num", value: (m) => count(m.payload_bytes) },
          { id: "payload", label: "Payload", value: (m) => h("code", {}, preview(m)) },
          { id: "expires", label: "Expires", value: (m) => when(m.expires_at) },
          {
            id: "actions",
            label: "",
            value: (m) =>
              ctx.admin
                ? button("Delete", () => ctx.act(`Delete the retained message of '${m.topic}'?`, () => remove(retainedPath(m.topic)), `deleted the retained message of '${m.topic}'`), { "data-action": "delete", class: "danger" })
                : "",
          },
        ], data, (m) => m.topic, "no retained messages"),
      );
    });
  },
};
