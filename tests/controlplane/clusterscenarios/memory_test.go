package clusterscenarios

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resmgr/resmgr/tests/controlplane/internal/onenode"
)

const (
	claimedMemory    = 64 << 20
	claimedHugepages = 4 << 20
)

// A claim for {cpu: 1, memory: 64Mi, hugepages2Mi: 4Mi} with the real scheduler, kubelet and
// containerd (hugetlb mounted and 2 MiB pages reserved by the run, containerd's
// disable_hugetlb_controller off): the container runs on its claim's NUMA node, held in the
// kernel to the claimed memory and hugepages, which the agent sets through NRI. The pod lists
// its hugepages in resources, as the kubelet requires to let it use them (docs/which-claim.md).
//
// On 1.37 the agent also maps memory and hugepages to the node's allocatable
// (node-allocatable-memory, the gate being on): the kubelet then adds the claim's hugepages to
// the pod cgroup's hugetlb limit, and the container is still held to its claim.
func TestAMemoryAndHugepagesClaimIsHeldToItsClaimInTheKernel(t *testing.T) {
	ns := namespace(t)
	minor := serverMinor(t)
	mapped := minor >= 37
	if got := node.Hugepages2M(); got*(2<<20) < 2*claimedHugepages {
		t.Fatalf("the run reserved %d of the %d 2 MiB pages it asked for (%s; memory too fragmented?)", got, onenode.ReservedHugepages, onenode.NRHugepages2M)
	}
	// The kubelet read the pages before it started.
	c, cancel := cx()
	n, err := node.Client.CoreV1().Nodes().Get(c, onenode.NodeName, metav1.GetOptions{})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if capacity := n.Status.Capacity["hugepages-2Mi"]; capacity.Value() < 2*claimedHugepages {
		t.Fatalf("node %s has hugepages-2Mi capacity %s, want at least %d", onenode.NodeName, capacity.String(), 2*claimedHugepages)
	}

	config := map[string]any{"claim-memory": "10%", "claim-hugepages": true, "node-allocatable-memory": mapped}
	values, err := node.ValuesFile("values-memory.json", map[string]any{"config": config})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := node.Helm("upgrade", onenode.Release, node.Chart(), "-n", onenode.Namespace, "-f", values, "--wait", "--timeout", "3m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		values, err := node.ValuesFile("values.json", nil)
		if err == nil {
			_, err = node.Helm("upgrade", onenode.Release, node.Chart(), "-n", onenode.Namespace, "-f", values, "--wait", "--timeout", "3m")
		}
		if err != nil {
			t.Errorf("restoring the chart's values: %v", err)
		}
	})
	poll(t, "the agent to publish memory and hugepages2Mi", limit, func() (bool, error) {
		devices, err := rawDevices()
		if err != nil || len(devices) == 0 {
			return false, err
		}
		for _, d := range devices {
			capacity, _ := d["capacity"].(map[string]any)
			_, mem := capacity["memory"]
			_, huge := capacity["hugepages2Mi"]
			_, hasMapping := d["nodeAllocatableResources"]
			if !mem || !huge || hasMapping != mapped {
				return false, fmt.Errorf("device %v: capacity %v", d["name"], capacity)
			}
		}
		return true, nil
	})

	tmpl := &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "memory", Namespace: ns},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "cpus", Exactly: &resourcev1.ExactDeviceRequest{
				DeviceClassName: deviceClass, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1,
				Capacity: &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{
					"cpu": resource.MustParse("1"), "memory": resource.MustParse("64Mi"), "hugepages2Mi": resource.MustParse("4Mi")}},
			}}},
		}}},
	}
	c, cancel = cx()
	_, err = node.Client.ResourceV1().ResourceClaimTemplates(ns).Create(c, tmpl, metav1.CreateOptions{})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	// app lists the claim's hugepages (beside them a cpu or memory request is required) and
	// states no memory limit; limited states a memory limit below the claim's and no hugepages.
	spec := podSpec{name: "hp", template: "memory", containers: []string{"app", "limited"}}.pod(ns)
	spec.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}
	spec.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"hugepages-2Mi": resource.MustParse("4Mi")}
	limitedMemory := corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("32Mi")}
	spec.Spec.Containers[1].Resources.Requests, spec.Spec.Containers[1].Resources.Limits = limitedMemory, limitedMemory
	c, cancel = cx()
	_, err = node.Client.CoreV1().Pods(ns).Create(c, spec, metav1.CreateOptions{})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	pod := running(t, ns, "hp")
	claim := podClaim(t, pod)
	results := claim.Status.Allocation.Devices.Results
	if len(results) != 1 || !strings.HasPrefix(results[0].Device, "numa") {
		t.Fatalf("claim %s was allocated %+v, want one NUMA device", claim.Name, results)
	}
	numa := strings.TrimPrefix(results[0].Device, "numa")

	// What each container is held to: the agent sets the claimed memory (or the kubelet's
	// limit when lower) and the claimed hugepages through NRI.
	want := map[string][2]int64{"app": {claimedMemory, claimedHugepages}, "limited": {32 << 20, claimedHugepages}}
	if mapped {
		// The 1.37 kubelet gives limited its own limit plus the claim's memory (96Mi): the
		// agent's limit, the claim's, is the lower.
		want["limited"] = [2]int64{claimedMemory, claimedHugepages}
	}
	var podCgroup onenode.MemoryLimits
	for _, name := range []string{"app", "limited"} {
		id := containerID(t, pod, name)
		if p := placement(t, pod, name); p.CgroupMems != numa {
			t.Fatalf("container %s has cpuset.mems %q, want its claim's node %s (device %s)", name, p.CgroupMems, numa, results[0].Device)
		}
		var container onenode.MemoryLimits
		container, podCgroup, err = node.MemoryLimits(id)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("Kubernetes 1.%d (node-allocatable-memory %v): container %s: cpuset.mems %s, memory.limit_in_bytes %d, hugetlb.2MB.limit_in_bytes %d",
			minor, mapped, name, numa, container.Memory, container.Hugetlb2M)
		if got := [2]int64{container.Memory, container.Hugetlb2M}; got != want[name] {
			t.Errorf("on Kubernetes 1.%d container %s is held to memory %d and hugetlb 2MB %d, want %d and %d",
				minor, name, got[0], got[1], want[name][0], want[name][1])
		}
	}
	// What the kubelet sets on the pod's cgroup: no memory limit (app states none), the
	// hugepages listed in resources and, from 1.37, the claim's mapped hugepages besides.
	t.Logf("Kubernetes 1.%d: the pod's cgroup: memory.limit_in_bytes %d, hugetlb.2MB.limit_in_bytes %d", minor, podCgroup.Memory, podCgroup.Hugetlb2M)
	wantPodHugetlb := int64(claimedHugepages)
	if mapped {
		wantPodHugetlb += claimedHugepages
	}
	if podCgroup.Memory != -1 || podCgroup.Hugetlb2M != wantPodHugetlb {
		t.Errorf("on Kubernetes 1.%d the pod's cgroup has memory %d and hugetlb 2MB %d, want no memory limit and %d",
			minor, podCgroup.Memory, podCgroup.Hugetlb2M, wantPodHugetlb)
	}
	deletePod(t, ns, "hp")
}
