// Package clusterscenarios runs resmgr in a real one-node cluster (package onenode): the
// kubelet, kube-controller-manager, kube-scheduler and kube-apiserver of the control-plane
// build, containerd and runc, the agent installed with Helm as the chart's DaemonSet. The tests
// act only through the API (client-go, kubectl, helm) and check the outcome in the kernel:
// cgroup cpusets and /proc/<pid>/status of the containers' processes. Run them with
// `cargo xtask e2e --stage cluster`, which builds everything and sets the environment.
package clusterscenarios

import (
	"fmt"
	"os"
	"testing"

	"github.com/resmgr/resmgr/tests/controlplane/internal/onenode"
)

// node is the cluster every test of the package runs on, one after the other.
var node *onenode.Node

func TestMain(m *testing.M) {
	cfg, err := onenode.ConfigFromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The node-allocatable mapping's gate, for its scenario (allocatable_test.go): it changes
	// nothing while the agent maps nothing, as by default.
	node, err = onenode.Up(cfg, onenode.Options{
		Logf:         func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) },
		FeatureGates: map[string]bool{"DRANodeAllocatableResources": true},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "bringing up the cluster:", err)
		os.Exit(1)
	}
	code := m.Run()
	keep := code != 0
	if keep {
		fmt.Fprintf(os.Stderr, "the cluster's files and logs are kept in %s\n", node.Dir())
	}
	if err := node.Close(keep); err != nil {
		fmt.Fprintln(os.Stderr, "taking the cluster down:", err)
		code = 1
	}
	// Down must leave nothing of the run on the machine (its directory only when kept).
	for _, left := range node.Leftovers() {
		if keep && left == "directory "+node.Dir() {
			continue
		}
		fmt.Fprintln(os.Stderr, "left behind after the cluster was taken down:", left)
		code = 1
	}
	os.Exit(code)
}
