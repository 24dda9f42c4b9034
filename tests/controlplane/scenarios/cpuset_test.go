package scenarios

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/resmgr/resmgr/tests/controlplane/internal/cluster"
	"github.com/resmgr/resmgr/tests/controlplane/internal/node"
)

// A cpuset chosen outside Kubernetes (issue 44): examples/kubernetes/
// claim-cpuset-chosen-outside.yaml applied as it is names CPUs 4-7 and memory node 0 in its
// configuration and selects numa0, which holds them on the 16-CPU node; the real scheduler
// allocates numa0 and copies the configuration into the allocation, and the agent grants
// exactly those CPUs and that node, which the container's environment says.
func TestTheCpusetChosenOutsideExampleGetsItsCPUs(t *testing.T) {
	e := start(t, options{})
	e.cp.Kubectl("apply", "-f", filepath.Join(repoRoot(t), "examples", "kubernetes", "claim-cpuset-chosen-outside.yaml"))
	pod := e.cp.Scheduled(workloads, "dra-cpuset-chosen-outside")
	prepared, err := e.node.Prepare(e.cp.Admin, pod)
	if err != nil {
		t.Fatalf("the agent did not prepare the example's claim: %v", err)
	}
	app := e.node.RunContainers(pod)["app"]
	for claim, devs := range prepared {
		if len(devs) != 1 || devs[0].Device != "numa0" {
			t.Fatalf("the example's claim %s: prepared %s, want numa0", claim, preparedText(devs))
		}
	}
	if app.Cpus != "4-7" || app.Mems != "0" {
		t.Fatalf("the example's container runs on cpus %q mems %q, want the named 4-7 and 0", app.Cpus, app.Mems)
	}
}

// The same with individual devices: a claim of four CPU devices, whose configuration names the
// four the scheduler picked, gets them; one naming another CPU is refused at prepare, naming it,
// and holds nothing.
func TestANamedCpusetOnIndividualDevices(t *testing.T) {
	e := start(t, options{args: []string{"--device-mode=individual"}})
	e.slices(func(s []resourcev1.ResourceSlice) bool { return len(devices(s)) == 15 })

	// The outside scheduler steers the allocation to the CPUs it chose with a selector, and
	// names them in the configuration.
	e.createNamedClaim("named", "device.attributes[\""+node.Driver+"\"].cpu in [4, 5]", "4-5")
	e.createPod("named", podSpec{claim: "named"})
	pod := e.cp.Scheduled(workloads, "named")
	if _, err := e.node.Prepare(e.cp.Admin, pod); err != nil {
		t.Fatalf("the agent did not prepare the claim naming the cpus the scheduler picked: %v", err)
	}
	if app := e.node.RunContainers(pod)["app"]; app.Cpus != "4-5" {
		t.Fatalf("the container runs on %q, want the named 4-5", app.Cpus)
	}

	// Naming a CPU the scheduler did not allocate: refused, by name, nothing held.
	e.createNamedClaim("wrong", "device.attributes[\""+node.Driver+"\"].cpu in [6, 7]", "6,8")
	e.createPod("wrong", podSpec{claim: "wrong"})
	wrong := e.cp.Scheduled(workloads, "wrong")
	_, err := e.node.Prepare(e.cp.Admin, wrong)
	if err == nil || !strings.Contains(err.Error(), "cpu 8 is on device cpu8, which the scheduler did not allocate to the request") {
		t.Fatalf("a claim naming a cpu the scheduler did not allocate was answered: %v", err)
	}
	held := fmt.Sprint(e.node.DebugState())
	if strings.Contains(held, "wrong") {
		t.Fatalf("the refused claim is held: %s", held)
	}
}

// createNamedClaim creates a claim of two individual devices that selector picks, whose
// configuration names cpus.
func (e *env) createNamedClaim(name, selector, cpus string) {
	e.t.Helper()
	parameters, err := json.Marshal(map[string]any{"apiVersion": "resmgr.io/v1alpha1", "kind": "CpuConfig", "cpus": cpus})
	if err != nil {
		e.t.Fatal(err)
	}
	claim := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: workloads},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "cpus", Exactly: &resourcev1.ExactDeviceRequest{
				DeviceClassName: deviceClass, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 2,
				Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: selector}}},
			}}},
			Config: []resourcev1.DeviceClaimConfiguration{{Requests: []string{"cpus"},
				DeviceConfiguration: resourcev1.DeviceConfiguration{Opaque: &resourcev1.OpaqueDeviceConfiguration{
					Driver: node.Driver, Parameters: runtime.RawExtension{Raw: parameters}}}}},
		}},
	}
	cx, cancel := context.WithTimeout(context.Background(), cluster.WaitLimit)
	defer cancel()
	if _, err := e.cp.Admin.ResourceV1().ResourceClaims(workloads).Create(cx, claim, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("creating claim %s: %v", name, err)
	}
}
