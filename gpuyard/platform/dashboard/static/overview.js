// The cluster page: overview cards, node grid (a cell per GPU coloured by its job), jobs table
// with placement and why-pending text, and the quota tree.

import { api, optional } from "./api.js";
import { age, assignJobColors, bar, bytes, fmt, gpuLegend, h, holdersBackground, jobColor, phaseBadge, placeholder, section } from "./dom.js";
import { queueLink } from "./queue.js";

export async function loadOverview() {
  const [summary, usage, jobs, reservations, quotas] = await Promise.all([
    api("/api/v1/summary"),
    api("/api/v1/usage/nodes"),
    api("/api/v1/jobs"),
    api("/api/v1/reservations"),
    optional("/api/v1/quotas"),
  ]);
  return { summary, usage: usage.items, jobs: jobs.items, reservations: reservations.items, quotas };
}

export function renderOverview(data) {
  // Colours in the order of the jobs list (oldest first), so that no two jobs share one.
  const byAge = [...data.jobs].sort((a, b) => String(a.metadata.creationTimestamp).localeCompare(String(b.metadata.creationTimestamp)));
  assignJobColors(byAge.map((j) => `${j.metadata.namespace}/${j.metadata.name}`));
  return [
    cards(data.summary),
    section("Nodes", "nodes", gpuLegend(), nodeGrid(data.usage)),
    section("Jobs", "jobs", jobsTable(data.jobs, data.reservations)),
    section("Quota tree", "quotas", quotaTree(data.quotas)),
  ];
}

function cards(s) {
  const frag = s.fragmentation || {};
  const models = Object.entries(s.gpus || {}).map(([model, row]) =>
    h("div", { class: "model-row" }, h("span", { class: "model" }, model), bar(row.allocated, row.total)),
  );
  const phases = Object.entries(s.jobsByPhase || {}).map(([p, n]) =>
    h("span", { class: "chip" }, phaseBadge(p), ` ${n}`),
  );
  const queues = Object.entries(s.queueDepths || {}).map(([q, n]) =>
    h("li", {}, h("span", { class: "model" }, queueLink(q)), ` ${n} pending`),
  );
  return section(
    "Cluster",
    "overview",
    h(
      "div",
      { class: "cards" },
      h("div", { class: "card" }, h("div", { class: "big" }, `${s.gpusAllocated} / ${s.gpusTotal}`), "GPUs allocated"),
      h(
        "div",
        { class: "card", title: frag.definition || "" },
        h("div", { class: "big", id: "fragmentation" }, `${Math.round((frag.ratio || 0) * 100)}%`),
        `fragmented (free GPUs unusable by ${frag.referenceGpus ?? 2}-GPU pods)`,
      ),
      h("div", { class: "card" }, h("div", { class: "big" }, `${s.readyNodes} / ${s.nodes}`), "nodes ready"),
      h("div", { class: "card" }, h("div", { class: "big" }, String(s.pods)), "pods"),
    ),
    h(
      "div",
      { class: "cols" },
      h("div", {}, h("h3", {}, "GPU allocation by model"), models.length ? models : placeholder("no GPUs")),
      h("div", {}, h("h3", {}, "Jobs by phase"), phases.length ? h("div", { class: "chips" }, phases) : placeholder("no jobs")),
      h("div", {}, h("h3", {}, "Queue depths"), queues.length ? h("ul", { class: "plain" }, queues) : placeholder("no job is waiting")),
    ),
  );
}

