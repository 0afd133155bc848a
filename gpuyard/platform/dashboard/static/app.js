// The dashboard: a hash router over its pages (cluster, job, queue, node, node topology, submit), the token field,
// and live updates: SSE watches on jobs and pods trigger a (debounced) reload of the page shown.

import { HttpError, token, watch } from "./api.js";
import { h } from "./dom.js";
import { renderSubmit } from "./actions.js";
import { loadJob, renderJob } from "./job.js";
import { loadNode, renderNode } from "./node.js";
import { loadOverview, renderOverview } from "./overview.js";
import { loadQueue, renderQueue } from "./queue.js";
import { loadTopology, renderTopology } from "./topology.js";

const main = document.getElementById("main");
const statusEl = document.getElementById("status");
const live = document.getElementById("live");

function route() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  if (parts[0] === "jobs" && parts.length >= 3) return { page: "job", ns: parts[1], name: parts[2] };
  if (parts[0] === "nodes" && parts[2] === "topology") return { page: "topology", name: parts[1] };
  if (parts[0] === "nodes" && parts.length >= 2) return { page: "node", name: parts[1] };
  if (parts[0] === "queues" && parts.length >= 2) return { page: "queue", name: parts[1] };
  if (parts[0] === "submit") return { page: "submit" };
  return { page: "cluster" };
}

let rendering = null;
let again = false;

async function render() {
  if (rendering) {
    again = true;
    return rendering;
  }
  rendering = (async () => {
    const r = route();
    if (r.page === "submit" && main.dataset.page === "submit") return; // keep what is being typed
    try {
      let nodes;
      if (r.page === "job") nodes = renderJob(await loadJob(r.ns, r.name));
      else if (r.page === "topology") nodes = renderTopology(await loadTopology(r.name));
      else if (r.page === "node") nodes = renderNode(await loadNode(r.name));
      else if (r.page === "queue") nodes = renderQueue(await loadQueue(r.name));
      else if (r.page === "submit") nodes = renderSubmit();
      else nodes = renderOverview(await loadOverview());
      const open = [...main.querySelectorAll("details[open]")].map((d) => d.closest("[data-pod]")?.dataset.pod);
      main.replaceChildren(...nodes);
      for (const pod of open) main.querySelector(`[data-pod="${CSS.escape(pod || "")}"] details`)?.setAttribute("open", "");
      main.dataset.page = r.page;
      statusEl.textContent = `updated ${new Date().toLocaleTimeString()}`;
      statusEl.className = "";
    } catch (e) {
      const auth = e instanceof HttpError && (e.status === 401 || e.status === 403);
      statusEl.textContent = auth ? `${e.message} — enter a token above` : `error: ${e.message}`;
      statusEl.className = "error";
      if (e instanceof HttpError && e.status === 404) main.replaceChildren(h("p", { class: "placeholder" }, e.message), h("a", { href: "#/" }, "← cluster"));
    }
  })();
  try {
    await rendering;
  } finally {
    rendering = null;
    if (again) {
      again = false;
      schedule();
    }
  }
}

let timer = null;
function schedule(delay = 250) {
  clearTimeout(timer);
  timer = setTimeout(render, delay);
}

let watches = [];
function startWatches() {
  for (const w of watches) w.close();
  const states = {};
  const show = (name) => (state) => {
    states[name] = state;
    const all = Object.values(states);
    live.textContent = all.every((s) => s === "live") ? "● live" : all.includes("auth") ? "○ token needed" : "○ reconnecting";
    live.className = all.every((s) => s === "live") ? "on" : "off";
    if (state === "live") schedule();
  };
  watches = ["jobs", "pods"].map((res) => watch(res, () => schedule(), show(res)));
}

function setupToken() {
  const input = document.getElementById("token");
  input.value = token.get();
  document.getElementById("token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    token.set(input.value.trim());
    startWatches();
    schedule(0);
  });
}

setupToken();
window.addEventListener("hashchange", () => schedule(0));
startWatches();
setInterval(() => schedule(0), 15000); // a safety net for changes no watch reports (reservations, quotas)
schedule(0);
