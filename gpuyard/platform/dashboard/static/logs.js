// The job page's Logs panel: one pod of the job at a time (its leader first, as `gpuyard logs
// job/NAME` picks), its log from GET /api/v1/namespaces/{ns}/pods/{name}/log. "Refresh" reads it
// again (it is also read again when the pod's phase changes), "Follow" streams it
// (?follow=true) until the container has finished, "Stop" ends that. An error (a backend that
// reads no logs: 501; a cluster that does not give it: 502) shows its reason.
//
// The page is rebuilt on every live update; the panel is kept across those rebuilds (the same
// element), so a followed stream goes on. It is dropped when the page shows something else.

import { api, HttpError, streamLines } from "./api.js";
import { h } from "./dom.js";

const LEADERS = ["master", "chief", "launcher", "scheduler", "ps"];
let current = null; // the panel of the job shown: { key, el, ... }

function role(pod) {
  return ((pod.summary || {}).replicaType || "").toLowerCase();
}

function index(pod) {
  return Number((pod.summary || {}).replicaIndex || 0);
}

// The pod `gpuyard logs job/NAME` shows: the first of the leader roles, else the first worker.
export function leaderPod(pods) {
  const rank = (p) => {
    const i = LEADERS.indexOf(role(p));
    return [i < 0 ? LEADERS.length : i, role(p), index(p), p.metadata.name];
  };
  const sorted = [...pods].sort((a, b) => {
    const [x, y] = [rank(a), rank(b)];
    for (let i = 0; i < x.length; i += 1) if (x[i] !== y[i]) return x[i] < y[i] ? -1 : 1;
    return 0;
  });
  return sorted[0] || null;
}

function logPath(ns, pod, container, follow) {
  const q = new URLSearchParams();
  if (container) q.set("container", container);
  if (follow) q.set("follow", "true");
  const query = q.toString();
  return `/api/v1/namespaces/${encodeURIComponent(ns)}/pods/${encodeURIComponent(pod)}/log${query ? `?${query}` : ""}`;
}

function createPanel(ns, key) {
  const podSelect = h("select", { id: "log-pod", "aria-label": "pod" });
  const containerSelect = h("select", { id: "log-container", "aria-label": "container", hidden: true });
  const refreshButton = h("button", { id: "log-refresh", type: "button" }, "Refresh");
  const followButton = h("button", { id: "log-follow", type: "button" }, "Follow");
  const status = h("span", { id: "log-status", class: "muted small" });
  const lines = h("pre", { id: "log-lines", class: "log-lines" });
  const el = h(
    "section",
    { id: "logs", class: "panel" },
    h("h2", {}, "Logs"),
    h("div", { class: "actions-row log-controls" }, podSelect, containerSelect, refreshButton, followButton, status),
    lines,
  );
  const panel = { key, ns, el, podSelect, containerSelect, followButton, status, lines, phases: {}, follow: null, reading: 0 };

  const say = (text, cls = "muted small") => {
    status.textContent = text;
    status.className = cls;
  };
  const fail = (e) => {
    const why = e instanceof HttpError ? e.message : String(e.message || e);
    say(why, e instanceof HttpError && e.status >= 500 ? "why wide" : "why");
  };

  panel.refresh = async () => {
    const pod = podSelect.value;
    if (!pod || panel.follow) return;
    const reading = (panel.reading += 1);
    try {
      const log = await api(logPath(ns, pod, containerSelect.value, false));
      if (reading !== panel.reading || pod !== podSelect.value || panel.follow) return; // a newer read, or following
      const names = log.containers || [];
      if (names.join(",") !== [...containerSelect.options].map((o) => o.value).join(",")) {
        containerSelect.replaceChildren(...names.map((c) => h("option", { value: c }, c)));
        containerSelect.value = log.container;
      }
      containerSelect.hidden = names.length <= 1;
      lines.textContent = (log.lines || []).map((l) => `${l}\n`).join("");
      lines.dataset.logPod = pod;
      if (!(log.lines || []).length && log.phase === "Pending") say("Pending: not started yet (Follow waits for it)");
      else {
        const ended = log.phase === "Succeeded" || log.phase === "Failed" ? ": the container has finished" : "";
        say(`${log.phase}${ended}${log.truncated ? `; the last ${log.lines.length} lines` : ""}`);
      }
    } catch (e) {
      if (reading !== panel.reading) return;
      lines.textContent = "";
      fail(e);
    }
  };

  panel.stop = () => {
    if (panel.follow) panel.follow.abort();
    panel.follow = null;
    followButton.textContent = "Follow";
  };

  panel.startFollow = async () => {
    const pod = podSelect.value;
    if (!pod) return;
    const controller = new AbortController();
    panel.follow = controller;
    panel.reading += 1; // a read under way is stale now
    followButton.textContent = "Stop";
    lines.textContent = "";
    lines.dataset.logPod = pod;
    say("following…");
    try {
      await streamLines(logPath(ns, pod, containerSelect.value, true), (line) => lines.append(`${line}\n`), controller.signal);
      if (panel.follow !== controller) return;
      panel.stop();
      await panel.refresh(); // the phase it ended in
    } catch (e) {
      if (panel.follow !== controller) return; // stopped, or another pod chosen
      panel.stop();
      fail(e);
    }
  };

  refreshButton.addEventListener("click", () => panel.refresh());
  followButton.addEventListener("click", () => (panel.follow ? panel.stop() : panel.startFollow()));
  podSelect.addEventListener("change", () => {
    panel.stop();
    containerSelect.replaceChildren();
    panel.refresh();
  });
  containerSelect.addEventListener("change", () => {
    panel.stop();
    panel.refresh();
  });
  return panel;
}

function leave(key) {
  if (current && current.key === key) {
    current.stop();
    current = null;
  }
}

// The Logs panel of job `ns/name` with `pods` (the page's pods, as listed).
export function logsPanel(ns, name, pods) {
  const key = `${ns}/${name}`;
  if (!current || current.key !== key) {
    if (current) current.stop();
    current = createPanel(ns, key);
    const mine = current;
    const hash = `#/jobs/${encodeURIComponent(ns)}/${encodeURIComponent(name)}`;
    const away = () => {
      if (location.hash !== hash) {
        leave(key);
        window.removeEventListener("hashchange", away);
      }
    };
    window.addEventListener("hashchange", away);
    mine.el.dataset.logJob = key;
  }
  const panel = current;
  const names = pods.map((p) => p.metadata.name);
  const shown = [...panel.podSelect.options].map((o) => o.value);
  const chosen = panel.podSelect.value;
  if (names.join(",") !== shown.join(",")) {
    panel.podSelect.replaceChildren(...pods.map((p) => h("option", { value: p.metadata.name }, p.metadata.name)));
    if (names.includes(chosen)) panel.podSelect.value = chosen;
    else {
      const leader = leaderPod(pods);
      panel.podSelect.value = leader ? leader.metadata.name : "";
      if (chosen) panel.stop();
    }
  }
  if (!pods.length) {
    panel.lines.textContent = "";
    panel.status.textContent = "no pods yet";
    return panel.el;
  }
  const pod = pods.find((p) => p.metadata.name === panel.podSelect.value);
  const phase = (pod && pod.summary && pod.summary.phase) || "";
  if (panel.phases[panel.podSelect.value] !== phase || panel.lines.dataset.logPod !== panel.podSelect.value) {
    panel.phases[panel.podSelect.value] = phase;
    if (!panel.follow) panel.refresh(); // a new pod, or its phase changed: read its log again
  }
  return panel.el;
}
