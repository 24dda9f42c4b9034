package clusterscenarios

import (
	"fmt"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/resmgr/resmgr/tests/controlplane/internal/onenode"
)

// sharedCPUs is what pods without claims run on while no claim holds a CPU: every online CPU but
// the reserved ones.
func sharedCPUs(t testing.TB) string {
	t.Helper()
	data, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		t.Fatal(err)
	}
	online, reserved := cpus(t, string(data)), cpus(t, onenode.ReservedCPUs)
	var parts []string
	for c := 0; c < 4096; c++ {
		if online[c] && !reserved[c] {
			parts = append(parts, itoa(c))
		}
	}
	return strings.Join(parts, ",")
}

func itoa(i int) string { return resource.NewQuantity(int64(i), resource.DecimalSI).String() }

// same says whether two cpusets are the same set.
func same(t testing.TB, a, b string) bool {
	t.Helper()
	return cpus(t, a).Equal(cpus(t, b))
}

// agentPod is the DaemonSet's running pod.
func agentPod(t testing.TB) *corev1.Pod {
	t.Helper()
	var found *corev1.Pod
	poll(t, "the agent's pod to be Ready", limit, func() (bool, error) {
		c, cancel := cx()
		defer cancel()
		pods, err := node.Client.CoreV1().Pods(onenode.Namespace).List(c, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=resmgr"})
		if err != nil {
			return false, err
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.DeletionTimestamp != nil {
				continue
			}
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
					found = p
					return true, nil
				}
			}
		}
		return false, nil
	})
	return found
}

// Without claims (cpu-exclusivity: claims, the default), BestEffort, Burstable and Guaranteed
// pods all run on the shared CPUs, every CPU but the reserved ones
// (docs/configuration.md#cpu-exclusivity); the agent's own pod, in a reserved namespace, runs on
// the reserved CPUs.
func TestPodsWithoutClaimsRunOnTheSharedCPUsAndTheAgentOnTheReservedOnes(t *testing.T) {
	ns := namespace(t)
	small := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("32Mi")}
	create(t, ns, podSpec{name: "besteffort"})
	create(t, ns, podSpec{name: "burstable", requests: small})
	create(t, ns, podSpec{name: "guaranteed", requests: small, limits: small})
	shared := sharedCPUs(t)
	for _, name := range []string{"besteffort", "burstable", "guaranteed"} {
		pod := running(t, ns, name)
		if pod.Status.QOSClass != map[string]corev1.PodQOSClass{"besteffort": corev1.PodQOSBestEffort,
			"burstable": corev1.PodQOSBurstable, "guaranteed": corev1.PodQOSGuaranteed}[name] {
			t.Fatalf("pod %s has QoS class %s", name, pod.Status.QOSClass)
		}
		poll(t, name+" to run on the shared CPUs "+shared, limit, func() (bool, error) {
			return same(t, placement(t, pod, "app").CgroupCPUs, shared), nil
		})
		t.Logf("kernel: %s (%s) runs on %q", name, pod.Status.QOSClass, placement(t, pod, "app").CgroupCPUs)
	}
	agent := agentPod(t)
	if got := placement(t, agent, "resmgr").CgroupCPUs; !same(t, got, onenode.ReservedCPUs) {
		t.Fatalf("the agent's pod runs on %q, want the reserved %q", got, onenode.ReservedCPUs)
	}
}

// One ResourceClaim used by both containers of a pod: the kubelet prepares it once, both
// containers get its CDI device and run on the same granted CPUs.
func TestASharedClaimPinsBothContainersToTheSameCPUs(t *testing.T) {
	ns := namespace(t)
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "shared", Namespace: ns},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "cpus",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: deviceClass, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1,
				Capacity: &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{"cpu": resource.MustParse("1")}}}}}}}}
	c, cancel := cx()
	created, err := node.Client.ResourceV1().ResourceClaims(ns).Create(c, claim, metav1.CreateOptions{})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	create(t, ns, podSpec{name: "two", containers: []string{"first", "second"}, claim: "shared"})
	pod := running(t, ns, "two")
	first, second := placement(t, pod, "first"), placement(t, pod, "second")
	granted := grantedCPUs(t, first, created)
	if grantedCPUs(t, second, created) != granted {
		t.Fatalf("the containers were granted %q and %q", granted, grantedCPUs(t, second, created))
	}
	if first.CgroupCPUs != granted || second.CgroupCPUs != granted {
		t.Fatalf("the kernel runs the containers on %q and %q, the claim holds %q", first.CgroupCPUs, second.CgroupCPUs, granted)
	}
	t.Logf("kernel: both containers run on the claim's %q", granted)
	deletePod(t, ns, "two")
}

// The kubelet resizes a running container in place (`kubectl patch --subresource resize`): it
// updates the container's resources through containerd, which hands the update to the agent over
// NRI first. The new CPU limit reaches the container's cgroup, the container is not restarted,
// and it stays on the shared CPUs the agent gave it.
func TestAnInPlaceResizeChangesTheCPULimitAndKeepsTheSharedCPUs(t *testing.T) {
	ns := namespace(t)
	create(t, ns, podSpec{name: "resized",
		requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
		limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("200m"), corev1.ResourceMemory: resource.MustParse("64Mi")}})
	pod := running(t, ns, "resized")
	id := containerID(t, pod, "app")
	if got, err := node.CPULimit(id); err != nil || got != "20000 100000" {
		t.Fatalf("before the resize the container's CPU limit is %q (%v), want 200m: \"20000 100000\"", got, err)
	}
	patch := `{"spec":{"containers":[{"name":"app","resources":{"requests":{"cpu":"150m"},"limits":{"cpu":"300m"}}}]}}`
	if _, err := node.Kubectl("-n", ns, "patch", "pod", "resized", "--subresource", "resize", "-p", patch); err != nil {
		t.Fatal(err)
	}
	poll(t, "the kubelet to apply the resize", limit, func() (bool, error) {
		got, err := node.CPULimit(id)
		if err != nil {
			return false, err
		}
		if got != "30000 100000" {
			return false, fmt.Errorf("the container's CPU limit is %q", got)
		}
		c, cancel := cx()
		defer cancel()
		now, err := node.Client.CoreV1().Pods(ns).Get(c, "resized", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		s := now.Status.ContainerStatuses[0]
		if s.Resources == nil || !s.Resources.Limits.Cpu().Equal(resource.MustParse("300m")) {
			return false, fmt.Errorf("the pod's status says %+v", s.Resources)
		}
		return true, nil
	})
	keepsContainer(t, pod)
	shared := sharedCPUs(t)
	poll(t, "the resized container to run on the shared CPUs "+shared, limit, func() (bool, error) {
		return same(t, placement(t, pod, "app").CgroupCPUs, shared), nil
	})
	t.Logf("kernel: after the resize the container's CPU limit is 300m and it runs on %q", placement(t, pod, "app").CgroupCPUs)
}
