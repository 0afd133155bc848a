// Built by `make k8s-bin`: etcd for the real control plane of gpuyard's tests, at the version
// Kubernetes' own go.mod pins.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