function nodeGrid(nodes) {
  if (!nodes.length) return placeholder("no nodes");
  return h(
    "div",
    { class: "grid" },
    nodes.map((n) => {
      const cells = [];
      for (let i = 0; i < n.gpus; i += 1) {
        const holders = n.holders[String(i)] || [];
        const unhealthy = (n.unhealthyGpus || []).includes(i);
        const state = holders.length > 1 ? "held shared" : holders.length ? "held" : "free";
        cells.push(
          h(
            "div",
            {
              class: `gpu ${state}${unhealthy ? " unhealthy" : ""}`,
              "data-gpu": i,
              title: `GPU ${i}: ${holders.length ? holders.join(", ") : "free"}${unhealthy ? " (unhealthy)" : ""}`,
              style: holders.length ? { background: holdersBackground(holders) } : {},
            },
            unhealthy ? "✕" : null,
          ),
        );
      }
      return h(
        "a",
        { class: `node ${n.ready ? "" : "not-ready"}`, href: `#/nodes/${encodeURIComponent(n.name)}`, "data-node": n.name },
        h("div", { class: "node-head" }, h("b", {}, n.name), h("span", { class: "muted" }, n.gpus ? `${n.model} ×${n.gpus}` : "cpu")),
        n.gpus ? h("div", { class: "gpus" }, cells) : null,
        bar(n.cpuRequested, n.cpu, { label: "cpu", cls: "small" }),
        h("div", { class: "muted small" }, `mem ${bytes(n.memoryRequestedBytes)} / ${bytes(n.memoryBytes)}`),
      );
    }),
  );
}

export function placementOf(reservations, ns, name) {
  const byNode = new Map();
  for (const r of reservations) {
    if (r.metadata.namespace !== ns || r.spec.podGroup !== name) continue;
    const gpus = byNode.get(r.spec.node) || [];
    gpus.push(...(r.spec.gpus || []));
    byNode.set(r.spec.node, gpus);
  }
  return [...byNode.entries()].map(([node, gpus]) => (gpus.length ? `${node}[${gpus.sort((a, b) => a - b).join(",")}]` : node));
}

function whyPending(job) {
  const phase = job.summary.phase;
  if (!["Created", "Queuing"].includes(phase)) return "";
  const conds = (job.status && job.status.conditions) || [];
  const last = conds[conds.length - 1];
  return last ? last.message : "";
}

function jobsTable(jobs, reservations) {
  if (!jobs.length) return placeholder("no jobs yet: submit one with `gpuyard submit FILE`");
  const rows = jobs.map((j) => {
    const ns = j.metadata.namespace;
    const name = j.metadata.name;
    const key = `${ns}/${name}`;
    const conds = ((j.status && j.status.conditions) || []).filter((c) => c.status === "True").map((c) => c.type);
    const placed = placementOf(reservations, ns, name);
    return h(
      "tr",
      { "data-job": key },
      h("td", {}, h("span", { class: "swatch", style: { background: jobColor(key) } }), h("a", { href: `#/jobs/${ns}/${name}` }, key)),
      h("td", {}, j.kind),
      h("td", { class: "phase-cell" }, phaseBadge(j.summary.phase)),
      h("td", {}, j.summary.queue),
      h("td", { class: "muted" }, conds.join(", ")),
      h("td", { class: "placement" }, placed.join(" ") || "-"),
      h("td", { class: "why" }, whyPending(j)),
      h("td", { class: "muted" }, age(j.metadata.creationTimestamp)),
    );
  });
  return h(
    "table",
    { class: "jobs" },
    h("thead", {}, h("tr", {}, ["Job", "Kind", "Phase", "Queue", "Conditions", "Placement", "Why pending", "Age"].map((t) => h("th", {}, t)))),
    h("tbody", {}, rows),
  );
}

const PARENT = "quota.scheduling.koordinator.sh/parent";

