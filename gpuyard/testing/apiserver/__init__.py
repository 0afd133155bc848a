"""A Kubernetes API server for tests: the REST and watch protocol of the kinds gpuyard uses, in memory.

`FakeApiServer` (server.py) is what `gpuyard fake-apiserver` runs and what the pytest fixture
`fake_apiserver` starts in-process. The Kubernetes backend's tests, `gpuyard fake-nodes` and kubectl
talk to it as to a real cluster: discovery, resourceVersions, LIST/WATCH from a version with bookmarks,
410 Gone after compaction, 409 on stale writes, selectors, the `status` and `binding` subresources,
CRD registration, garbage collection by ownerReferences, and fault injection (`faults.py`).

Module map, bottom up: errors (Status bodies) < selecting, patching, catalog (resources, discovery) <
storage (versions, history, watchers) < objects (verb semantics) < tables, watching, routes (HTTP) <
server. Documented in docs/kubernetes-testing.md.
"""

from gpuyard.testing.apiserver.errors import ApiError
from gpuyard.testing.apiserver.faults import FaultRequest, Faults
from gpuyard.testing.apiserver.routes import AuditRecord
from gpuyard.testing.apiserver.server import DEFAULT_TOKEN, FakeApiServer

__all__ = ["DEFAULT_TOKEN", "ApiError", "AuditRecord", "FakeApiServer", "FaultRequest", "Faults"]
