// Building the page from data with the DOM API only (never innerHTML), so a queue, client id
// or payload named "<script>" is shown as text, never run.

const SVG_NS = "http://www.w3.org/2000/svg";

function fill(node, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "onclick" || name === "onsubmit" || name === "onchange" || name === "oninput") {
      node.addEventListener(name.slice(2), value);
    } else if (name === "dataset") {
      Object.assign(node.dataset, value);
    } else {
      node.setAttribute(name, value === true ? "" : String(value));
    }
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// h("td", {class: "num"}, "12"): an HTML element with attributes and children.
export function h(tag, attrs, ...children) {
  return fill(document.createElement(tag), attrs, children);
}

export function svg(tag, attrs, ...children) {
  return fill(document.createElementNS(SVG_NS, tag), attrs, children);
}

// A table: columns are {label, value(row) -> node or text, cls}; rows get data-key.
export function table(name, columns, rows, key, empty = "none") {
  const head = h("tr", {}, columns.map((c) => h("th", { class: c.cls }, c.label)));
  const body = rows.length
    ? rows.map((row) =>
        h(
          "tr",
          { "data-key": key(row) },
          columns.map((c) => h("td", { class: c.cls, "data-col": c.id }, c.value(row))),
        ),
      )
    : [h("tr", { class: "empty" }, h("td", { colspan: columns.length }, empty))];
  return h("table", { "data-table": name }, h("thead", {}, head), h("tbody", {}, body));
}

// A section with a heading whose body is replaced only when its data changed, so a poll that
// brings the same answer leaves the rows (and a button under the pointer) alone.
export class Section {
  constructor(parent, title, name) {
    this.body = h("div", { class: "section-body" });
    this.element = h("section", { "data-section": name }, h("h2", {}, title), this.body);
    this.last = undefined;
    parent.append(this.element);
  }

  show(data, build) {
    const text = JSON.stringify(data);
    if (text === this.last) return;
    this.last = text;
    this.body.replaceChildren(build(data));
  }

  note(text) {
    this.last = undefined;
    this.body.replaceChildren(h("p", { class: "note" }, text));
  }
}

export function button(label, action, attrs = {}) {
  return h("button", { type: "button", ...attrs, onclick: action }, label);
}

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];

export function bytes(n) {
  if (n === undefined || n === null || Number.isNaN(n)) return "-";
  let value = Number(n);
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${unit ? value.toFixed(1) : value} ${UNITS[unit]}`;
}

export function count(n) {
  return n === undefined || n === null ? "-" : Number(n).toLocaleString("en");
}

export function perSecond(rate) {
  if (rate === undefined || rate === null || Number.isNaN(rate)) return "-";
  const r = Number(rate);
  return `${Math.abs(r) >= 100 ? r.toFixed(0) : r.toFixed(1)}/s`;
}

export function when(ms) {
  if (!ms) return "-";
  return new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

// A byte field of the API ({value, encoding: "string" | "base64"}) as text.
export function shown(field) {
  if (field === null || field === undefined) return "(none)";
  return field.encoding === "base64" ? `base64:${field.value}` : field.value;
}
