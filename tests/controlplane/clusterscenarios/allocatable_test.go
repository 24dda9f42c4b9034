package clusterscenarios

import (
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/resmgr/resmgr/tests/controlplane/internal/onenode"
)

// The node-allocatable mapping with the real scheduler and kubelet (the stage runs with the
// alpha gate DRANodeAllocatableResources on everywhere; with the agent's switch off, as by
// default, nothing maps and the gate changes nothing). Switched on with helm upgrade, the agent
// maps each device's cpu capacity to the node's cpu in the form the API server's release knows,
// and the scheduler records in the pod's status what the claim took from the node.
//
// What the kubelet makes of it differs. From 1.37 it adds a claim's mapped CPUs to the cgroup
// limits of the pod and of each container using the claim that states a CPU limit, and to the
// pod's CPU weight: a container limited to 200m with a one-CPU claim may use 1.2 CPUs, its
// claimed CPU and the 200m besides. The 1.36 kubelet leaves the cgroups to the pod's spec: the
// same container is held to 200m of its claimed CPU, which is why on 1.36 a pod that states a
// CPU limit must include its claimed CPUs in it (docs/deploy.md).
func TestTheKubeletAddsAClaimsMappedCPUsToThePodsLimitsFrom137(t *testing.T) {
	ns := namespace(t)
	minor := serverMinor(t)
	// Requests of 0, the agent's and the pod's: with the claim's CPU charged against the node,
	// a 2-CPU node with one reserved has nothing left for them.
	values, err := node.ValuesFile("values-node-allocatable.json", map[string]any{
		"config":    map[string]any{"node-allocatable-cpu": true},
		"resources": map[string]any{"requests": map[string]any{"cpu": "0"}},
	})
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
	// The 1.36 API server fills in the default multiplier.
	form, want := "nodeAllocatableResourceMappings", any(map[string]any{"cpu": map[string]any{"capacityKey": "cpu", "allocationMultiplier": "1"}})
	if minor >= 37 {
		form, want = "nodeAllocatableResources", map[string]any{"cpu": map[string]any{"mapping": map[string]any{"capacityKey": "cpu", "capacityMultiplier": "1"}}}
	}
	poll(t, "the agent to publish its devices with the "+form+" mapping", limit, func() (bool, error) {
		devices, err := rawDevices()
		if err != nil || len(devices) == 0 {
			return false, err
		}
		for _, d := range devices {
			if !reflect.DeepEqual(d[form], want) {
				return false, nil
			}
		}
		return true, nil
	})

	claimTemplate(t, ns, "one-cpu", 1)
	limited := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("200m")}
	create(t, ns, podSpec{name: "limited", template: "one-cpu",
		requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("0")}, limits: limited})
	pod := running(t, ns, "limited")
	if p := placement(t, pod, "app"); len(cpus(t, grantedCPUs(t, p, podClaim(t, pod)))) != 1 {
		t.Fatalf("the pod runs on %q, its claim holds one CPU", p.CgroupCPUs)
	}
	// What the scheduler recorded: the claim took one CPU from the node, for container app.
	status := rawPodStatus(t, ns, "limited")
	claimed := "the pod's nodeAllocatableResourceClaimStatuses"
	if len(status.NodeAllocatable) != 1 || !reflect.DeepEqual(status.NodeAllocatable[0].Containers, []string{"app"}) {
		t.Fatalf("%s: %+v", claimed, status.NodeAllocatable)
	}
	got := status.NodeAllocatable[0].Resources["cpu"]
	if minor >= 37 {
		got = ""
		for _, m := range status.NodeAllocatable[0].Mapping {
			if m.Name == "cpu" {
				got = m.Quantity
			}
		}
	}
	if got != "1" {
		t.Fatalf("%s say cpu %q, want 1: %+v", claimed, got, status.NodeAllocatable)
	}

	container, podLimits, err := node.CPULimits(containerID(t, pod, "app"))
	if err != nil {
		t.Fatal(err)
	}
	// The container's limit and the pod's (the sum of its containers' limits), in millicpus;
	// the pod's request (0 of its own) sets its weight.
	limit, request := int64(200), int64(0)
	if minor >= 37 {
		limit, request = 200+1000, 1000
	}
	for _, c := range []onenode.CPULimits{container, podLimits} {
		if c.Period <= 0 || c.Quota != limit*c.Period/1000 {
			t.Fatalf("on Kubernetes 1.%d, cgroup %s has a quota of %d µs per %d µs, want %dm of CPU", minor, c.Cgroup, c.Quota, c.Period, limit)
		}
	}
	if shares, weight := cpuShares(request), cpuWeight(cpuShares(request)); podLimits.Shares != 0 && podLimits.Shares != shares || podLimits.Shares == 0 && podLimits.Weight != weight {
		t.Fatalf("on Kubernetes 1.%d, the pod's cgroup %s has cpu.shares %d (weight %d), want the shares of %dm", minor, podLimits.Cgroup, podLimits.Shares, podLimits.Weight, request)
	}
	t.Logf("Kubernetes 1.%d: the container's cgroup allows %d µs per %d µs, the pod's %d µs with shares %d (weight %d)",
		minor, container.Quota, container.Period, podLimits.Quota, podLimits.Shares, podLimits.Weight)
	deletePod(t, ns, "limited")
}

