// The dashboard's shell: who is logged in, the navigation, a hash router (#/queues), polling
// that stops when the page changes, and one banner for errors and one for results.

import { get } from "./api.js";
import { h } from "./dom.js";
import { access } from "./page-access.js";
import { browser } from "./page-browser.js";
import { connections } from "./page-connections.js";
import { deadLetters } from "./page-deadletters.js";
import { groups } from "./page-groups.js";
import { mqtt } from "./page-mqtt.js";
import { overview } from "./page-overview.js";
import { pending } from "./page-pending.js";
import { queues } from "./page-queues.js";

const PAGES = [overview, queues, connections, mqtt, groups, pending, deadLetters, browser, access];
const MANAGEMENT_TAGS = ["management", "policymaker", "monitoring", "administrator"];

const main = document.getElementById("page");
const banner = document.getElementById("banner");
let generation = 0;

// Kinds: "error" (a poll failed; cleared by the next good poll), "refused" (an action the API
// refused; kept until the page changes), "done" (an action's result).
function showBanner(kind, text) {
  banner.hidden = false;
  banner.className = kind === "done" ? "banner done" : "banner error";
  banner.dataset.kind = kind;
  banner.textContent = text;
}

function clearBanner(kind) {
  if (banner.dataset.kind === kind) {
    banner.hidden = true;
    banner.textContent = "";
    delete banner.dataset.kind;
  }
}

// What the logged-in user may do, from its tags (the API checks again on every call: these
// only decide which buttons are shown). See docs/management.md, "Dashboard".
function abilities(who) {
  const tags = who.tags || [];
  const has = (tag) => tags.includes(tag);
  const admin = has("administrator");
  return {
    user: who.name,
    tags,
    admin,
    // /api/braid/..., /api/nodes: monitoring (administrator includes it).
    monitors: admin || has("monitoring"),
    // Purge and delete queues: RabbitMQ's management and policymaker users in their vhosts.
    // A monitoring-only user watches: no buttons, and the API refuses it (no vhost access).
    managesQueues: admin || has("management") || has("policymaker"),
    closes: (connection) => admin || connection.user === who.name,
  };
}

function route() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [name, query] = hash.split("?");
  const page = PAGES.find((p) => p.id === name) || overview;
  return { page, params: new URLSearchParams(query || "") };
}

function renderNav(current) {
  const nav = document.getElementById("nav");
  nav.replaceChildren(
    ...PAGES.map((p) =>
      h("a", { href: `#/${p.id}`, "data-page": p.id, class: p.id === current.id ? "active" : undefined }, p.title),
    ),
  );
}

function mount(who) {
  generation += 1;
  const mine = generation;
  const { page, params } = route();
  renderNav(page);
  for (const kind of ["error", "refused", "done"]) clearBanner(kind);
  delete main.dataset.ready;
  main.replaceChildren(h("h1", {}, page.title));
  document.title = `${page.title} · BraidMQ`;
  const pollers = [];
  const firsts = [];
  const ctx = {
    ...who,
    params,
    live: () => mine === generation,
    // Run refresh now and every ms until the page changes; errors go to the banner.
    every(ms, refresh) {
      const run = async () => {
        if (mine !== generation) return;
        try {
          await refresh();
          clearBanner("error");
        } catch (error) {
          if (mine === generation) showBanner("error", String(error.message || error));
        }
      };
      pollers.push(run);
      firsts.push(run());
      const timer = setInterval(() => (mine === generation ? run() : clearInterval(timer)), ms);
    },
    refreshNow: () => Promise.all(pollers.map((run) => run())),
    // A change the user asked for: confirm, call the API, say what happened, show the result.
    async act(question, call, done) {
      if (question && !window.confirm(question)) return;
      try {
        const result = await call();
        showBanner("done", typeof done === "function" ? done(result) : done);
      } catch (error) {
        showBanner("refused", String(error.message || error));
      }
      await ctx.refreshNow();
    },
  };
  const why = page.needs ? page.needs(ctx) : null;
  if (why) {
    main.append(h("p", { class: "note", "data-needs": "true" }, why));
  } else {
    page.mount(main, ctx);
  }
  Promise.all(firsts).then(() => {
    if (mine === generation) main.dataset.ready = page.id;
  });
}

async function start() {
  let who;
  try {
    who = abilities(await get("whoami"));
  } catch (error) {
    showBanner("error", `cannot read /api/whoami: ${error.message || error}`);
    return;
  }
  if (!who.tags.some((tag) => MANAGEMENT_TAGS.includes(tag))) {
    showBanner("error", "this user has no management tag");
    return;
  }
  document.getElementById("who").textContent = `${who.user} (${who.tags.join(", ") || "no tags"})`;
  window.addEventListener("hashchange", () => mount(who));
  mount(who);
}

start();
