// One node's topology: PCIe switches with their GPUs and NICs (each coloured by the job holding
// it), the NVLink matrix, NUMA nodes. Prefers `/api/v1/nodes/{name}/topology` (with per-device
// holders) and falls back to the NodeTopology plus the node's reservations.

import { api, optional } from "./api.js";
import { gpuLegend, h, holdersBackground, placeholder, section } from "./dom.js";

export async function loadTopology(name) {
  const enc = encodeURIComponent(name);
  const [rich, topo, reservations, node] = await Promise.all([
    optional(`/api/v1/nodes/${enc}/topology`),
    optional(`/api/v1/nodetopologies/${enc}`),
    api(`/api/v1/reservations?node=${enc}`),
    api(`/api/v1/nodes/${enc}`),
  ]);
  const spec = pickSpec(rich) || (topo && topo.spec) || null;
  const gpuHolders = new Map();
  const nicHolders = new Map();
  for (const r of reservations.items) {
    const job = `${r.metadata.namespace}/${r.spec.podGroup}`;
    for (const g of r.spec.gpus || []) addTo(gpuHolders, g, job);
    for (const n of r.spec.nics || []) addTo(nicHolders, n, job);
  }
  return { name, node, spec, gpuHolders, nicHolders };
}

function pickSpec(rich) {
  if (!rich) return null;
  if (rich.spec && Array.isArray(rich.spec.gpus)) return rich.spec;
  if (Array.isArray(rich.gpus)) return rich;
  if (rich.topology && rich.topology.spec) return rich.topology.spec;
  return null;
}

function addTo(map, key, job) {
  const list = map.get(key) || [];
  if (!list.includes(job)) list.push(job);
  map.set(key, list);
}

function device(kind, label, holders, extra = {}) {
  const state = holders.length > 1 ? "held shared" : holders.length ? "held" : "free";
  const unhealthy = Boolean(extra.unhealthy);
  const who = holders.join(", ");
  const text = unhealthy ? (who ? `unhealthy · ${who}` : "unhealthy") : who || "free";
  return h(
    "div",
    {
      class: `dev ${kind} ${state}${unhealthy ? " unhealthy" : ""}`,
      title: `${label}: ${text}`,
      style: holders.length ? { background: holdersBackground(holders) } : {},
      ...extra.attrs,
    },
    h("div", { class: "dev-name" }, label),
    h("div", { class: "dev-job" }, text),
  );
}

export function renderTopology({ name, node, spec, gpuHolders, nicHolders }) {
  const back = h("p", { class: "back" }, h("a", { href: "#/" }, "← cluster"));
  if (!spec) return [section(`Node ${name}`, "topology", back, placeholder("this node has no device topology (a CPU node?)"))];
  const gpus = spec.gpus || [];
  const nics = spec.nics || [];
  const switches = spec.pcieSwitches || [];
  const groups = new Map(switches.map((sw) => [sw.name, { sw, gpus: [], nics: [] }]));
  const loose = { sw: { name: "(no PCIe switch)" }, gpus: [], nics: [] };
  for (const g of gpus) (groups.get(g.pcieSwitch) || loose).gpus.push(g);
  for (const n of nics) (groups.get(n.pcieSwitch) || loose).nics.push(n);
  const all = [...groups.values(), loose].filter((g) => g.gpus.length || g.nics.length);
  const gpuCell = (g) =>
    device("gpu", `GPU ${g.index}`, gpuHolders.get(g.index) || [], { unhealthy: g.health === "Unhealthy", attrs: { "data-gpu": g.index } });
  const nicCell = (n) => device("nic", `${n.name}${n.rdma ? " (RDMA)" : ""}`, nicHolders.get(n.name) || [], { unhealthy: n.health === "Unhealthy", attrs: { "data-nic": n.name } });
  const tree = h(
    "div",
    { class: "switches" },
    all.map((g) =>
      h(
        "div",
        { class: "switch", "data-switch": g.sw.name },
        h("div", { class: "switch-name" }, `PCIe ${g.sw.name}`, g.sw.numaNode !== undefined ? ` · NUMA ${g.sw.numaNode}` : "", g.sw.parent ? ` · under ${g.sw.parent}` : ""),
        h("div", { class: "devs" }, g.gpus.map(gpuCell), g.nics.map(nicCell)),
      ),
    ),
  );
  const matrix = gpus.length
    ? h(
        "table",
        { class: "nvlink" },
        h("thead", {}, h("tr", {}, h("th", {}, ""), gpus.map((g) => h("th", {}, `GPU${g.index}`)))),
        h(
          "tbody",
          {},
          gpus.map((a) =>
            h(
              "tr",
              {},
              h("th", {}, `GPU${a.index}`),
              gpus.map((b) => {
                if (a.index === b.index) return h("td", { class: "self" }, "X");
                if (spec.linkMatrix) return h("td", { class: /^NV/.test(spec.linkMatrix[a.index][b.index]) ? "nv" : "" }, spec.linkMatrix[a.index][b.index]);
                const links = (a.nvlinkPeers || {})[String(b.index)];
                return h("td", { class: links ? "nv" : "" }, links ? `NV${links}` : a.pcieSwitch && a.pcieSwitch === b.pcieSwitch ? "PIX" : a.numaNode === b.numaNode ? "NODE" : "SYS");
              }),
            ),
          ),
        ),
      )
    : placeholder("no GPUs");
  const labels = (node.metadata && node.metadata.labels) || {};
  return [
    section(
      `Node ${name}`,
      "topology",
      back,
      h("p", { class: "muted" }, `${labels["gpuyard.io/gpu-model"] || ""} ${spec.preset ? `· preset ${spec.preset}` : ""} · ${gpus.length} GPUs · ${nics.length} NICs · ${spec.sockets || 1} socket(s)`),
      h("h3", {}, "PCIe switches, GPUs and NICs"),
      gpuLegend(),
      tree,
      h("h3", {}, "GPU links (nvidia-smi topo -m)"),
      matrix,
    ),
  ];
}
