// What is waiting: delayed records per queue (next due time) and open transactions.

import { get } from "./api.js";
import { Section, count, table, when } from "./dom.js";

// Listing delays walks every timer wheel chain (docs/management.md): an operator's look, so
// this page polls slowly.
const POLL_MS = 10000;

export const pending = {
  id: "pending",
  title: "Delays & transactions",
  needs: (ctx) => (ctx.monitors ? null : "Delays and transactions need the monitoring tag."),
  mount(root, ctx) {
    const delays = new Section(root, "Pending delayed records", "delays");
    const transactions = new Section(root, "Open transactions", "transactions");
    ctx.every(POLL_MS, async () => {
      const [delayed, open] = await Promise.all([get("braid/delays"), get("braid/transactions")]);
      delays.show(delayed, (data) =>
        table("delays", [
          { id: "queue", label: "Queue", value: (d) => (d.queue ? `${d.queue} (vhost ${d.vhost})` : `${d.topic}/${d.partition}`) },
          { id: "messages", label: "Delayed", cls: "num", value: (d) => count(d.messages) },
          { id: "due", label: "Next due", value: (d) => when(d.next_due_ms) },
        ], data, (d) => `${d.topic}|${d.partition}`, "nothing delayed"),
      );
      transactions.show(open, (data) =>
        table("transactions", [
          { id: "id", label: "Transaction", value: (t) => t.transaction_id },
          { id: "group", label: "Producer", value: (t) => t.producer_group },
          { id: "halves", label: "Half messages", cls: "num", value: (t) => count(t.half_messages) },
        ], data, (t) => t.transaction_id, "no open transactions"),
      );
    });
  },
};
