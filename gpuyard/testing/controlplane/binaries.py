"""Where the real control plane's binaries are: the folder `make k8s-bin` builds them into
(`hack/k8s/build.sh`), or the one `GPUYARD_K8S_BIN` names, for every consumer (the CLI, the tests,
the benchmarks).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ETCD_VERSION",
    "KUBE_VERSION",
    "TOOLS",
    "Binaries",
    "BinariesMissing",
    "default_bin_dir",
    "find_binaries",
]

# Pinned in hack/k8s/go.mod and build.sh as well (a test holds the three together).
KUBE_VERSION = "v1.37.2"
ETCD_VERSION = "v3.7.0"
TOOLS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
ENV = "GPUYARD_K8S_BIN"


class BinariesMissing(RuntimeError):
    """The folder lacks one of the binaries; the message says which and how to build them."""


@dataclass(frozen=True)
class Binaries:
    folder: Path
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path


def default_bin_dir() -> Path:
    """`$GPUYARD_K8S_BIN`, else the cache folder build.sh uses."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "gpuyard" / f"k8s-{KUBE_VERSION}"


def find_binaries(folder: str | Path | None = None) -> Binaries:
    """The binaries in `folder` (default: `default_bin_dir()`), or `BinariesMissing`."""
    where = Path(folder).expanduser() if folder else default_bin_dir()
    missing = [t for t in TOOLS if not os.access(where / t, os.X_OK)]
    if missing:
        raise BinariesMissing(
            f"the real control plane's binaries are not in {where} (missing: {', '.join(missing)}); "
            f"build them with `make k8s-bin` (Kubernetes {KUBE_VERSION} from its Go modules), or "
            f"point {ENV} or --bin-dir at a folder that has them"
        )
    return Binaries(
        folder=where,
        etcd=where / "etcd",
        kube_apiserver=where / "kube-apiserver",
        kube_controller_manager=where / "kube-controller-manager",
        kube_scheduler=where / "kube-scheduler",
    )
