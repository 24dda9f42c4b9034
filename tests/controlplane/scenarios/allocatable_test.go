package scenarios

import (
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"

	"github.com/resmgr/resmgr/tests/controlplane/internal/cluster"
)

// The node-allocatable mapping (Kubernetes 1.36, alpha gate DRANodeAllocatableResources): with
// the agent's switch on, each device maps its cpu capacity to the Node's allocatable cpu, so the
// scheduler charges claimed CPUs against the node and a plain pod cannot be placed on CPUs a
// claim holds, although the claim's pod repeats none of them in its requests. Without the
// switch, the same claim is invisible to the node's cpu, and the plain pod is placed on CPUs
// the claim holds (the reason pods must repeat their claimed CPUs in requests).
func TestNodeAllocatableMappingStopsDoubleBooking(t *testing.T) {
	// 15 allocatable cpus: the 16 of the machine less the one reserved, as a kubelet with the
	// same reserved CPU reports them.
	e := start(t, options{gates: cluster.Gates{"DRANodeAllocatableResources": true}, nodeCPU: "15"})

	// The agent's own pod (the chart's DaemonSet) asks for 50m of them.
	//
	// Without the mapping: an 8-cpu claim, and a plain pod asking for 14 cpus still fits.
	claimed := e.run("claimed", &claimSpec{cpu: "8"}, "")
	checkGranted(t, claimed, 8)
	e.createPod("plain", podSpec{cpu: "14"})
	plain := e.cp.Scheduled(workloads, "plain")
	e.cp.DeletePod(plain)
	e.remove(claimed)

	// With it: the agent republishes with the mapping, the API server keeps it (gate on), and
	// the scheduler counts the claim against the node's cpu.
	e.node.RestartAgent("--node-allocatable-cpu=true")
	devs := devices(e.slices(func(s []resourcev1.ResourceSlice) bool {
		d := devices(s)
		return len(d) == 2 && len(d["numa0"].NodeAllocatableResourceMappings) > 0 && len(d["numa1"].NodeAllocatableResourceMappings) > 0
	}))
	for name, d := range devs {
		m := d.NodeAllocatableResourceMappings["cpu"]
		if m.CapacityKey == nil || *m.CapacityKey != "cpu" {
			t.Fatalf("device %s maps %+v, want cpu from its capacity cpu", name, d.NodeAllocatableResourceMappings)
		}
	}
	claimed = e.run("claimed-again", &claimSpec{cpu: "8"}, "")
	checkGranted(t, claimed, 8)
	e.createPod("too-big", podSpec{cpu: "7"})
	if msg := e.cp.Unschedulable(workloads, "too-big"); !strings.Contains(msg, "Insufficient cpu") {
		t.Fatalf("a plain pod of 7 cpus next to an 8-cpu claim on 15 is unschedulable for another reason: %s", msg)
	}
	fits := e.run("fits", nil, "6")
	if overlaps(fits.app.Cpus, claimCPUs(claimed)) {
		t.Fatalf("the plain pod runs on %q, which overlaps the claim's %q", fits.app.Cpus, claimCPUs(claimed))
	}
}
