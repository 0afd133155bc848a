#!/usr/bin/env bash
# Build the real control plane (kube-apiserver, kube-controller-manager, kube-scheduler, etcd) from
# Kubernetes' own Go modules, through the Go module proxy, into a cache folder outside the repository.
# Reused when every binary is there at the pinned version; prints the folder on its last line.
#   GPUYARD_K8S_BIN   the folder (default: ${XDG_CACHE_HOME:-~/.cache}/gpuyard/k8s-<version>)
set -euo pipefail
cd "$(dirname "$0")"
KUBE_VERSION=v1.37.2
ETCD_VERSION=v3.7.0
BIN=${GPUYARD_K8S_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuyard/k8s-$KUBE_VERSION}
STAMP="$BIN/.built-$KUBE_VERSION-etcd-$ETCD_VERSION"
TOOLS=(kube-apiserver kube-controller-manager kube-scheduler etcd)

have_all() { [ -f "$STAMP" ] && for t in "${TOOLS[@]}"; do [ -x "$BIN/$t" ] || return 1; done; }
if have_all; then echo "k8s-bin: $KUBE_VERSION and etcd $ETCD_VERSION already built" >&2; echo "$BIN"; exit 0; fi

command -v go >/dev/null || { echo "k8s-bin: no Go toolchain on PATH (Go 1.21 or newer; see README)" >&2; exit 2; }
# A Go older than go.mod's `go` line fetches the toolchain it asks for through the module proxy.
export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION"
mkdir -p "$BIN"
start=$(date +%s)
for t in "${TOOLS[@]}"; do
  echo "k8s-bin: building $t ($KUBE_VERSION) into $BIN" >&2
  # One package at a time keeps the peak memory of a 2-core machine's build low; GOFLAGS from the
  # environment (for example -p=1) pass through.
  CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$BIN/$t.tmp" "./cmd/$t"
  mv "$BIN/$t.tmp" "$BIN/$t"
done
touch "$STAMP"
echo "k8s-bin: built in $(( $(date +%s) - start )) s" >&2
echo "$BIN"
