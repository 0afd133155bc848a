// Built by `make k8s-bin`: the real control plane for gpuyard's tests, from Kubernetes' own Go modules.
// The same main as upstream's cmd/kube-apiserver.
package main

import (
	"os"
	_ "time/tzdata" // CronJob time zones, as upstream

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