function quotaTree(quotas) {
  if (quotas === null) return placeholder("quotas are not served by this server (GET /api/v1/quotas answered 404)");
  const items = (quotas && quotas.items) || [];
  if (!items.length) return placeholder("no elastic quotas defined");
  const children = new Map();
  for (const q of items) {
    const parent = (q.metadata.labels || {})[PARENT] || "";
    if (!children.has(parent)) children.set(parent, []);
    children.get(parent).push(q);
  }
  const names = new Set(items.map((q) => q.metadata.name));
  const roots = items.filter((q) => !names.has((q.metadata.labels || {})[PARENT] || ""));
  const node = (q) => {
    const spec = q.spec || {};
    const status = q.status || {};
    const rows = quotaResources(q).map((r) => {
      // a limit the quota does not set shows "-" (kubectl-like): no min = no guarantee, no max = no ceiling
      const min = spec.min?.[r] === undefined ? null : num(spec.min[r]);
      const max = spec.max?.[r] === undefined ? null : num(spec.max[r]);
      const runtime = num(status.runtime?.[r]);
      const used = num(status.used?.[r]);
      const request = num(status.request?.[r]);
      const scale = max ?? Math.max(min ?? 0, runtime, used, request, 1);
      return h(
        "div",
        { class: "quota-res", "data-resource": r },
        h("span", { class: "model" }, r),
        min === null ? h("span", { class: "q-min", title: "min not set: no guarantee" }, "-") : h("span", { class: "q-min" }, qty(r, min)),
        max === null ? h("span", { class: "q-max", title: "max not set: no ceiling (unlimited)" }, "-") : h("span", { class: "q-max" }, qty(r, max)),
        qbar(r, "runtime", runtime, scale),
        qbar(r, "used", used, scale),
        qbar(r, "request", request, scale),
      );
    });
    return h(
      "li",
      { "data-quota": q.metadata.name },
      h("b", {}, q.metadata.name),
      (q.metadata.annotations || {})["gpuyard.io/implicit"] === "true" ? h("span", { class: "muted", title: "nobody stored it: min 0, no max; its runtime is the scheduler's" }, " (implicit)") : null,
      rows.length ? h("div", { class: "quota-res quota-head" }, ["resource", "min", "max", "runtime", "used", "request"].map((t) => h("span", {}, t))) : null,
      rows,
      children.has(q.metadata.name) ? h("ul", { class: "tree" }, children.get(q.metadata.name).map(node)) : null,
    );
  };
  return h("ul", { class: "tree" }, roots.map(node));
}

// The resources a quota row shows: those it sets (min or max), uses (non-zero used) or asks for
// (non-zero request: what its pending and running jobs want, e.g. the GPU model a waiting gang
// is blocked on). The status lists every resource of the cluster, mostly 0.
export function quotaResources(q) {
  const spec = q.spec || {};
  const status = q.status || {};
  const nonZero = (m) => Object.keys(m || {}).filter((r) => num(m[r]) !== 0);
  return [...new Set([...Object.keys(spec.min || {}), ...Object.keys(spec.max || {}), ...nonZero(status.used), ...nonZero(status.request)])].sort();
}

function qbar(resource, label, value, scale) {
  const pct = scale > 0 ? Math.min(100, (100 * value) / scale) : 0;
  return h(
    "div",
    { class: `bar ${label}`, "data-col": label, title: `${label} ${qty(resource, value)}` },
    h("div", { class: "fill", style: { width: `${pct}%` } }),
    h("span", { class: "bar-label" }, `${label} ${qty(resource, value)}`),
  );
}

// A quantity as the CLI prints it: binary units for memory and storage, cores for CPU, whole
// numbers for GPUs and other devices.
export function qty(resource, value) {
  if (/memory|storage/.test(resource)) return value === 0 ? "0" : bytes(value);
  if (resource === "cpu") return String(Math.round(value * 1000) / 1000);
  return String(Math.round(value));
}

const SCALE = { m: 1e-3, k: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, E: 1e18, Ki: 1024, Mi: 1024 ** 2, Gi: 1024 ** 3, Ti: 1024 ** 4, Pi: 1024 ** 5, Ei: 1024 ** 6 };

function num(v) {
  if (v === undefined || v === null) return 0;
  if (typeof v === "number") return v;
  const m = /^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$/.exec(String(v).trim());
  if (!m) return Number(v) || 0;
  return Number(m[1]) * (SCALE[m[2]] || 1);
}

export { fmt };
