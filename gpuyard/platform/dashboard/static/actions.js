// Changing jobs from the dashboard with the token in the header (kept in sessionStorage):
// submit (paste YAML or JSON, POST /api/v1/jobs) and delete (a button on the job page, after a
// confirm). The server's error is shown as it answered: its message and every detail.
// Suspend and resume are not offered: the API has no job update route yet.

import { HttpError, api, token } from "./api.js";
import { h } from "./dom.js";

// The server's error, verbatim: status, message, then each `field: reason` detail on its own line.
export function errorBox(e, id) {
  const err = e instanceof HttpError && e.body && e.body.error;
  const details = (err && err.details) || [];
  const hint = e instanceof HttpError && (e.status === 401 || e.status === 403) ? " (enter a token with the right role in the Token field above)" : "";
  return h(
    "div",
    { class: "action-error", id, role: "alert" },
    h("b", {}, e instanceof HttpError ? `HTTP ${e.status}: ` : "error: ", err ? err.message : e.message, hint),
    details.length ? h("ul", {}, details.map((d) => h("li", {}, h("code", {}, d.field), `: ${d.reason}`))) : null,
  );
}

const EXAMPLE = `apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: my-job
  namespace: default
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template:
        spec:
          containers:
            - name: pytorch
              image: pytorch/pytorch:2.3.0
              resources:
                limits: {nvidia.com/gpu: 1}
`;

// The submit page is built once and kept, so live reloads of other data never wipe what is typed.
let submitPage = null;

export function renderSubmit() {
  if (submitPage) return submitPage;
  const text = h("textarea", { id: "submit-yaml", rows: 22, spellcheck: "false", placeholder: EXAMPLE });
  const result = h("div", { id: "submit-result" });
  const button = h("button", { type: "submit", id: "submit-button" }, "Submit");
  const form = h(
    "form",
    {
      id: "submit-form",
      onsubmit: async (ev) => {
        ev.preventDefault();
        button.disabled = true;
        result.replaceChildren(h("p", { class: "muted" }, "submitting…"));
        try {
          const body = text.value;
          const json = /^\s*[[{]/.test(body);
          const out = await api("/api/v1/jobs", { method: "POST", body, contentType: json ? "application/json" : "application/yaml" });
          result.replaceChildren(
            h(
              "div",
              { class: "action-ok", id: "submit-ok" },
              "Submitted: ",
              (out.items || []).map((j, i) => {
                const ns = j.metadata.namespace;
                const name = j.metadata.name;
                return [i ? ", " : "", h("a", { href: `#/jobs/${encodeURIComponent(ns)}/${encodeURIComponent(name)}` }, `${j.kind} ${ns}/${name}`)];
              }),
            ),
          );
        } catch (e) {
          result.replaceChildren(errorBox(e, "submit-error"));
        } finally {
          button.disabled = false;
        }
      },
    },
    h("p", { class: "muted" }, "Paste one or more job documents (YAML separated by ---, or JSON). All are created or none. The request is sent with the token from the field above."),
    text,
    h("div", { class: "actions-row" }, button, h("span", { class: "muted", id: "submit-token" }, token.get() ? "token set" : "no token set: a server with tokens will answer 401")),
    result,
  );
  submitPage = [h("section", { id: "submit", class: "panel" }, h("h2", {}, "Submit jobs"), h("p", { class: "back" }, h("a", { href: "#/" }, "← cluster")), form)];
  return submitPage;
}

// The last delete error per job ("ns/name"), kept across the page's live reloads.
const deleteErrors = new Map();

export function deleteButton(ns, name, { onDeleted = () => {} } = {}) {
  const key = `${ns}/${name}`;
  const box = h("div", { class: "delete-box" });
  const button = h(
    "button",
    {
      type: "button",
      id: "delete-job",
      class: "danger",
      onclick: async () => {
        if (!window.confirm(`Delete job ${key} with its pods, services and reservations?`)) return;
        button.disabled = true;
        try {
          await api(`/api/v1/namespaces/${encodeURIComponent(ns)}/jobs/${encodeURIComponent(name)}`, { method: "DELETE" });
          deleteErrors.delete(key);
          onDeleted(key);
        } catch (e) {
          deleteErrors.set(key, e);
          box.replaceChildren(button, errorBox(e, "delete-error"));
        } finally {
          button.disabled = false;
        }
      },
    },
    "Delete job",
  );
  box.append(button);
  if (deleteErrors.has(key)) box.append(errorBox(deleteErrors.get(key), "delete-error"));
  return box;
}
