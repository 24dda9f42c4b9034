package scenarios

import (
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
)

// numaCPUs are the CPUs of each NUMA node of twoNUMA, by device name.
var numaCPUs = map[string]string{"numa0": "0-7", "numa1": "8-15"}

// checkGranted checks that the agent prepared the claim's one allocation result and granted
// exactly the CPUs the scheduler counted, all of the device's NUMA node, to the container.
func checkGranted(t *testing.T, w *workload, wantCPUs int) {
	t.Helper()
	res := results(w.claim)
	if len(res) != 1 {
		t.Fatalf("%s: want one result", describe(w.claim))
	}
	r := res[0]
	if len(w.prepared) != 1 || w.prepared[0].Device != r.Device || w.prepared[0].Pool != r.Pool {
		t.Fatalf("%s: the agent prepared %+v", describe(w.claim), w.prepared)
	}
	if r.ShareID == nil || w.prepared[0].ShareID != string(*r.ShareID) {
		t.Fatalf("%s: the agent answered share ID %q", describe(w.claim), w.prepared[0].ShareID)
	}
	consumed := r.ConsumedCapacity["cpu"]
	if consumed.Value() != int64(wantCPUs) {
		t.Fatalf("%s: the scheduler consumed %s cpu, want %d", describe(w.claim), consumed.String(), wantCPUs)
	}
	granted := claimCPUs(w)
	if n := len(cpus(granted)); n != wantCPUs {
		t.Fatalf("%s: the agent granted %q (%d cpus), want %d", describe(w.claim), granted, n, wantCPUs)
	}
	if !subset(granted, numaCPUs[r.Device]) {
		t.Fatalf("%s: the agent granted %q, outside %s's cpus %s", describe(w.claim), granted, r.Device, numaCPUs[r.Device])
	}
	if w.app.Cpus != granted {
		t.Fatalf("%s: the container runs on %q, the claim holds %q", describe(w.claim), w.app.Cpus, granted)
	}
}

// Per-NUMA devices with consumable capacity (the default, `grouped`): the agent publishes one
// device per NUMA node; the real scheduler allocates CPUs from them by capacity, rounding up by
// the request policy's step and applying its default; each allocated claim is prepared with
// exactly the CPUs the scheduler counted, on the device's NUMA node; a claim that no device has
// room for leaves its pod unschedulable.
func TestGroupedDevicesWithConsumableCapacity(t *testing.T) {
	e := start(t, options{})

	// What the scheduler sees: numa0 without the reserved CPU 0, numa1 whole, both shareable
	// with a request policy of whole CPUs defaulting to one.
	devs := devices(e.slices(func(s []resourcev1.ResourceSlice) bool { return len(devices(s)) == 2 }))
	for name, want := range map[string]int64{"numa0": 7, "numa1": 8} {
		d, ok := devs[name]
		if !ok {
			t.Fatalf("no device %s in %v", name, devs)
		}
		c := d.Capacity["cpu"]
		if c.Value.Value() != want || d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
			t.Fatalf("device %s: capacity %s, allowMultipleAllocations %v; want %d shareable", name, c.Value.String(), d.AllowMultipleAllocations, want)
		}
		if p := c.RequestPolicy; p == nil || p.Default == nil || p.Default.Value() != 1 || p.ValidRange == nil || p.ValidRange.Step == nil || p.ValidRange.Step.Value() != 1 {
			t.Fatalf("device %s: request policy %+v", name, c.RequestPolicy)
		}
	}

	// 2500m is rounded up to 3 by the step; no capacity request gets the default of one.
	rounded := e.run("rounded", &claimSpec{cpu: "2500m"}, "3")
	checkGranted(t, rounded, 3)
	dflt := e.run("default", &claimSpec{}, "1")
	checkGranted(t, dflt, 1)
	if overlaps(claimCPUs(rounded), claimCPUs(dflt)) {
		t.Fatalf("two claims share cpus: %q and %q", claimCPUs(rounded), claimCPUs(dflt))
	}
	e.remove(rounded)
	e.remove(dflt)

	// 4 and 6 fit (on two devices or one each); a third 6 has no device with room.
	four := e.run("four", &claimSpec{cpu: "4"}, "4")
	checkGranted(t, four, 4)
	six := e.run("six", &claimSpec{cpu: "6"}, "6")
	checkGranted(t, six, 6)
	if overlaps(claimCPUs(four), claimCPUs(six)) {
		t.Fatalf("two claims share cpus: %q and %q", claimCPUs(four), claimCPUs(six))
	}
	// Its pod repeats no cpus in its requests, so that the node's cpu is not what stops it.
	e.createClaim("another-six", claimSpec{cpu: "6"})
	e.createPod("another-six", podSpec{claim: "another-six"})
	msg := e.cp.Unschedulable(workloads, "another-six")
	if !strings.Contains(msg, "cannot allocate all claims") {
		t.Fatalf("another-six is unschedulable for another reason: %s", msg)
	}

	// The agent's own record agrees: two claims, ten CPUs.
	state := e.node.DebugState()
	if n := len(state["prepared_claims"].(map[string]any)); n != 2 {
		t.Fatalf("the agent holds %d prepared claims, want 2: %v", n, state["prepared_claims"])
	}
}
