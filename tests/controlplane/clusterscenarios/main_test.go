// Package clusterscenarios runs resmgr in a real one-node cluster (package onenode): the
// kubelet, kube-controller-manager, kube-scheduler and kube-apiserver of the control-plane
// build, containerd and runc, the agent installed with Helm as the chart's DaemonSet. The tests
// act only through the API (client-go, kubectl, helm) and check the outcome in the kernel:
// cgroup cpusets and /proc/<pid>/status of the containers' processes. Run them with
// `cargo xtask e2e --stage cluster`, which builds everything and sets the environment.
package clusterscenarios

import (
	"os"
	"testing"

	"github.com/resmgr/resmgr/tests/controlplane/internal/onenode"
)

// node is the cluster every test of the package runs on, one after the other.
var node *onenode.Node

func TestMain(m *testing.M) {
	// The node-allocatable mapping's gate, for its scenario (allocatable_test.go): it changes
	// nothing while the agent maps nothing, as by default.
	os.Exit(onenode.RunTests(m, onenode.Options{
		FeatureGates: map[string]bool{"DRANodeAllocatableResources": true},
	}, func(n *onenode.Node) { node = n }))
}
