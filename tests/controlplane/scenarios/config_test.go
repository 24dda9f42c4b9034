package scenarios

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/resmgr/resmgr/tests/controlplane/internal/cluster"
	"github.com/resmgr/resmgr/tests/controlplane/internal/node"
)

// wholeCoresClass is the DeviceClass of examples/kubernetes/deviceclass-whole-cores.yaml.
const wholeCoresClass = "whole-cores.cpu.resmgr.io"

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

// createExampleWholeCoresClass creates the DeviceClass of examples/kubernetes/
// deviceclass-whole-cores.yaml, as a user would apply it (the example's claim template and pod
// need the controller-manager and a kubelet, which the scenarios play themselves).
func (e *env) createExampleWholeCoresClass() {
	e.t.Helper()
	path := filepath.Join(repoRoot(e.t), "examples", "kubernetes", "deviceclass-whole-cores.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var class resourcev1.DeviceClass
		if err := yaml.UnmarshalStrict([]byte(doc), &class); err != nil || class.Kind != "DeviceClass" {
			continue
		}
		cx, cancel := context.WithTimeout(context.Background(), cluster.WaitLimit)
		defer cancel()
		if _, err := e.cp.Admin.ResourceV1().DeviceClasses().Create(cx, &class, metav1.CreateOptions{}); err != nil {
			e.t.Fatalf("creating the DeviceClass of %s: %v", path, err)
		}
		if class.Name != wholeCoresClass {
			e.t.Fatalf("%s names its DeviceClass %s, want %s", path, class.Name, wholeCoresClass)
		}
		return
	}
	e.t.Fatalf("no DeviceClass in %s", path)
}

// wholeCores reports whether a cpu list is made of whole cores of twoNUMA, which numbers the
// two threads of core k as cpus 2k and 2k+1.
func wholeCores(list string) bool {
	set := cpus(list)
	for c := range set {
		if !set[c^1] {
			return false
		}
	}
	return len(set) > 0
}

// Claim configuration through a DeviceClass: the scheduler copies the class's configuration
// for our driver into the allocation, and the agent applies it. memoryPinning off leaves the
// container's memory nodes to the runtime (no DRA_MEMS_ in the spec). fullCores on devices
// that hand out single CPUs is invisible to the scheduler: the agent grants whole cores when
// they make up what the scheduler allocated (4 cpus), and otherwise (3 cpus) exactly what it
// allocated, with a warning, never a refusal after allocation. The example's whole-cores class
// selects only devices that hand out whole cores, so on this node its claims are not allocated.
func TestClaimConfigurationFromADeviceClass(t *testing.T) {
	e := start(t, options{})
	e.createDeviceClass("unpinned.cpu.resmgr.io", map[string]any{"memoryPinning": false})
	e.createDeviceClass("full-cores.cpu.resmgr.io", map[string]any{"fullCores": true})
	e.createExampleWholeCoresClass()

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

	four := e.run("four-full-cores", &claimSpec{cpu: "4", class: "full-cores.cpu.resmgr.io"}, "4")
	checkGranted(t, four, 4)
	if !wholeCores(claimCPUs(four)) {
		t.Fatalf("fullCores from the class and 4 cpus of free whole cores, yet the claim holds %q", claimCPUs(four))
	}
	if four.app.Mems == "" {
		t.Fatalf("the full-cores class leaves memory pinning on, yet the container got no memory nodes")
	}
	// Measured before issue 18's fix: allocated on numa1, then refused "needs 3 cpus in whole
	// cores (fullCores) on numa1".
	three := e.run("three-full-cores", &claimSpec{cpu: "3", class: "full-cores.cpu.resmgr.io"}, "3")
	checkGranted(t, three, 3)
	if !strings.Contains(e.node.Log(), "asks for whole cores (fullCores)") {
		t.Fatalf("the agent granted %q to a fullCores claim of 3 cpus without a warning", claimCPUs(three))
	}

	e.createClaim("example-whole-cores", claimSpec{cpu: "2", class: wholeCoresClass})
	e.createPod("example-whole-cores", podSpec{claim: "example-whole-cores"})
	if msg := e.cp.Unschedulable(workloads, "example-whole-cores"); !strings.Contains(msg, "cannot allocate all claims") {
		t.Fatalf("a claim of the whole-cores class on a node without wholeCores devices: %s", msg)
	}
}

// Whole cores the scheduler accounts for (`claim-granularity: core`): only whole cores are
// published (numa0 loses CPU 0's sibling 1), every device says wholeCores, and the request
// policy counts in cores, so the scheduler rounds 3 cpus up to 4 and 1 up to 2; the agent
// grants exactly that, in whole cores, to claims of the example's whole-cores class.
func TestWholeCoresTheSchedulerAccountsFor(t *testing.T) {
	e := start(t, options{args: []string{"--claim-granularity=core"}})
	e.createExampleWholeCoresClass()
	devs := devices(e.slices(func(s []resourcev1.ResourceSlice) bool { return len(devices(s)) == 2 }))
	for name, want := range map[string]int64{"numa0": 6, "numa1": 8} {
		d := devs[name]
		c := d.Capacity["cpu"]
		whole := d.Attributes["wholeCores"]
		if c.Value.Value() != want || whole.BoolValue == nil || !*whole.BoolValue {
			t.Fatalf("device %s: capacity %s, wholeCores %v; want %d cpus in whole cores", name, c.Value.String(), whole.BoolValue, want)
		}
		if p := c.RequestPolicy; p == nil || p.ValidRange == nil || p.ValidRange.Step == nil || p.ValidRange.Step.Value() != 2 {
			t.Fatalf("device %s: request policy %+v, want steps of a core's 2 threads", name, c.RequestPolicy)
		}
	}

	three := e.run("three", &claimSpec{cpu: "3", class: wholeCoresClass}, "")
	checkGranted(t, three, 4)
	one := e.run("one", &claimSpec{cpu: "1", class: wholeCoresClass}, "")
	checkGranted(t, one, 2)
	for _, w := range []*workload{three, one} {
		if !wholeCores(claimCPUs(w)) {
			t.Fatalf("%s holds %q, not whole cores", describe(w.claim), claimCPUs(w))
		}
	}
	if overlaps(claimCPUs(three), claimCPUs(one)) {
		t.Fatalf("two claims share cpus: %q and %q", claimCPUs(three), claimCPUs(one))
	}
}
