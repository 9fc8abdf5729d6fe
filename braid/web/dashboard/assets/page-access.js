// Users, vhost permissions and vhosts (the security issue's store), read-only here: changing
// them is `braid user ...` or the API.

import { get } from "./api.js";
import { Section, table } from "./dom.js";

const POLL_MS = 10000;

export const access = {
  id: "access",
  title: "Users & vhosts",
  needs: (ctx) => (ctx.admin ? null : "Users, permissions and vhosts need the administrator tag."),
  mount(root, ctx) {
    const users = new Section(root, "Users", "users");
    const permissions = new Section(root, "Permissions", "permissions");
    const vhosts = new Section(root, "Virtual hosts", "vhosts");
    ctx.every(POLL_MS, async () => {
      const [u, p, v] = await Promise.all([get("users"), get("permissions"), get("vhosts")]);
      users.show(
        u.map((user) => ({ name: user.name, tags: user.tags, algorithm: user.hashing_algorithm })),
        (data) =>
          table("users", [
            { id: "name", label: "User", value: (x) => x.name },
            { id: "tags", label: "Tags", value: (x) => x.tags.join(", ") },
            { id: "algorithm", label: "Password hash", value: (x) => x.algorithm },
          ], data, (x) => x.name, "no users"),
      );
      permissions.show(p, (data) =>
        table("permissions", [
          { id: "user", label: "User", value: (x) => x.user },
          { id: "vhost", label: "Vhost", value: (x) => x.vhost },
          { id: "configure", label: "Configure", value: (x) => x.configure },
          { id: "write", label: "Write", value: (x) => x.write },
          { id: "read", label: "Read", value: (x) => x.read },
        ], data, (x) => `${x.vhost}|${x.user}`, "no permissions"),
      );
      vhosts.show(v, (data) => table("vhosts", [{ id: "name", label: "Name", value: (x) => x.name }], data, (x) => x.name));
    });
  },
};