// cpuShares is the kubelet's cpu.shares for a request of milli millicpus (MilliCPUToShares).
func cpuShares(milli int64) int64 {
	shares := milli * 1024 / 1000
	if shares < 2 {
		return 2
	}
	return shares
}

// cpuWeight is cgroup v2's cpu.weight for cpu.shares, as runc converts it.
func cpuWeight(shares int64) int64 {
	return 1 + ((shares-2)*9999)/262142
}

// serverMinor is the API server's minor version (36 for 1.36).
func serverMinor(t testing.TB) int {
	t.Helper()
	v, err := node.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("the API server's version: %v", err)
	}
	minor, err := strconv.Atoi(strings.TrimSuffix(v.Minor, "+"))
	if err != nil {
		t.Fatalf("the API server's minor version %q: %v", v.Minor, err)
	}
	return minor
}

// rawDevices is the node's devices (only the agent publishes any) as the API server stores them:
// JSON, because the client's types know only one release's fields.
func rawDevices() ([]map[string]any, error) {
	c, cancel := cx()
	defer cancel()
	body, err := node.Client.ResourceV1().RESTClient().Get().AbsPath("/apis/resource.k8s.io/v1/resourceslices").
		Param("fieldSelector", "spec.nodeName="+onenode.NodeName).DoRaw(c)
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
	var out []map[string]any
	for _, s := range list.Items {
		out = append(out, s.Spec.Devices...)
	}
	return out, nil
}

// podStatus is the part of a pod's status the scheduler writes for the node-allocatable mapping,
// in both releases' forms: 1.36's resources, 1.37's mapping.
type podStatus struct {
	NodeAllocatable []struct {
		ResourceClaimName string            `json:"resourceClaimName"`
		Containers        []string          `json:"containers"`
		Resources         map[string]string `json:"resources"`
		Mapping           []struct {
			Name     string `json:"name"`
			Quantity string `json:"quantity"`
		} `json:"mapping"`
	} `json:"nodeAllocatableResourceClaimStatuses"`
}

func rawPodStatus(t testing.TB, ns, name string) podStatus {
	t.Helper()
	c, cancel := cx()
	defer cancel()
	body, err := node.Client.CoreV1().RESTClient().Get().Namespace(ns).Resource("pods").Name(name).DoRaw(c)
	if err != nil {
		t.Fatal(err)
	}
	var pod struct {
		Status podStatus `json:"status"`
	}
	if err := json.Unmarshal(body, &pod); err != nil {
		t.Fatal(err)
	}
	return pod.Status
}
