// Small DOM helpers: every text goes through textContent, never innerHTML, so object names and
// messages from the API cannot inject markup.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "style" && typeof v === "object") Object.assign(el.style, v);
    else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

// A colour per job ("ns/name") from a palette, handed out so that no two jobs on screen share one:
// a job keeps its colour while it exists (the same everywhere), `assignJobColors` (the cluster
// page, with every job) frees the colours of jobs that are gone and hands out the lowest free
// slot in the order given. Past the palette, hues 137.5 degrees apart (still one per job).
// Ordered so that the first few are as far apart as possible; no red (that marks unhealthy).
const PALETTE = [
  "#4e79a7", "#f28e2b", "#8c564b", "#d37295", "#17becf", "#59a14f",
  "#11a579", "#bcbd22", "#7f3c8d", "#2f4b7c", "#6b6ecf", "#9c755f",
];
const slots = new Map(); // job -> palette slot

function slotColor(i) {
  return i < PALETTE.length ? PALETTE[i] : `hsl(${((i - PALETTE.length) * 137.5) % 360}, 55%, 42%)`;
}

function takeSlot(job) {
  const used = new Set(slots.values());
  let i = 0;
  while (used.has(i)) i += 1;
  slots.set(job, i);
  return i;
}

export function assignJobColors(jobs) {
  const keep = new Set(jobs);
  for (const job of [...slots.keys()]) if (!keep.has(job)) slots.delete(job);
  for (const job of jobs) if (!slots.has(job)) takeSlot(job);
}

export function jobColor(job) {
  if (!job) return "";
  if (job === "other") return "#8a8f98";
  return slotColor(slots.has(job) ? slots.get(job) : takeSlot(job));
}

// The background of a device held by `holders`: the job's colour, or stripes of each job's
// colour for a shared GPU.
export function holdersBackground(holders) {
  if (holders.length <= 1) return holders.length ? jobColor(holders[0]) : "";
  const stops = holders.map((j, i) => `${jobColor(j)} ${i * 8}px ${(i + 1) * 8}px`);
  return `repeating-linear-gradient(135deg, ${stops.join(", ")})`;
}

// What the colours of GPU cells mean (the node grid and the topology page).
export function gpuLegend() {
  const item = (cls, text, style = {}) =>
    h("span", { class: "legend-item" }, h("span", { class: `legend-cell ${cls}`, style }), text);
  return h(
    "div",
    { class: "legend", "aria-label": "legend" },
    item("free", "free"),
    item("held", "used by a job (its colour)", { background: PALETTE[0] }),
    item("shared", "shared by several jobs (stripes)", { background: `repeating-linear-gradient(135deg, ${PALETTE[0]} 0 4px, ${PALETTE[1]} 4px 8px)` }),
    item("unhealthy", "unhealthy"),
  );
}

export function bar(value, total, { label = "", cls = "" } = {}) {
  const pct = total > 0 ? Math.min(100, (100 * value) / total) : 0;
  return h(
    "div",
    { class: `bar ${cls}`, title: `${label} ${value} / ${total}` },
    h("div", { class: "fill", style: { width: `${pct}%` } }),
    h("span", { class: "bar-label" }, label ? `${label} ` : "", `${fmt(value)} / ${fmt(total)}`),
  );
}

export function fmt(n) {
  if (typeof n !== "number") return String(n ?? "-");
  if (Number.isInteger(n)) return String(n);
  return n.toFixed(n < 10 ? 2 : 1);
}

export function bytes(n) {
  const units = ["B", "Ki", "Mi", "Gi", "Ti"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${fmt(Math.round(n * 10) / 10)}${units[i]}`;
}

export function phaseBadge(phase) {
  const p = phase || "Created";
  return h("span", { class: `phase phase-${p.toLowerCase()}` }, p);
}

export function age(stamp) {
  if (!stamp) return "-";
  const secs = Math.max(0, Math.floor((Date.now() - Date.parse(stamp)) / 1000));
  if (secs >= 86400) return `${Math.floor(secs / 86400)}d`;
  if (secs >= 3600) return `${Math.floor(secs / 3600)}h`;
  if (secs >= 60) return `${Math.floor(secs / 60)}m`;
  return `${secs}s`;
}

// Env values of variables that look secret are never shown.
const SECRET = /(SECRET|TOKEN|PASSWORD|KEY)/i;
export function maskEnv(name, value) {
  return SECRET.test(name) ? "••••••" : value;
}

export function placeholder(text) {
  return h("p", { class: "placeholder" }, text);
}

export function section(title, id, ...children) {
  return h("section", { id, class: "panel" }, h("h2", {}, title), ...children);
}
