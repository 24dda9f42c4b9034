package scenarios

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resmgr/resmgr/tests/controlplane/internal/cluster"
	"github.com/resmgr/resmgr/tests/controlplane/internal/node"
)

// Device taints (issue 44): a CPU of the node goes offline, as the kernel says in sysfs (a tree
// of the test's, the agent's --sysfs-root: the synthetic node is not this machine); the agent
// taints the device behind it in its slice, and the real scheduler allocates the device to no
// new claim until the CPU is back.

// offlineKey is the taint the agent puts on a device whose CPUs went offline.
const offlineKey = node.Driver + "/cpus-offline"

// nodeSysfs writes the sysfs files the agent's health monitor reads, every CPU of twoNUMA
// online and both nodes with memory, and returns its root.
func nodeSysfs(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	setSysfs(t, root, "devices/system/cpu/online", "0-15")
	setSysfs(t, root, "devices/system/node/has_memory", "0-1")
	return root
}

// setSysfs writes one sysfs file under root, as the kernel would change it.
func setSysfs(t *testing.T, root, file, value string) {
	t.Helper()
	path := filepath.Join(root, file)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	// Renamed into place: the agent never reads half a file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(value+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// taintsOf waits until device's taints in our slices satisfy cond, and returns them.
func (e *env) taintsOf(device string, cond func([]resourcev1.DeviceTaint) bool) []resourcev1.DeviceTaint {
	e.t.Helper()
	var taints []resourcev1.DeviceTaint
	e.slices(func(s []resourcev1.ResourceSlice) bool {
		d, ok := devices(s)[device]
		taints = d.Taints
		return ok && cond(taints)
	})
	return taints
}

func deviceOf(t *testing.T, w *workload) string {
	t.Helper()
	r := results(w.claim)
	if len(r) != 1 {
		t.Fatalf("%s: want one result", describe(w.claim))
	}
	return r[0].Device
}

// With the default gates (DRADeviceTaints beta and on in 1.36, GA in 1.37): CPU 7, of numa0,
// goes offline. The agent taints numa0 (NoSchedule, cpus-offline=7) and tells the claim
// prepared there, which keeps its CPUs (prepared again, it is answered the same device). A new
// claim of 2 CPUs, which the scheduler would give numa0 (its first device, with room: as it
// does once the CPU is back), gets numa1. The CPU back online, the taint goes.
func TestATaintKeepsNewClaimsOffADeviceWhoseCPUWentOffline(t *testing.T) {
	root := nodeSysfs(t)
	e := start(t, options{args: []string{"--sysfs-root", root}})
	if taints := e.taintsOf("numa0", func([]resourcev1.DeviceTaint) bool { return true }); len(taints) != 0 {
		t.Fatalf("numa0 is tainted with every CPU online: %+v", taints)
	}
	before := e.run("before", &claimSpec{cpu: "2"}, "")
	if d := deviceOf(t, before); d != "numa0" {
		t.Fatalf("the first claim got %s, want numa0 (the scheduler's first device with room)", d)
	}

	setSysfs(t, root, "devices/system/cpu/online", "0-6,8-15")
	taints := e.taintsOf("numa0", func(ts []resourcev1.DeviceTaint) bool { return len(ts) > 0 })
	if len(taints) != 1 || taints[0].Key != offlineKey || taints[0].Value != "7" ||
		taints[0].Effect != resourcev1.DeviceTaintEffectNoSchedule || taints[0].TimeAdded == nil {
		t.Fatalf("numa0's taints: %+v, want %s=7:NoSchedule with its time", taints, offlineKey)
	}
	if others := e.taintsOf("numa1", func([]resourcev1.DeviceTaint) bool { return true }); len(others) != 0 {
		t.Fatalf("numa1, all of whose CPUs are online, is tainted: %+v", others)
	}

	// The claim on numa0 is told, not revoked.
	e.cp.Poll("a DeviceTainted Event on the claim prepared on numa0", func(cx context.Context) (bool, error) {
		events, err := e.cp.Admin.EventsV1().Events(workloads).List(cx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, ev := range events.Items {
			if ev.Reason == "DeviceTainted" && ev.Regarding.Kind == "ResourceClaim" && ev.Regarding.Name == "before" &&
				strings.Contains(ev.Note, "device numa0: cpu 7 is offline") {
				return true, nil
			}
		}
		return false, nil
	})
	again, err := e.node.Prepare(e.cp.Admin, before.pod)
	if err != nil || len(again["before"]) != 1 || again["before"][0].Device != "numa0" {
		t.Fatalf("the claim on the tainted device, prepared again: %+v %v", again, err)
	}

	after := e.run("after", &claimSpec{cpu: "2"}, "")
	if d := deviceOf(t, after); d != "numa1" {
		t.Fatalf("a claim made while numa0 is tainted got %s, want numa1", d)
	}

	setSysfs(t, root, "devices/system/cpu/online", "0-15")
	e.taintsOf("numa0", func(ts []resourcev1.DeviceTaint) bool { return len(ts) == 0 })
	back := e.run("back", &claimSpec{cpu: "2"}, "")
	if d := deviceOf(t, back); d != "numa0" {
		t.Fatalf("a claim made once numa0 is healthy again got %s, want numa0", d)
	}
}

// NUMA node 1 losing its memory taints numa1 (memory-offline=1); its coming back untaints it.
func TestATaintMarksADeviceWhoseNodeLostItsMemory(t *testing.T) {
	root := nodeSysfs(t)
	e := start(t, options{args: []string{"--sysfs-root", root}})
	setSysfs(t, root, "devices/system/node/has_memory", "0")
	taints := e.taintsOf("numa1", func(ts []resourcev1.DeviceTaint) bool { return len(ts) > 0 })
	if len(taints) != 1 || taints[0].Key != node.Driver+"/memory-offline" || taints[0].Value != "1" {
		t.Fatalf("numa1's taints: %+v, want memory-offline=1", taints)
	}
	setSysfs(t, root, "devices/system/node/has_memory", "0-1")
	e.taintsOf("numa1", func(ts []resourcev1.DeviceTaint) bool { return len(ts) == 0 })
}

// Where DRADeviceTaints is off (an operator's choice: it is beta and on by default in 1.36, GA
// and still switchable in 1.37, where DRADeviceTaintRules, which depends on it, must go off with
// it), the API server drops the taints: the agent reports the dropped field (metric and log) and
// does not rewrite its slices over it, and the scheduler, which sees no taint, allocates the
// device as before: the device's health shows only in the kubelet's resource health stream.
func TestWithoutDeviceTaintsTheTaintIsDroppedAndReported(t *testing.T) {
	root := nodeSysfs(t)
	e := start(t, options{gates: cluster.Gates{"DRADeviceTaints": false, "DRADeviceTaintRules": false},
		args: []string{"--sysfs-root", root}})
	setSysfs(t, root, "devices/system/cpu/online", "0-6,8-15")
	e.cp.Poll("the agent reporting the dropped taints", func(context.Context) (bool, error) {
		return strings.Contains(e.node.Metrics(), `resmgr_slice_fields_dropped{field="devices[].taints"} 1`), nil
	})
	if taints := e.taintsOf("numa0", func([]resourcev1.DeviceTaint) bool { return true }); len(taints) != 0 {
		t.Fatalf("the API server kept taints with the gate off: %+v", taints)
	}
	w := e.run("claim", &claimSpec{cpu: "2"}, "")
	if d := deviceOf(t, w); d != "numa0" {
		t.Fatalf("with the taint dropped the claim got %s, want numa0", d)
	}
}
