package scenarios

import (
	"context"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resmgr/resmgr/tests/controlplane/internal/cluster"
	"github.com/resmgr/resmgr/tests/controlplane/internal/node"
)

// The node-allocatable mapping (alpha gate DRANodeAllocatableResources, in 1.36's form or
// 1.37's, whichever the API server knows): with
// the agent's switch on, each device maps its cpu capacity to the Node's allocatable cpu, so the
// scheduler charges claimed CPUs against the node and a plain pod cannot be placed on CPUs a
// claim holds, although the claim's pod repeats none of them in its requests. Without the
// switch, the same claim is invisible to the node's cpu, and the plain pod is placed on CPUs
// the claim holds (the reason pods must repeat their claimed CPUs in requests). On 1.37, whose
// API server refuses the mapping for a Node that does not declare the feature, the agent first
// publishes without it (claims still work), and maps once the Node declares it.
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

	// With it: the agent republishes with the mapping, the API server keeps it (gate on) in the
	// form its release knows, and the scheduler counts the claim against the node's cpu.
	// The 1.36 API server fills in the default multiplier.
	want := map[string]any{"nodeAllocatableResourceMappings": map[string]any{"cpu": map[string]any{"capacityKey": "cpu", "allocationMultiplier": "1"}}}
	if serverMinor(t, e) >= 37 {
		// 1.37 replaced the field (KEP-5517's second alpha) and spells the multiplier out. Its
		// API server admits slices that map node resources only for a Node that declares the
		// feature (NodeDeclaredFeatureValidator), as a 1.37 kubelet with the gate does.
		want = map[string]any{"nodeAllocatableResources": map[string]any{
			"cpu": map[string]any{"mapping": map[string]any{"capacityKey": "cpu", "capacityMultiplier": "1"}}}}
		// Before the Node declares it, the API server refuses the mapped slices (403); the
		// agent publishes them without the mapping rather than nothing, and says so.
		e.node.RestartAgent("--node-allocatable-cpu=true")
		e.cp.Poll("the agent saying the mapping is refused", func(context.Context) (bool, error) {
			return strings.Contains(e.node.Metrics(), "\nresmgr_node_allocatable_refused 1\n"), nil
		})
		if log := e.node.Log(); !strings.Contains(log, "refuses the node-allocatable mapping") ||
			!strings.Contains(log, "does not support DRANodeAllocatableResources feature") {
			t.Fatalf("the agent's log does not name the refusal:\n%s", log)
		}
		refused, err := rawDevices(context.Background(), e)
		if err != nil {
			t.Fatal(err)
		}
		if len(refused) != 2 || refused["numa0"][mappingField(want)] != nil || refused["numa1"][mappingField(want)] != nil {
			t.Fatalf("with the mapping refused the node's devices are %v, want numa0 and numa1 without it", refused)
		}
		whileRefused := e.run("while-refused", &claimSpec{cpu: "2"}, "")
		checkGranted(t, whileRefused, 2)
		e.remove(whileRefused)
		// A kubelet restarted with the gate declares the feature and wipes the node's slices:
		// the agent publishes them again, with the mapping.
		declareFeature(t, e, "DRANodeAllocatableResources")
		wipeSlices(t, e)
	} else {
		e.node.RestartAgent("--node-allocatable-cpu=true")
	}
	var stored map[string]map[string]any
	e.cp.Poll("both devices mapping cpu", func(cx context.Context) (bool, error) {
		var err error
		stored, err = rawDevices(cx, e)
		if err != nil {
			return false, err
		}
		return len(stored) == 2 && stored["numa0"][mappingField(want)] != nil && stored["numa1"][mappingField(want)] != nil, nil
	})
	for name, d := range stored {
		got := map[string]any{}
		for _, field := range []string{"nodeAllocatableResourceMappings", "nodeAllocatableResources"} {
			if v, ok := d[field]; ok {
				got[field] = v
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("device %s maps %v, want %v (the one form this release knows)", name, got, want)
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

// serverMinor is the API server's minor version (36 for 1.36).
func serverMinor(t *testing.T, e *env) int {
	t.Helper()
	v, err := e.cp.Admin.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("the API server's version: %v", err)
	}
	minor, err := strconv.Atoi(strings.TrimSuffix(v.Minor, "+"))
	if err != nil {
		t.Fatalf("the API server's minor version %q: %v", v.Minor, err)
	}
	return minor
}

// mappingField is the one field of want.
func mappingField(want map[string]any) string {
	for field := range want {
		return field
	}
	return ""
}

// rawDevices is our node's devices as the API server stores them, by name: JSON, because the
// client's types know only one release's fields.
func rawDevices(cx context.Context, e *env) (map[string]map[string]any, error) {
	body, err := e.cp.Admin.ResourceV1().RESTClient().Get().AbsPath("/apis/resource.k8s.io/v1/resourceslices").
		Param("fieldSelector", "spec.nodeName="+nodeName+",spec.driver="+node.Driver).DoRaw(cx)
	if err != nil {
		return nil, err
	}
	var list struct {
		Items []struct {
			Spec struct {
				Devices []map[string]any `json:"devices"`
			} `json:"spec"`
		} `json:"items"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, err
	}
	out := map[string]map[string]any{}
	for _, s := range list.Items {
		for _, d := range s.Spec.Devices {
			name, _ := d["name"].(string)
			out[name] = d
		}
	}
	return out, nil
}

// wipeSlices deletes the node's slices, as a starting kubelet does.
func wipeSlices(t *testing.T, e *env) {
	t.Helper()
	e.cp.Poll("the node's slices wiped", func(cx context.Context) (bool, error) {
		err := e.cp.Admin.ResourceV1().ResourceSlices().DeleteCollection(cx, metav1.DeleteOptions{},
			metav1.ListOptions{FieldSelector: "spec.nodeName=" + nodeName})
		return err == nil, err
	})
}

// declareFeature adds feature to the Node's status.declaredFeatures, as a kubelet that has it
// declares it.
func declareFeature(t *testing.T, e *env, feature string) {
	t.Helper()
	e.cp.Poll("the node declaring "+feature, func(cx context.Context) (bool, error) {
		n, err := e.cp.Admin.CoreV1().Nodes().Get(cx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		n.Status.DeclaredFeatures = append(n.Status.DeclaredFeatures, feature)
		_, err = e.cp.Admin.CoreV1().Nodes().UpdateStatus(cx, n, metav1.UpdateOptions{})
		return err == nil, err
	})
}
