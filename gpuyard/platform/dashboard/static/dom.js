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

// A stable colour per job ("ns/name"), so the same job has the same colour everywhere.
export function jobColor(job) {
  if (!job) return "";
  if (job === "other") return "#8a8f98";
  let hash = 0;
  for (const ch of job) hash = (hash * 31 + ch.charCodeAt(0)) >>> 0;
  return `hsl(${hash % 360}, 62%, 52%)`;
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
