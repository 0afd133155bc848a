"""The backend tests' view of the real control plane (`kube_control_plane`, built by `make k8s-bin`):
the same questions `FakeApiServerView` answers about the development server — objects by plural,
the requests made, bindings, deletions — asked over HTTPS as the admin, and read from the API
server's audit log.

Fault injection (500s on demand, dropped watches) is the development server's alone: a test that
needs it is marked `dev_apiserver_only` and runs there only.

Between tests the cluster is wiped back to what a fresh control plane with gpuyard's CRDs holds
(every node, every object in a namespace other than kube-system and kube-public, gpuyard's
cluster-scoped objects, non-system PriorityClasses, namespaces and CRDs a test made), with
finalizers stripped and pods deleted at once (gracePeriodSeconds 0, as a kubelet's final delete).
"""

from __future__ import annotations

import json
import ssl
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuyard.apis.crds import crds
from gpuyard.apis.resources import API_RESOURCES, ApiResource

__all__ = ["GPUYARD_NAMESPACE", "ControlPlaneView", "admin_http", "ensure_namespace", "install_crds"]

Json = dict[str, Any]
GPUYARD_NAMESPACE = "gpuyard-system"  # made once, as `gpuyard install` does: its contents are wiped
_KEEP_NAMESPACES = {"default", "kube-system", "kube-public", "kube-node-lease", GPUYARD_NAMESPACE}
_SYSTEM_NAMESPACES = {"kube-system", "kube-public"}
_METHODS = {
    "create": "POST",
    "get": "GET",
    "list": "GET",
    "watch": "WATCH",
    "update": "PUT",
    "patch": "PATCH",
}
_CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


