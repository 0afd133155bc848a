// The dashboard's access to the gpuyard HTTP API: bearer token, JSON calls, SSE watches, streamed lines.
// EventSource cannot send an Authorization header, so watches read the SSE stream with fetch.

const TOKEN_KEY = "gpuyard.token";

export const token = {
  get: () => sessionStorage.getItem(TOKEN_KEY) || "",
  set: (value) => {
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    else sessionStorage.removeItem(TOKEN_KEY);
  },
};

export class HttpError extends Error {
  constructor(status, message, body = null) {
    super(message);
    this.status = status;
    this.body = body; // the server's JSON answer, e.g. {"error": {"code", "message", "details"}}
  }
}

function headers(extra = {}) {
  const out = { Accept: "application/json", ...extra };
  const t = token.get();
  if (t) out.Authorization = `Bearer ${t}`;
  return out;
}

function errorLine(status, body) {
  const err = body && body.error;
  if (!err) return `HTTP ${status}`;
  const details = (err.details || []).map((d) => `${d.field}: ${d.reason}`).join("; ");
  return details ? `${err.message}: ${details}` : err.message;
}

// GET (or other method) a JSON API path; throws HttpError with the server's one-line message.
// A GET of a list follows `metadata.continue` (lists are paged, 500 items by default) and
// answers every item.
export async function api(path, { method = "GET", body, contentType } = {}) {
  const first = await call(path, { method, body, contentType });
  if (method !== "GET") return first;
  let page = first;
  while (page && Array.isArray(page.items) && page.metadata && page.metadata.continue) {
    const next = new URL(path, window.location.origin);
    next.searchParams.set("continue", page.metadata.continue);
    page = await call(next.pathname + next.search, {});
    if (page && Array.isArray(page.items)) first.items.push(...page.items);
  }
  if (first && first.metadata) delete first.metadata.continue;
  return first;
}

async function call(path, { method = "GET", body, contentType } = {}) {
  const init = { method, headers: headers(contentType ? { "Content-Type": contentType } : {}) };
  if (body !== undefined) init.body = body;
  const resp = await fetch(path, init);
  let data = null;
  const text = await resp.text();
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (!resp.ok) throw new HttpError(resp.status, errorLine(resp.status, data), data);
  return data;
}

// Like api(), but a 404 (a route another part of the platform has not added) gives null.
export async function optional(path) {
  try {
    return await api(path);
  } catch (e) {
    if (e instanceof HttpError && (e.status === 404 || e.status === 405)) return null;
    throw e;
  }
}

// Follow `GET /api/v1/watch/{resource}`; call onEvent(type, object) per change and
// onState("live" | "down" | "auth") as the connection changes. Reconnects with backoff.
export function watch(resource, onEvent, onState = () => {}) {
  let stopped = false;
  let controller = null;
  let delay = 1000;

  async function once() {
    controller = new AbortController();
    const resp = await fetch(`/api/v1/watch/${resource}`, {
      headers: headers({ Accept: "text/event-stream" }),
      signal: controller.signal,
    });
    if (resp.status === 401 || resp.status === 403) {
      onState("auth");
      return;
    }
    if (!resp.ok || !resp.body) throw new Error(`watch ${resource}: HTTP ${resp.status}`);
    onState("live");
    delay = 1000;
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        let type = "message";
        const data = [];
        for (const line of block.split("\n")) {
          if (line.startsWith("event:")) type = line.slice(6).trim();
          else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
        }
        if (!data.length) continue;
        if (type === "GONE") return;
        try {
          onEvent(type, JSON.parse(data.join("\n")));
        } catch {
          /* a malformed message is skipped */
        }
      }
    }
  }

  (async () => {
    while (!stopped) {
      try {
        await once();
      } catch {
        if (stopped) return;
      }
      if (stopped) return;
      onState("down");
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 15000);
    }
  })();

  return {
    close() {
      stopped = true;
      if (controller) controller.abort();
    },
  };
}

// GET a path that answers text/plain lines as they come (a followed pod log); call onLine(text)
// per line until the server ends the answer or `signal` aborts it. An error answer (JSON) throws
// HttpError with the server's one-line message, as api() does.
export async function streamLines(path, onLine, signal) {
  const resp = await fetch(path, { headers: headers({ Accept: "text/plain" }), signal });
  if (!resp.ok) {
    let data = null;
    try {
      data = JSON.parse(await resp.text());
    } catch {
      data = null;
    }
    throw new HttpError(resp.status, errorLine(resp.status, data), data);
  }
  if (!resp.body) return;
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n")) >= 0) {
      onLine(buffer.slice(0, cut));
      buffer = buffer.slice(cut + 1);
    }
  }
  if (buffer) onLine(buffer);
}
