// Connections of every protocol, grouped by protocol, with close (an AMQP client gets
// CONNECTION_FORCED, an MQTT 5.0 client DISCONNECT 0x98, a Kafka client a closed socket).

import { get, remove, seg } from "./api.js";
import { Section, button, table, when } from "./dom.js";

const POLL_MS = 3000;
const PROTOCOLS = ["AMQP 0-9-1", "MQTT 3.1.1", "MQTT 5.0", "Kafka"];

// What the client called itself, as `braid connection list` shows it.
function clientOf(c) {
  const props = c.client_properties || {};
  return c.user_provided_name || props.connection_name || props.client_id || props.product || "";
}

function closeButton(ctx, c) {
  if (!ctx.closes(c)) return "";
  return button(
    "Close",
    () => ctx.act(`Close connection ${c.name} (${clientOf(c) || c.protocol})?`, () => remove(`connections/${seg(c.name)}`, { "X-Reason": `Closed from the dashboard by ${ctx.user}` }), `closed ${c.name}`),
    { "data-action": "close", class: "danger" },
  );
}

export const connections = {
  id: "connections",
  title: "Connections",
  mount(root, ctx) {
    const sections = new Map(PROTOCOLS.map((p) => [p, new Section(root, p, `connections-${p}`)]));
    ctx.every(POLL_MS, async () => {
      const listed = await get("connections");
      for (const [protocol, section] of sections) {
        const rows = listed
          .filter((c) => c.protocol === protocol)
          .map((c) => ({ name: c.name, user: c.user, vhost: c.vhost, client: clientOf(c), channels: c.channels, connected_at: c.connected_at, tls: c.ssl }));
        section.show(rows, (data) =>
          table(`connections-${protocol}`, [
            { id: "client", label: "Client", value: (c) => c.client },
            { id: "name", label: "Connection", value: (c) => c.name },
            { id: "user", label: "User", value: (c) => c.user || "-" },
            { id: "vhost", label: "Vhost", value: (c) => c.vhost },
            { id: "channels", label: "Channels", cls: "num", value: (c) => (protocol === "AMQP 0-9-1" ? c.channels : "") },
            { id: "tls", label: "TLS", value: (c) => (c.tls ? "yes" : "no") },
            { id: "since", label: "Connected", value: (c) => when(c.connected_at) },
            { id: "actions", label: "", value: (c) => closeButton(ctx, c) },
          ], data, (c) => c.name, "none connected"),
        );
      }
    });
  },
};
