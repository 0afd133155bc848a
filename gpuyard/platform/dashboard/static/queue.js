// One queue: its settings and share, the jobs waiting in it in queue order with why each waits,
// and the jobs it runs.

import { api, optional } from "./api.js";
import { age, h, phaseBadge, placeholder, section } from "./dom.js";

const PENDING = ["", "Created", "Queuing"];

// A link to a queue's page, for wherever a queue name appears.
export function queueLink(name) {
  if (!name) return "-";
  return h("a", { class: "queue-link", href: `#/queues/${encodeURIComponent(name)}` }, name);
}

export async function loadQueue(name) {
  const enc = encodeURIComponent(name);
  const [queue, jobs] = await Promise.all([api(`/api/v1/queues/${enc}`), api(`/api/v1/jobs?queue=${enc}`)]);
  const pending = jobs.items.filter((j) => PENDING.includes(j.summary.phase || ""));
  const explains = await Promise.all(
    pending.map((j) =>
      optional(`/api/v1/namespaces/${encodeURIComponent(j.metadata.namespace)}/jobs/${encodeURIComponent(j.metadata.name)}/explain`),
    ),
  );
  return { queue, jobs: jobs.items, pending: pending.map((job, i) => ({ job, explain: explains[i] })) };
}

// The scheduler's "#3 in queue team-a" position, when it wrote one.
function position(explain) {
  const m = /#(\d+) in queue /.exec((explain && explain.message) || "");
  return m ? Number(m[1]) : Infinity;
}

function lastCondition(job) {
  const conds = (job.status && job.status.conditions) || [];
  return conds[conds.length - 1];
}

function jobLink(j) {
  const key = `${j.metadata.namespace}/${j.metadata.name}`;
  return h("a", { href: `#/jobs/${encodeURIComponent(j.metadata.namespace)}/${encodeURIComponent(j.metadata.name)}` }, key);
}

function table(headers, rows, empty) {
  if (!rows.length) return placeholder(empty);
  return h("table", {}, h("thead", {}, h("tr", {}, headers.map((t) => h("th", {}, t)))), h("tbody", {}, rows));
}

export function renderQueue({ queue, jobs, pending }) {
  const name = queue.metadata.name;
  const spec = queue.spec || {};
  const status = queue.status || {};
  const implicit = ((queue.metadata.annotations || {})["gpuyard.io/implicit"] || "") === "true";
  const share = typeof status.share === "number" ? status.share.toFixed(2) : implicit ? "- (implicit queue: not computed)" : "-";
  const head = section(
    `Queue ${name}`,
    "queue",
    h("p", { class: "back" }, h("a", { href: "#/" }, "← cluster")),
    h(
      "dl",
      { class: "facts" },
      h("dt", {}, "Source"),
      h("dd", {}, implicit ? "implicit (named by jobs, default settings)" : "Queue object"),
      h("dt", {}, "Share"),
      h("dd", { id: "queue-share" }, share),
      h("dt", {}, "Weight"),
      h("dd", {}, String(spec.weight ?? 1)),
      h("dt", {}, "Strategy"),
      h("dd", {}, spec.queueingStrategy || "BestEffortFIFO"),
      h("dt", {}, "Max running"),
      h("dd", {}, spec.maxRunningJobs ?? "no limit"),
      h("dt", {}, "Pending"),
      h("dd", { id: "queue-pending" }, String(status.pending ?? 0)),
      h("dt", {}, "Running"),
      h("dd", { id: "queue-running" }, String(status.running ?? 0)),
      spec.description ? [h("dt", {}, "Description"), h("dd", {}, spec.description)] : null,
    ),
  );
  const ordered = pending
    .map((p, i) => ({ ...p, i }))
    .sort(
      (a, b) =>
        position(a.explain) - position(b.explain) ||
        String(a.job.metadata.creationTimestamp || "").localeCompare(String(b.job.metadata.creationTimestamp || "")) ||
        a.i - b.i,
    );
  const pendingRows = ordered.map(({ job, explain }, i) => {
    const cond = lastCondition(job);
    const why = explain ? explain.message || explain.reason || explain.phase : (cond && cond.message) || "no PodGroup yet";
    // the last condition's message usually repeats the scheduler's (it is copied from it): shown once
    const condText = cond ? [`${cond.type}${cond.reason ? ` (${cond.reason})` : ""}`, cond.message && !cond.message.includes(why) ? `: ${cond.message}` : ""].join("") : "-";
    return h(
      "tr",
      { "data-job": `${job.metadata.namespace}/${job.metadata.name}` },
      h("td", {}, String(i + 1)),
      h("td", {}, jobLink(job)),
      h("td", {}, phaseBadge(job.summary.phase)),
      h("td", { class: "why wide" }, why),
      h("td", { class: "muted" }, condText),
      h("td", { class: "muted" }, age(job.metadata.creationTimestamp)),
    );
  });
  const running = jobs.filter((j) => ["Running", "Restarting"].includes(j.summary.phase));
  const runningRows = running.map((j) =>
    h(
      "tr",
      { "data-job": `${j.metadata.namespace}/${j.metadata.name}` },
      h("td", {}, jobLink(j)),
      h("td", {}, j.kind),
      h("td", {}, phaseBadge(j.summary.phase)),
      h("td", {}, Object.entries(j.summary.replicas || {}).map(([r, n]) => `${r}:${n}`).join(", ")),
      h("td", { class: "muted" }, (j.status && j.status.startTime) || "-"),
    ),
  );
  const done = jobs.filter((j) => !PENDING.includes(j.summary.phase || "") && !["Running", "Restarting"].includes(j.summary.phase));
  return [
    head,
    section(
      "Pending, in queue order",
      "queue-pending-jobs",
      table(["#", "Job", "Phase", "Why pending (scheduler)", "Last condition", "Waiting"], pendingRows, "no job is waiting in this queue"),
    ),
    section("Running", "queue-running-jobs", table(["Job", "Kind", "Phase", "Replicas", "Started"], runningRows, "no job of this queue is running")),
    done.length
      ? section("Finished or suspended", "queue-other-jobs", h("p", { class: "muted" }, done.map((j) => `${j.metadata.namespace}/${j.metadata.name} (${j.summary.phase})`).join(", ")))
      : null,
  ].filter(Boolean);
}
