package scenarios

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/resmgr/resmgr/tests/controlplane/internal/cluster"
	"github.com/resmgr/resmgr/tests/controlplane/internal/node"
)

// createKindsClaim creates a claim of one request for 1 CPU and 256 MiB of our devices that
// match selector (none when ""), configured with memoryKinds kinds.
func (e *env) createKindsClaim(name, selector string, kinds []string) {
	e.t.Helper()
	raw, err := json.Marshal(map[string]any{"apiVersion": "resmgr.io/v1alpha1", "kind": "CpuConfig", "memoryKinds": kinds})
	if err != nil {
		e.t.Fatal(err)
	}
	req := resourcev1.ExactDeviceRequest{DeviceClassName: deviceClass, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1,
		Capacity: &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{
			"cpu": resource.MustParse("1"), "memory": resource.MustParse("256Mi")}}}
	if selector != "" {
		req.Selectors = []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: selector}}}
	}
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: workloads},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "numa", Exactly: &req}},
			Config: []resourcev1.DeviceClaimConfiguration{{DeviceConfiguration: resourcev1.DeviceConfiguration{
				Opaque: &resourcev1.OpaqueDeviceConfiguration{Driver: node.Driver, Parameters: runtime.RawExtension{Raw: raw}}}}}}}}
	cx, cancel := context.WithTimeout(context.Background(), cluster.WaitLimit)
	defer cancel()
	if _, err := e.cp.Admin.ResourceV1().ResourceClaims(workloads).Create(cx, claim, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("creating claim %s: %v", name, err)
	}
}

// A machine of four DRAM nodes with CXL memory attached to node 1 (the policy's
// four-sockets-slit.xml fixture). Only numa1 says `cxlAttached`, and the real scheduler
// evaluates a selector on it: a claim for CXL memory lands on numa1 and its container gets
// node 1 and the CXL node 4; one selecting HBM, which the machine lacks, stays Pending with the
// scheduler's reason; one naming CXL without the selector is allocated on numa0 by the
// scheduler and refused by the agent, naming the request and what it holds.
func TestMemoryKinds(t *testing.T) {
	xml := filepath.Join(repoRoot(t), "crates", "policy", "tests", "fixtures", "four-sockets-slit.xml")
	e := start(t, options{topology: "xml:" + xml, args: []string{"--claim-memory", "50%"}})
	devs := devices(e.slices(func(s []resourcev1.ResourceSlice) bool { return len(devices(s)) == 4 }))
	for _, d := range devs {
		_, has := d.Attributes["cxlAttached"]
		if has != (d.Name == "numa1") {
			t.Fatalf("device %s: cxlAttached present %v, want it on numa1 only", d.Name, has)
		}
	}

	selects := func(attr string) string {
		return `"` + attr + `" in device.attributes["` + node.Driver + `"]`
	}
	e.createKindsClaim("cxl", selects("cxlAttached"), []string{"dram", "cxl"})
	w := e.runAligned("cxl")
	if r := resultOf(t, w.claim, "numa"); r.Device != "numa1" {
		t.Fatalf("%s: want numa1, the node with CXL memory", describe(w.claim))
	}
	if w.app.Mems != "1,4" || !subset(w.app.Cpus, "4-7") {
		t.Fatalf("the container runs on cpus %q mems %q, want one of numa1's cpus (4-7) and mems 1,4", w.app.Cpus, w.app.Mems)
	}

	e.createKindsClaim("hbm", selects("hbmAttached"), []string{"dram", "hbm"})
	e.createPod("hbm", podSpec{claim: "hbm"})
	if msg := e.cp.Unschedulable(workloads, "hbm"); !strings.Contains(msg, "cannot allocate all claims") {
		t.Fatalf("the HBM claim's pod is unschedulable for another reason: %s", msg)
	}

	e.createKindsClaim("unselected", "", []string{"dram", "cxl"})
	e.createPod("unselected", podSpec{claim: "unselected"})
	pod := e.cp.Scheduled(workloads, "unselected")
	if r := resultOf(t, e.cp.Claim(workloads, "unselected"), "numa"); r.Device != "numa0" {
		t.Fatalf("without the selector the scheduler picked %s, want numa0 (the first)", r.Device)
	}
	_, err := e.node.Prepare(e.cp.Admin, pod)
	if err == nil || !strings.Contains(err.Error(), "request numa, cpus") || !strings.Contains(err.Error(), "256Mi of memory on NUMA node 0") ||
		!strings.Contains(err.Error(), "memoryKinds names cxl, but no cxl memory is attached to NUMA node 0") {
		t.Fatalf("prepare of a claim for CXL memory on numa0: want a refusal naming the request and what it holds, got %v", err)
	}
}
