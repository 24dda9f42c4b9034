package scenarios

import (
	"context"
	"strconv"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resmgr/resmgr/tests/controlplane/internal/cluster"
)

// advertised is what each device's cpu capacity says, by device name.
func advertised(slices []resourcev1.ResourceSlice) map[string]int64 {
	out := map[string]int64{}
	for name, d := range devices(slices) {
		c := d.Capacity["cpu"]
		out[name] = c.Value.Value()
	}
	return out
}

// The slices' promise after NRI placements: Guaranteed containers without claims come first
// (the kubelet admitted them; the agent places them through NRI), then a claim for everything
// each device still advertises. The scheduler allocates each from the slices alone; every
// allocated claim must be prepared, with the CPUs the scheduler counted, and no CPU may be
// granted to a claim and to another container at once. With `cpu-exclusivity: claims` (the
// default) the Guaranteed containers share and end up on the reserved CPU when claims take
// every published one; with `partition` they keep exclusive CPUs outside `claim-cpus`.
func TestEverythingTheSlicesAdvertiseCanBeClaimedAfterNRIPlacements(t *testing.T) {
	t.Run("claims", func(t *testing.T) { promise(t, options{}, "0") })
	t.Run("partition", func(t *testing.T) {
		promise(t, options{args: []string{"--cpu-exclusivity=partition", "--claim-cpus=8-15"}}, "")
	})
}

// promise runs the scenario; guaranteedOn is where the Guaranteed containers must end up ("" for
// anywhere off the claims).
func promise(t *testing.T, o options, guaranteedOn string) {
	e := start(t, o)
	var guaranteed []*workload
	for _, name := range []string{"g1", "g2", "g3"} {
		guaranteed = append(guaranteed, e.run(name, nil, "2"))
	}

	caps := advertised(e.slices(func(s []resourcev1.ResourceSlice) bool { return len(devices(s)) > 0 }))
	var claims []*workload
	for device, n := range caps {
		if n == 0 {
			continue
		}
		// Each pod asks for a whole device's advertised cpus and repeats none in its requests,
		// so that only the devices decide where it goes.
		name := "all-of-" + device
		e.createClaim(name, claimSpec{cpu: strconv.FormatInt(n, 10)})
		e.createPod(name, podSpec{claim: name})
		w := &workload{pod: e.cp.Scheduled(workloads, name)}
		w.claim = e.cp.Claim(workloads, name)
		prepared, err := e.node.Prepare(e.cp.Admin, w.pod)
		if err != nil {
			t.Fatalf("the scheduler allocated %s from what the slices advertised (%v), and the agent did not prepare it: %v",
				describe(w.claim), caps, err)
		}
		w.prepared = prepared[name]
		w.app = e.node.RunContainers(w.pod)["app"]
		t.Logf("scheduler: %s; agent: %s; container on %q", describe(w.claim), preparedText(w.prepared), w.app.Cpus)
		claims = append(claims, w)
	}
	if len(claims) == 0 {
		t.Fatalf("the slices advertise nothing: %v", caps)
	}

	// Every claimed CPU is held by one claim only, and by no running container but the claim's.
	cpusets := e.node.Cpusets()
	for i, c := range claims {
		granted := claimCPUs(c)
		for _, other := range claims[i+1:] {
			if overlaps(granted, claimCPUs(other)) {
				t.Fatalf("claims %s and %s share cpus: %q and %q", c.claim.Name, other.claim.Name, granted, claimCPUs(other))
			}
		}
		for id, set := range cpusets {
			if id != c.app.ID && overlaps(set, granted) {
				t.Fatalf("container %s runs on %q, which overlaps claim %s's %q", id, set, c.claim.Name, granted)
			}
		}
	}
	for _, g := range guaranteed {
		got := cpusets[g.app.ID]
		if got == "" || guaranteedOn != "" && got != guaranteedOn {
			t.Fatalf("Guaranteed container %s runs on %q after the claims, want %q", g.app.ID, got, guaranteedOn)
		}
		t.Logf("Guaranteed container %s: %q when created, %q after the claims", g.app.ID, g.app.Cpus, got)
	}
}