class _RetryBusy(httpx.HTTPTransport):
    """An API server answers 429 (with Retry-After) while a just-established CRD's storage starts,
    and under priority-and-fairness pressure: wait and ask again, as client-go does."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        for _ in range(50):
            response = super().handle_request(request)
            if response.status_code != 429:
                return response
            response.close()
            time.sleep(min(float(response.headers.get("Retry-After") or 1), 1.0) / 5)
        return response


def admin_http(plane: Any) -> httpx.Client:
    """An HTTPS client of the control plane, authenticated as its admin (system:masters)."""
    pki = plane.pki
    context = ssl.create_default_context(cafile=str(pki.ca_cert))
    context.load_cert_chain(str(pki.admin.cert), str(pki.admin.key))
    return httpx.Client(base_url=plane.url, transport=_RetryBusy(verify=context), timeout=15.0)


def ensure_namespace(http: httpx.Client, name: str) -> None:
    answer = http.post(
        "/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    assert answer.status_code in (201, 409), answer.text


def install_crds(http: httpx.Client, docs: list[Json], *, timeout: float = 60.0) -> None:
    """Server-side apply of `docs` (CRDs), then wait until every one is Established."""
    for crd in docs:
        answer = http.patch(
            f"{_CRDS}/{crd['metadata']['name']}",
            params={"fieldManager": "gpuyard-tests", "force": "true"},
            content=json.dumps(crd),
            headers={"Content-Type": "application/apply-patch+yaml"},
        )
        assert answer.status_code in (200, 201), f"CRD {crd['metadata']['name']} refused: {answer.text}"
    end = time.monotonic() + timeout
    for crd in docs:
        while True:
            got = http.get(f"{_CRDS}/{crd['metadata']['name']}").json()
            status = got.get("status") or {}
            conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
            if conditions.get("Established") == "True":
                break
            if time.monotonic() > end:
                raise AssertionError(f"CRD {crd['metadata']['name']} not Established: {conditions}")
            time.sleep(0.1)


class ControlPlaneView:
    """See the module docstring."""

    real = True

    def __init__(self, plane: Any, http: httpx.Client) -> None:
        self.plane = plane
        self.http = http
        self.kubeconfig: Path = plane.admin_kubeconfig
        self.admin_user: str = plane.pki.admin.user
        self._audit_from = plane.audit_log.stat().st_size if plane.audit_log.exists() else 0

    # --- objects --------------------------------------------------------------------------------

    def _served(self, plural: str) -> list[ApiResource]:
        return [r for r in API_RESOURCES if r.plural == plural]

    def list(self, plural: str) -> list[Json]:
        items: list[Json] = []
        for res in self._served(plural):
            answer = self.http.get(res.path())
            if answer.status_code == 404:  # a group this cluster does not serve
                continue
            answer.raise_for_status()
            for item in answer.json()["items"]:
                item.setdefault("kind", res.wire_kind)
                item.setdefault("apiVersion", res.api_version)
                items.append(item)
        return items

    def get(self, plural: str, namespace: str, name: str) -> Json | None:
        for res in self._served(plural):
            answer = self.http.get(res.path(namespace=namespace or None, name=name))
            if answer.status_code == 200:
                obj: Json = answer.json()
                return obj
        return None

    # --- what was asked -------------------------------------------------------------------------

    def audit(self) -> list[Json]:
        """The audit events (ResponseComplete) of every request since the test began."""
        log = self.plane.audit_log
        with log.open("rb") as f:
            f.seek(self._audit_from)
            lines = f.read().splitlines()
        events = [json.loads(line) for line in lines if line.strip()]
        return [e for e in events if e.get("stage") == "ResponseComplete" and e.get("objectRef")]

    @property
    def requests(self) -> list[tuple[str, str]]:
        out = []
        for e in self.audit():
            ref = e["objectRef"]
            parts = (ref.get("apiGroup"), ref.get("resource"), ref.get("namespace"), ref.get("name"))
            path = "/".join(x for x in (*parts, ref.get("subresource")) if x)
            out.append((_METHODS.get(e["verb"], e["verb"].upper()), "/" + path))
        return out

    def bindings(self) -> list[tuple[str, str]]:
        return [
            (e["objectRef"].get("namespace", ""), e["objectRef"].get("name", ""))
            for e in self.audit()
            if e["verb"] == "create"
            and e["objectRef"].get("subresource") == "binding"
            and 200 <= e.get("responseStatus", {}).get("code", 0) < 300
        ]

    def deletions(self, plural: str, namespace: str, name: str) -> int:
        return sum(
            1
            for e in self.audit()
            if e["verb"] == "delete"
            and e["objectRef"].get("resource") == plural
            and e["objectRef"].get("namespace", "") == namespace
            and e["objectRef"].get("name") == name
            and not e["objectRef"].get("subresource")
            and 200 <= e.get("responseStatus", {}).get("code", 0) < 300
        )

    def install_crds(self, docs: list[Json]) -> None:
        install_crds(self.http, docs)

    def ensure_namespace(self, name: str) -> None:
        """A real API server refuses objects in a namespace that does not exist."""
        ensure_namespace(self.http, name)

    # --- the development server's alone ---------------------------------------------------------

    def fail(self, *args: Any, **kwargs: Any) -> None:
        pytest.fail("fault injection needs the development API server: mark the test dev_apiserver_only")

    clear_faults = drop_watches = fail

    # --- between tests --------------------------------------------------------------------------

    def wipe(self, *, timeout: float = 60.0) -> None:
        """Delete what tests leave behind (see the module docstring) and wait until it is gone."""
        end = time.monotonic() + timeout
        while True:
            left = self._delete_round()
            if not left:
                return
            if time.monotonic() > end:
                raise AssertionError(f"control plane not clean after {timeout:.0f} s: {left[:10]}")
            time.sleep(0.2)

    def _delete_round(self) -> list[str]:
        left: list[str] = []
        for res in _wipeable():
            answer = self.http.get(res.path())
            if answer.status_code in (404, 405):
                continue
            answer.raise_for_status()
            for item in answer.json()["items"]:
                meta = item["metadata"]
                ns, name = meta.get("namespace", ""), meta["name"]
                if ns in _SYSTEM_NAMESPACES or _kept(res, name):
                    continue
                path = res.path(namespace=ns or None, name=name)
                left.append(path)
                if meta.get("finalizers"):
                    self.http.patch(
                        path,
                        content=json.dumps({"metadata": {"finalizers": None}}),
                        headers={"Content-Type": "application/merge-patch+json"},
                    )
                if not meta.get("deletionTimestamp") or res.plural == "pods":
                    self.http.request(
                        "DELETE",
                        path,
                        content=json.dumps({"gracePeriodSeconds": 0, "propagationPolicy": "Background"}),
                    )
        shipped = {c["metadata"]["name"] for c in gpuyard_crds()}
        for crd in self.http.get(_CRDS).json()["items"]:
            name = crd["metadata"]["name"]
            if name not in shipped:  # a test installed it (a gang scheduler's, say)
                if not crd["metadata"].get("deletionTimestamp"):
                    self.http.delete(f"{_CRDS}/{name}")
                left.append(f"CRD {name}")
        for ns in self.http.get("/api/v1/namespaces").json()["items"]:
            name = ns["metadata"]["name"]
            if name not in _KEEP_NAMESPACES:
                if not ns["metadata"].get("deletionTimestamp"):
                    self.http.delete(f"/api/v1/namespaces/{name}")
                left.append(f"namespace {name}")
        return left


def _kept(res: ApiResource, name: str) -> bool:
    """What a fresh control plane holds outside its system namespaces: system PriorityClasses, and
    what it makes again at once: each namespace's `kube-root-ca.crt` ConfigMap, the `kubernetes`
    Service."""
    if res.plural == "configmaps":
        return name == "kube-root-ca.crt"
    if res.plural == "services":
        return name == "kubernetes"
    return res.plural == "priorityclasses" and name.startswith("system-")


# workloads a test may apply (`gpuyard install --print` has a Deployment) whose controllers would
# make the pods again: they go first
_WORKLOADS = (
    ApiResource("Deployment", "apps", "v1", "deployments"),
    ApiResource("ReplicaSet", "apps", "v1", "replicasets"),
)


def _wipeable() -> list[ApiResource]:
    """Each REST collection once (a job kind is served in two groups: both are wiped)."""
    return [*_WORKLOADS, *{res.path(): res for res in API_RESOURCES}.values()]


def gpuyard_crds() -> list[Json]:
    """The CRDs gpuyard ships (`gpuyard install --write-crds`)."""
    return crds()
