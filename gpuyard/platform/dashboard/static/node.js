// One node, as `kubectl describe node` shows it: capacity and allocatable, labels, taints,
// conditions, the pods on it with their jobs, its events; then, for a GPU node, the device
// topology view (also on its own page, #/nodes/NAME/topology).

import { api, optional } from "./api.js";
import { age, h, phaseBadge, placeholder, section } from "./dom.js";
import { loadTopology, renderTopology } from "./topology.js";

export async function loadNode(name) {
  const enc = encodeURIComponent(name);
  const [node, pods, events, topology] = await Promise.all([
    api(`/api/v1/nodes/${enc}`),
    api(`/api/v1/nodes/${enc}/pods`),
    api(`/api/v1/nodes/${enc}/events`),
    optional(`/api/v1/nodetopologies/${enc}`),
  ]);
  const topo = topology ? await loadTopology(name) : null;
  return { name, node, pods: pods.items, events: events.items, topo };
}

function table(headers, rows, empty) {
  if (!rows.length) return placeholder(empty);
  return h("table", {}, h("thead", {}, h("tr", {}, headers.map((t) => h("th", {}, t)))), h("tbody", {}, rows));
}

function jobHref(key) {
  const [ns, name] = key.split("/");
  return `#/jobs/${encodeURIComponent(ns)}/${encodeURIComponent(name)}`;
}

export function renderNode({ name, node, pods, events, topo }) {
  const meta = node.metadata || {};
  const spec = node.spec || {};
  const status = node.status || {};
  const labels = meta.labels || {};
  const gpuNode = Boolean(topo);
  const ready = (status.conditions || []).find((c) => c.type === "Ready");
  const resources = [...new Set([...Object.keys(status.capacity || {}), ...Object.keys(status.allocatable || {})])].sort();
  const head = section(
    `Node ${name}`,
    "node",
    h("p", { class: "back" }, h("a", { href: "#/" }, "← cluster"), gpuNode ? [" · ", h("a", { id: "topology-link", href: `#/nodes/${encodeURIComponent(name)}/topology` }, "device topology →")] : null),
    h(
      "dl",
      { class: "facts" },
      h("dt", {}, "Ready"),
      h("dd", { id: "node-ready" }, ready ? ready.status : "Unknown"),
      h("dt", {}, "Schedulable"),
      h("dd", {}, spec.unschedulable ? "no (cordoned)" : "yes"),
      h("dt", {}, "GPUs"),
      h("dd", { id: "node-gpus" }, gpuNode ? `${labels["gpuyard.io/gpu-model"] || "GPU"} (topology below)` : "none: a CPU-only node (no GPUs to show)"),
      h("dt", {}, "Created"),
      h("dd", {}, meta.creationTimestamp || "-"),
    ),
    h(
      "div",
      { class: "cols" },
      h(
        "div",
        {},
        h("h3", {}, "Capacity and allocatable"),
        table(["Resource", "Capacity", "Allocatable"], resources.map((r) => h("tr", { "data-resource": r }, h("td", {}, r), h("td", {}, String(status.capacity?.[r] ?? "-")), h("td", {}, String(status.allocatable?.[r] ?? "-")))), "none reported"),
      ),
      h(
        "div",
        {},
        h("h3", {}, "Labels"),
        Object.keys(labels).length ? h("ul", { class: "plain labels", id: "node-labels" }, Object.entries(labels).sort().map(([k, v]) => h("li", {}, h("code", {}, `${k}=${v}`)))) : placeholder("none"),
        h("h3", {}, "Taints"),
        (spec.taints || []).length ? h("ul", { class: "plain", id: "node-taints" }, spec.taints.map((t) => h("li", {}, h("code", {}, `${t.key}${t.value ? `=${t.value}` : ""}:${t.effect}`)))) : placeholder("none"),
      ),
    ),
  );
  const conditions = section(
    "Conditions",
    "node-conditions",
    table(
      ["Type", "Status", "Reason", "Message", "Last transition"],
      (status.conditions || []).map((c) => h("tr", {}, h("td", {}, c.type), h("td", {}, c.status), h("td", {}, c.reason || ""), h("td", {}, c.message || ""), h("td", {}, c.lastTransitionTime || "-"))),
      "none reported",
    ),
  );
  const podRows = pods.map((p) => {
    const s = p.summary || {};
    return h(
      "tr",
      { "data-pod": `${p.metadata.namespace}/${p.metadata.name}` },
      h("td", {}, `${p.metadata.namespace}/${p.metadata.name}`),
      h("td", {}, s.job && s.job.includes("/") ? h("a", { href: jobHref(s.job) }, s.job) : s.job || "-"),
      h("td", {}, phaseBadge(s.phase)),
      h("td", {}, (s.gpus || []).join(",") || "-"),
      h("td", {}, s.hostPort ?? "-"),
      h("td", { class: "muted" }, age(p.metadata.creationTimestamp)),
    );
  });
  const podsPanel = section("Pods on this node", "node-pods", table(["Pod", "Job", "Phase", "GPUs", "Host port", "Age"], podRows, "no pods on this node"));
  const eventsPanel = section(
    "Events",
    "node-events",
    table(
      ["Type", "Reason", "Count", "Message", "Age"],
      events.map((e) => h("tr", { class: e.type === "Warning" ? "warn" : "" }, h("td", {}, e.type), h("td", {}, e.reason), h("td", {}, String(e.count ?? 1)), h("td", {}, e.message), h("td", {}, age(e.lastTimestamp)))),
      "no events about this node",
    ),
  );
  const topology = gpuNode ? renderTopology(topo) : [];
  for (const sec of topology) {
    // under the node's own panels: a heading of its own, no second way back
    const title = sec.querySelector("h2");
    if (title) title.textContent = "Device topology";
    sec.querySelector(".back")?.remove();
  }
  return [head, conditions, podsPanel, eventsPanel, ...topology];
}