// The gate off: an API server restarted with DRAConsumableCapacity=false drops the capacity
// fields of the slices the agent writes from then on (here after the kubelet-style wipe), and
// the scheduler hands each device out whole, to one claim. The agent notices the dropped fields
// and says so, and a claim allocated a whole device gets all of its CPUs.
func TestWithoutConsumableCapacityADeviceGoesWholeToOneClaim(t *testing.T) {
	e := start(t, options{})
	before := advertised(e.slices(func(s []resourcev1.ResourceSlice) bool { return len(devices(s)) == 2 }))

	e.cp.Restart(cluster.Gates{"DRAConsumableCapacity": false})
	cx, cancel := context.WithTimeout(context.Background(), cluster.WaitLimit)
	defer cancel()
	err := e.cp.Admin.ResourceV1().ResourceSlices().DeleteCollection(cx, metav1.DeleteOptions{},
		metav1.ListOptions{FieldSelector: "spec.nodeName=" + nodeName})
	if err != nil {
		t.Fatal(err)
	}
	e.slices(func(s []resourcev1.ResourceSlice) bool {
		d := devices(s)
		return len(d) == 2 && d["numa0"].AllowMultipleAllocations == nil && d["numa1"].AllowMultipleAllocations == nil
	})
	// The agent tells the operator which setting fits this cluster, and says it in a metric.
	e.cp.Poll("the agent to report the dropped fields", func(context.Context) (bool, error) {
		return strings.Contains(e.node.Log(), "DRAConsumableCapacity is off in this cluster") &&
			strings.Contains(e.node.Log(), "set device-mode: individual"), nil
	})
	if m := e.node.Metrics(); !strings.Contains(m, `resmgr_slice_fields_dropped{field="devices[].allowMultipleAllocations"} 1`) {
		t.Fatalf("/metrics does not report the dropped field:\n%s", m)
	}

	// A claim for one device, no capacity (the API server would drop a capacity request too).
	w := e.run("whole", &claimSpec{}, "")
	res := results(w.claim)
	if len(res) != 1 || len(res[0].ConsumedCapacity) != 0 || res[0].ShareID != nil {
		t.Fatalf("with the gate off the scheduler allocated %s; want one whole device, no consumed capacity or share", describe(w.claim))
	}
	want := before[res[0].Device]
	if got := int64(len(cpus(claimCPUs(w)))); got != want {
		t.Fatalf("the scheduler gave %s whole (%d cpus), the agent granted %q", res[0].Device, want, claimCPUs(w))
	}
	// The scheduler now believes that device taken: a second claim goes to the other one, and a
	// third finds none.
	second := e.run("second", &claimSpec{}, "")
	if r := results(second.claim); len(r) != 1 || r[0].Device == res[0].Device {
		t.Fatalf("second claim: %s, want the other device", describe(second.claim))
	}
	e.createClaim("third", claimSpec{})
	e.createPod("third", podSpec{claim: "third"})
	e.cp.Unschedulable(workloads, "third")
}

// A 2-CPU node with one CPU reserved (a common VM size): the agent publishes a device for the
// one CPU left (the API server accepts it), the scheduler allocates it to a claim, the agent
// prepares it; a BestEffort pod the scheduler puts next to it still gets a cpuset. Played
// rather than real: the cluster stage runs the same claim and BestEffort pod with a real
// kubelet, but on the machine's own CPUs, which are two only on a machine of that size.
func TestATwoCPUNode(t *testing.T) {
	e := start(t, options{topology: "synthetic:pack:1 numa:1 core:2 pu:1", reserved: "cpuset:0", nodeCPU: "1"})
	caps := advertised(e.slices(func(s []resourcev1.ResourceSlice) bool { return len(devices(s)) > 0 }))
	if len(caps) != 1 {
		t.Fatalf("a 2-cpu node with one reserved publishes %v, want one device", caps)
	}
	w := e.run("one", &claimSpec{cpu: "1"}, "")
	if got := claimCPUs(w); got != "1" {
		t.Fatalf("the claim got %q, want cpu 1 (0 is reserved)", got)
	}
	be := e.run("best-effort", nil, "")
	if be.app.Cpus == "" {
		t.Fatal("the BestEffort container got no cpuset")
	}
}
