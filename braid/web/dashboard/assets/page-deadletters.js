// Dead-letter queues: where their records came from, how many wait, and re-drive (each record
// back to the queue it died in, once, even across a crash: core/deadletter/redrive.py).

import { get, post, seg } from "./api.js";
import { Section, button, count, table } from "./dom.js";

const POLL_MS = 3000;

function redriveButton(ctx, q) {
  if (!ctx.admin || !q.queue || q.messages_ready < 1) return "";
  const path = `braid/dead-letters/${seg(q.vhost)}/${seg(q.queue)}/redrive`;
  return button(
    "Re-drive",
    () =>
      ctx.act(
        `Move the ${q.messages_ready} ready dead letters of '${q.queue}' back to their queues?`,
        () => post(path, {}),
        (result) => `moved ${result.moved} of '${q.queue}' back: ${result.to.map((t) => `${t.messages} to '${t.queue || t.topic}'`).join(", ") || "none"}${result.left.length ? `; ${result.left.length} left` : ""}`,
      ),
    { "data-action": "redrive" },
  );
}

export const deadLetters = {
  id: "dead-letters",
  title: "Dead letters",
  needs: (ctx) => (ctx.monitors ? null : "Dead letters need the monitoring tag."),
  mount(root, ctx) {
    const section = new Section(root, "Dead-letter queues", "dead-letters");
    ctx.every(POLL_MS, async () => {
      const listed = await get("braid/dead-letters");
      section.show(listed, (data) =>
        table("dead-letters", [
          { id: "queue", label: "Queue", value: (q) => (q.queue ? q.queue : q.topic) },
          { id: "vhost", label: "Vhost", value: (q) => q.vhost || "" },
          { id: "from", label: "Dead-lettered from", value: (q) => q.dead_lettered_from.join(", ") },
          { id: "exchanges", label: "Through", value: (q) => q.dead_letter_exchanges.join(", ") },
          { id: "ready", label: "Ready", cls: "num", value: (q) => count(q.messages_ready) },
          { id: "unacked", label: "Unacked", cls: "num", value: (q) => count(q.messages_unacknowledged) },
          { id: "consumers", label: "Consumers", cls: "num", value: (q) => count(q.consumers) },
          { id: "actions", label: "", value: (q) => redriveButton(ctx, q) },
        ], data, (q) => q.topic, "no dead-letter queues"),
      );
    });
  },
};
