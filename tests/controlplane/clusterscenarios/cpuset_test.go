package clusterscenarios

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/resmgr/resmgr/tests/controlplane/internal/onenode"
)

// namedCPUsTemplate creates a ResourceClaimTemplate for one CPU whose configuration names it,
// as a batch scheduler outside Kubernetes would (`cpus` of the agent's CpuConfig).
func namedCPUsTemplate(t testing.TB, ns, name, named string) {
	t.Helper()
	parameters, err := json.Marshal(map[string]any{"apiVersion": "resmgr.io/v1alpha1", "kind": "CpuConfig", "cpus": named})
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "cpus", Exactly: &resourcev1.ExactDeviceRequest{
				DeviceClassName: deviceClass, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1,
				Capacity: &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{
					"cpu": resource.MustParse("1")}},
			}}},
			Config: []resourcev1.DeviceClaimConfiguration{{Requests: []string{"cpus"},
				DeviceConfiguration: resourcev1.DeviceConfiguration{Opaque: &resourcev1.OpaqueDeviceConfiguration{
					Driver: driver, Parameters: runtime.RawExtension{Raw: parameters}}}}},
		}}},
	}
	c, cancel := cx()
	defer cancel()
	if _, err := node.Client.ResourceV1().ResourceClaimTemplates(ns).Create(c, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// A cpuset chosen outside Kubernetes: a claim's configuration names the CPU it gets (the
// highest the node publishes, which the agent would not pick itself on a node of several), the
// real scheduler copies the configuration into the allocation, and the kernel runs the pod on
// exactly that CPU. One naming a reserved CPU is refused at prepare: the pod waits in
// ContainerCreating, and `kubectl describe pod` shows the agent's ClaimNotPrepared Event naming
// the CPU and why, next to the kubelet's FailedPrepareDynamicResources.
func TestAClaimNamingItsCPUsGetsExactlyThoseOrIsRefusedSayingWhy(t *testing.T) {
	ns := namespace(t)
	published := cpus(t, sharedCPUs(t))
	highest := -1
	for c := range published {
		highest = max(highest, c)
	}
	named := strconv.Itoa(highest)
	namedCPUsTemplate(t, ns, "named", named)
	create(t, ns, podSpec{name: "named", template: "named"})
	pod := running(t, ns, "named")
	p := placement(t, pod, "app")
	if got := grantedCPUs(t, p, podClaim(t, pod)); got != named || p.CgroupCPUs != named {
		t.Fatalf("the claim names cpu %s; the agent granted %q and the kernel runs the pod on %q", named, got, p.CgroupCPUs)
	}
	deletePod(t, ns, "named")

	reserved := strings.Split(onenode.ReservedCPUs, ",")[0]
	namedCPUsTemplate(t, ns, "reserved", reserved)
	create(t, ns, podSpec{name: "refused", template: "reserved"})
	var described string
	poll(t, "the agent's ClaimNotPrepared Event in kubectl describe pod", limit, func() (bool, error) {
		out, err := node.Kubectl("-n", ns, "describe", "pod", "refused")
		described = out
		return strings.Contains(out, "ClaimNotPrepared") && strings.Contains(out, "reserved for system pods") &&
			strings.Contains(out, "FailedPrepareDynamicResources"), err
	})
	t.Logf("kubectl describe pod refused, its events:\n%s", described[strings.Index(described, "Events:"):])
	c, cancel := cx()
	defer cancel()
	refused, err := node.Client.CoreV1().Pods(ns).Get(c, "refused", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range refused.Status.ContainerStatuses {
		if s.State.Running != nil {
			t.Fatalf("the refused claim's container runs: %+v", s.State)
		}
	}
}
