package scenarios

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/resmgr/resmgr/tests/controlplane/internal/cluster"
	"github.com/resmgr/resmgr/tests/controlplane/internal/node"
)

// createDeviceClass creates a DeviceClass of our driver whose claims get settings as our
// CpuConfig, the way docs/kubernetes.md tells an administrator to.
func (e *env) createDeviceClass(name string, settings map[string]any) {
	e.t.Helper()
	params := map[string]any{"apiVersion": "resmgr.io/v1alpha1", "kind": "CpuConfig"}
	for k, v := range settings {
		params[k] = v
	}
	raw, err := json.Marshal(params)
	if err != nil {
		e.t.Fatal(err)
	}
	class := &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourcev1.DeviceClassSpec{
			Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{
				Expression: `device.driver == "` + node.Driver + `"`}}},
			Config: []resourcev1.DeviceClassConfiguration{{DeviceConfiguration: resourcev1.DeviceConfiguration{
				Opaque: &resourcev1.OpaqueDeviceConfiguration{Driver: node.Driver,
					Parameters: runtime.RawExtension{Raw: raw}}}}},
		},
	}
	cx, cancel := context.WithTimeout(context.Background(), cluster.WaitLimit)
	defer cancel()
	if _, err := e.cp.Admin.ResourceV1().DeviceClasses().Create(cx, class, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("creating DeviceClass %s: %v", name, err)
	}
}

// Claim configuration through a DeviceClass: the scheduler copies the class's configuration
// for our driver into the allocation, and the agent applies it. memoryPinning off leaves the
// container's memory nodes to the runtime (no DRA_MEMS_ in the spec); fullCores grants whole
// cores (both SMT siblings of every core).
func TestClaimConfigurationFromADeviceClass(t *testing.T) {
	e := start(t, options{})
	e.createDeviceClass("unpinned.cpu.resmgr.io", map[string]any{"memoryPinning": false})
	e.createDeviceClass("whole-cores.cpu.resmgr.io", map[string]any{"fullCores": true})

	unpinned := e.run("unpinned", &claimSpec{cpu: "2", class: "unpinned.cpu.resmgr.io"}, "2")
	cfg := unpinned.claim.Status.Allocation.Devices.Config
	if len(cfg) != 1 || cfg[0].Source != resourcev1.AllocationConfigSourceClass || !strings.Contains(string(cfg[0].Opaque.Parameters.Raw), "memoryPinning") {
		t.Fatalf("the scheduler allocated %s with configuration %+v, want the class's", describe(unpinned.claim), cfg)
	}
	checkGranted(t, unpinned, 2)
	for _, v := range unpinned.app.Env {
		if strings.HasPrefix(v, "DRA_MEMS_") {
			t.Fatalf("memory pinning is off by the class, yet the spec sets %s", v)
		}
	}
	if unpinned.app.Mems != "" {
		t.Fatalf("memory pinning is off by the class, yet the container got memory nodes %q", unpinned.app.Mems)
	}

	// Whole cores: twoNUMA numbers the two threads of core k as cpus 2k and 2k+1.
	whole := e.run("whole-cores", &claimSpec{cpu: "4", class: "whole-cores.cpu.resmgr.io"}, "4")
	checkGranted(t, whole, 4)
	granted := cpus(claimCPUs(whole))
	for c := range granted {
		if !granted[c^1] {
			t.Fatalf("fullCores from the class, yet the claim holds cpu %d without its sibling %d: %q", c, c^1, claimCPUs(whole))
		}
	}
	if whole.app.Mems == "" {
		t.Fatalf("the whole-cores class leaves memory pinning on, yet the container got no memory nodes")
	}
}
