// Package nodev2scenarios runs resmgr on the node its users run: cgroup v2 alone and the
// systemd cgroup driver, with the kubelet of the newest release (failCgroupV1 and MemoryQoS at
// their defaults), the runtime's systemd cgroup manager (runc's SystemdCgroup, CRI-O's
// cgroup_manager) and the agent installed with Helm as the DaemonSet's pod, in a VM with
// systemd as PID 1 (package onenode, Options.VM); the control plane runs on this machine. The
// tests act through the API and read the outcome from the guest's kernel and systemd: cgroup v2
// files, /proc/<pid>/status, the scope units' properties. Run them with `cargo xtask e2e
// --stage node-v2`, which builds the VM image and everything else and sets the environment.
package nodev2scenarios

import (
	"fmt"
	"os"
	"testing"

	"github.com/resmgr/resmgr/tests/controlplane/internal/onenode"
)

// node is the cluster every test of the package runs on, one after the other.
var node *onenode.Node

func TestMain(m *testing.M) {
	vm, ok, err := onenode.VMConfigFromEnv()
	if err == nil && !ok {
		err = fmt.Errorf("%s not set: run this with `cargo xtask e2e --stage node-v2`", onenode.EnvVMImage)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The node-allocatable mapping's gate, for the MemoryQoS scenario: it changes nothing while
	// the agent maps nothing, as by default.
	os.Exit(onenode.RunTests(m, onenode.Options{
		FeatureGates: map[string]bool{"DRANodeAllocatableResources": true},
		VM:           &vm,
	}, func(n *onenode.Node) { node = n }))
}
