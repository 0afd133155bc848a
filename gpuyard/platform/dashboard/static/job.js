// One job: summary, conditions, why it is (not) placed, pods with env (secrets masked), a pod's log
// (logs.js), events.

import { deleteButton } from "./actions.js";
import { api, optional } from "./api.js";
import { age, h, jobColor, maskEnv, phaseBadge, placeholder, section } from "./dom.js";
import { logsPanel } from "./logs.js";
import { queueLink } from "./queue.js";

export async function loadJob(ns, name) {
  const base = `/api/v1/namespaces/${encodeURIComponent(ns)}/jobs/${encodeURIComponent(name)}`;
  const [job, pods, events, explain] = await Promise.all([
    api(base),
    api(`${base}/pods`),
    api(`${base}/events`),
    optional(`${base}/explain`),
  ]);
  return { job, pods: pods.items, events: events.items, explain };
}

function table(headers, rows) {
  if (!rows.length) return placeholder("none");
  return h("table", {}, h("thead", {}, h("tr", {}, headers.map((t) => h("th", {}, t)))), h("tbody", {}, rows));
}

export function renderJob({ job, pods, events, explain }) {
  const ns = job.metadata.namespace;
  const name = job.metadata.name;
  const s = job.summary || {};
  const status = job.status || {};
  const replicas = Object.entries(s.replicas || {}).map(([r, n]) => `${r}:${n}`).join(", ");
  const head = section(
    `${job.kind} ${ns}/${name}`,
    "job",
    h("p", { class: "back" }, h("a", { href: "#/" }, "← cluster")),
    h(
      "dl",
      { class: "facts" },
      h("dt", {}, "Phase"),
      h("dd", { id: "job-phase" }, phaseBadge(s.phase)),
      h("dt", {}, "Queue"),
      h("dd", {}, queueLink(s.queue)),
      h("dt", {}, "Replicas"),
      h("dd", {}, replicas || "-"),
      h("dt", {}, "Restarts"),
      h("dd", {}, String(s.restarts ?? 0)),
      h("dt", {}, "Started"),
      h("dd", {}, status.startTime || "-"),
      h("dt", {}, "Colour"),
      h("dd", {}, h("span", { class: "swatch", style: { background: jobColor(`${ns}/${name}`) } })),
    ),
    deleteButton(ns, name, { onDeleted: () => (location.hash = "#/") }),
  );
  const placement = explain
    ? section(
        "Placement",
        "explain",
        h("p", { class: explain.phase === "Pending" ? "why" : "" }, `${explain.phase}: ${explain.message || explain.reason || "placed"}`),
        table(
          ["Pod", "Role", "Node", "GPUs", "NICs", "Host ports"],
          (explain.reservations || []).map((r) =>
            h(
              "tr",
              {},
              h("td", {}, r.pod),
              h("td", {}, r.role),
              h("td", {}, h("a", { href: `#/nodes/${encodeURIComponent(r.node)}` }, r.node)),
              h("td", {}, (r.gpus || []).join(",") || "-"),
              h("td", {}, (r.nics || []).join(",") || "-"),
              h("td", {}, (r.hostPorts || []).join(",") || "-"),
            ),
          ),
        ),
      )
    : section("Placement", "explain", placeholder("no PodGroup: the job has finished or the operator has not seen it yet"));
  const conditions = section(
    "Conditions",
    "conditions",
    table(
      ["Type", "Status", "Reason", "Message", "Last transition"],
      (status.conditions || []).map((c) =>
        h("tr", {}, h("td", {}, c.type), h("td", {}, c.status), h("td", {}, c.reason), h("td", {}, c.message), h("td", {}, c.lastTransitionTime || "-")),
      ),
    ),
  );
  const podRows = pods.map((p) => {
    const ps = p.summary || {};
    const env = Object.entries(ps.env || {}).flatMap(([container, vars]) =>
      Object.entries(vars).map(([k, v]) => h("div", { class: "env" }, h("code", {}, `${container}: ${k}=`), h("code", { class: "env-value" }, maskEnv(k, v)))),
    );
    return h(
      "tr",
      { "data-pod": p.metadata.name },
      h("td", {}, p.metadata.name),
      h("td", {}, phaseBadge(ps.phase)),
      h("td", {}, ps.node ? h("a", { href: `#/nodes/${encodeURIComponent(ps.node)}` }, ps.node) : "-"),
      h("td", {}, (ps.gpus || []).join(",") || "-"),
      h("td", {}, ps.hostPort ?? "-"),
      h("td", {}, ps.exitCode ?? "-"),
      h("td", {}, h("details", {}, h("summary", {}, `${env.length} vars`), env)),
    );
  });
  const podsPanel = section("Pods", "pods", table(["Pod", "Phase", "Node", "GPUs", "Host port", "Exit", "Env"], podRows));
  const eventsPanel = section(
    "Events",
    "events",
    table(
      ["Type", "Reason", "Count", "Message", "Age"],
      events.map((e) =>
        h("tr", { class: e.type === "Warning" ? "warn" : "" }, h("td", {}, e.type), h("td", {}, e.reason), h("td", {}, String(e.count ?? 1)), h("td", {}, e.message), h("td", {}, age(e.lastTimestamp))),
      ),
    ),
  );
  return [head, placement, conditions, podsPanel, logsPanel(ns, name, pods), eventsPanel];
}
