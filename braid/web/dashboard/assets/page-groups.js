// Kafka consumer groups: state, members, and per partition the committed offset and the lag.

import { get } from "./api.js";
import { Section, count, table } from "./dom.js";

const POLL_MS = 3000;

export const groups = {
  id: "groups",
  title: "Consumer groups",
  needs: (ctx) => (ctx.monitors ? null : "Consumer groups need the monitoring tag."),
  mount(root, ctx) {
    const summary = new Section(root, "Groups", "groups");
    const partitions = new Section(root, "Lag per partition", "group-partitions");
    ctx.every(POLL_MS, async () => {
      const listed = await get("braid/kafka/groups");
      summary.show(
        listed.map((g) => ({ id: g.group_id, state: g.state, type: g.protocol_type, lag: g.lag, members: g.members.map((m) => `${m.client_id} (${m.client_host})`) })),
        (data) =>
          table("groups", [
            { id: "group", label: "Group", value: (g) => g.id },
            { id: "state", label: "State", value: (g) => g.state },
            { id: "type", label: "Protocol", value: (g) => g.type },
            { id: "members", label: "Members", value: (g) => g.members.join(", ") },
            { id: "lag", label: "Total lag", cls: "num", value: (g) => count(g.lag) },
          ], data, (g) => g.id, "no consumer groups"),
      );
      const rows = listed.flatMap((g) => g.partitions.map((p) => ({ group: g.group_id, ...p })));
      partitions.show(rows, (data) =>
        table("group-partitions", [
          { id: "group", label: "Group", value: (p) => p.group },
          { id: "topic", label: "Topic", value: (p) => p.topic },
          { id: "partition", label: "Partition", cls: "num", value: (p) => p.partition },
          { id: "committed", label: "Committed", cls: "num", value: (p) => count(p.committed_offset) },
          { id: "end", label: "Log end", cls: "num", value: (p) => count(p.log_end_offset) },
          { id: "lag", label: "Lag", cls: "num", value: (p) => count(p.lag) },
        ], data, (p) => `${p.group}|${p.topic}|${p.partition}`, "no committed offsets"),
      );
    });
  },
};
