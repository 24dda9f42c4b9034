package scenarios

import (
	"strconv"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
)

// Changing the device model on a node that holds claims: a grouped claim keeps its CPUs across
// the agent's restart with `device-mode: individual`, and the per-CPU devices the agent then
// publishes must not promise them again. The scheduler allocates from the new slices alone (no
// claim references the new devices), so every claim it allocates from them must be prepared.
// Once the grouped claim goes, its CPUs are published as devices again and can be claimed.
func TestSwitchingTheDeviceModeKeepsThePromise(t *testing.T) {
	e := start(t, options{})
	held := e.run("held", &claimSpec{cpu: "3"}, "")
	checkGranted(t, held, 3)

	e.node.RestartAgent("--device-mode=individual")
	devs := devices(e.slices(func(s []resourcev1.ResourceSlice) bool {
		_, individual := devices(s)["cpu9"]
		return individual
	}))
	for name, d := range devs {
		if c := d.Attributes["cpu"]; c.IntValue != nil && cpus(claimCPUs(held))[int(*c.IntValue)] {
			t.Fatalf("device %s promises cpu %d, which claim %s holds", name, *c.IntValue, held.claim.Name)
		}
	}
	// Ask for every device the slices now advertise on the held claim's NUMA node.
	numa := results(held.claim)[0].Device
	var n int64
	for _, d := range devs {
		if a := d.Attributes["resource.kubernetes.io/numaNode"]; a.IntValue != nil && "numa"+strconv.FormatInt(*a.IntValue, 10) == numa {
			n++
		}
	}
	all := e.run("all-of-"+numa, &claimSpec{count: n, matchNUMA: true}, "")
	if overlaps(claimCPUs(all), claimCPUs(held)) {
		t.Fatalf("claims share cpus: %q and %q", claimCPUs(all), claimCPUs(held))
	}

	released := claimCPUs(held)
	e.remove(held)
	devs = devices(e.slices(func(s []resourcev1.ResourceSlice) bool {
		published := map[int]bool{}
		for _, d := range devices(s) {
			if c := d.Attributes["cpu"]; c.IntValue != nil {
				published[int(*c.IntValue)] = true
			}
		}
		return cpus(released).SubsetOf(published)
	}))
	again := e.run("released-cpus", &claimSpec{count: int64(len(cpus(released))), matchNUMA: true}, "")
	if picked := pickedCPUs(t, devs, again.claim); !sameCPUs(picked, released) || !sameCPUs(claimCPUs(again), released) {
		t.Fatalf("the scheduler picked %s, the agent granted %q; want the released cpus %q", picked, claimCPUs(again), released)
	}
}
