package scenarios

import (
	"sort"
	"strconv"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
)

// pickedCPUs is the cpu list of the devices the scheduler allocated to a claim, from their
// `cpu` attribute.
func pickedCPUs(t *testing.T, devs map[string]resourcev1.Device, claim *resourcev1.ResourceClaim) string {
	t.Helper()
	var picked []int
	for _, r := range results(claim) {
		cpu := devs[r.Device].Attributes["cpu"]
		if cpu.IntValue == nil {
			t.Fatalf("%s: device %s has no cpu attribute", describe(claim), r.Device)
		}
		picked = append(picked, int(*cpu.IntValue))
	}
	sort.Ints(picked)
	var parts []string
	for _, c := range picked {
		parts = append(parts, strconv.Itoa(c))
	}
	return strings.Join(parts, ",")
}

// sameCPUs compares two cpu lists as sets.
func sameCPUs(a, b string) bool { return cpus(a).Equal(cpus(b)) }

// One device per CPU (`device-mode: individual`, for clusters without consumable capacity): the
// scheduler picks `count` devices with matchAttribute on the NUMA node, and the agent grants
// exactly the CPUs it picked. Eight devices on one node fit only numa1 (numa0 has 7 besides the
// reserved CPU 0), four then fit numa0, and four more fit nowhere.
func TestIndividualDevicesWithCountAndMatchAttribute(t *testing.T) {
	e := start(t, options{args: []string{"--device-mode=individual"}})
	devs := devices(e.slices(func(s []resourcev1.ResourceSlice) bool { return len(devices(s)) == 15 }))
	for name, d := range devs {
		if d.AllowMultipleAllocations != nil || len(d.Capacity) > 0 && d.Capacity["cpu"].RequestPolicy != nil {
			t.Fatalf("device %s is shared or has a request policy: %+v", name, d)
		}
		if d.Attributes["resource.kubernetes.io/numaNode"].IntValue == nil {
			t.Fatalf("device %s has no numaNode attribute", name)
		}
	}

	check := func(w *workload, n int, numa string) {
		t.Helper()
		if len(w.prepared) != n || len(results(w.claim)) != n {
			t.Fatalf("%s: the agent prepared %d devices, want %d", describe(w.claim), len(w.prepared), n)
		}
		picked := pickedCPUs(t, devs, w.claim)
		if !sameCPUs(claimCPUs(w), picked) || !sameCPUs(w.app.Cpus, picked) {
			t.Fatalf("the scheduler picked cpus %s, the agent granted %q, the container runs on %q", picked, claimCPUs(w), w.app.Cpus)
		}
		if !subset(picked, numa) {
			t.Fatalf("the scheduler picked cpus %s, not all on the NUMA node of %s", picked, numa)
		}
	}
	eight := e.run("eight", &claimSpec{count: 8, matchNUMA: true}, "8")
	check(eight, 8, "8-15")
	four := e.run("four", &claimSpec{count: 4, matchNUMA: true}, "4")
	check(four, 4, "1-7")

	e.createClaim("four-more", claimSpec{count: 4, matchNUMA: true})
	e.createPod("four-more", podSpec{claim: "four-more"})
	if msg := e.cp.Unschedulable(workloads, "four-more"); !strings.Contains(msg, "cannot allocate all claims") {
		t.Fatalf("four-more is unschedulable for another reason: %s", msg)
	}
}
