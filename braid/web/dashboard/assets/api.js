// The only way the page talks to the broker: the management API and /metrics, same origin,
// with the credentials the browser logged in with (HTTP Basic, remembered by the browser).

export class ApiError extends Error {
  constructor(status, reason) {
    super(`${status}: ${reason}`);
    this.status = status;
    this.reason = reason;
  }
}

// One path segment as the API reads it: the vhost "/" is "%2F", a connection's
// "a:1 -> b:2" is escaped, as RabbitMQ's clients send them.
export const seg = encodeURIComponent;

async function failure(response) {
  let reason = response.statusText;
  try {
    const body = await response.json();
    reason = body.reason || body.error || reason;
  } catch {
    // not JSON: keep the status text
  }
  return new ApiError(response.status, reason);
}

async function request(method, path, body, headers = {}) {
  const init = { method, cache: "no-store", credentials: "same-origin", headers: { ...headers } };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  const response = await fetch(`/api/${path}`, init);
  if (!response.ok) throw await failure(response);
  return response;
}

export async function get(path) {
  return (await request("GET", path)).json();
}

export async function remove(path, headers) {
  await request("DELETE", path, undefined, headers);
}

export async function post(path, body) {
  const response = await request("POST", path, body);
  const text = await response.text();
  return text ? JSON.parse(text) : null;
}

// A health check: {status: "ok"} (200) or the failure it names (503), both answers.
export async function check(path) {
  const response = await fetch(`/api/${path}`, { cache: "no-store", credentials: "same-origin" });
  if (response.status !== 200 && response.status !== 503) throw await failure(response);
  return response.json();
}

// /metrics in the Prometheus text format: each name's samples summed over its labels.
export async function metrics() {
  const response = await fetch("/metrics", { cache: "no-store" });
  if (!response.ok) throw await failure(response);
  return parsePrometheus(await response.text());
}

const SAMPLE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)/;

export function parsePrometheus(text) {
  const sums = new Map();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = SAMPLE.exec(line);
    if (!match) continue;
    const value = Number(match[3]);
    if (Number.isNaN(value)) continue;
    sums.set(match[1], (sums.get(match[1]) || 0) + value);
  }
  return sums;
}
